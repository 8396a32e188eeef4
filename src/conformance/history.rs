//! Checked histories: every operation's invocation and response (or its absence, for an outcome
//! that stays unknown) recorded in real-time order, then checked for linearizability against a
//! sequential model of one cluster with `stateright`'s `LinearizabilityTester`.
//!
//! Etags are random, so the model names the tags it creates symbolically and binds each symbol to
//! the text the first read in a linearization shows for it; a write expecting a tag applies only
//! if the model's current tag is bound to that text (tags are never reused).
//!
//! Heartbeats are not recorded: one that moves an entry's I-am-alive time gives its row a new tag,
//! which the model accepts in a read as the same entry under a tag nobody has seen yet.
//!
//! What the provider promises, and so what the model checks: `Ok(true)` only for a write whose
//! condition held, applied atomically at one point; `Ok(false)` never for a write that applied
//! (a later read would show its marker). A `false` may *fence* (move the version tag, keeping the
//! number and the entries), so a read may show a version tag no write of the history made.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use stateright::semantics::{ConsistencyTester, LinearizabilityTester, SequentialSpec};

use crate::model::MembershipSnapshot;

/// A recorded operation on one cluster.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum HistoryOp {
    /// `read_all`.
    ReadAll,
    /// `insert_row` of `silo` with `status`, presenting `expected_version_etag`, writing `version`.
    Insert {
        /// The entry's address text.
        silo: String,
        /// Status code.
        status: i32,
        /// A value unique to this write (stored in the entry), so its effect is recognisable.
        marker: i32,
        /// The version tag presented.
        expected_version_etag: String,
        /// The version number written.
        version: i64,
    },
    /// `update_row` of `silo`.
    Update {
        /// The entry's address text.
        silo: String,
        /// Status code.
        status: i32,
        /// A value unique to this write (stored in the entry), so its effect is recognisable.
        marker: i32,
        /// The row tag presented.
        expected_row_etag: String,
        /// The version tag presented.
        expected_version_etag: String,
        /// The version number written.
        version: i64,
    },
}

/// What an operation returned. Operations whose outcome is unknown (a timeout, an ambiguous
/// error) have no return: the checker lets them take effect at any later point, or never.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HistoryRet {
    /// A snapshot: the version, its tag, and each entry's status and row tag.
    Snapshot {
        /// Version number.
        version: i64,
        /// Version tag.
        version_etag: String,
        /// Entry address text → (status code, the marker of the write that stored it, row tag).
        rows: BTreeMap<String, (i32, i32, String)>,
    },
    /// `Ok(applied)` of a conditional write.
    Applied(bool),
}

/// The part of a row etag that names the row's write: a Cassandra etag also names the heartbeat
/// element the read saw (`<uuid>/<start>/<alive>`), which heartbeats — not recorded — move. Keeping
/// it would make every heartbeat a tag change the checker must place, and the search explode.
/// (A write refused because a heartbeat moved answers `false`, which is always a valid step.)
pub fn row_identity(etag: &crate::model::ETag) -> String {
    etag.as_str()
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned()
}

impl HistoryRet {
    /// The return of a `read_all`. The marker of an entry is its `update_zone`: the workload
    /// stores each write's marker there.
    pub fn snapshot(s: &MembershipSnapshot) -> Self {
        HistoryRet::Snapshot {
            version: i64::try_from(s.version.version).unwrap_or(i64::MAX),
            version_etag: s.version.etag.as_str().to_owned(),
            rows: s
                .rows
                .iter()
                .map(|r| {
                    (
                        r.entry.address.to_string(),
                        (
                            r.entry.status.code(),
                            r.entry.update_zone,
                            row_identity(&r.etag),
                        ),
                    )
                })
                .collect(),
        }
    }
}

/// The checker's stack: its search recurses once per operation.
const CHECK_STACK_BYTES: usize = 1 << 30;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Event {
    Invoke(u64, HistoryOp),
    Return(u64, HistoryRet),
}

/// A history being recorded by concurrent clients. Each client works as a "thread" that has at
/// most one operation in flight; after an operation whose outcome stays unknown the client
/// continues as a new thread ([`History::thread`]), as in Jepsen-style checkers.
#[derive(Debug, Default)]
pub struct History {
    events: Mutex<Vec<Event>>,
    next_thread: AtomicU64,
}

/// The verdict on a history.
#[derive(Clone, Debug)]
pub struct Verdict {
    /// Operations invoked.
    pub operations: usize,
    /// Operations that returned.
    pub returned: usize,
    /// Linearizable against the model.
    pub linearizable: bool,
}

impl History {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// A fresh thread id.
    pub fn thread(&self) -> u64 {
        self.next_thread.fetch_add(1, Ordering::Relaxed)
    }

    /// Records an invocation; call just before sending the operation.
    pub fn invoke(&self, thread: u64, op: HistoryOp) {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Event::Invoke(thread, op));
    }

    /// Records a response; call as soon as it arrives.
    pub fn respond(&self, thread: u64, ret: HistoryRet) {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Event::Return(thread, ret));
    }

    /// Checks the history for linearizability against the one-cluster model, starting from a
    /// cluster that was initialized (version 0) and had no entries.
    pub fn check(&self) -> Result<Verdict, String> {
        let events = self
            .events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        // The tester searches depth-first, one stack frame per operation: give it room.
        std::thread::Builder::new()
            .name("linearizability".into())
            .stack_size(CHECK_STACK_BYTES)
            .spawn(move || Self::check_events(events))
            .map_err(|e| format!("cannot start the checker's thread: {e}"))?
            .join()
            .map_err(|_| "the checker panicked".to_owned())?
    }

    fn check_events(mut events: Vec<Event>) -> Result<Verdict, String> {
        // A read that never returned changed nothing: leave it out, or the search would try it at
        // every point (a thread's in-flight operation is its last event).
        let mut last = HashMap::new();
        for (i, e) in events.iter().enumerate() {
            let (Event::Invoke(t, _) | Event::Return(t, _)) = e;
            last.insert(*t, i);
        }
        let dropped: std::collections::HashSet<usize> = last
            .values()
            .copied()
            .filter(|&i| matches!(events[i], Event::Invoke(_, HistoryOp::ReadAll)))
            .collect();
        let mut i = 0;
        events.retain(|_| {
            i += 1;
            !dropped.contains(&(i - 1))
        });
        let mut tester = LinearizabilityTester::new(ClusterModel::default());
        let (mut operations, mut returned) = (0, 0);
        for event in events {
            match event {
                Event::Invoke(t, op) => {
                    operations += 1;
                    tester.on_invoke(t, op)?;
                }
                Event::Return(t, ret) => {
                    returned += 1;
                    tester.on_return(t, ret)?;
                }
            }
        }
        Ok(Verdict {
            operations,
            returned,
            linearizable: tester.is_consistent(),
        })
    }
}

/// A tag as the model knows it: a symbol for a tag a write created, bound to text once seen.
/// `Tag(0)` is the tag of the version `initialize` created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Tag(u64);

/// The sequential model of one cluster, with symbolic tags.
#[derive(Clone, Debug, Default)]
struct ClusterModel {
    version: i64,
    version_tag: Tag,
    /// Address text → (status, marker, row tag).
    rows: BTreeMap<String, (i32, i32, Tag)>,
    bound: HashMap<Tag, String>,
    by_text: HashMap<String, Tag>,
    next: u64,
}

impl ClusterModel {
    fn fresh(&mut self) -> Tag {
        self.next += 1;
        Tag(self.next)
    }

    /// Whether `tag` is the tag whose text is `text` (an unbound tag is not: every text a
    /// client presents was bound by the read it came from, which precedes it).
    fn is(&self, tag: Tag, text: &str) -> bool {
        self.bound.get(&tag).is_some_and(|t| t == text)
    }

    /// Binds `tag` to `text` if it is unbound; false if that contradicts what is known.
    fn bind(&mut self, tag: Tag, text: &str) -> bool {
        match self.bound.get(&tag) {
            Some(t) => t == text,
            None => {
                if self.by_text.contains_key(text) {
                    return false; // tags are never reused
                }
                self.bound.insert(tag, text.to_owned());
                self.by_text.insert(text.to_owned(), tag);
                true
            }
        }
    }

    fn condition(&self, op: &HistoryOp) -> bool {
        match op {
            HistoryOp::ReadAll => true,
            HistoryOp::Insert {
                silo,
                expected_version_etag,
                ..
            } => !self.rows.contains_key(silo) && self.is(self.version_tag, expected_version_etag),
            HistoryOp::Update {
                silo,
                expected_row_etag,
                expected_version_etag,
                ..
            } => {
                self.rows
                    .get(silo)
                    .is_some_and(|(_, _, tag)| self.is(*tag, expected_row_etag))
                    && self.is(self.version_tag, expected_version_etag)
            }
        }
    }

    fn apply(&mut self, op: &HistoryOp) {
        if let HistoryOp::Insert {
            silo,
            status,
            marker,
            version,
            ..
        }
        | HistoryOp::Update {
            silo,
            status,
            marker,
            version,
            ..
        } = op
        {
            let (row_tag, version_tag) = (self.fresh(), self.fresh());
            self.rows.insert(silo.clone(), (*status, *marker, row_tag));
            self.version = *version;
            self.version_tag = version_tag;
        }
    }
}

impl SequentialSpec for ClusterModel {
    type Op = HistoryOp;
    type Ret = HistoryRet;

    /// Only for operations still in flight at the end: a read changes nothing, a write applies
    /// if its condition holds.
    fn invoke(&mut self, op: &HistoryOp) -> HistoryRet {
        if matches!(op, HistoryOp::ReadAll) {
            return HistoryRet::Applied(false);
        }
        let applies = self.condition(op);
        if applies {
            self.apply(op);
        }
        HistoryRet::Applied(applies)
    }

    fn is_valid_step(&mut self, op: &HistoryOp, ret: &HistoryRet) -> bool {
        match (op, ret) {
            (
                HistoryOp::ReadAll,
                HistoryRet::Snapshot {
                    version,
                    version_etag,
                    rows,
                },
            ) => {
                if *version != self.version || rows.len() != self.rows.len() {
                    return false;
                }
                if !self.bind(self.version_tag, version_etag) {
                    // A fence: the same version under a tag nobody has seen yet.
                    if self.by_text.contains_key(version_etag) {
                        return false;
                    }
                    self.version_tag = self.fresh();
                    self.bind(self.version_tag, version_etag);
                }
                let expected: Vec<(String, (i32, i32, Tag))> =
                    self.rows.iter().map(|(k, v)| (k.clone(), *v)).collect();
                for (silo, (status, marker, tag)) in expected {
                    match rows.get(&silo) {
                        Some((s, m, text)) if *s == status && *m == marker => {
                            if self.bind(tag, text) {
                                continue;
                            }
                            // A heartbeat (outside the history) that moved the I-am-alive time
                            // gives the row a new tag: the same entry under a tag nobody has
                            // seen yet.
                            if self.by_text.contains_key(text) {
                                return false;
                            }
                            let moved = self.fresh();
                            self.bind(moved, text);
                            if let Some(row) = self.rows.get_mut(&silo) {
                                row.2 = moved;
                            }
                        }
                        _ => return false,
                    }
                }
                true
            }
            // `false`: nothing applied (a fence it may have left shows in later reads).
            (HistoryOp::Insert { .. } | HistoryOp::Update { .. }, HistoryRet::Applied(false)) => {
                true
            }
            (HistoryOp::Insert { .. } | HistoryOp::Update { .. }, HistoryRet::Applied(true)) => {
                let applies = self.condition(op);
                if applies {
                    self.apply(op);
                }
                applies
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(version: i64, etag: &str, rows: &[(&str, i32, &str)]) -> HistoryRet {
        HistoryRet::Snapshot {
            version,
            version_etag: etag.into(),
            rows: rows
                .iter()
                .map(|(s, st, t)| ((*s).to_owned(), (*st, 7, (*t).to_owned())))
                .collect(),
        }
    }

    fn insert(silo: &str, expected: &str, version: i64) -> HistoryOp {
        HistoryOp::Insert {
            silo: silo.into(),
            status: 3,
            marker: 7,
            expected_version_etag: expected.into(),
            version,
        }
    }

    #[test]
    fn a_sequential_history_is_linearizable() {
        let h = History::new();
        h.invoke(0, HistoryOp::ReadAll);
        h.respond(0, snapshot(0, "v0", &[]));
        h.invoke(0, insert("a", "v0", 1));
        h.respond(0, HistoryRet::Applied(true));
        h.invoke(1, HistoryOp::ReadAll);
        h.respond(1, snapshot(1, "v1", &[("a", 3, "r1")]));
        let v = h.check().unwrap();
        assert!(v.linearizable);
        assert_eq!((v.operations, v.returned), (3, 3));
    }

    #[test]
    fn two_inserts_with_one_tag_cannot_both_apply() {
        let h = History::new();
        h.invoke(0, HistoryOp::ReadAll);
        h.respond(0, snapshot(0, "v0", &[]));
        h.invoke(1, insert("a", "v0", 1));
        h.invoke(2, insert("b", "v0", 1));
        h.respond(1, HistoryRet::Applied(true));
        h.respond(2, HistoryRet::Applied(true));
        assert!(!h.check().unwrap().linearizable);
    }

    #[test]
    fn a_false_for_a_write_that_applied_is_caught() {
        let h = History::new();
        h.invoke(0, HistoryOp::ReadAll);
        h.respond(0, snapshot(0, "v0", &[]));
        h.invoke(0, insert("a", "v0", 1));
        h.respond(0, HistoryRet::Applied(false));
        h.invoke(0, HistoryOp::ReadAll);
        h.respond(0, snapshot(1, "v1", &[("a", 3, "r1")]));
        assert!(!h.check().unwrap().linearizable);
    }

    #[test]
    fn an_unknown_outcome_may_apply_later_or_never() {
        for shows_it in [true, false] {
            let h = History::new();
            h.invoke(0, HistoryOp::ReadAll);
            h.respond(0, snapshot(0, "v0", &[]));
            h.invoke(0, insert("a", "v0", 1)); // never returns
            h.invoke(1, HistoryOp::ReadAll);
            if shows_it {
                h.respond(1, snapshot(1, "v1", &[("a", 3, "r1")]));
            } else {
                h.respond(1, snapshot(0, "v0", &[]));
            }
            assert!(h.check().unwrap().linearizable, "shows_it = {shows_it}");
        }
    }

    #[test]
    fn a_fenced_false_may_move_the_version_tag_but_not_the_number() {
        let h = History::new();
        h.invoke(0, HistoryOp::ReadAll);
        h.respond(0, snapshot(0, "v0", &[]));
        h.invoke(0, insert("a", "v0", 1));
        h.respond(0, HistoryRet::Applied(false));
        h.invoke(0, HistoryOp::ReadAll);
        h.respond(0, snapshot(0, "fence", &[]));
        h.invoke(0, insert("a", "fence", 1));
        h.respond(0, HistoryRet::Applied(true));
        h.invoke(0, HistoryOp::ReadAll);
        h.respond(0, snapshot(1, "v1", &[("a", 3, "r1")]));
        assert!(h.check().unwrap().linearizable);
        // But a tag seen before cannot come back, and the number cannot move without a write.
        let h = History::new();
        h.invoke(0, HistoryOp::ReadAll);
        h.respond(0, snapshot(0, "v0", &[]));
        h.invoke(0, HistoryOp::ReadAll);
        h.respond(0, snapshot(1, "other", &[]));
        assert!(!h.check().unwrap().linearizable);
    }

    #[test]
    fn a_heartbeat_may_move_a_row_tag_and_a_write_expecting_the_old_one_cannot_apply() {
        let update = |expected_row: &str, expected_version: &str| HistoryOp::Update {
            silo: "a".into(),
            status: 3,
            marker: 8,
            expected_row_etag: expected_row.into(),
            expected_version_etag: expected_version.into(),
            version: 2,
        };
        let prefix = |h: &History| {
            h.invoke(0, HistoryOp::ReadAll);
            h.respond(0, snapshot(0, "v0", &[]));
            h.invoke(0, insert("a", "v0", 1));
            h.respond(0, HistoryRet::Applied(true));
            h.invoke(0, HistoryOp::ReadAll);
            h.respond(0, snapshot(1, "v1", &[("a", 3, "r1")]));
            // A heartbeat moved the row's tag.
            h.invoke(0, HistoryOp::ReadAll);
            h.respond(0, snapshot(1, "v1", &[("a", 3, "r1+hb")]));
        };
        let h = History::new();
        prefix(&h);
        h.invoke(0, update("r1", "v1"));
        h.respond(0, HistoryRet::Applied(false));
        h.invoke(0, update("r1+hb", "v1"));
        h.respond(0, HistoryRet::Applied(true));
        assert!(h.check().unwrap().linearizable);
        let h = History::new();
        prefix(&h);
        h.invoke(0, update("r1", "v1"));
        h.respond(0, HistoryRet::Applied(true));
        assert!(!h.check().unwrap().linearizable);
        // A tag seen before cannot come back.
        let h = History::new();
        prefix(&h);
        h.invoke(0, HistoryOp::ReadAll);
        h.respond(0, snapshot(1, "v1", &[("a", 3, "r1")]));
        assert!(!h.check().unwrap().linearizable);
    }

    #[test]
    fn reads_that_never_returned_are_left_out() {
        let h = History::new();
        for t in 0..40 {
            h.invoke(t, HistoryOp::ReadAll); // each failed, its client moved to a new thread
        }
        h.invoke(50, HistoryOp::ReadAll);
        h.respond(50, snapshot(0, "v0", &[]));
        let v = h.check().unwrap();
        assert!(v.linearizable);
        assert_eq!(v.operations, 1);
    }

    #[test]
    fn a_stale_read_after_a_completed_write_is_caught() {
        let h = History::new();
        h.invoke(0, HistoryOp::ReadAll);
        h.respond(0, snapshot(0, "v0", &[]));
        h.invoke(0, insert("a", "v0", 1));
        h.respond(0, HistoryRet::Applied(true));
        h.invoke(1, HistoryOp::ReadAll);
        h.respond(1, snapshot(0, "v0", &[]));
        assert!(!h.check().unwrap().linearizable);
    }
}

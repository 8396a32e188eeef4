//! Model-based testing: random operation sequences, some of them run concurrently, applied to a
//! backend and to a simple sequential model; the answers must be identical (for concurrent
//! groups: identical to the model run in some order).

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use crate::model::{
    ETag, MembershipEntry, MembershipSnapshot, SiloAddress, SiloStatus, SuspectTime, TableVersion,
    Timestamp,
};
use crate::table::{HeartbeatOutcome, MembershipTable};

/// Which tag a versioned write presents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TagChoice {
    /// The current one (as of the last read).
    Current,
    /// One seen earlier, no longer current (falls back to a random tag if none was seen).
    Stale,
    /// A tag the table never issued.
    Random,
}

/// One operation on the table. Silos are indices into a small pool, so operations collide.
#[derive(Clone, Debug)]
pub enum Op {
    /// `insert_row` of a fresh entry for `silo`.
    Insert {
        /// Pool index.
        silo: u8,
        /// Status code (0..=6).
        status: u8,
        /// The version tag presented.
        version: TagChoice,
    },
    /// `update_row` of `silo`'s entry.
    Update {
        /// Pool index.
        silo: u8,
        /// Status code.
        status: u8,
        /// Add a suspicion.
        suspect: bool,
        /// The row tag presented.
        row: TagChoice,
        /// The version tag presented.
        version: TagChoice,
    },
    /// `update_i_am_alive` of `silo`. Heartbeat times only move forward through a run, as real
    /// ones ("now") do across a silo address's incarnations: the k-th operation's time is
    /// `base + 50 ms × k + offset_ms`.
    Heartbeat {
        /// Pool index.
        silo: u8,
        /// Milliseconds after the base time.
        offset_ms: u16,
    },
    /// `cleanup_defunct` with a cutoff `offset_ms` after the base time.
    Cleanup {
        /// Milliseconds after the base time (entries start 30 s before it).
        offset_ms: u16,
    },
    /// `read_row` of `silo`.
    ReadRow {
        /// Pool index.
        silo: u8,
    },
}

/// A step: one operation, or a few writes started together.
#[derive(Clone, Debug)]
pub enum Step {
    /// One operation.
    One(Op),
    /// Operations run concurrently.
    Concurrent(Vec<Op>),
}

const POOL: u8 = 4;

fn tag_choice() -> impl Strategy<Value = TagChoice> {
    prop_oneof![6 => Just(TagChoice::Current), 2 => Just(TagChoice::Stale), 1 => Just(TagChoice::Random)]
}

fn write_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..POOL, 0u8..7, tag_choice()).prop_map(|(silo, status, version)| Op::Insert { silo, status, version }),
        3 => (0..POOL, 0u8..7, any::<bool>(), tag_choice(), tag_choice())
            .prop_map(|(silo, status, suspect, row, version)| Op::Update { silo, status, suspect, row, version }),
        2 => (0..POOL, 0u16..50).prop_map(|(silo, offset_ms)| Op::Heartbeat { silo, offset_ms }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => write_op(),
        1 => (0u16..6000).prop_map(|offset_ms| Op::Cleanup { offset_ms }),
        1 => (0..POOL).prop_map(|silo| Op::ReadRow { silo }),
    ]
}

/// Sequences of up to `max_len` steps; about one in five is a concurrent group of 2 or 3 writes.
pub fn steps(max_len: usize) -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        4 => op().prop_map(Step::One),
        1 => proptest::collection::vec(write_op(), 2..=3).prop_map(Step::Concurrent),
    ];
    proptest::collection::vec(step, 1..=max_len)
}

/// What an operation answered, in backend-independent form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// insert/update result.
    Applied(bool),
    /// Heartbeat: entry missing / present / present and Dead.
    Heartbeat(&'static str),
    /// Cleanup: rows removed.
    Removed(usize),
    /// read_row: the entry (if any) and the version number.
    Row(Option<MembershipEntry>, u64),
}

/// The sequential reference: rows with abstract tags.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Model {
    version: u64,
    version_tag: u64,
    rows: BTreeMap<SiloAddress, (MembershipEntry, u64, Option<Timestamp>)>,
    next_tag: u64,
}

/// A resolved operation: the concrete arguments both sides receive.
#[derive(Clone, Debug)]
enum Call {
    Insert(MembershipEntry, TableVersion, Option<u64>),
    Update(
        MembershipEntry,
        ETag,
        Option<u64>,
        TableVersion,
        Option<u64>,
    ),
    Heartbeat(SiloAddress, Timestamp),
    Cleanup(Timestamp),
    ReadRow(SiloAddress),
}

impl Model {
    fn fresh_tag(&mut self) -> u64 {
        self.next_tag += 1;
        self.next_tag
    }

    fn read(&self, address: &SiloAddress) -> Option<MembershipEntry> {
        self.rows.get(address).map(|(e, _, hb)| {
            let mut e = e.clone();
            if let Some(h) = hb {
                e.i_am_alive_time = e.i_am_alive_time.max(*h);
            }
            e
        })
    }

    /// What a heartbeat of `address` answers in this state.
    fn heartbeat_answer(&self, address: &SiloAddress) -> Answer {
        Answer::Heartbeat(match self.rows.get(address) {
            None => "not_found",
            Some((e, _, _)) if e.status == SiloStatus::Dead => "dead",
            Some(_) => "refreshed",
        })
    }

    /// Applies a call; `row_tag`/`version_tag` are the abstract tags the call presents
    /// (`None`: a tag the model never issued).
    fn apply(&mut self, call: &Call) -> Answer {
        match call {
            Call::Insert(entry, v, vtag) => {
                if self.rows.contains_key(&entry.address) || *vtag != Some(self.version_tag) {
                    return Answer::Applied(false);
                }
                let tag = self.fresh_tag();
                self.rows.insert(entry.address, (entry.clone(), tag, None));
                self.version = v.version;
                self.version_tag = self.fresh_tag();
                Answer::Applied(true)
            }
            Call::Update(entry, _, rtag, v, vtag) => {
                let version_ok = *vtag == Some(self.version_tag);
                let fresh = self.fresh_tag();
                match self.rows.get_mut(&entry.address) {
                    Some((e, tag, _)) if version_ok && Some(*tag) == *rtag => {
                        *e = entry.clone();
                        *tag = fresh;
                    }
                    _ => return Answer::Applied(false),
                }
                self.version = v.version;
                self.version_tag = self.fresh_tag();
                Answer::Applied(true)
            }
            Call::Heartbeat(address, time) => match self.rows.get_mut(address) {
                None => Answer::Heartbeat("not_found"),
                Some((e, tag, hb)) => {
                    // A heartbeat that moves the stored time gives the row a new tag: a write
                    // decided on an earlier read must not match.
                    if hb.is_none_or(|h| *time > h) {
                        *hb = Some(*time);
                        self.next_tag += 1;
                        *tag = self.next_tag;
                    }
                    Answer::Heartbeat(if e.status == SiloStatus::Dead {
                        "dead"
                    } else {
                        "refreshed"
                    })
                }
            },
            Call::Cleanup(before) => {
                let doomed: Vec<_> = self
                    .rows
                    .keys()
                    .copied()
                    .filter(|a| {
                        let e = self.read(a).expect("key from the map");
                        e.status != SiloStatus::Active && e.last_activity() < *before
                    })
                    .collect();
                for a in &doomed {
                    self.rows.remove(a);
                }
                Answer::Removed(doomed.len())
            }
            Call::ReadRow(address) => Answer::Row(self.read(address), self.version),
        }
    }
}

/// Tags seen on the backend, mapped to the model's abstract tags.
#[derive(Default)]
struct Tags {
    to_model: HashMap<ETag, u64>,
    history: Vec<ETag>,
}

impl Tags {
    fn bind(&mut self, real: &ETag, model: u64) {
        if self.to_model.insert(real.clone(), model).is_none() {
            self.history.push(real.clone());
        }
    }

    fn pick(&self, choice: TagChoice, current: Option<&ETag>, rng_pick: usize) -> ETag {
        match (choice, current) {
            (TagChoice::Current, Some(c)) => c.clone(),
            (TagChoice::Stale, _) => {
                let stale: Vec<_> = self
                    .history
                    .iter()
                    .filter(|t| Some(*t) != current)
                    .collect();
                if stale.is_empty() {
                    ETag::random()
                } else {
                    stale[rng_pick % stale.len()].clone()
                }
            }
            _ => ETag::random(),
        }
    }
}

fn address(silo: u8) -> SiloAddress {
    SiloAddress::from_v4(
        SocketAddrV4::new(Ipv4Addr::LOCALHOST, 20000 + u16::from(silo)),
        7,
    )
}

async fn run_call(table: &dyn MembershipTable, call: &Call) -> Result<Answer, String> {
    let r = match call {
        Call::Insert(e, v, _) => {
            Answer::Applied(table.insert_row(e, v).await.map_err(|e| e.to_string())?)
        }
        Call::Update(e, etag, _, v, _) => Answer::Applied(
            table
                .update_row(e, etag, v)
                .await
                .map_err(|e| e.to_string())?,
        ),
        Call::Heartbeat(a, t) => Answer::Heartbeat(
            match table
                .update_i_am_alive(a, *t)
                .await
                .map_err(|e| e.to_string())?
            {
                HeartbeatOutcome::NotFound => "not_found",
                HeartbeatOutcome::DeclaredDead { .. } => "dead",
                HeartbeatOutcome::Refreshed { .. } => "refreshed",
            },
        ),
        Call::Cleanup(before) => Answer::Removed(
            table
                .cleanup_defunct(*before)
                .await
                .map_err(|e| e.to_string())?,
        ),
        Call::ReadRow(a) => {
            let s = table.read_row(a).await.map_err(|e| e.to_string())?;
            Answer::Row(s.rows.first().map(|r| r.entry.clone()), s.version.version)
        }
    };
    Ok(r)
}

/// Compares the backend's full state with the model's, and binds newly seen tags.
fn compare_state(
    snapshot: &MembershipSnapshot,
    model: &Model,
    tags: &mut Tags,
) -> Result<(), String> {
    if snapshot.version.version != model.version {
        return Err(format!(
            "version {} != model {}",
            snapshot.version.version, model.version
        ));
    }
    let real: Vec<_> = snapshot.rows.iter().map(|r| r.entry.address).collect();
    let expected: Vec<_> = model.rows.keys().copied().collect();
    if real != expected {
        return Err(format!("rows {real:?} != model {expected:?}"));
    }
    for row in &snapshot.rows {
        let want = model.read(&row.entry.address).expect("same keys");
        if row.entry != want {
            return Err(format!("entry {:?} != model {:?}", row.entry, want));
        }
        let model_tag = model.rows[&row.entry.address].1;
        match tags.to_model.get(&row.etag) {
            Some(t) if *t != model_tag => {
                return Err(format!("row tag of {} is stale", row.entry.address));
            }
            _ => tags.bind(&row.etag, model_tag),
        }
    }
    match tags.to_model.get(&snapshot.version.etag) {
        Some(t) if *t != model.version_tag => Err("version tag is stale".into()),
        _ => {
            tags.bind(&snapshot.version.etag, model.version_tag);
            Ok(())
        }
    }
}

/// Runs `steps` against `table` (a fresh, initialized cluster) and the model; returns the first
/// disagreement.
pub async fn check(table: Arc<dyn MembershipTable>, steps: &[Step]) -> Result<(), String> {
    // Entries start 30 s before the run; heartbeats are stamped in the 5 s before it. So no
    // heartbeat is stamped in the future, and none precedes its entry's start (see `docs::guarantees`
    // on I-am-alive times).
    let base = Timestamp::now().saturating_sub(Duration::from_secs(5));
    let start = base.saturating_sub(Duration::from_secs(25));
    let mut model = Model::default();
    let initial = table.read_all().await.map_err(|e| e.to_string())?;
    let mut tags = Tags::default();
    tags.bind(&initial.version.etag, 0);
    let mut counter = 0usize;
    for (i, step) in steps.iter().enumerate() {
        let snapshot = table.read_all().await.map_err(|e| e.to_string())?;
        compare_state(&snapshot, &model, &mut tags).map_err(|e| format!("before step {i}: {e}"))?;
        let ops: Vec<&Op> = match step {
            Step::One(op) => vec![op],
            Step::Concurrent(ops) => ops.iter().collect(),
        };
        let calls: Vec<Call> = ops
            .iter()
            .map(|op| {
                counter += 1;
                resolve(op, &snapshot, &model, &tags, start, base, counter)
            })
            .collect();
        let answers = if calls.len() == 1 {
            vec![run_call(table.as_ref(), &calls[0]).await?]
        } else {
            let handles: Vec<_> = calls
                .iter()
                .cloned()
                .map(|c| {
                    let t = Arc::clone(&table);
                    tokio::spawn(async move { run_call(t.as_ref(), &c).await })
                })
                .collect();
            let mut out = Vec::new();
            for h in handles {
                out.push(h.await.map_err(|e| e.to_string())??);
            }
            out
        };
        // Some order of the calls must explain every answer and the resulting state.
        let after = table.read_all().await.map_err(|e| e.to_string())?;
        let mut explained = None;
        for order in permutations(calls.len()) {
            let mut m = model.clone();
            let mut got = vec![None; calls.len()];
            // What a heartbeat could answer: its entry's status at any point of the order up to
            // its own write. A heartbeat does not read the entry every time (the Cassandra table
            // checks it once per renewal interval and otherwise answers from what its own last
            // write or check saw), so a write that completes while it runs may not show in its
            // answer; its effect on the stored time and the row tag is at its own position.
            let mut seen: Vec<Vec<Answer>> = vec![Vec::new(); calls.len()];
            for &k in &order {
                for (j, call) in calls.iter().enumerate() {
                    if let Call::Heartbeat(address, _) = call
                        && got[j].is_none()
                    {
                        seen[j].push(m.heartbeat_answer(address));
                    }
                }
                got[k] = Some(m.apply(&calls[k]));
            }
            let got: Vec<Answer> = got
                .into_iter()
                .map(|a| a.expect("every call applied"))
                .collect();
            let answers_agree = got.iter().zip(&answers).enumerate().all(|(k, (g, a))| {
                g == a || (matches!(calls[k], Call::Heartbeat(..)) && seen[k].contains(a))
            });
            if answers_agree
                && compare_state(
                    &after,
                    &m,
                    &mut Tags {
                        to_model: tags.to_model.clone(),
                        history: Vec::new(),
                    },
                )
                .is_ok()
            {
                explained = Some(m);
                break;
            }
        }
        model = explained.ok_or_else(|| {
            format!("step {i}: no sequential order explains answers {answers:?} to {calls:?}; state after: {after:?}")
        })?;
    }
    let last = table.read_all().await.map_err(|e| e.to_string())?;
    compare_state(&last, &model, &mut tags).map_err(|e| format!("at the end: {e}"))
}

fn resolve(
    op: &Op,
    snapshot: &MembershipSnapshot,
    model: &Model,
    tags: &Tags,
    start: Timestamp,
    base: Timestamp,
    n: usize,
) -> Call {
    let version_for = |choice: TagChoice| {
        let etag = tags.pick(choice, Some(&snapshot.version.etag), n);
        let model_tag = tags.to_model.get(&etag).copied();
        (
            TableVersion {
                version: snapshot.version.version + 1,
                etag,
            },
            model_tag,
        )
    };
    match *op {
        Op::Insert {
            silo,
            status,
            version,
        } => {
            let mut e = MembershipEntry::new(
                address(silo),
                SiloStatus::from_code(i32::from(status)).unwrap_or(SiloStatus::Joining),
                start.saturating_add(Duration::from_millis(n as u64)),
            );
            e.silo_name = format!("silo-{silo}-{n}");
            let (v, vt) = version_for(version);
            Call::Insert(e, v, vt)
        }
        Op::Update {
            silo,
            status,
            suspect,
            row,
            version,
        } => {
            let a = address(silo);
            let current = snapshot.get(&a);
            let mut e = current
                .map(|r| r.entry.clone())
                .unwrap_or_else(|| MembershipEntry::new(a, SiloStatus::Joining, start));
            e.status = SiloStatus::from_code(i32::from(status)).unwrap_or(SiloStatus::Active);
            if suspect {
                e.suspect_times.push(SuspectTime {
                    suspecting_silo: address((silo + 1) % POOL),
                    time: start.saturating_add(Duration::from_millis(100 + n as u64)),
                });
            }
            e.role_name = format!("updated-{n}");
            let row_etag = tags.pick(row, current.map(|r| &r.etag), n);
            let row_tag = tags.to_model.get(&row_etag).copied();
            // A tag the model issued for another row must not match this row either.
            let row_tag = row_tag.filter(|t| model.rows.get(&a).is_some_and(|(_, mt, _)| mt == t));
            let (v, vt) = version_for(version);
            Call::Update(e, row_etag, row_tag.or(Some(u64::MAX)), v, vt)
        }
        Op::Heartbeat { silo, offset_ms } => Call::Heartbeat(
            address(silo),
            base.saturating_add(Duration::from_millis(50 * n as u64 + u64::from(offset_ms))),
        ),
        Op::Cleanup { offset_ms } => {
            Call::Cleanup(start.saturating_add(Duration::from_millis(u64::from(offset_ms) * 10)))
        }
        Op::ReadRow { silo } => Call::ReadRow(address(silo)),
    }
}

fn permutations(n: usize) -> Vec<Vec<usize>> {
    fn go(rest: Vec<usize>, acc: Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if rest.is_empty() {
            out.push(acc);
            return;
        }
        for i in 0..rest.len() {
            let mut r = rest.clone();
            let x = r.remove(i);
            let mut a = acc.clone();
            a.push(x);
            go(r, a, out);
        }
    }
    let mut out = Vec::new();
    go((0..n).collect(), Vec::new(), &mut out);
    out
}

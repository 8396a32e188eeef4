//! The conformance suite: the contract's semantics written once, run against every backend.
//!
//! It covers the Orleans `MembershipTableTestsBase` checks (with the extended-protocol
//! assertions) and this crate's stricter guarantees. A backend proves itself with one line:
//!
//! ```text
//! cassandra_membership::conformance_tests!(my_harness());
//! ```
//!
//! Each case panics (like `assert!`) on a violation, naming what was expected.
//! Available with the `conformance` feature.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use async_trait::async_trait;

pub mod history;
pub mod model;
pub mod workload;

use crate::error::MembershipError;
use crate::model::{
    ETag, MembershipEntry, MembershipSnapshot, SiloAddress, SiloStatus, SuspectTime, TableVersion,
    Timestamp,
};
use crate::table::{HeartbeatOutcome, MembershipTable};

/// What the suite needs from a backend: tables on clusters it names.
#[async_trait]
pub trait Harness: Send + Sync {
    /// A table bound to `cluster_id`, sharing storage with every other table this harness made.
    /// The suite calls `initialize` itself.
    async fn table(&self, cluster_id: &str) -> Arc<dyn MembershipTable>;
}

static GENERATION: AtomicI32 = AtomicI32::new(1);

/// A cluster id nobody else uses.
pub fn fresh_cluster_id(case: &str) -> String {
    format!("{case}-{}", uuid::Uuid::new_v4().simple())
}

/// An Orleans-suite entry: 127.0.0.1:12345, a new generation, status Joining, whole-second times.
pub fn new_entry(now: Timestamp) -> MembershipEntry {
    let generation = GENERATION.fetch_add(1, Ordering::Relaxed);
    let address = SiloAddress::from_v4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 12345), generation);
    let whole = Timestamp::from_millis(now.as_millis() - now.as_millis().rem_euclid(1000));
    let mut e = MembershipEntry::new(address, SiloStatus::Joining, whole);
    e.host_name = "host".into();
    e.silo_name = format!("silo-{generation}");
    e.role_name = "role".into();
    e.proxy_port = 30000;
    e.update_zone = 1;
    e.fault_zone = 2;
    e
}

async fn fresh<H: Harness + ?Sized>(h: &H, case: &str) -> Arc<dyn MembershipTable> {
    let t = h.table(&fresh_cluster_id(case)).await;
    t.initialize(true).await.expect("initialize");
    t
}

fn one_row(s: &MembershipSnapshot) -> &crate::model::MembershipRow {
    assert_eq!(s.rows.len(), 1, "expected exactly one row in {s:?}");
    &s.rows[0]
}

/// (Orleans case 1) Reading an empty table: no members, version 0, a version tag present.
pub async fn read_all_on_empty_table<H: Harness + ?Sized>(h: &H) {
    let t = fresh(h, "empty").await;
    let s = t.read_all().await.unwrap();
    assert!(s.rows.is_empty());
    assert_eq!(s.version.version, 0);
    assert!(
        !s.version.etag.is_absent(),
        "initialize(true) must store a version tag"
    );
}

/// (Orleans case 2) Insert with `next()` succeeds; the version becomes 1; one member.
pub async fn insert_row_moves_version<H: Harness + ?Sized>(h: &H) {
    let t = fresh(h, "insert").await;
    let v = t.read_all().await.unwrap().version;
    let e = new_entry(Timestamp::now());
    assert!(t.insert_row(&e, &v.next()).await.unwrap());
    let s = t.read_all().await.unwrap();
    assert_eq!(s.version.version, 1);
    assert_ne!(s.version.etag, v.etag);
    assert_eq!(one_row(&s).entry, e);
}

async fn duplicate_and_stale_inserts<H: Harness + ?Sized>(h: &H, via_read_all: bool) {
    let t = fresh(h, "dup").await;
    let v0 = t.read_all().await.unwrap().version;
    let e = new_entry(Timestamp::now());
    let next = v0.next();
    assert!(t.insert_row(&e, &next).await.unwrap());
    assert!(
        !t.insert_row(&e, &next).await.unwrap(),
        "the same insert twice must fail"
    );
    let other = new_entry(Timestamp::now());
    assert!(
        !t.insert_row(&other, &next).await.unwrap(),
        "an insert with a stale version must fail"
    );
    let v1 = t.read_all().await.unwrap().version;
    assert!(
        !t.insert_row(&e, &v1.next()).await.unwrap(),
        "a duplicate row with the current version must fail"
    );
    let s = if via_read_all {
        t.read_all().await.unwrap()
    } else {
        t.read_row(&e.address).await.unwrap()
    };
    assert_eq!(s.version.version, 1);
    assert_ne!(
        s.version.etag, next.etag,
        "the table tag must change on insert"
    );
    let row = one_row(&s);
    assert!(!row.etag.is_absent());
    assert_eq!(row.entry, e);
    assert!(t.read_row(&other.address).await.unwrap().rows.is_empty());
}

/// (Orleans case 3) Duplicate and stale inserts fail, read back through `read_row`.
pub async fn duplicate_and_stale_inserts_fail_read_row<H: Harness + ?Sized>(h: &H) {
    duplicate_and_stale_inserts(h, false).await
}

/// (Orleans case 4) Duplicate and stale inserts fail, read back through `read_all`.
pub async fn duplicate_and_stale_inserts_fail_read_all<H: Harness + ?Sized>(h: &H) {
    duplicate_and_stale_inserts(h, true).await
}

/// (Orleans case 5) Nine rounds of insert and update with suspect times; stale updates fail with no effect.
pub async fn update_row_rounds<H: Harness + ?Sized>(h: &H) {
    let t = fresh(h, "update").await;
    let now = Timestamp::now();
    for round in 1..=9usize {
        let v = t.read_all().await.unwrap().version;
        let mut e = new_entry(now);
        assert!(t.insert_row(&e, &v.next()).await.unwrap());
        let s = t.read_row(&e.address).await.unwrap();
        let row_etag = one_row(&s).etag.clone();
        // A stale version (the one the insert consumed).
        e.status = SiloStatus::Active;
        e.suspect_times = vec![
            SuspectTime {
                suspecting_silo: new_entry(now).address,
                time: now.saturating_sub(Duration::from_millis(1234)),
            },
            SuspectTime {
                suspecting_silo: new_entry(now).address,
                time: now.saturating_add(Duration::from_millis(77)),
            },
        ];
        assert!(!t.update_row(&e, &row_etag, &v.next()).await.unwrap());
        let current = s.version.next();
        assert!(t.update_row(&e, &row_etag, &current).await.unwrap());
        assert!(
            !t.update_row(&e, &row_etag, &current).await.unwrap(),
            "the same update twice must fail"
        );
        let after = t.read_row(&e.address).await.unwrap();
        let stored = one_row(&after);
        assert_eq!(stored.entry, e, "every field must read back as written");
        assert_ne!(stored.etag, row_etag);
        assert!(
            !t.update_row(&e, &row_etag, &after.version.next())
                .await
                .unwrap()
        );
        assert_eq!(
            one_row(&t.read_row(&e.address).await.unwrap()).etag,
            stored.etag,
            "a failed update must leave the row tag unchanged"
        );
        assert_eq!(t.read_all().await.unwrap().rows.len(), round);
    }
}

/// (Orleans case 6) 20 parallel inserts of one entry: exactly one wins. Then 19 workers loop read → update
/// until each succeeded once: version 20, one member.
///
/// Under contention a conditional write may answer `OutcomeUnknown` (the contract allows it: on a
/// replicated cluster Paxos rounds that duel can time out); such an answer counts as neither a win
/// nor a loss, and the state read afterwards must be explained by the definite answers plus some
/// of the unknown ones. A backend that never answers unknown is held to the exact numbers.
pub async fn parallel_inserts_and_update_loops<H: Harness + ?Sized>(h: &H) {
    let t = fresh(h, "parallel").await;
    let v = t.read_all().await.unwrap().version.next();
    let e = new_entry(Timestamp::now());
    let inserts = (0..20).map(|_| {
        let (t, e, v) = (Arc::clone(&t), e.clone(), v.clone());
        tokio::spawn(async move { definite(t.insert_row(&e, &v).await) })
    });
    let answers = futures_join(inserts).await;
    let wins = answers.iter().filter(|a| **a == Some(true)).count();
    let unknown = answers.iter().filter(|a| a.is_none()).count();
    assert!(
        wins <= 1,
        "at most one of 20 concurrent inserts wins: {wins}"
    );
    let s = t.read_all().await.unwrap();
    assert_eq!(s.rows.len(), 1, "the entry was inserted exactly once");
    assert_eq!(s.version.version, 1, "one insert applied");
    assert!(
        wins == 1 || unknown > 0,
        "the insert that applied answered true, or its answer was unknown"
    );

    let workers = (0..19).map(|_| {
        let t = Arc::clone(&t);
        let address = e.address;
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            let mut unknown = 0u64;
            loop {
                let s = t.read_row(&address).await.unwrap();
                let row = one_row(&s).clone();
                let mut entry = row.entry.clone();
                entry.status = SiloStatus::Active;
                match definite(t.update_row(&entry, &row.etag, &s.version.next()).await) {
                    Some(true) => return unknown,
                    Some(false) => {}
                    None => unknown += 1,
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "update loop did not finish in 60 s"
                );
                tokio::time::sleep(Duration::from_millis(rand::random_range(1..20))).await;
            }
        })
    });
    let unknown: u64 = futures_join(workers).await.into_iter().sum();
    let s = t.read_all().await.unwrap();
    // 1 insert + 19 updates that answered true, plus any update whose answer was unknown.
    assert!(
        (20..=20 + unknown).contains(&s.version.version),
        "version {} after 19 definite updates and {unknown} unknown ones",
        s.version.version
    );
    assert_eq!(s.rows.len(), 1);
}

/// `Some(applied)` for a definite answer, `None` for `OutcomeUnknown`; any other error fails.
fn definite(r: crate::error::Result<bool>) -> Option<bool> {
    match r {
        Ok(applied) => Some(applied),
        Err(MembershipError::OutcomeUnknown { .. }) => None,
        Err(e) => panic!("a conditional write answers true, false or OutcomeUnknown: {e:?}"),
    }
}

/// (Orleans case 7) A heartbeat stores the time and does not move the version. It gives the row
/// a new tag (this crate's rule, see [`a_vote_decided_before_a_heartbeat_does_not_apply`]): a
/// write decided on a read from before it must not apply.
pub async fn i_am_alive_does_not_move_version<H: Harness + ?Sized>(h: &H) {
    let t = fresh(h, "alive").await;
    let v = t.read_all().await.unwrap().version;
    let e = new_entry(Timestamp::now());
    assert!(t.insert_row(&e, &v.next()).await.unwrap());
    let before = t.read_row(&e.address).await.unwrap();
    let alive = e.i_am_alive_time.saturating_add(Duration::from_secs(5));
    let outcome = t.update_i_am_alive(&e.address, alive).await.unwrap();
    assert!(
        matches!(outcome, HeartbeatOutcome::Refreshed { .. }),
        "{outcome:?}"
    );
    let after = t.read_row(&e.address).await.unwrap();
    assert_eq!(one_row(&after).entry.i_am_alive_time, alive);
    assert_eq!(after.version, before.version);
    assert_ne!(
        one_row(&after).etag,
        one_row(&before).etag,
        "a heartbeat that moves the I-am-alive time must change the row tag"
    );
    let mut expected = e.clone();
    expected.i_am_alive_time = alive;
    assert_eq!(
        one_row(&after).entry,
        expected,
        "only the I-am-alive time may change"
    );
}

/// A death vote decided on a read is refused once the suspect's I-am-alive time moved after that
/// read, even though neither the version nor the entry changed: a silo that heartbeats again
/// must not be declared dead by a decision made while it was silent. A vote decided on a read
/// taken after the heartbeat applies.
pub async fn a_vote_decided_before_a_heartbeat_does_not_apply<H: Harness + ?Sized>(h: &H) {
    let t = fresh(h, "vote-heartbeat").await;
    let v = t.read_all().await.unwrap().version;
    let suspect = new_entry(Timestamp::now()).with_status(SiloStatus::Active);
    assert!(t.insert_row(&suspect, &v.next()).await.unwrap());
    let voter = new_entry(Timestamp::now()).address;
    for via_read_all in [true, false] {
        let read = if via_read_all {
            t.read_all().await.unwrap()
        } else {
            t.read_row(&suspect.address).await.unwrap()
        };
        let row = read
            .get(&suspect.address)
            .expect("the suspect's row")
            .clone();
        // The silo publishes a later I-am-alive time after the voter's read.
        let alive = row
            .entry
            .i_am_alive_time
            .saturating_add(Duration::from_secs(1));
        t.update_i_am_alive(&suspect.address, alive).await.unwrap();
        let before = t.read_all().await.unwrap();
        for dead in [true, false] {
            let mut vote = row.entry.clone();
            vote.suspect_times.push(SuspectTime {
                suspecting_silo: voter,
                time: alive,
            });
            if dead {
                vote.status = SiloStatus::Dead;
            }
            assert!(
                !t.update_row(&vote, &row.etag, &read.version.next())
                    .await
                    .unwrap(),
                "a vote (dead: {dead}, read via read_all: {via_read_all}) decided before the \
                 suspect's heartbeat applied"
            );
        }
        let after = t.read_all().await.unwrap();
        assert_eq!(after, before, "a refused vote must change nothing");
        assert_eq!(
            after.get(&suspect.address).unwrap().entry.status,
            SiloStatus::Active
        );
    }
    // A vote decided on a read that shows the heartbeat applies.
    let read = t.read_row(&suspect.address).await.unwrap();
    let row = one_row(&read).clone();
    let mut vote = row.entry.clone();
    vote.status = SiloStatus::Dead;
    assert!(
        t.update_row(&vote, &row.etag, &read.version.next())
            .await
            .unwrap(),
        "a vote decided after the heartbeat must apply"
    );
    let stored = t.read_row(&suspect.address).await.unwrap();
    assert_eq!(one_row(&stored).entry.status, SiloStatus::Dead);
}

/// (Orleans case 8) Cleanup of defunct entries leaves exactly the fresh Joining and the old Active one.
pub async fn cleanup_defunct_leaves_fresh_and_active<H: Harness + ?Sized>(h: &H) {
    let t = fresh(h, "cleanup").await;
    let now = Timestamp::now();
    let old = now.saturating_sub(Duration::from_secs(10 * 24 * 3600));
    let mut keep = BTreeSet::new();
    let mut entries = Vec::new();
    for status in SiloStatus::ALL {
        entries.push(new_entry(old).with_status(status));
    }
    entries.push(new_entry(old).with_status(SiloStatus::Dead));
    entries.push(new_entry(old).with_status(SiloStatus::Joining));
    let fresh_joining = new_entry(now).with_status(SiloStatus::Joining);
    entries.push(fresh_joining.clone());
    for e in &entries {
        let v = t.read_all().await.unwrap().version;
        assert!(t.insert_row(e, &v.next()).await.unwrap());
        if e.status == SiloStatus::Active || e.address == fresh_joining.address {
            keep.insert(e.address);
        }
    }
    let version = t.read_all().await.unwrap().version;
    let removed = t
        .cleanup_defunct(old.saturating_add(Duration::from_secs(3 * 24 * 3600)))
        .await
        .unwrap();
    assert_eq!(removed, entries.len() - 2);
    let s = t.read_all().await.unwrap();
    let left: BTreeSet<_> = s.rows.iter().map(|r| r.entry.address).collect();
    assert_eq!(left, keep);
    assert_eq!(s.version, version, "cleanup does not move the version");
}

/// A recent suspicion or heartbeat keeps an old, non-Active entry from cleanup.
pub async fn cleanup_counts_suspicions_and_heartbeats<H: Harness + ?Sized>(h: &H) {
    let t = fresh(h, "cleanup-recent").await;
    let now = Timestamp::now();
    let old = now.saturating_sub(Duration::from_secs(10 * 24 * 3600));
    let mut suspected = new_entry(old).with_status(SiloStatus::Dead);
    suspected.suspect_times.push(SuspectTime {
        suspecting_silo: new_entry(now).address,
        time: now,
    });
    let heartbeating = new_entry(old).with_status(SiloStatus::Joining);
    let stale = new_entry(old).with_status(SiloStatus::Dead);
    for e in [&suspected, &heartbeating, &stale] {
        let v = t.read_all().await.unwrap().version;
        assert!(t.insert_row(e, &v.next()).await.unwrap());
    }
    t.update_i_am_alive(&heartbeating.address, now)
        .await
        .unwrap();
    let removed = t
        .cleanup_defunct(now.saturating_sub(Duration::from_secs(3600)))
        .await
        .unwrap();
    assert_eq!(removed, 1);
    let left: BTreeSet<_> = t
        .read_all()
        .await
        .unwrap()
        .rows
        .iter()
        .map(|r| r.entry.address)
        .collect();
    assert_eq!(
        left,
        BTreeSet::from([suspected.address, heartbeating.address])
    );
}

/// `update_row` on a missing row returns false and creates nothing.
pub async fn update_on_missing_row_returns_false_and_creates_nothing<H: Harness + ?Sized>(h: &H) {
    let t = fresh(h, "update-missing").await;
    let v = t.read_all().await.unwrap().version;
    let e = new_entry(Timestamp::now());
    assert!(!t.update_row(&e, &ETag::random(), &v.next()).await.unwrap());
    assert!(!t.update_row(&e, &ETag::absent(), &v.next()).await.unwrap());
    let s = t.read_all().await.unwrap();
    assert!(s.rows.is_empty());
    assert_eq!(s.version, v, "a failed update must not move the version");
}

/// `update_row` checks the row tag, not only the version.
pub async fn update_with_wrong_row_etag_fails<H: Harness + ?Sized>(h: &H) {
    let t = fresh(h, "update-etag").await;
    let v = t.read_all().await.unwrap().version;
    let e = new_entry(Timestamp::now());
    assert!(t.insert_row(&e, &v.next()).await.unwrap());
    let s = t.read_all().await.unwrap();
    let changed = e.clone().with_status(SiloStatus::Active);
    assert!(
        !t.update_row(&changed, &ETag::random(), &s.version.next())
            .await
            .unwrap()
    );
    let after = t.read_all().await.unwrap();
    assert_eq!(after, s, "a rejected update must change nothing");
}

/// A heartbeat for a silo without an entry reports it and writes nothing.
pub async fn heartbeat_on_missing_entry_reports_not_found<H: Harness + ?Sized>(h: &H) {
    let t = fresh(h, "alive-missing").await;
    let e = new_entry(Timestamp::now());
    let outcome = t
        .update_i_am_alive(&e.address, Timestamp::now())
        .await
        .unwrap();
    assert_eq!(outcome, HeartbeatOutcome::NotFound);
    let v = t.read_all().await.unwrap().version;
    assert!(t.read_all().await.unwrap().rows.is_empty());
    // Nothing was left behind that would block or pollute a later insert.
    assert!(t.insert_row(&e, &v.next()).await.unwrap());
    assert_eq!(one_row(&t.read_all().await.unwrap()).entry, e);
}

/// A heartbeat on an entry declared Dead says so.
pub async fn heartbeat_on_dead_entry_reports_declared_dead<H: Harness + ?Sized>(h: &H) {
    let t = fresh(h, "alive-dead").await;
    let v = t.read_all().await.unwrap().version;
    let e = new_entry(Timestamp::now()).with_status(SiloStatus::Dead);
    assert!(t.insert_row(&e, &v.next()).await.unwrap());
    let outcome = t
        .update_i_am_alive(&e.address, Timestamp::now())
        .await
        .unwrap();
    assert!(
        matches!(outcome, HeartbeatOutcome::DeclaredDead { .. }),
        "{outcome:?}"
    );
}

/// The I-am-alive time only moves forward, whichever call wrote it.
pub async fn i_am_alive_time_only_moves_forward<H: Harness + ?Sized>(h: &H) {
    let t = fresh(h, "alive-forward").await;
    let v = t.read_all().await.unwrap().version;
    let e = new_entry(Timestamp::now());
    assert!(t.insert_row(&e, &v.next()).await.unwrap());
    let later = e.i_am_alive_time.saturating_add(Duration::from_secs(10));
    t.update_i_am_alive(&e.address, later).await.unwrap();
    t.update_i_am_alive(&e.address, e.i_am_alive_time)
        .await
        .unwrap();
    let s = t.read_row(&e.address).await.unwrap();
    assert_eq!(one_row(&s).entry.i_am_alive_time, later);
    // An update carrying an older time does not move it back either.
    let row = one_row(&s).clone();
    let mut changed = e.clone().with_status(SiloStatus::Active);
    changed.i_am_alive_time = e.i_am_alive_time;
    assert!(
        t.update_row(&changed, &row.etag, &s.version.next())
            .await
            .unwrap()
    );
    let after = t.read_row(&e.address).await.unwrap();
    assert_eq!(one_row(&after).entry.status, SiloStatus::Active);
    assert_eq!(one_row(&after).entry.i_am_alive_time, later);
}

/// Every field survives a round trip, including IPv6 addresses, long Unicode names and
/// extreme numbers.
pub async fn full_field_round_trip<H: Harness + ?Sized>(h: &H) {
    let t = fresh(h, "fields").await;
    let v = t.read_all().await.unwrap().version;
    let now = Timestamp::now();
    let address = SiloAddress::new(
        SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 65535),
        i32::MIN,
    )
    .unwrap();
    let e = MembershipEntry {
        address,
        status: SiloStatus::ShuttingDown,
        suspect_times: (0..5)
            .map(|i| SuspectTime {
                suspecting_silo: SiloAddress::from_v4(
                    SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, i), 1),
                    i32::from(i),
                ),
                time: Timestamp::from_millis(now.as_millis() + i64::from(i) * 7),
            })
            .collect(),
        proxy_port: u16::MAX,
        host_name: "hôte-ünïcødé-🚀".repeat(20),
        silo_name: String::new(),
        role_name: "r\"o'l;e --".into(),
        update_zone: i32::MIN,
        fault_zone: i32::MAX,
        start_time: Timestamp::from_millis(1),
        i_am_alive_time: now,
    };
    assert!(t.insert_row(&e, &v.next()).await.unwrap());
    assert_eq!(one_row(&t.read_row(&address).await.unwrap()).entry, e);
    assert_eq!(one_row(&t.read_all().await.unwrap()).entry, e);
}

/// Deleting one cluster removes its rows and version, leaves another cluster with the same silo
/// addresses alone, and the deleted cluster is usable again after `initialize`.
pub async fn delete_cluster_isolated_and_reusable<H: Harness + ?Sized>(h: &H) {
    let (id_a, id_b) = (fresh_cluster_id("del-a"), fresh_cluster_id("del-b"));
    let a = h.table(&id_a).await;
    let b = h.table(&id_b).await;
    a.initialize(true).await.unwrap();
    b.initialize(true).await.unwrap();
    let e = new_entry(Timestamp::now());
    for t in [&a, &b] {
        let v = t.read_all().await.unwrap().version;
        assert!(t.insert_row(&e, &v.next()).await.unwrap());
        t.update_i_am_alive(&e.address, Timestamp::now())
            .await
            .unwrap();
    }
    let b_before = b.read_all().await.unwrap();
    b.delete_cluster(&id_a).await.unwrap();
    let a_after = a.read_all().await.unwrap();
    assert!(a_after.rows.is_empty());
    assert_eq!(a_after.version.version, 0);
    assert_eq!(
        b.read_all().await.unwrap(),
        b_before,
        "another cluster must be untouched"
    );
    a.initialize(true).await.unwrap();
    let v = a.read_all().await.unwrap().version;
    assert_eq!(v.version, 0);
    assert!(a.insert_row(&e, &v.next()).await.unwrap());
    let s = a.read_all().await.unwrap();
    assert_eq!(
        one_row(&s).entry,
        e,
        "a re-inserted entry must not inherit old heartbeats"
    );
    assert_eq!(s.version.version, 1);
}

/// `initialize` is idempotent and safe when many silos call it at once.
pub async fn concurrent_initialize_is_idempotent<H: Harness + ?Sized>(h: &H) {
    let id = fresh_cluster_id("init");
    let t = h.table(&id).await;
    let calls = (0..10).map(|_| {
        let t = Arc::clone(&t);
        tokio::spawn(async move { t.initialize(true).await.unwrap() })
    });
    futures_join(calls).await;
    let v = t.read_all().await.unwrap().version;
    assert_eq!(v.version, 0);
    let e = new_entry(Timestamp::now());
    assert!(t.insert_row(&e, &v.next()).await.unwrap());
    t.initialize(true).await.unwrap();
    let s = t.read_all().await.unwrap();
    assert_eq!(
        s.version.version, 1,
        "initialize must not reset an existing version"
    );
    assert_eq!(s.rows.len(), 1);
}

/// A reader that only initializes without a version sees the absent version, and an insert
/// conditioned on it still works (the first writer creates the version).
pub async fn absent_version_reads_as_zero<H: Harness + ?Sized>(h: &H) {
    let t = h.table(&fresh_cluster_id("absent")).await;
    t.initialize(false).await.unwrap();
    let s = t.read_all().await.unwrap();
    assert_eq!(s.version, TableVersion::absent());
    let e = new_entry(Timestamp::now());
    assert!(
        !t.insert_row(
            &e,
            &TableVersion {
                version: 1,
                etag: ETag::random()
            }
        )
        .await
        .unwrap()
    );
    assert!(t.insert_row(&e, &s.version.next()).await.unwrap());
    assert_eq!(t.read_all().await.unwrap().version.version, 1);
}

async fn futures_join<T: Send + 'static>(
    handles: impl IntoIterator<Item = tokio::task::JoinHandle<T>>,
) -> Vec<T> {
    let mut out = Vec::new();
    for h in handles.into_iter().collect::<Vec<_>>() {
        match h.await {
            Ok(v) => out.push(v),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    out
}

trait WithStatus {
    fn with_status(self, status: SiloStatus) -> Self;
}

impl WithStatus for MembershipEntry {
    fn with_status(mut self, status: SiloStatus) -> Self {
        self.status = status;
        self
    }
}

/// Generates one `#[tokio::test]` per conformance case for the harness expression given.
#[macro_export]
macro_rules! conformance_tests {
    ($harness:expr) => {
        $crate::conformance_tests!(@cases $harness;
            read_all_on_empty_table,
            insert_row_moves_version,
            duplicate_and_stale_inserts_fail_read_row,
            duplicate_and_stale_inserts_fail_read_all,
            update_row_rounds,
            parallel_inserts_and_update_loops,
            i_am_alive_does_not_move_version,
            a_vote_decided_before_a_heartbeat_does_not_apply,
            cleanup_defunct_leaves_fresh_and_active,
            cleanup_counts_suspicions_and_heartbeats,
            update_on_missing_row_returns_false_and_creates_nothing,
            update_with_wrong_row_etag_fails,
            heartbeat_on_missing_entry_reports_not_found,
            heartbeat_on_dead_entry_reports_declared_dead,
            i_am_alive_time_only_moves_forward,
            full_field_round_trip,
            delete_cluster_isolated_and_reusable,
            concurrent_initialize_is_idempotent,
            absent_version_reads_as_zero,
        );
    };
    (@cases $harness:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let harness = $harness;
                $crate::conformance::$case(&harness).await;
            }
        )*
    };
}

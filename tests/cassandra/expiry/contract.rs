//! The expiry contract point by point, with a short TTL: never early, a stopped silo and a
//! stopped cluster expire within the slack and never partially, a heartbeat never reverts a
//! concurrent change, expiry keeps the version, a heartbeat stays cheap.
//!
//! TTL 4 s (DefunctSiloExpiration), renewal interval 1 s, so every write carries TTL 6 s
//! (TTL + renewal + 1 s for Cassandra's whole-second clock).

use std::sync::Arc;
use std::time::{Duration, Instant};

use cassandra_membership::conformance::{self, model, new_entry};
use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, HeartbeatOutcome, MembershipEntry,
    MembershipOptions, MembershipTable, SiloStatus, SuspectTime, Timestamp,
};
use proptest::prelude::*;
use scylla::client::session::Session;

use crate::utils::{KEYSPACE, count_rows, options, session_with_keyspace, table_on, unique};

const TTL: Duration = Duration::from_secs(4);
/// Renewal interval (1 s) + the extra second every write carries.
const SLACK: Duration = Duration::from_secs(2);
const TABLE: &str = "membership_ttl4";

fn short_ttl(o: CassandraClusteringOptions) -> CassandraClusteringOptions {
    let mut m = MembershipOptions::default();
    m.defunct_silo_expiration = TTL;
    m.i_am_alive_table_publish_timeout = Duration::from_millis(500);
    o.ttl(true).membership(m)
}

async fn ttl_table(cluster: &str) -> (Arc<Session>, CassandraMembershipTable) {
    let s = session_with_keyspace().await;
    let t = table_on(&s, short_ttl(options(cluster).table(TABLE)));
    t.initialize(true).await.unwrap();
    (s, t)
}

async fn insert(t: &dyn MembershipTable, e: &MembershipEntry) {
    let v = t.read_all().await.unwrap().version;
    assert!(t.insert_row(e, &v.next()).await.unwrap());
}

/// Everything stored in a cluster's partition, read directly: its rows, the version's included.
async fn raw_partition(s: &Session, table: &str, cluster: &str) -> usize {
    count_rows(s, format!("SELECT silo, version FROM {KEYSPACE}.{table} WHERE service_id = 'test-service' AND cluster_id = ?"), (cluster,)).await
}

async fn raw_ttl(s: &Session, table: &str, cluster: &str, silo: &str, column: &str) -> Option<i32> {
    let row: Option<(Option<i32>,)> = s
        .query_unpaged(
            format!(
                "SELECT TTL({column}) FROM {KEYSPACE}.{table} WHERE service_id = 'test-service' AND cluster_id = ? AND silo = ?"
            ),
            (cluster, silo),
        )
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .maybe_first_row()
        .unwrap();
    row.and_then(|r| r.0)
}

fn heartbeater(
    t: Arc<CassandraMembershipTable>,
    e: MembershipEntry,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let outcome = t
                .update_i_am_alive(&e.address, Timestamp::now())
                .await
                .unwrap();
            assert!(
                matches!(outcome, HeartbeatOutcome::Refreshed { .. }),
                "{outcome:?}"
            );
            tokio::time::sleep(every).await;
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_early_an_entry_heartbeating_for_three_ttls_stays_complete() {
    let cluster = unique("never-early");
    let (s, t) = ttl_table(&cluster).await;
    let t = Arc::new(t);
    let e = new_entry(Timestamp::now());
    insert(t.as_ref(), &e).await;
    let ttl = raw_ttl(&s, TABLE, &cluster, &e.address.to_string(), "entry").await;
    assert!(
        matches!(ttl, Some(1..=6)),
        "cells must carry the write TTL, found {ttl:?}"
    );
    let hb = heartbeater(Arc::clone(&t), e.clone(), Duration::from_millis(500));
    let started = Instant::now();
    let mut samples = 0;
    while started.elapsed() < TTL * 3 + Duration::from_secs(1) {
        let snapshot = t.read_all().await.unwrap();
        assert_eq!(snapshot.version.version, 1, "the version must stay intact");
        assert_eq!(
            snapshot.rows.len(),
            1,
            "the entry must never disappear while heartbeating"
        );
        let mut stored = snapshot.rows[0].entry.clone();
        stored.i_am_alive_time = e.i_am_alive_time;
        assert_eq!(stored, e, "every field stays");
        samples += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    hb.abort();
    assert!(samples > 20, "{samples} samples");
    // The version is still the one the protocol wrote: an insert with it succeeds.
    insert(t.as_ref(), &new_entry(Timestamp::now())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_silo_expires_after_the_ttl_within_the_slack_and_never_partially() {
    let cluster = unique("expires");
    let (s, t) = ttl_table(&cluster).await;
    let t = Arc::new(t);
    let (stopping, staying) = (new_entry(Timestamp::now()), new_entry(Timestamp::now()));
    insert(t.as_ref(), &stopping).await;
    insert(t.as_ref(), &staying).await;
    let keep_alive = heartbeater(Arc::clone(&t), staying.clone(), Duration::from_millis(500));
    for _ in 0..4 {
        t.update_i_am_alive(&stopping.address, Timestamp::now())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let last_heartbeat = Timestamp::now();
    t.update_i_am_alive(&stopping.address, last_heartbeat)
        .await
        .unwrap();
    let stopped_at = Instant::now();
    let snapshot = t.read_all().await.unwrap();
    let stale = snapshot.get(&stopping.address).unwrap().clone();
    // Sample reads through the whole expiry window: the entry is complete or absent, never partial.
    let gone_after = loop {
        let s = t.read_all().await.unwrap();
        match s.get(&stopping.address) {
            Some(row) => {
                assert_eq!(
                    row.entry, stale.entry,
                    "an expiring entry is read whole or not at all"
                );
                assert_eq!(row.etag, stale.etag);
            }
            None => break stopped_at.elapsed(),
        }
        assert!(
            stopped_at.elapsed() < TTL + SLACK + Duration::from_secs(3),
            "the entry never expired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    eprintln!(
        "expiry slack seen: entry gone {gone_after:?} after its last heartbeat (TTL {TTL:?})"
    );
    assert!(
        gone_after >= TTL - Duration::from_millis(100),
        "expired early: {gone_after:?}"
    );
    assert!(
        gone_after <= TTL + SLACK + Duration::from_millis(1500),
        "expired late: {gone_after:?}"
    );
    // Nothing is left that a later write could resurrect, and those writes say so.
    let key = stopping.address.to_string();
    let raw_rows = count_rows(&s, format!("SELECT silo FROM {KEYSPACE}.{TABLE} WHERE service_id = 'test-service' AND cluster_id = ? AND silo = ?"), (&cluster, &key)).await;
    assert_eq!(raw_rows, 0);
    assert_eq!(
        t.update_i_am_alive(&stopping.address, Timestamp::now())
            .await
            .unwrap(),
        HeartbeatOutcome::NotFound
    );
    let now = t.read_all().await.unwrap();
    let mut revived = stale.entry.clone();
    revived.status = SiloStatus::Active;
    assert!(
        !t.update_row(&revived, &stale.etag, &now.version.next())
            .await
            .unwrap()
    );
    assert!(t.read_row(&stopping.address).await.unwrap().rows.is_empty());
    assert_eq!(
        t.read_all().await.unwrap().rows.len(),
        1,
        "the heartbeating silo stays"
    );
    keep_alive.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_silo_stops_the_whole_cluster_disappears_and_restarts_at_version_zero() {
    let cluster = unique("all-stop");
    let (s, t) = ttl_table(&cluster).await;
    let t = Arc::new(t);
    let silos = [new_entry(Timestamp::now()), new_entry(Timestamp::now())];
    for e in &silos {
        insert(t.as_ref(), e).await;
    }
    let beats: Vec<_> = silos
        .iter()
        .map(|e| heartbeater(Arc::clone(&t), e.clone(), Duration::from_millis(500)))
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    for b in &beats {
        b.abort();
    }
    let stopped = Instant::now();
    drop(t); // no silo of the cluster runs any more
    let gone_after = loop {
        if raw_partition(&s, TABLE, &cluster).await == 0 {
            break stopped.elapsed();
        }
        assert!(
            stopped.elapsed() < TTL + SLACK + Duration::from_secs(3),
            "the cluster never disappeared"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!(
        "whole cluster (rows, version, heartbeats) gone {gone_after:?} after the last heartbeat"
    );
    assert!(gone_after >= TTL - Duration::from_millis(600));
    // The same cluster id starts cleanly.
    let again = table_on(&s, short_ttl(options(&cluster).table(TABLE)));
    again.initialize(true).await.unwrap();
    let v = again.read_all().await.unwrap();
    assert_eq!(v.version.version, 0);
    assert!(v.rows.is_empty());
    insert(&again, &new_entry(Timestamp::now())).await;
    assert_eq!(again.read_all().await.unwrap().version.version, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_never_reverts_a_concurrent_membership_change() {
    let cluster = unique("no-revert");
    let (s, heartbeats) = ttl_table(&cluster).await;
    let other_silo = table_on(&s, short_ttl(options(&cluster).table(TABLE)));
    let heartbeats = Arc::new(heartbeats);
    let target = new_entry(Timestamp::now());
    insert(heartbeats.as_ref(), &target).await;
    // The target heartbeats as fast as it can (renewing its TTL every second) while another
    // silo adds suspicions and finally declares it dead.
    let hb = {
        let t = Arc::clone(&heartbeats);
        let a = target.address;
        tokio::spawn(async move {
            let mut dead_seen: Option<Instant> = None;
            // Until well after it learnt it is Dead (the votes lose to every heartbeat that
            // lands between their read and their write, so they take a while), bounded.
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(60)
                && dead_seen.is_none_or(|d| d.elapsed() < Duration::from_secs(1))
            {
                match t.update_i_am_alive(&a, Timestamp::now()).await.unwrap() {
                    HeartbeatOutcome::DeclaredDead { .. } => {
                        dead_seen.get_or_insert(Instant::now());
                    }
                    HeartbeatOutcome::Refreshed { .. } => {
                        assert!(dead_seen.is_none(), "Dead never reverts")
                    }
                    HeartbeatOutcome::NotFound => panic!("the entry must not vanish"),
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            dead_seen
        })
    };
    let mut expected_suspicions = Vec::new();
    for round in 0..12 {
        loop {
            let snap = other_silo.read_row(&target.address).await.unwrap();
            let row = snap.rows[0].clone();
            let mut changed = row.entry.clone();
            let vote = SuspectTime {
                suspecting_silo: new_entry(Timestamp::now()).address,
                time: Timestamp::now(),
            };
            changed.suspect_times = expected_suspicions.clone();
            changed.suspect_times.push(vote.clone());
            if round == 11 {
                changed.status = SiloStatus::Dead;
            }
            if other_silo
                .update_row(&changed, &row.etag, &snap.version.next())
                .await
                .unwrap()
            {
                expected_suspicions.push(vote);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let dead_declared_at = Instant::now();
    let dead_seen = hb
        .await
        .unwrap()
        .expect("the heartbeating silo learns it was declared dead");
    assert!(
        dead_seen.duration_since(dead_declared_at) <= Duration::from_secs(2),
        "learned within a renewal"
    );
    let stored = heartbeats.read_row(&target.address).await.unwrap().rows[0]
        .entry
        .clone();
    assert_eq!(stored.status, SiloStatus::Dead);
    assert_eq!(
        stored.suspect_times, expected_suspicions,
        "no suspicion was lost to a heartbeat"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_keeps_the_version_so_old_snapshots_stay_valid_except_for_the_expired_row() {
    let cluster = unique("versions");
    let (_, t) = ttl_table(&cluster).await;
    let t = Arc::new(t);
    let (expiring, staying) = (new_entry(Timestamp::now()), new_entry(Timestamp::now()));
    insert(t.as_ref(), &expiring).await;
    insert(t.as_ref(), &staying).await;
    let keep_alive = heartbeater(Arc::clone(&t), staying.clone(), Duration::from_millis(500));
    let old = t.read_all().await.unwrap();
    assert_eq!(old.version.version, 2);
    while t.read_all().await.unwrap().get(&expiring.address).is_some() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let now = t.read_all().await.unwrap();
    assert_eq!(
        now.version, old.version,
        "expiry removes a row without a versioned write"
    );
    // A writer holding the old snapshot: its update of the expired row fails, …
    let row = old.get(&expiring.address).unwrap();
    let mut changed = row.entry.clone();
    changed.status = SiloStatus::Active;
    assert!(
        !t.update_row(&changed, &row.etag, &old.version.next())
            .await
            .unwrap()
    );
    // … but any other write it bases on that snapshot still succeeds.
    insert(t.as_ref(), &new_entry(Timestamp::now())).await;
    keep_alive.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_costs_one_plain_write_and_rarely_a_paxos_round() {
    let s = session_with_keyspace().await;
    let mut m = MembershipOptions::default();
    m.defunct_silo_expiration = Duration::from_secs(100);
    m.i_am_alive_table_publish_timeout = Duration::from_secs(1);
    let t = table_on(
        &s,
        options(&unique("cost"))
            .table("membership_ttl100")
            .ttl(true)
            .membership(m),
    );
    t.initialize(true).await.unwrap();
    let e = new_entry(Timestamp::now());
    insert(&t, &e).await;
    let before = t.statement_counts();
    let started = Instant::now();
    let mut heartbeats = 0u64;
    while started.elapsed() < Duration::from_secs(12) {
        t.update_i_am_alive(&e.address, Timestamp::now())
            .await
            .unwrap();
        heartbeats += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let c = t.statement_counts();
    let (plain, paxos, reads) = (
        c.plain_writes - before.plain_writes,
        c.conditional_writes - before.conditional_writes,
        c.reads + c.serial_reads - before.reads - before.serial_reads,
    );
    eprintln!(
        "{heartbeats} heartbeats over {:?}: {plain} plain writes, {reads} reads, {paxos} Paxos rounds \
         ({:.4} Paxos rounds and {:.4} round trips per heartbeat; renewal every 10 s)",
        started.elapsed(),
        paxos as f64 / heartbeats as f64,
        (plain + reads + paxos) as f64 / heartbeats as f64
    );
    assert_eq!(
        plain, heartbeats,
        "every heartbeat is exactly one plain write"
    );
    assert!(paxos <= 2, "one renewal per 10 s: {paxos}");
    assert!((paxos as f64) / (heartbeats as f64) < 0.01);
}

proptest! {
    // Model-based: random sequences with concurrent heartbeats and updates on a TTL table whose
    // entries renew their TTL every second, so renewals race with membership changes.
    #![proptest_config(ProptestConfig { cases: 12, max_shrink_iters: 32, ..ProptestConfig::default() })]

    #[test]
    fn with_expiry_on_the_table_still_behaves_like_the_model(steps in model::steps(14)) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let outcome = rt.block_on(async {
            let s = session_with_keyspace().await;
            let mut m = MembershipOptions::default();
            m.defunct_silo_expiration = Duration::from_secs(60);
            m.i_am_alive_table_publish_timeout = Duration::from_secs(1);
            let mut o = options(&conformance::fresh_cluster_id("ttl-model")).table("membership_ttl60").ttl(true).membership(m);
            o.ttl_renewal_interval = Some(Duration::from_secs(1));
            let table = Arc::new(CassandraMembershipTable::with_session(s, o).unwrap());
            table.initialize(true).await.unwrap();
            model::check(table, &steps).await
        });
        prop_assert!(outcome.is_ok(), "{}", outcome.unwrap_err());
    }
}

/// With whole-entry conditions (what ScyllaDB gets; forced here): a heartbeating silo renews its
/// lease (an unchanged rewrite expecting the whole entry), an update expecting a stale tag does
/// not apply, one expecting the current tag does, a death vote fenced on the heartbeat cell
/// loses once the suspect heartbeats again, cleanup removes a dead entry, and a stopped silo's
/// entry expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_entry_conditions_keep_the_lease_the_fence_and_the_cleanup() {
    let cluster = unique("whole-value");
    let s = session_with_keyspace().await;
    let t = table_on(
        &s,
        short_ttl(options(&cluster).table(TABLE))
            .entry_conditions(cassandra_membership::EntryConditions::WholeValue),
    );
    t.initialize(true).await.unwrap();
    let e = new_entry(Timestamp::now());
    insert(&t, &e).await;
    // Renewals across two TTLs: the entry never expires while heartbeating.
    let until = std::time::Instant::now() + TTL * 2;
    while std::time::Instant::now() < until {
        assert!(matches!(
            t.update_i_am_alive(&e.address, Timestamp::now())
                .await
                .unwrap(),
            HeartbeatOutcome::Refreshed { .. }
        ));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(t.read_row(&e.address).await.unwrap().rows.len(), 1);
    }
    let seen = t.read_row(&e.address).await.unwrap();
    // The suspect heartbeats after the vote's read: the vote must not apply.
    t.update_i_am_alive(&e.address, Timestamp::now())
        .await
        .unwrap();
    let mut dead = seen.rows[0].entry.clone();
    dead.status = SiloStatus::Dead;
    assert!(
        !t.update_row(&dead, &seen.rows[0].etag, &seen.version.next())
            .await
            .unwrap(),
        "a vote read before the last heartbeat"
    );
    let now = t.read_row(&e.address).await.unwrap();
    assert!(
        t.update_row(&dead, &now.rows[0].etag, &now.version.next())
            .await
            .unwrap(),
        "a vote on the current entry"
    );
    assert_eq!(
        t.cleanup_defunct(Timestamp::now().saturating_add(Duration::from_secs(60)))
            .await
            .unwrap(),
        1
    );
    assert!(t.read_row(&e.address).await.unwrap().rows.is_empty());
    // A stopped silo's entry expires (never renewed again).
    let stopped = new_entry(Timestamp::now());
    insert(&t, &stopped).await;
    tokio::time::sleep(TTL + SLACK + Duration::from_secs(1)).await;
    assert!(t.read_row(&stopped.address).await.unwrap().rows.is_empty());
}

/// A heartbeat on an expired entry answers `NotFound` and leaves nothing behind (docs::expiry,
/// "never partial"), also when its table value knew the entry and its renewal is due — the
/// heartbeat's cell is written before the renewal finds the entry gone, and taken back then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_on_an_expired_entry_answers_not_found_and_leaves_no_cell() {
    let cluster = unique("expired-heartbeat");
    let (s, t) = ttl_table(&cluster).await;
    let e = new_entry(Timestamp::now());
    insert(&t, &e).await;
    t.update_i_am_alive(&e.address, Timestamp::now())
        .await
        .unwrap();
    let key = e.address.to_string();
    let q = format!(
        "SELECT silo FROM {KEYSPACE}.{TABLE} WHERE service_id = 'test-service' AND cluster_id = ? AND silo = ?"
    );
    let deadline = Instant::now() + TTL + SLACK + Duration::from_secs(5);
    while count_rows(&s, q.clone(), (&cluster, &key)).await > 0 {
        assert!(Instant::now() < deadline, "the entry never expired");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        t.update_i_am_alive(&e.address, Timestamp::now())
            .await
            .unwrap(),
        HeartbeatOutcome::NotFound
    );
    assert_eq!(
        count_rows(&s, q, (&cluster, &key)).await,
        0,
        "a heartbeat answering NotFound wrote a heartbeat-only row"
    );
}

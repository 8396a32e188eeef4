//! The `ttl_mismatch` policies, for tables whose TTL settings or rows disagree with the
//! configuration: `throw` names what disagrees (in its own cluster only), `allow` leaves it,
//! `patch` repairs it (its own cluster only, once, clamping what it writes); the audit.

use std::sync::Arc;
use std::time::Duration;

use cassandra_membership::cassandra::PatchAction;
use cassandra_membership::conformance::new_entry;
use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, MembershipError, MembershipOptions,
    MembershipTable, SiloStatus, Timestamp, TtlMismatchPolicy,
};
use scylla::client::session::Session;

use super::{WRITE_TTL, insert, opts, plant_row, ttl_on, ttls};
use crate::utils::{KEYSPACE, count_rows, options, session_with_keyspace, table_on, unique};

fn table_name() -> String {
    unique("ttl").replace('-', "_")[..24].to_owned()
}

fn with_ttl(o: CassandraClusteringOptions, seconds: u64) -> CassandraClusteringOptions {
    let mut m = MembershipOptions::default();
    m.defunct_silo_expiration = Duration::from_secs(seconds);
    m.i_am_alive_table_publish_timeout = Duration::from_millis(500);
    o.ttl(true).membership(m)
}

async fn table_default_ttl(s: &Session, table: &str) -> i32 {
    let (ttl,): (i32,) = s
        .query_unpaged(
            "SELECT default_time_to_live FROM system_schema.tables WHERE keyspace_name = ? AND table_name = ?",
            (KEYSPACE, table),
        )
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .single_row()
        .unwrap();
    ttl
}

async fn etag_ttls(s: &Session, table: &str) -> Vec<Option<i32>> {
    // Entry rows only: the versions' rows ('') hold no entry.
    s.query_unpaged(
        format!("SELECT silo, TTL(entry) FROM {KEYSPACE}.{table}"),
        (),
    )
    .await
    .unwrap()
    .into_rows_result()
    .unwrap()
    .rows::<(String, Option<i32>)>()
    .unwrap()
    .map(|r| r.unwrap())
    .filter(|(silo, _)| !silo.is_empty())
    .map(|(_, ttl)| ttl)
    .collect()
}

/// A table written with expiry off: one cluster with a live silo (heartbeat now) and a silo
/// last seen an hour ago. Returns the session, table name and cluster id.
async fn legacy_table() -> (Arc<Session>, String, String) {
    let s = session_with_keyspace().await;
    let table = table_name();
    let cluster = unique("legacy");
    let t = table_on(&s, options(&cluster).table(&table));
    t.initialize(true).await.unwrap();
    let live = new_entry(Timestamp::now());
    let old = new_entry(Timestamp::now().saturating_sub(Duration::from_secs(3600)));
    for e in [&live, &old] {
        let v = t.read_all().await.unwrap().version;
        assert!(t.insert_row(e, &v.next()).await.unwrap());
    }
    t.update_i_am_alive(&live.address, Timestamp::now())
        .await
        .unwrap();
    (s, table, cluster)
}

#[tokio::test]
async fn throw_names_the_table_both_ttls_and_the_disagreeing_rows() {
    let (s, table, cluster) = legacy_table().await;
    let t = table_on(&s, with_ttl(options(&cluster).table(&table), 4));
    let err = t.initialize(true).await.unwrap_err();
    match &err {
        MembershipError::TtlMismatch {
            table: name,
            table_ttl_seconds,
            configured_ttl_seconds,
            rows_disagreeing,
        } => {
            assert_eq!(name, &format!("\"{KEYSPACE}\".\"{table}\""));
            assert_eq!(*table_ttl_seconds, 0);
            assert_eq!(*configured_ttl_seconds, 4);
            // The version rightly keeps no TTL while a live entry has none.
            assert_eq!(*rows_disagreeing, 2, "the two entries");
        }
        other => panic!("{other:?}"),
    }
    let text = err.to_string();
    assert!(text.contains("allow") && text.contains("patch"), "{text}");
    assert_eq!(
        table_default_ttl(&s, &table).await,
        0,
        "throw changes nothing"
    );
    assert!(etag_ttls(&s, &table).await.iter().all(Option::is_none));
}

#[tokio::test]
async fn allow_leaves_the_table_and_old_rows_and_writes_new_rows_with_the_ttl() {
    let (s, table, cluster) = legacy_table().await;
    let t = table_on(
        &s,
        with_ttl(options(&cluster).table(&table), 4).ttl_mismatch(TtlMismatchPolicy::Allow),
    );
    t.initialize(true).await.unwrap();
    assert_eq!(table_default_ttl(&s, &table).await, 0);
    assert_eq!(etag_ttls(&s, &table).await, vec![None, None]);
    let v = t.read_all().await.unwrap().version;
    assert!(
        t.insert_row(&new_entry(Timestamp::now()), &v.next())
            .await
            .unwrap()
    );
    let ttls = etag_ttls(&s, &table).await;
    assert_eq!(ttls.iter().filter(|t| t.is_none()).count(), 2);
    assert!(ttls.iter().any(|t| matches!(t, Some(1..=6))), "{ttls:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn patch_removes_past_rows_keeps_live_ones_without_ttl_and_is_idempotent() {
    let (s, table, cluster) = legacy_table().await;
    let o = with_ttl(options(&cluster).table(&table), 4).ttl_mismatch(TtlMismatchPolicy::Patch);
    // The audit (dry run) says what patch will do, and writes nothing.
    let auditor = table_on(&s, o.clone().ttl_mismatch(TtlMismatchPolicy::Allow));
    auditor.initialize(false).await.unwrap();
    let audit = auditor.audit_ttl().await.unwrap();
    assert_eq!(audit.table_default_ttl, 0);
    assert_eq!(audit.configured_ttl, 4);
    let actions: Vec<_> = audit.rows.iter().map(|r| r.action).collect();
    // The entry last seen an hour ago goes; the live one may belong to a silo running with
    // expiry off, which would never renew a TTL: it keeps none (and so does the version).
    assert_eq!(actions.len(), 2, "{audit:?}");
    assert!(actions.contains(&PatchAction::Remove), "{audit:?}");
    assert!(actions.contains(&PatchAction::KeepWhileLive), "{audit:?}");
    assert!(
        etag_ttls(&s, &table).await.iter().all(Option::is_none),
        "the audit wrote nothing"
    );

    // Five silos start at once, all with patch. Their patches race on the same rows: the
    // contract lets a start fail for a passing reason (a Paxos round lost to another patcher's,
    // a timeout or an outcome unknown on a loaded node), and `Silo::join` starts again on such a
    // failure; `initialize` is idempotent, so another start completes it. Anything else fails
    // the test.
    let tasks: Vec<_> = (0..5)
        .map(|_| {
            let t = CassandraMembershipTable::with_session(Arc::clone(&s), o.clone()).unwrap();
            tokio::spawn(async move {
                let mut passing = Vec::new();
                loop {
                    match t.initialize(true).await {
                        Ok(()) => return Ok(passing),
                        Err(e)
                            if (e.is_transient()
                                || matches!(e, MembershipError::OutcomeUnknown { .. }))
                                && passing.len() < 3 =>
                        {
                            passing.push(e)
                        }
                        Err(e) => return Err((e, passing)),
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        let passing = task
            .await
            .unwrap()
            .expect("every concurrent patch succeeds, at most after passing failures");
        if !passing.is_empty() {
            eprintln!("a start was repeated after: {passing:?}");
        }
    }
    assert_eq!(table_default_ttl(&s, &table).await, 4);
    let ttls = etag_ttls(&s, &table).await;
    assert_eq!(
        ttls,
        vec![None],
        "the entry past its TTL was removed, the live one kept"
    );
    // Idempotent: only the live entry is still reported.
    let again = table_on(&s, o.clone());
    again.initialize(true).await.unwrap();
    let audit = again.audit_ttl().await.unwrap();
    assert!(
        audit
            .rows
            .iter()
            .all(|r| r.action == PatchAction::KeepWhileLive),
        "{audit:?}"
    );
    // Once the live entry's silo has been silent for longer than the TTL, the next start
    // with patch removes it, and the cluster then disappears by itself.
    tokio::time::sleep(Duration::from_secs(7)).await;
    table_on(&s, o.clone()).initialize(false).await.unwrap();
    let started = std::time::Instant::now();
    loop {
        let left = count_rows(&s, format!("SELECT silo FROM {KEYSPACE}.{table} WHERE service_id = 'test-service' AND cluster_id = ?"), (&cluster,)).await;
        if left == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the patched cluster never expired"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn ttl_off_on_a_table_with_a_default_ttl_writes_ttl_zero_explicitly() {
    let s = session_with_keyspace().await;
    let table = table_name();
    // Someone else made the table, with a default TTL.
    let creator = table_on(&s, with_ttl(options(&unique("other")).table(&table), 3));
    creator.initialize(false).await.unwrap();
    assert_eq!(table_default_ttl(&s, &table).await, 3);
    let cluster = unique("ttl-off");
    let strict = table_on(&s, options(&cluster).table(&table));
    match strict.initialize(true).await {
        Err(MembershipError::TtlMismatch {
            table_ttl_seconds: 3,
            configured_ttl_seconds: 0,
            ..
        }) => {}
        other => panic!("TTL off against a table default must throw by default: {other:?}"),
    }
    let t = table_on(
        &s,
        options(&cluster)
            .table(&table)
            .ttl_mismatch(TtlMismatchPolicy::Allow),
    );
    t.initialize(true).await.unwrap();
    let e = new_entry(Timestamp::now());
    let v = t.read_all().await.unwrap().version;
    assert!(t.insert_row(&e, &v.next()).await.unwrap());
    t.update_i_am_alive(&e.address, Timestamp::now())
        .await
        .unwrap();
    assert_eq!(
        etag_ttls(&s, &table).await,
        vec![None],
        "USING TTL 0 overrides the table default"
    );
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let snapshot = t.read_all().await.unwrap();
    assert_eq!(
        snapshot.rows.len(),
        1,
        "nothing expired behind the user's back"
    );
    assert_eq!(snapshot.version.version, 1);
}

/// `patch` rewrites only its own cluster's rows, in both directions: expiry turned on beside a
/// cluster without it, and off beside one with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patch_never_reads_or_writes_other_clusters_rows() {
    let s = session_with_keyspace().await;
    let table = super::table_name();
    // Service B runs with expiry off; its rows and version carry no TTL.
    let b = table_on(&s, opts(&table, "svc-b", "b"));
    b.initialize(true).await.unwrap();
    let eb = new_entry(Timestamp::now());
    insert(&b, &eb).await;
    b.update_i_am_alive(&eb.address, Timestamp::now())
        .await
        .unwrap();
    // Service A turns expiry on with patch: the table default changes (shared), B's rows do not.
    let a = table_on(
        &s,
        ttl_on(opts(&table, "svc-a", "a")).ttl_mismatch(TtlMismatchPolicy::Patch),
    );
    a.initialize(true).await.unwrap();
    let ea = new_entry(Timestamp::now());
    insert(&a, &ea).await;
    let (rows, version) = ttls(&s, &table, "svc-b", "b").await;
    assert_eq!(
        rows,
        vec![(eb.address.to_string(), None)],
        "B's row keeps no TTL"
    );
    assert_eq!(version, None, "B's version keeps no TTL");
    // The reverse: B' (expiry off, patch) leaves A's rows their TTL.
    let b2 = table_on(
        &s,
        opts(&table, "svc-b", "b2").ttl_mismatch(TtlMismatchPolicy::Patch),
    );
    b2.initialize(true).await.unwrap();
    let (rows, version) = ttls(&s, &table, "svc-a", "a").await;
    assert!(
        matches!(rows[..], [(_, Some(1..=WRITE_TTL))]),
        "A's row keeps its TTL: {rows:?}"
    );
    assert!(matches!(version, Some(1..=WRITE_TTL)), "{version:?}");
    // And B's entry is still there well after A's TTL.
    tokio::time::sleep(Duration::from_secs(WRITE_TTL as u64 + 1)).await;
    assert!(b.read_all().await.unwrap().get(&eb.address).is_some());
}

/// `throw` looks only at the table default and its own cluster: other clusters' rows do not
/// trip it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throw_looks_only_at_the_table_default_and_its_own_cluster() {
    let s = session_with_keyspace().await;
    let table = super::table_name();
    // The table is created with A's TTL as its default.
    let creator = table_on(&s, ttl_on(opts(&table, "svc-a", "creator")));
    creator.initialize(false).await.unwrap();
    // Another cluster of A (blue/green) and another service write rows without TTL.
    for (service, cluster, n) in [("svc-a", "green", 2), ("svc-b", "b", 3)] {
        let t = table_on(
            &s,
            opts(&table, service, cluster).ttl_mismatch(TtlMismatchPolicy::Allow),
        );
        t.initialize(true).await.unwrap();
        for _ in 0..n {
            insert(&t, &new_entry(Timestamp::now())).await;
        }
    }
    let blue = table_on(&s, ttl_on(opts(&table, "svc-a", "blue")));
    blue.initialize(true)
        .await
        .expect("other clusters' rows do not count");
    assert!(blue.audit_ttl().await.unwrap().agrees());
}

/// TTL() is computed on the reading coordinator's clock; a row written through a node a second
/// ahead must not trip `throw`.
#[tokio::test]
async fn a_row_written_through_a_node_ahead_does_not_trip_throw() {
    let s = session_with_keyspace().await;
    let table = super::table_name();
    let cluster = unique("skew");
    let first = table_on(&s, ttl_on(opts(&table, "svc", &cluster)));
    first.initialize(true).await.unwrap();
    let now = Timestamp::now().as_millis();
    // As stored through a coordinator 1 s ahead: one second more than the provider writes.
    plant_row(
        &s,
        &table,
        "svc",
        &cluster,
        "127.0.0.1:1@1",
        3,
        now,
        WRITE_TTL + 1,
    )
    .await;
    // And one whose last heartbeat is in the future (a silo clock ahead).
    plant_row(
        &s,
        &table,
        "svc",
        &cluster,
        "127.0.0.1:2@2",
        3,
        now + 1500,
        WRITE_TTL,
    )
    .await;
    let second = table_on(&s, ttl_on(opts(&table, "svc", &cluster)));
    second
        .initialize(true)
        .await
        .expect("within the tolerance, nothing disagrees");
}

/// A Dead row stamped in 2100 would have patch propose a TTL over Cassandra's maximum: patch
/// clamps it, rather than have Cassandra reject it as invalid and report `Contention` after 8
/// attempts.
#[tokio::test]
async fn a_patch_never_turns_a_hard_error_into_contention() {
    let s = session_with_keyspace().await;
    let table = super::table_name();
    let cluster = unique("hard");
    let legacy = table_on(&s, opts(&table, "svc", &cluster));
    legacy.initialize(true).await.unwrap();
    plant_row(
        &s,
        &table,
        "svc",
        &cluster,
        "127.0.0.1:3@3",
        6,
        4_102_444_800_000,
        0,
    )
    .await;
    let t = table_on(
        &s,
        ttl_on(opts(&table, "svc", &cluster)).ttl_mismatch(TtlMismatchPolicy::Patch),
    );
    t.initialize(true).await.expect("the TTL is clamped");
    let (rows, _) = ttls(&s, &table, "svc", &cluster).await;
    assert!(matches!(rows[..], [(_, Some(1..=WRITE_TTL))]), "{rows:?}");
}

/// Rows of a partition without a version are repaired by patch once, not skipped and flagged
/// again at every start.
#[tokio::test]
async fn rows_without_a_version_are_repaired_once() {
    let s = session_with_keyspace().await;
    let table = super::table_name();
    let cluster = unique("no-version");
    let creator = table_on(&s, ttl_on(opts(&table, "svc", &unique("creator"))));
    creator.initialize(false).await.unwrap();
    let now = Timestamp::now().as_millis();
    plant_row(&s, &table, "svc", &cluster, "127.0.0.1:1@1", 6, now, 0).await;
    plant_row(&s, &table, "svc", &cluster, "127.0.0.1:2@2", 6, now, 0).await;
    let patch = table_on(
        &s,
        ttl_on(opts(&table, "svc", &cluster)).ttl_mismatch(TtlMismatchPolicy::Patch),
    );
    patch.initialize(true).await.unwrap();
    let (rows, version) = ttls(&s, &table, "svc", &cluster).await;
    assert!(
        rows.iter().all(|(_, t)| matches!(t, Some(1..=WRITE_TTL))),
        "{rows:?}"
    );
    assert!(version.is_some(), "the cluster has a version again");
    let strict = table_on(&s, ttl_on(opts(&table, "svc", &cluster)));
    strict
        .initialize(true)
        .await
        .expect("nothing is flagged again at the next start");
}

/// With `allow`, rows without TTL stay, so storage does not cover the defunct cleanup.
#[tokio::test]
async fn storage_covers_cleanup_only_when_nothing_without_ttl_stays() {
    let s = session_with_keyspace().await;
    let table = super::table_name();
    let cluster = unique("allow");
    let legacy = table_on(&s, opts(&table, "svc", &cluster));
    legacy.initialize(true).await.unwrap();
    let mut dead = new_entry(Timestamp::now().saturating_sub(Duration::from_secs(1)));
    dead.status = SiloStatus::Dead;
    insert(&legacy, &dead).await;
    let allow = table_on(
        &s,
        ttl_on(opts(&table, "svc", &cluster)).ttl_mismatch(TtlMismatchPolicy::Allow),
    );
    allow.initialize(true).await.unwrap();
    assert!(
        !allow.storage_expiry().covers_defunct_cleanup,
        "a Dead row without TTL stays: the runtime's cleanup must run"
    );
    // The runtime's cleanup then removes it.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(allow.cleanup_defunct(Timestamp::now()).await.unwrap(), 1);
    // A cluster with expiry on from the start is covered by storage.
    // (`allow`: the table default is still the legacy 0, which `throw` would refuse.)
    let fresh = table_on(
        &s,
        ttl_on(opts(&table, "svc", &unique("fresh"))).ttl_mismatch(TtlMismatchPolicy::Allow),
    );
    fresh.initialize(true).await.unwrap();
    assert!(fresh.storage_expiry().covers_defunct_cleanup);
    // Patch gives the Dead row of the other legacy cluster its TTL: covered then.
    let cluster2 = unique("patch");
    let legacy2 = table_on(&s, opts(&table, "svc", &cluster2));
    legacy2.initialize(true).await.unwrap();
    insert(&legacy2, &dead).await;
    let patched = table_on(
        &s,
        ttl_on(opts(&table, "svc", &cluster2)).ttl_mismatch(TtlMismatchPolicy::Patch),
    );
    patched.initialize(true).await.unwrap();
    assert!(patched.storage_expiry().covers_defunct_cleanup);
}

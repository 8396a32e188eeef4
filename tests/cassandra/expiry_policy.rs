//! Expiry in every configuration (issue 10): the policy applies to this cluster only, rolling
//! changes of `ttl` lose no entry, nothing is left behind, no stored value breaks anything.
//! Other configurations and damaged rows are planted with raw CQL.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cassandra_membership::conformance::new_entry;
use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, HeartbeatOutcome, MembershipEntry,
    MembershipError, MembershipOptions, MembershipTable, SiloStatus, Timestamp, TtlMismatchPolicy,
};
use scylla::client::session::Session;
use scylla::value::CqlTimestamp;

use crate::utils::{KEYSPACE, count_rows, options, session_with_keyspace, table_on, unique};

pub(crate) const TTL: u64 = 4;
/// Every write with TTL 4 s carries 4 + 1 (renewal) + 1 s.
pub(crate) const WRITE_TTL: i32 = 6;

pub(crate) fn table_name() -> String {
    unique("pol").replace('-', "_")[..24].to_owned()
}

pub(crate) fn ttl_on(o: CassandraClusteringOptions) -> CassandraClusteringOptions {
    let mut m = MembershipOptions::default();
    m.defunct_silo_expiration = Duration::from_secs(TTL);
    m.i_am_alive_table_publish_timeout = Duration::from_millis(500);
    o.ttl(true).membership(m)
}

/// Options for `service`/`cluster` in `table`.
pub(crate) fn opts(table: &str, service: &str, cluster: &str) -> CassandraClusteringOptions {
    options(cluster).table(table).service_id(service)
}

pub(crate) async fn insert(t: &dyn MembershipTable, e: &MembershipEntry) {
    for _ in 0..20 {
        let v = t.read_all().await.unwrap().version;
        if t.insert_row(e, &v.next()).await.unwrap() {
            return;
        }
    }
    panic!("insert kept losing races");
}

/// (silo, TTL(etag)) of every row of a partition, and TTL(version_etag).
pub(crate) async fn ttls(
    s: &Session,
    table: &str,
    service: &str,
    cluster: &str,
) -> (Vec<(String, Option<i32>)>, Option<i32>) {
    let rows: Vec<(Option<String>, Option<i32>, Option<i32>)> = s
        .query_unpaged(
            format!("SELECT silo, TTL(etag), TTL(version_etag) FROM {KEYSPACE}.{table} WHERE service_id = ? AND cluster_id = ?"),
            (service, cluster),
        )
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .rows()
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    let version = rows.first().and_then(|r| r.2);
    (
        rows.into_iter()
            .filter_map(|(silo, t, _)| silo.map(|s| (s, t)))
            .collect(),
        version,
    )
}

/// The keys of a partition's heartbeat elements, as stored.
async fn heartbeat_keys(s: &Session, table: &str, cluster: &str) -> Vec<String> {
    type Elements = std::collections::BTreeMap<String, (CqlTimestamp, CqlTimestamp)>;
    let rows: Vec<(Option<Elements>,)> = s
        .query_unpaged(
            format!("SELECT heartbeats FROM {KEYSPACE}.{table} WHERE service_id = 'svc' AND cluster_id = ?"),
            (cluster,),
        )
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .rows()
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    rows.into_iter()
        .flat_map(|(m,)| m.unwrap_or_default().into_keys())
        .collect()
}

async fn raw_partition(s: &Session, table: &str, service: &str, cluster: &str) -> usize {
    count_rows(
        s,
        format!("SELECT silo, version, heartbeats FROM {KEYSPACE}.{table} WHERE service_id = ? AND cluster_id = ?"),
        (service, cluster),
    )
    .await
}

/// Writes a complete entry row by hand, as another program or an older binary would.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn plant_row(
    s: &Session,
    table: &str,
    service: &str,
    cluster: &str,
    silo: &str,
    status: i32,
    i_am_alive: i64,
    ttl: i32,
) {
    s.query_unpaged(
        format!(
            "UPDATE {KEYSPACE}.{table} USING TTL ? SET etag = ?, status = ?, suspect_times = [], proxy_port = 30000, \
             host_name = 'h', silo_name = 's', role_name = 'r', update_zone = 1, fault_zone = 2, start_time = ?, \
             i_am_alive = ? WHERE service_id = ? AND cluster_id = ? AND silo = ?"
        ),
        (
            ttl,
            uuid::Uuid::new_v4(),
            status,
            CqlTimestamp(1_000),
            CqlTimestamp(i_am_alive),
            service,
            cluster,
            silo,
        ),
    )
    .await
    .expect("plant a row");
}

pub(crate) fn heartbeater(
    t: Arc<CassandraMembershipTable>,
    e: MembershipEntry,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            match t.update_i_am_alive(&e.address, Timestamp::now()).await {
                Ok(HeartbeatOutcome::Refreshed { .. }) => {}
                other => panic!("a live silo's heartbeat: {other:?}"),
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
}

/// Reads every 200 ms for `how_long`: every entry of `expected` is there and the version never
/// goes back. Returns the last version seen.
pub(crate) async fn watch_entries(
    t: &CassandraMembershipTable,
    expected: &[&MembershipEntry],
    how_long: Duration,
    mut version: u64,
) -> u64 {
    let started = Instant::now();
    let mut samples = 0;
    while started.elapsed() < how_long {
        let snapshot = t.read_all().await.unwrap();
        for e in expected {
            assert!(
                snapshot.get(&e.address).is_some(),
                "entry {} vanished after {:?} (sample {samples})",
                e.address,
                started.elapsed()
            );
        }
        assert!(
            snapshot.version.version >= version,
            "the version went back from {version} to {} after {:?}",
            snapshot.version.version,
            started.elapsed()
        );
        version = snapshot.version.version;
        samples += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(samples > 10);
    version
}

/// Defect 1: patch rewrote other clusters' rows (both directions).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patch_never_reads_or_writes_other_clusters_rows() {
    let s = session_with_keyspace().await;
    let table = table_name();
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

/// Defect 2: throw was tripped by other clusters' rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throw_looks_only_at_the_table_default_and_its_own_cluster() {
    let s = session_with_keyspace().await;
    let table = table_name();
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

/// Defect 3 (and the version half of the contract): a rolling change off → on, then the new
/// silo stops while the old ones keep running for longer than the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rolling_change_off_to_on_loses_no_entry_and_keeps_the_version() {
    let s = session_with_keyspace().await;
    let table = table_name();
    let cluster = unique("off-on");
    let old = Arc::new(table_on(&s, opts(&table, "svc", &cluster)));
    old.initialize(true).await.unwrap();
    let (o1, o2) = (new_entry(Timestamp::now()), new_entry(Timestamp::now()));
    insert(old.as_ref(), &o1).await;
    insert(old.as_ref(), &o2).await;
    let beats = [
        heartbeater(Arc::clone(&old), o1.clone()),
        heartbeater(Arc::clone(&old), o2.clone()),
    ];
    // A new silo of the same cluster starts with expiry on and patch.
    let new = Arc::new(table_on(
        &s,
        ttl_on(opts(&table, "svc", &cluster)).ttl_mismatch(TtlMismatchPolicy::Patch),
    ));
    new.initialize(true).await.unwrap();
    let n1 = new_entry(Timestamp::now());
    insert(new.as_ref(), &n1).await;
    let new_beat = heartbeater(Arc::clone(&new), n1.clone());
    // The new silo votes against an old one: a membership write on a row it does not renew.
    // (o1 heartbeats: a vote decided on a read before one of its heartbeats loses; read again.)
    let mut voted_once = false;
    for _ in 0..20 {
        let snap = new.read_row(&o1.address).await.unwrap();
        let mut voted = snap.rows[0].entry.clone();
        voted.suspect_times.push(cassandra_membership::SuspectTime {
            suspecting_silo: n1.address,
            time: Timestamp::now(),
        });
        if new
            .update_row(&voted, &snap.rows[0].etag, &snap.version.next())
            .await
            .unwrap()
        {
            voted_once = true;
            break;
        }
    }
    assert!(voted_once, "the vote never applied in 20 rounds");
    let v = watch_entries(&new, &[&o1, &o2, &n1], Duration::from_secs(3 * TTL + 1), 0).await;
    // The new silo stops; the old ones keep running for longer than the TTL.
    new_beat.abort();
    let v2 = watch_entries(
        &old,
        &[&o1, &o2],
        Duration::from_secs(2 * WRITE_TTL as u64),
        v,
    )
    .await;
    assert!(v2 >= v);
    // The version is intact: the next insert continues it instead of restarting at 1.
    let before = old.read_all().await.unwrap().version.version;
    assert!(before >= 4, "the version restarted: {before}");
    insert(old.as_ref(), &new_entry(Timestamp::now())).await;
    assert_eq!(old.read_all().await.unwrap().version.version, before + 1);
    for b in beats {
        b.abort();
    }
}

/// The contract's other direction: on → off; a silo with expiry off joins a cluster of silos
/// with expiry on, which vote on its row; then they stop and it keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rolling_change_on_to_off_loses_no_entry_and_keeps_the_version() {
    let s = session_with_keyspace().await;
    let table = table_name();
    let cluster = unique("on-off");
    let on = Arc::new(table_on(&s, ttl_on(opts(&table, "svc", &cluster))));
    on.initialize(true).await.unwrap();
    let n1 = new_entry(Timestamp::now());
    insert(on.as_ref(), &n1).await;
    let on_beat = heartbeater(Arc::clone(&on), n1.clone());
    let off = Arc::new(table_on(
        &s,
        opts(&table, "svc", &cluster).ttl_mismatch(TtlMismatchPolicy::Allow),
    ));
    off.initialize(true).await.unwrap();
    let o1 = new_entry(Timestamp::now());
    insert(off.as_ref(), &o1).await;
    let off_beat = heartbeater(Arc::clone(&off), o1.clone());
    // Let the silo with expiry on renew at least once, then vote on the new silo's row.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // A write decided on a read loses to a heartbeat of that row in between: read again.
    let mut voted_once = false;
    for _ in 0..20 {
        let snap = on.read_row(&o1.address).await.unwrap();
        let mut voted = snap.rows[0].entry.clone();
        voted.status = SiloStatus::Active;
        if on
            .update_row(&voted, &snap.rows[0].etag, &snap.version.next())
            .await
            .unwrap()
        {
            voted_once = true;
            break;
        }
    }
    assert!(voted_once, "the vote never applied in 20 rounds");
    let v = watch_entries(&off, &[&o1, &n1], Duration::from_secs(3 * TTL + 1), 0).await;
    on_beat.abort();
    watch_entries(&off, &[&o1], Duration::from_secs(2 * WRITE_TTL as u64), v).await;
    let before = off.read_all().await.unwrap().version.version;
    assert!(before >= 3, "the version restarted: {before}");
    insert(off.as_ref(), &new_entry(Timestamp::now())).await;
    assert_eq!(off.read_all().await.unwrap().version.version, before + 1);
    off_beat.abort();
}

/// Defect 4: with allow, rows without TTL stay, so storage does not cover cleanup.
#[tokio::test]
async fn storage_covers_cleanup_only_when_nothing_without_ttl_stays() {
    let s = session_with_keyspace().await;
    let table = table_name();
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

/// Defect 5: delete_cluster left damaged, marker-only and non-canonical rows; a damaged version
/// made it fail.
#[tokio::test]
async fn delete_cluster_removes_every_row_and_the_statics_even_with_a_damaged_version() {
    let s = session_with_keyspace().await;
    let table = table_name();
    let cluster = unique("delete");
    let t = table_on(&s, opts(&table, "svc", &cluster));
    t.initialize(true).await.unwrap();
    let e = new_entry(Timestamp::now());
    insert(&t, &e).await;
    t.update_i_am_alive(&e.address, Timestamp::now())
        .await
        .unwrap();
    let now = Timestamp::now().as_millis();
    plant_row(&s, &table, "svc", &cluster, "127.0.0.1:1@1", 42, now, 0).await;
    plant_row(&s, &table, "svc", &cluster, "127.0.0.1:2@0002", 3, now, 0).await;
    s.query_unpaged(
        format!("INSERT INTO {KEYSPACE}.{table} (service_id, cluster_id, silo) VALUES ('svc', ?, '127.0.0.1:3@3')"),
        (&cluster,),
    )
    .await
    .unwrap();
    assert_eq!(raw_partition(&s, &table, "svc", &cluster).await, 4);
    t.delete_cluster(&cluster).await.unwrap();
    assert_eq!(
        raw_partition(&s, &table, "svc", &cluster).await,
        0,
        "nothing of the cluster is left"
    );
    t.initialize(true).await.unwrap();
    assert!(t.read_all().await.unwrap().rows.is_empty());
    // A damaged version: negative, then without its tag.
    for damage in [
        "UPDATE {t} SET version = -5 WHERE service_id = 'svc' AND cluster_id = ?",
        "UPDATE {t} SET version_etag = null WHERE service_id = 'svc' AND cluster_id = ?",
    ] {
        insert(&t, &new_entry(Timestamp::now())).await;
        s.query_unpaged(
            damage.replace("{t}", &format!("{KEYSPACE}.{table}")),
            (&cluster,),
        )
        .await
        .unwrap();
        assert!(matches!(
            t.read_all().await,
            Err(MembershipError::CorruptData { .. })
        ));
        t.delete_cluster(&cluster)
            .await
            .expect("a damaged version can be deleted");
        assert_eq!(raw_partition(&s, &table, "svc", &cluster).await, 0);
        t.initialize(true).await.unwrap();
        assert_eq!(t.read_all().await.unwrap().version.version, 0);
    }
}

/// Defects 6 and 7 (cleanup): elements written by another program, or stamped `i64::MIN`, are
/// removed and do not make cleanup fail.
#[tokio::test]
async fn cleanup_removes_any_orphaned_heartbeat_element_whoever_wrote_it() {
    let s = session_with_keyspace().await;
    let table = table_name();
    let cluster = unique("elements");
    let t = table_on(&s, opts(&table, "svc", &cluster));
    t.initialize(true).await.unwrap();
    let old = Timestamp::now().as_millis() - 60_000;
    for (key, time) in [("127.0.0.1:9@9", old), ("127.0.0.1:8@8", i64::MIN)] {
        // Written "now" (the coordinator's timestamp), with an old I-am-alive time in it.
        s.query_unpaged(
            format!("UPDATE {KEYSPACE}.{table} SET heartbeats[?] = (?, ?) WHERE service_id = 'svc' AND cluster_id = ?"),
            (key, CqlTimestamp(old), CqlTimestamp(time), &cluster),
        )
        .await
        .unwrap();
    }
    t.cleanup_defunct(Timestamp::now())
        .await
        .expect("one damaged element must not make cleanup fail");
    let left = heartbeat_keys(&s, &table, &cluster).await;
    assert!(left.is_empty(), "orphaned elements left: {left:?}");
}

/// Defect 6 (patch): after a patch re-stamped a Dead entry's element, cleanup can remove it.
#[tokio::test]
async fn cleanup_removes_elements_a_patch_restamped() {
    let s = session_with_keyspace().await;
    let table = table_name();
    let cluster = unique("restamp");
    let legacy = table_on(&s, opts(&table, "svc", &cluster));
    legacy.initialize(true).await.unwrap();
    let mut e = new_entry(Timestamp::now());
    insert(&legacy, &e).await;
    legacy
        .update_i_am_alive(&e.address, Timestamp::now())
        .await
        .unwrap();
    let snap = legacy.read_row(&e.address).await.unwrap();
    e = snap.rows[0].entry.clone();
    e.status = SiloStatus::Dead;
    assert!(
        legacy
            .update_row(&e, &snap.rows[0].etag, &snap.version.next())
            .await
            .unwrap()
    );
    let patched = table_on(
        &s,
        ttl_on(opts(&table, "svc", &cluster)).ttl_mismatch(TtlMismatchPolicy::Patch),
    );
    patched.initialize(true).await.unwrap();
    // Back to expiry off: the cleanup deletes the Dead entry and its element.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(legacy.cleanup_defunct(Timestamp::now()).await.unwrap(), 1);
    let elements = heartbeat_keys(&s, &table, &cluster).await;
    assert!(
        elements.is_empty(),
        "the re-stamped element was removed: {elements:?}"
    );
}

/// Defect 7: stored times far out of range neither panic nor produce a TTL Cassandra rejects.
#[tokio::test]
async fn stored_times_out_of_range_never_panic_or_give_invalid_ttls() {
    let s = session_with_keyspace().await;
    let table = table_name();
    let year_2100 = 4_102_444_800_000;
    for policy in [
        TtlMismatchPolicy::Throw,
        TtlMismatchPolicy::Allow,
        TtlMismatchPolicy::Patch,
    ] {
        let cluster = unique("times");
        let legacy = table_on(
            &s,
            opts(&table, "svc", &cluster).ttl_mismatch(TtlMismatchPolicy::Allow),
        );
        legacy.initialize(true).await.unwrap();
        plant_row(&s, &table, "svc", &cluster, "127.0.0.1:1@1", 3, i64::MAX, 0).await;
        plant_row(&s, &table, "svc", &cluster, "127.0.0.1:2@2", 3, i64::MIN, 0).await;
        plant_row(
            &s,
            &table,
            "svc",
            &cluster,
            "127.0.0.1:3@3",
            6,
            year_2100,
            0,
        )
        .await;
        let t = table_on(
            &s,
            ttl_on(opts(&table, "svc", &cluster)).ttl_mismatch(policy),
        );
        let result = t.initialize(true).await;
        match policy {
            TtlMismatchPolicy::Throw => {
                assert!(
                    matches!(result, Err(MembershipError::TtlMismatch { .. })),
                    "{result:?}"
                )
            }
            _ => result.unwrap_or_else(|e| panic!("{policy:?}: {e:?}")),
        }
        let (rows, _) = ttls(&s, &table, "svc", &cluster).await;
        for (silo, ttl) in rows {
            assert!(
                ttl.is_none_or(|t| (1..=WRITE_TTL).contains(&t)),
                "{silo}: {ttl:?}"
            );
        }
    }
}

/// Defect 8: TTL() is computed on the reading coordinator's clock; a row written through a
/// node a second ahead must not trip `throw`.
#[tokio::test]
async fn a_row_written_through_a_node_ahead_does_not_trip_throw() {
    let s = session_with_keyspace().await;
    let table = table_name();
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

/// Defect 7/9: a Dead row stamped in 2100 made patch propose a TTL over Cassandra's maximum,
/// which Cassandra rejected as invalid, and patch reported `Contention` after 8 attempts.
#[tokio::test]
async fn a_patch_never_turns_a_hard_error_into_contention() {
    let s = session_with_keyspace().await;
    let table = table_name();
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

/// Defect 9: rows of a partition without a version were skipped by patch and flagged again at
/// every start.
#[tokio::test]
async fn rows_without_a_version_are_repaired_once() {
    let s = session_with_keyspace().await;
    let table = table_name();
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

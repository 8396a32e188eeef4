//! A cluster whose partition holds more tombstones than Cassandra lets one read scan: the reads
//! that meet them fail with a typed error naming the cluster and what an operator can do, and
//! reads past Cassandra's warning threshold report how many tombstones they scanned, so the
//! cliff is seen before it is reached.

use std::time::Instant;

use cassandra_membership::conformance::new_entry;
use cassandra_membership::{MembershipError, MembershipTable, Timestamp};
use scylla::client::session::Session;

use crate::utils::{KEYSPACE, options, session_with_keyspace, table_on, unique};

/// Cassandra's default `tombstone_failure_threshold` (the node `scripts/cassandra.sh` starts keeps
/// the default) and `tombstone_warn_threshold`.
const FAILURE_THRESHOLD: usize = 100_000;
const WARN_THRESHOLD: usize = 1_000;

/// `n` row tombstones in `cluster`'s partition of the shared test table.
async fn bury(s: &Session, cluster: &str, n: usize) {
    let started = Instant::now();
    let table = format!("{KEYSPACE}.membership");
    crate::buried::bury(s, &table, "test-service", cluster, n).await;
    eprintln!("{n} row tombstones written in {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_past_the_failure_threshold_fail_with_a_typed_error_naming_the_cluster() {
    let cluster = unique("tombstones-fail");
    let s = session_with_keyspace().await;
    let t = table_on(&s, options(&cluster));
    t.initialize(true).await.unwrap();
    let e = new_entry(Timestamp::now());
    let v = t.read_all().await.unwrap().version;
    assert!(t.insert_row(&e, &v.next()).await.unwrap());
    // Another cluster of the same table, untouched: its reads must keep working.
    let neighbour = unique("tombstones-neighbour");
    let n = table_on(&s, options(&neighbour));
    n.initialize(true).await.unwrap();

    bury(&s, &cluster, FAILURE_THRESHOLD + 100).await;

    let err = t
        .read_all()
        .await
        .expect_err("read_all of the buried partition");
    match &err {
        MembershipError::TooManyTombstones {
            service_id,
            cluster_id,
            ..
        } => {
            assert_eq!(service_id, "test-service");
            assert_eq!(cluster_id, &cluster);
        }
        other => panic!("expected TooManyTombstones, got {other:?}"),
    }
    assert!(!err.is_transient(), "{err}");
    let text = err.to_string();
    for what in [
        cluster.as_str(),
        "gc_grace_seconds",
        "compact",
        "delete-cluster",
    ] {
        assert!(text.contains(what), "{text:?} names {what}");
    }
    // A read of one row starts at its key and scans nothing before it.
    let own = t
        .read_row(&e.address)
        .await
        .expect("read_row of a live entry");
    assert_eq!(own.rows.len(), 1);
    assert!(
        n.read_all().await.is_ok(),
        "the neighbour cluster still reads"
    );

    // What the error tells an operator to do with a cluster that is gone works past the cliff:
    // the cluster is removed, and a new one under its name reads and writes again.
    // The partition deletion is stamped 10 s in the past (clock skew between coordinators):
    // tombstones younger than that are not shadowed by it.
    tokio::time::sleep(std::time::Duration::from_secs(11)).await;
    t.delete_cluster(&cluster)
        .await
        .expect("delete_cluster of a buried partition");
    let again = table_on(&s, options(&cluster));
    again.initialize(true).await.unwrap();
    let snapshot = again.read_all().await.expect("the cluster reads again");
    assert!(snapshot.rows.is_empty(), "{:?}", snapshot.rows);
    let e = new_entry(Timestamp::now());
    assert!(
        again
            .insert_row(&e, &snapshot.version.next())
            .await
            .unwrap()
    );
    assert_eq!(again.read_all().await.unwrap().rows.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_past_the_warning_threshold_report_the_tombstones_they_scanned() {
    let cluster = unique("tombstones-warn");
    let s = session_with_keyspace().await;
    let t = table_on(&s, options(&cluster));
    t.initialize(true).await.unwrap();
    let e = new_entry(Timestamp::now());
    let v = t.read_all().await.unwrap().version;
    assert!(t.insert_row(&e, &v.next()).await.unwrap());
    t.read_all().await.unwrap();
    assert_eq!(
        t.tombstones_scanned(),
        None,
        "a clean partition reports none"
    );

    let buried = WARN_THRESHOLD * 3;
    bury(&s, &cluster, buried).await;
    let snapshot = t.read_all().await.unwrap();
    assert_eq!(snapshot.rows.len(), 1);
    let scanned = t
        .tombstones_scanned()
        .expect("a read past the warning threshold reports its tombstones");
    assert!(
        (buried as u64..=buried as u64 + 10).contains(&scanned),
        "{scanned} tombstones reported, {buried} written"
    );
}

/// A silo whose cluster's partition is buried fences, and says why: its failure detector's reads
/// fail with `TooManyTombstones`, which the health names apart from an outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silo_of_a_buried_cluster_fences_naming_the_tombstones() {
    use std::sync::Arc;
    use std::time::Duration;

    use cassandra_membership::{FailureCause, MembershipOptions, Silo, SiloAddress, SiloHealth};

    let cluster = unique("tombstones-silo");
    let s = session_with_keyspace().await;
    let mut m = MembershipOptions::default();
    m.i_am_alive_table_publish_timeout = Duration::from_millis(500);
    m.max_defunct_silo_entries = None;
    let table: Arc<dyn MembershipTable> = Arc::new(table_on(&s, options(&cluster).membership(m)));
    let address = SiloAddress::new_incarnation("127.0.0.1:13001".parse().unwrap()).unwrap();
    let silo = Silo::join(Arc::clone(&table), address).await.unwrap();
    let mut health = silo.health();
    tokio::time::timeout(
        Duration::from_secs(10),
        health.wait_for(|h| matches!(h, SiloHealth::Healthy { .. })),
    )
    .await
    .expect("healthy after joining")
    .unwrap();

    bury(&s, &cluster, FAILURE_THRESHOLD + 100).await;
    let fenced = tokio::time::timeout(
        Duration::from_secs(30),
        health.wait_for(|h| {
            matches!(
                h,
                SiloHealth::LeaseAtRisk {
                    cause: Some(FailureCause::TooManyTombstones),
                    ..
                }
            )
        }),
    )
    .await;
    let now = silo.health().borrow().clone();
    assert!(
        matches!(fenced, Ok(Ok(_))),
        "fenced naming the tombstones; health is {now:?}"
    );
    assert!(!now.should_serve());
    silo.crash();
    // The partition deletion is stamped 10 s in the past (clock skew between coordinators):
    // tombstones younger than that are not shadowed by it.
    tokio::time::sleep(std::time::Duration::from_secs(11)).await;
    table
        .delete_cluster(&cluster)
        .await
        .expect("the buried cluster is removed");
}

/// A table of its own with expiry on and a TTL longer than the test (its rows must not expire
/// while the partition is buried).
async fn long_ttl_table(
    s: &std::sync::Arc<Session>,
    cluster: &str,
) -> (String, cassandra_membership::CassandraMembershipTable) {
    let name = unique("tomb_ttl").replace('-', "_")[..24].to_owned();
    let mut m = cassandra_membership::MembershipOptions::default();
    m.defunct_silo_expiration = std::time::Duration::from_secs(300);
    let t = table_on(s, options(cluster).table(&name).ttl(true).membership(m));
    t.initialize(true).await.unwrap();
    (name, t)
}

/// No statement that wants only the version or one row scans the rows of other generations: on
/// a partition buried past the failure threshold, a silo still reads its row, joins (with expiry
/// on: the version's TTL read first), updates its entry and renews its lease; only the read of
/// the whole partition meets the tombstones. (On the 0.2 shape the version's TTL read scanned
/// every tombstone ahead of the first live row, and `insert_row` failed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_and_writes_of_the_version_or_one_row_scan_no_tombstones() {
    let cluster = unique("tombstones-rows");
    let s = session_with_keyspace().await;
    let (name, t) = long_ttl_table(&s, &cluster).await;
    let first = new_entry(Timestamp::now());
    let v = t.read_all().await.unwrap().version;
    assert!(t.insert_row(&first, &v.next()).await.unwrap());

    let started = Instant::now();
    crate::buried::bury(
        &s,
        &format!("{KEYSPACE}.{name}"),
        "test-service",
        &cluster,
        FAILURE_THRESHOLD + 100,
    )
    .await;
    eprintln!("buried in {:?}", started.elapsed());
    let buried_at = Instant::now();

    // A table value that knows nothing yet (no lease): every path reads what it needs — its
    // `initialize` too (the first step of `Silo::join`), which cannot audit the partition.
    let fresh = t.for_cluster(cluster.clone()).unwrap();
    fresh
        .initialize(true)
        .await
        .expect("initialize of a buried partition");
    let own = fresh.read_row(&first.address).await.expect("read_row");
    assert_eq!(own.rows.len(), 1);
    let second = new_entry(Timestamp::now());
    assert!(
        fresh
            .insert_row(&second, &own.version.next())
            .await
            .expect("insert_row reads the version's TTL by name"),
        "the join applies"
    );
    let row = fresh.read_row(&second.address).await.unwrap();
    let mut active = second.clone();
    active.status = cassandra_membership::SiloStatus::Active;
    assert!(
        fresh
            .update_row(&active, &row.rows[0].etag, &row.version.next())
            .await
            .expect("update_row reads the row's and the version's TTLs by name")
    );
    let renewing = t.for_cluster(cluster.clone()).unwrap();
    assert!(matches!(
        renewing
            .update_i_am_alive(&first.address, Timestamp::now())
            .await
            .expect("a lease check and renewal"),
        cassandra_membership::HeartbeatOutcome::Refreshed { .. }
    ));
    assert!(matches!(
        fresh.read_all().await,
        Err(MembershipError::TooManyTombstones { .. })
    ));
    // Its version lost while entries stay: no read can rule the entries out, so `initialize`
    // fails rather than create the version again at 0.
    s.query_unpaged(
        format!(
            "DELETE FROM {KEYSPACE}.{name} WHERE service_id = 'test-service' AND cluster_id = ? AND silo = ''"
        ),
        (&cluster,),
    )
    .await
    .unwrap();
    let starting = t.for_cluster(cluster.clone()).unwrap();
    assert!(matches!(
        starting.initialize(true).await,
        Err(MembershipError::TooManyTombstones { .. })
    ));
    assert!(
        matches!(
            starting.read_row(&first.address).await,
            Err(MembershipError::CorruptData { .. })
        ),
        "no version was created: the entry is one without a version"
    );
    // `delete_cluster` shadows a buried partition with a deletion stamped 10 s in the past
    // (clock skew between coordinators): the tombstones must be older than that, however fast
    // the steps above ran (on a quick node they took less: "still buried" on 4.1.10).
    tokio::time::sleep_until((buried_at + std::time::Duration::from_secs(11)).into()).await;
    fresh.delete_cluster(&cluster).await.unwrap();
    s.query_unpaged(format!("DROP TABLE {KEYSPACE}.{name}"), ())
        .await
        .unwrap();
}

/// What the shape is for: an expired generation leaves two tombstone cells (its entry and its
/// heartbeat), so `read_all` still answers with 45,000 expired generations in its partition
/// (90,000 cells, under the failure threshold of 100,000; the 0.2 shape left eleven per
/// generation and failed past ~9,000), and the count it reports is two per generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_all_answers_with_45000_expired_generations() {
    use futures::StreamExt as _;
    const GENERATIONS: usize = 45_000;
    let cluster = unique("tombstones-churn");
    let s = session_with_keyspace().await;
    let (name, t) = long_ttl_table(&s, &cluster).await;
    let live = new_entry(Timestamp::now());
    let v = t.read_all().await.unwrap().version;
    assert!(t.insert_row(&live, &v.next()).await.unwrap());

    // Expired generations as the provider leaves them: an entry cell and a heartbeat cell,
    // written with a TTL that runs out (plain writes, past the provider, for speed).
    let started = Instant::now();
    let write = s
        .prepare(format!(
            "UPDATE {KEYSPACE}.{name} USING TTL 1 SET entry = {{etag: uuid(), status: 6, \
             suspect_times: [], proxy_port: 1, host_name: 'h', silo_name: 's', role_name: 'r', \
             update_zone: 0, fault_zone: 0, start_time: toTimestamp(now()), \
             i_am_alive: toTimestamp(now())}}, heartbeat = (toTimestamp(now()), toTimestamp(now())) \
             WHERE service_id = 'test-service' AND cluster_id = ? AND silo = ?"
        ))
        .await
        .unwrap();
    let (write, cluster_ref) = (&write, cluster.as_str());
    futures::stream::iter(0..GENERATIONS)
        .map(|i| {
            let s = &s;
            async move {
                let key = format!(
                    "10.{}.{}.{}:11111@{}",
                    i / 65_536,
                    (i / 256) % 256,
                    i % 256,
                    i
                );
                s.execute_unpaged(write, (cluster_ref, key))
                    .await
                    .expect("a plain write")
            }
        })
        .buffer_unordered(128)
        .for_each(|_| async {})
        .await;
    eprintln!(
        "{GENERATIONS} generations written in {:?}",
        started.elapsed()
    );
    tokio::time::sleep(std::time::Duration::from_millis(2_100)).await;

    let started = Instant::now();
    let snapshot = t
        .read_all()
        .await
        .expect("read_all with 45,000 expired generations");
    eprintln!("read_all in {:?}", started.elapsed());
    assert_eq!(snapshot.rows.len(), 1, "only the live entry");
    assert_eq!(snapshot.rows[0].entry, live);
    let scanned = t
        .tombstones_scanned()
        .expect("a read past the warning threshold reports its tombstones");
    assert!(
        (2 * GENERATIONS as u64..=2 * GENERATIONS as u64 + 10).contains(&scanned),
        "{scanned} tombstones reported for {GENERATIONS} expired generations: two each"
    );
    t.delete_cluster(&cluster).await.unwrap();
    s.query_unpaged(format!("DROP TABLE {KEYSPACE}.{name}"), ())
        .await
        .unwrap();
}

//! Cassandra-specific behaviour of the provider: schema, parallel initialization, isolation,
//! damaged data, paging, statement costs.

use scylla::value::CqlTimestamp;
use std::sync::Arc;
use std::time::Duration;

use cassandra_membership::conformance::new_entry;
use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, HeartbeatOutcome, MembershipError,
    MembershipTable, SiloAddress, SiloStatus, TableVersion, Timestamp,
};

use crate::utils::{
    KEYSPACE, contact_points, count_rows, options, session, session_with_keyspace, table_on, unique,
};

async fn ready(
    cluster: &str,
) -> (
    Arc<scylla::client::session::Session>,
    CassandraMembershipTable,
) {
    let s = session_with_keyspace().await;
    let t = table_on(&s, options(cluster));
    t.initialize(true).await.unwrap();
    (s, t)
}

async fn insert_next(t: &dyn MembershipTable, e: &cassandra_membership::MembershipEntry) {
    let v = t.read_all().await.unwrap().version;
    assert!(t.insert_row(e, &v.next()).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_tables_initialize_in_parallel_against_a_fresh_keyspace() {
    let s = session().await;
    let keyspace = unique("ks").replace('-', "_")[..30].to_owned();
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let s = Arc::clone(&s);
            let o = CassandraClusteringOptions::default()
                .keyspace(&keyspace)
                .service_id("svc")
                .cluster_id(format!("c{i}"))
                .contact_points(contact_points())
                .create_keyspace_simple(1);
            tokio::spawn(async move {
                let t = CassandraMembershipTable::with_session(s, o).unwrap();
                t.initialize(true).await.map(|_| t)
            })
        })
        .collect();
    let mut tables = Vec::new();
    for task in tasks {
        tables.push(
            task.await
                .unwrap()
                .expect("every parallel initialize succeeds"),
        );
    }
    for t in &tables {
        let snapshot = t.read_all().await.unwrap();
        assert_eq!(snapshot.version.version, 0);
        assert!(!snapshot.version.etag.is_absent());
    }
    s.query_unpaged(format!("DROP KEYSPACE {keyspace}"), ())
        .await
        .unwrap();
}

#[tokio::test]
async fn clusters_with_overlapping_addresses_stay_isolated() {
    let (_, a) = ready(&unique("iso-a")).await;
    let b = a.for_cluster(unique("iso-b")).unwrap();
    b.initialize(true).await.unwrap();
    let e = new_entry(Timestamp::now());
    insert_next(&a, &e).await;
    assert!(b.read_all().await.unwrap().rows.is_empty());
    assert_eq!(
        b.update_i_am_alive(&e.address, Timestamp::now())
            .await
            .unwrap(),
        HeartbeatOutcome::NotFound
    );
    insert_next(&b, &e.clone()).await;
    let dead = {
        let mut d = e.clone();
        d.status = SiloStatus::Dead;
        d
    };
    let sa = a.read_all().await.unwrap();
    assert!(
        a.update_row(&dead, &sa.rows[0].etag, &sa.version.next())
            .await
            .unwrap()
    );
    assert_eq!(
        b.read_all().await.unwrap().rows[0].entry.status,
        SiloStatus::Joining
    );
    assert_eq!(
        b.cleanup_defunct(Timestamp::now().saturating_add(Duration::from_secs(60)))
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        a.read_all().await.unwrap().rows.len(),
        1,
        "cleanup of b never touches a"
    );
}

#[tokio::test]
async fn a_new_instance_reads_back_identically() {
    let cluster = unique("reread");
    let (_, t) = ready(&cluster).await;
    let mut e = new_entry(Timestamp::now());
    e.suspect_times.push(cassandra_membership::SuspectTime {
        suspecting_silo: new_entry(Timestamp::now()).address,
        time: Timestamp::now(),
    });
    insert_next(&t, &e).await;
    t.update_i_am_alive(
        &e.address,
        Timestamp::now().saturating_add(Duration::from_secs(1)),
    )
    .await
    .unwrap();
    let written = t.read_all().await.unwrap();
    drop(t);
    let other = CassandraMembershipTable::connect(options(&cluster))
        .await
        .unwrap();
    assert_eq!(other.read_all().await.unwrap(), written);
    assert_eq!(other.read_row(&e.address).await.unwrap(), written);
}

/// Writes rows by hand, the way an older program or an operator might have.
async fn hand_write(
    s: &scylla::client::session::Session,
    cluster: &str,
    silo: &str,
    assignments: &str,
) {
    let cql = format!(
        "UPDATE {KEYSPACE}.membership SET {assignments} WHERE service_id = 'test-service' AND cluster_id = ? AND silo = ?"
    );
    s.query_unpaged(cql, (cluster, silo)).await.unwrap();
}

#[tokio::test]
async fn damaged_rows_are_skipped_by_read_all_and_reported_by_read_row() {
    let cluster = unique("damaged");
    let (s, t) = ready(&cluster).await;
    let mut good = new_entry(Timestamp::now());
    good.status = SiloStatus::Active;
    insert_next(&t, &good).await;
    let complete = "entry = {etag: uuid(), status: 6, suspect_times: [], proxy_port: 1, host_name: 'h', \
                    silo_name: 's', role_name: 'r', update_zone: 0, fault_zone: 0, \
                    start_time: toTimestamp(now()), i_am_alive: toTimestamp(now())}";
    let damages = [
        ("10.9.0.1:1@1", complete.replace("status: 6", "status: 42")),
        ("10.9.0.2:1@1", complete.replace("host_name: 'h', ", "")),
        (
            "10.9.0.3:1@1",
            complete.replace(
                "suspect_times: []",
                "suspect_times: [('not-a-silo', toTimestamp(now()))]",
            ),
        ),
        (
            "10.9.0.4:1@1",
            complete.replace(
                "suspect_times: []",
                "suspect_times: [('10.0.0.1:1@1', null)]",
            ),
        ),
        (
            "10.9.0.5:1@1",
            complete.replace("proxy_port: 1", "proxy_port: 70000"),
        ),
        ("not a silo address", complete.to_owned()),
    ];
    for (silo, assignments) in &damages {
        hand_write(&s, &cluster, silo, assignments).await;
    }
    let snapshot = t
        .read_all()
        .await
        .expect("damaged rows never fail the whole read");
    assert_eq!(snapshot.rows.len(), 1, "only the intact row is returned");
    assert_eq!(snapshot.rows[0].entry, good);
    for (silo, _) in &damages[..5] {
        match t.read_row(&silo.parse().unwrap()).await {
            Err(MembershipError::CorruptData {
                silo: Some(s),
                reason,
            }) => {
                assert_eq!(&s, silo);
                assert!(!reason.is_empty());
            }
            other => panic!("read_row of damaged {silo} returned {other:?}"),
        }
    }
    // A missing silo next to damaged rows is still just missing: read_row answers a miss with
    // the version its damaged neighbour carries (10.9.0.1:1@0 sorts before the bad status;
    // 10.9.0.5:1@2 before the key that is no silo address).
    for missing in ["10.9.0.1:1@0", "10.9.0.5:1@2"] {
        let got = t
            .read_row(&missing.parse().unwrap())
            .await
            .unwrap_or_else(|e| panic!("read_row of missing {missing}: {e}"));
        assert!(got.rows.is_empty(), "{missing}: {got:?}");
        assert_eq!(got.version, snapshot.version, "{missing}");
    }
    // Cleanup leaves rows it cannot understand alone (they look Dead and old), and the intact
    // one is still usable.
    assert_eq!(
        t.cleanup_defunct(Timestamp::now().saturating_add(Duration::from_secs(3600)))
            .await
            .unwrap(),
        0
    );
    let stored = count_rows(&s, format!("SELECT silo FROM {KEYSPACE}.membership WHERE service_id = 'test-service' AND cluster_id = ?"), (&cluster,)).await;
    // The damaged rows, the intact one and the version's row.
    assert_eq!(stored, damages.len() + 2);
    let after = t.read_all().await.unwrap();
    let mut changed = good.clone();
    changed.status = SiloStatus::ShuttingDown;
    assert!(
        t.update_row(&changed, &after.rows[0].etag, &after.version.next())
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn a_damaged_table_version_is_reported_as_corrupt() {
    let cluster = unique("badversion");
    let (s, t) = ready(&cluster).await;
    s.query_unpaged(
        format!("UPDATE {KEYSPACE}.membership SET version = -5 WHERE service_id = 'test-service' AND cluster_id = ? AND silo = ''"),
        (&cluster,),
    )
    .await
    .unwrap();
    assert!(matches!(
        t.read_all().await,
        Err(MembershipError::CorruptData { .. })
    ));
    s.query_unpaged(
        format!("DELETE version_etag FROM {KEYSPACE}.membership WHERE service_id = 'test-service' AND cluster_id = ? AND silo = ''"),
        (&cluster,),
    )
    .await
    .unwrap();
    let e = new_entry(Timestamp::now());
    match t.read_row(&e.address).await {
        Err(MembershipError::CorruptData { reason, .. }) => {
            assert!(reason.contains("incomplete"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reads_page_through_many_rows_and_stay_consistent() {
    let cluster = unique("paging");
    let s = session_with_keyspace().await;
    let t = Arc::new(table_on(&s, options(&cluster).page_size(10)));
    t.initialize(true).await.unwrap();
    const ROWS: u64 = 45;
    let writer = {
        let t = Arc::clone(&t);
        tokio::spawn(async move {
            for _ in 0..ROWS {
                insert_next(t.as_ref(), &new_entry(Timestamp::now())).await;
            }
        })
    };
    // Each insert adds one row and one version: any consistent view has as many rows as its
    // version number, however many pages the read took and whatever was written meanwhile.
    let mut reads = 0;
    while !writer.is_finished() {
        let snapshot = t.read_all().await.unwrap();
        assert_eq!(
            snapshot.rows.len() as u64,
            snapshot.version.version,
            "a read mixed two versions"
        );
        reads += 1;
    }
    writer.await.unwrap();
    let last = t.read_all().await.unwrap();
    assert_eq!(last.rows.len() as u64, ROWS);
    assert_eq!(last.version.version, ROWS);
    assert!(reads > 0);
}

/// The version's row (`''`) sorts first in ascending key order, where a whole-partition read
/// finds it on its first page: a table clustered the other way round has another shape.
#[tokio::test]
async fn a_table_clustered_in_descending_order_is_a_schema_mismatch() {
    let s = session_with_keyspace().await;
    let name = unique("desc").replace('-', "_")[..20].to_owned();
    for ddl in [
        format!(
            "CREATE TYPE {KEYSPACE}.{name}_entry (etag uuid, status int, \
             suspect_times frozen<list<frozen<tuple<text, timestamp>>>>, proxy_port int, host_name text, \
             silo_name text, role_name text, update_zone int, fault_zone int, start_time timestamp, \
             i_am_alive timestamp)"
        ),
        format!(
            "CREATE TABLE {KEYSPACE}.{name} (service_id text, cluster_id text, silo text, \
             version bigint, version_etag uuid, entry frozen<{name}_entry>, \
             heartbeat frozen<tuple<timestamp, timestamp>>, PRIMARY KEY ((service_id, cluster_id), silo)) \
             WITH CLUSTERING ORDER BY (silo DESC)"
        ),
    ] {
        s.query_unpaged(ddl, ()).await.unwrap();
    }
    s.await_schema_agreement().await.unwrap();
    let t = table_on(&s, options("c").table(&name));
    match t.initialize(true).await {
        Err(MembershipError::SchemaMismatch { detail, .. }) => {
            assert!(detail.contains("descending"), "{detail}");
            assert!(
                !detail.contains("missing"),
                "only the order differs: {detail}"
            );
        }
        other => panic!("{other:?}"),
    }
    s.query_unpaged(format!("DROP TABLE {KEYSPACE}.{name}"), ())
        .await
        .unwrap();
}

/// A table of the 0.2 shape (static version and heartbeat map, a column per entry field) is
/// recognised and never read or written: `TableNeedsMigration`, naming the table.
#[tokio::test]
async fn a_table_of_the_old_shape_needs_migration_and_is_left_as_it_is() {
    let s = session_with_keyspace().await;
    let name = unique("old").replace('-', "_")[..20].to_owned();
    s.query_unpaged(
        format!(
            "CREATE TABLE {KEYSPACE}.{name} (service_id text, cluster_id text, silo text, \
             version bigint static, version_etag uuid static, \
             heartbeats map<text, frozen<tuple<timestamp, timestamp>>> static, etag uuid, status int, \
             suspect_times frozen<list<frozen<tuple<text, timestamp>>>>, proxy_port int, host_name text, \
             silo_name text, role_name text, update_zone int, fault_zone int, start_time timestamp, \
             i_am_alive timestamp, PRIMARY KEY ((service_id, cluster_id), silo))"
        ),
        (),
    )
    .await
    .unwrap();
    s.query_unpaged(
        format!(
            "UPDATE {KEYSPACE}.{name} SET version = 7, version_etag = uuid() \
             WHERE service_id = 'test-service' AND cluster_id = 'c'"
        ),
        (),
    )
    .await
    .unwrap();
    s.await_schema_agreement().await.unwrap();
    let t = table_on(&s, options("c").table(&name));
    match t.initialize(true).await {
        Err(e @ MembershipError::TableNeedsMigration { .. }) => {
            let MembershipError::TableNeedsMigration { table } = &e else {
                unreachable!()
            };
            assert_eq!(table, &format!("\"{KEYSPACE}\".\"{name}\""));
            assert!(
                e.to_string().contains("cassandra-membership migrate"),
                "{e}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        t.read_all().await,
        Err(MembershipError::TableNeedsMigration { .. } | MembershipError::SchemaMismatch { .. })
    ));
    // Nothing written: the old version is as it was.
    let rows = count_rows(
        &s,
        format!("SELECT version FROM {KEYSPACE}.{name} WHERE service_id = 'test-service' AND cluster_id = 'c' AND version = 7 ALLOW FILTERING"),
        (),
    )
    .await;
    assert_eq!(rows, 1);
    s.query_unpaged(format!("DROP TABLE {KEYSPACE}.{name}"), ())
        .await
        .unwrap();
}

#[tokio::test]
async fn a_table_of_another_shape_is_a_schema_mismatch() {
    let s = session_with_keyspace().await;
    let name = unique("shape").replace('-', "_")[..20].to_owned();
    s.query_unpaged(
        format!(
            "CREATE TABLE {KEYSPACE}.{name} (service_id text, cluster_id text, silo text, entry text, \
             PRIMARY KEY ((service_id, cluster_id), silo))"
        ),
        (),
    )
    .await
    .unwrap();
    s.await_schema_agreement().await.unwrap();
    let t = table_on(&s, options("c").table(&name));
    match t.initialize(true).await {
        Err(MembershipError::SchemaMismatch { table, detail }) => {
            assert_eq!(table, format!("\"{KEYSPACE}\".\"{name}\""));
            assert!(
                detail.contains("column entry is regular text, expected regular frozen<"),
                "{detail}"
            );
            assert!(detail.contains("column heartbeat is missing"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
    s.query_unpaged(format!("DROP TABLE {KEYSPACE}.{name}"), ())
        .await
        .unwrap();
}

#[tokio::test]
async fn invalid_identifiers_are_rejected_before_any_statement() {
    let s = session().await;
    for bad in ["x\"; DROP KEYSPACE cm_test; --", "ks.tbl", ""] {
        let err = CassandraMembershipTable::with_session(Arc::clone(&s), options("c").table(bad))
            .unwrap_err();
        assert!(
            matches!(err, MembershipError::InvalidConfiguration { ref option, .. } if option == "table"),
            "{err}"
        );
    }
}

#[tokio::test]
async fn unreachable_nodes_are_reported_as_unavailable() {
    let o = CassandraClusteringOptions::default()
        .keyspace(KEYSPACE)
        .service_id("svc")
        .cluster_id("c")
        .contact_points(["127.0.0.1:1"])
        .request_timeout(Duration::from_secs(1));
    match CassandraMembershipTable::connect(o).await {
        Err(MembershipError::Unavailable { operation, .. }) => assert_eq!(operation, "connect"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn heartbeats_within_a_lease_are_one_plain_write() {
    let (_, t) = ready(&unique("cost")).await;
    let e = new_entry(Timestamp::now());
    insert_next(&t, &e).await;
    let before = t.statement_counts();
    for i in 0..20 {
        let outcome = t
            .update_i_am_alive(
                &e.address,
                Timestamp::now().saturating_add(Duration::from_millis(i)),
            )
            .await
            .unwrap();
        assert!(matches!(outcome, HeartbeatOutcome::Refreshed { .. }));
    }
    let after = t.statement_counts();
    assert_eq!(after.plain_writes - before.plain_writes, 20);
    assert_eq!(after.conditional_writes - before.conditional_writes, 0);
    assert_eq!(
        after.reads + after.serial_reads - before.reads - before.serial_reads,
        0
    );
}

/// A silo starting in a cluster whose version exists races nobody for it: no conditional write.
#[tokio::test]
async fn initialize_writes_the_version_only_when_it_is_missing() {
    let (_, t) = ready(&unique("init-once")).await;
    let again = t.for_cluster(t.cluster_id().to_owned()).unwrap();
    let before = again.statement_counts();
    again.initialize(true).await.unwrap();
    assert_eq!(
        again.statement_counts().conditional_writes - before.conditional_writes,
        0,
        "the version exists"
    );
    let fresh = t.for_cluster(unique("init-once-new")).unwrap();
    let before = fresh.statement_counts();
    fresh.initialize(true).await.unwrap();
    assert_eq!(
        fresh.statement_counts().conditional_writes - before.conditional_writes,
        1,
        "the first silo creates the version"
    );
    assert!(!fresh.read_all().await.unwrap().version.etag.is_absent());
}

/// What each operation costs, by statement kind (the table of `docs::costs`).
#[tokio::test]
async fn statement_costs_per_operation() {
    let (_, t) = ready(&unique("costs")).await;
    let e = new_entry(Timestamp::now());
    let mut last = t.statement_counts();
    let mut cost = |label: &str, t: &CassandraMembershipTable| {
        let now = t.statement_counts();
        let d = (
            now.reads - last.reads,
            now.serial_reads - last.serial_reads,
            now.plain_writes - last.plain_writes,
            now.conditional_writes - last.conditional_writes,
        );
        eprintln!(
            "{label:<28} reads {} serial reads {} plain writes {} conditional writes {}",
            d.0, d.1, d.2, d.3
        );
        last = now;
        d
    };
    cost("(setup)", &t);
    let v = t.read_all().await.unwrap().version;
    assert_eq!(
        cost("read_all", &t),
        (0, 1, 0, 0),
        "one serial page: the version's row, the entries and their heartbeat cells"
    );
    assert!(t.insert_row(&e, &v.next()).await.unwrap());
    assert_eq!(cost("insert_row", &t), (0, 0, 0, 1));
    let s = t.read_row(&e.address).await.unwrap();
    assert_eq!(cost("read_row (present)", &t), (0, 1, 0, 0));
    // Keys are "ip:port@generation" text: 127.0.0.0 sorts before the entry's 127.0.0.1, 127.0.0.2 after.
    let absent = |ip: [u8; 4]| SiloAddress::new(std::net::SocketAddr::from((ip, 1)), 1).unwrap();
    let after = t.read_row(&absent([127, 0, 0, 0])).await.unwrap();
    assert_eq!(
        cost("read_row (absent, a row after it)", &t),
        (0, 1, 0, 0),
        "one names read of the version's row and the silo's"
    );
    assert!(after.rows.is_empty());
    assert_eq!(after.version, s.version);
    let before = t.read_row(&absent([127, 0, 0, 2])).await.unwrap();
    assert_eq!(
        cost("read_row (absent, rows before it)", &t),
        (0, 1, 0, 0),
        "one names read, wherever the key sorts"
    );
    assert!(before.rows.is_empty());
    assert_eq!(before.version, s.version);
    let empty = t.for_cluster(unique("costs-empty")).unwrap();
    let nothing = empty.read_row(&absent([127, 0, 0, 0])).await.unwrap();
    assert_eq!(
        cost("read_row (empty cluster)", &empty),
        (0, 2, 0, 0),
        "the names read, then (no version) a read of the partition: entries without a version are a lost version, never an absent one"
    );
    assert!(nothing.rows.is_empty());
    assert_eq!(nothing.version, TableVersion::absent());
    let mut changed = e.clone();
    changed.status = SiloStatus::Dead;
    assert!(
        t.update_row(&changed, &s.rows[0].etag, &s.version.next())
            .await
            .unwrap()
    );
    assert_eq!(cost("update_row", &t), (0, 0, 0, 1));
    t.update_i_am_alive(&e.address, Timestamp::now())
        .await
        .unwrap();
    assert_eq!(cost("update_i_am_alive (lease)", &t), (0, 0, 1, 0));
    let fresh = t.for_cluster(t.cluster_id().to_owned()).unwrap();
    fresh
        .update_i_am_alive(&e.address, Timestamp::now())
        .await
        .unwrap();
    assert_eq!(
        cost("update_i_am_alive (check)", &fresh),
        (2, 0, 1, 0),
        "TTL off: a check is one plain read of the row and one of its and the version's TTLs"
    );
    assert_eq!(
        t.cleanup_defunct(Timestamp::now().saturating_add(Duration::from_secs(60)))
            .await
            .unwrap(),
        1
    );
    // read_all, the entry's conditional delete, 1 plain read of the due heartbeat cells' write
    // times and the delete of the cell left behind (stamped with its write time).
    assert_eq!(cost("cleanup_defunct (1 removed)", &t), (1, 1, 1, 1));
    t.delete_cluster(t.cluster_id()).await.unwrap();
    // The stored keys (serial), the batch, the heartbeat cells' write times, the check (serial).
    assert_eq!(cost("delete_cluster (empty)", &t), (1, 2, 0, 1));
}

/// A row without an entry — a heartbeat cell that outlived it, or a bare row marker another
/// program wrote — is no entry; cleanup removes the cell (at its own write time), and the key can
/// be inserted again.
#[tokio::test]
async fn a_row_without_an_entry_is_no_entry_and_cleanup_removes_its_heartbeat_cell() {
    let cluster = unique("marker");
    let (s, t) = ready(&cluster).await;
    let e = new_entry(Timestamp::now());
    let key = e.address.to_string();
    let past = Timestamp::now().as_millis() - 120_000;
    s.query_unpaged(
        format!(
            "UPDATE {KEYSPACE}.membership USING TIMESTAMP ? SET heartbeat = (?, ?) \
             WHERE service_id = 'test-service' AND cluster_id = ? AND silo = ?"
        ),
        (
            past * 1000,
            CqlTimestamp(past),
            CqlTimestamp(past),
            &cluster,
            &key,
        ),
    )
    .await
    .unwrap();
    let marker = SiloAddress::new(std::net::SocketAddr::from(([10, 1, 1, 1], 1)), 1).unwrap();
    s.query_unpaged(
        format!("INSERT INTO {KEYSPACE}.membership (service_id, cluster_id, silo) VALUES ('test-service', ?, ?)"),
        (&cluster, marker.to_string()),
    )
    .await
    .unwrap();
    assert!(t.read_all().await.unwrap().rows.is_empty());
    for address in [&e.address, &marker] {
        assert!(t.read_row(address).await.unwrap().rows.is_empty());
        assert_eq!(
            t.update_i_am_alive(address, Timestamp::now())
                .await
                .unwrap(),
            HeartbeatOutcome::NotFound
        );
    }
    assert_eq!(
        t.cleanup_defunct(Timestamp::now()).await.unwrap(),
        0,
        "not an entry, not counted"
    );
    let left = count_rows(
        &s,
        format!("SELECT silo FROM {KEYSPACE}.membership WHERE service_id = 'test-service' AND cluster_id = ? AND silo = ?"),
        (&cluster, &key),
    )
    .await;
    assert_eq!(
        left, 0,
        "cleanup removed the heartbeat cell, and so the row"
    );
    // And an insert of the marker's key works (inserts expect no entry, not no row).
    let mut at_marker = e.clone();
    at_marker.address = marker;
    insert_next(&t, &at_marker).await;
    assert_eq!(t.read_row(&marker).await.unwrap().rows[0].entry, at_marker);
}

#[tokio::test]
async fn a_missing_keyspace_is_named_and_never_created_silently() {
    let s = session().await;
    let keyspace = unique("nokeyspace").replace('-', "_")[..30].to_owned();
    let t = table_on(
        &s,
        CassandraClusteringOptions::default()
            .keyspace(&keyspace)
            .service_id("svc")
            .cluster_id("c")
            .contact_points(contact_points()),
    );
    // Its own variant, not a table of another shape; the message says what to do.
    match t.initialize(true).await {
        Err(MembershipError::KeyspaceMissing { keyspace: named }) => assert_eq!(named, keyspace),
        other => panic!("{other:?}"),
    }
    let text = t.initialize(true).await.unwrap_err().to_string();
    assert!(
        text.contains(&keyspace) && text.contains("create_keyspace_with_replication"),
        "{text}"
    );
    // A table value that never ran `initialize` (an operator's tool, a reader) learns it from
    // its first statement.
    let reader = table_on(
        &s,
        CassandraClusteringOptions::default()
            .keyspace(&keyspace)
            .service_id("svc")
            .cluster_id("c"),
    );
    match reader.read_all().await {
        Err(MembershipError::KeyspaceMissing { keyspace: named }) => assert_eq!(named, keyspace),
        other => panic!("{other:?}"),
    }
    let exists = count_rows(
        &s,
        "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = ?".into(),
        (&keyspace,),
    )
    .await;
    assert_eq!(exists, 0);
}

/// A missing table in an existing keyspace stays a schema mismatch: only the keyspace gets
/// its own variant.
#[tokio::test]
async fn a_missing_table_in_an_existing_keyspace_is_a_schema_mismatch_not_a_missing_keyspace() {
    let s = session_with_keyspace().await;
    let reader = table_on(&s, options(&unique("notable")).table("no_such_table_api24"));
    match reader.read_all().await {
        Err(MembershipError::SchemaMismatch { table, .. }) => {
            assert!(table.contains("no_such_table_api24"), "{table}")
        }
        other => panic!("{other:?}"),
    }
}

/// A table name with capitals (quoted everywhere) gets an entry type Cassandra reports quoted:
/// the table the provider creates passes its own schema check, then and on every later start.
#[tokio::test]
async fn a_table_named_with_capitals_is_created_checked_and_used() {
    let s = session_with_keyspace().await;
    let name = format!("Mixed_{}", &unique("case").replace('-', "_")[..16]);
    for _ in 0..2 {
        let t = table_on(&s, options("c").table(&name));
        t.initialize(true).await.expect("initialize");
        let e = new_entry(Timestamp::now());
        insert_next(&t, &e).await;
        assert_eq!(t.read_row(&e.address).await.unwrap().rows[0].entry, e);
    }
    s.query_unpaged(format!("DROP TABLE {KEYSPACE}.\"{name}\""), ())
        .await
        .unwrap();
}

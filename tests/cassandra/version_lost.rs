//! A partition whose version is lost while its rows stay (an interrupted or running
//! `delete_cluster`, a version outlived by rows): reads and dry runs write nothing, no membership
//! write applies, and `delete_cluster` racing a reader leaves nothing behind.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cassandra_membership::conformance::new_entry;
use cassandra_membership::{MembershipEntry, MembershipError, MembershipTable, Timestamp};
use scylla::client::session::Session;

use crate::utils::{KEYSPACE, options, session_with_keyspace, table_on, unique};

/// (version, version_etag) as stored, past the provider (`None`: no version row at all).
async fn raw_version(s: &Session, cluster: &str) -> Option<(Option<i64>, Option<uuid::Uuid>)> {
    s.query_unpaged(
        format!(
            "SELECT version, version_etag FROM {KEYSPACE}.membership \
             WHERE service_id = 'test-service' AND cluster_id = ? AND silo = ''"
        ),
        (cluster,),
    )
    .await
    .unwrap()
    .into_rows_result()
    .unwrap()
    .maybe_first_row()
    .unwrap()
}

/// What the first batch of `delete_cluster` (or its "close" step) leaves: no version, rows stay.
async fn lose_the_version(s: &Session, cluster: &str) {
    s.query_unpaged(
        format!(
            "DELETE FROM {KEYSPACE}.membership \
             WHERE service_id = 'test-service' AND cluster_id = ? AND silo = ''"
        ),
        (cluster,),
    )
    .await
    .unwrap();
}

async fn insert_many(t: &dyn MembershipTable, n: usize) -> Vec<MembershipEntry> {
    let mut v = t.read_all().await.unwrap().version;
    let mut out = Vec::new();
    for _ in 0..n {
        let e = new_entry(Timestamp::now());
        assert!(t.insert_row(&e, &v.next()).await.unwrap());
        v = t.read_row(&e.address).await.unwrap().version;
        out.push(e);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_and_inspect_write_nothing_in_a_partition_that_lost_its_version() {
    let cluster = unique("lost-dry-run");
    let s = session_with_keyspace().await;
    let t = table_on(&s, options(&cluster));
    t.initialize(true).await.unwrap();
    insert_many(&t, 2).await;
    lose_the_version(&s, &cluster).await;
    assert_eq!(raw_version(&s, &cluster).await, None);
    let audit = t.audit_ttl().await.unwrap();
    assert!(
        audit.rows.iter().any(|r| r.silo.is_none()),
        "the audit reports the missing version: {audit:?}"
    );
    match t.inspect_cluster("test-service", &cluster).await {
        Err(MembershipError::CorruptData { reason, .. }) => {
            assert!(reason.contains("version is missing"), "{reason}")
        }
        other => panic!("inspect of a partition that lost its version: {other:?}"),
    }
    assert_eq!(
        raw_version(&s, &cluster).await,
        None,
        "a dry run wrote a version"
    );
}

/// What `delete_cluster`'s close step leaves: a running silo's reads fail and its writes cannot
/// apply (each is conditioned on the version tag), however it retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_cluster_takes_no_membership_write() {
    let cluster = unique("lost-closed");
    let s = session_with_keyspace().await;
    let t = table_on(&s, options(&cluster));
    t.initialize(true).await.unwrap();
    insert_many(&t, 2).await;
    let before = t.read_all().await.unwrap().version;
    lose_the_version(&s, &cluster).await; // exactly what the close step deletes
    assert!(matches!(
        t.read_all().await,
        Err(MembershipError::CorruptData { .. })
    ));
    let e = new_entry(Timestamp::now());
    assert!(!t.insert_row(&e, &before.next()).await.unwrap());
    assert_eq!(raw_version(&s, &cluster).await, None);
}

/// delete_cluster of a multi-chunk partition while one silo still reads (its detector): every
/// row and the version must be gone, and the answer must not be CorruptData.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_cluster_racing_a_reader_leaves_nothing() {
    let s = session_with_keyspace().await;
    let mut failures = Vec::new();
    for round in 0..3 {
        let cluster = unique("lost-delete");
        let t = Arc::new(table_on(&s, options(&cluster)));
        t.initialize(true).await.unwrap();
        insert_many(t.as_ref(), 450).await;
        let reader = Arc::new(table_on(&s, options(&cluster)));
        reader.initialize(true).await.unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let reads = Arc::new(AtomicUsize::new(0));
        let task = {
            let (reader, stop, reads) = (reader.clone(), stop.clone(), reads.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let _ = reader.read_all().await;
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let started = Instant::now();
        let deleted = t.delete_cluster(&cluster).await;
        let took = started.elapsed();
        // Give a read in flight time to land, then stop the reader.
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.store(true, Ordering::Relaxed);
        task.await.unwrap();
        let left = raw_version(&s, &cluster).await;
        let rows = crate::utils::count_rows(
            &s,
            format!("SELECT silo FROM {KEYSPACE}.membership WHERE service_id = 'test-service' AND cluster_id = ?"),
            (&cluster,),
        )
        .await;
        eprintln!(
            "round {round}: delete_cluster -> {deleted:?} in {took:?}; reads {}; left: rows {rows}, statics {left:?}",
            reads.load(Ordering::Relaxed)
        );
        if deleted.is_err() || left.is_some_and(|v| v.1.is_some()) {
            failures.push(format!(
                "round {round}: {deleted:?}, statics left {left:?}, rows left {rows}"
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A starting silo whose settings disagree with the rows (a rolling change of
/// DefunctSiloExpiration under `allow`) meets a partition that lost its version: it re-creates
/// the version above the one the partition had, never at 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_under_allow_recreates_a_lost_version_above_the_one_it_had() {
    let s = session_with_keyspace().await;
    let table = unique("lostallow").replace('-', "_")[..24].to_owned();
    let cluster = unique("lost-allow");
    // Silos running with expiry off: rows without TTL, the version moved to 5.
    let old = table_on(&s, options(&cluster).table(&table));
    old.initialize(true).await.unwrap();
    insert_many(&old, 5).await;
    let before = old.read_all().await.unwrap().version.version;
    assert_eq!(before, 5);
    s.query_unpaged(
        format!(
            "DELETE version, version_etag FROM {KEYSPACE}.{table} WHERE service_id = 'test-service' AND cluster_id = ? AND silo = ''"
        ),
        (&cluster,),
    )
    .await
    .unwrap();
    let mut m = cassandra_membership::MembershipOptions::default();
    m.defunct_silo_expiration = Duration::from_secs(4);
    m.i_am_alive_table_publish_timeout = Duration::from_millis(500);
    let new = table_on(
        &s,
        options(&cluster)
            .table(&table)
            .ttl(true)
            .membership(m)
            .ttl_mismatch(cassandra_membership::TtlMismatchPolicy::Allow),
    );
    new.initialize(true).await.unwrap();
    let after = new.read_all().await.unwrap();
    assert!(
        after.version.version > before,
        "the version went backwards: {before} -> {}",
        after.version.version
    );
    assert_eq!(after.rows.len(), 5);
}

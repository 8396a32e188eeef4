//! Storage-side expiry under transient faults, on the real node: a fenced write, a renewal whose
//! TTL read fails, a version lost while rows stay, a damaged version at start, a partition too
//! full of tombstones to scan. None of them may leave the version without TTL, move it
//! backwards, stop a renewal, or turn into an operator's error for a silo of the same
//! configuration.
//!
//! TTL 4 s, renewal interval 1 s: every write carries TTL 6 s (as in `contract.rs`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cassandra_membership::conformance::new_entry;
use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, HeartbeatOutcome, MembershipEntry,
    MembershipError, MembershipOptions, MembershipTable, Timestamp, TtlMismatchPolicy,
};
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::errors::DbError;
use scylla::statement::Consistency;
use scylla_proxy::{Condition, RequestOpcode, RequestReaction, RequestRule, RunningProxy};

use super::{opts, table_name, ttl_on};
use crate::outcomes::{cas_write_timeout, start_proxy};
use crate::utils::{KEYSPACE, count_rows, options, session_with_keyspace, table_on, unique};

const TTL: Duration = Duration::from_secs(4);
/// Renewal interval (1 s) + the extra second every write carries.
const SLACK: Duration = Duration::from_secs(2);
const TABLE: &str = "membership_ttl4";

fn short_ttl(o: CassandraClusteringOptions) -> CassandraClusteringOptions {
    let mut m = MembershipOptions::default();
    m.defunct_silo_expiration = TTL;
    m.i_am_alive_table_publish_timeout = Duration::from_millis(500);
    o.ttl(true).membership(m).table(TABLE)
}

/// A table with expiry on whose session goes through a proxy in front of the node.
async fn proxied_ttl(cluster: &str) -> (RunningProxy, CassandraMembershipTable) {
    session_with_keyspace().await;
    let (proxy, proxy_addr, real) = start_proxy().await;
    let session = SessionBuilder::new()
        .known_node_addr(proxy_addr)
        .address_translator(Arc::new(HashMap::from([(real, proxy_addr)])))
        .build()
        .await
        .expect("session through the proxy");
    let table = CassandraMembershipTable::with_session(
        Arc::new(session),
        short_ttl(options(cluster)).request_timeout(Duration::from_millis(1500)),
    )
    .unwrap();
    table.initialize(true).await.unwrap();
    (proxy, table)
}

async fn insert(t: &dyn MembershipTable, e: &MembershipEntry) {
    let v = t.read_all().await.unwrap().version;
    assert!(t.insert_row(e, &v.next()).await.unwrap());
}

/// The version's remaining TTL as stored (`None`: none), read past the provider.
async fn version_ttl(s: &Session, cluster: &str) -> Option<i32> {
    let row: Option<(Option<i32>,)> = s
        .query_unpaged(
            format!(
                "SELECT TTL(version_etag) FROM {KEYSPACE}.{TABLE} WHERE service_id = 'test-service' AND cluster_id = ? AND silo = ''"
            ),
            (cluster,),
        )
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .maybe_first_row()
        .unwrap();
    row.and_then(|r| r.0)
}

async fn partition_size(s: &Session, cluster: &str) -> usize {
    count_rows(
        s,
        format!("SELECT silo, version FROM {KEYSPACE}.{TABLE} WHERE service_id = 'test-service' AND cluster_id = ?"),
        (cluster,),
    )
    .await
}

/// Waits until nothing of the cluster is stored; fails past the expiry bound (plus 1 s for the
/// polling and the node's whole-second clock).
async fn assert_gone_within_the_bound(s: &Session, cluster: &str, since: Instant) {
    loop {
        if partition_size(s, cluster).await == 0 {
            return;
        }
        assert!(
            since.elapsed() < TTL + SLACK + Duration::from_secs(2),
            "the stopped cluster is still stored {:?} after its last write (version TTL {:?})",
            since.elapsed(),
            version_ttl(s, cluster).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The bytes a statement's bound values start with when they are (service_id, cluster_id, silo),
/// preceded by their count: `read_ttls.cql`'s values, and no other statement of a renewal.
fn three_values(cluster: &str, silo: &str) -> Vec<u8> {
    let mut b = vec![0, 3];
    for v in ["test-service", cluster, silo] {
        b.extend_from_slice(&(v.len() as i32).to_be_bytes());
        b.extend_from_slice(v.as_bytes());
    }
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_write_keeps_the_version_ttl_and_the_stopped_cluster_still_expires() {
    let cluster = unique("fence-ttl");
    let s = session_with_keyspace().await;
    let (mut proxy, t) = proxied_ttl(&cluster).await;
    insert(&t, &new_entry(Timestamp::now())).await;
    let before = version_ttl(&s, &cluster).await;
    assert!(before.is_some_and(|t| t > 0), "{before:?}");
    // A CAS timeout before the node: the provider fences the write off by moving the tag.
    let e = new_entry(Timestamp::now());
    proxy.running_nodes[0].change_request_rules(Some(vec![RequestRule(
        Condition::RequestOpcode(RequestOpcode::Batch)
            .and(Condition::BodyContainsCaseSensitive(
                e.address.to_string().into_bytes().into(),
            ))
            .and(Condition::TrueForLimitedTimes(1)),
        RequestReaction::forge_with_error(cas_write_timeout()),
    )]));
    let v = t.read_all().await.unwrap().version;
    assert!(!t.insert_row(&e, &v.next()).await.unwrap(), "fenced off");
    let fenced = t.read_all().await.unwrap().version;
    assert_ne!(fenced.etag, v.etag, "the fence moved the tag");
    let after = version_ttl(&s, &cluster).await;
    assert!(
        after.is_some_and(|t| t > 0),
        "the fence left the version without TTL ({before:?} before)"
    );
    // A silo of the same configuration starts (the default policy throws on a mismatch).
    let same = table_on(&s, short_ttl(options(&cluster)));
    same.initialize(true)
        .await
        .expect("a state the provider left behind is no mismatch");
    let last_write = Instant::now();
    drop((t, same, proxy));
    assert_gone_within_the_bound(&s, &cluster, last_write).await;
    let again = table_on(&s, short_ttl(options(&cluster)));
    again.initialize(true).await.unwrap();
    assert_eq!(again.read_all().await.unwrap().version.version, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_whose_ttl_read_fails_keeps_the_version_ttl() {
    let cluster = unique("renew-read");
    let s = session_with_keyspace().await;
    let (mut proxy, t) = proxied_ttl(&cluster).await;
    let (a, b) = (new_entry(Timestamp::now()), new_entry(Timestamp::now()));
    insert(&t, &a).await;
    insert(&t, &b).await;
    // Both leases fall due; a's renewal scans the partition, b's (within the same interval)
    // reads its own TTLs — and that read times out.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let outcome = t.update_i_am_alive(&a.address, Timestamp::now()).await;
    assert!(
        matches!(outcome, Ok(HeartbeatOutcome::Refreshed { .. })),
        "{outcome:?}"
    );
    proxy.running_nodes[0].change_request_rules(Some(vec![RequestRule(
        Condition::RequestOpcode(RequestOpcode::Execute)
            .and(Condition::BodyContainsCaseSensitive(
                three_values(&cluster, &b.address.to_string()).into(),
            ))
            // Every attempt of the provider's read retries fails.
            .and(Condition::TrueForLimitedTimes(50)),
        RequestReaction::forge_with_error(DbError::ReadTimeout {
            consistency: Consistency::One,
            received: 0,
            required: 1,
            data_present: false,
        }),
    )]));
    // The heartbeat is still published (the next one retries the renewal).
    let outcome = t.update_i_am_alive(&b.address, Timestamp::now()).await;
    assert!(
        matches!(outcome, Ok(HeartbeatOutcome::Refreshed { .. })),
        "{outcome:?}"
    );
    proxy.running_nodes[0].change_request_rules(None);
    let ttl = version_ttl(&s, &cluster).await;
    assert!(
        ttl.is_some_and(|t| t > 0),
        "a failed TTL read left the version without TTL"
    );
    let same = table_on(&s, short_ttl(options(&cluster)));
    same.initialize(true)
        .await
        .expect("a silo of the same configuration starts");
    let last_write = Instant::now();
    drop((t, same, proxy));
    assert_gone_within_the_bound(&s, &cluster, last_write).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_left_without_ttl_is_repaired_by_a_start_of_the_same_configuration() {
    // What a fence of an earlier release left behind: the version rewritten without TTL while
    // every row has one.
    let cluster = unique("unbounded-version");
    let s = session_with_keyspace().await;
    let t = table_on(&s, short_ttl(options(&cluster)));
    t.initialize(true).await.unwrap();
    insert(&t, &new_entry(Timestamp::now())).await;
    s.query_unpaged(
        format!(
            "UPDATE {KEYSPACE}.{TABLE} USING TTL 0 SET version_etag = uuid() WHERE service_id = 'test-service' AND cluster_id = ? AND silo = ''"
        ),
        (&cluster,),
    )
    .await
    .unwrap();
    assert_eq!(version_ttl(&s, &cluster).await, None);
    let same = table_on(&s, short_ttl(options(&cluster)));
    same.initialize(true)
        .await
        .expect("the default policy (throw) repairs what the provider's own protocol left");
    assert!(version_ttl(&s, &cluster).await.is_some_and(|t| t > 0));
    let last_write = Instant::now();
    drop((t, same));
    assert_gone_within_the_bound(&s, &cluster, last_write).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_version_never_goes_backwards_when_it_is_lost_while_rows_stay() {
    let cluster = unique("lost-version");
    let s = session_with_keyspace().await;
    let t = table_on(&s, options(&cluster));
    t.initialize(true).await.unwrap();
    let mut entries = Vec::new();
    for _ in 0..3 {
        let e = new_entry(Timestamp::now());
        insert(&t, &e).await;
        entries.push(e);
    }
    let seen = t.read_all().await.unwrap().version;
    assert_eq!(seen.version, 3);
    // The version's cells vanish while the rows stay (an interrupted delete, an expiry race).
    s.query_unpaged(
        format!("DELETE version, version_etag FROM {KEYSPACE}.membership WHERE service_id = 'test-service' AND cluster_id = ? AND silo = ''"),
        (&cluster,),
    )
    .await
    .unwrap();
    // Reads never answer it absent (a write would restart it at 1), and never write.
    for read in [
        t.read_row(&entries[0].address).await,
        t.read_row(&new_entry(Timestamp::now()).address).await,
        t.read_all().await,
    ] {
        match read {
            Err(MembershipError::CorruptData { reason, .. }) => {
                assert!(reason.contains("version is missing"), "{reason}")
            }
            other => panic!("a read of a partition that lost its version: {other:?}"),
        }
    }
    let e = new_entry(Timestamp::now());
    assert!(
        !t.insert_row(&e, &seen.next()).await.unwrap(),
        "no write applies to a partition without a version"
    );
    // A silo's start re-creates it above any earlier number.
    let starting = table_on(&s, options(&cluster));
    starting.initialize(true).await.unwrap();
    let all = t.read_all().await.unwrap();
    assert!(
        all.version.version > seen.version,
        "version {} after {}",
        all.version.version,
        seen.version
    );
    assert_eq!(all.rows.len(), 3, "no row lost");
    let e = new_entry(Timestamp::now());
    assert!(t.insert_row(&e, &all.version.next()).await.unwrap());
    let after = t.read_all().await.unwrap();
    assert_eq!(after.version.version, all.version.version + 1);
    assert_eq!(after.rows.len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_version_at_start_is_corrupt_data_under_every_policy_and_is_kept() {
    let cluster = unique("damaged-version");
    let s = session_with_keyspace().await;
    let t = table_on(&s, options(&cluster));
    t.initialize(true).await.unwrap();
    insert(&t, &new_entry(Timestamp::now())).await;
    // The version number stays, its tag is gone.
    s.query_unpaged(
        format!("DELETE version_etag FROM {KEYSPACE}.membership WHERE service_id = 'test-service' AND cluster_id = ? AND silo = ''"),
        (&cluster,),
    )
    .await
    .unwrap();
    for policy in [
        TtlMismatchPolicy::Throw,
        TtlMismatchPolicy::Allow,
        TtlMismatchPolicy::Patch,
    ] {
        let other = table_on(&s, options(&cluster).ttl_mismatch(policy));
        match other.initialize(true).await {
            Err(MembershipError::CorruptData { .. }) => {}
            other => panic!("{policy:?}: {other:?}"),
        }
    }
    let stored: Option<(Option<i64>,)> = s
        .query_unpaged(
            format!("SELECT version FROM {KEYSPACE}.membership WHERE service_id = 'test-service' AND cluster_id = ? LIMIT 1"),
            (&cluster,),
        )
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .maybe_first_row()
        .unwrap();
    assert_eq!(
        stored,
        Some((Some(1),)),
        "the damaged version was rewritten"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_that_expires_before_a_longer_lived_row_comes_back_above_its_old_number() {
    // The worst a race between a write's TTL read and a longer-TTL silo's renewal can leave
    // (a rolling change of DefunctSiloExpiration): the version expiring before a row.
    let cluster = unique("short-version");
    let s = session_with_keyspace().await;
    let t = table_on(&s, short_ttl(options(&cluster)));
    t.initialize(true).await.unwrap();
    insert(&t, &new_entry(Timestamp::now())).await;
    let before = t.read_all().await.unwrap().version;
    let (version, tag): (Option<i64>, Option<uuid::Uuid>) = s
        .query_unpaged(
            format!("SELECT version, version_etag FROM {KEYSPACE}.{TABLE} WHERE service_id = 'test-service' AND cluster_id = ? AND silo = ''"),
            (&cluster,),
        )
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .first_row()
        .unwrap();
    s.query_unpaged(
        format!("UPDATE {KEYSPACE}.{TABLE} USING TTL 1 SET version = ?, version_etag = ? WHERE service_id = 'test-service' AND cluster_id = ? AND silo = ''"),
        (version, tag, &cluster),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert!(matches!(
        t.read_all().await,
        Err(MembershipError::CorruptData { .. })
    ));
    // Nobody was running (that is when a version can expire at all); the next start repairs it.
    let starting = table_on(&s, short_ttl(options(&cluster)));
    starting.initialize(true).await.unwrap();
    let after = t.read_all().await.unwrap();
    assert_eq!(after.rows.len(), 1, "the row outlived the version");
    assert!(
        after.version.version > before.version,
        "{} after {}",
        after.version.version,
        before.version
    );
    assert!(version_ttl(&s, &cluster).await.is_some_and(|t| t >= 1));
    assert!(
        t.insert_row(&new_entry(Timestamp::now()), &after.version.next())
            .await
            .unwrap()
    );
}

/// Fills a partition with more row tombstones than Cassandra's `tombstone_failure_threshold`
/// (100,000 by default): a scan of the partition fails, a names read of one row does not.
async fn overwhelm_with_tombstones(s: &Session, table: &str, cluster: &str) {
    crate::buried::bury(s, &format!("{KEYSPACE}.{table}"), "svc", cluster, 100_100).await;
}

/// A renewal does not depend on a scan of the partition: when a scan fails, a live entry still
/// renews and never expires while its silo heartbeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_partition_scan_never_stops_a_renewal() {
    let s = session_with_keyspace().await;
    let table = table_name();
    let cluster = unique("scan-fails");
    let t = table_on(&s, ttl_on(opts(&table, "svc", &cluster)));
    t.initialize(true).await.unwrap();
    let e = new_entry(Timestamp::now());
    super::insert(&t, &e).await;
    // The silo keeps heartbeating while the tombstones are written (that takes longer than the
    // TTL on a slow node).
    let t = Arc::new(t);
    let beating = {
        let (t, address) = (Arc::clone(&t), e.address);
        tokio::spawn(async move {
            loop {
                let _ = t.update_i_am_alive(&address, Timestamp::now()).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    overwhelm_with_tombstones(&s, &table, &cluster).await;
    beating.abort();
    let scan = s
        .query_unpaged(
            format!("SELECT silo, TTL(entry) FROM {KEYSPACE}.{table} WHERE service_id = 'svc' AND cluster_id = ?"),
            (&cluster,),
        )
        .await;
    assert!(scan.is_err(), "the premise: a scan of the partition fails");
    let started = Instant::now();
    let mut samples = 0;
    while started.elapsed() < Duration::from_secs(3 * super::TTL + 1) {
        match t.update_i_am_alive(&e.address, Timestamp::now()).await {
            Ok(HeartbeatOutcome::Refreshed { .. }) => {}
            other => panic!(
                "a live silo's heartbeat after {:?}: {other:?}",
                started.elapsed()
            ),
        }
        assert!(
            !t.read_row(&e.address).await.unwrap().rows.is_empty(),
            "the entry expired after {:?}",
            started.elapsed()
        );
        samples += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(samples > 10);
}

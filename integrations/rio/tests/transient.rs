//! Transient storage errors never reach rio: its peer-to-peer provider stops the server's
//! membership loop on the first storage error it sees. A table that injects timeouts, lost races
//! and unavailability in front of the real node (`CASSANDRA_CONTACT_POINTS`, default
//! 127.0.0.1:9042; keyspace `cm_rio_test`) shows what the adapter absorbs and what it reports.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cassandra_membership::conformance::faults::{Calls, FaultyTable, Injection};
use cassandra_membership::{CassandraClusteringOptions, CassandraMembershipTable};
use cassandra_membership_rio::{CassandraMembershipStorage, RioStorageOptions};
use rio_rs::cluster::storage::{Member, MembershipStorage};

const KEYSPACE: &str = match option_env!("CM_RIO_TEST_KEYSPACE") {
    Some(k) => k,
    None => "cm_rio_test",
};

/// The real table, with faults injected in front of it.
async fn flaky(rio: RioStorageOptions) -> (CassandraMembershipStorage, Arc<FaultyTable>) {
    let points: Vec<String> = std::env::var("CASSANDRA_CONTACT_POINTS")
        .unwrap_or_else(|_| "127.0.0.1:9042".into())
        .split(',')
        .map(|s| s.trim().to_owned())
        .collect();
    let cluster = format!("flaky-{}", uuid::Uuid::new_v4().simple());
    let o = CassandraClusteringOptions::default()
        .keyspace(KEYSPACE)
        .service_id("rio-test")
        .cluster_id(cluster)
        .contact_points(points.clone())
        .table("rio_members")
        .create_keyspace_simple(1)
        .request_timeout(Duration::from_secs(30));
    let inner = CassandraMembershipTable::connect(o)
        .await
        .unwrap_or_else(|e| panic!("cannot use Cassandra at {points:?}: {e}"));
    let table = Arc::new(FaultyTable::new(Arc::new(inner)));
    let storage = CassandraMembershipStorage::with_table(table.clone(), rio)
        .await
        .unwrap();
    (storage, table)
}

fn member(port: u16) -> Member {
    let mut m = Member::new("127.0.0.1".into(), port.to_string());
    m.set_active(true);
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_timeouts_do_not_reach_rio() {
    let (s, t) = flaky(RioStorageOptions::default()).await;
    // The next `n` reads time out (in place of what is left of the previous `n`).
    let timeouts = |n: u32| {
        t.clear_all();
        t.inject(Injection::timeout(Calls::reads(), "injected: read timeout").times(u64::from(n)));
    };
    timeouts(3);
    s.push(member(7001)).await.expect("push");
    timeouts(3);
    assert_eq!(s.members().await.expect("members").len(), 1);
    timeouts(3);
    s.notify_failure("127.0.0.1", "7001")
        .await
        .expect("notify_failure");
    timeouts(3);
    let failures = s
        .member_failures("127.0.0.1", "7001")
        .await
        .expect("member_failures");
    assert_eq!(failures.len(), 1);
    timeouts(3);
    s.set_inactive("127.0.0.1", "7001")
        .await
        .expect("set_inactive");
    timeouts(3);
    s.remove("127.0.0.1", "7001").await.expect("remove");
    assert!(s.members().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn races_lost_beyond_the_write_attempts_do_not_reach_rio() {
    let rio = RioStorageOptions::default();
    let (s, t) = flaky(rio.clone()).await;
    // The next `n` conditional writes lose their race (another writer was first).
    let lose = |n: u32| {
        t.clear_all();
        t.inject(Injection::not_applied(Calls::conditional_writes()).times(u64::from(n)));
    };
    lose(rio.write_attempts + 5);
    s.push(member(7002)).await.expect("push");
    lose(rio.write_attempts + 5);
    s.set_inactive("127.0.0.1", "7002")
        .await
        .expect("set_inactive");
    assert!(!s.members().await.unwrap()[0].active());
    lose(rio.write_attempts + 5);
    s.notify_failure("127.0.0.1", "7002")
        .await
        .expect("notify_failure");
    assert_eq!(
        s.member_failures("127.0.0.1", "7002").await.unwrap().len(),
        1
    );
    lose(rio.write_attempts + 5);
    s.remove("127.0.0.1", "7002").await.expect("remove");
    assert!(s.members().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sustained_unavailability_reaches_rio_after_retry_for() {
    let mut rio = RioStorageOptions::default();
    rio.retry_for = Duration::from_secs(2);
    let (s, t) = flaky(rio).await;
    s.push(member(7003)).await.unwrap();
    // Every read fails as unavailable.
    let down = t.inject(Injection::unavailable(Calls::reads(), "injected: no node"));
    let started = Instant::now();
    let e = s.members().await.expect_err("storage is down");
    let elapsed = started.elapsed();
    assert!(format!("{e:?}").contains("unavailable"), "{e:?}");
    // Retried, but no longer than the budget (plus one read).
    assert!(elapsed >= Duration::from_millis(500), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(4), "{elapsed:?}");
    t.clear(down);
    assert_eq!(s.members().await.unwrap().len(), 1, "works again");
}

/// A write whose answer is lost (`OutcomeUnknown`: it applied) does not reach rio either: the
/// adapter re-reads, finds what it wrote, and is done — `is_transient()` excludes unknown
/// outcomes, and the adapter retries them on purpose, since each step re-reads first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_outcomes_are_settled_by_re_reading_and_do_not_reach_rio() {
    let (s, t) = flaky(RioStorageOptions::default()).await;
    let lost = |n: u64| {
        t.clear_all();
        t.inject(Injection::answer_lost(Calls::conditional_writes()).times(n));
    };
    lost(2);
    s.push(member(7004)).await.expect("push");
    assert_eq!(s.members().await.unwrap().len(), 1);
    lost(2);
    s.set_inactive("127.0.0.1", "7004")
        .await
        .expect("set_inactive");
    assert!(!s.members().await.unwrap()[0].active());
    lost(2);
    s.remove("127.0.0.1", "7004").await.expect("remove");
    assert!(s.members().await.unwrap().is_empty());
}

//! Transient storage errors never reach rio: its peer-to-peer provider stops the server's
//! membership loop on the first storage error it sees. A table that injects timeouts, lost races
//! and unavailability in front of the real node (`CASSANDRA_CONTACT_POINTS`, default
//! 127.0.0.1:9042; keyspace `cm_rio_test`) shows what the adapter absorbs and what it reports.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, ETag, HeartbeatOutcome, MembershipEntry,
    MembershipError, MembershipSnapshot, MembershipTable, Result, SiloAddress, StorageExpiry,
    TableVersion, Timestamp,
};
use cassandra_membership_rio::{CassandraMembershipStorage, RioStorageOptions};
use rio_rs::cluster::storage::{Member, MembershipStorage};

const KEYSPACE: &str = match option_env!("CM_RIO_TEST_KEYSPACE") {
    Some(k) => k,
    None => "cm_rio_test",
};

/// The real table, with faults injected in front of it.
#[derive(Debug)]
struct Flaky {
    inner: CassandraMembershipTable,
    /// The next this many reads time out.
    read_timeouts: AtomicU32,
    /// The next this many conditional writes lose their race (another writer was first).
    lost_races: AtomicU32,
    /// Every read fails as unavailable.
    down: AtomicBool,
}

fn take(n: &AtomicU32) -> bool {
    n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
        .is_ok()
}

impl Flaky {
    fn read_fault(&self, operation: &'static str) -> Result<()> {
        if self.down.load(Ordering::SeqCst) {
            return Err(MembershipError::Unavailable {
                operation,
                source: "injected: no node".into(),
            });
        }
        if take(&self.read_timeouts) {
            return Err(MembershipError::Timeout {
                operation,
                source: "injected: read timeout".into(),
            });
        }
        Ok(())
    }
}

#[async_trait]
impl MembershipTable for Flaky {
    fn cluster_id(&self) -> &str {
        self.inner.cluster_id()
    }
    fn identity(&self) -> String {
        self.inner.identity()
    }
    fn storage_expiry(&self) -> StorageExpiry {
        self.inner.storage_expiry()
    }
    async fn initialize(&self, try_init_version: bool) -> Result<()> {
        self.inner.initialize(try_init_version).await
    }
    async fn read_all(&self) -> Result<MembershipSnapshot> {
        self.read_fault("read_all")?;
        self.inner.read_all().await
    }
    async fn read_row(&self, address: &SiloAddress) -> Result<MembershipSnapshot> {
        self.read_fault("read_row")?;
        self.inner.read_row(address).await
    }
    async fn insert_row(&self, entry: &MembershipEntry, v: &TableVersion) -> Result<bool> {
        if take(&self.lost_races) {
            return Ok(false);
        }
        self.inner.insert_row(entry, v).await
    }
    async fn update_row(&self, e: &MembershipEntry, etag: &ETag, v: &TableVersion) -> Result<bool> {
        if take(&self.lost_races) {
            return Ok(false);
        }
        self.inner.update_row(e, etag, v).await
    }
    async fn update_i_am_alive(&self, a: &SiloAddress, t: Timestamp) -> Result<HeartbeatOutcome> {
        self.inner.update_i_am_alive(a, t).await
    }
    async fn cleanup_defunct(&self, before: Timestamp) -> Result<usize> {
        self.inner.cleanup_defunct(before).await
    }
    async fn delete_cluster(&self, cluster_id: &str) -> Result<()> {
        self.inner.delete_cluster(cluster_id).await
    }
}

async fn flaky(rio: RioStorageOptions) -> (CassandraMembershipStorage, Arc<Flaky>) {
    let points: Vec<String> = std::env::var("CASSANDRA_CONTACT_POINTS")
        .unwrap_or_else(|_| "127.0.0.1:9042".into())
        .split(',')
        .map(|s| s.trim().to_owned())
        .collect();
    let cluster = format!("flaky-{}", uuid::Uuid::new_v4().simple());
    let o = CassandraClusteringOptions::new(KEYSPACE, "rio-test", cluster)
        .contact_points(points.clone())
        .table("rio_members")
        .create_keyspace_simple(1)
        .request_timeout(Duration::from_secs(30));
    let inner = CassandraMembershipTable::connect(o)
        .await
        .unwrap_or_else(|e| panic!("cannot use Cassandra at {points:?}: {e}"));
    let table = Arc::new(Flaky {
        inner,
        read_timeouts: AtomicU32::new(0),
        lost_races: AtomicU32::new(0),
        down: AtomicBool::new(false),
    });
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
    let timeouts = |n| t.read_timeouts.store(n, Ordering::SeqCst);
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
    let lose = |n| t.lost_races.store(n, Ordering::SeqCst);
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
    t.down.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let e = s.members().await.expect_err("storage is down");
    let elapsed = started.elapsed();
    assert!(format!("{e:?}").contains("unavailable"), "{e:?}");
    // Retried, but no longer than the budget (plus one read).
    assert!(elapsed >= Duration::from_millis(500), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(4), "{elapsed:?}");
    t.down.store(false, Ordering::SeqCst);
    assert_eq!(s.members().await.unwrap().len(), 1, "works again");
}

//! The in-memory membership table: the reference semantics of the contract, and the embedded
//! default for silo hosts' own tests and the demo.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tracing::instrument;

use crate::clock::{Clock, SystemClock};
use crate::error::{MembershipError, Result};
use crate::model::{
    ETag, MembershipEntry, MembershipRow, MembershipSnapshot, SiloAddress, SiloStatus,
    TableVersion, Timestamp,
};
use crate::observe::{Applied, TableMetrics};
use crate::options::MembershipOptions;
use crate::table::{HeartbeatOutcome, Lease, MembershipTable, StorageExpiry};

/// A membership table held in process memory.
///
/// Clones share the same store. [`InMemoryMembershipTable::for_cluster`] gives a handle on
/// another cluster of the same store; clusters never see each other's data.
///
/// With [`InMemoryMembershipTable::with_expiry`], entries expire `ttl` after their last write
/// or heartbeat, and a cluster's version `ttl` after the last sign of life of any of its silos,
/// exactly on time: the reference for the Cassandra backend's expiry (which may be late by its
/// documented slack, never early).
///
/// ```
/// use cassandra_membership::{InMemoryMembershipTable, MembershipTable};
/// # tokio_test_block(async {
/// let table = InMemoryMembershipTable::new("cluster-a");
/// table.initialize(true).await?;
/// let snapshot = table.read_all().await?;
/// assert_eq!(snapshot.version.version, 0);
/// assert!(snapshot.rows.is_empty());
/// # Ok::<(), cassandra_membership::MembershipError>(())
/// # });
/// # fn tokio_test_block<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct InMemoryMembershipTable {
    store: Arc<Mutex<Store>>,
    cluster_id: Arc<str>,
    clock: Arc<dyn Clock>,
    ttl: Option<Duration>,
    options: Arc<MembershipOptions>,
    /// The labels of this handle's operations (`crate::observe`): no service, this cluster.
    metrics: TableMetrics,
}

#[derive(Debug, Default)]
struct Store {
    clusters: HashMap<String, Cluster>,
}

#[derive(Debug, Default)]
struct Cluster {
    version: Option<TableVersion>,
    /// When the version was last written (for expiry).
    version_written: Option<Timestamp>,
    rows: BTreeMap<SiloAddress, StoredRow>,
}

#[derive(Debug)]
struct StoredRow {
    entry: MembershipEntry,
    /// The row tag readers see: new with every write, and with every heartbeat that moves the
    /// stored I-am-alive time.
    etag: ETag,
    /// The latest time published by `update_i_am_alive`; kept apart from the entry's own time so
    /// that the stored time only moves forward, exactly as the Cassandra backend stores it.
    heartbeat: Option<Timestamp>,
    /// The clock's time at the last write or heartbeat (for expiry).
    touched: Timestamp,
}

impl StoredRow {
    fn read(&self) -> MembershipRow {
        let mut entry = self.entry.clone();
        if let Some(h) = self.heartbeat {
            entry.i_am_alive_time = entry.i_am_alive_time.max(h);
        }
        MembershipRow {
            entry,
            etag: self.etag.clone(),
        }
    }
}

impl Cluster {
    fn version(&self) -> TableVersion {
        self.version.clone().unwrap_or_else(TableVersion::absent)
    }

    fn version_matches(&self, expected: &ETag) -> bool {
        &self.version().etag == expected
    }

    fn set_version(&mut self, version: u64, now: Timestamp) {
        self.version = Some(TableVersion {
            version,
            etag: ETag::random(),
        });
        self.version_written = Some(now);
    }

    /// Drops what expired by `now`: rows `ttl` after their last touch; the version `ttl` after
    /// the later of its last write and the last touch of any row, once no row is left.
    fn expire(&mut self, ttl: Option<Duration>, now: Timestamp) {
        let Some(ttl) = ttl else { return };
        let last_sign = self
            .rows
            .values()
            .map(|r| r.touched)
            .chain(self.version_written)
            .max();
        self.rows.retain(|_, r| r.touched.saturating_add(ttl) > now);
        if self.rows.is_empty() && last_sign.is_some_and(|t| t.saturating_add(ttl) <= now) {
            self.version = None;
            self.version_written = None;
        }
    }
}

impl InMemoryMembershipTable {
    /// The two cleanups: removes every entry whose status `removes` selects and that shows no
    /// activity since `before`; counts what it removed.
    async fn remove_inactive(
        &self,
        operation: &'static str,
        before: Timestamp,
        removes: impl Fn(SiloStatus) -> bool,
    ) -> Result<usize> {
        let removed = self
            .answer(operation, || {
                Ok(self.with_cluster(|c, _| {
                    let len = c.rows.len();
                    c.rows.retain(|_, row| {
                        let read = row.read();
                        !removes(read.entry.status) || read.entry.last_activity() >= before
                    });
                    len - c.rows.len()
                }))
            })
            .await?;
        self.metrics.removed(removed);
        Ok(removed)
    }

    /// A new, empty store without expiry, on the system clock, with default
    /// [`MembershipOptions`], with a handle on `cluster_id`.
    pub fn new(cluster_id: impl Into<String>) -> Self {
        let cluster_id: Arc<str> = Arc::from(cluster_id.into());
        InMemoryMembershipTable {
            store: Arc::default(),
            metrics: TableMetrics::new("", &cluster_id),
            cluster_id,
            clock: Arc::new(SystemClock),
            ttl: None,
            options: Arc::default(),
        }
    }

    /// Sets the cluster's membership options ([`MembershipTable::membership_options`]): what
    /// [`Silo::join`](crate::Silo::join) runs with on this table. Checked when a silo joins.
    ///
    /// ```
    /// use std::time::Duration;
    /// use cassandra_membership::{InMemoryMembershipTable, MembershipOptions, MembershipTable};
    /// let table = InMemoryMembershipTable::new("c").with_options(
    ///     MembershipOptions::default().i_am_alive_table_publish_timeout(Duration::from_secs(5)),
    /// );
    /// assert_eq!(table.membership_options().i_am_alive_table_publish_timeout, Duration::from_secs(5));
    /// ```
    pub fn with_options(mut self, options: MembershipOptions) -> Self {
        self.options = Arc::new(options);
        self
    }

    /// Turns storage-side expiry on: entries live `ttl` after their last write or heartbeat.
    pub fn with_expiry(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Reads time from `clock` (for expiry and leases).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// A handle on another cluster of the same store (same expiry, clock and options).
    pub fn for_cluster(&self, cluster_id: impl Into<String>) -> Self {
        let cluster_id: Arc<str> = Arc::from(cluster_id.into());
        InMemoryMembershipTable {
            store: Arc::clone(&self.store),
            metrics: TableMetrics::new("", &cluster_id),
            cluster_id,
            clock: Arc::clone(&self.clock),
            ttl: self.ttl,
            options: Arc::clone(&self.options),
        }
    }

    fn lease(&self, now: Timestamp) -> Lease {
        match self.ttl {
            None => Lease::unbounded(now),
            Some(ttl) => Lease {
                granted_at: now,
                expires_at: Some(now.saturating_add(ttl)),
                refresh_by: Some(now.saturating_add(ttl - ttl / 10)),
            },
        }
    }

    /// Answers one operation of the [`MembershipTable`] impl, recording its outcome and latency
    /// under `name` (`crate::observe`), as the Cassandra table's `answer` does.
    async fn answer<T: Applied>(
        &self,
        name: &'static str,
        operation: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        self.metrics.measure(name, async { operation() }).await
    }

    fn lock(&self) -> MutexGuard<'_, Store> {
        // A panic while holding the lock cannot leave a half-applied write: every write below
        // mutates only after all its checks passed. So a poisoned lock is still consistent.
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn with_cluster<T>(&self, f: impl FnOnce(&mut Cluster, Timestamp) -> T) -> T {
        let now = self.clock.now();
        let mut store = self.lock();
        let cluster = store
            .clusters
            .entry(self.cluster_id.to_string())
            .or_default();
        cluster.expire(self.ttl, now);
        f(cluster, now)
    }
}

#[async_trait]
impl MembershipTable for InMemoryMembershipTable {
    fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// `memory:<store>/<cluster>`: handles made by `clone` or `for_cluster` of one store share it.
    fn identity(&self) -> String {
        format!("memory:{:p}/{}", Arc::as_ptr(&self.store), self.cluster_id)
    }

    fn membership_options(&self) -> &MembershipOptions {
        &self.options
    }

    fn storage_expiry(&self) -> StorageExpiry {
        match self.ttl {
            None => StorageExpiry::OFF,
            Some(ttl) => StorageExpiry {
                ttl: Some(ttl),
                slack: Duration::ZERO,
                covers_defunct_cleanup: true,
            },
        }
    }

    #[instrument(level = "debug", skip(self), fields(cluster = %self.cluster_id))]
    async fn initialize(&self, try_init_version: bool) -> Result<()> {
        self.answer("initialize", || {
            self.with_cluster(|c, now| {
                if try_init_version && c.version.is_none() {
                    c.set_version(0, now);
                }
            });
            Ok(())
        })
        .await
    }

    #[instrument(level = "debug", skip(self), fields(cluster = %self.cluster_id))]
    async fn read_all(&self) -> Result<MembershipSnapshot> {
        self.answer("read_all", || {
            Ok(self.with_cluster(|c, _| MembershipSnapshot {
                rows: c.rows.values().map(StoredRow::read).collect(),
                version: c.version(),
            }))
        })
        .await
    }

    #[instrument(level = "debug", skip(self), fields(cluster = %self.cluster_id, silo = %address))]
    async fn read_row(&self, address: &SiloAddress) -> Result<MembershipSnapshot> {
        self.answer("read_row", || {
            Ok(self.with_cluster(|c, _| MembershipSnapshot {
                rows: c
                    .rows
                    .get(address)
                    .map(StoredRow::read)
                    .into_iter()
                    .collect(),
                version: c.version(),
            }))
        })
        .await
    }

    #[instrument(level = "debug", skip(self, entry), fields(cluster = %self.cluster_id, silo = %entry.address, version = new_version.version))]
    async fn insert_row(
        &self,
        entry: &MembershipEntry,
        new_version: &TableVersion,
    ) -> Result<bool> {
        self.answer("insert_row", || {
            Ok(self.with_cluster(|c, now| {
                if c.rows.contains_key(&entry.address) || !c.version_matches(&new_version.etag) {
                    return false;
                }
                let row = StoredRow {
                    entry: entry.clone(),
                    etag: ETag::random(),
                    heartbeat: None,
                    touched: now,
                };
                c.rows.insert(entry.address, row);
                c.set_version(new_version.version, now);
                true
            }))
        })
        .await
    }

    #[instrument(level = "debug", skip(self, entry), fields(cluster = %self.cluster_id, silo = %entry.address, version = new_version.version))]
    async fn update_row(
        &self,
        entry: &MembershipEntry,
        row_etag: &ETag,
        new_version: &TableVersion,
    ) -> Result<bool> {
        self.answer("update_row", || {
            Ok(self.with_cluster(|c, now| {
                let version_ok = c.version_matches(&new_version.etag);
                match c.rows.get_mut(&entry.address) {
                    Some(row) if version_ok && &row.etag == row_etag => {
                        row.entry = entry.clone();
                        row.etag = ETag::random();
                        row.touched = now;
                    }
                    _ => return false,
                }
                c.set_version(new_version.version, now);
                true
            }))
        })
        .await
    }

    #[instrument(level = "debug", skip(self), fields(cluster = %self.cluster_id, silo = %address))]
    async fn update_i_am_alive(
        &self,
        address: &SiloAddress,
        time: Timestamp,
    ) -> Result<HeartbeatOutcome> {
        self.answer("update_i_am_alive", || {
            Ok(self.with_cluster(|c, now| match c.rows.get_mut(address) {
                None => HeartbeatOutcome::NotFound,
                Some(row) => {
                    let moved = row.heartbeat.is_none_or(|h| time > h);
                    if moved {
                        row.heartbeat = Some(time);
                        // A write decided on a read from before this heartbeat (a death vote)
                        // must no longer match, exactly as on the Cassandra backend.
                        row.etag = ETag::random();
                    }
                    row.touched = now;
                    let lease = self.lease(now);
                    if row.entry.status == SiloStatus::Dead {
                        HeartbeatOutcome::DeclaredDead { lease }
                    } else {
                        HeartbeatOutcome::Refreshed { lease }
                    }
                }
            }))
        })
        .await
    }

    #[instrument(level = "debug", skip(self), fields(cluster = %self.cluster_id))]
    async fn cleanup_defunct(&self, before: Timestamp) -> Result<usize> {
        self.remove_inactive("cleanup_defunct", before, |s| s != SiloStatus::Active)
            .await
    }

    #[instrument(level = "debug", skip(self), fields(cluster = %self.cluster_id))]
    async fn cleanup_dead_entries(&self, before: Timestamp) -> Result<usize> {
        self.remove_inactive("cleanup_dead_entries", before, |s| s == SiloStatus::Dead)
            .await
    }

    #[instrument(level = "debug", skip(self), fields(cluster = %self.cluster_id))]
    async fn delete_cluster(&self, cluster_id: &str) -> Result<()> {
        self.answer("delete_cluster", || {
            if cluster_id.is_empty() {
                return Err(MembershipError::config("cluster_id", "must not be empty"));
            }
            self.lock().clusters.remove(cluster_id);
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::model::MembershipEntry;

    #[tokio::test]
    async fn expiry_removes_silent_entries_then_the_whole_cluster() {
        let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
        let t = InMemoryMembershipTable::new("c")
            .with_expiry(Duration::from_secs(10))
            .with_clock(Arc::new(clock.clone()));
        t.initialize(true).await.unwrap();
        let a: SiloAddress = "10.0.0.1:1@1".parse().unwrap();
        let b: SiloAddress = "10.0.0.2:1@1".parse().unwrap();
        for addr in [a, b] {
            let v = t.read_all().await.unwrap().version;
            assert!(
                t.insert_row(
                    &MembershipEntry::new(addr, SiloStatus::Active, clock.now()),
                    &v.next()
                )
                .await
                .unwrap()
            );
        }
        for _ in 0..3 {
            clock.advance(Duration::from_secs(6));
            assert!(matches!(
                t.update_i_am_alive(&b, clock.now()).await.unwrap(),
                HeartbeatOutcome::Refreshed { .. }
            ));
        }
        let s = t.read_all().await.unwrap();
        assert_eq!(s.rows.len(), 1, "a expired, b heartbeats");
        assert_eq!(s.version.version, 2, "the version stays while a silo lives");
        assert_eq!(
            t.update_i_am_alive(&a, clock.now()).await.unwrap(),
            HeartbeatOutcome::NotFound
        );
        clock.advance(Duration::from_secs(10));
        let s = t.read_all().await.unwrap();
        assert!(s.rows.is_empty());
        assert_eq!(
            s.version,
            TableVersion::absent(),
            "the whole cluster is gone"
        );
    }

    #[tokio::test]
    async fn leases_are_bounded_only_with_expiry() {
        let t = InMemoryMembershipTable::new("c").with_expiry(Duration::from_secs(100));
        t.initialize(true).await.unwrap();
        let a: SiloAddress = "10.0.0.1:1@1".parse().unwrap();
        let v = t.read_all().await.unwrap().version;
        t.insert_row(
            &MembershipEntry::new(a, SiloStatus::Joining, Timestamp::now()),
            &v.next(),
        )
        .await
        .unwrap();
        match t.update_i_am_alive(&a, Timestamp::now()).await.unwrap() {
            HeartbeatOutcome::Refreshed { lease } => {
                let (e, r) = (lease.expires_at.unwrap(), lease.refresh_by.unwrap());
                assert_eq!(e.duration_since(lease.granted_at), Duration::from_secs(100));
                assert!(r < e && r > lease.granted_at);
            }
            other => panic!("{other:?}"),
        }
    }
}

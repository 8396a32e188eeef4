//! The in-memory membership table: the reference semantics of the contract, and the embedded
//! default for silo hosts' own tests and the demo.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use tracing::instrument;

use crate::error::{MembershipError, Result};
use crate::model::{
    ETag, MembershipEntry, MembershipRow, MembershipSnapshot, SiloAddress, SiloStatus,
    TableVersion, Timestamp,
};
use crate::table::{HeartbeatOutcome, Lease, MembershipTable};

/// A membership table held in process memory.
///
/// Clones share the same store. [`InMemoryMembershipTable::for_cluster`] gives a handle on
/// another cluster of the same store; clusters never see each other's data.
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
}

#[derive(Debug, Default)]
struct Store {
    clusters: HashMap<String, Cluster>,
}

#[derive(Debug, Default)]
struct Cluster {
    version: Option<TableVersion>,
    rows: BTreeMap<SiloAddress, StoredRow>,
}

#[derive(Debug)]
struct StoredRow {
    entry: MembershipEntry,
    etag: ETag,
    /// The latest time published by `update_i_am_alive`; kept apart from the entry's own time so
    /// that the stored time only moves forward, exactly as the Cassandra backend stores it.
    heartbeat: Option<Timestamp>,
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

    fn set_version(&mut self, version: u64) {
        self.version = Some(TableVersion {
            version,
            etag: ETag::random(),
        });
    }
}

impl InMemoryMembershipTable {
    /// A new, empty store, with a handle on cluster `cluster_id`.
    pub fn new(cluster_id: impl Into<String>) -> Self {
        InMemoryMembershipTable {
            store: Arc::default(),
            cluster_id: Arc::from(cluster_id.into()),
        }
    }

    /// A handle on another cluster of the same store.
    pub fn for_cluster(&self, cluster_id: impl Into<String>) -> Self {
        InMemoryMembershipTable {
            store: Arc::clone(&self.store),
            cluster_id: Arc::from(cluster_id.into()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Store> {
        // A panic while holding the lock cannot leave a half-applied write: every write below
        // mutates only after all its checks passed. So a poisoned lock is still consistent.
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn with_cluster<T>(&self, f: impl FnOnce(&mut Cluster) -> T) -> T {
        let mut store = self.lock();
        let cluster = store
            .clusters
            .entry(self.cluster_id.to_string())
            .or_default();
        f(cluster)
    }
}

#[async_trait]
impl MembershipTable for InMemoryMembershipTable {
    fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    #[instrument(level = "debug", skip(self), fields(cluster = %self.cluster_id))]
    async fn initialize(&self, try_init_version: bool) -> Result<()> {
        self.with_cluster(|c| {
            if try_init_version && c.version.is_none() {
                c.set_version(0);
            }
        });
        Ok(())
    }

    #[instrument(level = "debug", skip(self), fields(cluster = %self.cluster_id))]
    async fn read_all(&self) -> Result<MembershipSnapshot> {
        Ok(self.with_cluster(|c| MembershipSnapshot {
            rows: c.rows.values().map(StoredRow::read).collect(),
            version: c.version(),
        }))
    }

    #[instrument(level = "debug", skip(self), fields(cluster = %self.cluster_id, silo = %address))]
    async fn read_row(&self, address: &SiloAddress) -> Result<MembershipSnapshot> {
        Ok(self.with_cluster(|c| MembershipSnapshot {
            rows: c
                .rows
                .get(address)
                .map(StoredRow::read)
                .into_iter()
                .collect(),
            version: c.version(),
        }))
    }

    #[instrument(level = "debug", skip(self, entry), fields(cluster = %self.cluster_id, silo = %entry.address, version = new_version.version))]
    async fn insert_row(
        &self,
        entry: &MembershipEntry,
        new_version: &TableVersion,
    ) -> Result<bool> {
        Ok(self.with_cluster(|c| {
            if c.rows.contains_key(&entry.address) || !c.version_matches(&new_version.etag) {
                return false;
            }
            c.rows.insert(
                entry.address,
                StoredRow {
                    entry: entry.clone(),
                    etag: ETag::random(),
                    heartbeat: None,
                },
            );
            c.set_version(new_version.version);
            true
        }))
    }

    #[instrument(level = "debug", skip(self, entry), fields(cluster = %self.cluster_id, silo = %entry.address, version = new_version.version))]
    async fn update_row(
        &self,
        entry: &MembershipEntry,
        row_etag: &ETag,
        new_version: &TableVersion,
    ) -> Result<bool> {
        Ok(self.with_cluster(|c| {
            let version_ok = c.version_matches(&new_version.etag);
            match c.rows.get_mut(&entry.address) {
                Some(row) if version_ok && &row.etag == row_etag => {
                    row.entry = entry.clone();
                    row.etag = ETag::random();
                }
                _ => return false,
            }
            c.set_version(new_version.version);
            true
        }))
    }

    #[instrument(level = "debug", skip(self), fields(cluster = %self.cluster_id, silo = %address))]
    async fn update_i_am_alive(
        &self,
        address: &SiloAddress,
        time: Timestamp,
    ) -> Result<HeartbeatOutcome> {
        let now = Timestamp::now();
        Ok(self.with_cluster(|c| match c.rows.get_mut(address) {
            None => HeartbeatOutcome::NotFound,
            Some(row) => {
                row.heartbeat = Some(row.heartbeat.map_or(time, |h| h.max(time)));
                let lease = Lease::unbounded(now);
                if row.entry.status == SiloStatus::Dead {
                    HeartbeatOutcome::DeclaredDead { lease }
                } else {
                    HeartbeatOutcome::Refreshed { lease }
                }
            }
        }))
    }

    #[instrument(level = "debug", skip(self), fields(cluster = %self.cluster_id))]
    async fn cleanup_defunct(&self, before: Timestamp) -> Result<usize> {
        Ok(self.with_cluster(|c| {
            let len = c.rows.len();
            c.rows.retain(|_, row| {
                let read = row.read();
                read.entry.status == SiloStatus::Active || read.entry.last_activity() >= before
            });
            len - c.rows.len()
        }))
    }

    #[instrument(level = "debug", skip(self), fields(cluster = %self.cluster_id))]
    async fn delete_cluster(&self, cluster_id: &str) -> Result<()> {
        if cluster_id.is_empty() {
            return Err(MembershipError::config("cluster_id", "must not be empty"));
        }
        self.lock().clusters.remove(cluster_id);
        Ok(())
    }
}

//! The contract every membership table backend implements.

use std::fmt::Debug;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::Result;
use crate::model::{
    ETag, MembershipEntry, MembershipSnapshot, SiloAddress, TableVersion, Timestamp,
};
use crate::options::MembershipOptions;

/// How long a silo's entry is guaranteed to live and when it should be refreshed — the
/// equivalent of a resolver's registration lifetime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// When the lease was granted (the writer's clock, taken before the write was sent).
    pub granted_at: Timestamp,
    /// Until when storage keeps the entry if nothing refreshes it; `None` without expiry.
    pub expires_at: Option<Timestamp>,
    /// The time by which the next refresh should have succeeded, leaving a margin under
    /// `expires_at` for latency and clock skew; `None` without expiry.
    pub refresh_by: Option<Timestamp>,
}

impl Lease {
    /// A lease that never expires (storage-side expiry off).
    pub fn unbounded(granted_at: Timestamp) -> Self {
        Lease {
            granted_at,
            expires_at: None,
            refresh_by: None,
        }
    }

    /// How long until `refresh_by`, from `now`; `None` when unbounded.
    pub fn headroom(&self, now: Timestamp) -> Option<Duration> {
        self.refresh_by.map(|r| r.duration_since(now))
    }
}

/// What [`MembershipTable::update_i_am_alive`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeartbeatOutcome {
    /// The time was written; the entry exists as far as the table knows.
    Refreshed {
        /// How long the entry now lives.
        lease: Lease,
    },
    /// The time was written, but the entry's status is Dead: other silos declared this silo
    /// dead (or it left). A silo that sees this must stop.
    DeclaredDead {
        /// How long the entry now lives.
        lease: Lease,
    },
    /// There is no entry for this silo (never inserted, cleaned up, deleted or expired).
    /// Nothing was written: a heartbeat never re-creates an entry.
    NotFound,
}

/// What a backend's storage-side expiry does, so the host can switch its own periodic
/// defunct cleanup off when storage already covers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StorageExpiry {
    /// The configured time to live of entries (DefunctSiloExpiration), `None` when expiry is off.
    pub ttl: Option<Duration>,
    /// How much later than `ttl` after its last heartbeat an entry may still be stored
    /// (its lease renewal interval). Entries never expire earlier than `ttl`.
    pub slack: Duration,
    /// True when storage removes defunct entries by itself, so periodic
    /// [`MembershipTable::cleanup_defunct`] calls are redundant (they keep working).
    pub covers_defunct_cleanup: bool,
}

impl StorageExpiry {
    /// No storage-side expiry.
    pub const OFF: StorageExpiry = StorageExpiry {
        ttl: None,
        slack: Duration::ZERO,
        covers_defunct_cleanup: false,
    };
}

/// A cluster's membership table: the Orleans `IMembershipTable` contract.
///
/// A table value is bound to one cluster (its service id and cluster id). All writes that
/// change membership are conditional and atomic with the table version; see each method.
/// Usable as `Arc<dyn MembershipTable>`.
#[async_trait]
pub trait MembershipTable: Send + Sync + Debug {
    /// The cluster this table value reads and writes.
    fn cluster_id(&self) -> &str;

    /// The service this table value's cluster belongs to, when the backend has one (the
    /// Cassandra table's `service_id`); `""` by default. Labels the metrics.
    fn service_id(&self) -> &str {
        ""
    }

    /// What this table value's data is, as a key: two values with the same identity read and
    /// write the same entries (the runtime runs one defunct cleanup per identity and process).
    /// Backends override it with their storage's name (the Cassandra table:
    /// `cassandra:keyspace.table/service/cluster`); the default is this value's address in
    /// memory with the cluster id, unique while the value lives.
    fn identity(&self) -> String {
        format!(
            "{:p}/{}",
            std::ptr::from_ref(self).cast::<()>(),
            self.cluster_id()
        )
    }

    /// The membership options of this table's cluster: the one source of them for
    /// [`Silo::join`](crate::Silo::join) (publish period, votes, cleanup, timeouts) and for the
    /// backend itself (the TTL is `defunct_silo_expiration`). The Cassandra table returns its
    /// `CassandraClusteringOptions::membership`; the in-memory table the options given to
    /// [`InMemoryMembershipTable::with_options`](crate::InMemoryMembershipTable::with_options).
    /// A wrapper forwards its inner table's.
    fn membership_options(&self) -> &MembershipOptions;

    /// What storage-side expiry this table applies.
    fn storage_expiry(&self) -> StorageExpiry {
        StorageExpiry::OFF
    }

    /// Creates what the backend needs and is missing — the Cassandra table and its entry type;
    /// never a keyspace unless the options ask for it (`create_keyspace_with_replication`,
    /// development) — and, with `try_init_version`, the table version 0 when the cluster has
    /// none. Idempotent; many silos may call it at once.
    ///
    /// A missing keyspace is [`KeyspaceMissing`](crate::MembershipError::KeyspaceMissing), a
    /// table of another shape [`SchemaMismatch`](crate::MembershipError::SchemaMismatch) (of the
    /// 0.2 shape: [`TableNeedsMigration`](crate::MembershipError::TableNeedsMigration)): nothing
    /// is written then ([`docs::guarantees`](crate::docs::guarantees), [`docs::schema`](crate::docs::schema)).
    async fn initialize(&self, try_init_version: bool) -> Result<()>;

    /// Every entry of the cluster and the table version, as one consistent view.
    async fn read_all(&self) -> Result<MembershipSnapshot>;

    /// The entry of `address` (if any) and the table version, as one consistent view.
    async fn read_row(&self, address: &SiloAddress) -> Result<MembershipSnapshot>;

    /// Adds `entry` and moves the table to `new_version.version`, atomically.
    ///
    /// Returns `false` if a row for the address exists or `new_version.etag` is not the table's
    /// current version tag: the write did not apply and never will, and no entry or version
    /// number changed (a backend that fenced off its own ambiguous attempt moved only the
    /// version's tag). `Err(OutcomeUnknown)`: it may have applied, or may still — re-read
    /// before deciding ([`docs::guarantees`](crate::docs::guarantees), "Honest outcomes").
    async fn insert_row(&self, entry: &MembershipEntry, new_version: &TableVersion)
    -> Result<bool>;

    /// Replaces the whole entry and moves the table to `new_version.version`, atomically.
    ///
    /// Returns `false` if the row is missing, `row_etag` is not its current tag (the tag names
    /// the row's last heartbeat too: one since the read makes it stale), or `new_version.etag` is
    /// not the table's current version tag: the write did not apply and never will, and no entry
    /// or version number changed (a backend that fenced off its own ambiguous attempt moved only
    /// the version's tag). A missing row is never created. `Err(OutcomeUnknown)`: as for
    /// [`insert_row`](MembershipTable::insert_row).
    async fn update_row(
        &self,
        entry: &MembershipEntry,
        row_etag: &ETag,
        new_version: &TableVersion,
    ) -> Result<bool>;

    /// Publishes the silo's I-am-alive time. Never changes the table version, never alters an
    /// entry's other fields and never re-creates a missing entry.
    ///
    /// A heartbeat that moves the stored time **changes the row etag** a read hands out: an
    /// [`update_row`](MembershipTable::update_row) decided on a read from before it answers
    /// `false`, so a death vote cast on an old I-am-alive time cannot land
    /// ([`docs::guarantees`](crate::docs::guarantees), [`docs::fencing`](crate::docs::fencing)).
    ///
    /// The stored I-am-alive time only moves forward: a read returns the latest time written by
    /// this call or by `insert_row`/`update_row` since the row was inserted. A backend may check
    /// the entry only now and then (the Cassandra table: on a table value's first heartbeat and
    /// once per renewal interval): between checks a heartbeat of an entry that is gone or Dead
    /// answers `Refreshed`, writing a heartbeat that belongs to no entry.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use cassandra_membership::{
    ///     InMemoryMembershipTable, MembershipEntry, MembershipTable, SiloStatus, Timestamp,
    /// };
    /// let table = InMemoryMembershipTable::new("blue");
    /// let entry = MembershipEntry::new(
    ///     "10.0.0.1:11111@1".parse().unwrap(),
    ///     SiloStatus::Active,
    ///     Timestamp::from_millis(1_000),
    /// );
    /// let version = table.read_all().await.unwrap().version;
    /// assert!(table.insert_row(&entry, &version.next()).await.unwrap());
    /// let before = table.read_row(&entry.address).await.unwrap();
    /// let vote_on = &before.rows[0];
    /// // The silo heartbeats after the voter read its row …
    /// table.update_i_am_alive(&entry.address, Timestamp::from_millis(5_000)).await.unwrap();
    /// // … so the vote, decided on the old I-am-alive time, does not land.
    /// let mut dead = vote_on.entry.clone();
    /// dead.status = SiloStatus::Dead;
    /// assert!(!table.update_row(&dead, &vote_on.etag, &before.version.next()).await.unwrap());
    /// # });
    /// ```
    async fn update_i_am_alive(
        &self,
        address: &SiloAddress,
        time: Timestamp,
    ) -> Result<HeartbeatOutcome>;

    /// Deletes every entry that is not Active and whose [`MembershipEntry::last_activity`] is
    /// older than `before`, each only if it did not change or heartbeat since it was read. Does
    /// not change the table version. Returns how many it removed: possibly fewer than it did
    /// (a delete another silo completed at the same time is not counted), never more.
    async fn cleanup_defunct(&self, before: Timestamp) -> Result<usize>;

    /// Deletes every **Dead** entry whose [`MembershipEntry::last_activity`] is older than
    /// `before` — the Dead-entry limit (`max_defunct_silo_entries`). Unlike
    /// [`MembershipTable::cleanup_defunct`] it never removes a Joining, ShuttingDown (or
    /// Created) entry, however old: a burst of recent deaths puts the limit's cutoff a moment
    /// ago, where silos that are starting or stopping right now also are. Does not change the
    /// table version. Returns how many it removed.
    async fn cleanup_dead_entries(&self, before: Timestamp) -> Result<usize>;

    /// Removes all data of cluster `cluster_id` (of this table's service) and nothing of any
    /// other cluster. The cluster can be used again after [`MembershipTable::initialize`].
    async fn delete_cluster(&self, cluster_id: &str) -> Result<()>;
}

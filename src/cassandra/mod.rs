//! The membership table on Apache Cassandra / ScyllaDB.
//!
//! The table and its options are also at the crate root ([`CassandraMembershipTable`],
//! [`CassandraClusteringOptions`], …). Here besides: what the operators' calls return — the
//! TTL audit ([`TtlAudit`], [`RowAudit`], [`PatchAction`]), inspection ([`ClusterInspection`],
//! [`EntryInspection`]), the offline migration ([`MigrationPlan`], [`MigrationReport`], …),
//! statement counts ([`StatementCounts`]) —, the schema a DBA creates ([`SchemaScript`]) and the
//! TTL limits ([`MAX_TTL_SECONDS`], [`EXPIRY_HORIZON_UNIX_SECONDS`]).
//!
//! ## How the code is laid out
//!
//! The [`MembershipTable`] impl delegates to one module per responsibility. Layout (see
//! `cql/create_table.cql`): one partition per (service id, cluster id). The table
//! version lives in the row `''`; every entry is one clustering row holding the entry as one
//! frozen cell and its heartbeat as another. Every membership write is one conditional batch on
//! the partition, so a row and the version commit together or not at all. Heartbeats are plain
//! writes that touch only their heartbeat cell, never a cell a conditional write owns, so the two
//! never race.
//!
//! Files, each owning one thing (an operation's file names the ones it builds on):
//! - operations: `schema.rs` (`initialize`), `read.rs`, `write.rs` (`insert_row` / `update_row`),
//!   `resolve.rs` (ambiguous write outcomes, the fence), `lease.rs` (`update_i_am_alive`),
//!   `cleanup.rs` (`cleanup_defunct`, `delete_cluster`), `version.rs` (the version's TTL and
//!   recovery), `expiry.rs` (TTL audit and patch), `inspect.rs` (operators' reads),
//!   `migrate.rs` and `migrate/` (the offline copy of a 0.2-shape table, `cql/migrate_*.cql`);
//! - the heartbeat cell: `heartbeats.rs`;
//! - sending: `exec.rs` (counts, read retry, plain and conditional sends), `statements.rs`
//!   (preparing `cql/`), `retry.rs` (the driver retry policy), `errors.rs` (driver errors);
//! - data: `bind.rs` (bind values), `decode.rs` (stored rows), `etags.rs` (the tags handed out),
//!   `options.rs`.

mod bind;
mod cleanup;
use cleanup::Defunct;
mod datacenter;
mod ddl;
mod decode;
mod errors;
mod etags;
mod exec;
mod expiry;
mod heartbeats;
mod inspect;
mod lease;
mod migrate;
mod options;
mod read;
mod resolve;
mod retry;
mod routing;
mod schema;
mod schema_lag;
mod statements;
mod tls;
mod tombstones;
mod version;
mod write;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use scylla::SerializeRow;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use tokio::sync::OnceCell;
use tracing::instrument;

pub use ddl::SchemaScript;
pub use exec::StatementCounts;
pub use expiry::{PatchAction, RowAudit, TtlAudit};
pub use inspect::{ClusterInspection, EntryInspection};
pub use migrate::{
    ClusterMigration, DEFAULT_MIGRATION_QUIET_FOR, MigrationPlan, MigrationReport, SkippedCell,
    Verification,
};
pub use options::{
    CassandraClusteringOptions, ConsistencyProfile, Credentials, EXPIRY_HORIZON_UNIX_SECONDS,
    EntryConditions, MAX_TTL_SECONDS, TtlMismatchPolicy,
};
pub use tls::TlsOptions;

use crate::error::{MembershipError, Result};
use crate::model::{
    ETag, MembershipEntry, MembershipSnapshot, SiloAddress, TableVersion, Timestamp,
};
use crate::observe::{Applied, TableMetrics};
use crate::options::MembershipOptions;
use crate::table::{HeartbeatOutcome, MembershipTable, StorageExpiry};
use bind::ttl_value;
use exec::Counters;
use lease::LeaseState;
use statements::{Statements, qualified};

/// How many times a read restarts when the version moves between its pages, and how many times
/// a lease renewal re-reads after losing a race.
const MAX_ATTEMPTS: u32 = 8;

/// One cluster's partition key; also the bind values of statements that take only it.
#[derive(Clone, Copy, Debug, SerializeRow)]
pub(crate) struct Pk<'a> {
    pub(crate) service_id: &'a str,
    pub(crate) cluster_id: &'a str,
}

/// The driver's timeout for each TCP connect. It tries the contact points one after another
/// (in random order): with the whole budget for each, one that drops packets would use it all
/// before a live one is tried. Each gets a share, and one share is left for the live node's
/// handshake and metadata.
fn per_connection_timeout(connect_timeout: Duration, contact_points: usize) -> Duration {
    let shares = u32::try_from(contact_points.saturating_add(1)).unwrap_or(u32::MAX);
    connect_timeout / shares.max(2)
}

/// The table, its statements and the session: shared by the per-cluster values of one table.
#[derive(Debug)]
struct Shared {
    session: Arc<Session>,
    /// The session is a host's own (`with_session`): its credentials are not the options'.
    host_session: bool,
    options: CassandraClusteringOptions,
    qualified: String,
    /// The profile every statement carries when `serial_datacenter` is set (datacenter.rs).
    routing: Option<scylla::client::execution_profile::ExecutionProfileHandle>,
    statements: OnceCell<Statements>,
    counters: Counters,
    /// Per partition: the tombstones a read of it last reported scanning (tombstones.rs).
    tombstones: tombstones::Scanned,
}

/// The membership table on Cassandra / ScyllaDB. See the guide's
/// [guarantees](crate::docs::guarantees), [schema](crate::docs::schema) and
/// [expiry](crate::docs::expiry) pages.
///
/// ```no_run
/// use cassandra_membership::{CassandraClusteringOptions, CassandraMembershipTable, MembershipTable};
/// # async fn f() -> cassandra_membership::Result<()> {
/// let options = CassandraClusteringOptions::default()
///     .keyspace("orleans")
///     .service_id("my-service")
///     .cluster_id("blue")
///     .contact_points(["10.0.0.5:9042"])
///     .ttl(true);
/// let table = CassandraMembershipTable::connect(options).await?;
/// table.initialize(true).await?;
/// let snapshot = table.read_all().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct CassandraMembershipTable {
    shared: Arc<Shared>,
    cluster_id: String,
    leases: Mutex<HashMap<SiloAddress, LeaseState>>,
    /// What `initialize` and lease renewals learnt of this cluster's partition's expiry.
    expiry_state: expiry::ExpiryState,
    /// The labels of this value's operations (`crate::observe`).
    metrics: TableMetrics,
}

impl CassandraMembershipTable {
    /// Validates `options`, connects to `options.contact_points` and returns the table for
    /// `options.cluster_id`. Nothing is created until [`MembershipTable::initialize`].
    ///
    /// With `options.tls` set it connects over TLS, reading the section's PEM files (crate
    /// feature `rustls`; without it, a `tls` section is an
    /// [`MembershipError::InvalidConfiguration`]).
    pub async fn connect(options: CassandraClusteringOptions) -> Result<Self> {
        match &options.tls {
            None => Self::connect_with(options, |builder| builder).await,
            #[cfg(feature = "rustls")]
            Some(tls) => {
                options.validate()?;
                let config = tls::client_config(tls, &options.contact_points)?;
                Self::connect_tls(options, config).await
            }
            #[cfg(not(feature = "rustls"))]
            Some(_) => Err(MembershipError::config(
                "tls",
                "TLS needs the crate feature `rustls` (cassandra-membership = { version = \"…\", \
                 features = [\"rustls\"] })",
            )),
        }
    }

    /// Connects over TLS with the given rustls configuration (`options.tls` is ignored: this
    /// configuration is the one used).
    #[cfg(feature = "rustls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "rustls")))]
    pub async fn connect_tls(
        options: CassandraClusteringOptions,
        tls: Arc<rustls::ClientConfig>,
    ) -> Result<Self> {
        Self::connect_with(options, move |builder| builder.tls_context(Some(tls))).await
    }

    async fn connect_with(
        options: CassandraClusteringOptions,
        customize: impl FnOnce(SessionBuilder) -> SessionBuilder,
    ) -> Result<Self> {
        options.validate()?;
        // One bound for all of it: the password, TCP, handshake, login, metadata.
        let deadline = tokio::time::Instant::now() + options.connect_timeout;
        let per_connection =
            per_connection_timeout(options.connect_timeout, options.contact_points.len());
        let mut builder = SessionBuilder::new()
            .known_nodes(&options.contact_points)
            .connection_timeout(per_connection);
        if let Some(c) = &options.credentials {
            use secrecy::ExposeSecret;
            let password = c.password_until(deadline, options.connect_timeout).await?;
            builder = builder.user(c.username.clone(), password.expose_secret());
        }
        if let Some(filter) = datacenter::host_filter(&options) {
            builder = builder.host_filter(filter);
        }
        // The driver bounds each TCP connect (and tries the contact points one after another,
        // so each gets a share of the budget), but not a node that completes the TCP handshake
        // and then never answers: the whole build is bounded here.
        let built = tokio::time::timeout_at(deadline, customize(builder).build()).await;
        // The driver's error text never holds the password; it names nodes and causes.
        let session = match built {
            Ok(Ok(session)) => session,
            Ok(Err(e)) => {
                let user = options.credentials.as_ref().map(|c| c.username.clone());
                return Err(errors::session_error(e, user));
            }
            Err(elapsed) => {
                return Err(MembershipError::Unavailable {
                    operation: "connect",
                    source: format!(
                        "no session within connect_timeout ({:?}; each TCP connect may take {per_connection:?}): \
                         a contact point accepted the connection and then never answered \
                         (the driver's warnings name each node it tried): {elapsed}",
                        options.connect_timeout
                    )
                    .into(),
                });
            }
        };
        Self::on_session(Arc::new(session), options, false)
    }

    /// Uses a session the host already has. `options.contact_points` and `credentials` are ignored.
    pub fn with_session(
        session: Arc<Session>,
        options: CassandraClusteringOptions,
    ) -> Result<Self> {
        Self::on_session(session, options, true)
    }

    fn on_session(
        session: Arc<Session>,
        options: CassandraClusteringOptions,
        host_session: bool,
    ) -> Result<Self> {
        options.validate()?;
        let cluster_id = options.cluster_id.clone();
        let qualified = qualified(&options.keyspace, &options.table);
        let routing = datacenter::routing_profile(&options);
        let metrics = TableMetrics::new(&options.service_id, &cluster_id);
        Ok(CassandraMembershipTable {
            shared: Arc::new(Shared {
                session,
                host_session,
                options,
                qualified,
                routing,
                statements: OnceCell::new(),
                counters: Counters::default(),
                tombstones: tombstones::Scanned::default(),
            }),
            cluster_id,
            leases: Mutex::default(),
            expiry_state: Default::default(),
            metrics,
        })
    }

    /// The table for another cluster of the same service, sharing session and statements.
    pub fn for_cluster(&self, cluster_id: impl Into<String>) -> Result<Self> {
        let cluster_id = cluster_id.into();
        options::validate_value("cluster_id", &cluster_id)?;
        Ok(CassandraMembershipTable {
            metrics: TableMetrics::new(self.service_id(), &cluster_id),
            shared: Arc::clone(&self.shared),
            cluster_id,
            leases: Mutex::default(),
            expiry_state: Default::default(),
        })
    }

    /// The options this table was built from.
    pub fn options(&self) -> &CassandraClusteringOptions {
        &self.shared.options
    }

    /// The session in use.
    pub fn session(&self) -> &Arc<Session> {
        &self.shared.session
    }

    /// `"keyspace"."table"` as the statements name it.
    pub fn qualified_table(&self) -> &str {
        &self.shared.qualified
    }

    /// The tombstones the latest read of this cluster's partition reported scanning in one
    /// statement, as Cassandra counts them (the number its `tombstone_failure_threshold` is
    /// compared with, per statement): `None` until a read of the partition scanned more than the
    /// node's `tombstone_warn_threshold` (1,000 by default; below it Cassandra reports nothing),
    /// and again once a whole-partition read scanned fewer. Exported as the gauge
    /// `membership_table_tombstones_scanned` (feature `metrics`) and shown by
    /// `cassandra-membership clusters`: the distance to the cliff where reads fail with
    /// [`MembershipError::TooManyTombstones`].
    pub fn tombstones_scanned(&self) -> Option<u64> {
        self.shared.tombstones.get(self.pk())
    }

    /// How many statements of each kind all tables sharing this one's session and options ran.
    pub fn statement_counts(&self) -> StatementCounts {
        self.shared.counters.snapshot()
    }

    fn service_id(&self) -> &str {
        &self.shared.options.service_id
    }

    fn write_ttl(&self) -> i32 {
        ttl_value(self.options().write_ttl_seconds())
    }

    async fn statements(&self) -> Result<&Statements> {
        self.shared
            .statements
            .get_or_try_init(|| async {
                let o = self.options();
                // Every first operation of a table value, `initialize` or not (the CLI's).
                self.check_datacenter_known()?;
                let prepared = Statements::prepare(
                    self.session(),
                    &self.shared.qualified,
                    o.consistency,
                    self.shared.routing.as_ref(),
                    o.request_timeout,
                    o.membership.effective_table_operation_timeout(),
                    o.page_size,
                    o.entry_conditions,
                )
                .await;
                match prepared {
                    Ok(st) => Ok(st),
                    Err(e) => Err(self
                        .keyspace_missing(errors::prepare_error(&self.shared.qualified, e))
                        .await),
                }
            })
            .await
    }

    /// A refused statement is a schema problem: a missing keyspace is told apart from a missing
    /// or different table by asking the schema tables (the node's message is not an interface).
    /// Without `initialize` (the CLI, a host's read-only table value) this is where a missing
    /// keyspace shows.
    async fn keyspace_missing(&self, e: MembershipError) -> MembershipError {
        if !matches!(e, MembershipError::SchemaMismatch { .. }) {
            return e;
        }
        match self.keyspace_exists().await {
            Ok(false) => MembershipError::KeyspaceMissing {
                keyspace: self.options().keyspace.clone(),
            },
            // Present, or unknown: the mismatch as it was found.
            Ok(true) | Err(_) => e,
        }
    }

    /// Which of this table value's schema objects `err` says a node does not know (yet).
    fn unapplied(&self, err: &MembershipError) -> Option<schema_lag::Unapplied> {
        let o = self.options();
        let entry_type = statements::entry_type_name(&o.table);
        schema_lag::unapplied(
            err,
            schema_lag::SchemaNames {
                keyspace: &o.keyspace,
                table: &o.table,
                entry_type: &entry_type,
            },
        )
    }

    /// Names the configured user in an access failure (the driver's errors do not know it).
    fn named(&self, err: MembershipError) -> MembershipError {
        match err {
            MembershipError::AccessDenied {
                operation,
                user: None,
                host_session: false,
                source,
            } => {
                let host_session = self.shared.host_session;
                MembershipError::AccessDenied {
                    operation,
                    // A host's session logs in with its own credentials, not the options'.
                    user: if host_session {
                        None
                    } else {
                        self.options()
                            .credentials
                            .as_ref()
                            .map(|c| c.username.clone())
                    },
                    host_session,
                    source,
                }
            }
            other => other,
        }
    }

    /// Runs one operation of the [`MembershipTable`] impl: its error names the configured user
    /// in an access failure (see [`Self::named`]); its outcome and latency are recorded under
    /// `name` (`crate::observe`).
    async fn answer<T: Applied>(
        &self,
        name: &'static str,
        operation: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        // Measured first: naming the user does not change an error's kind, only its text.
        self.metrics
            .measure(name, operation)
            .await
            .map_err(|e| self.named(e))
    }

    fn pk(&self) -> Pk<'_> {
        self.pk_of(&self.cluster_id)
    }

    fn pk_of<'a>(&'a self, cluster_id: &'a str) -> Pk<'a> {
        Pk {
            service_id: self.service_id(),
            cluster_id,
        }
    }
}

#[async_trait]
impl MembershipTable for CassandraMembershipTable {
    fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    fn service_id(&self) -> &str {
        &self.shared.options.service_id
    }

    /// `cassandra:keyspace.table/service/cluster` (the contact points are not part of it).
    fn identity(&self) -> String {
        format!(
            "cassandra:{}/{}/{}",
            self.shared.qualified,
            self.service_id(),
            self.cluster_id
        )
    }

    /// `options().membership`.
    fn membership_options(&self) -> &MembershipOptions {
        &self.shared.options.membership
    }

    fn storage_expiry(&self) -> StorageExpiry {
        self.expiry()
    }

    #[instrument(level = "info", skip(self), fields(table = %self.shared.qualified, cluster = %self.cluster_id))]
    async fn initialize(&self, try_init_version: bool) -> Result<()> {
        self.answer("initialize", self.initialize_cluster(try_init_version))
            .await
    }

    #[instrument(level = "debug", skip(self), fields(cluster = %self.cluster_id, rows))]
    async fn read_all(&self) -> Result<MembershipSnapshot> {
        self.answer("read_all", self.read_snapshot()).await
    }

    #[instrument(level = "debug", skip(self), fields(cluster = %self.cluster_id, silo = %address))]
    async fn read_row(&self, address: &SiloAddress) -> Result<MembershipSnapshot> {
        self.answer("read_row", self.read_row_snapshot(address))
            .await
    }

    #[instrument(level = "debug", skip(self, entry), fields(cluster = %self.cluster_id, silo = %entry.address, version = new_version.version, applied))]
    async fn insert_row(
        &self,
        entry: &MembershipEntry,
        new_version: &TableVersion,
    ) -> Result<bool> {
        // An insert is the same conditional write as an update, expecting no row etag.
        let absent = ETag::absent();
        let write = self.write_entry("insert_row", entry, Some(&absent), new_version);
        self.answer("insert_row", write).await
    }

    #[instrument(level = "debug", skip(self, entry), fields(cluster = %self.cluster_id, silo = %entry.address, version = new_version.version, applied))]
    async fn update_row(
        &self,
        entry: &MembershipEntry,
        row_etag: &ETag,
        new_version: &TableVersion,
    ) -> Result<bool> {
        let write = async {
            if row_etag.is_absent() {
                return Ok(false); // an update needs the row's tag; only inserts expect none
            }
            self.write_entry("update_row", entry, Some(row_etag), new_version)
                .await
        };
        self.answer("update_row", write).await
    }

    #[instrument(level = "debug", skip(self), fields(cluster = %self.cluster_id, silo = %address, outcome))]
    async fn update_i_am_alive(
        &self,
        address: &SiloAddress,
        time: Timestamp,
    ) -> Result<HeartbeatOutcome> {
        self.answer("update_i_am_alive", self.heartbeat(address, time))
            .await
    }

    #[instrument(level = "info", skip(self), fields(cluster = %self.cluster_id, removed))]
    async fn cleanup_defunct(&self, before: Timestamp) -> Result<usize> {
        let removed = self
            .answer("cleanup_defunct", self.cleanup(before, Defunct::NotActive))
            .await?;
        self.metrics.removed(removed);
        Ok(removed)
    }

    #[instrument(level = "info", skip(self), fields(cluster = %self.cluster_id, removed))]
    async fn cleanup_dead_entries(&self, before: Timestamp) -> Result<usize> {
        let removed = self
            .answer("cleanup_dead_entries", self.cleanup(before, Defunct::Dead))
            .await?;
        self.metrics.removed(removed);
        Ok(removed)
    }

    #[instrument(level = "info", skip(self), fields(service = %self.service_id()))]
    async fn delete_cluster(&self, cluster_id: &str) -> Result<()> {
        self.answer("delete_cluster", self.delete_partition(cluster_id))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_contact_point_and_the_live_nodes_handshake_share_the_connect_timeout() {
        let t = Duration::from_secs(6);
        assert_eq!(per_connection_timeout(t, 1), Duration::from_secs(3));
        assert_eq!(per_connection_timeout(t, 2), Duration::from_secs(2));
        assert_eq!(per_connection_timeout(t, 5), Duration::from_secs(1));
        assert_eq!(per_connection_timeout(t, 0), Duration::from_secs(3));
    }
}

//! The membership table on Apache Cassandra / ScyllaDB.
//!
//! Layout (see `cql/create_table.cql`): one partition per (service id, cluster id). The table
//! version lives in two static cells; every entry is one clustering row; heartbeats are elements
//! of a static map. Every membership write is one conditional batch on the partition, so a row
//! and the version commit together or not at all. Heartbeats are plain writes that touch only
//! their map element, never a cell a conditional write owns, so the two never race.

mod driver_errors;
mod expiry;
mod options;
mod rows;
mod statements;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use scylla::SerializeRow;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::errors::ExecutionError;
use scylla::response::{PagingState, PagingStateResponse};
use scylla::statement::batch::Batch;
use scylla::value::{CqlTimestamp, CqlValue, Row};
use tokio::sync::OnceCell;
use tracing::{Span, debug, info, instrument, warn};
use uuid::Uuid;

pub use expiry::{PatchAction, RowAudit, TtlAudit};
pub use options::{
    CassandraClusteringOptions, ConsistencyProfile, Credentials, EXPIRY_HORIZON_UNIX_SECONDS,
    MAX_TTL_SECONDS, TtlMismatchPolicy,
};

use crate::error::{MembershipError, Result};
use crate::model::{
    ETag, MembershipEntry, MembershipRow, MembershipSnapshot, SiloAddress, SiloStatus,
    TableVersion, Timestamp,
};
use crate::table::{HeartbeatOutcome, Lease, MembershipTable, StorageExpiry};
use driver_errors::{may_have_applied, to_error};
use rows::{
    EntryRow, EntryWithStaticsRow, StaticsRow, StoredEntry, StoredHeartbeat, decode_entry,
    decode_version, merge_heartbeat,
};
use statements::{Statements, create_keyspace_cql, create_table_cql, qualified};

/// How many times a read restarts when the version moves between its pages, and how many times
/// a lease renewal re-reads after losing a race.
const MAX_ATTEMPTS: u32 = 8;
/// Rows per conditional batch in `delete_cluster`.
const DELETE_CHUNK: usize = 100;
/// Entries whose lease state a table value remembers before it starts forgetting.
const MAX_LEASES: usize = 100_000;

/// The schema-check detail for a table whose columns are not (yet) listed.
const NO_COLUMNS: &str = "the table has no columns (yet)";

/// Counts of the statements a table value executed, by kind: what each operation costs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatementCounts {
    /// Plain reads at the commit level (QUORUM / LOCAL_QUORUM): one round trip each.
    pub reads: u64,
    /// Linearizable reads (SERIAL / LOCAL_SERIAL): each runs a Paxos round.
    pub serial_reads: u64,
    /// Plain writes (heartbeats, heartbeat clean-up): one round trip each.
    pub plain_writes: u64,
    /// Conditional writes (LWT, conditional batches): each runs a Paxos round.
    pub conditional_writes: u64,
}

#[derive(Debug, Default)]
struct Counters {
    reads: AtomicU64,
    serial_reads: AtomicU64,
    plain_writes: AtomicU64,
    conditional_writes: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> StatementCounts {
        StatementCounts {
            reads: self.reads.load(Ordering::Relaxed),
            serial_reads: self.serial_reads.load(Ordering::Relaxed),
            plain_writes: self.plain_writes.load(Ordering::Relaxed),
            conditional_writes: self.conditional_writes.load(Ordering::Relaxed),
        }
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// What a table value knows of an entry's lease from its own writes.
#[derive(Clone, Copy, Debug)]
struct LeaseState {
    /// Local time taken before the write that last refreshed (or checked) the entry was sent.
    renewed_at: Timestamp,
    dead: bool,
    /// The entry's start time: heartbeat elements carry it to name their incarnation.
    start_time: Timestamp,
}

impl LeaseState {
    fn after_write(entry: &MembershipEntry, renewed_at: Timestamp) -> Self {
        LeaseState {
            renewed_at,
            dead: entry.status == SiloStatus::Dead,
            start_time: entry.start_time,
        }
    }
}

/// The table, its statements and the session: shared by the per-cluster values of one table.
#[derive(Debug)]
struct Shared {
    session: Arc<Session>,
    options: CassandraClusteringOptions,
    qualified: String,
    statements: OnceCell<Statements>,
    counters: Counters,
}

/// The membership table on Cassandra / ScyllaDB. See the crate README's "Guarantees",
/// "Schema" and "Expiry" sections.
///
/// ```no_run
/// use cassandra_membership::{CassandraClusteringOptions, CassandraMembershipTable, MembershipTable};
/// # async fn f() -> cassandra_membership::Result<()> {
/// let options = CassandraClusteringOptions::new("orleans", "my-service", "blue")
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
}

// --- bind values, one struct per statement file; field names are the bind marker names ---

/// An insert or update in flight: what identifies its effect if its outcome must be resolved.
struct VersionedWrite<'a> {
    operation: &'static str,
    entry: &'a MembershipEntry,
    expected_version: Option<Uuid>,
    new_row_etag: Uuid,
    new_version_etag: Uuid,
}

/// One cluster's partition key; also the bind values of statements that take only it.
#[derive(Clone, Copy, Debug, SerializeRow)]
pub(crate) struct Pk<'a> {
    service_id: &'a str,
    cluster_id: &'a str,
}

#[derive(SerializeRow)]
struct InitVersionValues<'a> {
    ttl: i32,
    new_version_etag: Uuid,
    service_id: &'a str,
    cluster_id: &'a str,
}

#[derive(SerializeRow)]
struct ReadRowValues<'a> {
    heartbeat_key: &'a str,
    service_id: &'a str,
    cluster_id: &'a str,
    silo: &'a str,
}

#[derive(SerializeRow)]
struct EntryValues<'a> {
    service_id: &'a str,
    cluster_id: &'a str,
    silo: &'a str,
    new_etag: Uuid,
    status: i32,
    suspect_times: Vec<(String, CqlTimestamp)>,
    proxy_port: i32,
    host_name: &'a str,
    silo_name: &'a str,
    role_name: &'a str,
    update_zone: i32,
    fault_zone: i32,
    start_time: CqlTimestamp,
    i_am_alive: CqlTimestamp,
    ttl: i32,
}

#[derive(SerializeRow)]
struct UpdateEntryValues<'a> {
    #[scylla(flatten)]
    entry: EntryValues<'a>,
    /// `None` for an insert: the row must have no etag (missing, or an empty marker).
    expected_etag: Option<Uuid>,
}

#[derive(SerializeRow)]
struct WriteVersionValues<'a> {
    ttl: i32,
    version: i64,
    new_version_etag: Uuid,
    service_id: &'a str,
    cluster_id: &'a str,
    expected_version_etag: Option<Uuid>,
}

#[derive(SerializeRow)]
struct SiloKey<'a> {
    silo: &'a str,
    service_id: &'a str,
    cluster_id: &'a str,
}

#[derive(SerializeRow)]
struct HeartbeatValues<'a> {
    ttl: i32,
    write_time_micros: i64,
    silo: &'a str,
    heartbeat: (CqlTimestamp, CqlTimestamp),
    service_id: &'a str,
    cluster_id: &'a str,
}

#[derive(SerializeRow)]
struct DeleteEntryValues<'a> {
    service_id: &'a str,
    cluster_id: &'a str,
    silo: &'a str,
    expected_etag: Uuid,
    heartbeat_key: &'a str,
    expected_heartbeat: Option<StoredHeartbeat>,
}

#[derive(SerializeRow)]
struct DeleteHeartbeatValues<'a> {
    silo: &'a str,
    write_time_micros: i64,
    service_id: &'a str,
    cluster_id: &'a str,
}

#[derive(SerializeRow)]
struct DeleteStaticsValues<'a> {
    service_id: &'a str,
    cluster_id: &'a str,
    expected_version_etag: Option<Uuid>,
}

/// The values of one statement of a `delete_cluster` batch.
enum DeleteClusterValues<'a> {
    Row(SiloKey<'a>),
    Statics(DeleteStaticsValues<'a>),
}

impl scylla::serialize::row::SerializeRow for DeleteClusterValues<'_> {
    fn serialize(
        &self,
        ctx: &scylla::serialize::row::RowSerializationContext<'_>,
        writer: &mut scylla::serialize::writers::RowWriter,
    ) -> std::result::Result<(), scylla::serialize::SerializationError> {
        match self {
            DeleteClusterValues::Row(v) => v.serialize(ctx, writer),
            DeleteClusterValues::Statics(v) => v.serialize(ctx, writer),
        }
    }

    fn is_empty(&self) -> bool {
        false
    }
}

/// A full read of one cluster's partition.
struct PartitionRead {
    version: TableVersion,
    version_etag: Option<Uuid>,
    entries: Vec<StoredEntry>,
    /// Keys of rows with no cells left (only a row marker).
    empty_rows: Vec<String>,
    heartbeats: HashMap<String, StoredHeartbeat>,
}

impl PartitionRead {
    fn snapshot(&self) -> MembershipSnapshot {
        let mut rows: Vec<MembershipRow> = self
            .entries
            .iter()
            .map(|s| MembershipRow {
                entry: merge_heartbeat(
                    s.entry.clone(),
                    self.heartbeats.get(&s.entry.address.to_string()).copied(),
                ),
                etag: ETag::new(s.etag.to_string()),
            })
            .collect();
        rows.sort_by_key(|r| r.entry.address);
        MembershipSnapshot {
            rows,
            version: self.version.clone(),
        }
    }
}

fn ttl_value(seconds: u64) -> i32 {
    // Validated options keep every TTL under MAX_TTL_SECONDS, which fits an i32.
    i32::try_from(seconds).unwrap_or(i32::MAX)
}

fn to_cql(t: Timestamp) -> CqlTimestamp {
    CqlTimestamp(t.as_millis())
}

fn parse_etag(etag: &ETag) -> Option<Option<Uuid>> {
    if etag.is_absent() {
        Some(None)
    } else {
        Uuid::parse_str(etag.as_str()).ok().map(Some)
    }
}

fn applied(result: scylla::response::query_result::QueryResult) -> Result<bool> {
    let rows = result.into_rows_result().map_err(|e| {
        MembershipError::corrupt(
            None,
            format!("conditional write returned no [applied] row: {e}"),
        )
    })?;
    let first: Option<Row> = rows
        .maybe_first_row::<Row>()
        .map_err(|e| MembershipError::corrupt(None, format!("unreadable [applied] row: {e}")))?;
    // Cassandra and ScyllaDB return different extra columns; only the first one, [applied], counts.
    match first.and_then(|r| r.columns.into_iter().next()) {
        Some(Some(CqlValue::Boolean(b))) => Ok(b),
        other => Err(MembershipError::corrupt(
            None,
            format!("unexpected [applied] column: {other:?}"),
        )),
    }
}

impl CassandraMembershipTable {
    /// Validates `options`, connects to `options.contact_points` and returns the table for
    /// `options.cluster_id`. Nothing is created until [`MembershipTable::initialize`].
    pub async fn connect(options: CassandraClusteringOptions) -> Result<Self> {
        Self::connect_with(options, |builder| builder).await
    }

    /// Connects over TLS with the given rustls configuration.
    #[cfg(feature = "rustls")]
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
        let mut builder = SessionBuilder::new()
            .known_nodes(&options.contact_points)
            .connection_timeout(options.request_timeout);
        if let Some(c) = &options.credentials {
            builder = builder.user(c.username.clone(), c.password.clone());
        }
        let session =
            customize(builder)
                .build()
                .await
                .map_err(|e| MembershipError::Unavailable {
                    operation: "connect",
                    // The driver's error text never holds the password; it names nodes and causes.
                    source: Box::new(e),
                })?;
        Self::with_session(Arc::new(session), options)
    }

    /// Uses a session the host already has. `options.contact_points` and `credentials` are ignored.
    pub fn with_session(
        session: Arc<Session>,
        options: CassandraClusteringOptions,
    ) -> Result<Self> {
        options.validate()?;
        let cluster_id = options.cluster_id.clone();
        let qualified = qualified(&options.keyspace, &options.table);
        Ok(CassandraMembershipTable {
            shared: Arc::new(Shared {
                session,
                options,
                qualified,
                statements: OnceCell::new(),
                counters: Counters::default(),
            }),
            cluster_id,
            leases: Mutex::default(),
        })
    }

    /// The table for another cluster of the same service, sharing session and statements.
    pub fn for_cluster(&self, cluster_id: impl Into<String>) -> Result<Self> {
        let cluster_id = cluster_id.into();
        if cluster_id.is_empty() {
            return Err(MembershipError::config("cluster_id", "must not be empty"));
        }
        Ok(CassandraMembershipTable {
            shared: Arc::clone(&self.shared),
            cluster_id,
            leases: Mutex::default(),
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

    /// How many statements of each kind all tables sharing this one's session and options ran.
    pub fn statement_counts(&self) -> StatementCounts {
        self.shared.counters.snapshot()
    }

    fn opts(&self) -> &CassandraClusteringOptions {
        &self.shared.options
    }

    fn session_ref(&self) -> &Session {
        &self.shared.session
    }

    fn service_id(&self) -> &str {
        &self.shared.options.service_id
    }

    fn write_ttl(&self) -> i32 {
        ttl_value(self.opts().write_ttl_seconds())
    }

    async fn statements(&self) -> Result<&Statements> {
        self.shared
            .statements
            .get_or_try_init(|| async {
                let o = self.opts();
                Statements::prepare(
                    self.session_ref(),
                    &self.shared.qualified,
                    o.consistency,
                    o.request_timeout,
                    o.page_size,
                )
                .await
                .map_err(|e| {
                    // Preparing fails when the table is missing or has another shape.
                    MembershipError::SchemaMismatch {
                        table: self.shared.qualified.clone(),
                        detail: format!("the provider's statements do not prepare against it: {e}"),
                    }
                })
            })
            .await
    }

    fn lease_for(&self, renewed_at: Timestamp) -> Lease {
        match self.opts().ttl_seconds() {
            None => Lease::unbounded(renewed_at),
            Some(ttl) => {
                let renewal = self.opts().renewal_seconds();
                Lease {
                    granted_at: renewed_at,
                    expires_at: Some(renewed_at.saturating_add(Duration::from_secs(ttl + renewal))),
                    refresh_by: Some(renewed_at.saturating_add(Duration::from_secs(ttl))),
                }
            }
        }
    }

    fn remember_lease(&self, address: SiloAddress, state: LeaseState) {
        let mut leases = self.leases.lock().unwrap_or_else(|p| p.into_inner());
        if leases.len() >= MAX_LEASES && !leases.contains_key(&address) {
            // Forgetting only costs an extra check on that silo's next heartbeat.
            leases.clear();
        }
        leases.insert(address, state);
    }

    fn forget_lease(&self, address: &SiloAddress) {
        self.leases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(address);
    }

    /// The lease this table value granted `address` with its last write or check, if it knows one.
    pub fn known_lease(&self, address: &SiloAddress) -> Option<Lease> {
        let state = *self
            .leases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(address)?;
        Some(self.lease_for(state.renewed_at))
    }

    async fn exec_read(
        &self,
        op: &'static str,
        statement: &scylla::statement::prepared::PreparedStatement,
        values: impl scylla::serialize::row::SerializeRow,
        serial: bool,
    ) -> Result<scylla::response::query_result::QueryResult> {
        bump(if serial {
            &self.shared.counters.serial_reads
        } else {
            &self.shared.counters.reads
        });
        self.session_ref()
            .execute_unpaged(statement, values)
            .await
            .map_err(|e| to_error(op, e))
    }

    async fn exec_conditional_batch(
        &self,
        batch: &Batch,
        values: impl scylla::serialize::batch::BatchValues,
    ) -> std::result::Result<Result<bool>, ExecutionError> {
        bump(&self.shared.counters.conditional_writes);
        match self.session_ref().batch(batch, values).await {
            Ok(r) => Ok(applied(r)),
            Err(e) => Err(e),
        }
    }

    async fn exec_conditional(
        &self,
        statement: &scylla::statement::prepared::PreparedStatement,
        values: impl scylla::serialize::row::SerializeRow,
    ) -> std::result::Result<Result<bool>, ExecutionError> {
        bump(&self.shared.counters.conditional_writes);
        match self.session_ref().execute_unpaged(statement, values).await {
            Ok(r) => Ok(applied(r)),
            Err(e) => Err(e),
        }
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

    async fn read_statics(&self, pk: Pk<'_>) -> Result<StaticsRow> {
        let st = self.statements().await?;
        let result = self.exec_read("read", &st.read_statics, pk, true).await?;
        let rows = result.into_rows_result().map_err(|e| {
            MembershipError::corrupt(None, format!("read returned no rows result: {e}"))
        })?;
        Ok(rows
            .maybe_first_row::<StaticsRow>()
            .map_err(|e| self.shape_error(e))?
            .unwrap_or(StaticsRow {
                version: None,
                version_etag: None,
                heartbeats: None,
            }))
    }

    fn shape_error(&self, e: impl std::fmt::Display) -> MembershipError {
        MembershipError::SchemaMismatch {
            table: self.shared.qualified.clone(),
            detail: format!("a result does not have the expected columns: {e}"),
        }
    }

    /// Reads the whole partition of `cluster_id`: statics first, then the rows page by page,
    /// all linearizably; restarts if the version moved in between, so the result is one view.
    async fn read_partition(&self, pk: Pk<'_>) -> Result<PartitionRead> {
        let cluster_id = pk.cluster_id;
        let started = Instant::now();
        let st = self.statements().await?;
        for _ in 0..MAX_ATTEMPTS {
            let statics = self.read_statics(pk).await?;
            let version = decode_version(statics.version, statics.version_etag)?;
            let mut entries = Vec::new();
            let mut empty_rows = Vec::new();
            let mut paging = PagingState::start();
            let mut consistent = true;
            loop {
                bump(&self.shared.counters.serial_reads);
                let (result, next) = self
                    .session_ref()
                    .execute_single_page(&st.read_rows, pk, paging)
                    .await
                    .map_err(|e| to_error("read", e))?;
                let rows = result.into_rows_result().map_err(|e| {
                    MembershipError::corrupt(None, format!("read returned no rows result: {e}"))
                })?;
                for row in rows.rows::<EntryRow>().map_err(|e| self.shape_error(e))? {
                    let row = row.map_err(|e| self.shape_error(e))?;
                    if row.version_etag != statics.version_etag {
                        consistent = false;
                        break;
                    }
                    if row.silo.is_none() {
                        continue; // the partition's static row: no entry
                    }
                    if row.is_empty() {
                        empty_rows.extend(row.silo);
                        continue;
                    }
                    match decode_entry(row) {
                        Ok(e) => entries.push(e),
                        Err((silo, reason)) => {
                            // One damaged row must not hide the whole cluster's membership.
                            warn!(table = %self.shared.qualified, cluster = cluster_id, silo = ?silo, %reason,
                                "skipping a damaged membership row");
                        }
                    }
                }
                if !consistent {
                    break;
                }
                match next {
                    PagingStateResponse::HasMorePages { state } => paging = state,
                    PagingStateResponse::NoMorePages => break,
                }
            }
            if consistent {
                return Ok(PartitionRead {
                    version,
                    version_etag: statics.version_etag,
                    entries,
                    empty_rows,
                    heartbeats: statics.heartbeats.unwrap_or_default(),
                });
            }
            debug!(
                cluster = cluster_id,
                "the version moved during a paged read; reading again"
            );
        }
        Err(MembershipError::Contention {
            operation: "read",
            attempts: MAX_ATTEMPTS,
            elapsed: started.elapsed(),
        })
    }

    /// One entry with the partition's version and its heartbeat element, in one query.
    /// `Ok(None)` when the row does not exist. Damage in this row is an error: the caller asked for it.
    async fn read_one(
        &self,
        address: &SiloAddress,
        serial: bool,
    ) -> Result<Option<(StoredEntry, TableVersion, Option<StoredHeartbeat>)>> {
        let st = self.statements().await?;
        let key = address.to_string();
        let statement = if serial {
            &st.read_row
        } else {
            &st.read_row_quorum
        };
        let result = self
            .exec_read(
                "read_row",
                statement,
                ReadRowValues {
                    heartbeat_key: &key,
                    service_id: self.service_id(),
                    cluster_id: &self.cluster_id,
                    silo: &key,
                },
                serial,
            )
            .await?;
        let rows = result.into_rows_result().map_err(|e| {
            MembershipError::corrupt(Some(&key), format!("read returned no rows result: {e}"))
        })?;
        let Some(row) = rows
            .maybe_first_row::<EntryWithStaticsRow>()
            .map_err(|e| self.shape_error(e))?
        else {
            return Ok(None);
        };
        let version_etag = row.version_etag;
        let (row, version, heartbeat) = row.split();
        if row.is_empty() {
            return Ok(None); // only a row marker is left: no entry (an insert may take the key)
        }
        let version = decode_version(version, version_etag)?;
        let stored = decode_entry(row)
            .map_err(|(_, reason)| MembershipError::corrupt(Some(&key), reason))?;
        Ok(Some((stored, version, heartbeat)))
    }

    fn entry_values_in<'a>(
        &'a self,
        pk: Pk<'a>,
        entry: &'a MembershipEntry,
        silo: &'a str,
        new_etag: Uuid,
        ttl: i32,
    ) -> EntryValues<'a> {
        EntryValues {
            service_id: pk.service_id,
            cluster_id: pk.cluster_id,
            silo,
            new_etag,
            status: entry.status.code(),
            suspect_times: entry
                .suspect_times
                .iter()
                .map(|s| (s.suspecting_silo.to_string(), to_cql(s.time)))
                .collect(),
            proxy_port: i32::from(entry.proxy_port),
            host_name: &entry.host_name,
            silo_name: &entry.silo_name,
            role_name: &entry.role_name,
            update_zone: entry.update_zone,
            fault_zone: entry.fault_zone,
            start_time: to_cql(entry.start_time),
            i_am_alive: to_cql(entry.i_am_alive_time),
            ttl,
        }
    }

    fn entry_values<'a>(
        &'a self,
        entry: &'a MembershipEntry,
        silo: &'a str,
        new_etag: Uuid,
    ) -> EntryValues<'a> {
        self.entry_values_in(self.pk(), entry, silo, new_etag, self.write_ttl())
    }

    fn version_values_in<'a>(
        &self,
        pk: Pk<'a>,
        version: i64,
        new_etag: Uuid,
        expected: Option<Uuid>,
        ttl: i32,
    ) -> WriteVersionValues<'a> {
        WriteVersionValues {
            ttl,
            version,
            new_version_etag: new_etag,
            service_id: pk.service_id,
            cluster_id: pk.cluster_id,
            expected_version_etag: expected,
        }
    }

    fn version_values(
        &self,
        version: i64,
        new_etag: Uuid,
        expected: Option<Uuid>,
    ) -> WriteVersionValues<'_> {
        self.version_values_in(self.pk(), version, new_etag, expected, self.write_ttl())
    }

    /// `insert_row` / `update_row`: writes the whole entry and the next version in one
    /// conditional batch, expecting `row_etag` (absent for an insert) and the caller's version tag.
    async fn write_entry(
        &self,
        operation: &'static str,
        entry: &MembershipEntry,
        row_etag: Option<&ETag>,
        new_version: &TableVersion,
    ) -> Result<bool> {
        let version = i64::try_from(new_version.version).map_err(|_| {
            MembershipError::config("new_version.version", "does not fit a CQL bigint")
        })?;
        let (Some(expected), Some(expected_row)) =
            (parse_etag(&new_version.etag), row_etag.and_then(parse_etag))
        else {
            return Ok(false); // tags this table never issued cannot match
        };
        let st = self.statements().await?;
        let key = entry.address.to_string();
        let (new_row_etag, new_version_etag) = (Uuid::new_v4(), Uuid::new_v4());
        let values = (
            UpdateEntryValues {
                entry: self.entry_values(entry, &key, new_row_etag),
                expected_etag: expected_row,
            },
            self.version_values(version, new_version_etag, expected),
        );
        let write = VersionedWrite {
            operation,
            entry,
            expected_version: expected,
            new_row_etag,
            new_version_etag,
        };
        self.versioned_write(&st.update_batch, values, write).await
    }

    /// Runs an insert or update batch; an ambiguous failure is resolved by [`Self::resolve`].
    async fn versioned_write(
        &self,
        batch: &Batch,
        values: impl scylla::serialize::batch::BatchValues,
        w: VersionedWrite<'_>,
    ) -> Result<bool> {
        let sent_at = Timestamp::now();
        let applied = match self.exec_conditional_batch(batch, values).await {
            Ok(r) => r?,
            Err(e) if may_have_applied(&e) => self.resolve(&w, e).await?,
            Err(e) => return Err(to_error(w.operation, e)),
        };
        if applied {
            self.remember_lease(w.entry.address, LeaseState::after_write(w.entry, sent_at));
        }
        Span::current().record("applied", applied);
        Ok(applied)
    }

    /// Decides an ambiguous conditional write by a linearizable re-read: a serial read completes
    /// or supersedes any in-flight Paxos proposal, so what it shows is final.
    async fn resolve(&self, w: &VersionedWrite<'_>, err: ExecutionError) -> Result<bool> {
        let (operation, address) = (w.operation, &w.entry.address);
        let (expected_version, new_row_etag, new_version_etag) =
            (w.expected_version, w.new_row_etag, w.new_version_etag);
        warn!(operation, silo = %address, error = %err, "conditional write outcome unknown; re-reading serially");
        let unknown = |detail: String, err: ExecutionError| MembershipError::OutcomeUnknown {
            operation,
            detail,
            source: Box::new(err),
        };
        let found = match self.read_one(address, true).await {
            Ok(Some((row, version, _))) => Some((row.etag, version)),
            Ok(None) => None,
            Err(read_err) => {
                return Err(unknown(format!("the re-read failed too: {read_err}"), err));
            }
        };
        let current_version_etag = match &found {
            Some((_, v)) => parse_etag(&v.etag).flatten(),
            None => match self.read_statics(self.pk()).await {
                Ok(s) => s.version_etag,
                Err(read_err) => {
                    return Err(unknown(format!("the re-read failed too: {read_err}"), err));
                }
            },
        };
        let row_is_ours = found
            .as_ref()
            .is_some_and(|(etag, _)| *etag == new_row_etag);
        if row_is_ours || current_version_etag == Some(new_version_etag) {
            info!(operation, silo = %address, "ambiguous conditional write had applied");
            return Ok(true);
        }
        if current_version_etag == expected_version {
            // Version tags are never reused, so the version never moved: the write did not apply.
            info!(operation, silo = %address, "ambiguous conditional write had not applied");
            return Ok(false);
        }
        Err(unknown(
            "the table changed since; whether this write applied cannot be told".into(),
            err,
        ))
    }

    /// Renews the TTL of an entry and of the version by rewriting them unchanged, conditionally
    /// on both being unchanged. Returns the entry as read, or `None` if it is gone.
    async fn renew(&self, address: &SiloAddress) -> Result<Option<MembershipEntry>> {
        let st = self.statements().await?;
        let key = address.to_string();
        for _ in 0..MAX_ATTEMPTS {
            // A plain read is enough: the conditional write below re-checks both tags.
            let Some((stored, version, _)) = self.read_one(address, false).await? else {
                return Ok(None);
            };
            if self.opts().ttl_seconds().is_none() {
                return Ok(Some(stored.entry));
            }
            let version_etag = parse_etag(&version.etag).flatten();
            let Some(version_etag_value) = version_etag else {
                return Err(MembershipError::corrupt(
                    None,
                    "an entry exists but the table version does not; re-initialize the cluster",
                ));
            };
            let values = (
                UpdateEntryValues {
                    entry: self.entry_values(&stored.entry, &key, stored.etag),
                    expected_etag: Some(stored.etag),
                },
                self.version_values(version.version as i64, version_etag_value, version_etag),
            );
            match self.exec_conditional_batch(&st.update_batch, values).await {
                Ok(r) => {
                    if r? {
                        return Ok(Some(stored.entry));
                    }
                    // Lost a race with a membership change: read again.
                }
                Err(e) if may_have_applied(&e) => {
                    // Rewriting unchanged values is harmless either way; report the failure so
                    // the caller retries the heartbeat.
                    return Err(MembershipError::Timeout {
                        operation: "update_i_am_alive",
                        source: Box::new(e),
                    });
                }
                Err(e) => return Err(to_error("update_i_am_alive", e)),
            }
        }
        Err(MembershipError::Contention {
            operation: "update_i_am_alive",
            attempts: MAX_ATTEMPTS,
            elapsed: Duration::ZERO,
        })
    }

    /// Removes a heartbeat element unless a heartbeat newer than `stamp_micros` was written.
    async fn delete_heartbeat(
        &self,
        pk: Pk<'_>,
        key: &str,
        stamp_micros: i64,
        operation: &'static str,
    ) -> Result<()> {
        let st = self.statements().await?;
        bump(&self.shared.counters.plain_writes);
        self.session_ref()
            .execute_unpaged(
                &st.delete_heartbeat_before,
                DeleteHeartbeatValues {
                    silo: key,
                    write_time_micros: stamp_micros,
                    service_id: pk.service_id,
                    cluster_id: pk.cluster_id,
                },
            )
            .await
            .map_err(|e| to_error(operation, e))?;
        Ok(())
    }

    async fn ensure_schema(&self) -> Result<()> {
        let o = self.opts();
        let session = self.session_ref();
        if let Some(replication) = &o.create_keyspace_with_replication {
            session
                .query_unpaged(create_keyspace_cql(&o.keyspace, replication), ())
                .await
                .map_err(|e| to_error("initialize", e))?;
            self.await_schema_agreement().await?;
        }
        if !self.keyspace_exists().await? {
            return Err(MembershipError::SchemaMismatch {
                table: self.shared.qualified.clone(),
                detail: format!(
                    "keyspace {:?} does not exist: create it with the replication your cluster needs \
                     (the provider does not choose one), or for development set create_keyspace_with_replication",
                    o.keyspace
                ),
            });
        }
        if self.table_settings().await?.is_none() {
            let ddl = create_table_cql(
                &self.shared.qualified,
                statements::table_id(&o.keyspace, &o.table),
                o.ttl_seconds().unwrap_or(0),
                o.gc_grace.as_secs(),
            );
            session
                .query_unpaged(ddl, ())
                .await
                .map_err(|e| to_error("initialize", e))?;
        }
        // Also when another silo just created the table: until every node has its schema, a
        // quorum read of it can fail (INCOMPATIBLE_SCHEMA) on the nodes that do not.
        self.await_schema_agreement().await?;
        // A table another silo has just created may be listed before its columns are.
        for _ in 0..40 {
            match self.check_columns().await {
                Err(MembershipError::SchemaMismatch { detail, .. }) if detail == NO_COLUMNS => {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                other => return other,
            }
        }
        self.check_columns().await
    }

    async fn await_schema_agreement(&self) -> Result<()> {
        self.session_ref()
            .await_schema_agreement()
            .await
            .map(|_| ())
            .map_err(|e| MembershipError::Unavailable {
                operation: "initialize",
                source: Box::new(e),
            })
    }

    async fn keyspace_exists(&self) -> Result<bool> {
        let result = self
            .session_ref()
            .query_unpaged(
                "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = ?",
                (&self.opts().keyspace,),
            )
            .await
            .map_err(|e| to_error("initialize", e))?;
        let rows = result
            .into_rows_result()
            .map_err(|e| MembershipError::corrupt(None, format!("system_schema read: {e}")))?;
        Ok(rows.rows_num() > 0)
    }

    /// `default_time_to_live` and `gc_grace_seconds` of the table, if it exists.
    async fn table_settings(&self) -> Result<Option<(i32, i32)>> {
        let o = self.opts();
        let result = self
            .session_ref()
            .query_unpaged(
                "SELECT default_time_to_live, gc_grace_seconds FROM system_schema.tables \
                 WHERE keyspace_name = ? AND table_name = ?",
                (&o.keyspace, &o.table),
            )
            .await
            .map_err(|e| to_error("initialize", e))?;
        let rows = result
            .into_rows_result()
            .map_err(|e| MembershipError::corrupt(None, format!("system_schema read: {e}")))?;
        rows.maybe_first_row::<(Option<i32>, Option<i32>)>()
            .map(|r| r.map(|(ttl, gc)| (ttl.unwrap_or(0), gc.unwrap_or(0))))
            .map_err(|e| MembershipError::corrupt(None, format!("system_schema read: {e}")))
    }

    async fn check_columns(&self) -> Result<()> {
        let o = self.opts();
        let result = self
            .session_ref()
            .query_unpaged(
                "SELECT column_name, type, kind FROM system_schema.columns WHERE keyspace_name = ? AND table_name = ?",
                (&o.keyspace, &o.table),
            )
            .await
            .map_err(|e| to_error("initialize", e))?;
        let rows = result
            .into_rows_result()
            .map_err(|e| MembershipError::corrupt(None, format!("system_schema read: {e}")))?;
        let mut actual = HashMap::new();
        for row in rows
            .rows::<(String, String, String)>()
            .map_err(|e| MembershipError::corrupt(None, format!("system_schema read: {e}")))?
        {
            let (name, ty, kind) = row
                .map_err(|e| MembershipError::corrupt(None, format!("system_schema read: {e}")))?;
            actual.insert(name, (ty, kind));
        }
        let expected: &[(&str, &str, &str)] = &[
            ("service_id", "text", "partition_key"),
            ("cluster_id", "text", "partition_key"),
            ("silo", "text", "clustering"),
            ("version", "bigint", "static"),
            ("version_etag", "uuid", "static"),
            (
                "heartbeats",
                "map<text, frozen<tuple<timestamp, timestamp>>>",
                "static",
            ),
            ("etag", "uuid", "regular"),
            ("status", "int", "regular"),
            (
                "suspect_times",
                "frozen<list<frozen<tuple<text, timestamp>>>>",
                "regular",
            ),
            ("proxy_port", "int", "regular"),
            ("host_name", "text", "regular"),
            ("silo_name", "text", "regular"),
            ("role_name", "text", "regular"),
            ("update_zone", "int", "regular"),
            ("fault_zone", "int", "regular"),
            ("start_time", "timestamp", "regular"),
            ("i_am_alive", "timestamp", "regular"),
        ];
        if actual.is_empty() {
            return Err(MembershipError::SchemaMismatch {
                table: self.shared.qualified.clone(),
                detail: NO_COLUMNS.into(),
            });
        }
        let mut problems = Vec::new();
        for (name, ty, kind) in expected {
            match actual.get(*name) {
                None => problems.push(format!("column {name} is missing")),
                Some((t, k)) if t.replace(' ', "") != ty.replace(' ', "") || k != kind => {
                    problems.push(format!("column {name} is {k} {t}, expected {kind} {ty}"))
                }
                Some(_) => {}
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(MembershipError::SchemaMismatch {
                table: self.shared.qualified.clone(),
                detail: problems.join("; "),
            })
        }
    }
}

#[async_trait]
impl MembershipTable for CassandraMembershipTable {
    fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    fn storage_expiry(&self) -> StorageExpiry {
        match self.opts().ttl_seconds() {
            None => StorageExpiry::OFF,
            Some(ttl) => StorageExpiry {
                ttl: Some(Duration::from_secs(ttl)),
                slack: Duration::from_secs(self.opts().renewal_seconds() + 1),
                covers_defunct_cleanup: true,
            },
        }
    }

    #[instrument(level = "info", skip(self), fields(table = %self.shared.qualified, cluster = %self.cluster_id))]
    async fn initialize(&self, try_init_version: bool) -> Result<()> {
        self.ensure_schema().await?;
        // Another silo may have just created the table: its schema can be listed a moment before
        // the node serves it, so preparing is retried for a short while.
        let mut attempt = 0;
        let st = loop {
            match self.statements().await {
                Ok(st) => break st,
                Err(MembershipError::SchemaMismatch { .. }) if attempt < 40 => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => return Err(e),
            }
        };
        self.reconcile_ttl().await?;
        if !try_init_version {
            return Ok(());
        }
        let values = InitVersionValues {
            ttl: self.write_ttl(),
            new_version_etag: Uuid::new_v4(),
            service_id: self.service_id(),
            cluster_id: &self.cluster_id,
        };
        match self.exec_conditional(&st.init_version, values).await {
            Ok(r) => {
                let created = r?;
                debug!(created, "table version initialized");
                Ok(())
            }
            Err(e) if may_have_applied(&e) => {
                // Either this write or another silo's created the version, or none did: look.
                let statics = self.read_statics(self.pk()).await?;
                if statics.version_etag.is_some() {
                    Ok(())
                } else {
                    Err(MembershipError::OutcomeUnknown {
                        operation: "initialize",
                        detail: "the version is still missing after an ambiguous write".into(),
                        source: Box::new(e),
                    })
                }
            }
            Err(e) => Err(to_error("initialize", e)),
        }
    }

    #[instrument(level = "debug", skip(self), fields(cluster = %self.cluster_id, rows))]
    async fn read_all(&self) -> Result<MembershipSnapshot> {
        let snapshot = self.read_partition(self.pk()).await?.snapshot();
        Span::current().record("rows", snapshot.rows.len());
        Ok(snapshot)
    }

    #[instrument(level = "debug", skip(self), fields(cluster = %self.cluster_id, silo = %address))]
    async fn read_row(&self, address: &SiloAddress) -> Result<MembershipSnapshot> {
        let found =
            |(stored, version, heartbeat): (StoredEntry, TableVersion, Option<StoredHeartbeat>)| {
                MembershipSnapshot {
                    rows: vec![MembershipRow {
                        entry: merge_heartbeat(stored.entry, heartbeat),
                        etag: ETag::new(stored.etag.to_string()),
                    }],
                    version,
                }
            };
        if let Some(hit) = self.read_one(address, true).await? {
            return Ok(found(hit));
        }
        // A missing row carries no statics: read the version, then make sure the row is still
        // missing (rows only appear through versioned inserts, so both reads describe one view).
        let statics = self.read_statics(self.pk()).await?;
        if let Some(hit) = self.read_one(address, true).await? {
            return Ok(found(hit));
        }
        Ok(MembershipSnapshot {
            rows: Vec::new(),
            version: decode_version(statics.version, statics.version_etag)?,
        })
    }

    #[instrument(level = "debug", skip(self, entry), fields(cluster = %self.cluster_id, silo = %entry.address, version = new_version.version, applied))]
    async fn insert_row(
        &self,
        entry: &MembershipEntry,
        new_version: &TableVersion,
    ) -> Result<bool> {
        // An insert is the same conditional write as an update, expecting no row etag.
        self.write_entry("insert_row", entry, Some(&ETag::absent()), new_version)
            .await
    }

    #[instrument(level = "debug", skip(self, entry), fields(cluster = %self.cluster_id, silo = %entry.address, version = new_version.version, applied))]
    async fn update_row(
        &self,
        entry: &MembershipEntry,
        row_etag: &ETag,
        new_version: &TableVersion,
    ) -> Result<bool> {
        if row_etag.is_absent() {
            return Ok(false); // an update needs the row's tag; only inserts expect none
        }
        self.write_entry("update_row", entry, Some(row_etag), new_version)
            .await
    }

    #[instrument(level = "debug", skip(self), fields(cluster = %self.cluster_id, silo = %address, outcome))]
    async fn update_i_am_alive(
        &self,
        address: &SiloAddress,
        time: Timestamp,
    ) -> Result<HeartbeatOutcome> {
        let st = self.statements().await?;
        let now = Timestamp::now();
        let known = self
            .leases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(address)
            .copied();
        let renewal = Duration::from_secs(self.opts().renewal_seconds());
        let state = match known {
            Some(s) if now < s.renewed_at.saturating_add(renewal) => s,
            _ => {
                // Unknown entry, or its lease is due: check it exists (and renew its TTL).
                match self.renew(address).await? {
                    None => {
                        self.forget_lease(address);
                        Span::current().record("outcome", "not_found");
                        return Ok(HeartbeatOutcome::NotFound);
                    }
                    Some(entry) => {
                        let s = LeaseState::after_write(&entry, now);
                        self.remember_lease(*address, s);
                        s
                    }
                }
            }
        };
        let key = address.to_string();
        bump(&self.shared.counters.plain_writes);
        self.session_ref()
            .execute_unpaged(
                &st.heartbeat,
                HeartbeatValues {
                    ttl: self.write_ttl(),
                    write_time_micros: time.as_millis().saturating_mul(1000),
                    silo: &key,
                    heartbeat: (to_cql(state.start_time), to_cql(time)),
                    service_id: self.service_id(),
                    cluster_id: &self.cluster_id,
                },
            )
            .await
            .map_err(|e| to_error("update_i_am_alive", e))?;
        let lease = self.lease_for(state.renewed_at);
        Ok(if state.dead {
            Span::current().record("outcome", "declared_dead");
            HeartbeatOutcome::DeclaredDead { lease }
        } else {
            Span::current().record("outcome", "refreshed");
            HeartbeatOutcome::Refreshed { lease }
        })
    }

    #[instrument(level = "info", skip(self), fields(cluster = %self.cluster_id, removed))]
    async fn cleanup_defunct(&self, before: Timestamp) -> Result<usize> {
        let st = self.statements().await?;
        let read = self.read_partition(self.pk()).await?;
        let mut removed = 0usize;
        let mut removed_keys = HashSet::new();
        for stored in &read.entries {
            let key = stored.entry.address.to_string();
            let heartbeat = read.heartbeats.get(&key).copied();
            let entry = merge_heartbeat(stored.entry.clone(), heartbeat);
            if entry.status == SiloStatus::Active || entry.last_activity() >= before {
                continue;
            }
            let values = DeleteEntryValues {
                service_id: self.service_id(),
                cluster_id: &self.cluster_id,
                silo: &key,
                expected_etag: stored.etag,
                heartbeat_key: &key,
                expected_heartbeat: heartbeat,
            };
            let deleted = match self.exec_conditional(&st.delete_entry, values).await {
                Ok(r) => r?,
                Err(e) if may_have_applied(&e) => match self.read_one(&entry.address, true).await {
                    Ok(None) => true,
                    Ok(Some(_)) => false,
                    Err(_) => {
                        return Err(MembershipError::OutcomeUnknown {
                            operation: "cleanup_defunct",
                            detail: format!(
                                "deleting {key}; {removed} entries were removed before"
                            ),
                            source: Box::new(e),
                        });
                    }
                },
                Err(e) => return Err(to_error("cleanup_defunct", e)),
            };
            if deleted {
                removed += 1;
                removed_keys.insert(key);
                self.forget_lease(&entry.address);
            }
        }
        for key in &read.empty_rows {
            // Not entries: not counted. A lost race (the row got cells) leaves it alone.
            match self
                .exec_conditional(
                    &st.delete_empty_row,
                    SiloKey {
                        silo: key,
                        service_id: self.service_id(),
                        cluster_id: &self.cluster_id,
                    },
                )
                .await
            {
                Ok(r) => {
                    r?;
                }
                Err(e) if may_have_applied(&e) => {} // the next cleanup sees it again if it is still there
                Err(e) => return Err(to_error("cleanup_defunct", e)),
            }
        }
        // Heartbeat elements whose row is gone (removed above, or earlier), older than the cutoff.
        // Each delete is stamped with the element's own time, so a newer heartbeat survives it.
        // An element of another incarnation (start time differs from the row's) counts as orphaned.
        let live: HashMap<String, i64> = read
            .entries
            .iter()
            .map(|e| (e.entry.address.to_string(), e.entry.start_time.as_millis()))
            .filter(|(k, _)| !removed_keys.contains(k))
            .collect();
        for (key, (start, time)) in &read.heartbeats {
            let Some(time) = time else { continue };
            let owned = start.is_some_and(|s| live.get(key) == Some(&s.0));
            if time.0 < before.as_millis() && !owned {
                self.delete_heartbeat(
                    self.pk(),
                    key,
                    time.0.saturating_mul(1000),
                    "cleanup_defunct",
                )
                .await?;
            }
        }
        Span::current().record("removed", removed);
        Ok(removed)
    }

    #[instrument(level = "info", skip(self), fields(service = %self.service_id()))]
    async fn delete_cluster(&self, cluster_id: &str) -> Result<()> {
        if cluster_id.is_empty() {
            return Err(MembershipError::config("cluster_id", "must not be empty"));
        }
        let st = self.statements().await?;
        let started = Instant::now();
        for _ in 0..MAX_ATTEMPTS {
            let read = self.read_partition(self.pk_of(cluster_id)).await?;
            let mut expected = read.version_etag;
            let keys: Vec<String> = read
                .entries
                .iter()
                .map(|e| e.entry.address.to_string())
                .collect();
            let mut chunks: Vec<&[String]> = keys.chunks(DELETE_CHUNK).collect();
            if chunks.is_empty() {
                chunks.push(&[]);
            }
            let mut conflicted = false;
            for chunk in chunks {
                // Each chunk deletes its rows and the statics, fenced on the version read: a
                // concurrent membership change makes the batch fail and the loop read again.
                let statements =
                    std::iter::repeat_n(&st.delete_row, chunk.len()).chain([&st.delete_statics]);
                let batch = st.batch_of(statements, self.opts().request_timeout);
                let mut values: Vec<DeleteClusterValues<'_>> = chunk
                    .iter()
                    .map(|key| {
                        DeleteClusterValues::Row(SiloKey {
                            silo: key,
                            service_id: self.service_id(),
                            cluster_id,
                        })
                    })
                    .collect();
                values.push(DeleteClusterValues::Statics(DeleteStaticsValues {
                    service_id: self.service_id(),
                    cluster_id,
                    expected_version_etag: expected,
                }));
                let ok = match self.exec_conditional_batch(&batch, values).await {
                    Ok(r) => r?,
                    Err(e) if may_have_applied(&e) => false, // read again and continue from what is left
                    Err(e) => return Err(to_error("delete_cluster", e)),
                };
                if !ok {
                    conflicted = true;
                    break;
                }
                expected = None; // the statics are gone after the first chunk
            }
            if conflicted {
                continue;
            }
            // Heartbeat elements stamped later than the deleting ballot survive it (their stamp
            // is their I-am-alive time): remove those with a delete stamped just after each.
            let soon = Timestamp::now().as_millis().saturating_sub(1000);
            for (key, time) in read
                .heartbeats
                .iter()
                .filter_map(|(k, (_, t))| t.map(|t| (k, t)))
                .filter(|(_, t)| t.0 >= soon)
            {
                self.delete_heartbeat(
                    self.pk_of(cluster_id),
                    key,
                    time.0.saturating_mul(1000).saturating_add(1),
                    "delete_cluster",
                )
                .await?;
            }
            if cluster_id == self.cluster_id {
                self.leases
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clear();
            }
            return Ok(());
        }
        Err(MembershipError::Contention {
            operation: "delete_cluster",
            attempts: MAX_ATTEMPTS,
            elapsed: started.elapsed(),
        })
    }
}

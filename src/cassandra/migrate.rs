//! The offline copy of a table of the 0.2 shape (per-field columns, the version and a heartbeat
//! map in static columns) into a table of the current shape: `migrate_to`, which
//! `cassandra-membership migrate` runs. See the guide's migration page (`docs::migration`).
//!
//! Every cell is copied with a plain write stamped with the old cell's own write time and carrying
//! its remaining TTL, so a run can be repeated or resumed at any point: it writes the same cells at
//! the same timestamps, and whatever was written to the new table later wins over them. The old
//! table is only read.
//!
//! What to write is decided by pure functions of the partition as read and the time
//! ([`plan_cluster`]); the IO around them reads, writes in single-partition batches, and verifies
//! through the provider's own read.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use scylla::client::session::Session;
use scylla::response::{PagingState, PagingStateResponse};
use scylla::serialize::row::{RowSerializationContext, SerializeRow};
use scylla::serialize::writers::RowWriter;
use scylla::statement::Consistency;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use tracing::{Span, info, instrument, warn};
use uuid::Uuid;

use super::bind::EntryValues;
use super::errors::{prepare_error, prepare_refused_statement, to_error};
use super::heartbeats::StoredHeartbeat;
use super::options::{ConsistencyProfile, validate_identifier};
use super::retry::{ProviderRetryPolicy, StatementKind};
use super::statements::{PrepareFailure, bind_table, qualified};
use super::{CassandraMembershipTable, Pk};
use crate::cassandra::exec::Scan;
use crate::error::{MembershipError, Result};
use crate::model::{TableVersion, Timestamp};
use crate::table::MembershipTable;

mod plan;
use plan::{
    ClusterCopy, CopyWrite, Dated, OldHeartbeatValuesRow, OldHeartbeatsRow, OldPartition, OldRow,
    difference, plan_cluster,
};

const LIST_CLUSTERS: &str = include_str!("../../cql/list_clusters.cql");
const READ_OLD: &str = include_str!("../../cql/migrate_read_old.cql");
const OLD_HEARTBEATS: &str = include_str!("../../cql/migrate_old_heartbeats.cql");
const OLD_HEARTBEAT_VALUES: &str = include_str!("../../cql/migrate_old_heartbeat_values.cql");
const WRITE_ENTRY: &str = include_str!("../../cql/migrate_write_entry.cql");
const WRITE_HEARTBEAT: &str = include_str!("../../cql/migrate_write_heartbeat.cql");
const WRITE_VERSION: &str = include_str!("../../cql/migrate_write_version.cql");

/// How long a cluster must have been quiet (no heartbeat, no membership write) before it is
/// copied: twice the default I-am-alive publish period (30 s). Migration is offline.
pub const DEFAULT_MIGRATION_QUIET_FOR: Duration = Duration::from_secs(60);

/// Statements per copy batch: one partition's batch is one mutation, and ~60 entries stay well
/// under Cassandra's `batch_size_fail_threshold` (50 KiB by default).
const BATCH_STATEMENTS: usize = 60;

/// What [`CassandraMembershipTable::migrate_to`] copies, and how carefully.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct MigrationPlan {
    /// The table to copy into, in the same keyspace; created with the source table's options
    /// (TTL, `gc_grace`) when missing. Must differ from the source.
    pub to_table: String,
    /// A cluster any of whose entries heartbeated or was written within this window is refused
    /// (its silos still run). Default [`DEFAULT_MIGRATION_QUIET_FOR`].
    pub quiet_for: Duration,
    /// Copy clusters that are not quiet too.
    pub force: bool,
    /// Read, check and report what would be copied; write (and create) nothing.
    pub dry_run: bool,
    /// Only the clusters of this service.
    pub service_id: Option<String>,
    /// Only the clusters with this id.
    pub cluster_id: Option<String>,
}

impl MigrationPlan {
    /// Every cluster of the source into `to_table`, refusing clusters active within
    /// [`DEFAULT_MIGRATION_QUIET_FOR`].
    pub fn new(to_table: impl Into<String>) -> Self {
        MigrationPlan {
            to_table: to_table.into(),
            quiet_for: DEFAULT_MIGRATION_QUIET_FOR,
            force: false,
            dry_run: false,
            service_id: None,
            cluster_id: None,
        }
    }

    /// Sets [`Self::quiet_for`].
    pub fn quiet_for(mut self, window: Duration) -> Self {
        self.quiet_for = window;
        self
    }

    /// Sets [`Self::force`].
    pub fn force(mut self, force: bool) -> Self {
        self.force = force;
        self
    }

    /// Sets [`Self::dry_run`].
    pub fn dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }

    /// Restricts the copy to the clusters of one service ([`Self::service_id`]) and / or with one
    /// cluster id ([`Self::cluster_id`]).
    pub fn only(mut self, service_id: Option<String>, cluster_id: Option<String>) -> Self {
        self.service_id = service_id;
        self.cluster_id = cluster_id;
        self
    }
}

/// What a migration did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MigrationReport {
    /// The source, `"keyspace"."table"` (read only, never changed).
    pub source: String,
    /// The target, `"keyspace"."table"`.
    pub target: String,
    /// Nothing was written: a dry run.
    pub dry_run: bool,
    /// Nothing was written: a cluster was active within the quiet window and `force` was not
    /// set (see each cluster's [`ClusterMigration::recent_activity`]).
    pub refused: bool,
    /// Each cluster, in the order the source listed them (token order).
    pub clusters: Vec<ClusterMigration>,
}

impl MigrationReport {
    /// True when every cluster was copied and read back equal.
    pub fn all_verified(&self) -> bool {
        self.clusters.iter().all(|c| {
            matches!(
                c.verification,
                Verification::Verified | Verification::TargetMovedOn
            )
        })
    }
}

/// One cluster of a migration.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClusterMigration {
    /// The service id.
    pub service_id: String,
    /// The cluster id.
    pub cluster_id: String,
    /// Entries written (or, in a dry run, to write).
    pub entries_copied: usize,
    /// Heartbeat cells written (or to write).
    pub heartbeats_copied: usize,
    /// The table version copied, if the cluster had one.
    pub version: Option<u64>,
    /// Entries the target already held as copied, before this run: a resumed or repeated run.
    pub already_present: usize,
    /// Rows and cells not copied, and why (damaged, expired during the migration, a heartbeat
    /// without its entry).
    pub skipped: Vec<SkippedCell>,
    /// The newest sign of life in the cluster (an I-am-alive time or a write time), with the
    /// silo it came from (`None`: the version's write).
    pub last_activity: Option<(Timestamp, Option<String>)>,
    /// The cluster was active within the quiet window: with `force`, it was copied anyway.
    pub recent_activity: bool,
    /// Heartbeat cells were dated by their own I-am-alive time (a server that cannot report a
    /// map element's write time, Cassandra before 5.0).
    pub heartbeats_dated_by_value: bool,
    /// The read-back of the copy.
    pub verification: Verification,
}

impl ClusterMigration {
    /// The target already held part of this cluster (a repeated or resumed run).
    pub fn resumed(&self) -> bool {
        self.already_present > 0
    }
}

/// A row or cell a migration did not copy.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SkippedCell {
    /// The row's key (`None`: the version).
    pub silo: Option<String>,
    /// Why.
    pub reason: String,
}

/// How the copy of a cluster read back from the target table.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verification {
    /// Not read back (a dry run, a refused migration).
    NotRun,
    /// The provider's read of the target returned exactly the entries and version copied.
    Verified,
    /// It did not: what differs (or why the read failed).
    Mismatch(String),
    /// Not copied again: the target's version moved on since an earlier copy (silos wrote
    /// there), and a copy could bring back what they removed.
    TargetMovedOn,
}

/// The values of one statement of a copy batch.
enum CopyValues<'a> {
    Entry(EntryCopyValues<'a>),
    Heartbeat(HeartbeatCopyValues<'a>),
    Version(VersionCopyValues<'a>),
}

/// `migrate_write_entry.cql`.
#[derive(scylla::SerializeRow)]
struct EntryCopyValues<'a> {
    #[scylla(flatten)]
    entry: EntryValues<'a>,
    write_time_micros: i64,
}

/// `migrate_write_heartbeat.cql`.
#[derive(scylla::SerializeRow)]
struct HeartbeatCopyValues<'a> {
    ttl: i32,
    write_time_micros: i64,
    heartbeat: StoredHeartbeat,
    service_id: &'a str,
    cluster_id: &'a str,
    silo: &'a str,
}

/// `migrate_write_version.cql`.
#[derive(scylla::SerializeRow)]
struct VersionCopyValues<'a> {
    ttl: i32,
    write_time_micros: i64,
    version: i64,
    version_etag: Uuid,
    service_id: &'a str,
    cluster_id: &'a str,
}

impl SerializeRow for CopyValues<'_> {
    fn serialize(
        &self,
        ctx: &RowSerializationContext<'_>,
        writer: &mut RowWriter,
    ) -> std::result::Result<(), scylla::serialize::SerializationError> {
        match self {
            CopyValues::Entry(v) => v.serialize(ctx, writer),
            CopyValues::Heartbeat(v) => v.serialize(ctx, writer),
            CopyValues::Version(v) => v.serialize(ctx, writer),
        }
    }

    fn is_empty(&self) -> bool {
        false
    }
}

/// The migration's reads of the source.
struct SourceStatements {
    list_clusters: PreparedStatement,
    read_old: PreparedStatement,
    /// With write times (`true`), or the values-only fallback (`false`).
    old_heartbeats: (PreparedStatement, bool),
}

/// The migration's writes of the target.
struct TargetStatements {
    write_entry: PreparedStatement,
    write_heartbeat: PreparedStatement,
    write_version: PreparedStatement,
}

fn commit_level(profile: ConsistencyProfile) -> Consistency {
    match profile {
        ConsistencyProfile::Quorum => Consistency::Quorum,
        ConsistencyProfile::LocalQuorum => Consistency::LocalQuorum,
    }
}

impl CassandraMembershipTable {
    /// Copies this table, of the 0.2 shape, into `plan.to_table` (the current shape, created
    /// with these options but for its name), cluster by cluster, and reads every copied cluster
    /// back through the provider to verify it. Offline: the clusters' silos must be stopped (a
    /// cluster active within `plan.quiet_for` refuses the whole run, writing nothing, unless
    /// `plan.force`). Idempotent and resumable: see the guide's migration page. This table is
    /// never written.
    ///
    /// Errors: [`MembershipError::SchemaMismatch`] when this table is not of the 0.2 shape (or
    /// missing), [`MembershipError::TableNeedsMigration`] when the target is, an
    /// [`MembershipError::InvalidConfiguration`] for a bad target name; storage errors as every
    /// operation. A failure part-way leaves a partial copy that a new run completes.
    #[instrument(level = "info", skip(self, plan), fields(source = %self.shared.qualified, target = %plan.to_table, dry_run = plan.dry_run, clusters))]
    pub async fn migrate_to(&self, plan: &MigrationPlan) -> Result<MigrationReport> {
        let o = self.options();
        validate_identifier("to_table", &plan.to_table)?;
        if plan.to_table == o.table {
            return Err(MembershipError::config(
                "to_table",
                "the target must be another table than the source (the shapes cannot be mixed)",
            ));
        }
        self.check_old_shape().await?;
        let target_name = qualified(&o.keyspace, &plan.to_table);
        let source = self.prepare_source().await?;
        let mut clusters = self.list_old_clusters(&source).await?;
        clusters.retain(|(s, c)| {
            plan.service_id.as_ref().is_none_or(|x| x == s)
                && plan.cluster_id.as_ref().is_none_or(|x| x == c)
        });
        Span::current().record("clusters", clusters.len());
        // Every cluster is read and checked before anything is written: a refusal changes nothing.
        let started = Instant::now();
        let mut reads = Vec::new();
        for (service_id, cluster_id) in clusters {
            let pk = Pk {
                service_id: &service_id,
                cluster_id: &cluster_id,
            };
            let old = self.read_old_partition(&source, pk).await?;
            reads.push((service_id, cluster_id, old, Instant::now()));
        }
        info!(
            clusters = reads.len(),
            rows = reads.iter().map(|r| r.2.rows.len()).sum::<usize>(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "source read"
        );
        let now = Timestamp::now();
        let mut report = MigrationReport {
            source: self.shared.qualified.clone(),
            target: target_name.clone(),
            dry_run: plan.dry_run,
            refused: false,
            clusters: Vec::new(),
        };
        let mut copies = Vec::new();
        for (service_id, cluster_id, old, read_at) in reads {
            let copy = plan_cluster(&old, read_at.elapsed());
            let recent = copy
                .last_activity
                .as_ref()
                .is_some_and(|(t, _)| now.duration_since(*t) < plan.quiet_for);
            // A cell stamped in the future (a coordinator's clock was ahead when it was written)
            // would outvote the new table's Paxos ballots, which start from the wall clock: every
            // conditional write on it would answer applied and lose. Never copied, even forced.
            let now_micros = now.as_millis().saturating_mul(1000);
            let future = copy.latest_write_micros().is_some_and(|w| w > now_micros);
            if future {
                warn!(service = %service_id, cluster = %cluster_id,
                    "a cell of this cluster is stamped in the future: it cannot be copied (not even with force) until the clock passes it");
            }
            report.refused |= future || (recent && !plan.force);
            report.clusters.push(ClusterMigration {
                service_id,
                cluster_id,
                entries_copied: copy.count(|w| matches!(w, CopyWrite::Entry { .. })),
                heartbeats_copied: copy.count(|w| matches!(w, CopyWrite::Heartbeat { .. })),
                version: (copy.expected.version != TableVersion::absent())
                    .then_some(copy.expected.version.version),
                already_present: 0,
                skipped: copy.skipped.clone(),
                last_activity: copy.last_activity.clone(),
                recent_activity: recent || future,
                heartbeats_dated_by_value: old.heartbeats_dated_by_value,
                verification: Verification::NotRun,
            });
            copies.push((old, read_at));
        }
        if report.refused || plan.dry_run {
            if report.refused {
                warn!("a cluster was active within the quiet window: nothing copied");
            }
            return Ok(report);
        }
        let mut target_options = o.clone().table(plan.to_table.clone());
        // An operator's tool never creates a keyspace.
        target_options.create_keyspace_with_replication = None;
        let target = Self::on_session(
            self.session().clone(),
            target_options,
            self.shared.host_session,
        )?;
        // Creates the table (with the options' TTL and gc_grace) and checks its shape.
        target.initialize(false).await?;
        info!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            "target table ready"
        );
        let writes = self.prepare_target(&target_name).await?;
        let mut targets: BTreeMap<String, CassandraMembershipTable> = BTreeMap::new();
        for (cluster, (old, read_at)) in report.clusters.iter_mut().zip(copies) {
            let service = match targets.get(&cluster.service_id) {
                Some(t) => t,
                None => {
                    let options = target
                        .options()
                        .clone()
                        .service_id(cluster.service_id.clone());
                    let t = Self::on_session(
                        self.session().clone(),
                        options,
                        self.shared.host_session,
                    )?;
                    targets.entry(cluster.service_id.clone()).or_insert(t)
                }
            };
            let table = service.for_cluster(cluster.cluster_id.clone())?;
            // Planned again now: the TTLs copied are what is left of them at this moment, not at
            // the check above (the target's creation and earlier clusters took time).
            let copy = plan_cluster(&old, read_at.elapsed());
            cluster.entries_copied = copy.count(|w| matches!(w, CopyWrite::Entry { .. }));
            cluster.heartbeats_copied = copy.count(|w| matches!(w, CopyWrite::Heartbeat { .. }));
            cluster.skipped = copy.skipped.clone();
            self.copy_cluster(&writes, &table, cluster, &copy).await?;
        }
        Ok(report)
    }

    /// Writes one cluster's copy and reads it back.
    #[instrument(level = "info", skip_all, fields(service = %cluster.service_id, cluster = %cluster.cluster_id, entries = cluster.entries_copied, resumed))]
    async fn copy_cluster(
        &self,
        st: &TargetStatements,
        target: &CassandraMembershipTable,
        cluster: &mut ClusterMigration,
        copy: &ClusterCopy,
    ) -> Result<()> {
        // What an earlier run already copied (a read that fails, e.g. on a copy stopped after
        // the entries, counts nothing).
        if let Ok(before) = target.read_all().await {
            cluster.already_present = copy
                .expected
                .rows
                .iter()
                .filter(|r| before.get(&r.entry.address) == Some(r))
                .count();
        }
        // A target whose version moved on was written by silos since (an earlier run finished):
        // copying again could bring back what they removed once its tombstones are purged.
        if let Ok(before) = target.read_all().await
            && before.version != TableVersion::absent()
            && before.version.etag != copy.expected.version.etag
        {
            warn!(service = %cluster.service_id, cluster = %cluster.cluster_id,
                "the target's version moved on since an earlier copy: not copied again");
            cluster.verification = Verification::TargetMovedOn;
            return Ok(());
        }
        Span::current().record("resumed", cluster.resumed());
        let started = Instant::now();
        let pk = Pk {
            service_id: &cluster.service_id,
            cluster_id: &cluster.cluster_id,
        };
        // The version first: a copy stopped part-way never holds entries without a version.
        for chunk in copy.writes.chunks(BATCH_STATEMENTS) {
            let mut batch = Batch::new(BatchType::Unlogged);
            let mut values = Vec::with_capacity(chunk.len());
            for w in chunk {
                let (statement, v) = match w {
                    CopyWrite::Version {
                        version,
                        version_etag,
                        written,
                        ttl,
                    } => (
                        &st.write_version,
                        CopyValues::Version(VersionCopyValues {
                            ttl: *ttl,
                            write_time_micros: *written,
                            version: *version,
                            version_etag: *version_etag,
                            service_id: pk.service_id,
                            cluster_id: pk.cluster_id,
                        }),
                    ),
                    CopyWrite::Entry {
                        silo,
                        entry,
                        etag,
                        written,
                        ttl,
                    } => (
                        &st.write_entry,
                        CopyValues::Entry(EntryCopyValues {
                            entry: EntryValues::new(pk, entry, silo, *etag, *ttl),
                            write_time_micros: *written,
                        }),
                    ),
                    CopyWrite::Heartbeat {
                        silo,
                        value,
                        written,
                        ttl,
                    } => (
                        &st.write_heartbeat,
                        CopyValues::Heartbeat(HeartbeatCopyValues {
                            ttl: *ttl,
                            write_time_micros: *written,
                            heartbeat: *value,
                            service_id: pk.service_id,
                            cluster_id: pk.cluster_id,
                            silo,
                        }),
                    ),
                };
                batch.append_statement(statement.clone());
                values.push(v);
            }
            self.prepare_batch(&mut batch);
            self.session()
                .batch(&batch, values)
                .await
                .map_err(|e| to_error("migrate", e))?;
        }
        let written = started.elapsed();
        // The batches after the version's took `written`: their cells' TTLs count from later,
        // so the version, written first, is written again to outlive them by as much (same
        // value, same timestamp: the later expiry wins).
        if let Some(CopyWrite::Version {
            version,
            version_etag,
            written: stamp,
            ttl,
        }) = copy
            .writes
            .iter()
            .find(|w| matches!(w, CopyWrite::Version { .. }))
            && *ttl > 0
            && copy.writes.len() > BATCH_STATEMENTS
        {
            let extra = i32::try_from(written.as_secs() + 2).unwrap_or(i32::MAX);
            let mut batch = Batch::new(BatchType::Unlogged);
            batch.append_statement(st.write_version.clone());
            self.prepare_batch(&mut batch);
            let values = vec![CopyValues::Version(VersionCopyValues {
                ttl: ttl.saturating_add(extra),
                write_time_micros: *stamp,
                version: *version,
                version_etag: *version_etag,
                service_id: pk.service_id,
                cluster_id: pk.cluster_id,
            })];
            self.session()
                .batch(&batch, values)
                .await
                .map_err(|e| to_error("migrate", e))?;
        }
        cluster.verification = match target.read_all().await {
            Ok(actual) => match difference(&copy.expected, &actual) {
                None => Verification::Verified,
                Some(d) => Verification::Mismatch(d),
            },
            Err(e) => Verification::Mismatch(format!("the copy does not read back: {e}")),
        };
        info!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            written_ms = written.as_millis() as u64,
            heartbeats = cluster.heartbeats_copied,
            verification = ?cluster.verification,
            "cluster copied"
        );
        Ok(())
    }

    fn prepare_batch(&self, batch: &mut Batch) {
        let o = self.options();
        batch.set_consistency(commit_level(o.consistency));
        batch.set_request_timeout(Some(o.request_timeout));
        batch.set_execution_profile_handle(self.shared.routing.clone());
        // Every statement is stamped with its own timestamp: repeating the batch is harmless.
        batch.set_is_idempotent(true);
        batch.set_retry_policy(Some(std::sync::Arc::new(ProviderRetryPolicy(
            StatementKind::Idempotent,
        ))));
    }

    /// The source must have the 0.2 shape: anything else is not this migration's to read.
    async fn check_old_shape(&self) -> Result<()> {
        let o = self.options();
        let rows = self
            .query_bounded(
                "SELECT column_name, kind FROM system_schema.columns \
                 WHERE keyspace_name = ? AND table_name = ?",
                (&o.keyspace, &o.table),
            )
            .await
            .map_err(|e| to_error("migrate", e))?
            .into_rows_result()
            .map_err(|e| MembershipError::corrupt(None, format!("system_schema read: {e}")))?;
        let mut kinds = BTreeMap::new();
        for row in rows
            .rows::<(Option<String>, Option<String>)>()
            .map_err(|e| MembershipError::corrupt(None, format!("system_schema read: {e}")))?
        {
            if let Ok((Some(name), Some(kind))) = row {
                kinds.insert(name, kind);
            }
        }
        let mismatch = |detail: String| MembershipError::SchemaMismatch {
            table: self.shared.qualified.clone(),
            detail,
        };
        if kinds.is_empty() {
            if !self.keyspace_exists().await? {
                return Err(MembershipError::KeyspaceMissing {
                    keyspace: o.keyspace.clone(),
                });
            }
            return Err(mismatch("the table to migrate does not exist".into()));
        }
        if kinds.contains_key("entry") {
            return Err(mismatch(
                "the table already has the current shape: there is nothing to migrate".into(),
            ));
        }
        let statics = ["version", "version_etag", "heartbeats"];
        let regular = [
            "etag",
            "status",
            "suspect_times",
            "proxy_port",
            "host_name",
            "silo_name",
            "role_name",
            "update_zone",
            "fault_zone",
            "start_time",
            "i_am_alive",
        ];
        let problems: Vec<String> = statics
            .iter()
            .map(|c| (c, "static"))
            .chain(regular.iter().map(|c| (c, "regular")))
            .filter(|(c, kind)| kinds.get(**c).map(String::as_str) != Some(*kind))
            .map(|(c, kind)| format!("no {kind} column {c}"))
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(mismatch(format!(
                "not a table of the cassandra-membership 0.2 shape: {}",
                problems.join(", ")
            )))
        }
    }

    async fn prepare(
        &self,
        cql: &str,
        table: &str,
    ) -> std::result::Result<PreparedStatement, PrepareFailure> {
        let o = self.options();
        let session: &Session = self.session();
        let mut p =
            tokio::time::timeout(o.request_timeout, session.prepare(bind_table(cql, table)))
                .await
                .map_err(|_| PrepareFailure::Timeout)??;
        p.set_consistency(commit_level(o.consistency));
        p.set_request_timeout(Some(o.request_timeout));
        p.set_execution_profile_handle(self.shared.routing.clone());
        p.set_page_size(i32::try_from(o.page_size).unwrap_or(i32::MAX));
        // Reads, and writes stamped with their own timestamps: all repeatable.
        p.set_is_idempotent(true);
        p.set_retry_policy(Some(std::sync::Arc::new(ProviderRetryPolicy(
            StatementKind::Idempotent,
        ))));
        Ok(p)
    }

    async fn prepare_source(&self) -> Result<SourceStatements> {
        let table = self.shared.qualified.clone();
        let fail = |e| prepare_error(&table, e);
        let old_heartbeats = match self.prepare(OLD_HEARTBEATS, &table).await {
            Ok(p) => (p, true),
            // Before 5.0 a map element's write time cannot be selected.
            Err(PrepareFailure::Refused(e)) if prepare_refused_statement(&e) => {
                warn!(error = %e, "the server cannot report heartbeat write times: dating each by its I-am-alive time");
                let values = self.prepare(OLD_HEARTBEAT_VALUES, &table).await;
                (values.map_err(fail)?, false)
            }
            Err(e) => return Err(fail(e)),
        };
        Ok(SourceStatements {
            list_clusters: self.prepare(LIST_CLUSTERS, &table).await.map_err(fail)?,
            read_old: self.prepare(READ_OLD, &table).await.map_err(fail)?,
            old_heartbeats,
        })
    }

    async fn prepare_target(&self, target: &str) -> Result<TargetStatements> {
        let fail = |e| prepare_error(target, e);
        Ok(TargetStatements {
            write_entry: self.prepare(WRITE_ENTRY, target).await.map_err(fail)?,
            write_heartbeat: self.prepare(WRITE_HEARTBEAT, target).await.map_err(fail)?,
            write_version: self.prepare(WRITE_VERSION, target).await.map_err(fail)?,
        })
    }

    async fn list_old_clusters(&self, st: &SourceStatements) -> Result<Vec<(String, String)>> {
        let mut out = Vec::new();
        let mut paging = PagingState::start();
        loop {
            let (result, next) = self
                .read_page("migrate", &st.list_clusters, (), paging, false, Scan::Table)
                .await?;
            let rows = result
                .into_rows_result()
                .map_err(|e| MembershipError::corrupt(None, format!("cluster listing: {e}")))?;
            for row in rows
                .rows::<(Option<String>, Option<String>)>()
                .map_err(|e| self.shape_error(e))?
            {
                if let (Some(s), Some(c)) = row.map_err(|e| self.shape_error(e))? {
                    out.push((s, c));
                }
            }
            match next {
                PagingStateResponse::HasMorePages { state } => paging = state,
                PagingStateResponse::NoMorePages => return Ok(out),
            }
        }
    }

    /// One old partition: its rows (paged, plain) and its heartbeat elements with their dates.
    async fn read_old_partition(&self, st: &SourceStatements, pk: Pk<'_>) -> Result<OldPartition> {
        let mut out = OldPartition::default();
        let mut paging = PagingState::start();
        let mut scan = Scan::Whole(pk);
        loop {
            let (result, next) = self
                .read_page("migrate", &st.read_old, pk, paging, false, scan)
                .await?;
            scan = Scan::Part(pk);
            let rows = result
                .into_rows_result()
                .map_err(|e| MembershipError::corrupt(None, format!("old partition read: {e}")))?;
            for row in rows.rows::<OldRow>().map_err(|e| self.shape_error(e))? {
                out.rows.push(row.map_err(|e| self.shape_error(e))?);
            }
            match next {
                PagingStateResponse::HasMorePages { state } => paging = state,
                PagingStateResponse::NoMorePages => break,
            }
        }
        let (statement, with_dates) = &st.old_heartbeats;
        let result = self
            .exec_read("migrate", statement, pk, false, Scan::Part(pk))
            .await?;
        if *with_dates {
            if let Some(row) = self.first_row::<OldHeartbeatsRow>(result, None, "heartbeat read")? {
                let written = row.written.unwrap_or_default();
                let ttls = row.ttls.unwrap_or_default();
                // Cassandra lists write times and TTLs in the map's key order (UTF-8 byte order,
                // the order of a BTreeMap of Strings).
                for (i, (key, value)) in row.heartbeats.unwrap_or_default().into_iter().enumerate()
                {
                    let dated = Dated {
                        value,
                        written: written.get(i).copied().flatten(),
                        ttl: ttls.get(i).copied().flatten(),
                    };
                    out.heartbeats.insert(key, dated);
                }
            }
        } else {
            out.heartbeats_dated_by_value = true;
            if let Some(row) =
                self.first_row::<OldHeartbeatValuesRow>(result, None, "heartbeat read")?
            {
                for (key, value) in row.heartbeats.unwrap_or_default() {
                    // Every heartbeat of the old provider was stamped with its I-am-alive time.
                    let written = value.1.map(|t| t.0.saturating_mul(1000));
                    out.heartbeats.insert(
                        key,
                        Dated {
                            value,
                            written,
                            ttl: None,
                        },
                    );
                }
            }
        }
        Ok(out)
    }
}

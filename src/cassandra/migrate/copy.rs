//! The migration's side of the target: its set-up (the schema alone), what it already holds of
//! a cluster (see `rerun.rs`), the copy in single-partition batches, and the read-back through
//! the provider's own read.

use std::time::Instant;

use scylla::response::{PagingState, PagingStateResponse};
use scylla::serialize::row::{RowSerializationContext, SerializeRow};
use scylla::serialize::writers::RowWriter;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use tracing::{Span, info, instrument, warn};
use uuid::Uuid;

use super::plan::{ClusterCopy, CopyWrite, difference};
use super::rerun::{Rerun, TargetRow, TargetState, decide};
use super::source::commit_level;
use super::{ClusterMigration, Verification};
use crate::cassandra::bind::EntryValues;
use crate::cassandra::errors::{prepare_error, to_error};
use crate::cassandra::exec::Scan;
use crate::cassandra::heartbeats::StoredHeartbeat;
use crate::cassandra::retry::{ProviderRetryPolicy, StatementKind};
use crate::cassandra::{CassandraMembershipTable, Pk};
use crate::error::{MembershipError, Result};
use crate::table::MembershipTable;

const READ_TARGET: &str = include_str!("../../../cql/migrate_read_target.cql");
const WRITE_ENTRY: &str = include_str!("../../../cql/migrate_write_entry.cql");
const WRITE_HEARTBEAT: &str = include_str!("../../../cql/migrate_write_heartbeat.cql");
const WRITE_VERSION: &str = include_str!("../../../cql/migrate_write_version.cql");

/// Statements per copy batch: one partition's batch is one mutation, and ~60 entries stay well
/// under Cassandra's `batch_size_fail_threshold` (50 KiB by default).
const BATCH_STATEMENTS: usize = 60;

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

/// The migration's writes of the target.
pub(super) struct TargetStatements {
    read_target: PreparedStatement,
    write_entry: PreparedStatement,
    write_heartbeat: PreparedStatement,
    write_version: PreparedStatement,
}

impl CassandraMembershipTable {
    pub(super) async fn prepare_target(&self, target: &str) -> Result<TargetStatements> {
        let fail = |e| prepare_error(target, e);
        Ok(TargetStatements {
            read_target: self.prepare(READ_TARGET, target).await.map_err(fail)?,
            write_entry: self.prepare(WRITE_ENTRY, target).await.map_err(fail)?,
            write_heartbeat: self.prepare(WRITE_HEARTBEAT, target).await.map_err(fail)?,
            write_version: self.prepare(WRITE_VERSION, target).await.map_err(fail)?,
        })
    }

    /// What the target holds of one cluster: its version and the newest write time of its
    /// cells. A read that fails stops the run: deciding without it could copy over silos'
    /// writes (and, once their tombstones are purged, bring back what they removed).
    async fn read_target_state(&self, st: &TargetStatements, pk: Pk<'_>) -> Result<TargetState> {
        let mut state = TargetState::default();
        let mut paging = PagingState::start();
        let mut scan = Scan::Whole(pk);
        loop {
            let (result, next) = self
                .read_page("migrate", &st.read_target, pk, paging, false, scan)
                .await?;
            scan = Scan::Part(pk);
            let rows = result
                .into_rows_result()
                .map_err(|e| MembershipError::corrupt(None, format!("target read: {e}")))?;
            for row in rows.rows::<TargetRow>().map_err(|e| self.shape_error(e))? {
                state.add(&row.map_err(|e| self.shape_error(e))?);
            }
            match next {
                PagingStateResponse::HasMorePages { state } => paging = state,
                PagingStateResponse::NoMorePages => return Ok(state),
            }
        }
    }

    /// Writes one cluster's copy and reads it back, unless the target holds what must not be
    /// copied over (`rerun.rs`).
    #[instrument(level = "info", skip_all, fields(service = %cluster.service_id, cluster = %cluster.cluster_id, entries = cluster.entries_copied, resumed))]
    pub(super) async fn copy_cluster(
        &self,
        st: &TargetStatements,
        target: &CassandraMembershipTable,
        cluster: &mut ClusterMigration,
        copy: &ClusterCopy,
    ) -> Result<()> {
        let pk = Pk {
            service_id: &cluster.service_id,
            cluster_id: &cluster.cluster_id,
        };
        match decide(&self.read_target_state(st, pk).await?, copy) {
            Rerun::Copy => {}
            Rerun::Resume => {
                // What an earlier run already copied (a read that fails, e.g. on a copy stopped
                // after the version, counts nothing: this count is only reported).
                if let Ok(before) = target.read_all().await {
                    cluster.already_present = copy
                        .expected
                        .rows
                        .iter()
                        .filter(|r| before.get(&r.entry.address) == Some(r))
                        .count();
                }
            }
            Rerun::TargetMovedOn => {
                warn!(service = %cluster.service_id, cluster = %cluster.cluster_id,
                    "the target holds writes newer than the source's: its silos wrote there since an earlier copy; not copied again");
                cluster.verification = Verification::TargetMovedOn;
                cluster.nothing_written();
                return Ok(());
            }
            Rerun::SourceChanged(why) => {
                warn!(service = %cluster.service_id, cluster = %cluster.cluster_id, reason = %why,
                    "the source changed since an earlier copy: the copy there is stale and is left as it is");
                cluster.verification = Verification::SourceChanged(why);
                cluster.nothing_written();
                return Ok(());
            }
        }
        Span::current().record("resumed", cluster.resumed());
        let started = Instant::now();
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
}

//! Tables that disagree with the configured TTL: the audit (dry run) and the `patch` policy.
//!
//! A row "disagrees" when its cells carry no TTL although expiry is on, a TTL longer than the
//! provider ever writes, or any TTL although expiry is off. Patching rewrites each such row so
//! that it expires as if the configured TTL had always applied, counted from its last heartbeat
//! (rows already past that are removed). Every rewrite is conditional on the row and the version
//! being unchanged, so a concurrent membership change or another silo patching at the same time
//! is never overwritten; the patch is idempotent.

use std::collections::HashMap;
use std::time::Duration;

use scylla::DeserializeRow;
use scylla::response::{PagingState, PagingStateResponse};
use scylla::value::CqlTimestamp;
use tracing::{info, warn};

use super::CassandraMembershipTable;
use super::driver_errors::to_error;
use super::rows::merge_heartbeat;
use super::statements::alter_table_ttl_cql;
use super::values::{DeleteEntryValues, HeartbeatValues, Pk, UpdateEntryValues, to_cql};
use crate::error::{MembershipError, Result};
use crate::model::Timestamp;

/// What `patch` would do (or did) with one row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchAction {
    /// The row already agrees with the configuration.
    Keep,
    /// Rewrite the row's cells, unchanged, to expire in this many seconds (0: never).
    Rewrite {
        /// The TTL the rewrite carries.
        ttl_seconds: u32,
    },
    /// The row is older than the configured TTL allows: delete it.
    Remove,
    /// The row cannot be decoded (written by hand or another program); it is left alone.
    Unreadable,
}

/// One row of the audit. `silo` is `None` for a cluster's table version (its static cells).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowAudit {
    /// The row's service id.
    pub service_id: String,
    /// The row's cluster id.
    pub cluster_id: String,
    /// The silo key, or `None` for the table version.
    pub silo: Option<String>,
    /// The TTL its cells carry now, in seconds (`None`: no TTL).
    pub current_ttl: Option<u32>,
    /// What `patch` does with it.
    pub action: PatchAction,
}

/// What [`CassandraMembershipTable::audit_ttl`] found: the table's settings against the
/// configuration, and one line per row that disagrees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TtlAudit {
    /// `keyspace.table`.
    pub table: String,
    /// The table's `default_time_to_live`.
    pub table_default_ttl: u64,
    /// The configured TTL (DefunctSiloExpiration, 0 when expiry is off).
    pub configured_ttl: u64,
    /// Rows (and versions) that disagree with the configuration, with what `patch` does.
    pub rows: Vec<RowAudit>,
}

impl TtlAudit {
    /// True when neither the table default nor any row disagrees.
    pub fn agrees(&self) -> bool {
        self.table_default_ttl == self.configured_ttl && self.rows.is_empty()
    }

    /// How many rows (and versions) disagree.
    pub fn disagreeing(&self) -> u64 {
        self.rows.len() as u64
    }
}

#[derive(DeserializeRow)]
struct ScanRow {
    service_id: String,
    cluster_id: String,
    silo: Option<String>,
    etag_ttl: Option<i32>,
    version_etag: Option<uuid::Uuid>,
    version_ttl: Option<i32>,
}

#[derive(DeserializeRow)]
struct AuditRow {
    silo: Option<String>,
    etag_ttl: Option<i32>,
    version_ttl: Option<i32>,
    version_written: Option<i64>,
}

/// A partition's plan: one line per disagreeing row, plus what to do with the version and the
/// heartbeat elements.
struct PartitionPlan {
    lines: Vec<RowAudit>,
    version_ttl: Option<u32>,
    remove_version: bool,
}

impl CassandraMembershipTable {
    /// Reports, without writing anything, how the table and every row of every cluster in it
    /// compare with the configured TTL, and what the `patch` policy would do row by row.
    pub async fn audit_ttl(&self) -> Result<TtlAudit> {
        let table_default_ttl = self
            .table_settings()
            .await?
            .map_or(0, |(ttl, _)| ttl.max(0) as u64);
        let mut rows = Vec::new();
        for (service_id, cluster_id) in self.disagreeing_partitions().await? {
            let pk = Pk {
                service_id: &service_id,
                cluster_id: &cluster_id,
            };
            match self.plan_partition(pk).await {
                Ok(plan) => rows.extend(plan.lines),
                // A cluster whose version is damaged cannot be planned; report it, touch nothing.
                Err(MembershipError::CorruptData { reason, .. }) => {
                    warn!(service = %service_id, cluster = %cluster_id, %reason, "cannot audit a damaged cluster");
                    rows.push(RowAudit {
                        service_id: service_id.clone(),
                        cluster_id: cluster_id.clone(),
                        silo: None,
                        current_ttl: None,
                        action: PatchAction::Unreadable,
                    });
                }
                Err(e) => return Err(e),
            }
        }
        Ok(TtlAudit {
            table: self.shared.qualified.clone(),
            table_default_ttl,
            configured_ttl: self.opts().ttl_seconds().unwrap_or(0),
            rows,
        })
    }

    /// One paged scan of the table: the clusters holding any row or version that disagrees.
    async fn disagreeing_partitions(&self) -> Result<Vec<(String, String)>> {
        let st = self.statements().await?;
        let mut out: Vec<(String, String)> = Vec::new();
        let mut paging = PagingState::start();
        loop {
            super::bump(&self.shared.counters.reads);
            let (result, next) = self
                .session_ref()
                .execute_single_page(&st.audit_table, (), paging)
                .await
                .map_err(|e| to_error("audit_ttl", e))?;
            let rows = result
                .into_rows_result()
                .map_err(|e| MembershipError::corrupt(None, format!("table scan: {e}")))?;
            for row in rows.rows::<ScanRow>().map_err(|e| self.shape_error(e))? {
                let row = row.map_err(|e| self.shape_error(e))?;
                let row_disagrees = row.silo.is_some() && self.disagrees(row.etag_ttl);
                let version_disagrees =
                    row.version_etag.is_some() && self.disagrees(row.version_ttl);
                let key = (row.service_id, row.cluster_id);
                if (row_disagrees || version_disagrees) && out.last() != Some(&key) {
                    out.push(key);
                }
            }
            match next {
                PagingStateResponse::HasMorePages { state } => paging = state,
                PagingStateResponse::NoMorePages => return Ok(out),
            }
        }
    }

    /// The remaining TTL, in whole seconds, of something last alive at `last`: what it would
    /// have left had every write carried the configured TTL. `None` when expiry is off.
    fn remaining_from(&self, last: Timestamp, now: Timestamp) -> Option<i64> {
        self.opts().ttl_seconds()?;
        let expires = last.as_millis() + self.opts().write_ttl_seconds() as i64 * 1000;
        Some((expires - now.as_millis()).div_euclid(1000))
    }

    fn disagrees(&self, current: Option<i32>) -> bool {
        match (self.opts().ttl_seconds(), current) {
            (None, ttl) => ttl.is_some(),
            (Some(_), None) => true,
            (Some(_), Some(ttl)) => ttl as u64 > self.opts().write_ttl_seconds(),
        }
    }

    async fn plan_partition(&self, pk: Pk<'_>) -> Result<PartitionPlan> {
        let st = self.statements().await?;
        let now = Timestamp::now();
        let read = self.read_partition(pk).await?;
        let mut ttls = Vec::new();
        let mut paging = PagingState::start();
        loop {
            let (result, next) = self
                .session_ref()
                .execute_single_page(&st.audit_partition, pk, paging)
                .await
                .map_err(|e| to_error("audit_ttl", e))?;
            let rows = result
                .into_rows_result()
                .map_err(|e| MembershipError::corrupt(None, format!("audit: {e}")))?;
            for row in rows.rows::<AuditRow>().map_err(|e| self.shape_error(e))? {
                ttls.push(row.map_err(|e| self.shape_error(e))?);
            }
            match next {
                PagingStateResponse::HasMorePages { state } => paging = state,
                PagingStateResponse::NoMorePages => break,
            }
        }
        let entries: HashMap<String, _> = read
            .entries
            .iter()
            .map(|e| (e.entry.address.to_string(), e))
            .collect();
        let line = |silo: Option<String>, current: Option<i32>, action| RowAudit {
            service_id: pk.service_id.to_owned(),
            cluster_id: pk.cluster_id.to_owned(),
            silo,
            current_ttl: current.map(|t| t.max(0) as u32),
            action,
        };
        let mut lines = Vec::new();
        // The version must outlive every row that stays: the latest expiry among them.
        let mut latest_row_expiry: Option<i64> = None;
        let mut version_current = None;
        let mut version_written = None;
        for row in &ttls {
            version_current = row.version_ttl;
            version_written = row.version_written;
            let Some(silo) = row.silo.clone() else {
                continue;
            };
            let Some(stored) = entries.get(&silo) else {
                if self.disagrees(row.etag_ttl) {
                    lines.push(line(Some(silo), row.etag_ttl, PatchAction::Unreadable));
                }
                continue;
            };
            let entry = merge_heartbeat(stored.entry.clone(), read.heartbeats.get(&silo).copied());
            let remaining = self.remaining_from(entry.i_am_alive_time, now);
            if !self.disagrees(row.etag_ttl) {
                if let Some(t) = row.etag_ttl {
                    latest_row_expiry = latest_row_expiry.max(Some(i64::from(t)));
                }
                continue;
            }
            let action = match remaining {
                None => PatchAction::Rewrite { ttl_seconds: 0 },
                Some(r) if r <= 0 => PatchAction::Remove,
                Some(r) => {
                    latest_row_expiry = latest_row_expiry.max(Some(r));
                    PatchAction::Rewrite {
                        ttl_seconds: r as u32,
                    }
                }
            };
            lines.push(line(Some(silo), row.etag_ttl, action));
        }
        let mut version_ttl = None;
        let mut remove_version = false;
        if read.version_etag.is_some() && self.disagrees(version_current) {
            let action = match self.opts().ttl_seconds() {
                None => PatchAction::Rewrite { ttl_seconds: 0 },
                Some(_) => {
                    let written = Timestamp::from_millis(version_written.unwrap_or(0) / 1000);
                    let own = self.remaining_from(written, now).unwrap_or(0);
                    let needed = own.max(latest_row_expiry.unwrap_or(0));
                    if needed <= 0 {
                        PatchAction::Remove
                    } else {
                        PatchAction::Rewrite {
                            ttl_seconds: needed as u32,
                        }
                    }
                }
            };
            match action {
                PatchAction::Remove => remove_version = true,
                PatchAction::Rewrite { ttl_seconds } => version_ttl = Some(ttl_seconds),
                _ => {}
            }
            lines.push(line(None, version_current, action));
        }
        Ok(PartitionPlan {
            lines,
            version_ttl,
            remove_version,
        })
    }

    /// Decides, at `initialize`, what to do about a table that disagrees with the configuration.
    pub(super) async fn reconcile_ttl(&self) -> Result<()> {
        let audit = self.audit_ttl().await?;
        if audit.agrees() {
            return Ok(());
        }
        match self.opts().ttl_mismatch {
            super::TtlMismatchPolicy::Throw => Err(MembershipError::TtlMismatch {
                table: audit.table.clone(),
                table_ttl_seconds: audit.table_default_ttl,
                configured_ttl_seconds: audit.configured_ttl,
                rows_disagreeing: audit.disagreeing(),
            }),
            super::TtlMismatchPolicy::Allow => {
                warn!(
                    table = %audit.table,
                    table_ttl = audit.table_default_ttl,
                    configured_ttl = audit.configured_ttl,
                    rows_disagreeing = audit.disagreeing(),
                    "the table's TTL settings disagree with the configuration; ttl_mismatch = allow leaves them as they are, new writes use the configured TTL"
                );
                Ok(())
            }
            super::TtlMismatchPolicy::Patch => self.patch_ttl(&audit).await,
        }
    }

    async fn patch_ttl(&self, audit: &TtlAudit) -> Result<()> {
        if audit.table_default_ttl != audit.configured_ttl {
            self.session_ref()
                .query_unpaged(
                    alter_table_ttl_cql(&self.shared.qualified, audit.configured_ttl),
                    (),
                )
                .await
                .map_err(|e| to_error("initialize", e))?;
            self.await_schema_agreement().await?;
        }
        let mut partitions: Vec<(String, String)> = audit
            .rows
            .iter()
            .map(|r| (r.service_id.clone(), r.cluster_id.clone()))
            .collect();
        partitions.dedup();
        let mut rewritten = 0usize;
        let mut removed = 0usize;
        for (service_id, cluster_id) in partitions {
            let pk = Pk {
                service_id: &service_id,
                cluster_id: &cluster_id,
            };
            let (w, r) = self.patch_partition(pk).await?;
            rewritten += w;
            removed += r;
        }
        info!(table = %audit.table, rewritten, removed, "patched rows to the configured TTL");
        Ok(())
    }

    /// Patches one partition; re-plans and retries when a concurrent write wins a condition.
    async fn patch_partition(&self, pk: Pk<'_>) -> Result<(usize, usize)> {
        let st = self.statements().await?;
        let (mut rewritten, mut removed) = (0, 0);
        for _ in 0..super::MAX_ATTEMPTS {
            let plan = self.plan_partition(pk).await?;
            let read = self.read_partition(pk).await?;
            let version_etag = read.version_etag;
            let mut conflict = false;
            for line in &plan.lines {
                let Some(silo) = &line.silo else { continue };
                let Some(stored) = read
                    .entries
                    .iter()
                    .find(|e| &e.entry.address.to_string() == silo)
                else {
                    continue;
                };
                let ok = match line.action {
                    PatchAction::Rewrite { ttl_seconds } => {
                        let Some(version_etag) = version_etag else {
                            continue;
                        };
                        let values = (
                            self.entry_values_in(
                                pk,
                                &stored.entry,
                                silo,
                                stored.etag,
                                ttl_seconds as i32,
                            ),
                            UpdateEntryValues {
                                entry: self.entry_values_in(
                                    pk,
                                    &stored.entry,
                                    silo,
                                    stored.etag,
                                    ttl_seconds as i32,
                                ),
                                expected_etag: Some(stored.etag),
                            },
                            self.version_values_in(
                                pk,
                                read.version.version as i64,
                                version_etag,
                                Some(version_etag),
                                plan.version_ttl
                                    .map_or_else(|| self.write_ttl(), |t| t as i32),
                            ),
                        );
                        let r = self.exec_conditional_batch(&st.patch_batch, values).await;
                        rewritten += 1;
                        r
                    }
                    PatchAction::Remove => {
                        let r = self
                            .exec_conditional(
                                &st.delete_entry,
                                DeleteEntryValues {
                                    service_id: pk.service_id,
                                    cluster_id: pk.cluster_id,
                                    silo,
                                    expected_etag: stored.etag,
                                    heartbeat_key: silo,
                                    expected_heartbeat: read.heartbeats.get(silo).copied(),
                                },
                            )
                            .await;
                        removed += 1;
                        r
                    }
                    _ => continue,
                };
                // A lost condition, or an unknown outcome (rewriting unchanged cells is safe to
                // repeat): the next attempt re-plans from what is stored.
                if !matches!(ok, Ok(Ok(true))) {
                    conflict = true;
                    break;
                }
            }
            if conflict {
                continue;
            }
            // The version alone (when no row rewrite carried it), or its removal when nothing stays.
            if let Some(version_etag) = version_etag {
                if plan.remove_version
                    && read.entries.len()
                        == plan
                            .lines
                            .iter()
                            .filter(|l| l.action == PatchAction::Remove)
                            .count()
                {
                    let r = self
                        .exec_conditional(
                            &st.delete_statics,
                            super::values::DeleteStaticsValues {
                                service_id: pk.service_id,
                                cluster_id: pk.cluster_id,
                                expected_version_etag: Some(version_etag),
                            },
                        )
                        .await;
                    if !matches!(r, Ok(Ok(true))) {
                        continue;
                    }
                } else if let Some(ttl) = plan.version_ttl {
                    let values = self.version_values_in(
                        pk,
                        read.version.version as i64,
                        version_etag,
                        Some(version_etag),
                        ttl as i32,
                    );
                    let r = self.exec_conditional(&st.write_version, values).await;
                    if !matches!(r, Ok(Ok(true))) {
                        continue;
                    }
                }
            }
            self.patch_heartbeats(pk, &read.heartbeats).await?;
            return Ok((rewritten, removed));
        }
        Err(MembershipError::Contention {
            operation: "initialize (ttl patch)",
            attempts: super::MAX_ATTEMPTS,
            elapsed: Duration::ZERO,
        })
    }

    /// Re-stamps every heartbeat element one microsecond after its own stamp with the TTL it
    /// should have (or removes it when already past), so a newer heartbeat always wins.
    async fn patch_heartbeats(
        &self,
        pk: Pk<'_>,
        heartbeats: &HashMap<String, super::rows::StoredHeartbeat>,
    ) -> Result<()> {
        let st = self.statements().await?;
        let now = Timestamp::now();
        for (key, (start, time)) in heartbeats {
            let (Some(start), Some(time)) = (start, time) else {
                continue;
            };
            let stamp = time.0.saturating_mul(1000).saturating_add(1);
            match self.remaining_from(Timestamp::from_millis(time.0), now) {
                Some(r) if r <= 0 => {
                    self.delete_heartbeat(pk, key, stamp, "initialize (ttl patch)")
                        .await?;
                }
                remaining => {
                    super::bump(&self.shared.counters.plain_writes);
                    self.session_ref()
                        .execute_unpaged(
                            &st.heartbeat,
                            HeartbeatValues {
                                ttl: remaining.map_or(0, |r| r as i32),
                                write_time_micros: stamp,
                                silo: key,
                                heartbeat: (
                                    CqlTimestamp(start.0),
                                    to_cql(Timestamp::from_millis(time.0)),
                                ),
                                service_id: pk.service_id,
                                cluster_id: pk.cluster_id,
                            },
                        )
                        .await
                        .map_err(|e| to_error("initialize", e))?;
                }
            }
        }
        Ok(())
    }
}

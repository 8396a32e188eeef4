//! The migration's side of the source: the 0.2 shape checked, its clusters listed, each
//! partition read with its cells' write times and TTLs. The source is only ever read.

use std::collections::BTreeMap;

use scylla::client::session::Session;
use scylla::response::{PagingState, PagingStateResponse};
use scylla::statement::Consistency;
use scylla::statement::prepared::PreparedStatement;
use tracing::warn;

use super::plan::{Dated, OldHeartbeatValuesRow, OldHeartbeatsRow, OldPartition, OldRow};
use crate::cassandra::errors::{prepare_error, prepare_refused_statement, to_error};
use crate::cassandra::exec::Scan;
use crate::cassandra::options::ConsistencyProfile;
use crate::cassandra::retry::{ProviderRetryPolicy, StatementKind};
use crate::cassandra::statements::{PrepareFailure, bind_table};
use crate::cassandra::{CassandraMembershipTable, Pk};
use crate::error::{MembershipError, Result};

const LIST_CLUSTERS: &str = include_str!("../../../cql/list_clusters.cql");
const READ_OLD: &str = include_str!("../../../cql/migrate_read_old.cql");
const OLD_HEARTBEATS: &str = include_str!("../../../cql/migrate_old_heartbeats.cql");
const OLD_HEARTBEAT_VALUES: &str = include_str!("../../../cql/migrate_old_heartbeat_values.cql");

/// The migration's reads of the source.
pub(super) struct SourceStatements {
    list_clusters: PreparedStatement,
    read_old: PreparedStatement,
    /// With write times (`true`), or the values-only fallback (`false`).
    old_heartbeats: (PreparedStatement, bool),
}

pub(super) fn commit_level(profile: ConsistencyProfile) -> Consistency {
    match profile {
        ConsistencyProfile::Quorum => Consistency::Quorum,
        ConsistencyProfile::LocalQuorum => Consistency::LocalQuorum,
    }
}

impl CassandraMembershipTable {
    /// The source must have the 0.2 shape: anything else is not this migration's to read.
    pub(super) async fn check_old_shape(&self) -> Result<()> {
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

    pub(super) async fn prepare(
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

    pub(super) async fn prepare_source(&self) -> Result<SourceStatements> {
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

    pub(super) async fn list_old_clusters(
        &self,
        st: &SourceStatements,
    ) -> Result<Vec<(String, String)>> {
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
    pub(super) async fn read_old_partition(
        &self,
        st: &SourceStatements,
        pk: Pk<'_>,
    ) -> Result<OldPartition> {
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

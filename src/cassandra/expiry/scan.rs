//! The reads expiry decides from: the paged plain scan of the partition's tags and TTLs
//! (`audit_partition.cql`), the plan made from it and the serial read of the entries, and the
//! audit reported from that plan. Reads only: nothing here writes.

use scylla::response::{PagingState, PagingStateResponse};
use tracing::warn;

use super::audit::{PatchAction, RowAudit, TtlAudit};
use super::plan::{PartitionRows, Plan, ScanRow, plan};
use super::ttl::TtlRules;
use crate::cassandra::CassandraMembershipTable;
use crate::cassandra::Pk;
use crate::cassandra::decode::row_key;
use crate::cassandra::exec::Scan;
use crate::error::{MembershipError, Result};
use crate::model::Timestamp;

impl CassandraMembershipTable {
    /// Reports, without writing anything, how the table default and every row of this
    /// cluster's partition compare with the configured TTL, and what `patch` would do row by row.
    /// Other clusters' rows are not read.
    pub async fn audit_ttl(&self) -> Result<TtlAudit> {
        Ok(self.audit_and_plan().await?.0)
    }

    /// The audit and the partition plan it was made from (`Err(CorruptData)`: the cluster's
    /// version is damaged and cannot be planned; reported as an unreadable line).
    pub(super) async fn audit_and_plan(&self) -> Result<(TtlAudit, Result<Plan>)> {
        let table_default_ttl = self
            .table_settings()
            .await?
            .map_or(0, |(ttl, _)| ttl.max(0) as u64);
        let plan = match self.plan_partition(self.pk()).await {
            Err(e) if !matches!(e, MembershipError::CorruptData { .. }) => return Err(e),
            plan => plan,
        };
        let rows = match &plan {
            Ok(plan) => plan.lines.clone(),
            // A cluster whose version is damaged cannot be planned; report it, touch nothing.
            Err(e) => {
                warn!(cluster = %self.cluster_id, error = %e, "cannot audit a damaged cluster");
                vec![RowAudit {
                    service_id: self.service_id().to_owned(),
                    cluster_id: self.cluster_id.clone(),
                    silo: None,
                    current_ttl: None,
                    action: PatchAction::Unreadable,
                }]
            }
        };
        let audit = TtlAudit {
            table: self.shared.qualified.clone(),
            table_default_ttl,
            configured_ttl: self.options().ttl_seconds().unwrap_or(0),
            rows,
        };
        Ok((audit, plan))
    }

    /// Reads the partition (the serial read, then the scan) and plans from what it read.
    pub(super) async fn plan_partition(&self, pk: Pk<'_>) -> Result<Plan> {
        let now = Timestamp::now();
        let read = self.read_partition(pk).await?;
        let scan = self.scan_partition(pk).await?;
        let rows = PartitionRows { pk, read, scan };
        Ok(plan(rows, now, &TtlRules::of(self.options())))
    }

    /// One paged plain read of the partition's tags and TTLs.
    pub(crate) async fn scan_partition(&self, pk: Pk<'_>) -> Result<Vec<ScanRow>> {
        let st = self.statements().await?;
        let mut out = Vec::new();
        let mut paging = PagingState::start();
        let mut scan = Scan::Whole(pk);
        loop {
            let (result, next) = self
                .read_page("audit_ttl", &st.audit_partition, pk, paging, false, scan)
                .await?;
            scan = Scan::Part(pk);
            let rows = result
                .into_rows_result()
                .map_err(|e| MembershipError::corrupt(None, format!("audit: {e}")))?;
            for row in rows.rows::<ScanRow>().map_err(|e| self.shape_error(e))? {
                let mut row = row.map_err(|e| self.shape_error(e))?;
                row.silo = row_key(row.silo); // the version's row: no key
                out.push(row);
            }
            match next {
                PagingStateResponse::HasMorePages { state } => paging = state,
                PagingStateResponse::NoMorePages => return Ok(out),
            }
        }
    }
}

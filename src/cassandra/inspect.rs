//! Read-only inspection for operators: the clusters a table holds, and each cluster's entries
//! with the time they have left before storage-side expiry.
//!
//! Entries and the version come from the provider's own linearizable partition read; the
//! remaining TTLs come from the TTL audit's plain scan of the partition (`audit_partition.cql`),
//! matched to entries by silo key.
//! The two are not one snapshot: an entry rewritten in between shows its new TTL, which is
//! what an operator wants to see anyway.

use std::time::Duration;

use scylla::DeserializeRow;
use scylla::response::{PagingState, PagingStateResponse};
use tracing::{Span, instrument};

use super::CassandraMembershipTable;
use super::Pk;
use crate::cassandra::exec::Scan;
use crate::error::{MembershipError, Result};
use crate::model::{ETag, MembershipEntry, SiloStatus, TableVersion, Timestamp};

/// One entry of a cluster as an operator sees it: the entry (with its latest heartbeat merged
/// in), its row tag, and how long storage keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct EntryInspection {
    /// The entry, I-am-alive time from the latest heartbeat of its incarnation.
    pub entry: MembershipEntry,
    /// The row tag.
    pub etag: ETag,
    /// The remaining TTL of the row's cells in seconds; `None`: the row never expires.
    pub ttl_seconds: Option<u32>,
    /// When storage will remove the row unless it is renewed first (read time + TTL).
    pub expires_at: Option<Timestamp>,
}

/// One cluster (partition) of a table, read for an operator.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClusterInspection {
    /// The service id.
    pub service_id: String,
    /// The cluster id.
    pub cluster_id: String,
    /// The table version ([`TableVersion::absent`] when the cluster has none).
    pub version: TableVersion,
    /// The remaining TTL of the version in seconds; `None`: it never expires (or is absent).
    pub version_ttl_seconds: Option<u32>,
    /// Every readable entry, ordered by silo address.
    pub entries: Vec<EntryInspection>,
    /// Keys of rows that could not be decoded (written by hand or another program).
    pub unreadable: Vec<String>,
    /// When the cluster was read (the local clock), the origin of every `expires_at`.
    pub read_at: Timestamp,
    /// The tombstones one statement of this read scanned, as the node reported it (see
    /// [`CassandraMembershipTable::tombstones_scanned`]); `None` below the node's warning
    /// threshold.
    pub tombstones_scanned: Option<u64>,
}

impl ClusterInspection {
    /// How many entries have `status`.
    pub fn count(&self, status: SiloStatus) -> usize {
        self.entries
            .iter()
            .filter(|e| e.entry.status == status)
            .count()
    }

    /// The latest I-am-alive time of any entry.
    pub fn newest_i_am_alive(&self) -> Option<Timestamp> {
        self.entries.iter().map(|e| e.entry.i_am_alive_time).max()
    }

    /// When the version will expire unless renewed (read time + TTL); `None`: never.
    pub fn version_expires_at(&self) -> Option<Timestamp> {
        expires(self.read_at, self.version_ttl_seconds)
    }
}

fn expires(read_at: Timestamp, ttl_seconds: Option<u32>) -> Option<Timestamp> {
    ttl_seconds.map(|t| read_at.saturating_add(Duration::from_secs(u64::from(t))))
}

#[derive(DeserializeRow)]
struct ClusterKeyRow {
    service_id: Option<String>,
    cluster_id: Option<String>,
}

/// A TTL as Cassandra reports it: null or non-positive means none.
fn ttl_of(ttl: Option<i32>) -> Option<u32> {
    ttl.and_then(|t| u32::try_from(t).ok()).filter(|&t| t > 0)
}

impl CassandraMembershipTable {
    /// Every `(service_id, cluster_id)` that has data in the table, of every service, in token
    /// order. One paged scan of partition keys (a plain read, at the commit level).
    #[instrument(level = "info", skip(self), fields(table = %self.shared.qualified, clusters))]
    pub async fn list_clusters(&self) -> Result<Vec<(String, String)>> {
        let st = self.statements().await?;
        let mut out = Vec::new();
        let mut paging = PagingState::start();
        loop {
            let (result, next) = self
                .read_page(
                    "list_clusters",
                    &st.list_clusters,
                    (),
                    paging,
                    false,
                    Scan::Table,
                )
                .await?;
            let rows = result
                .into_rows_result()
                .map_err(|e| MembershipError::corrupt(None, format!("cluster listing: {e}")))?;
            for row in rows
                .rows::<ClusterKeyRow>()
                .map_err(|e| self.shape_error(e))?
            {
                let row = row.map_err(|e| self.shape_error(e))?;
                if let (Some(s), Some(c)) = (row.service_id, row.cluster_id) {
                    out.push((s, c));
                }
            }
            match next {
                PagingStateResponse::HasMorePages { state } => paging = state,
                PagingStateResponse::NoMorePages => break,
            }
        }
        Span::current().record("clusters", out.len());
        Ok(out)
    }

    /// This table's own cluster, for an operator: see [`Self::inspect_cluster`].
    pub async fn inspect(&self) -> Result<ClusterInspection> {
        let service_id = self.service_id().to_owned();
        let cluster_id = self.cluster_id.clone();
        self.inspect_cluster(&service_id, &cluster_id).await
    }

    /// Reads one cluster of any service in the table for an operator: its version and entries
    /// (the provider's linearizable read), and the remaining TTL of each (one plain read).
    /// Writes nothing. A damaged version is [`MembershipError::CorruptData`], and so is a version
    /// lost while entries remain.
    #[instrument(level = "info", skip(self), fields(table = %self.shared.qualified, entries))]
    pub async fn inspect_cluster(
        &self,
        service_id: &str,
        cluster_id: &str,
    ) -> Result<ClusterInspection> {
        if service_id.is_empty() || cluster_id.is_empty() {
            return Err(MembershipError::config(
                if service_id.is_empty() {
                    "service_id"
                } else {
                    "cluster_id"
                },
                "must not be empty",
            ));
        }
        let pk = Pk {
            service_id,
            cluster_id,
        };
        let read = self.read_partition(pk).await?;
        if read.version_lost {
            return Err(super::read::lost_version_error(None));
        }
        let read_at = Timestamp::now();
        let ttls = self.scan_partition(pk).await?;
        let version_ttl_seconds = ttls.first().and_then(|r| ttl_of(r.version_ttl));
        let snapshot = read.snapshot();
        let entries: Vec<EntryInspection> = snapshot
            .rows
            .into_iter()
            .map(|row| {
                let key = row.entry.address.to_string();
                let ttl_seconds = ttls
                    .iter()
                    .find(|t| t.silo.as_deref() == Some(key.as_str()))
                    .and_then(|t| ttl_of(t.etag_ttl));
                EntryInspection {
                    entry: row.entry,
                    etag: row.etag,
                    ttl_seconds,
                    expires_at: expires(read_at, ttl_seconds),
                }
            })
            .collect();
        // Rows the read skipped as damaged still show up here: name them. (A row inserted
        // between the two reads shows up too; the next inspection reads it.)
        let unreadable = ttls
            .iter()
            .filter_map(|t| t.silo.clone())
            .filter(|silo| {
                !entries.iter().any(|e| &e.entry.address.to_string() == silo)
                    && !read.empty_rows.contains(silo)
            })
            .collect();
        Span::current().record("entries", entries.len());
        Ok(ClusterInspection {
            tombstones_scanned: self.shared.tombstones.get(pk),
            service_id: service_id.to_owned(),
            cluster_id: cluster_id.to_owned(),
            version: read.version,
            version_ttl_seconds,
            entries,
            unreadable,
            read_at,
        })
    }
}

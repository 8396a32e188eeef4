//! Removing data: `cleanup_defunct` (defunct entries, rows left with only a heartbeat cell,
//! orphaned heartbeat cells) and `delete_cluster` (a whole partition).

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use scylla::response::{PagingState, PagingStateResponse};
use tracing::{Span, debug, warn};
use uuid::Uuid;

use super::bind::{
    DeleteClusterValues, DeleteEntryValues, DeletePartitionValues, DeleteStaticsValues, Expected,
    SiloKey,
};
use super::decode::row_key;
use super::exec::Outcome;
use super::heartbeats::{StoredHeartbeat, merge_heartbeat};
use super::read::{larger_page, restart_pause};
use super::{CassandraMembershipTable, MAX_ATTEMPTS, Pk};
use crate::cassandra::exec::Scan;
use crate::error::{MembershipError, Result};
use crate::model::{SiloStatus, Timestamp};

/// How far in the past `delete_cluster` stamps the partition deletion of a buried partition:
/// more than the clock skew between coordinators, less than the age of the tombstones it must
/// shadow (hours, under any real churn).
const SHADOW_MARGIN: std::time::Duration = std::time::Duration::from_secs(10);

/// Rows per conditional batch in `delete_cluster`.
const DELETE_CHUNK: usize = 100;

/// The operation of `cleanup_defunct`'s statements.
const OPERATION: &str = "cleanup_defunct";

/// Which entries a cleanup removes (both: only those with no activity since the cutoff).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Defunct {
    /// Every entry that is not Active (`cleanup_defunct`, the age limit).
    NotActive,
    /// Only Dead entries (`cleanup_dead_entries`, the Dead-entry limit).
    Dead,
}

impl Defunct {
    fn removes(self, status: SiloStatus) -> bool {
        match self {
            Defunct::NotActive => status != SiloStatus::Active,
            Defunct::Dead => status == SiloStatus::Dead,
        }
    }
}

/// The raw content of a partition: every row key as stored and the version tag as stored.
struct RawKeys {
    keys: Vec<String>,
    version_etag: Option<Uuid>,
}

impl CassandraMembershipTable {
    /// Every row key of a partition as stored, and the raw version tag, read serially as one
    /// view: the version's row (`''`) comes first; a read of more than one page reads the tag
    /// again at its end — a membership write landing between two pages could have inserted a key
    /// into a page already read, and every such write moves the tag. Then the read starts over
    /// with larger pages, as `read_partition` does.
    async fn read_raw_keys(&self, pk: Pk<'_>) -> Result<RawKeys> {
        let st = self.statements().await?;
        let started = Instant::now();
        let mut page_size = i32::try_from(self.options().page_size).unwrap_or(i32::MAX);
        for attempt in 0..MAX_ATTEMPTS {
            restart_pause(attempt).await;
            let mut read_keys = st.read_keys.clone();
            read_keys.set_page_size(page_size);
            let mut view: Option<Uuid> = None;
            let mut keys = Vec::new();
            let mut seen = 0usize;
            let mut pages = 0u32;
            let mut paging = PagingState::start();
            let mut scan = Scan::Whole(pk);
            loop {
                let (result, next) = self
                    .read_page("delete_cluster", &read_keys, pk, paging, true, scan)
                    .await?;
                scan = Scan::Part(pk);
                pages += 1;
                let rows = result
                    .into_rows_result()
                    .map_err(|e| MembershipError::corrupt(None, format!("key read: {e}")))?;
                seen = seen.saturating_add(rows.rows_num());
                for row in rows
                    .rows::<(Option<String>, Option<Uuid>)>()
                    .map_err(|e| self.shape_error(e))?
                {
                    let (silo, version_etag) = row.map_err(|e| self.shape_error(e))?;
                    match row_key(silo) {
                        None => view = version_etag,
                        Some(key) => keys.push(key),
                    }
                }
                match next {
                    PagingStateResponse::HasMorePages { state } => paging = state,
                    PagingStateResponse::NoMorePages => break,
                }
            }
            if pages <= 1 || self.read_statics(pk).await?.version_etag == view {
                return Ok(RawKeys {
                    keys,
                    version_etag: view,
                });
            }
            debug!(
                cluster = pk.cluster_id,
                rows_seen = seen,
                "the version moved while reading the keys; reading again"
            );
            page_size = larger_page(page_size, seen);
        }
        Err(MembershipError::Contention {
            operation: "delete_cluster",
            attempts: MAX_ATTEMPTS,
            elapsed: started.elapsed(),
        })
    }

    /// `cleanup_defunct` / `cleanup_dead_entries`: conditional deletes of the entries `which`
    /// selects, then empty rows and orphaned heartbeat cells.
    pub(super) async fn cleanup(&self, before: Timestamp, which: Defunct) -> Result<usize> {
        let st = self.statements().await?;
        let read = self.read_partition(self.pk()).await?;
        let mut removed = 0usize;
        let mut removed_keys = HashSet::new();
        for stored in &read.entries {
            let key = stored.entry.address.to_string();
            let heartbeat = read.heartbeats.get(&key).copied();
            let entry = merge_heartbeat(stored.entry.clone(), heartbeat);
            if !which.removes(entry.status) || entry.last_activity() >= before {
                continue;
            }
            let values = DeleteEntryValues {
                service_id: self.service_id(),
                cluster_id: &self.cluster_id,
                silo: &key,
                expected: Expected::of(st.whole_entry_conditions, stored),
                expected_heartbeat: heartbeat,
            };
            // (gone, removed by this delete): a row gone after a delete whose outcome is unknown
            // may be another silo's removal, so it is not counted (the count can be low, never
            // high), but it is gone all the same.
            let (gone, counted) = match self
                .conditional(OPERATION, &st.delete_entry, values)
                .await?
            {
                Outcome::Applied => (true, true),
                Outcome::NotApplied => (false, false),
                Outcome::Ambiguous(e) => match self.read_one(&entry.address, true).await {
                    Ok(None) => (true, false),
                    Ok(Some(_)) => (false, false),
                    Err(_) => {
                        return Err(MembershipError::OutcomeUnknown {
                            operation: OPERATION,
                            detail: format!(
                                "deleting {key}; {removed} entries were removed before"
                            ),
                            source: e,
                        });
                    }
                },
            };
            if counted {
                removed += 1;
            }
            if gone {
                removed_keys.insert(key);
                self.forget_lease(&entry.address);
            }
        }
        // Rows left with only a heartbeat cell (an entry removed, or expired before its cell)
        // go with the orphaned cells below: a cell deleted at its own write time, never a row
        // deletion (which would shadow later heartbeats of a key inserted again).
        // Heartbeat cells whose entry is gone (removed above, or earlier), older than the cutoff.
        // A cell of another incarnation (start time differs from the row's) counts as orphaned;
        // so does a damaged one. Each delete is stamped with the cell's own write time (read
        // just before), so a newer heartbeat survives it — whoever wrote the cell.
        let live: HashMap<String, i64> = read
            .entries
            .iter()
            .map(|e| (e.entry.address.to_string(), e.entry.start_time.as_millis()))
            .filter(|(k, _)| !removed_keys.contains(k))
            .collect();
        let due = |key: &String, (start, time): &StoredHeartbeat| {
            let owned = start.is_some_and(|s| live.get(key) == Some(&s.0));
            !owned && time.is_none_or(|t| t.0 < before.as_millis())
        };
        if read.heartbeats.iter().any(|(k, v)| due(k, v)) {
            for cell in self.read_heartbeat_cells(self.pk(), OPERATION).await? {
                let Some(value) = cell.value else {
                    continue;
                };
                let stamp = cell.delete_stamp();
                if let (true, Some(stamp)) = (due(&cell.key, &value), stamp) {
                    self.delete_heartbeat_cell(self.pk(), &cell.key, stamp, OPERATION)
                        .await?;
                }
            }
        }
        Span::current().record("removed", removed);
        Ok(removed)
    }

    /// `delete_cluster`: every row of the partition as stored (healthy, damaged, heartbeat-only,
    /// any key text) and the version's row, in conditional batches fenced on the version tag as
    /// stored (so a damaged version does not block it); then heartbeat cells stamped later than the
    /// deleting ballot, each at its own write time. Checks that nothing is left.
    pub(super) async fn delete_partition(&self, cluster_id: &str) -> Result<()> {
        if cluster_id.is_empty() {
            return Err(MembershipError::config("cluster_id", "must not be empty"));
        }
        let pk = self.pk_of(cluster_id);
        match self.delete_fenced(pk).await {
            // A read (or a conditional write's read) of the partition met more tombstones than
            // the node lets it scan: its rows cannot be listed to delete them one by one.
            Err(e) if super::tombstones::buried(&e) => {
                self.shadow_buried_partition(pk).await?;
                // What the partition deletion leaves (cells of the last moments) goes the
                // fenced way; a partition still buried (tombstones of the last moments) fails.
                self.delete_fenced(pk).await
            }
            done => done,
        }
    }

    /// `delete_cluster`'s fenced path: see [`Self::delete_partition`].
    async fn delete_fenced(&self, pk: Pk<'_>) -> Result<()> {
        let cluster_id = pk.cluster_id;
        let st = self.statements().await?;
        let started = Instant::now();
        // Set after a write moved the version between the key read and the first batch.
        let mut close_first = false;
        for attempt in 0..MAX_ATTEMPTS {
            restart_pause(attempt).await;
            if close_first {
                // Close the cluster first: the statics deleted, fenced on the tag read just
                // now (a window of one serial read, not of the whole key read), every
                // membership write — each conditioned on the version tag — fails from then on,
                // so the keys read next stay put and the batches that follow delete them all.
                let statics = self.read_statics(pk).await?;
                let batch = st.batch_of([&st.delete_statics], self.options().request_timeout);
                let values = vec![DeleteClusterValues::Statics(DeleteStaticsValues {
                    service_id: self.service_id(),
                    cluster_id,
                    expected_version_etag: statics.version_etag,
                })];
                // Ambiguous: read again, closed or not.
                let closed = self
                    .conditional("delete_cluster", &batch, values)
                    .await?
                    .applied();
                if !closed {
                    continue;
                }
            }
            let raw = self.read_raw_keys(pk).await?;
            let mut expected = raw.version_etag;
            let mut chunks: Vec<&[String]> = raw.keys.chunks(DELETE_CHUNK).collect();
            if chunks.is_empty() {
                chunks.push(&[]);
            }
            let mut conflicted = false;
            for chunk in chunks {
                // Each chunk deletes its rows and the statics, fenced on the version read: a
                // concurrent membership change makes the batch fail and the loop read again.
                let statements =
                    std::iter::repeat_n(&st.delete_row, chunk.len()).chain([&st.delete_statics]);
                let batch = st.batch_of(statements, self.options().request_timeout);
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
                // Ambiguous: read again and continue from what is left.
                let ok = self
                    .conditional("delete_cluster", &batch, values)
                    .await?
                    .applied();
                if !ok {
                    conflicted = true;
                    break;
                }
                expected = None; // the statics are gone after the first chunk
            }
            if conflicted {
                close_first = true;
                continue;
            }
            // Heartbeat cells written with a timestamp later than the deleting ballot (their
            // stamp is their I-am-alive time, or another program's choice) survive it.
            for cell in self.read_heartbeat_cells(pk, "delete_cluster").await? {
                if let Some(stamp) = cell.delete_stamp() {
                    self.delete_heartbeat_cell(pk, &cell.key, stamp, "delete_cluster")
                        .await?;
                }
            }
            return self.check_deleted(pk).await;
        }
        Err(MembershipError::Contention {
            operation: "delete_cluster",
            attempts: MAX_ATTEMPTS,
            elapsed: started.elapsed(),
        })
    }

    /// `delete_cluster` of a partition that no read can scan for its tombstones
    /// ([`MembershipError::TooManyTombstones`]): one plain partition deletion stamped
    /// [`SHADOW_MARGIN`] in the past, which shadows every row, tombstone and heartbeat cell
    /// written before then, so reads of the partition scan none of those from then on. Stamped
    /// in the past so that no write acknowledged after it (a Paxos ballot of a coordinator whose
    /// clock is behind this one's by less than the margin) falls under it; the fenced path then
    /// deletes whatever is newer.
    async fn shadow_buried_partition(&self, pk: Pk<'_>) -> Result<()> {
        let st = self.statements().await?;
        warn!(
            cluster = pk.cluster_id,
            "the partition holds more tombstones than a read may scan: shadowing it with one partition deletion"
        );
        let stamp = Timestamp::now()
            .saturating_sub(SHADOW_MARGIN)
            .as_millis()
            .saturating_mul(1000);
        self.exec_plain(
            "delete_cluster",
            &st.delete_partition,
            DeletePartitionValues {
                write_time_micros: stamp,
                service_id: pk.service_id,
                cluster_id: pk.cluster_id,
            },
        )
        .await
    }

    /// After `delete_cluster`: forgets the leases of a deleted own cluster, and fails when rows
    /// or the version are left (written later than the delete).
    async fn check_deleted(&self, pk: Pk<'_>) -> Result<()> {
        let cluster_id = pk.cluster_id;
        {
            if cluster_id == self.cluster_id {
                self.forget_all_leases();
            }
            let left = self.read_raw_keys(pk).await?;
            if !left.keys.is_empty() || left.version_etag.is_some() {
                warn!(
                    cluster = cluster_id,
                    rows = left.keys.len(),
                    "delete_cluster left data behind"
                );
                return Err(MembershipError::corrupt(
                    None,
                    format!(
                        "delete_cluster of {cluster_id:?} left {} row(s) ({}){}: they carry write \
                         timestamps later than the delete (written with USING TIMESTAMP in the future, \
                         or a silo still writing); delete them by hand or call delete_cluster again",
                        left.keys.len(),
                        left.keys
                            .iter()
                            .take(5)
                            .cloned()
                            .collect::<Vec<_>>()
                            .join(", "),
                        if left.version_etag.is_some() {
                            " and the version"
                        } else {
                            ""
                        },
                    ),
                ));
            }
        }
        Ok(())
    }
}

//! Removing data: `cleanup_defunct`, `delete_cluster`, and heartbeat-element deletes.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use tracing::Span;

use super::driver_errors::{may_have_applied, to_error};
use super::rows::merge_heartbeat;
use super::values::{
    DeleteClusterValues, DeleteEntryValues, DeleteHeartbeatValues, DeleteStaticsValues, Pk, SiloKey,
};
use super::{CassandraMembershipTable, MAX_ATTEMPTS, bump};
use crate::error::{MembershipError, Result};
use crate::model::{SiloStatus, Timestamp};

/// Rows per conditional batch in `delete_cluster`.
const DELETE_CHUNK: usize = 100;

impl CassandraMembershipTable {
    /// Removes a heartbeat element unless a heartbeat newer than `stamp_micros` was written.
    pub(super) async fn delete_heartbeat(
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

    /// `cleanup_defunct`: conditional deletes of qualifying entries, then empty rows and
    /// orphaned heartbeat elements.
    pub(super) async fn cleanup(&self, before: Timestamp) -> Result<usize> {
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

    /// `delete_cluster`: the partition's rows and statics in conditional batches fenced on the
    /// version, then heartbeat elements stamped after the deleting ballot.
    pub(super) async fn delete_partition(&self, cluster_id: &str) -> Result<()> {
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
                self.forget_all_leases();
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

//! Linearizable reads: paged partition reads whose rows carry the version (checked across pages),
//! single rows and their neighbours, and how a paged read that a write overtook starts over.

use std::collections::BTreeMap;
use std::time::Instant;

use scylla::response::{PagingState, PagingStateResponse};
use scylla::statement::prepared::PreparedStatement;
use tracing::{Span, debug, warn};
use uuid::Uuid;

use super::bind::ReadRowValues;
use super::decode::{
    EntryRow, EntryWithStaticsRow, StaticsRow, StoredEntry, decode_entry, decode_version,
};
use super::etags::row_etag;
use super::heartbeats::{StoredHeartbeat, merge_heartbeat};
use super::{CassandraMembershipTable, MAX_ATTEMPTS, Pk};
use crate::cassandra::exec::Scan;
use crate::error::{MembershipError, Result};
use crate::model::{MembershipRow, MembershipSnapshot, SiloAddress, TableVersion};

/// The largest page a restarted whole-partition read asks for (the options' own maximum): a
/// page's rows are what the read returns anyway, so a larger page costs no memory the result
/// does not, only a larger response.
const LARGEST_PAGE: i32 = 100_000;

/// The page size for the next attempt of a paged read of a partition that a write overtook after
/// it had received `seen` rows in pages of `current`: the partition holds at least `seen` rows
/// and is growing, so twice that most likely takes it in one page — one statement, which reads
/// the partition at one point of its history (a single-partition read is isolated from every
/// write to that partition), so no write can land between its rows. Never smaller than
/// `current`, at most [`LARGEST_PAGE`] (or `current`, if larger).
pub(super) fn larger_page(current: i32, seen: usize) -> i32 {
    let seen = i32::try_from(seen).unwrap_or(i32::MAX);
    current
        .max(seen)
        .saturating_mul(2)
        .min(LARGEST_PAGE.max(current))
        .max(current)
}

/// The pause before attempt `attempt` (0-based) of a read or delete that a write overtook: none
/// before the first two (the second reads with a larger page, most likely in one statement),
/// then a jittered exponential pause (20–40 ms before the third, doubling up to 0.64–1.28 s), so
/// a partition that keeps changing gets a quieter moment, and readers do not retry in lockstep.
/// All pauses of [`MAX_ATTEMPTS`] attempts add up to under 2.6 s.
pub(super) async fn restart_pause(attempt: u32) {
    if attempt < 2 {
        return;
    }
    let ceiling: u64 = 20 << (attempt - 1).min(6);
    let pause = rand::random_range(ceiling / 2..ceiling);
    tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
}

/// A full read of one cluster's partition.
pub(super) struct PartitionRead {
    pub(super) version: TableVersion,
    pub(super) version_etag: Option<Uuid>,
    pub(super) entries: Vec<StoredEntry>,
    /// Keys of rows without an entry (only a heartbeat cell left).
    pub(super) empty_rows: Vec<String>,
    pub(super) heartbeats: BTreeMap<String, StoredHeartbeat>,
    /// Rows holding cells (entries, damaged rows) but no version: rows outlived it (see
    /// `version.rs`). Answering the version absent would restart it at 1.
    pub(super) version_lost: bool,
}

impl PartitionRead {
    pub(super) fn snapshot(&self) -> MembershipSnapshot {
        let mut rows: Vec<MembershipRow> = self
            .entries
            .iter()
            .map(|s| {
                let heartbeat = self.heartbeats.get(&s.entry.address.to_string()).copied();
                MembershipRow {
                    entry: merge_heartbeat(s.entry.clone(), heartbeat),
                    etag: row_etag(s.etag, heartbeat),
                }
            })
            .collect();
        rows.sort_by_key(|r| r.entry.address);
        MembershipSnapshot {
            rows,
            version: self.version.clone(),
        }
    }
}

impl CassandraMembershipTable {
    /// The version's two cells (row `''`), read serially by name.
    pub(super) async fn read_statics(&self, pk: Pk<'_>) -> Result<StaticsRow> {
        let st = self.statements().await?;
        let result = self
            .exec_read("read", &st.read_statics, pk, true, Scan::Part(pk))
            .await?;
        Ok(self
            .first_row(result, None, "read returned no rows result")?
            .unwrap_or(StaticsRow {
                version: None,
                version_etag: None,
            }))
    }

    /// `read_all`: the whole partition as one snapshot; a version lost while entries remain is
    /// an error, never an absent version.
    pub(super) async fn read_snapshot(&self) -> Result<MembershipSnapshot> {
        let read = self.read_partition(self.pk()).await?;
        if read.version_lost {
            return Err(lost_version_error(None));
        }
        let snapshot = read.snapshot();
        Span::current().record("rows", snapshot.rows.len());
        Ok(snapshot)
    }

    /// Reads the whole partition of `cluster_id` as one view: the rows page by page, each page a
    /// serial read; the version is the first page's row `''` (it sorts first). A read of more
    /// than one page reads the version again at its end and starts over if it moved: every
    /// membership write moves it (and its tag is never reused), so an unmoved version proves no
    /// write landed between the pages. A restart asks for pages twice as large as all it saw (see
    /// [`larger_page`]): one page is one statement, a view no write can split, so under any write
    /// load the read needs one restart, two at most while the partition keeps doubling.
    pub(super) async fn read_partition(&self, pk: Pk<'_>) -> Result<PartitionRead> {
        let cluster_id = pk.cluster_id;
        let started = Instant::now();
        let st = self.statements().await?;
        // The rows statement with a larger page, once a read was overtaken.
        let mut larger: Option<PreparedStatement> = None;
        for attempt in 0..MAX_ATTEMPTS {
            restart_pause(attempt).await;
            let read_rows = larger.as_ref().unwrap_or(&st.read_rows);
            let mut version_row: Option<(Option<i64>, Option<Uuid>)> = None;
            let mut entries = Vec::new();
            let mut empty_rows = Vec::new();
            let mut heartbeats = BTreeMap::new();
            // Rows holding an entry (damaged ones too), not bare heartbeat cells.
            let mut entry_rows = 0usize;
            let mut pages = 0u32;
            let mut seen = 0usize;
            let mut page = Some(
                self.read_page(
                    "read",
                    read_rows,
                    pk,
                    PagingState::start(),
                    true,
                    Scan::Whole(pk),
                )
                .await?,
            );
            while let Some((result, next)) = page.take() {
                pages += 1;
                let rows = result.into_rows_result().map_err(|e| {
                    MembershipError::corrupt(None, format!("read returned no rows result: {e}"))
                })?;
                seen = seen.saturating_add(rows.rows_num());
                for row in rows
                    .rows::<EntryWithStaticsRow>()
                    .map_err(|e| self.shape_error(e))?
                {
                    let (row, heartbeat) = row.map_err(|e| self.shape_error(e))?.split();
                    let Some(silo) = row.silo.clone() else {
                        version_row = Some((row.version, row.version_etag));
                        continue;
                    };
                    if let Some(heartbeat) = heartbeat {
                        heartbeats.insert(silo.clone(), heartbeat);
                    }
                    if row.is_empty() {
                        empty_rows.push(silo);
                        continue;
                    }
                    entry_rows += 1;
                    match decode_entry(row) {
                        Ok(e) => entries.push(e),
                        Err((silo, reason)) => {
                            // One damaged row must not hide the whole cluster's membership.
                            warn!(table = %self.shared.qualified, cluster = cluster_id, silo = ?silo, %reason,
                                "skipping a damaged membership row");
                        }
                    }
                }
                if let PagingStateResponse::HasMorePages { state } = next {
                    page = Some(
                        self.read_page("read", read_rows, pk, state, true, Scan::Part(pk))
                            .await?,
                    );
                }
            }
            let view = version_row.unwrap_or((None, None));
            let consistent = pages <= 1 || {
                let now = self.read_statics(pk).await?;
                (now.version, now.version_etag) == view
            };
            if consistent {
                let (version, version_etag) = view;
                return Ok(PartitionRead {
                    version_lost: entry_rows > 0 && version.is_none() && version_etag.is_none(),
                    version: decode_version(version, version_etag)?,
                    version_etag,
                    entries,
                    empty_rows,
                    heartbeats,
                });
            }
            let current = read_rows.get_page_size();
            let next_size = larger_page(current, seen);
            debug!(
                cluster = cluster_id,
                rows_seen = seen,
                page_size = next_size,
                "the version moved during a paged read; reading again"
            );
            if next_size > current {
                let mut statement = st.read_rows.clone();
                statement.set_page_size(next_size);
                larger = Some(statement);
            }
        }
        Err(MembershipError::Contention {
            operation: "read",
            attempts: MAX_ATTEMPTS,
            elapsed: started.elapsed(),
        })
    }

    /// The version's row and the silo's row of one `read_row.cql` (serial or at the commit
    /// level): `(version cells, the silo's row with its heartbeat cell)`.
    async fn read_pair(
        &self,
        key: &str,
        serial: bool,
    ) -> Result<(
        (Option<i64>, Option<Uuid>),
        Option<(EntryRow, Option<StoredHeartbeat>)>,
    )> {
        let st = self.statements().await?;
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
                    service_id: self.service_id(),
                    cluster_id: &self.cluster_id,
                    silo: key,
                },
                serial,
                Scan::Part(self.pk()),
            )
            .await?;
        let rows = result.into_rows_result().map_err(|e| {
            MembershipError::corrupt(Some(key), format!("read returned no rows result: {e}"))
        })?;
        let mut version = (None, None);
        let mut entry = None;
        for row in rows
            .rows::<EntryWithStaticsRow>()
            .map_err(|e| self.shape_error(e))?
        {
            let (row, heartbeat) = row.map_err(|e| self.shape_error(e))?.split();
            match row.silo.as_deref() {
                None => version = (row.version, row.version_etag),
                Some(silo) if silo == key => entry = Some((row, heartbeat)),
                Some(_) => {} // no other key can match the names read
            }
        }
        Ok((version, entry))
    }

    /// One entry with the partition's version and its heartbeat cell, in one query.
    /// `Ok(None)` when the row holds no entry. Damage in this row is an error: the caller asked for it.
    pub(super) async fn read_one(
        &self,
        address: &SiloAddress,
        serial: bool,
    ) -> Result<Option<(StoredEntry, TableVersion, Option<StoredHeartbeat>)>> {
        let key = address.to_string();
        let ((version, version_etag), row) = self.read_pair(&key, serial).await?;
        let Some((row, heartbeat)) = row else {
            return Ok(None);
        };
        if row.is_empty() {
            return Ok(None); // only a heartbeat cell is left: no entry (an insert may take the key)
        }
        if version.is_none() && version_etag.is_none() {
            return Err(lost_version_error(Some(&key)));
        }
        let version = decode_version(version, version_etag)?;
        let stored = decode_entry(row)
            .map_err(|(_, reason)| MembershipError::corrupt(Some(&key), reason))?;
        Ok(Some((stored, version, heartbeat)))
    }

    /// `read_row`: the entry with the version, or the version alone, as one linearizable view —
    /// one serial names read of the two rows. Without a version, and without the entry, the
    /// partition is read whole: entries left without a version are a lost version (an error),
    /// never an absent one (a write would restart it at 1); a partition with none is absent.
    pub(super) async fn read_row_snapshot(
        &self,
        address: &SiloAddress,
    ) -> Result<MembershipSnapshot> {
        let key = address.to_string();
        let ((version, version_etag), row) = self.read_pair(&key, true).await?;
        let row = row.filter(|(row, _)| !row.is_empty());
        if row.is_some() && version.is_none() && version_etag.is_none() {
            return Err(lost_version_error(Some(&key)));
        }
        let Some((row, heartbeat)) = row else {
            if version.is_none() && version_etag.is_none() {
                let whole = self.read_partition(self.pk()).await?;
                if whole.version_lost {
                    return Err(lost_version_error(None));
                }
                return Ok(MembershipSnapshot {
                    rows: Vec::new(),
                    version: whole.version,
                });
            }
            return Ok(MembershipSnapshot {
                rows: Vec::new(),
                version: decode_version(version, version_etag)?,
            });
        };
        let version = decode_version(version, version_etag)?;
        // Damage in this row is an error: the caller asked for it.
        let stored = decode_entry(row)
            .map_err(|(_, reason)| MembershipError::corrupt(Some(&key), reason))?;
        Ok(found(stored, version, heartbeat))
    }
}

/// What a read answers for a partition whose entries outlived the version: never the version
/// as absent (a write would restart it at 1). Reads never write; `initialize` re-creates it.
pub(super) fn lost_version_error(silo: Option<&str>) -> MembershipError {
    MembershipError::corrupt(
        silo,
        "the table version is missing while entries remain (an interrupted delete_cluster, or rows that outlived their version): a silo's initialize re-creates it above any earlier number, delete_cluster removes the rest",
    )
}

/// A snapshot holding one entry, its heartbeat merged in.
fn found(
    stored: StoredEntry,
    version: TableVersion,
    heartbeat: Option<StoredHeartbeat>,
) -> MembershipSnapshot {
    MembershipSnapshot {
        rows: vec![MembershipRow {
            entry: merge_heartbeat(stored.entry, heartbeat),
            etag: row_etag(stored.etag, heartbeat),
        }],
        version,
    }
}

#[cfg(test)]
mod tests {
    use super::{LARGEST_PAGE, larger_page};

    #[test]
    fn a_restart_reads_with_twice_the_rows_seen_and_never_a_smaller_page() {
        // Overtaken after two pages of 1,000: a 4,000-row page takes a 3,000-row partition whole.
        assert_eq!(larger_page(1000, 2000), 4000);
        // An empty page first (nothing seen) still doubles.
        assert_eq!(larger_page(1000, 0), 2000);
        assert_eq!(larger_page(10, 11), 22);
        assert_eq!(larger_page(1000, 80_000), LARGEST_PAGE);
        assert_eq!(larger_page(1000, usize::MAX), LARGEST_PAGE);
        // A configured page above the cap is kept, never shrunk.
        assert_eq!(larger_page(i32::MAX, 5), i32::MAX);
    }
}

//! The heartbeat cell: one cell (`heartbeat`) in each entry's row, written by plain writes
//! outside the versioned view. Its stored form, how a read merges it into the entry, and every
//! read, write and delete of it.

use scylla::response::{PagingState, PagingStateResponse};
use scylla::value::CqlTimestamp;
use scylla::{DeserializeRow, SerializeRow};

use super::decode::row_key;
use super::{CassandraMembershipTable, Pk};
use crate::cassandra::exec::Scan;
use crate::error::{MembershipError, Result};
use crate::model::{MembershipEntry, Timestamp};

/// A heartbeat cell: (the start time of the incarnation that wrote it, its I-am-alive time).
pub(crate) type StoredHeartbeat = (Option<CqlTimestamp>, Option<CqlTimestamp>);

/// The I-am-alive time a read reports: the later of the entry's own and its heartbeat cell,
/// if that cell was written for this incarnation (same start time). A cell of an earlier
/// incarnation at the same address, or a damaged one, is ignored.
pub(crate) fn merge_heartbeat(
    mut entry: MembershipEntry,
    heartbeat: Option<StoredHeartbeat>,
) -> MembershipEntry {
    if let Some((Some(start), Some(time))) = heartbeat
        && start.0 == entry.start_time.as_millis()
    {
        entry.i_am_alive_time = entry.i_am_alive_time.max(Timestamp::from_millis(time.0));
    }
    entry
}

/// A write timestamp Cassandra accepts (it rejects `i64::MIN`).
fn valid_timestamp(micros: i64) -> i64 {
    micros.max(i64::MIN + 1)
}

/// `heartbeat.cql`.
#[derive(SerializeRow)]
struct HeartbeatValues<'a> {
    ttl: i32,
    write_time_micros: i64,
    silo: &'a str,
    heartbeat: (CqlTimestamp, CqlTimestamp),
    service_id: &'a str,
    cluster_id: &'a str,
}

/// `delete_heartbeat_before.cql`.
#[derive(SerializeRow)]
struct DeleteHeartbeatValues<'a> {
    silo: &'a str,
    write_time_micros: i64,
    service_id: &'a str,
    cluster_id: &'a str,
}

/// A heartbeat cell as stored, with its write time (µs) and TTL.
pub(super) struct HeartbeatCell {
    pub(super) key: String,
    pub(super) value: Option<StoredHeartbeat>,
    pub(super) written: Option<i64>,
    pub(super) ttl: Option<i32>,
}

impl HeartbeatCell {
    /// The timestamp to delete this cell with: its write time as read, so a heartbeat written
    /// after the read survives the delete. `None` (no write time): leave it.
    pub(super) fn delete_stamp(&self) -> Option<i64> {
        self.written
    }
}

/// `read_heartbeats.cql`: one row's heartbeat cell with its write time and TTL.
#[derive(DeserializeRow)]
struct HeartbeatCellRow {
    silo: Option<String>,
    heartbeat: Option<StoredHeartbeat>,
    written: Option<i64>,
    ttl: Option<i32>,
}

impl CassandraMembershipTable {
    /// The heartbeat cells of the partition with their write times and TTLs, read at the
    /// commit level (paged): heartbeats are plain writes outside the versioned view, so a
    /// serial read would add a Paxos round and no order.
    pub(super) async fn read_heartbeat_cells(
        &self,
        pk: Pk<'_>,
        operation: &'static str,
    ) -> Result<Vec<HeartbeatCell>> {
        let st = self.statements().await?;
        let mut out = Vec::new();
        let mut paging = PagingState::start();
        let mut scan = Scan::Whole(pk);
        loop {
            let (result, next) = self
                .read_page(operation, &st.read_heartbeats, pk, paging, false, scan)
                .await?;
            scan = Scan::Part(pk);
            let rows = result.into_rows_result().map_err(|e| {
                MembershipError::corrupt(None, format!("heartbeat read returned no rows: {e}"))
            })?;
            for row in rows
                .rows::<HeartbeatCellRow>()
                .map_err(|e| self.shape_error(e))?
            {
                let row = row.map_err(|e| self.shape_error(e))?;
                let (Some(key), Some(value)) = (row_key(row.silo), row.heartbeat) else {
                    continue; // the version's row, or a row without a heartbeat cell
                };
                out.push(HeartbeatCell {
                    key,
                    value: Some(value),
                    written: row.written,
                    ttl: row.ttl,
                });
            }
            match next {
                PagingStateResponse::HasMorePages { state } => paging = state,
                PagingStateResponse::NoMorePages => return Ok(out),
            }
        }
    }

    /// Writes the heartbeat cell of `silo` (`heartbeat.cql`), stamped `write_time_micros`.
    pub(super) async fn write_heartbeat(
        &self,
        pk: Pk<'_>,
        silo: &str,
        heartbeat: (CqlTimestamp, CqlTimestamp),
        ttl: i32,
        write_time_micros: i64,
        operation: &'static str,
    ) -> Result<()> {
        let st = self.statements().await?;
        let values = HeartbeatValues {
            ttl,
            write_time_micros,
            silo,
            heartbeat,
            service_id: pk.service_id,
            cluster_id: pk.cluster_id,
        };
        self.exec_plain(operation, &st.heartbeat, values).await
    }

    /// Rewrites a heartbeat cell unchanged with another TTL, stamped one microsecond after
    /// its own write time: it replaces that cell, a newer heartbeat still wins.
    pub(super) async fn write_heartbeat_cell(
        &self,
        pk: Pk<'_>,
        key: &str,
        value: StoredHeartbeat,
        ttl: i32,
        written_micros: i64,
        operation: &'static str,
    ) -> Result<()> {
        let (Some(start), Some(time)) = value else {
            return Ok(());
        };
        let stamp = valid_timestamp(written_micros.saturating_add(1));
        self.write_heartbeat(pk, key, (start, time), ttl, stamp, operation)
            .await
    }

    /// Removes a heartbeat cell written at `written_micros` (its own write time, as read):
    /// a tombstone wins a tie, and any heartbeat written later survives. Whatever time the
    /// cell's value holds (even `i64::MIN`), the delete's timestamp is a valid one.
    pub(super) async fn delete_heartbeat_cell(
        &self,
        pk: Pk<'_>,
        key: &str,
        written_micros: i64,
        operation: &'static str,
    ) -> Result<()> {
        let st = self.statements().await?;
        let values = DeleteHeartbeatValues {
            silo: key,
            write_time_micros: valid_timestamp(written_micros),
            service_id: pk.service_id,
            cluster_id: pk.cluster_id,
        };
        self.exec_plain(operation, &st.delete_heartbeat_before, values)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_is_deleted_at_its_own_write_time_and_an_undated_one_is_left() {
        let cell = |written| HeartbeatCell {
            key: "a".to_owned(),
            value: Some((Some(CqlTimestamp(1)), Some(CqlTimestamp(5_000)))),
            written,
            ttl: None,
        };
        assert_eq!(cell(Some(7_000_123)).delete_stamp(), Some(7_000_123));
        assert_eq!(cell(None).delete_stamp(), None);
        assert_eq!(valid_timestamp(i64::MIN), i64::MIN + 1);
    }
}

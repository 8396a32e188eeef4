//! The heartbeat element: one element of the partition's static `heartbeats` map per entry,
//! written by plain writes outside the versioned view. Its stored form, how a read merges it
//! into the entry, and every read, write and delete of it.

use std::collections::BTreeMap;

use scylla::value::CqlTimestamp;
use scylla::{DeserializeRow, SerializeRow};

use super::{CassandraMembershipTable, Pk};
use crate::cassandra::exec::Scan;
use crate::error::Result;
use crate::model::{MembershipEntry, Timestamp};

/// A heartbeat element: (the start time of the incarnation that wrote it, its I-am-alive time).
pub(crate) type StoredHeartbeat = (Option<CqlTimestamp>, Option<CqlTimestamp>);

/// The I-am-alive time a read reports: the later of the entry's own and its heartbeat element,
/// if that element was written for this incarnation (same start time). An element of an earlier
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

/// A heartbeat element as stored, with its write time (µs) and TTL.
pub(super) struct HeartbeatCell {
    pub(super) key: String,
    pub(super) value: Option<StoredHeartbeat>,
    pub(super) written: Option<i64>,
    pub(super) ttl: Option<i32>,
    /// `written` is the element's own I-am-alive time, not a write time the server reported
    /// (Cassandra 4.x and ScyllaDB cannot select `WRITETIME` of a map element).
    pub(super) dated_by_value: bool,
}

impl HeartbeatCell {
    /// Elements read without their write times (`read_heartbeat_values.cql`): each is taken to
    /// be written at its own I-am-alive time (µs), as the provider writes every heartbeat; an
    /// element without one cannot be dated and is left alone. TTLs are unknown.
    pub(super) fn without_write_times(
        elements: BTreeMap<String, StoredHeartbeat>,
    ) -> Vec<HeartbeatCell> {
        elements
            .into_iter()
            .map(|(key, value)| HeartbeatCell {
                key,
                written: value.1.map(|t| t.0.saturating_mul(1000)),
                value: Some(value),
                ttl: None,
                dated_by_value: true,
            })
            .collect()
    }

    /// The timestamp to delete this element with: its write time as read, so a heartbeat
    /// written after the read survives the delete. An element the server could not date whose
    /// row is gone is deleted at `now_micros`, or one microsecond past its I-am-alive time if
    /// that is later (what a `patch` re-stamp writes; provider heartbeats are whole
    /// milliseconds): its I-am-alive time need not be its write time, and only its own
    /// incarnation — which has no row, so no membership — writes that key again. `None`: leave
    /// it.
    pub(super) fn delete_stamp(&self, row_exists: bool, now_micros: i64) -> Option<i64> {
        if self.dated_by_value && !row_exists {
            return Some(
                self.written
                    .map_or(now_micros, |w| w.saturating_add(1).max(now_micros)),
            );
        }
        self.written
    }
}

/// `read_heartbeats.cql`: the map and its per-element write times and TTLs, in key order.
#[derive(DeserializeRow)]
pub(super) struct HeartbeatCellsRow {
    pub(super) heartbeats: Option<BTreeMap<String, StoredHeartbeat>>,
    pub(super) written: Option<Vec<Option<i64>>>,
    pub(super) ttls: Option<Vec<Option<i32>>>,
}

impl HeartbeatCellsRow {
    pub(super) fn cells(self) -> Vec<HeartbeatCell> {
        let written = self.written.unwrap_or_default();
        let ttls = self.ttls.unwrap_or_default();
        // Cassandra lists write times and TTLs in the map's key order (UTF-8 byte order, the
        // order of a BTreeMap of Strings).
        self.heartbeats
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(i, (key, value))| HeartbeatCell {
                key,
                value: Some(value),
                written: written.get(i).copied().flatten(),
                ttl: ttls.get(i).copied().flatten(),
                dated_by_value: false,
            })
            .collect()
    }
}

impl CassandraMembershipTable {
    /// The heartbeat elements of the partition, read at the commit level: heartbeats are plain
    /// writes outside the versioned view, so a serial read would add a Paxos round and no order.
    pub(super) async fn read_heartbeats(
        &self,
        pk: Pk<'_>,
        operation: &'static str,
    ) -> Result<BTreeMap<String, StoredHeartbeat>> {
        let st = self.statements().await?;
        let result = self
            .exec_read(
                operation,
                &st.read_heartbeat_values,
                pk,
                false,
                Scan::Part(pk),
            )
            .await?;
        let row: Option<(Option<BTreeMap<String, StoredHeartbeat>>,)> =
            self.first_row(result, None, "heartbeat read")?;
        Ok(row.and_then(|(m,)| m).unwrap_or_default())
    }

    /// The heartbeat elements with their write times and TTLs. Where the server refuses to read
    /// them (ScyllaDB), each element's write time is taken to be its own I-am-alive time — the
    /// timestamp every heartbeat of the provider is written with — and its TTL is unknown.
    pub(super) async fn read_heartbeat_cells(
        &self,
        pk: Pk<'_>,
        operation: &'static str,
    ) -> Result<Vec<HeartbeatCell>> {
        let st = self.statements().await?;
        let Some(read_heartbeats) = &st.read_heartbeats else {
            return Ok(HeartbeatCell::without_write_times(
                self.read_heartbeats(pk, operation).await?,
            ));
        };
        let result = self
            .exec_read(operation, read_heartbeats, pk, false, Scan::Part(pk))
            .await?;
        Ok(self
            .first_row::<HeartbeatCellsRow>(result, None, "heartbeat read")?
            .map(HeartbeatCellsRow::cells)
            .unwrap_or_default())
    }

    /// Writes the element of `silo` (`heartbeat.cql`), stamped `write_time_micros`.
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

    /// Rewrites a heartbeat element unchanged with another TTL, stamped one microsecond after
    /// its own write time: it replaces that element, a newer heartbeat still wins.
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

    /// Removes a heartbeat element written at `written_micros` (its own write time, as read):
    /// a tombstone wins a tie, and any heartbeat written later survives. Whatever time the
    /// element's value holds (even `i64::MIN`), the delete's timestamp is a valid one.
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
    fn without_write_times_an_element_is_dated_by_its_own_i_am_alive_time() {
        let cells = HeartbeatCell::without_write_times(BTreeMap::from([
            (
                "a".to_owned(),
                (Some(CqlTimestamp(1)), Some(CqlTimestamp(5_000))),
            ),
            ("b".to_owned(), (Some(CqlTimestamp(1)), None)),
            ("c".to_owned(), (None, Some(CqlTimestamp(i64::MIN)))),
        ]));
        let written: Vec<_> = cells.iter().map(|c| (c.key.as_str(), c.written)).collect();
        assert_eq!(
            written,
            [("a", Some(5_000_000)), ("b", None), ("c", Some(i64::MIN))]
        );
        assert!(cells.iter().all(|c| c.ttl.is_none()));
    }

    #[test]
    fn an_undated_element_without_a_row_is_deleted_now_and_every_other_at_its_write_time() {
        let now = 9_000_000;
        let undated = HeartbeatCell::without_write_times(BTreeMap::from([
            (
                "old".to_owned(),
                (Some(CqlTimestamp(1)), Some(CqlTimestamp(5_000))),
            ),
            (
                "ahead".to_owned(),
                (Some(CqlTimestamp(1)), Some(CqlTimestamp(20_000))),
            ),
            ("damaged".to_owned(), (Some(CqlTimestamp(1)), None)),
        ]));
        let stamps: Vec<_> = undated
            .iter()
            .map(|c| {
                (
                    c.key.as_str(),
                    c.delete_stamp(false, now),
                    c.delete_stamp(true, now),
                )
            })
            .collect();
        assert_eq!(
            stamps,
            [
                // A row still there: the element's own time, or nothing when it has none.
                ("ahead", Some(20_000_001), Some(20_000_000)),
                ("damaged", Some(now), None),
                ("old", Some(now), Some(5_000_000)),
            ]
        );
        let dated = HeartbeatCellsRow {
            heartbeats: Some(BTreeMap::from([(
                "a".to_owned(),
                (Some(CqlTimestamp(1)), Some(CqlTimestamp(5_000))),
            )])),
            written: Some(vec![Some(7_000_123)]),
            ttls: Some(vec![None]),
        }
        .cells();
        assert_eq!(dated[0].delete_stamp(false, now), Some(7_000_123));
        assert_eq!(dated[0].delete_stamp(true, now), Some(7_000_123));
    }
}

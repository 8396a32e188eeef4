//! Heartbeat elements as stored: each element of the `heartbeats` map with its write time and
//! TTL (`read_heartbeats.cql`), or dated by its own I-am-alive time where the server cannot say
//! (`read_heartbeat_values.cql`). Read by defunct cleanup and by `patch`.

use std::collections::BTreeMap;

use scylla::DeserializeRow;

use crate::cassandra::rows::StoredHeartbeat;

/// A heartbeat element as stored, with its write time (µs) and TTL.
pub(crate) struct HeartbeatCell {
    pub(crate) key: String,
    pub(crate) value: Option<StoredHeartbeat>,
    pub(crate) written: Option<i64>,
    pub(crate) ttl: Option<i32>,
}

impl HeartbeatCell {
    /// Elements read without their write times (`read_heartbeat_values.cql`): each is taken to
    /// be written at its own I-am-alive time (µs), as the provider writes every heartbeat; an
    /// element without one cannot be dated and is left alone. TTLs are unknown.
    pub(crate) fn without_write_times(
        elements: BTreeMap<String, StoredHeartbeat>,
    ) -> Vec<HeartbeatCell> {
        elements
            .into_iter()
            .map(|(key, value)| HeartbeatCell {
                key,
                written: value.1.map(|t| t.0.saturating_mul(1000)),
                value: Some(value),
                ttl: None,
            })
            .collect()
    }
}

/// `read_heartbeats.cql`: the map and its per-element write times and TTLs, in key order.
#[derive(DeserializeRow)]
pub(crate) struct HeartbeatCellsRow {
    pub(crate) heartbeats: Option<BTreeMap<String, StoredHeartbeat>>,
    pub(crate) written: Option<Vec<Option<i64>>>,
    pub(crate) ttls: Option<Vec<Option<i32>>>,
}

impl HeartbeatCellsRow {
    pub(crate) fn cells(self) -> Vec<HeartbeatCell> {
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
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_write_times_an_element_is_dated_by_its_own_i_am_alive_time() {
        use scylla::value::CqlTimestamp;
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
}

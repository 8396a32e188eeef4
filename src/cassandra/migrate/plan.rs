//! What a migration writes for one old partition, decided from the partition as read and the
//! time since: pure functions, tested without a node. The IO around them is `migrate.rs`.

use std::collections::BTreeMap;
use std::time::Duration;

use scylla::DeserializeRow;
use scylla::value::CqlTimestamp;
use uuid::Uuid;

use super::SkippedCell;
use crate::cassandra::decode::{EntryRow, decode_entry, decode_version};
use crate::cassandra::etags::row_etag;
use crate::cassandra::heartbeats::{StoredHeartbeat, merge_heartbeat};
use crate::model::{MembershipEntry, MembershipRow, MembershipSnapshot, TableVersion, Timestamp};

/// One row of `migrate_read_old.cql`.
#[derive(Debug, DeserializeRow)]
pub(super) struct OldRow {
    pub(super) silo: Option<String>,
    pub(super) etag: Option<Uuid>,
    pub(super) status: Option<i32>,
    pub(super) suspect_times: Option<Vec<(Option<String>, Option<CqlTimestamp>)>>,
    pub(super) proxy_port: Option<i32>,
    pub(super) host_name: Option<String>,
    pub(super) silo_name: Option<String>,
    pub(super) role_name: Option<String>,
    pub(super) update_zone: Option<i32>,
    pub(super) fault_zone: Option<i32>,
    pub(super) start_time: Option<CqlTimestamp>,
    pub(super) i_am_alive: Option<CqlTimestamp>,
    pub(super) etag_ttl: Option<i32>,
    pub(super) etag_written: Option<i64>,
    pub(super) version: Option<i64>,
    pub(super) version_etag: Option<Uuid>,
    pub(super) version_ttl: Option<i32>,
    pub(super) version_written: Option<i64>,
}

/// `migrate_old_heartbeats.cql` (`written` and `ttls` absent with the fallback statement).
#[derive(Debug, DeserializeRow)]
pub(super) struct OldHeartbeatsRow {
    pub(super) heartbeats: Option<BTreeMap<String, StoredHeartbeat>>,
    pub(super) written: Option<Vec<Option<i64>>>,
    pub(super) ttls: Option<Vec<Option<i32>>>,
}

/// `migrate_old_heartbeat_values.cql`.
#[derive(Debug, DeserializeRow)]
pub(super) struct OldHeartbeatValuesRow {
    pub(super) heartbeats: Option<BTreeMap<String, StoredHeartbeat>>,
}

/// A stored cell's value with its write time (µs) and remaining TTL as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Dated<T> {
    pub(super) value: T,
    pub(super) written: Option<i64>,
    pub(super) ttl: Option<i32>,
}

/// One old partition as read.
#[derive(Debug, Default)]
pub(super) struct OldPartition {
    pub(super) rows: Vec<OldRow>,
    pub(super) heartbeats: BTreeMap<String, Dated<StoredHeartbeat>>,
    pub(super) heartbeats_dated_by_value: bool,
}

/// A write of the copy, with its timestamp (µs) and TTL (0: none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum CopyWrite {
    Version {
        version: i64,
        version_etag: Uuid,
        written: i64,
        ttl: i32,
    },
    Entry {
        silo: String,
        entry: MembershipEntry,
        etag: Uuid,
        written: i64,
        ttl: i32,
    },
    Heartbeat {
        silo: String,
        value: StoredHeartbeat,
        written: i64,
        ttl: i32,
    },
}

/// What to write for one cluster, and what the provider must read back afterwards.
#[derive(Debug)]
pub(super) struct ClusterCopy {
    pub(super) writes: Vec<CopyWrite>,
    pub(super) expected: MembershipSnapshot,
    pub(super) skipped: Vec<SkippedCell>,
    pub(super) last_activity: Option<(Timestamp, Option<String>)>,
}

impl ClusterCopy {
    /// The latest write time (µs) among the cells it copies.
    pub(super) fn latest_write_micros(&self) -> Option<i64> {
        self.writes
            .iter()
            .map(|w| match w {
                CopyWrite::Version { written, .. }
                | CopyWrite::Entry { written, .. }
                | CopyWrite::Heartbeat { written, .. } => *written,
            })
            .max()
    }

    /// The latest write time (µs) among the version and entry cells it copies (what a silo
    /// joining the target would write after; see `rerun.rs`).
    pub(super) fn latest_membership_write_micros(&self) -> Option<i64> {
        self.writes
            .iter()
            .filter_map(|w| match w {
                CopyWrite::Version { written, .. } | CopyWrite::Entry { written, .. } => {
                    Some(*written)
                }
                CopyWrite::Heartbeat { .. } => None,
            })
            .max()
    }

    /// How many of its writes are of one kind.
    pub(super) fn count(&self, kind: fn(&CopyWrite) -> bool) -> usize {
        self.writes.iter().filter(|w| kind(w)).count()
    }
}

/// The TTL to copy a cell with, `elapsed` after it was read: 0 for a cell that had none, `None`
/// for one that has expired since.
pub(super) fn remaining_ttl(ttl: Option<i32>, elapsed: Duration) -> Option<i32> {
    match ttl {
        None => Some(0),
        Some(t) if t <= 0 => Some(0),
        Some(t) => {
            // Whole seconds rounded up: a copy never outlives its source cell.
            let secs = elapsed.as_secs() + u64::from(elapsed.subsec_nanos() > 0);
            let left = i64::from(t) - i64::try_from(secs).unwrap_or(i64::MAX);
            (left > 0).then(|| i32::try_from(left).unwrap_or(i32::MAX))
        }
    }
}

pub(super) fn later(
    a: Option<(Timestamp, Option<String>)>,
    t: Timestamp,
    silo: Option<&str>,
) -> Option<(Timestamp, Option<String>)> {
    match a {
        Some((at, _)) if at >= t => a,
        _ => Some((t, silo.map(str::to_owned))),
    }
}

/// Decides the copy of one old partition read `elapsed` ago: the version, every entry that
/// decodes and has not expired meanwhile, and the heartbeat cell of each copied entry.
pub(super) fn plan_cluster(old: &OldPartition, elapsed: Duration) -> ClusterCopy {
    let mut writes = Vec::new();
    let mut skipped = Vec::new();
    let mut last: Option<(Timestamp, Option<String>)> = None;
    let mut version = TableVersion::absent();
    // Static cells repeat on every row: the first row says them.
    if let Some(first) = old.rows.first() {
        match decode_version(first.version, first.version_etag) {
            Ok(v) if v == TableVersion::absent() => {}
            Ok(v) => match (first.version, first.version_etag, first.version_written) {
                (Some(n), Some(tag), Some(written)) => {
                    last = later(last, Timestamp::from_millis(written / 1000), None);
                    match remaining_ttl(first.version_ttl, elapsed) {
                        Some(ttl) => {
                            writes.push(CopyWrite::Version {
                                version: n,
                                version_etag: tag,
                                written,
                                ttl,
                            });
                            version = v;
                        }
                        None => skip(
                            &mut skipped,
                            None,
                            "the version expired during the migration".into(),
                        ),
                    }
                }
                _ => skip(&mut skipped, None, "the version has no write time".into()),
            },
            Err(e) => skip(&mut skipped, None, e.to_string()),
        }
    }
    let mut rows = Vec::new();
    for r in &old.rows {
        let Some(silo) = r.silo.clone().filter(|s| !s.is_empty()) else {
            continue; // the partition's statics alone
        };
        let row = EntryRow {
            silo: Some(silo.clone()),
            version: None,
            version_etag: None,
            etag: r.etag,
            status: r.status,
            suspect_times: r.suspect_times.clone(),
            proxy_port: r.proxy_port,
            host_name: r.host_name.clone(),
            silo_name: r.silo_name.clone(),
            role_name: r.role_name.clone(),
            update_zone: r.update_zone,
            fault_zone: r.fault_zone,
            start_time: r.start_time,
            i_am_alive: r.i_am_alive,
        };
        if row.is_empty() {
            continue;
        }
        let stored = match decode_entry(row) {
            Ok(s) => s,
            Err((_, reason)) => {
                skip(&mut skipped, Some(&silo), reason);
                continue;
            }
        };
        let Some(written) = r.etag_written else {
            skip(
                &mut skipped,
                Some(&silo),
                "the entry has no write time".into(),
            );
            continue;
        };
        let Some(ttl) = remaining_ttl(r.etag_ttl, elapsed) else {
            skip(
                &mut skipped,
                Some(&silo),
                "the entry expired during the migration".into(),
            );
            continue;
        };
        last = later(last, stored.entry.i_am_alive_time, Some(&silo));
        last = later(last, Timestamp::from_millis(written / 1000), Some(&silo));
        let mut heartbeat = None;
        if let Some(hb) = old.heartbeats.get(&silo) {
            // Dated by value (Cassandra 4.x): its TTL is the entry's, whose lease it extends.
            let element_ttl = if old.heartbeats_dated_by_value {
                Some(ttl)
            } else {
                remaining_ttl(hb.ttl, elapsed)
            };
            match (hb.written, element_ttl) {
                (None, _) => skip(
                    &mut skipped,
                    Some(&silo),
                    "the heartbeat has no write time".into(),
                ),
                (Some(_), None) => skip(
                    &mut skipped,
                    Some(&silo),
                    "the heartbeat expired during the migration".into(),
                ),
                (Some(hb_written), Some(hb_ttl)) => {
                    if let Some(alive) = hb.value.1 {
                        last = later(last, Timestamp::from_millis(alive.0), Some(&silo));
                    }
                    last = later(last, Timestamp::from_millis(hb_written / 1000), Some(&silo));
                    heartbeat = Some(hb.value);
                    writes.push(CopyWrite::Heartbeat {
                        silo: silo.clone(),
                        value: hb.value,
                        written: hb_written,
                        ttl: hb_ttl,
                    });
                }
            }
        }
        let copied = MembershipRow {
            entry: merge_heartbeat(stored.entry.clone(), heartbeat),
            etag: row_etag(stored.etag, heartbeat),
        };
        writes.push(CopyWrite::Entry {
            silo,
            entry: stored.entry,
            etag: stored.etag,
            written,
            ttl,
        });
        rows.push(copied);
    }
    for key in old.heartbeats.keys() {
        if !rows.iter().any(|r| &r.entry.address.to_string() == key)
            && !skipped.iter().any(|s| s.silo.as_deref() == Some(key))
        {
            skip(
                &mut skipped,
                Some(key),
                "a heartbeat without an entry (not copied)".into(),
            );
        }
    }
    rows.sort_by_key(|r| r.entry.address);
    ClusterCopy {
        writes,
        expected: MembershipSnapshot { rows, version },
        skipped,
        last_activity: last,
    }
}

pub(super) fn skip(skipped: &mut Vec<SkippedCell>, silo: Option<&str>, reason: String) {
    skipped.push(SkippedCell {
        silo: silo.map(str::to_owned),
        reason,
    });
}

/// What differs between the snapshot copied and the one read back; `None`: nothing.
pub(super) fn difference(
    expected: &MembershipSnapshot,
    actual: &MembershipSnapshot,
) -> Option<String> {
    if expected.version != actual.version {
        return Some(format!(
            "version: copied {:?}, read back {:?}",
            expected.version, actual.version
        ));
    }
    for row in &expected.rows {
        match actual.get(&row.entry.address) {
            None => return Some(format!("entry {} is missing", row.entry.address)),
            Some(a) if a != row => {
                return Some(format!(
                    "entry {} differs: copied {row:?}, read back {a:?}",
                    row.entry.address
                ));
            }
            Some(_) => {}
        }
    }
    actual
        .rows
        .iter()
        .find(|a| expected.get(&a.entry.address).is_none())
        .map(|a| format!("entry {} was not copied but is there", a.entry.address))
}

#[cfg(test)]
mod tests {
    use super::*;

    const START: i64 = 1_700_000_000_000;

    fn row(silo: &str, written_ms: i64, ttl: Option<i32>) -> OldRow {
        OldRow {
            silo: Some(silo.into()),
            etag: Some(Uuid::from_u128(1)),
            status: Some(3),
            suspect_times: Some(vec![(
                Some("10.0.0.9:1@1".into()),
                Some(CqlTimestamp(START + 5)),
            )]),
            proxy_port: Some(30000),
            host_name: Some("h".into()),
            silo_name: Some("s".into()),
            role_name: Some("r".into()),
            update_zone: Some(1),
            fault_zone: Some(2),
            start_time: Some(CqlTimestamp(START)),
            i_am_alive: Some(CqlTimestamp(START + 10)),
            etag_ttl: ttl,
            etag_written: Some(written_ms * 1000),
            version: Some(4),
            version_etag: Some(Uuid::from_u128(9)),
            version_ttl: Some(500),
            version_written: Some((START + 20) * 1000),
        }
    }

    fn heartbeat(alive_ms: i64, ttl: Option<i32>) -> Dated<StoredHeartbeat> {
        Dated {
            value: (Some(CqlTimestamp(START)), Some(CqlTimestamp(alive_ms))),
            written: Some(alive_ms * 1000),
            ttl,
        }
    }

    #[test]
    fn a_ttl_loses_the_time_since_the_read_and_a_cell_without_one_keeps_none() {
        let second = Duration::from_secs(1);
        assert_eq!(remaining_ttl(None, second * 100), Some(0));
        assert_eq!(remaining_ttl(Some(0), second * 100), Some(0));
        assert_eq!(remaining_ttl(Some(100), second * 30), Some(70));
        assert_eq!(remaining_ttl(Some(100), second * 100), None);
        // Rounded up: a copy never outlives its source cell.
        assert_eq!(
            remaining_ttl(Some(100), Duration::from_millis(999)),
            Some(99)
        );
    }

    #[test]
    fn each_cell_keeps_its_write_time_and_remaining_ttl_and_the_version_comes_first() {
        let old = OldPartition {
            rows: vec![row("10.0.0.1:1@1", START + 10, Some(300))],
            heartbeats: BTreeMap::from([(
                "10.0.0.1:1@1".to_owned(),
                heartbeat(START + 99, Some(200)),
            )]),
            heartbeats_dated_by_value: false,
        };
        let copy = plan_cluster(&old, Duration::from_secs(50));
        assert!(copy.skipped.is_empty(), "{:?}", copy.skipped);
        assert!(matches!(
            copy.writes[0],
            CopyWrite::Version { version: 4, written, ttl: 450, .. } if written == (START + 20) * 1000
        ));
        assert!(copy.writes.iter().any(|w| matches!(
            w,
            CopyWrite::Entry { written, ttl: 250, .. } if *written == (START + 10) * 1000
        )));
        assert!(copy.writes.iter().any(|w| matches!(
            w,
            CopyWrite::Heartbeat { written, ttl: 150, .. } if *written == (START + 99) * 1000
        )));
        // Read back: the heartbeat merged into the entry, the version as it was.
        let entry = &copy.expected.rows[0];
        assert_eq!(
            entry.entry.i_am_alive_time,
            Timestamp::from_millis(START + 99)
        );
        assert_eq!(entry.entry.suspect_times.len(), 1);
        assert_eq!(copy.expected.version.version, 4);
        assert_eq!(
            copy.last_activity,
            Some((
                Timestamp::from_millis(START + 99),
                Some("10.0.0.1:1@1".into())
            ))
        );
    }

    #[test]
    fn a_heartbeat_dated_by_its_value_lives_as_long_as_its_entry() {
        let mut hb = heartbeat(START + 99, None);
        hb.ttl = None;
        let old = OldPartition {
            rows: vec![row("10.0.0.1:1@1", START + 10, Some(300))],
            heartbeats: BTreeMap::from([("10.0.0.1:1@1".to_owned(), hb)]),
            heartbeats_dated_by_value: true,
        };
        let copy = plan_cluster(&old, Duration::ZERO);
        assert!(
            copy.writes
                .iter()
                .any(|w| matches!(w, CopyWrite::Heartbeat { ttl: 300, .. }))
        );
    }

    #[test]
    fn damaged_and_expired_rows_and_heartbeats_without_entries_are_skipped_with_reasons() {
        let mut damaged = row("10.0.0.2:1@1", START, None);
        damaged.status = Some(42);
        let old = OldPartition {
            rows: vec![
                row("10.0.0.1:1@1", START, Some(10)),
                damaged,
                row("10.0.0.3:1@1", START, None),
            ],
            heartbeats: BTreeMap::from([("10.0.0.7:1@1".to_owned(), heartbeat(START, None))]),
            heartbeats_dated_by_value: false,
        };
        let copy = plan_cluster(&old, Duration::from_secs(20));
        let reasons: Vec<_> = copy
            .skipped
            .iter()
            .map(|s| (s.silo.clone().unwrap_or_default(), s.reason.clone()))
            .collect();
        assert!(
            reasons
                .iter()
                .any(|(s, r)| s == "10.0.0.1:1@1" && r.contains("expired")),
            "{reasons:?}"
        );
        assert!(
            reasons
                .iter()
                .any(|(s, r)| s == "10.0.0.2:1@1" && r.contains("unknown status")),
            "{reasons:?}"
        );
        assert!(
            reasons
                .iter()
                .any(|(s, r)| s == "10.0.0.7:1@1" && r.contains("without an entry")),
            "{reasons:?}"
        );
        assert_eq!(copy.expected.rows.len(), 1);
        assert_eq!(
            copy.expected.rows[0].entry.address.to_string(),
            "10.0.0.3:1@1"
        );
    }

    #[test]
    fn a_copy_that_reads_back_otherwise_names_the_difference() {
        let old = OldPartition {
            rows: vec![row("10.0.0.1:1@1", START, None)],
            ..OldPartition::default()
        };
        let expected = plan_cluster(&old, Duration::ZERO).expected;
        assert_eq!(difference(&expected, &expected), None);
        let mut other = expected.clone();
        other.rows[0].entry.silo_name = "other".into();
        assert!(difference(&expected, &other).unwrap().contains("differs"));
        other.rows.clear();
        assert!(difference(&expected, &other).unwrap().contains("missing"));
        let mut moved = expected.clone();
        moved.version = moved.version.next();
        assert!(difference(&expected, &moved).unwrap().contains("version"));
    }
}

//! What Cassandra says about the tombstones a read scanned: the warning it attaches to a read
//! past `tombstone_warn_threshold`, kept per cluster as the distance to the cliff, and the
//! failure past `tombstone_failure_threshold`, told apart from other failures.

use std::collections::HashMap;
use std::sync::Mutex;

use scylla::errors::{DbError, ExecutionError, RequestAttemptError};

use super::Pk;
use crate::error::MembershipError;

/// Per partition (service, cluster) of one table: the tombstones one statement of a recent read
/// of it reported scanning.
#[derive(Debug, Default)]
pub(super) struct Scanned(Mutex<HashMap<(String, String), Seen>>);

/// What reads of one partition reported.
#[derive(Clone, Copy, Debug)]
struct Seen {
    /// The largest count one statement of the latest warning read reported.
    count: u64,
    /// Whole-partition reads since then that carried no warning.
    silent: u32,
}

/// Whole-partition reads without a warning that clear a count. More than one: on a ring only
/// the replica that serves the data read warns, and a warning of a remote replica does not
/// reach the client (unless the nodes run with `read_thresholds_enabled`), so one silent answer
/// proves nothing; several in a row do not prove it either, but make a stale count unlikely.
const SILENT_READS_TO_CLEAR: u32 = 3;

fn key(pk: Pk<'_>) -> (String, String) {
    (pk.service_id.to_owned(), pk.cluster_id.to_owned())
}

impl Scanned {
    pub(super) fn get(&self, pk: Pk<'_>) -> Option<u64> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&key(pk))
            .map(|s| s.count)
    }

    /// A statement of a read of `pk`'s partition answered with `warnings`. `whole`: it read
    /// the partition from its start (a full read's first page): its count replaces the last
    /// one, and its silence counts towards clearing it. A later page or a part read only
    /// raises the count (Cassandra's thresholds apply per statement: the largest is the one
    /// nearest the cliff). Returns the count it reported, if any.
    pub(super) fn record<'a>(
        &self,
        pk: Pk<'_>,
        whole: bool,
        warnings: impl Iterator<Item = &'a str>,
    ) -> Option<u64> {
        let reported = warnings.filter_map(reported_tombstones).max();
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let k = key(pk);
        match (reported, map.get_mut(&k)) {
            (Some(n), Some(seen)) if !whole => {
                seen.count = seen.count.max(n);
                seen.silent = 0;
            }
            (Some(n), _) => {
                map.insert(
                    k,
                    Seen {
                        count: n,
                        silent: 0,
                    },
                );
            }
            (None, Some(seen)) if whole => {
                seen.silent += 1;
                if seen.silent >= SILENT_READS_TO_CLEAR {
                    map.remove(&k);
                }
            }
            (None, _) => {}
        }
        reported
    }
}

/// The tombstone count in one of Cassandra's read warnings, if it is one: "Read 1 live rows and
/// 3001 tombstone cells for query …" (the replica's, every release since 2.x), or the
/// coordinator's when `read_thresholds_enabled` is on (4.1+): "… scanned up to 3001 tombstones
/// and issued tombstone warnings …".
pub(super) fn reported_tombstones(warning: &str) -> Option<u64> {
    let number_before = |marker: &str| -> Option<u64> {
        let (before, _) = warning.split_once(marker)?;
        before.rsplit(' ').next()?.parse().ok()
    };
    number_before(" tombstone cells").or_else(|| number_before(" tombstones and issued"))
}

/// True when the node aborted a read for the tombstones it met: the replica's failure reason
/// `READ_TOO_MANY_TOMBSTONES` in the message (Cassandra 4.0+), or the coordinator's own message
/// when `read_thresholds_enabled` is on ("… scanned over 100001 tombstones and aborted the
/// query …").
pub(super) fn is_overflow(err: &ExecutionError) -> bool {
    matches!(
        err,
        ExecutionError::LastAttemptError(RequestAttemptError::DbError(DbError::ReadFailure { .. }, message))
            if message.to_ascii_lowercase().contains("tombstone")
    )
}

/// True for an error of a buried partition: [`MembershipError::TooManyTombstones`] from a
/// read, or a conditional write whose read was aborted for its tombstones (`Storage`, as
/// conditional writes do not name the partition).
pub(super) fn buried(err: &MembershipError) -> bool {
    match err {
        MembershipError::TooManyTombstones { .. } => true,
        MembershipError::Storage { source, .. } => source
            .downcast_ref::<ExecutionError>()
            .is_some_and(is_overflow),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_is_read_from_cassandras_warning_and_nothing_else() {
        assert_eq!(
            reported_tombstones(
                "Read 1 live rows and 3001 tombstone cells for query SELECT * FROM ks.t WHERE k = 1 LIMIT 5000; token 1 (see tombstone_warn_threshold)"
            ),
            Some(3001)
        );
        assert_eq!(
            reported_tombstones("Aggregation query used without partition key"),
            None
        );
        assert_eq!(reported_tombstones("x tombstone cells"), None);
    }
}

#[cfg(test)]
mod record_tests {
    use super::*;

    const PK: Pk<'static> = Pk {
        service_id: "s",
        cluster_id: "c",
    };
    const W: &str = "Read 1 live rows and 5000 tombstone cells for query x";
    const W2: &str = "Read 1 live rows and 1200 tombstone cells for query x";

    /// Later pages raise the count, never lower it; only several silent whole reads clear it.
    #[test]
    fn pages_raise_the_count_and_only_repeated_silence_clears_it() {
        let s = Scanned::default();
        s.record(PK, true, [W].into_iter());
        s.record(PK, false, [W2].into_iter());
        assert_eq!(s.get(PK), Some(5000));
        for _ in 0..SILENT_READS_TO_CLEAR - 1 {
            s.record(PK, true, std::iter::empty());
            assert_eq!(s.get(PK), Some(5000), "one silent answer proves nothing");
        }
        s.record(PK, false, std::iter::empty());
        assert_eq!(
            s.get(PK),
            Some(5000),
            "a part read's silence counts for nothing"
        );
        s.record(PK, true, std::iter::empty());
        assert_eq!(s.get(PK), None);
        s.record(PK, true, [W2].into_iter());
        assert_eq!(
            s.get(PK),
            Some(1200),
            "a whole read's count replaces the last"
        );
    }
}

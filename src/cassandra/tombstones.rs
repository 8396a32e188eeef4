//! What Cassandra says about the tombstones a read scanned: the warning it attaches to a read
//! past `tombstone_warn_threshold`, kept per cluster as the distance to the cliff, and the
//! failure past `tombstone_failure_threshold`, told apart from other failures.

use std::collections::HashMap;
use std::sync::Mutex;

use scylla::errors::{DbError, ExecutionError, RequestAttemptError};

use super::Pk;

/// Per partition (service, cluster) of one table: the tombstones one statement of the latest
/// read of it reported scanning.
#[derive(Debug, Default)]
pub(super) struct Scanned(Mutex<HashMap<(String, String), u64>>);

fn key(pk: Pk<'_>) -> (String, String) {
    (pk.service_id.to_owned(), pk.cluster_id.to_owned())
}

impl Scanned {
    pub(super) fn get(&self, pk: Pk<'_>) -> Option<u64> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&key(pk))
            .copied()
    }

    /// A statement of a read of `pk`'s partition answered with `warnings`. `whole`: it
    /// scanned the whole partition from its start (a full read's first page), so a statement
    /// without a tombstone warning proves the partition is below the warning threshold now.
    /// Returns the count it reported, if any.
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
        match reported {
            Some(n) => {
                map.insert(key(pk), n);
            }
            None if whole => {
                map.remove(&key(pk));
            }
            None => {}
        }
        reported
    }
}

/// The tombstone count in one of Cassandra's read warnings, if it is one: "Read 1 live rows and
/// 3001 tombstone cells for query …" (the replica's, every release since 2.x).
pub(super) fn reported_tombstones(warning: &str) -> Option<u64> {
    let before = warning.split(" tombstone cells").next()?;
    if before.len() == warning.len() {
        return None;
    }
    before.rsplit(' ').next()?.parse().ok()
}

/// True when the node aborted a read for the tombstones it met.
pub(super) fn is_overflow(err: &ExecutionError) -> bool {
    matches!(
        err,
        ExecutionError::LastAttemptError(RequestAttemptError::DbError(DbError::ReadFailure { .. }, message))
            if message.contains("TOMBSTONE")
    )
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

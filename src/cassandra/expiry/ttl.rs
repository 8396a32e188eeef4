//! TTL arithmetic and the rules every expiry decision shares: the configuration's TTLs
//! ([`TtlRules`]: what it writes, what it accepts as its own), the seconds left to something
//! by its last sign of life, the TTLs Cassandra accepts, and the floors a write keeps — never
//! shorter than what is stored, none where there is none, the version outliving every row.
//! Pure: no IO, no clock.

use crate::cassandra::options::{CassandraClusteringOptions, MAX_TTL_SECONDS};
use crate::model::Timestamp;

/// The TTL settings of one configuration, as every decision reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct TtlRules {
    /// Expiry is on (`ttl_seconds()` is some).
    pub(super) expiry_on: bool,
    /// The TTL every write of this configuration carries, in seconds (0 with expiry off).
    pub(super) write_ttl: u64,
    /// How much longer than `write_ttl` a stored TTL may read and still agree: `TTL()` is
    /// computed on the reading coordinator's clock, which may be ahead of the writer's.
    pub(super) tolerance: u64,
}

impl TtlRules {
    /// The rules of these options.
    pub(super) fn of(options: &CassandraClusteringOptions) -> Self {
        TtlRules {
            expiry_on: options.ttl_seconds().is_some(),
            write_ttl: options.write_ttl_seconds(),
            tolerance: options.renewal_seconds(),
        }
    }

    /// The longest TTL this configuration accepts as one it writes.
    pub(super) fn cap(&self) -> u64 {
        self.write_ttl + self.tolerance
    }

    /// True when a row with this remaining TTL expires within what this configuration renews.
    pub(super) fn bounded(&self, ttl: Option<i32>) -> bool {
        match ttl {
            None => false,
            Some(t) => (t.max(0) as u64) <= self.cap(),
        }
    }
}

/// Seconds left to something last alive at `last` had every write carried `write_ttl` seconds;
/// saturating, so no stored time can overflow.
pub(super) fn remaining_seconds(last: Timestamp, now: Timestamp, write_ttl: u64) -> i64 {
    let expires = last
        .as_millis()
        .saturating_add((write_ttl as i64).saturating_mul(1000));
    expires.saturating_sub(now.as_millis()).div_euclid(1000)
}

/// A TTL Cassandra accepts: between 1 s and `max` (itself at most 630,720,000 s).
pub(super) fn clamp_ttl(seconds: i64, max: u64) -> u32 {
    let max = max.clamp(1, MAX_TTL_SECONDS) as i64;
    seconds.clamp(1, max) as u32
}

/// The TTL a membership write gives something that carries `current` now, when this
/// configuration writes `write_ttl`: never shorter than what it has (another silo may rely on a
/// longer TTL, e.g. during a rolling change of DefunctSiloExpiration), and none stays none (a
/// silo with expiry off never renews it).
pub(super) fn keep_longer(current: Option<i32>, write_ttl: i32) -> i32 {
    match current {
        None => 0,
        Some(t) => t.max(write_ttl).clamp(1, MAX_TTL_SECONDS as i32),
    }
}

/// The TTL a renewal gives its silo's own row, which carries `current` now: this silo renews
/// it, so a row without TTL gets one; never shorter than what it has.
pub(super) fn renewed_row_ttl(current: Option<i32>, write_ttl: i32) -> i32 {
    current.map_or(write_ttl, |t| t.max(write_ttl))
}

/// The TTL the version is written with when nothing is known of its current one: none while
/// rows without TTL (or with a longer one) may outlive it, else at least the longest row TTL.
pub(super) fn version_floor_ttl(unbounded_rows: bool, write_ttl: i32, longest_row_ttl: i32) -> i32 {
    if unbounded_rows {
        0
    } else {
        write_ttl.max(longest_row_ttl).min(MAX_TTL_SECONDS as i32)
    }
}

/// The version's TTL for a write that gives a row `row_ttl` and finds the version with
/// `current`, when the version must carry at least `floor` ([`version_floor_ttl`]): never
/// shorter than the version has or than any row, none while any row has none.
pub(super) fn version_ttl_over(floor: i32, current: Option<i32>, row_ttl: i32) -> i32 {
    match current {
        Some(v) if row_ttl > 0 && floor > 0 => v.max(row_ttl).max(floor),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remaining_time_never_overflows() {
        let now = Timestamp::now();
        for t in [i64::MIN, i64::MIN + 1, -1, 0, i64::MAX - 1, i64::MAX] {
            let r = remaining_seconds(Timestamp::from_millis(t), now, 630_720_000);
            let c = clamp_ttl(r, 630_720_000);
            assert!((1..=630_720_000).contains(&c), "{t}: {r} → {c}");
        }
        assert!(remaining_seconds(Timestamp::from_millis(i64::MIN), now, 6) < 0);
        assert_eq!(clamp_ttl(i64::MAX, 6), 6);
        assert_eq!(clamp_ttl(4_102_444_800, 900_000_000), 630_720_000);
    }

    #[test]
    fn durations_are_whole_seconds() {
        let now = Timestamp::from_millis(10_000);
        assert_eq!(remaining_seconds(Timestamp::from_millis(9_000), now, 6), 5);
        assert_eq!(remaining_seconds(Timestamp::from_millis(0), now, 6), -4);
    }

    #[test]
    fn a_stored_ttl_within_the_tolerance_is_one_this_configuration_writes() {
        let rules = TtlRules {
            expiry_on: true,
            write_ttl: 10,
            tolerance: 2,
        };
        assert!(rules.bounded(Some(12)));
        assert!(rules.bounded(Some(-5)));
        assert!(!rules.bounded(Some(13)));
        assert!(!rules.bounded(None));
    }

    #[test]
    fn a_write_never_shortens_a_ttl_and_keeps_none_where_there_is_none() {
        assert_eq!(keep_longer(None, 10), 0);
        assert_eq!(keep_longer(Some(3), 10), 10);
        assert_eq!(keep_longer(Some(30), 10), 30);
        assert_eq!(keep_longer(Some(i32::MAX), 10), MAX_TTL_SECONDS as i32);
        assert_eq!(renewed_row_ttl(None, 10), 10);
        assert_eq!(renewed_row_ttl(Some(30), 10), 30);
    }

    #[test]
    fn the_version_outlives_every_row_and_has_no_ttl_while_a_row_has_none() {
        assert_eq!(version_floor_ttl(true, 10, 50), 0);
        assert_eq!(version_floor_ttl(false, 10, 50), 50);
        assert_eq!(version_floor_ttl(false, 10, 5), 10);
        assert_eq!(version_ttl_over(10, Some(40), 20), 40);
        assert_eq!(version_ttl_over(50, Some(40), 20), 50);
        assert_eq!(version_ttl_over(10, None, 20), 0);
        assert_eq!(version_ttl_over(10, Some(40), 0), 0);
        assert_eq!(version_ttl_over(0, Some(40), 20), 0);
    }
}

//! The rules of the defunct cleanup, pure or one table call each: when it runs
//! ([`CleanupSchedule`]), and the Dead-entry limit of `max_defunct_silo_entries` (which entries are
//! beyond it, and which silo applies it). The task that runs them is `cleanup.rs`.

use std::cmp::Ordering;
use std::net::IpAddr;
use std::time::Duration;

use crate::clock::scale;
use crate::error::Result;
use crate::model::{MembershipEntry, SiloAddress, SiloStatus, Timestamp};
use crate::options::MembershipOptions;
use crate::table::MembershipTable;

/// When the cleanup runs. Pure: the random draws are arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CleanupSchedule {
    period: Duration,
    jitter: Duration,
}

impl CleanupSchedule {
    /// The schedule of these options, `None` when cleanup is disabled.
    pub(crate) fn new(options: &MembershipOptions) -> Option<Self> {
        options
            .defunct_silo_cleanup_period
            .map(|period| CleanupSchedule {
                period,
                jitter: options.defunct_silo_cleanup_jitter,
            })
    }

    /// Delay before the first run: a random point of the first period, so silos started
    /// together do not clean together.
    pub(crate) fn first_delay(&self, unit_random: f64) -> Duration {
        scale(self.period, unit_random.clamp(0.0, 1.0))
    }

    /// Delay between runs: the period plus up to `jitter`. Never shorter than the period, which
    /// is also the cleanup's rate limit.
    pub(crate) fn next_delay(&self, unit_random: f64) -> Duration {
        self.period
            .saturating_add(scale(self.jitter, unit_random.clamp(0.0, 1.0)))
    }
}

/// The smallest step of a [`Timestamp`]: one millisecond (what Cassandra's `timestamp` holds).
/// Orleans adds one .NET tick (100 ns) to the newest entry it removes; ours is this.
pub const TIMESTAMP_TICK: Duration = Duration::from_millis(1);

/// The cutoff that removes the oldest Dead entries beyond `max` (Orleans' `MaxDefunctSiloEntries`
/// rule), `None` when there are at most `max`. Dead entries are ranked by
/// [`MembershipEntry::last_activity`] (Orleans' effective update time: the latest of I-am-alive,
/// start time and suspicion votes, so a silo just declared dead ranks as recent); the cutoff is
/// the time of the newest entry to remove plus one [`TIMESTAMP_TICK`].
///
/// Passed to [`MembershipTable::cleanup_dead_entries`], the cutoff removes every Dead entry
/// older than it, including every one at the same millisecond as the newest removed one:
/// entries tied at the boundary go together, so fewer than `max` may remain. (Orleans passes it
/// to `CleanupDefunctSiloEntries`, which also removes every non-Active entry older than it; a
/// burst of recent deaths puts the cutoff a moment ago, where silos that are starting or
/// stopping right now are, so we remove Dead entries only.)
pub fn excess_dead_cutoff<'a>(
    entries: impl IntoIterator<Item = &'a MembershipEntry>,
    max: u64,
) -> Option<Timestamp> {
    let mut times: Vec<Timestamp> = entries
        .into_iter()
        .filter(|e| e.status == SiloStatus::Dead)
        .map(MembershipEntry::last_activity)
        .collect();
    let keep = usize::try_from(max).unwrap_or(usize::MAX);
    if times.len() <= keep {
        return None;
    }
    // Newest first: the entry at index `keep` is the newest one beyond the limit.
    let (_, newest_removed, _) = times.select_nth_unstable_by(keep, |a, b| b.cmp(a));
    Some(Timestamp::from_millis(
        newest_removed.as_millis().saturating_add(1),
    ))
}

/// Orleans' silo address order: generation, then port, then IP address (IPv4 before IPv6).
/// (Orleans compares an IPv4 address as a little-endian number; we compare its octets in order.
/// Only the silos of one table need to agree, and they all run this code.)
pub fn silo_address_order(a: &SiloAddress, b: &SiloAddress) -> Ordering {
    fn ip_key(ip: IpAddr) -> (u8, [u8; 16]) {
        match ip {
            IpAddr::V4(v4) => (0, v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => (1, v6.octets()),
        }
    }
    a.generation()
        .cmp(&b.generation())
        .then(a.endpoint().port().cmp(&b.endpoint().port()))
        .then(ip_key(a.endpoint().ip()).cmp(&ip_key(b.endpoint().ip())))
}

/// The first Active silo by [`silo_address_order`]: the one that applies the Dead-entry limit.
pub fn first_active_silo<'a>(
    entries: impl IntoIterator<Item = &'a MembershipEntry>,
) -> Option<SiloAddress> {
    entries
        .into_iter()
        .filter(|e| e.status == SiloStatus::Active)
        .map(|e| e.address)
        .min_by(silo_address_order)
}

/// One application of the Dead-entry limit: reads the table, and when it holds more than `max`
/// Dead entries, calls [`MembershipTable::cleanup_dead_entries`] with [`excess_dead_cutoff`].
/// Returns how many entries that removed (0 when within the limit). The caller decides who
/// applies it (Orleans: only the first Active silo, [`first_active_silo`]); both backends give
/// the same result, since the rule needs only `read_all` and `cleanup_dead_entries`.
pub async fn remove_excess_dead_entries(table: &dyn MembershipTable, max: u64) -> Result<usize> {
    let snapshot = table.read_all().await?;
    match excess_dead_cutoff(snapshot.rows.iter().map(|r| &r.entry), max) {
        Some(before) => table.cleanup_dead_entries(before).await,
        None => Ok(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_run_falls_within_the_first_period_and_later_runs_never_faster_than_the_period() {
        let s = CleanupSchedule::new(&MembershipOptions::default()).unwrap();
        assert_eq!(s.first_delay(0.0), Duration::ZERO);
        assert_eq!(s.first_delay(0.5), Duration::from_secs(1800));
        assert_eq!(s.next_delay(0.0), Duration::from_secs(3600));
        assert_eq!(s.next_delay(1.0), Duration::from_secs(3900));
    }

    fn at(address: &str, status: SiloStatus, millis: i64) -> MembershipEntry {
        MembershipEntry::new(
            address.parse().unwrap(),
            status,
            Timestamp::from_millis(millis),
        )
    }

    #[test]
    fn the_cutoff_is_one_tick_after_the_newest_dead_entry_beyond_the_limit() {
        let entries = [
            at("10.0.0.1:1@1", SiloStatus::Dead, 100),
            at("10.0.0.2:1@1", SiloStatus::Dead, 300),
            at("10.0.0.3:1@1", SiloStatus::Dead, 200),
            at("10.0.0.4:1@1", SiloStatus::Joining, 50),
            at("10.0.0.5:1@1", SiloStatus::Active, 10),
        ];
        assert_eq!(excess_dead_cutoff(&entries, 3), None, "within the limit");
        assert_eq!(
            excess_dead_cutoff(&entries, 2),
            Some(Timestamp::from_millis(101))
        );
        assert_eq!(
            excess_dead_cutoff(&entries, 1),
            Some(Timestamp::from_millis(201))
        );
        assert_eq!(
            excess_dead_cutoff(&entries, 0),
            Some(Timestamp::from_millis(301))
        );
        assert_eq!(TIMESTAMP_TICK, Duration::from_millis(1));
        let mut voted = at("10.0.0.6:1@1", SiloStatus::Dead, 0);
        voted.suspect_times.push(crate::model::SuspectTime {
            suspecting_silo: "10.0.0.5:1@1".parse().unwrap(),
            time: Timestamp::from_millis(400),
        });
        let ranked = [entries[0].clone(), voted];
        assert_eq!(
            excess_dead_cutoff(&ranked, 1),
            Some(Timestamp::from_millis(101)),
            "a recent vote ranks an entry as recent"
        );
    }

    #[test]
    fn silos_are_ordered_by_generation_then_port_then_address() {
        let a = |s: &str| -> SiloAddress { s.parse().unwrap() };
        let order = |x: &str, y: &str| silo_address_order(&a(x), &a(y));
        assert_eq!(order("10.0.0.9:9@1", "10.0.0.1:1@2"), Ordering::Less);
        assert_eq!(order("10.0.0.9:1@1", "10.0.0.1:2@1"), Ordering::Less);
        assert_eq!(order("10.0.0.1:1@1", "10.0.0.2:1@1"), Ordering::Less);
        assert_eq!(order("10.0.0.1:1@1", "[::1]:1@1"), Ordering::Less);
        assert_eq!(order("10.0.0.1:1@1", "10.0.0.1:1@1"), Ordering::Equal);
        let entries = [
            at("10.0.0.1:1@5", SiloStatus::Active, 0),
            at("10.0.0.2:1@3", SiloStatus::Active, 0),
            at("10.0.0.3:1@1", SiloStatus::Dead, 0),
        ];
        assert_eq!(first_active_silo(&entries), Some(a("10.0.0.2:1@3")));
        assert_eq!(first_active_silo(&entries[2..]), None);
    }

    #[test]
    fn no_schedule_when_disabled() {
        let o = MembershipOptions {
            defunct_silo_cleanup_period: None,
            ..Default::default()
        };
        assert!(CleanupSchedule::new(&o).is_none());
    }
}

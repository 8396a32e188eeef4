//! The heartbeat's decisions, pure: [`HeartbeatPlanner`] is fed outcomes and times and answers
//! the health to show and the delay until the next heartbeat. No IO, no clock: the task in
//! `heartbeat.rs` runs it on tokio.

use std::time::Duration;

use crate::clock::scale;
use crate::error::MembershipError;
use crate::model::{SiloStatus, Timestamp};
use crate::options::MembershipOptions;
use crate::runtime::health::{FailureCause, SiloHealth};
use crate::table::{HeartbeatOutcome, Lease};

/// The heartbeat's decisions, without IO or clocks: fed outcomes and times, it answers the
/// next health state and the delay until the next heartbeat.
///
/// Times called `now`, `started` or `joined_at` are monotonic: offsets from any fixed origin
/// (the runtime uses tokio's `Instant`), never wall-clock readings, so a wall-clock step moves
/// no deadline. Wall time only enters as the time a heartbeat wrote (`wall_started`), to place
/// the lease's `refresh_by` on the monotonic line.
///
/// The fence horizon ([`HeartbeatPlanner::fence_at`]) is the earliest of
/// - the failure-detection horizon, `num_missed_table_i_am_alive_limit` ×
///   `i_am_alive_table_publish_timeout` after the start of the last successful publish (from
///   then on the others may vote this silo dead), less [`HeartbeatPlanner::fencing_margin`];
/// - the storage lease's `refresh_by` (with storage-side expiry).
#[derive(Clone, Debug)]
pub(crate) struct HeartbeatPlanner {
    period: Duration,
    jitter_percent: u8,
    backoff: Duration,
    detection: Duration,
    margin: Duration,
    lease: Option<Lease>,
    failures: u32,
    last_error: String,
    /// The kind of the last failure.
    last_cause: Option<FailureCause>,
    published_at: Duration,
    /// The largest I-am-alive time written so far. Backends keep the largest stored time, so
    /// after a backward wall-clock step a write that "succeeds" publishes nothing new: the
    /// detection horizon advances only as far as the written time moves past this one.
    published_wall: Option<Timestamp>,
    lease_due: Option<Duration>,
    /// The fence horizon passed (the host was, or must be, told to fence). Only a read of the
    /// own row after a successful publish clears it: meanwhile the others may have declared this
    /// silo dead, and a heartbeat need not look at the row (the Cassandra table checks it once
    /// per renewal interval).
    fenced: bool,
    /// A publish succeeded while fenced: the own row must be read before the fence is lifted.
    awaiting_own_row: bool,
    /// When the last successful publish started (or the join's).
    last_started: Duration,
}

impl HeartbeatPlanner {
    /// A planner for these options; `joined_at` is when the join published the I-am-alive time.
    pub(crate) fn new(options: &MembershipOptions, joined_at: Duration) -> Self {
        HeartbeatPlanner {
            period: options.i_am_alive_table_publish_timeout,
            jitter_percent: options.i_am_alive_jitter_percent,
            backoff: options.heartbeat_retry_backoff,
            detection: Self::detection_horizon(options),
            margin: Self::fencing_margin(options),
            lease: None,
            failures: 0,
            last_error: String::new(),
            last_cause: None,
            published_at: joined_at,
            published_wall: None,
            lease_due: None,
            fenced: false,
            awaiting_own_row: false,
            last_started: joined_at,
        }
    }

    /// The same planner, knowing that the publish at `joined_at` stored the I-am-alive time
    /// `wall` (so later writes of an earlier time, after a backward clock step, move nothing).
    pub(crate) fn with_published_wall(mut self, wall: Timestamp) -> Self {
        self.published_wall = Some(wall);
        self
    }

    /// How long after a silo's last published I-am-alive time the others may start voting it
    /// dead: `num_missed_table_i_am_alive_limit` × `i_am_alive_table_publish_timeout`
    /// (90 s with the defaults).
    pub(crate) fn detection_horizon(options: &MembershipOptions) -> Duration {
        options
            .i_am_alive_table_publish_timeout
            .saturating_mul(options.num_missed_table_i_am_alive_limit)
    }

    /// How much earlier than the detection horizon the host is told to fence: one publish
    /// period, but never so much that the fence comes before the longest healthy heartbeat gap
    /// ([`MembershipOptions::longest_heartbeat_gap`]: 33 s + 30 s with the defaults), so a
    /// healthy silo is never fenced. 27 s with the defaults: fence 63 s after the start of the
    /// last successful publish. Options that leave no margin fail validation.
    pub(crate) fn fencing_margin(options: &MembershipOptions) -> Duration {
        let period = options.i_am_alive_table_publish_timeout;
        period.min(Self::detection_horizon(options).saturating_sub(options.longest_heartbeat_gap()))
    }

    /// The lease last granted.
    pub(crate) fn lease(&self) -> Option<Lease> {
        self.lease
    }

    /// Consecutive failures so far.
    pub(crate) fn failures(&self) -> u32 {
        self.failures
    }

    /// The fence horizon (monotonic): see the type's docs.
    pub(crate) fn fence_at(&self) -> Duration {
        let detection = self
            .published_at
            .saturating_add(self.detection.saturating_sub(self.margin));
        self.lease_due.map_or(detection, |due| due.min(detection))
    }

    /// How long to wait before the next heartbeat. `unit_random` in `[0, 1)` picks the jitter.
    ///
    /// After a success: the period ± jitter from that publish's start. After failures: a backoff doubling from
    /// `heartbeat_retry_backoff` up to the period; just the backoff once the fence horizon has
    /// passed (every second counts then). Never past the fence horizon.
    pub(crate) fn next_delay(&self, now: Duration, unit_random: f64) -> Duration {
        let r = unit_random.clamp(0.0, 1.0);
        let fence_at = self.fence_at();
        let mut delay = if self.fenced || now >= fence_at {
            self.backoff
        } else if self.failures == 0 {
            // Counted from the last publish's start, not its end: a slow call does not push
            // the next one later (the fencing margin assumes this).
            let jitter = scale(self.period, f64::from(self.jitter_percent) / 100.0);
            let interval = (self.period - jitter).saturating_add(scale(jitter, 2.0 * r));
            self.last_started
                .saturating_add(interval)
                .saturating_sub(now)
        } else {
            let exp = self.failures.saturating_sub(1).min(16);
            self.backoff.saturating_mul(1 << exp).min(self.period)
        };
        if fence_at > now {
            delay = delay.min(fence_at - now);
        }
        delay
    }

    /// The health at `now`; `in_flight` when a heartbeat is under way (it counts as a failure
    /// once the fence horizon passes). Once the fence horizon has passed it stays
    /// [`SiloHealth::LeaseAtRisk`] until [`HeartbeatPlanner::on_own_row`] saw the own row live
    /// after a successful publish.
    pub(crate) fn health(&self, now: Duration, in_flight: bool) -> SiloHealth {
        if self.fenced || now >= self.fence_at() {
            SiloHealth::LeaseAtRisk {
                lease: self.lease,
                failures: self.failures.saturating_add(u32::from(in_flight)),
                cause: self
                    .last_cause
                    .filter(|_| self.failures > 0)
                    .or(in_flight.then_some(FailureCause::Outage)),
            }
        } else if self.failures > 0 {
            SiloHealth::Failing {
                failures: self.failures,
                lease: self.lease,
                last_error: self.last_error.clone(),
                cause: self.last_cause.unwrap_or(FailureCause::Other),
            }
        } else if let Some(lease) = self.lease {
            SiloHealth::Healthy { lease }
        } else {
            SiloHealth::Starting
        }
    }

    /// Takes the result of a heartbeat that started at `started` (monotonic) and wrote
    /// `wall_started`, at `now`, and returns the new health.
    pub(crate) fn on_outcome(
        &mut self,
        started: Duration,
        wall_started: Timestamp,
        now: Duration,
        outcome: &Result<HeartbeatOutcome, MembershipError>,
    ) -> SiloHealth {
        if now >= self.fence_at() {
            self.fenced = true;
        }
        match outcome {
            Ok(HeartbeatOutcome::Refreshed { lease }) => {
                self.awaiting_own_row = self.fenced;
                self.failures = 0;
                self.last_started = self.last_started.max(started);
                self.lease = Some(*lease);
                // The others compare the stored time (the largest written) with their clocks.
                match self.published_wall {
                    // Not past what is stored: nothing new published.
                    Some(last) if wall_started <= last => {}
                    Some(last) => {
                        let moved = wall_started.duration_since(last);
                        let at = started.min(self.published_at.saturating_add(moved));
                        self.published_at = self.published_at.max(at);
                        self.published_wall = Some(wall_started);
                    }
                    None => {
                        self.published_at = self.published_at.max(started);
                        self.published_wall = Some(wall_started);
                    }
                }
                self.lease_due = lease
                    .refresh_by
                    .map(|r| started.saturating_add(r.duration_since(wall_started)));
                self.health(now, false)
            }
            Ok(HeartbeatOutcome::DeclaredDead { .. }) => SiloHealth::DeclaredDead,
            Ok(HeartbeatOutcome::NotFound) => SiloHealth::EntryMissing,
            Err(e) => {
                self.failures = self.failures.saturating_add(1);
                self.last_error = e.to_string();
                self.last_cause = Some(FailureCause::of(e));
                self.health(now, false)
            }
        }
    }

    /// True when a publish succeeded after the fence horizon: the host stays fenced until the
    /// own row has been read ([`HeartbeatPlanner::on_own_row`]).
    pub(crate) fn awaiting_own_row(&self) -> bool {
        self.awaiting_own_row
    }

    /// Takes the status of the own row read after a successful publish (`None`: no row) and
    /// returns the new health: final when the row is Dead or gone, the fence lifted when it is
    /// live, still fenced (and one more failure) when the read failed.
    pub(crate) fn on_own_row(
        &mut self,
        now: Duration,
        read: &Result<Option<SiloStatus>, MembershipError>,
    ) -> SiloHealth {
        self.awaiting_own_row = false;
        match read {
            Ok(Some(SiloStatus::Dead)) => SiloHealth::DeclaredDead,
            Ok(None) => SiloHealth::EntryMissing,
            Ok(Some(_)) => {
                self.fenced = false;
                self.health(now, false)
            }
            Err(e) => {
                self.failures = self.failures.saturating_add(1);
                self.last_error = e.to_string();
                self.last_cause = Some(FailureCause::of(e));
                self.health(now, false)
            }
        }
    }

    /// What the host is shown at `now`: [`HeartbeatPlanner::health`], but fenced while the
    /// failure detector reports the own row `unknown` (it could not read it for too long).
    /// `unknown`: the kind of the detector's failures while it cannot read the own row.
    pub(crate) fn shown(
        &self,
        now: Duration,
        in_flight: bool,
        unknown: Option<FailureCause>,
    ) -> SiloHealth {
        match (self.health(now, in_flight), unknown) {
            (
                SiloHealth::Starting | SiloHealth::Healthy { .. } | SiloHealth::Failing { .. },
                Some(cause),
            ) => SiloHealth::LeaseAtRisk {
                lease: self.lease(),
                failures: self.failures().saturating_add(u32::from(in_flight)),
                cause: Some(cause),
            },
            (health, _) => health,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> MembershipOptions {
        MembershipOptions {
            i_am_alive_table_publish_timeout: Duration::from_secs(30),
            ..Default::default()
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn wall(s: i64) -> Timestamp {
        Timestamp::from_millis(1_000_000 + s * 1000)
    }

    fn lease(granted: i64, expires: i64, refresh: i64) -> Lease {
        Lease {
            granted_at: wall(granted),
            expires_at: Some(wall(expires)),
            refresh_by: Some(wall(refresh)),
        }
    }

    fn refreshed(lease: Lease) -> Result<HeartbeatOutcome, MembershipError> {
        Ok(HeartbeatOutcome::Refreshed { lease })
    }

    /// A planner whose first publish, at monotonic 0 and wall 100, was granted a lease to be
    /// refreshed by wall 120 (expiring at 130).
    fn granted_at_wall_100(o: &MembershipOptions) -> HeartbeatPlanner {
        let mut p = HeartbeatPlanner::new(o, Duration::ZERO);
        p.on_outcome(
            Duration::ZERO,
            wall(100),
            Duration::ZERO,
            &refreshed(lease(100, 130, 120)),
        );
        p
    }

    fn err() -> Result<HeartbeatOutcome, MembershipError> {
        Err(MembershipError::config("x", "boom"))
    }

    /// The cause of the last failure is what the host is shown, while failing and once fenced;
    /// a detector that cannot read the own row fences with its own failure's cause.
    #[test]
    fn the_health_names_the_kind_of_the_last_failure() {
        let o = MembershipOptions::default();
        let mut p = HeartbeatPlanner::new(&o, secs(0));
        let buried = Err(MembershipError::TooManyTombstones {
            operation: "read_row",
            service_id: "s".into(),
            cluster_id: "c".into(),
            last_scanned: None,
            source: "aborted".into(),
        });
        assert!(matches!(
            p.on_outcome(secs(1), wall(1), secs(1), &buried),
            SiloHealth::Failing {
                cause: FailureCause::TooManyTombstones,
                ..
            }
        ));
        let outage = Err(MembershipError::Timeout {
            operation: "update_i_am_alive",
            source: "slow".into(),
        });
        assert!(matches!(
            p.on_outcome(secs(2), wall(2), secs(2), &outage),
            SiloHealth::Failing {
                cause: FailureCause::Outage,
                ..
            }
        ));
        assert!(matches!(
            p.health(secs(500), false),
            SiloHealth::LeaseAtRisk {
                cause: Some(FailureCause::Outage),
                ..
            }
        ));
        let fresh = HeartbeatPlanner::new(&o, secs(0));
        assert!(matches!(
            fresh.shown(secs(1), false, Some(FailureCause::TooManyTombstones)),
            SiloHealth::LeaseAtRisk {
                cause: Some(FailureCause::TooManyTombstones),
                failures: 0,
                ..
            }
        ));
        assert_eq!(fresh.shown(secs(1), false, None), SiloHealth::Starting);
    }

    #[test]
    fn horizons_with_the_defaults() {
        let o = MembershipOptions::default();
        assert_eq!(HeartbeatPlanner::detection_horizon(&o), secs(90));
        assert_eq!(o.longest_heartbeat_gap(), secs(63));
        assert_eq!(HeartbeatPlanner::fencing_margin(&o), secs(27));
        let p = HeartbeatPlanner::new(&o, secs(5));
        assert_eq!(p.fence_at(), secs(68), "63 s after the join's publish");
        // Two missed periods with calls of up to a period: no room (validation refuses it).
        let o2 = o.clone().num_missed_table_i_am_alive_limit(2);
        assert_eq!(HeartbeatPlanner::fencing_margin(&o2), Duration::ZERO);
        // With 1 s calls: 60 s - (33 s + 1 s) leaves more than a period.
        let o2 = o2.table_operation_timeout(Some(secs(1)));
        assert_eq!(HeartbeatPlanner::fencing_margin(&o2), secs(26));
        let o1 = o.num_missed_table_i_am_alive_limit(1);
        assert_eq!(HeartbeatPlanner::fencing_margin(&o1), Duration::ZERO);
    }

    #[test]
    fn the_fence_comes_before_the_detection_horizon_with_ttl_off() {
        let o = options();
        let mut p = HeartbeatPlanner::new(&o, Duration::ZERO);
        let h = p.on_outcome(
            secs(10),
            wall(10),
            secs(10),
            &refreshed(Lease::unbounded(wall(10))),
        );
        assert!(matches!(h, SiloHealth::Healthy { .. }));
        assert_eq!(p.fence_at(), secs(73));
        assert!(matches!(
            p.on_outcome(secs(40), wall(40), secs(41), &err()),
            SiloHealth::Failing { failures: 1, .. }
        ));
        assert!(matches!(
            p.health(secs(72), false),
            SiloHealth::Failing { .. }
        ));
        assert_eq!(
            p.health(secs(73), false),
            SiloHealth::LeaseAtRisk {
                lease: Some(Lease::unbounded(wall(10))),
                failures: 1,
                cause: Some(FailureCause::Other),
            }
        );
        // A call in flight at the horizon counts as failed.
        assert!(matches!(
            p.health(secs(73), true),
            SiloHealth::LeaseAtRisk { failures: 2, .. }
        ));
        // Retries never wait past the fence.
        assert_eq!(p.next_delay(secs(72), 0.5), secs(1));
    }

    #[test]
    fn the_fence_is_the_lease_when_it_comes_first_and_a_failed_publish_does_not_move_it() {
        let o = options();
        // Written at wall 100 (monotonic 0); refresh by wall 120: 20 s, before detection's 60 s.
        let mut p = granted_at_wall_100(&o);
        assert_eq!(p.fence_at(), secs(20));
        p.on_outcome(secs(15), wall(115), secs(16), &err());
        assert_eq!(p.fence_at(), secs(20));
        // A lease already due when granted (a renewal that keeps failing) is at risk at once.
        let mut q = HeartbeatPlanner::new(&o, Duration::ZERO);
        let h = q.on_outcome(
            secs(50),
            wall(150),
            secs(50),
            &refreshed(lease(100, 130, 120)),
        );
        assert!(
            matches!(h, SiloHealth::LeaseAtRisk { failures: 0, .. }),
            "{h:?}"
        );
        assert_eq!(q.next_delay(secs(50), 0.5), secs(1), "retried soon");
    }

    #[test]
    fn a_wall_clock_step_moves_no_deadline() {
        let o = options();
        let mut p = granted_at_wall_100(&o);
        // The wall clock jumps back an hour: the next outcomes carry earlier wall times, the
        // monotonic deadline stays.
        p.on_outcome(secs(5), wall(100 - 3600), secs(5), &err());
        assert_eq!(p.fence_at(), secs(20));
        assert!(matches!(
            p.health(secs(20), false),
            SiloHealth::LeaseAtRisk { .. }
        ));
    }

    #[test]
    fn the_detection_horizon_moves_only_as_far_as_the_stored_time() {
        let o = options();
        let mut p = HeartbeatPlanner::new(&o, Duration::ZERO).with_published_wall(wall(100));
        assert_eq!(p.fence_at(), secs(63));
        let ok = refreshed(Lease::unbounded(wall(0)));
        // The wall clock stepped back an hour: nothing newer than wall 100 is stored.
        p.on_outcome(secs(30), wall(100 - 3600 + 30), secs(30), &ok);
        assert_eq!(p.fence_at(), secs(63));
        // A forward step counts no further than the monotonic time that passed.
        p.on_outcome(secs(40), wall(100 + 3600), secs(40), &ok);
        assert_eq!(p.fence_at(), secs(103));
        // Written 5 s past the stored time, 20 s of monotonic time later: 5 s more.
        let mut q = HeartbeatPlanner::new(&o, Duration::ZERO).with_published_wall(wall(100));
        q.on_outcome(secs(20), wall(105), secs(20), &ok);
        assert_eq!(q.fence_at(), secs(68));
    }

    #[test]
    fn delays_stay_within_the_jitter() {
        let p = HeartbeatPlanner::new(&options(), Duration::ZERO);
        let now = Duration::ZERO;
        assert_eq!(p.next_delay(now, 0.0), secs(27));
        assert_eq!(p.next_delay(now, 0.5), secs(30));
        assert!(p.next_delay(now, 0.999) <= secs(33));
    }

    #[test]
    fn failures_back_off_up_to_the_period_and_turn_into_lease_at_risk_at_the_fence() {
        let mut o = options();
        o.num_missed_table_i_am_alive_limit = 10; // detection 300 s: the lease fences first
        let mut p = HeartbeatPlanner::new(&o, Duration::ZERO);
        let granted = lease(0, 100, 90);
        p.on_outcome(Duration::ZERO, wall(0), Duration::ZERO, &refreshed(granted));
        let mut delays = Vec::new();
        for i in 1..=6u64 {
            let h = p.on_outcome(secs(i), wall(i as i64), secs(i), &err());
            assert!(matches!(h, SiloHealth::Failing { failures, .. } if failures == i as u32));
            delays.push(p.next_delay(secs(i), 0.5).as_secs());
        }
        assert_eq!(delays, vec![1, 2, 4, 8, 16, 30]);
        let h = p.on_outcome(secs(90), wall(90), secs(90), &err());
        assert_eq!(
            h,
            SiloHealth::LeaseAtRisk {
                lease: Some(granted),
                failures: 7,
                cause: Some(FailureCause::Other),
            }
        );
        assert_eq!(p.next_delay(secs(90), 0.5), secs(1));
        let h = p.on_outcome(
            secs(91),
            wall(91),
            secs(91),
            &refreshed(lease(91, 191, 181)),
        );
        // Published again, but fenced until the own row has been read.
        assert!(matches!(h, SiloHealth::LeaseAtRisk { failures: 0, .. }));
        assert!(p.awaiting_own_row());
        let h = p.on_own_row(secs(91), &Ok(Some(SiloStatus::Active)));
        assert_eq!(
            h,
            SiloHealth::Healthy {
                lease: lease(91, 191, 181)
            }
        );
        assert_eq!(p.failures(), 0);
    }

    #[test]
    fn after_the_fence_only_a_live_own_row_lifts_it() {
        let o = options();
        let mut p = HeartbeatPlanner::new(&o, Duration::ZERO);
        p.on_outcome(secs(64), wall(64), secs(64), &err());
        let ok = refreshed(Lease::unbounded(wall(65)));
        p.on_outcome(secs(65), wall(65), secs(65), &ok);
        // A failed read keeps the fence; the next publish asks again.
        assert!(matches!(
            p.on_own_row(secs(65), &err().map(|_| None)),
            SiloHealth::LeaseAtRisk { failures: 1, .. }
        ));
        assert!(!p.awaiting_own_row());
        p.on_outcome(secs(66), wall(66), secs(66), &ok);
        assert!(p.awaiting_own_row());
        assert_eq!(
            p.on_own_row(secs(66), &Ok(Some(SiloStatus::Dead))),
            SiloHealth::DeclaredDead
        );
        let mut q = HeartbeatPlanner::new(&o, Duration::ZERO);
        q.on_outcome(secs(64), wall(64), secs(64), &ok);
        assert_eq!(q.on_own_row(secs(64), &Ok(None)), SiloHealth::EntryMissing);
    }

    #[test]
    fn the_next_heartbeat_never_waits_past_the_fence() {
        let mut p = HeartbeatPlanner::new(&options(), Duration::ZERO);
        p.on_outcome(
            Duration::ZERO,
            wall(0),
            Duration::ZERO,
            &refreshed(lease(0, 20, 10)),
        );
        assert_eq!(p.next_delay(secs(4), 0.5), secs(6));
    }

    #[test]
    fn extreme_periods_never_panic() {
        let mut o = options();
        o.i_am_alive_table_publish_timeout = Duration::MAX;
        o.heartbeat_retry_backoff = Duration::MAX;
        o.num_missed_table_i_am_alive_limit = u32::MAX;
        let mut p = HeartbeatPlanner::new(&o, Duration::MAX);
        assert!(p.next_delay(Duration::ZERO, 0.999) >= secs(1));
        p.on_outcome(
            Duration::MAX,
            Timestamp::from_millis(i64::MIN),
            Duration::MAX,
            &err(),
        );
        let _ = p.next_delay(Duration::ZERO, 0.5);
        let _ = p.fence_at();
        let s = crate::runtime::cleanup::CleanupSchedule::new(&MembershipOptions {
            defunct_silo_cleanup_period: Some(Duration::MAX),
            defunct_silo_cleanup_jitter: Duration::MAX,
            ..MembershipOptions::default()
        })
        .unwrap();
        let _ = (s.first_delay(1.0), s.next_delay(1.0));
    }

    #[test]
    fn missing_and_dead_entries_are_final() {
        let mut p = HeartbeatPlanner::new(&options(), Duration::ZERO);
        let z = Duration::ZERO;
        assert!(
            p.on_outcome(z, wall(0), z, &Ok(HeartbeatOutcome::NotFound))
                .is_final()
        );
        assert!(
            p.on_outcome(
                z,
                wall(0),
                z,
                &Ok(HeartbeatOutcome::DeclaredDead {
                    lease: lease(0, 1, 1)
                })
            )
            .is_final()
        );
    }
}

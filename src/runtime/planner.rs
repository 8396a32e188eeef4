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
        options.detection_horizon()
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

    /// Until when (monotonic) the host may serve, `None` while fenced: the fence horizon, unless
    /// the horizon passed at an outcome and no live own row has lifted the fence since. Held by
    /// the host as a deadline, so a question asked after a pause is answered against the clock.
    pub(crate) fn serve_until(&self) -> Option<Duration> {
        (!self.fenced).then(|| self.fence_at())
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
#[path = "planner_tests.rs"]
mod tests;

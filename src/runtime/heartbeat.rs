//! The heartbeat: publishes I-am-alive on schedule, keeps the lease, and tells the host when it
//! must fence itself. The decisions ([`HeartbeatPlanner`]) are pure; [`Heartbeat`] runs them on tokio.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::clock::{Clock, scale};
use crate::error::MembershipError;
use crate::model::{SiloAddress, SiloStatus, Timestamp};
use crate::options::MembershipOptions;
use crate::runtime::observe;
use crate::table::{HeartbeatOutcome, Lease, MembershipTable};

pub use crate::runtime::health::SiloHealth;

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
pub struct HeartbeatPlanner {
    period: Duration,
    jitter_percent: u8,
    backoff: Duration,
    detection: Duration,
    margin: Duration,
    lease: Option<Lease>,
    failures: u32,
    last_error: String,
    published_at: Duration,
    lease_due: Option<Duration>,
}

impl HeartbeatPlanner {
    /// A planner for these options; `joined_at` is when the join published the I-am-alive time.
    pub fn new(options: &MembershipOptions, joined_at: Duration) -> Self {
        HeartbeatPlanner {
            period: options.i_am_alive_table_publish_timeout,
            jitter_percent: options.i_am_alive_jitter_percent,
            backoff: options.heartbeat_retry_backoff,
            detection: Self::detection_horizon(options),
            margin: Self::fencing_margin(options),
            lease: None,
            failures: 0,
            last_error: String::new(),
            published_at: joined_at,
            lease_due: None,
        }
    }

    /// How long after a silo's last published I-am-alive time the others may start voting it
    /// dead: `num_missed_table_i_am_alive_limit` × `i_am_alive_table_publish_timeout`
    /// (90 s with the defaults).
    pub fn detection_horizon(options: &MembershipOptions) -> Duration {
        options
            .i_am_alive_table_publish_timeout
            .saturating_mul(options.num_missed_table_i_am_alive_limit)
    }

    /// How much earlier than the detection horizon the host is told to fence: one publish
    /// period, but at most half of what the horizon leaves after one period, so a healthy
    /// heartbeat always comes before the fence (30 s with the defaults: fence 60 s after the
    /// last successful publish). Zero when `num_missed_table_i_am_alive_limit` is 1.
    pub fn fencing_margin(options: &MembershipOptions) -> Duration {
        let period = options.i_am_alive_table_publish_timeout;
        period.min(Self::detection_horizon(options).saturating_sub(period) / 2)
    }

    /// The lease last granted.
    pub fn lease(&self) -> Option<Lease> {
        self.lease
    }

    /// Consecutive failures so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// The fence horizon (monotonic): see the type's docs.
    pub fn fence_at(&self) -> Duration {
        let detection = self
            .published_at
            .saturating_add(self.detection.saturating_sub(self.margin));
        self.lease_due.map_or(detection, |due| due.min(detection))
    }

    /// How long to wait before the next heartbeat. `unit_random` in `[0, 1)` picks the jitter.
    ///
    /// After a success: the period ± jitter. After failures: a backoff doubling from
    /// `heartbeat_retry_backoff` up to the period; just the backoff once the fence horizon has
    /// passed (every second counts then). Never past the fence horizon.
    pub fn next_delay(&self, now: Duration, unit_random: f64) -> Duration {
        let r = unit_random.clamp(0.0, 1.0);
        let fence_at = self.fence_at();
        let mut delay = if now >= fence_at {
            self.backoff
        } else if self.failures == 0 {
            let jitter = scale(self.period, f64::from(self.jitter_percent) / 100.0);
            (self.period - jitter).saturating_add(scale(jitter, 2.0 * r))
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
    /// once the fence horizon passes).
    pub fn health(&self, now: Duration, in_flight: bool) -> SiloHealth {
        if now >= self.fence_at() {
            SiloHealth::LeaseAtRisk {
                lease: self.lease,
                failures: self.failures.saturating_add(u32::from(in_flight)),
            }
        } else if self.failures > 0 {
            SiloHealth::Failing {
                failures: self.failures,
                lease: self.lease,
                last_error: self.last_error.clone(),
            }
        } else if let Some(lease) = self.lease {
            SiloHealth::Healthy { lease }
        } else {
            SiloHealth::Starting
        }
    }

    /// Takes the result of a heartbeat that started at `started` (monotonic) and wrote
    /// `wall_started`, at `now`, and returns the new health.
    pub fn on_outcome(
        &mut self,
        started: Duration,
        wall_started: Timestamp,
        now: Duration,
        outcome: &Result<HeartbeatOutcome, MembershipError>,
    ) -> SiloHealth {
        match outcome {
            Ok(HeartbeatOutcome::Refreshed { lease }) => {
                self.failures = 0;
                self.lease = Some(*lease);
                // The others compare the time written (taken at `started`) with their clocks.
                self.published_at = self.published_at.max(started);
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
                self.health(now, false)
            }
        }
    }
}

/// Sends `health` unless the current state is final (final states stick) or unchanged.
fn publish(tx: &watch::Sender<SiloHealth>, health: SiloHealth) {
    tx.send_if_modified(|current| {
        if current.is_final() || *current == health {
            return false;
        }
        *current = health;
        true
    });
}

/// Hands what the failure detector read of this silo's own row to the heartbeat.
#[derive(Clone, Debug)]
pub(crate) struct OwnEntryReport(Arc<watch::Sender<SiloHealth>>);

impl OwnEntryReport {
    /// `status` is the own row's status in the detector's snapshot, `None` when it has none.
    /// Dead or missing ends the heartbeat (the watch turns final); anything else says nothing.
    pub(crate) fn own_entry(&self, status: Option<SiloStatus>) {
        match status {
            None => publish(&self.0, SiloHealth::EntryMissing),
            Some(SiloStatus::Dead) => publish(&self.0, SiloHealth::DeclaredDead),
            Some(_) => {}
        }
    }
}

/// A running heartbeat task.
#[derive(Debug)]
pub struct Heartbeat {
    health: watch::Receiver<SiloHealth>,
    health_tx: Arc<watch::Sender<SiloHealth>>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Heartbeat {
    /// Starts heartbeating `address` on `table`. The first heartbeat is immediate. The fence
    /// horizon counts from now: the caller has just published the I-am-alive time (joined).
    pub fn spawn(
        table: Arc<dyn MembershipTable>,
        address: SiloAddress,
        options: &MembershipOptions,
        clock: Arc<dyn Clock>,
    ) -> Heartbeat {
        let (health_tx, health) = watch::channel(SiloHealth::Starting);
        let health_tx = Arc::new(health_tx);
        let (stop, mut stop_rx) = watch::channel(false);
        let origin = Instant::now();
        let mut planner = HeartbeatPlanner::new(options, Duration::ZERO);
        let call_timeout = options.effective_table_operation_timeout();
        let cluster = table.cluster_id().to_owned();
        let tx = Arc::clone(&health_tx);
        let mut final_rx = health_tx.subscribe();
        let task = tokio::spawn(async move {
            let mono = move || origin.elapsed();
            let mut delay = Duration::ZERO;
            // The fence horizon already announced, so it is announced once.
            let mut announced: Option<Duration> = None;
            loop {
                let wake = Instant::now() + delay;
                loop {
                    let fence = planner.fence_at();
                    tokio::select! {
                        biased;
                        _ = stop_rx.changed() => {
                            publish(&tx, SiloHealth::Stopped);
                            return;
                        }
                        _ = final_rx.wait_for(SiloHealth::is_final) => return,
                        _ = tokio::time::sleep_until(wake) => break,
                        _ = tokio::time::sleep_until(origin + fence), if announced != Some(fence) => {
                            announced = Some(fence);
                            let health = planner.health(mono(), false);
                            warn!(%cluster, silo = %address, ?health, "fence horizon passed without a successful heartbeat");
                            publish(&tx, health);
                        }
                    }
                }
                let started = mono();
                let wall_started = clock.now();
                let call = tokio::time::timeout(
                    call_timeout,
                    table.update_i_am_alive(&address, wall_started),
                );
                tokio::pin!(call);
                let outcome = loop {
                    let fence = planner.fence_at();
                    tokio::select! {
                        biased;
                        r = &mut call => break r.unwrap_or_else(|_| Err(MembershipError::Timeout {
                            operation: "update_i_am_alive",
                            source: format!("no answer within {call_timeout:?} (table_operation_timeout)").into(),
                        })),
                        _ = stop_rx.changed() => {
                            publish(&tx, SiloHealth::Stopped);
                            return;
                        }
                        _ = final_rx.wait_for(SiloHealth::is_final) => return,
                        _ = tokio::time::sleep_until(origin + fence), if announced != Some(fence) => {
                            announced = Some(fence);
                            let health = planner.health(mono(), true);
                            warn!(%cluster, silo = %address, ?health, "fence horizon passed during a heartbeat");
                            publish(&tx, health);
                        }
                    }
                };
                let health = planner.on_outcome(started, wall_started, mono(), &outcome);
                observe::heartbeat(&health, clock.now());
                match &health {
                    SiloHealth::Healthy { lease } => {
                        debug!(%cluster, silo = %address, expires_at = ?lease.expires_at, "lease refreshed")
                    }
                    SiloHealth::Failing {
                        failures,
                        last_error,
                        ..
                    } => {
                        warn!(%cluster, silo = %address, failures, error = %last_error, "heartbeat failed; retrying")
                    }
                    SiloHealth::LeaseAtRisk { lease, failures } => {
                        warn!(%cluster, silo = %address, failures, expires_at = ?lease.and_then(|l| l.expires_at),
                            "past the fence horizon: the host must fence itself")
                    }
                    SiloHealth::EntryMissing => {
                        warn!(%cluster, silo = %address, "entry missing; heartbeat stops")
                    }
                    SiloHealth::DeclaredDead => {
                        info!(%cluster, silo = %address, "declared dead; heartbeat stops")
                    }
                    _ => {}
                }
                let done = health.is_final();
                publish(&tx, health);
                if done {
                    return;
                }
                delay = planner.next_delay(mono(), rand::random::<f64>());
            }
        });
        Heartbeat {
            health,
            health_tx,
            stop,
            task,
        }
    }

    /// What the failure detector uses to report this silo's own row.
    pub(crate) fn own_entry_report(&self) -> OwnEntryReport {
        OwnEntryReport(Arc::clone(&self.health_tx))
    }

    /// A receiver of health changes.
    pub fn health(&self) -> watch::Receiver<SiloHealth> {
        self.health.clone()
    }

    /// Stops the heartbeat and waits for it to finish.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        publish(&self.health_tx, SiloHealth::Stopped);
    }

    /// Ends the task at once, as if the process had crashed (for demos and tests).
    pub fn abort(self) {
        self.task.abort();
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

    fn err() -> Result<HeartbeatOutcome, MembershipError> {
        Err(MembershipError::config("x", "boom"))
    }

    #[test]
    fn horizons_with_the_defaults() {
        let o = MembershipOptions::default();
        assert_eq!(HeartbeatPlanner::detection_horizon(&o), secs(90));
        assert_eq!(HeartbeatPlanner::fencing_margin(&o), secs(30));
        let p = HeartbeatPlanner::new(&o, secs(5));
        assert_eq!(p.fence_at(), secs(65), "60 s after the join's publish");
        // Two missed periods allowed: half of what is left after one period.
        let o2 = o.clone().num_missed_table_i_am_alive_limit(2);
        assert_eq!(HeartbeatPlanner::fencing_margin(&o2), secs(15));
        // One: no room for a margin.
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
        assert_eq!(p.fence_at(), secs(70));
        assert!(matches!(
            p.on_outcome(secs(40), wall(40), secs(41), &err()),
            SiloHealth::Failing { failures: 1, .. }
        ));
        assert!(matches!(
            p.health(secs(69), false),
            SiloHealth::Failing { .. }
        ));
        assert_eq!(
            p.health(secs(70), false),
            SiloHealth::LeaseAtRisk {
                lease: Some(Lease::unbounded(wall(10))),
                failures: 1
            }
        );
        // A call in flight at the horizon counts as failed.
        assert!(matches!(
            p.health(secs(70), true),
            SiloHealth::LeaseAtRisk { failures: 2, .. }
        ));
        // Retries never wait past the fence.
        assert_eq!(p.next_delay(secs(69), 0.5), secs(1));
    }

    #[test]
    fn the_fence_is_the_lease_when_it_comes_first_and_a_failed_publish_does_not_move_it() {
        let o = options();
        let mut p = HeartbeatPlanner::new(&o, Duration::ZERO);
        // Written at wall 100 (monotonic 0); refresh by wall 120: 20 s, before detection's 60 s.
        p.on_outcome(
            Duration::ZERO,
            wall(100),
            Duration::ZERO,
            &refreshed(lease(100, 130, 120)),
        );
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
        let mut p = HeartbeatPlanner::new(&o, Duration::ZERO);
        p.on_outcome(
            Duration::ZERO,
            wall(100),
            Duration::ZERO,
            &refreshed(lease(100, 130, 120)),
        );
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
                failures: 7
            }
        );
        assert_eq!(p.next_delay(secs(90), 0.5), secs(1));
        let h = p.on_outcome(
            secs(91),
            wall(91),
            secs(91),
            &refreshed(lease(91, 191, 181)),
        );
        assert_eq!(
            h,
            SiloHealth::Healthy {
                lease: lease(91, 191, 181)
            }
        );
        assert_eq!(p.failures(), 0);
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
        let s = crate::runtime::CleanupSchedule::new(&MembershipOptions {
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

    #[test]
    fn final_states_stick() {
        let (tx, rx) = watch::channel(SiloHealth::Starting);
        let report = OwnEntryReport(Arc::new(tx));
        report.own_entry(Some(SiloStatus::Active));
        assert_eq!(*rx.borrow(), SiloHealth::Starting);
        report.own_entry(Some(SiloStatus::Dead));
        publish(
            &report.0,
            SiloHealth::Healthy {
                lease: Lease::unbounded(wall(0)),
            },
        );
        report.own_entry(None);
        assert_eq!(*rx.borrow(), SiloHealth::DeclaredDead);
    }
}

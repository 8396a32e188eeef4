//! The heartbeat: publishes I-am-alive on schedule, keeps the lease, and tells the host when it
//! must fence itself. The decisions ([`HeartbeatPlanner`]) are pure; [`Heartbeat`] runs them on tokio.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::clock::{Clock, scale};
use crate::error::MembershipError;
use crate::model::{SiloAddress, Timestamp};
use crate::options::MembershipOptions;
use crate::runtime::observe;
use crate::table::{HeartbeatOutcome, Lease, MembershipTable};

// The health type has its own module (metrics read it too); this keeps its published path
// `runtime::heartbeat::SiloHealth`.
pub use crate::runtime::health::SiloHealth;

/// The heartbeat's decisions, without IO or clocks: fed outcomes and times, it answers the
/// next health state and the delay until the next heartbeat.
#[derive(Clone, Debug)]
pub struct HeartbeatPlanner {
    period: Duration,
    jitter_percent: u8,
    backoff: Duration,
    lease: Option<Lease>,
    failures: u32,
}

impl HeartbeatPlanner {
    /// A planner for these options.
    pub fn new(options: &MembershipOptions) -> Self {
        HeartbeatPlanner {
            period: options.i_am_alive_table_publish_timeout,
            jitter_percent: options.i_am_alive_jitter_percent,
            backoff: options.heartbeat_retry_backoff,
            lease: None,
            failures: 0,
        }
    }

    /// The lease last granted.
    pub fn lease(&self) -> Option<Lease> {
        self.lease
    }

    /// Consecutive failures so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// How long to wait before the next heartbeat. `unit_random` in `[0, 1)` picks the jitter.
    ///
    /// After a success: the period ± jitter. After failures: a backoff doubling from
    /// `heartbeat_retry_backoff` up to the period, or just the backoff once the lease is past
    /// `refresh_by` (every second counts then). Never past the lease's `refresh_by`.
    pub fn next_delay(&self, now: Timestamp, unit_random: f64) -> Duration {
        let r = unit_random.clamp(0.0, 1.0);
        let at_risk = self
            .lease
            .and_then(|l| l.refresh_by)
            .is_some_and(|r| now >= r);
        let mut delay = if self.failures > 0 && at_risk {
            self.backoff
        } else if self.failures == 0 {
            let jitter = scale(self.period, f64::from(self.jitter_percent) / 100.0);
            (self.period - jitter).saturating_add(scale(jitter, 2.0 * r))
        } else {
            let exp = self.failures.saturating_sub(1).min(16);
            self.backoff.saturating_mul(1 << exp).min(self.period)
        };
        if let Some(refresh_by) = self.lease.and_then(|l| l.refresh_by)
            && refresh_by > now
        {
            delay = delay.min(refresh_by.duration_since(now));
        }
        delay
    }

    /// Takes a heartbeat's result at `now` and returns the new health.
    pub fn on_outcome(
        &mut self,
        now: Timestamp,
        outcome: &Result<HeartbeatOutcome, MembershipError>,
    ) -> SiloHealth {
        match outcome {
            Ok(HeartbeatOutcome::Refreshed { lease }) => {
                self.failures = 0;
                self.lease = Some(*lease);
                SiloHealth::Healthy { lease: *lease }
            }
            Ok(HeartbeatOutcome::DeclaredDead { .. }) => SiloHealth::DeclaredDead,
            Ok(HeartbeatOutcome::NotFound) => SiloHealth::EntryMissing,
            Err(e) => {
                self.failures = self.failures.saturating_add(1);
                match self.lease {
                    Some(lease) if lease.refresh_by.is_some_and(|r| now >= r) => {
                        SiloHealth::LeaseAtRisk {
                            lease,
                            failures: self.failures,
                        }
                    }
                    lease => SiloHealth::Failing {
                        failures: self.failures,
                        lease,
                        last_error: e.to_string(),
                    },
                }
            }
        }
    }
}

/// A running heartbeat task.
#[derive(Debug)]
pub struct Heartbeat {
    health: watch::Receiver<SiloHealth>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Heartbeat {
    /// Starts heartbeating `address` on `table`. The first heartbeat is immediate.
    pub fn spawn(
        table: Arc<dyn MembershipTable>,
        address: SiloAddress,
        options: &MembershipOptions,
        clock: Arc<dyn Clock>,
    ) -> Heartbeat {
        let (health_tx, health) = watch::channel(SiloHealth::Starting);
        let (stop, mut stop_rx) = watch::channel(false);
        let mut planner = HeartbeatPlanner::new(options);
        let cluster = table.cluster_id().to_owned();
        let task = tokio::spawn(async move {
            let mut delay = Duration::ZERO;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = stop_rx.changed() => {
                        let _ = health_tx.send(SiloHealth::Stopped);
                        return;
                    }
                }
                let now = clock.now();
                let outcome = table.update_i_am_alive(&address, now).await;
                let health = planner.on_outcome(clock.now(), &outcome);
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
                        warn!(%cluster, silo = %address, failures, expires_at = ?lease.expires_at,
                            "heartbeats kept failing: the lease is about to lapse")
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
                let _ = health_tx.send(health);
                if done {
                    return;
                }
                delay = planner.next_delay(clock.now(), rand::random::<f64>());
            }
        });
        Heartbeat { health, stop, task }
    }

    /// A receiver of health changes.
    pub fn health(&self) -> watch::Receiver<SiloHealth> {
        self.health.clone()
    }

    /// Stops the heartbeat and waits for it to finish.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
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

    fn lease(granted: i64, expires: i64, refresh: i64) -> Lease {
        Lease {
            granted_at: Timestamp::from_millis(granted),
            expires_at: Some(Timestamp::from_millis(expires)),
            refresh_by: Some(Timestamp::from_millis(refresh)),
        }
    }

    #[test]
    fn delays_stay_within_the_jitter() {
        let p = HeartbeatPlanner::new(&options());
        let now = Timestamp::from_millis(0);
        assert_eq!(p.next_delay(now, 0.0), Duration::from_secs(27));
        assert_eq!(p.next_delay(now, 0.5), Duration::from_secs(30));
        assert!(p.next_delay(now, 0.999) <= Duration::from_secs(33));
    }

    #[test]
    fn failures_back_off_up_to_the_period_and_turn_into_lease_at_risk() {
        let mut p = HeartbeatPlanner::new(&options());
        let granted = lease(0, 100_000, 90_000);
        p.on_outcome(
            Timestamp::from_millis(0),
            &Ok(HeartbeatOutcome::Refreshed { lease: granted }),
        );
        let err = || Err(MembershipError::config("x", "boom"));
        let mut delays = Vec::new();
        for i in 1..=6 {
            let h = p.on_outcome(Timestamp::from_millis(i * 1000), &err());
            assert!(matches!(h, SiloHealth::Failing { failures, .. } if failures == i as u32));
            delays.push(
                p.next_delay(Timestamp::from_millis(i * 1000), 0.5)
                    .as_secs(),
            );
        }
        assert_eq!(delays, vec![1, 2, 4, 8, 16, 30]);
        // Past refresh_by the host is told to fence, and retries come at the base backoff.
        let h = p.on_outcome(Timestamp::from_millis(90_000), &err());
        assert_eq!(
            h,
            SiloHealth::LeaseAtRisk {
                lease: granted,
                failures: 7
            }
        );
        assert_eq!(
            p.next_delay(Timestamp::from_millis(90_000), 0.5),
            Duration::from_secs(1)
        );
        // A success clears it.
        let h = p.on_outcome(
            Timestamp::from_millis(91_000),
            &Ok(HeartbeatOutcome::Refreshed { lease: granted }),
        );
        assert_eq!(h, SiloHealth::Healthy { lease: granted });
        assert_eq!(p.failures(), 0);
    }

    #[test]
    fn the_next_heartbeat_never_waits_past_refresh_by() {
        let mut p = HeartbeatPlanner::new(&options());
        p.on_outcome(
            Timestamp::from_millis(0),
            &Ok(HeartbeatOutcome::Refreshed {
                lease: lease(0, 20_000, 10_000),
            }),
        );
        assert_eq!(
            p.next_delay(Timestamp::from_millis(4_000), 0.5),
            Duration::from_secs(6)
        );
    }

    #[test]
    fn extreme_periods_never_panic() {
        let mut o = options();
        o.i_am_alive_table_publish_timeout = Duration::MAX;
        o.heartbeat_retry_backoff = Duration::MAX;
        let mut p = HeartbeatPlanner::new(&o);
        assert!(p.next_delay(Timestamp::from_millis(0), 0.999) >= Duration::from_secs(1));
        p.on_outcome(
            Timestamp::from_millis(0),
            &Err(MembershipError::config("x", "y")),
        );
        let _ = p.next_delay(Timestamp::from_millis(0), 0.5);
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
        let mut p = HeartbeatPlanner::new(&options());
        let now = Timestamp::from_millis(0);
        assert!(
            p.on_outcome(now, &Ok(HeartbeatOutcome::NotFound))
                .is_final()
        );
        assert!(
            p.on_outcome(
                now,
                &Ok(HeartbeatOutcome::DeclaredDead {
                    lease: lease(0, 1, 1)
                })
            )
            .is_final()
        );
    }
}

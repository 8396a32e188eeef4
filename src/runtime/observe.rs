//! The runtime's metrics (with the `metrics` feature; no-ops without it): a silo's heartbeats,
//! lease headroom, readiness and fences, and the protocol's lost races. The table's own series
//! and the list of names are in `crate::observe`.

use crate::model::{SiloAddress, Timestamp};
use crate::runtime::health::SiloHealth;
use crate::table::MembershipTable;

/// One silo's series: labelled with its service, cluster and endpoint (`silo="ip:port"`, the
/// same for every incarnation of the endpoint, so a rejoin or a restart reuses its series); the
/// generation is a label of `membership_silo_info` only.
#[derive(Clone, Debug)]
pub(crate) struct SiloMetrics {
    #[cfg(feature = "metrics")]
    labels: crate::observe::imp::Labels,
    #[cfg(feature = "metrics")]
    generation: String,
    /// Set once a headroom was recorded (a silo with an unbounded lease has no such series).
    #[cfg(feature = "metrics")]
    leased: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Set once [`SiloMetrics::stopped`] ran: it zeroes the series once, so a later crash of
    /// an incarnation that already stopped cannot zero its endpoint's next one.
    #[cfg(feature = "metrics")]
    stopped: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// What a change of a silo's health was, for [`SiloMetrics::health_changed`].
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) struct HealthChange {
    /// The new health's `should_serve()`.
    pub(crate) serving: bool,
    /// The silo has just reached `LeaseAtRisk` (it was not there before).
    pub(crate) fenced: bool,
}

impl HealthChange {
    pub(crate) fn between(previous: &SiloHealth, next: &SiloHealth) -> Self {
        let at_risk = |h: &SiloHealth| matches!(h, SiloHealth::LeaseAtRisk { .. });
        HealthChange {
            serving: next.should_serve(),
            fenced: at_risk(next) && !at_risk(previous),
        }
    }
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
impl SiloMetrics {
    /// The series of `silo`: its `membership_silo_info` is 1 and it serves (it is Starting).
    pub(crate) fn new(table: &dyn MembershipTable, silo: &SiloAddress) -> Self {
        crate::observe::describe_once();
        let metrics = SiloMetrics {
            #[cfg(feature = "metrics")]
            labels: crate::observe::imp::Labels::new(table.service_id(), table.cluster_id())
                .with("silo", silo.endpoint().to_string()),
            #[cfg(feature = "metrics")]
            generation: silo.generation().to_string(),
            #[cfg(feature = "metrics")]
            leased: Default::default(),
            #[cfg(feature = "metrics")]
            stopped: Default::default(),
        };
        #[cfg(feature = "metrics")]
        {
            use crate::observe::imp::SILO_SERVING;
            metrics.info(1.0);
            metrics::gauge!(SILO_SERVING, metrics.labels.all()).set(1.0);
        }
        metrics
    }

    #[cfg(feature = "metrics")]
    fn info(&self, value: f64) {
        let labels = self.labels.with("generation", self.generation.clone());
        metrics::gauge!(crate::observe::imp::SILO_INFO, labels.all()).set(value);
    }

    /// The incarnation stopped (left, crashed, declared dead, lost its entry): its gauges go to
    /// 0 — serving, lease headroom (when it had one) and its `membership_silo_info`. The
    /// `metrics` facade cannot remove a series, so exporters keep showing them at 0. Once only.
    pub(crate) fn stopped(&self) {
        #[cfg(feature = "metrics")]
        {
            use std::sync::atomic::Ordering;

            use crate::observe::imp::{LEASE_HEADROOM, SILO_SERVING};
            if self.stopped.swap(true, Ordering::SeqCst) {
                return;
            }
            metrics::gauge!(SILO_SERVING, self.labels.all()).set(0.0);
            if self.leased.load(Ordering::SeqCst) {
                metrics::gauge!(LEASE_HEADROOM, self.labels.all()).set(0.0);
            }
            self.info(0.0);
        }
    }

    /// A heartbeat ended with `health` (before it is shown to the host).
    pub(crate) fn heartbeat(&self, health: &SiloHealth, now: Timestamp) {
        #[cfg(feature = "metrics")]
        {
            use crate::observe::imp::{HEARTBEATS, LEASE_HEADROOM};
            let (outcome, lease) = match health {
                SiloHealth::Healthy { lease } => ("ok", Some(lease)),
                // Distinct from an outage: it does not heal by itself (docs::tombstones).
                SiloHealth::Failing {
                    lease,
                    cause: crate::FailureCause::TooManyTombstones,
                    ..
                }
                | SiloHealth::LeaseAtRisk {
                    lease,
                    cause: Some(crate::FailureCause::TooManyTombstones),
                    ..
                } => ("tombstones", lease.as_ref()),
                SiloHealth::Failing { lease, .. } | SiloHealth::LeaseAtRisk { lease, .. } => {
                    ("failed", lease.as_ref())
                }
                SiloHealth::EntryMissing => ("entry_missing", None),
                SiloHealth::DeclaredDead => ("declared_dead", None),
                SiloHealth::Starting | SiloHealth::Stopped => return,
            };
            // While heartbeats fail the headroom keeps falling (to 0): what an alert watches.
            if let Some(h) = lease.and_then(|l| l.headroom(now)) {
                self.leased.store(true, std::sync::atomic::Ordering::SeqCst);
                metrics::gauge!(LEASE_HEADROOM, self.labels.all()).set(h.as_secs_f64());
            }
            metrics::counter!(HEARTBEATS, self.labels.and(&[("outcome", outcome)])).increment(1);
        }
    }

    /// The health the host sees changed.
    pub(crate) fn health_changed(&self, change: HealthChange) {
        #[cfg(feature = "metrics")]
        {
            use crate::observe::imp::{FENCES, SILO_SERVING};
            metrics::gauge!(SILO_SERVING, self.labels.all())
                .set(f64::from(u8::from(change.serving)));
            if change.fenced {
                metrics::counter!(FENCES, self.labels.all()).increment(1);
            }
        }
    }
}

/// Which protocol step lost a race (the `step` label).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Step {
    /// A join's insert.
    Join,
    /// A status change (Active, ShuttingDown, Dead of the silo's own row).
    Status,
    /// A failure detector's suspicion or death vote on another silo's row.
    Vote,
}

/// A conditional write of the protocol on `table` lost a race (it is retried or given up).
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn conflict(table: &dyn MembershipTable, step: Step) {
    #[cfg(feature = "metrics")]
    {
        let step = match step {
            Step::Join => "join",
            Step::Status => "status",
            Step::Vote => "vote",
        };
        let labels = crate::observe::imp::Labels::new(table.service_id(), table.cluster_id());
        metrics::counter!(
            crate::observe::imp::LWT_CONFLICTS,
            labels.and(&[("step", step)])
        )
        .increment(1);
    }
}

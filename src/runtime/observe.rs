//! The runtime's metrics (with the `metrics` feature; no-ops without it): a silo's heartbeats,
//! lease headroom, readiness and fences, and the protocol's lost races. The table's own series
//! and the list of names are in `crate::observe`.

use crate::model::{SiloAddress, Timestamp};
use crate::runtime::health::SiloHealth;
use crate::table::MembershipTable;

/// One silo's series: labelled with its service, cluster and address.
#[derive(Clone, Debug)]
pub(crate) struct SiloMetrics {
    #[cfg(feature = "metrics")]
    labels: crate::observe::imp::Labels,
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
    pub(crate) fn new(table: &dyn MembershipTable, silo: &SiloAddress) -> Self {
        crate::observe::describe_once();
        SiloMetrics {
            #[cfg(feature = "metrics")]
            labels: crate::observe::imp::Labels::new(table.service_id(), table.cluster_id())
                .with("silo", silo.to_string()),
        }
    }

    /// A heartbeat ended with `health` (before it is shown to the host).
    pub(crate) fn heartbeat(&self, health: &SiloHealth, now: Timestamp) {
        #[cfg(feature = "metrics")]
        {
            use crate::observe::imp::{HEARTBEATS, LEASE_HEADROOM};
            let (outcome, lease) = match health {
                SiloHealth::Healthy { lease } => ("ok", Some(lease)),
                SiloHealth::Failing { lease, .. } | SiloHealth::LeaseAtRisk { lease, .. } => {
                    ("failed", lease.as_ref())
                }
                SiloHealth::EntryMissing => ("entry_missing", None),
                SiloHealth::DeclaredDead => ("declared_dead", None),
                SiloHealth::Starting | SiloHealth::Stopped => return,
            };
            // While heartbeats fail the headroom keeps falling (to 0): what an alert watches.
            if let Some(h) = lease.and_then(|l| l.headroom(now)) {
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

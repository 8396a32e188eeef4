//! Metrics (with the `metrics` feature; no-ops without it). Names are stable and documented in
//! the guide's page `docs::observability`.

#[cfg(not(feature = "metrics"))]
mod imp {
    use crate::model::Timestamp;
    use crate::runtime::health::SiloHealth;

    pub(crate) fn heartbeat(_: &SiloHealth, _: Timestamp) {}
    pub(crate) fn conflict() {}
    pub(crate) fn cleaned(_: usize) {}
}

#[cfg(feature = "metrics")]
mod imp {
    use crate::model::Timestamp;
    use crate::runtime::health::SiloHealth;

    pub(crate) fn heartbeat(health: &SiloHealth, now: Timestamp) {
        let outcome = match health {
            SiloHealth::Healthy { lease } => {
                if let Some(h) = lease.headroom(now) {
                    metrics::gauge!("membership_lease_headroom_seconds").set(h.as_secs_f64());
                }
                "ok"
            }
            SiloHealth::Failing { .. } | SiloHealth::LeaseAtRisk { .. } => "failed",
            SiloHealth::EntryMissing => "entry_missing",
            SiloHealth::DeclaredDead => "declared_dead",
            _ => return,
        };
        metrics::counter!("membership_heartbeats_total", "outcome" => outcome).increment(1);
    }

    pub(crate) fn conflict() {
        metrics::counter!("membership_lwt_conflicts_total").increment(1);
    }

    pub(crate) fn cleaned(n: usize) {
        metrics::counter!("membership_cleanup_removed_total").increment(n as u64);
    }
}

pub(crate) use imp::*;

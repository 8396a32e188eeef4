//! The host runtime: what a silo host runs around the table — heartbeat with leases, defunct
//! cleanup, failure detection, graceful leave — each tested with a fake clock or paused time.
//!
//! A host runs [`Silo`](crate::Silo) and watches its [`SiloHealth`](crate::SiloHealth) (both at
//! the crate root). Public here are the pieces a host assembling its own runtime needs: the
//! [`DefunctCleanup`] task (shared by a process's silos on a table), the rule of
//! `max_defunct_silo_entries` ([`remove_excess_dead_entries`] and its pure parts) and the
//! versioned [`protocol`] steps.

mod cleanup;
mod cleanup_rules;
pub(crate) mod health;
mod heartbeat;
pub(crate) mod jitter;
mod observe;
mod planner;
pub mod protocol;
pub(crate) mod regress;
pub(crate) mod silo;
pub(crate) mod task;
pub(crate) mod view;
pub(crate) mod watcher;

pub use cleanup::{CleanupNotStarted, DefunctCleanup};
pub use cleanup_rules::{
    TIMESTAMP_TICK, excess_dead_cutoff, first_active_silo, remove_excess_dead_entries,
    silo_address_order,
};

/// How long after the start of its last successful publish a silo may serve: the detection
/// horizon less the fencing margin (63 s with the defaults; `docs::fencing`).
#[cfg(feature = "conformance")]
pub(crate) fn fence_offset(options: &crate::options::MembershipOptions) -> std::time::Duration {
    planner::HeartbeatPlanner::detection_horizon(options)
        .saturating_sub(planner::HeartbeatPlanner::fencing_margin(options))
}

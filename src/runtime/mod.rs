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
mod observe;
mod planner;
pub mod protocol;
pub(crate) mod silo;
pub(crate) mod view;
pub(crate) mod watcher;

pub use cleanup::{CleanupNotStarted, DefunctCleanup};
pub use cleanup_rules::{
    TIMESTAMP_TICK, excess_dead_cutoff, first_active_silo, remove_excess_dead_entries,
    silo_address_order,
};

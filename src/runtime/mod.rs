//! The host runtime: what a silo host runs around the table — heartbeat with leases, defunct
//! cleanup, failure detection, graceful leave — each tested with a fake clock or paused time.

pub mod cleanup;
mod health;
pub mod heartbeat;
mod observe;
pub mod protocol;
mod silo;

pub use cleanup::{CleanupNotStarted, CleanupSchedule, DefunctCleanup};
pub use health::SiloHealth;
pub use heartbeat::{Heartbeat, HeartbeatPlanner};
pub use silo::Silo;

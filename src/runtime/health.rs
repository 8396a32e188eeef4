//! [`SiloHealth`]: what the heartbeat knows about this silo's registration, as the host sees it.

use crate::table::Lease;

/// What the heartbeat knows about this silo's registration. Sent on a watch channel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SiloHealth {
    /// No heartbeat has completed yet.
    Starting,
    /// The last heartbeat succeeded; the entry lives at least until `lease.expires_at`.
    Healthy {
        /// The lease the last heartbeat returned.
        lease: Lease,
    },
    /// Heartbeats are failing and being retried; the lease is not yet at risk.
    Failing {
        /// Consecutive failures.
        failures: u32,
        /// The last lease granted, if any.
        lease: Option<Lease>,
        /// The last error, as text.
        last_error: String,
    },
    /// Heartbeats kept failing past the lease's `refresh_by`: the entry may expire at
    /// `lease.expires_at`. The host should fence itself (stop serving as a member).
    LeaseAtRisk {
        /// The last lease granted.
        lease: Lease,
        /// Consecutive failures.
        failures: u32,
    },
    /// The entry is gone (expired, cleaned up or deleted). Final: the heartbeat stopped and
    /// never re-creates the entry.
    EntryMissing,
    /// The entry's status is Dead: the cluster declared this silo dead. Final.
    DeclaredDead,
    /// The heartbeat was stopped by the host.
    Stopped,
}

impl SiloHealth {
    /// True for the states after which the heartbeat has stopped for good.
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            SiloHealth::EntryMissing | SiloHealth::DeclaredDead | SiloHealth::Stopped
        )
    }
}

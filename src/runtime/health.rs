//! What the runtime tells the host about its silo's membership: [`SiloHealth`].

use crate::table::Lease;

/// What the runtime knows about this silo's registration. Sent on a watch channel; see
/// [`docs::fencing`](crate::docs::fencing) for what a host must do on each state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SiloHealth {
    /// No heartbeat has completed yet.
    Starting,
    /// The last heartbeat succeeded; the entry lives at least until `lease.expires_at`.
    Healthy {
        /// The lease the last heartbeat returned.
        lease: Lease,
    },
    /// Heartbeats are failing and being retried; the fence horizon has not been reached.
    Failing {
        /// Consecutive failures.
        failures: u32,
        /// The last lease granted, if any.
        lease: Option<Lease>,
        /// The last error, as text.
        last_error: String,
    },
    /// No heartbeat has succeeded for so long that this silo may soon lose its membership: the
    /// fence horizon (the failure-detection horizon measured from the last successful publish,
    /// less a margin, or the storage lease's `refresh_by`, whichever comes first) has passed.
    /// The host must fence itself (stop serving as a member) until it is `Healthy` again.
    LeaseAtRisk {
        /// The last lease granted, if any.
        lease: Option<Lease>,
        /// Consecutive failures (a call still in flight at the horizon counts as one).
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
    /// True while the host may serve as a member: `Starting`, `Healthy` and `Failing` (the fence
    /// horizon is still ahead). False once it must fence (`LeaseAtRisk`) and in the final states.
    /// This is the host's readiness; `!is_final()` is its liveness.
    ///
    /// ```
    /// use cassandra_membership::SiloHealth;
    /// assert!(SiloHealth::Starting.should_serve());
    /// assert!(!SiloHealth::LeaseAtRisk { lease: None, failures: 3 }.should_serve());
    /// assert!(!SiloHealth::DeclaredDead.should_serve());
    /// ```
    pub fn should_serve(&self) -> bool {
        matches!(
            self,
            SiloHealth::Starting | SiloHealth::Healthy { .. } | SiloHealth::Failing { .. }
        )
    }

    /// True for the states after which the heartbeat has stopped for good.
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            SiloHealth::EntryMissing | SiloHealth::DeclaredDead | SiloHealth::Stopped
        )
    }
}

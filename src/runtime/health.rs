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
        /// What kind of failure the last one was: an outage heals by itself, the others need
        /// an operator.
        cause: FailureCause,
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
        /// What kind of failure the last one was (`None`: none failed yet, a call is slow).
        cause: Option<FailureCause>,
    },
    /// The entry is gone (expired, cleaned up or deleted). Final: the heartbeat stopped and
    /// never re-creates the entry.
    EntryMissing,
    /// The entry's status is Dead: the cluster declared this silo dead. Final.
    DeclaredDead,
    /// The heartbeat was stopped by the host.
    Stopped,
}

/// What kind of failure made heartbeats fail ([`SiloHealth::Failing`],
/// [`SiloHealth::LeaseAtRisk`]), from the table's error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailureCause {
    /// Storage was unreachable or slow, or an outcome was unknown: it heals by itself.
    Outage,
    /// The cluster's partition holds more tombstones than one read may scan
    /// ([`MembershipError::TooManyTombstones`](crate::MembershipError::TooManyTombstones)): it
    /// does not heal until the tombstones are purged; see `docs::tombstones`.
    TooManyTombstones,
    /// Credentials refused or a permission missing.
    AccessDenied,
    /// Anything else (a schema problem, stored data that cannot be read).
    Other,
}

impl FailureCause {
    /// The cause of `err`.
    pub fn of(err: &crate::MembershipError) -> FailureCause {
        use crate::MembershipError as E;
        match err {
            E::Unavailable { .. }
            | E::Timeout { .. }
            | E::OutcomeUnknown { .. }
            | E::Contention { .. } => FailureCause::Outage,
            E::TooManyTombstones { .. } => FailureCause::TooManyTombstones,
            E::AccessDenied { .. } => FailureCause::AccessDenied,
            _ => FailureCause::Other,
        }
    }
}

impl SiloHealth {
    /// True while the host may serve as a member: `Starting`, `Healthy` and `Failing` (the fence
    /// horizon is still ahead). False once it must fence (`LeaseAtRisk`) and in the final states.
    /// This is the host's readiness; `!is_final()` is its liveness.
    ///
    /// ```
    /// use cassandra_membership::SiloHealth;
    /// assert!(SiloHealth::Starting.should_serve());
    /// use cassandra_membership::FailureCause;
    /// assert!(!SiloHealth::LeaseAtRisk { lease: None, failures: 3, cause: Some(FailureCause::Outage) }.should_serve());
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

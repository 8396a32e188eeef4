//! What the runtime tells the host about its silo's membership: [`SiloHealth`], and [`Fence`],
//! whether it may take work at the moment it asks.

use tokio::sync::watch;
use tokio::time::Instant;

use crate::runtime::regress::{self, Regression};
use crate::table::Lease;

/// What the runtime knows about this silo's registration. Sent on a watch channel; see
/// [`docs::fencing`](crate::docs::fencing) for what a host must do on each state.
///
/// `#[non_exhaustive]`: a later release may add states, so a `match` needs a `_` arm. Decide
/// with [`SiloHealth::should_serve`] and [`SiloHealth::is_final`] where those say what you need.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
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
        /// The last error as its `Display` gives it: what failed and why (the driver's or
        /// the system's causes, e.g. `Connection refused`, `UnknownIssuer`).
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
    /// The TLS handshake failed ([`MembershipError::TlsHandshake`](crate::MembershipError::TlsHandshake)):
    /// the server's certificate is not trusted or not valid for its name, or the node does not
    /// speak TLS. It does not heal until the certificate or the `tls` options change.
    TlsHandshake,
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
            E::TlsHandshake { .. } => FailureCause::TlsHandshake,
            _ => FailureCause::Other,
        }
    }
}

impl SiloHealth {
    /// True for the states in which the host may serve as a member: `Starting`, `Healthy` and
    /// `Failing` (the fence horizon was still ahead). False once it must fence (`LeaseAtRisk`) and
    /// in the final states.
    ///
    /// This is the value as the heartbeat task last wrote it: a process paused past its fence
    /// horizon (a GC pause, SIGSTOP, a VM freeze) can read a stale `true` on resume, before that
    /// task has run. Before taking work ask [`Silo::should_serve`](crate::Silo::should_serve) or
    /// [`Fence::should_serve`], which compare the fence's deadline with the clock when asked.
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

/// Whether the host may take work, decided when it asks: the silo's last health, and the fence
/// horizon's deadline on tokio's monotonic clock compared with the time of the question — not a
/// value a timer last wrote, so a process resumed after a pause past its fence refuses work
/// before any of its tasks has run ([`docs::fencing`](crate::docs::fencing)). Cheap to clone
/// and to ask; from [`Silo::fence`](crate::Silo::fence).
#[derive(Clone, Debug)]
pub struct Fence {
    pub(crate) health: watch::Receiver<SiloHealth>,
    /// The fence horizon while the heartbeat may serve; `None` while fenced or stopped.
    pub(crate) serve_until: watch::Receiver<Option<Instant>>,
    /// The failure detector could not read the own row for too long.
    pub(crate) unknown: watch::Receiver<Option<FailureCause>>,
    /// Until when the own row's last successful read vouches for it: one detection horizon
    /// from when that read was sent, however many detector rounds failed or hung since.
    pub(crate) own_row_until: watch::Receiver<Instant>,
}

impl Fence {
    /// True while the host may take work now: the health says so
    /// ([`SiloHealth::should_serve`]), the own row was read recently enough, and the fence
    /// horizon is still ahead of the clock *now*. Readiness probes and work admission ask this.
    pub fn should_serve(&self) -> bool {
        self.serve_until().is_some()
    }

    /// The instant until which the host may serve, when it may serve now (`None` otherwise): a
    /// host can bound the work it accepts by it. A later heartbeat may move it on.
    pub fn serve_until(&self) -> Option<Instant> {
        if regress::on(Regression::ServeFromCachedHealth) {
            let may = self.health.borrow().should_serve() && self.unknown.borrow().is_none();
            return may.then(|| Instant::now() + std::time::Duration::from_secs(1));
        }
        let until = (*self.serve_until.borrow())?;
        let until = if regress::on(Regression::FenceCountsRounds) {
            until
        } else {
            until.min(*self.own_row_until.borrow())
        };
        let may = self.health.borrow().should_serve() && self.unknown.borrow().is_none();
        (may && Instant::now() < until).then_some(until)
    }

    /// The last health the heartbeat task published (see [`SiloHealth::should_serve`] on why it
    /// may be stale after a pause).
    pub fn health(&self) -> SiloHealth {
        self.health.borrow().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::FailureCause;
    use crate::MembershipError;

    fn source() -> crate::error::BoxError {
        "invalid peer certificate: UnknownIssuer".into()
    }

    #[test]
    fn a_failed_tls_handshake_is_its_own_cause_not_an_outage_or_other() {
        let e = MembershipError::TlsHandshake {
            operation: "update_i_am_alive",
            source: source(),
        };
        assert_eq!(FailureCause::of(&e), FailureCause::TlsHandshake);
        let e = MembershipError::Unavailable {
            operation: "update_i_am_alive",
            source: source(),
        };
        assert_eq!(FailureCause::of(&e), FailureCause::Outage);
    }
}

//! A silo's membership, assembled: join, heartbeat, failure detection, cleanup, leave.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::warn;

use crate::clock::{Clock, SystemClock};
use crate::error::Result;
use crate::model::{MembershipEntry, SiloAddress, SiloStatus};
use crate::options::MembershipOptions;
use crate::runtime::cleanup::DefunctCleanup;
use crate::runtime::health::SiloHealth;
use crate::runtime::heartbeat::Heartbeat;
use crate::runtime::protocol::{self, ProtocolLimits, bounded};
use crate::table::MembershipTable;

/// One silo's membership in a cluster.
///
/// ```
/// use std::sync::Arc;
/// use cassandra_membership::{InMemoryMembershipTable, MembershipEntry, MembershipOptions, Silo, SiloStatus, Timestamp};
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let table = Arc::new(InMemoryMembershipTable::new("my-cluster"));
/// let me = MembershipEntry::new("10.0.0.1:11111@1".parse()?, SiloStatus::Joining, Timestamp::now());
/// let silo = Silo::join(table.clone(), me, MembershipOptions::default()).await?;
/// let mut health = silo.health();          // watch this to fence the host when it turns final
/// assert_eq!(silo.entry_status().await?, Some(SiloStatus::Active));
/// silo.leave().await?;                     // ShuttingDown → Dead through the protocol
/// # Ok::<(), cassandra_membership::MembershipError>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
pub struct Silo {
    table: Arc<dyn MembershipTable>,
    address: SiloAddress,
    clock: Arc<dyn Clock>,
    heartbeat: Heartbeat,
    detector: JoinHandle<()>,
    cleanup: Option<DefunctCleanup>,
    limits: ProtocolLimits,
}

impl Silo {
    /// Joins the cluster on the system clock: see [`Silo::join_with_clock`].
    pub async fn join(
        table: Arc<dyn MembershipTable>,
        entry: MembershipEntry,
        options: MembershipOptions,
    ) -> Result<Silo> {
        Self::join_with_clock(table, entry, options, Arc::new(SystemClock)).await
    }

    /// Validates the options and registers the defunct cleanup (unless storage expiry covers
    /// it) before anything is written; then initializes the table, inserts `entry` as Joining,
    /// moves it to Active, and starts the heartbeat and the failure detector (every publish
    /// period; it also watches this silo's own row). Conflicts, reads that give up and calls
    /// that time out are retried with jittered backoff until `max_join_attempt_time`.
    pub async fn join_with_clock(
        table: Arc<dyn MembershipTable>,
        entry: MembershipEntry,
        options: MembershipOptions,
        clock: Arc<dyn Clock>,
    ) -> Result<Silo> {
        options.validate()?;
        // Not started when disabled or when storage expiry covers it (see CleanupNotStarted).
        let cleanup = DefunctCleanup::spawn(Arc::clone(&table), &options, Arc::clone(&clock))?.ok();
        let limits = ProtocolLimits::from_options(&options);
        match Self::enter(table.as_ref(), entry, &clock, &limits).await {
            Ok(address) => Ok(Self::start(table, address, options, clock, cleanup, limits)),
            Err(e) => {
                if let Some(c) = cleanup {
                    c.stop().await;
                }
                Err(e)
            }
        }
    }

    async fn enter(
        table: &dyn MembershipTable,
        mut entry: MembershipEntry,
        clock: &Arc<dyn Clock>,
        limits: &ProtocolLimits,
    ) -> Result<SiloAddress> {
        bounded(
            "initialize",
            true,
            limits.step_deadline,
            table.initialize(true),
        )
        .await?;
        entry.status = SiloStatus::Joining;
        entry.i_am_alive_time = clock.now();
        protocol::join_within(table, &entry, limits).await?;
        let active = protocol::set_status_within(
            table,
            &entry.address,
            SiloStatus::Active,
            clock.now(),
            limits,
        )
        .await;
        if let Err(e) = active {
            // Nobody will heartbeat this entry: say so rather than leave it Joining (best effort).
            let _ = protocol::set_status_within(
                table,
                &entry.address,
                SiloStatus::Dead,
                clock.now(),
                limits,
            )
            .await;
            return Err(e);
        }
        Ok(entry.address)
    }

    fn start(
        table: Arc<dyn MembershipTable>,
        address: SiloAddress,
        options: MembershipOptions,
        clock: Arc<dyn Clock>,
        cleanup: Option<DefunctCleanup>,
        limits: ProtocolLimits,
    ) -> Silo {
        let heartbeat = Heartbeat::spawn(Arc::clone(&table), address, &options, Arc::clone(&clock));
        let detector = {
            let (table, clock, options) = (Arc::clone(&table), Arc::clone(&clock), options.clone());
            let mut health = heartbeat.health();
            let report = heartbeat.own_entry_report();
            tokio::spawn(async move {
                let period = options.i_am_alive_table_publish_timeout;
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep(period) => {}
                        _ = health.wait_for(SiloHealth::is_final) => return,
                    }
                    match protocol::detection_round(table.as_ref(), &address, &options, clock.now())
                        .await
                    {
                        // The same read tells this silo whether it was declared dead or lost
                        // its entry: within one period on every backend, no extra round trip.
                        Ok(round) => report.own_entry(round.own_status),
                        Err(e) => {
                            warn!(silo = %address, error = %e, "failure detection round failed")
                        }
                    }
                }
            })
        };
        Silo {
            table,
            address,
            clock,
            heartbeat,
            detector,
            cleanup,
            limits,
        }
    }

    /// This silo's address.
    pub fn address(&self) -> SiloAddress {
        self.address
    }

    /// Health changes of this silo's registration: fence the host when it becomes
    /// [`SiloHealth::LeaseAtRisk`] or final.
    pub fn health(&self) -> watch::Receiver<SiloHealth> {
        self.heartbeat.health()
    }

    /// True when this process runs the periodic defunct cleanup for the cluster (and storage
    /// does not cover it, as of the cleanup's last period).
    pub fn runs_defunct_cleanup(&self) -> bool {
        self.cleanup.as_ref().is_some_and(DefunctCleanup::is_active)
    }

    /// The stored status of this silo's entry (`None` when it has none).
    pub async fn entry_status(&self) -> Result<Option<SiloStatus>> {
        Ok(bounded(
            "read_row",
            false,
            self.limits.call_timeout,
            self.table.read_row(&self.address),
        )
        .await?
        .rows
        .first()
        .map(|r| r.entry.status))
    }

    /// Leaves gracefully: stops the tasks, then moves the entry to ShuttingDown and Dead.
    pub async fn leave(self) -> Result<()> {
        self.heartbeat.stop().await;
        self.detector.abort();
        if let Some(c) = self.cleanup {
            c.stop().await;
        }
        protocol::leave_within(
            self.table.as_ref(),
            &self.address,
            self.clock.now(),
            &self.limits,
        )
        .await
    }

    /// Stops everything without touching the entry, as if the process had crashed.
    pub fn crash(self) {
        self.heartbeat.abort();
        self.detector.abort();
        // Dropping the cleanup handle leaves its task running until the runtime ends; stop it.
        if let Some(c) = self.cleanup {
            tokio::spawn(c.stop());
        }
    }

    /// Waits until the heartbeat stops for good or `timeout` passes; returns the last health.
    pub async fn wait_final(&self, timeout: Duration) -> SiloHealth {
        let mut h = self.health();
        let _ = tokio::time::timeout(timeout, h.wait_for(SiloHealth::is_final)).await;
        h.borrow().clone()
    }
}

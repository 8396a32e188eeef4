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
use crate::runtime::protocol;
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

    /// Initializes the table, inserts `entry` as Joining, moves it to Active, and starts the
    /// heartbeat, the failure detector (every publish period) and, unless storage expiry covers
    /// it, the defunct cleanup.
    pub async fn join_with_clock(
        table: Arc<dyn MembershipTable>,
        mut entry: MembershipEntry,
        options: MembershipOptions,
        clock: Arc<dyn Clock>,
    ) -> Result<Silo> {
        options.validate()?;
        table.initialize(true).await?;
        let now = clock.now();
        entry.status = SiloStatus::Joining;
        entry.i_am_alive_time = now;
        protocol::join(table.as_ref(), &entry).await?;
        protocol::set_status(
            table.as_ref(),
            &entry.address,
            SiloStatus::Active,
            clock.now(),
        )
        .await?;
        let address = entry.address;
        let heartbeat = Heartbeat::spawn(Arc::clone(&table), address, &options, Arc::clone(&clock));
        let detector = {
            let (table, clock, options) = (Arc::clone(&table), Arc::clone(&clock), options.clone());
            let mut health = heartbeat.health();
            tokio::spawn(async move {
                let period = options.i_am_alive_table_publish_timeout;
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep(period) => {}
                        _ = health.wait_for(SiloHealth::is_final) => return,
                    }
                    if let Err(e) = protocol::declare_silent_silos_dead(
                        table.as_ref(),
                        &address,
                        &options,
                        clock.now(),
                    )
                    .await
                    {
                        warn!(silo = %address, error = %e, "failure detection round failed");
                    }
                }
            })
        };
        // Not started when disabled or when storage expiry covers it (see CleanupNotStarted).
        let cleanup = DefunctCleanup::spawn(Arc::clone(&table), &options, Arc::clone(&clock))?.ok();
        Ok(Silo {
            table,
            address,
            clock,
            heartbeat,
            detector,
            cleanup,
        })
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

    /// True when this process runs the periodic defunct cleanup for the cluster.
    pub fn runs_defunct_cleanup(&self) -> bool {
        self.cleanup.is_some()
    }

    /// The stored status of this silo's entry (`None` when it has none).
    pub async fn entry_status(&self) -> Result<Option<SiloStatus>> {
        Ok(self
            .table
            .read_row(&self.address)
            .await?
            .rows
            .first()
            .map(|r| r.entry.status))
    }

    async fn stop_tasks(self) -> (Arc<dyn MembershipTable>, SiloAddress, Arc<dyn Clock>) {
        self.heartbeat.stop().await;
        self.detector.abort();
        if let Some(c) = self.cleanup {
            c.stop().await;
        }
        (self.table, self.address, self.clock)
    }

    /// Leaves gracefully: stops the tasks, then moves the entry to ShuttingDown and Dead.
    pub async fn leave(self) -> Result<()> {
        let (table, address, clock) = self.stop_tasks().await;
        protocol::leave(table.as_ref(), &address, clock.now()).await
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

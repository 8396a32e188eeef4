//! A silo's membership, assembled: join, heartbeat, failure detection, cleanup, leave.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::warn;

use crate::clock::{Clock, SystemClock};
use crate::error::{MembershipError, Result};
use crate::model::{MembershipEntry, SiloAddress, SiloStatus};
use crate::options::MembershipOptions;
use crate::runtime::cleanup::DefunctCleanup;
use crate::runtime::health::{Fence, SiloHealth};
use crate::runtime::heartbeat::{Heartbeat, Joined};
use crate::runtime::protocol::{self, ProtocolLimits, bounded};
use crate::table::MembershipTable;

/// One silo's membership in a cluster.
///
/// The membership options (publish period, votes, cleanup, timeouts) are the table's
/// ([`MembershipTable::membership_options`]): one source, the one the backend also uses.
///
/// ```
/// use std::sync::Arc;
/// use cassandra_membership::{InMemoryMembershipTable, Silo, SiloStatus};
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let table = Arc::new(InMemoryMembershipTable::new("my-cluster"));
/// let silo = Silo::join(table.clone(), "10.0.0.1:11111@1".parse()?).await?;
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

/// What a silo's entry says about it besides its address, and the clock it runs on: built by
/// [`Silo::builder`], ended by [`SiloBuilder::join`].
///
/// ```
/// use std::sync::Arc;
/// use cassandra_membership::{InMemoryMembershipTable, MembershipTable, Silo};
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let table = Arc::new(InMemoryMembershipTable::new("my-cluster"));
/// let address = "10.0.0.1:11111@1".parse()?;
/// let silo = Silo::builder(table.clone(), address)
///     .silo_name("silo-1")
///     .host_name("host-a")
///     .proxy_port(30000)
///     .role_name("frontend")
///     .fault_zone(2)
///     .join()
///     .await?;
/// let entry = &table.read_row(&address).await?.rows[0].entry;
/// assert_eq!((entry.silo_name.as_str(), entry.proxy_port), ("silo-1", 30000));
/// silo.leave().await?;
/// # Ok::<(), cassandra_membership::MembershipError>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
#[must_use = "a builder does nothing until `join` is awaited"]
pub struct SiloBuilder {
    table: Arc<dyn MembershipTable>,
    entry: MembershipEntry,
    clock: Arc<dyn Clock>,
}

impl SiloBuilder {
    /// The silo's name (default empty).
    pub fn silo_name(mut self, name: impl Into<String>) -> Self {
        self.entry.silo_name = name.into();
        self
    }

    /// The host's name (default empty).
    pub fn host_name(mut self, name: impl Into<String>) -> Self {
        self.entry.host_name = name.into();
        self
    }

    /// The gateway (proxy) port clients connect to (default 0: none).
    pub fn proxy_port(mut self, port: u16) -> Self {
        self.entry.proxy_port = port;
        self
    }

    /// The silo's role name (default empty).
    pub fn role_name(mut self, name: impl Into<String>) -> Self {
        self.entry.role_name = name.into();
        self
    }

    /// The update zone (default 0).
    pub fn update_zone(mut self, zone: i32) -> Self {
        self.entry.update_zone = zone;
        self
    }

    /// The fault zone (default 0).
    pub fn fault_zone(mut self, zone: i32) -> Self {
        self.entry.fault_zone = zone;
        self
    }

    /// The clock the silo reads its times from (default [`SystemClock`]); tests pass a
    /// [`TokioClock`](crate::TokioClock) under paused time or a [`ManualClock`](crate::ManualClock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Validates the table's membership options and attaches to this process's defunct
    /// cleanup of the table (starting it for the first silo; [`DefunctCleanup`] — refused when
    /// its options differ) before anything is written; then initializes the table,
    /// inserts the entry as Joining (its start and I-am-alive times the clock's now), moves it
    /// to Active, and starts the heartbeat and the failure detector (every publish period; it
    /// also watches this silo's own row). Conflicts, reads that give up and calls that time
    /// out are retried with jittered backoff; the whole join, calls in flight included, ends
    /// by `max_join_attempt_time`. A join that fails after its insert may have applied marks
    /// the entry Dead in the background (best effort). Cancelling the returned future
    /// (dropping it) skips that: an entry it inserted stays Joining until defunct cleanup or
    /// storage expiry removes it.
    pub async fn join(self) -> Result<Silo> {
        let SiloBuilder {
            table,
            mut entry,
            clock,
        } = self;
        let options = table.membership_options().clone();
        options.validate()?;
        entry.start_time = clock.now();
        // Shared with this process's other silos on the table; none when disabled.
        let cleanup = DefunctCleanup::spawn_for(
            Arc::clone(&table),
            &options,
            Arc::clone(&clock),
            entry.address,
        )?
        .ok();
        let limits = ProtocolLimits::from_options(&options);
        match Silo::enter(&table, entry, &clock, &limits).await {
            Ok(joined) => Ok(Silo::start(table, joined, options, clock, cleanup, limits)),
            Err(e) => {
                if let Some(c) = cleanup {
                    c.stop().await;
                }
                Err(e)
            }
        }
    }
}

impl Silo {
    /// Joins the cluster as `address`, with the table's membership options, on the system
    /// clock and with an entry whose names are empty, ports and zones 0: see
    /// [`SiloBuilder::join`]. [`Silo::builder`] sets those.
    pub async fn join(table: Arc<dyn MembershipTable>, address: SiloAddress) -> Result<Silo> {
        Self::builder(table, address).join().await
    }

    /// A join as `address` whose entry's names, port, zones and clock the builder sets.
    pub fn builder(table: Arc<dyn MembershipTable>, address: SiloAddress) -> SiloBuilder {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        SiloBuilder {
            table,
            entry: MembershipEntry::new(address, SiloStatus::Joining, clock.now()),
            clock,
        }
    }

    async fn enter(
        table: &Arc<dyn MembershipTable>,
        mut entry: MembershipEntry,
        clock: &Arc<dyn Clock>,
        limits: &ProtocolLimits,
    ) -> Result<Joined> {
        // One deadline for every step: initialize, insert, Active.
        let deadline = protocol::deadline_after(limits.step_deadline);
        let t = limits.call_timeout;
        Self::initialize(table.as_ref(), t, deadline).await?;
        entry.status = SiloStatus::Joining;
        entry.i_am_alive_time = clock.now();
        if let Err(e) = protocol::join_until(table.as_ref(), &entry, t, deadline).await {
            // An insert whose outcome is unknown, or that timed out or was retried until the
            // deadline, may have applied (best effort, as below).
            if e.is_transient() || e.is_outcome_unknown() {
                Self::mark_dead_in_background(table, &entry, clock, limits);
            }
            return Err(e);
        }
        // The Active write stores this I-am-alive time (or a later one already stored): the
        // others' detection horizon counts from it, however long the step then retries.
        let (published_at, published_wall) = (Instant::now(), clock.now());
        let active = protocol::set_status_until(
            table.as_ref(),
            &entry.address,
            Some(entry.start_time),
            SiloStatus::Active,
            published_wall,
            t,
            deadline,
        )
        .await
        .and_then(|active| {
            // The row is Dead or gone: someone declared this incarnation dead meanwhile.
            active.then_some(()).ok_or(MembershipError::NotAMember {
                silo: entry.address.to_string(),
                state: "dead or missing",
            })
        });
        if let Err(e) = active {
            Self::mark_dead_in_background(table, &entry, clock, limits);
            return Err(e);
        }
        Ok(Joined {
            address: entry.address,
            published_at,
            published_wall,
            start_time: entry.start_time,
        })
    }

    /// `initialize`, retried like the other steps until `deadline`.
    async fn initialize(
        table: &dyn MembershipTable,
        call_timeout: Duration,
        deadline: Instant,
    ) -> Result<()> {
        let mut round = 0u32;
        loop {
            let limit = call_timeout.min(deadline.saturating_duration_since(Instant::now()));
            match bounded("initialize", true, limit, table.initialize(true)).await {
                Err(e) if protocol::retriable(&e) && Instant::now() < deadline => {
                    warn!(cluster = table.cluster_id(), error = %e, "initialize failed; retrying");
                }
                r => return r,
            }
            round = round.saturating_add(1);
            protocol::pause(round, deadline).await;
        }
    }

    /// Nobody will heartbeat an entry whose join failed: say so rather than leave it Joining
    /// (best effort, only this incarnation's row). In the background, so the join returns by
    /// its deadline; bounded by `max_join_attempt_time` of its own.
    fn mark_dead_in_background(
        table: &Arc<dyn MembershipTable>,
        entry: &MembershipEntry,
        clock: &Arc<dyn Clock>,
        limits: &ProtocolLimits,
    ) {
        let (table, address, start, now, limits) = (
            Arc::clone(table),
            entry.address,
            entry.start_time,
            clock.now(),
            *limits,
        );
        tokio::spawn(async move {
            let marked = protocol::set_status_until(
                table.as_ref(),
                &address,
                Some(start),
                SiloStatus::Dead,
                now,
                limits.call_timeout,
                protocol::deadline_after(limits.step_deadline),
            )
            .await;
            if let Err(e) = marked {
                warn!(cluster = table.cluster_id(), silo = %address, error = %e, "could not mark a failed join's entry Dead; defunct cleanup or expiry removes it");
            }
        });
    }

    fn start(
        table: Arc<dyn MembershipTable>,
        joined: Joined,
        options: MembershipOptions,
        clock: Arc<dyn Clock>,
        cleanup: Option<DefunctCleanup>,
        limits: ProtocolLimits,
    ) -> Silo {
        let address = joined.address;
        let heartbeat = Heartbeat::spawn(Arc::clone(&table), &joined, &options, Arc::clone(&clock));
        let start_time = joined.start_time;
        let detector = {
            let (table, clock, options) = (Arc::clone(&table), Arc::clone(&clock), options.clone());
            let mut health = heartbeat.health();
            let report = heartbeat.own_entry_report();
            tokio::spawn(async move {
                let period = options.i_am_alive_table_publish_timeout;
                let mut failed_rounds = 0u32;
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep(period) => {}
                        _ = health.wait_for(SiloHealth::is_final) => return,
                    }
                    // The round's first read tells this silo whether it was declared dead or
                    // lost its entry — within one period on every backend, no extra round trip
                    // — and is reported before any vote.
                    let round = protocol::detection_round_reporting(
                        table.as_ref(),
                        &address,
                        Some(start_time),
                        &options,
                        clock.now(),
                        |own| report.own_entry(own),
                    )
                    .await;
                    match round {
                        Ok(_) => failed_rounds = 0,
                        Err(e) => {
                            failed_rounds = failed_rounds.saturating_add(1);
                            warn!(silo = %address, error = %e, failed_rounds, "failure detection round failed");
                            // As long as the others may take to declare a silent silo dead:
                            // past it, this silo cannot know it is still a member.
                            if failed_rounds >= options.num_missed_table_i_am_alive_limit {
                                report.own_entry_unknown(crate::FailureCause::of(&e));
                            }
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
    /// [`SiloHealth::LeaseAtRisk`] or final. To decide whether to take a piece of work, ask
    /// [`Silo::should_serve`] (or a [`Fence`]) instead: a value on this watch can be stale after
    /// the process was paused.
    pub fn health(&self) -> watch::Receiver<SiloHealth> {
        self.heartbeat.health()
    }

    /// True while the host may take work now: decided against the clock when asked, so it is
    /// false once the fence horizon has passed even if no task has run since (a process resumed
    /// after a pause). See [`Fence::should_serve`].
    pub fn should_serve(&self) -> bool {
        self.heartbeat.fence().should_serve()
    }

    /// A clonable handle that answers [`Silo::should_serve`] where the silo itself is not at hand
    /// (request handlers, a readiness probe); after [`Silo::leave`] or [`Silo::crash`] it answers
    /// false.
    pub fn fence(&self) -> Fence {
        self.heartbeat.fence()
    }

    /// True when this silo takes part in the periodic defunct cleanup this process's silos on
    /// the table share, and its rounds remove entries: the age limit is not covered by storage
    /// expiry (asked now), or `max_defunct_silo_entries` is set.
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
        // Detaches from the shared cleanup (the last silo's handle stops it).
        drop(self.cleanup);
    }

    /// Waits until the heartbeat stops for good or `timeout` passes; returns the last health.
    pub async fn wait_final(&self, timeout: Duration) -> SiloHealth {
        let mut h = self.health();
        let _ = tokio::time::timeout(timeout, h.wait_for(SiloHealth::is_final)).await;
        h.borrow().clone()
    }
}

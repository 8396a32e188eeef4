//! A silo's membership, assembled: join, heartbeat, failure detection, cleanup, leave.

use std::pin::pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::Stream;
use tracing::warn;

use crate::clock::{Clock, SystemClock};
use crate::error::{MembershipError, Result};
use crate::model::{MembershipEntry, SiloAddress, SiloStatus};
use crate::options::MembershipOptions;
use crate::runtime::cleanup::DefunctCleanup;
use crate::runtime::health::{Fence, SiloHealth};
use crate::runtime::heartbeat::{Heartbeat, Joined};
use crate::runtime::protocol::{self, ProtocolLimits, bounded};
use crate::runtime::regress::{self, Regression};
use crate::runtime::task;
use crate::runtime::view::{self, ClusterView, ViewPublisher};
use crate::table::MembershipTable;

mod join;
pub use join::SiloBuilder;

/// One silo's membership in a cluster.
///
/// The membership options (publish period, votes, cleanup, timeouts) are the table's
/// ([`MembershipTable::membership_options`]): one source, the one the backend also uses.
///
/// **Ending it.** [`Silo::leave`] (graceful: the others stop counting on it at once, within
/// `leave_timeout`) or [`Silo::crash`]. Both take `&self`, so a host shares the silo as
/// `Arc<Silo>` (in its HTTP state, its signal handler) with no `Mutex<Option<Silo>>`. Once the
/// silo left or crashed, a later `leave` answers [`MembershipError::NotAMember`] and a later
/// `crash` does nothing; a leave that failed or was cancelled can be called again. **Dropping a silo that neither left nor crashed is a crash**: its
/// tasks stop, its entry stays Active until the others declare it dead (the detection horizon,
/// 90 s by default), and a warning naming the silo is logged.
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
#[must_use = "dropping a Silo is a crash: its entry stays Active until the others declare it dead; call `leave` (or `crash`)"]
pub struct Silo {
    table: Arc<dyn MembershipTable>,
    address: SiloAddress,
    clock: Arc<dyn Clock>,
    health: watch::Receiver<SiloHealth>,
    fence: Fence,
    run: Mutex<Run>,
    /// One leave at a time: a second waits for the first, then answers as that one ended.
    leaving: tokio::sync::Mutex<()>,
    limits: ProtocolLimits,
    leave_limits: ProtocolLimits,
    view: watch::Receiver<ClusterView>,
}

/// Whether the silo's tasks still run, or how it ended.
#[derive(Debug)]
enum Run {
    Running(Tasks),
    /// A leave is under way: it took the tasks out to stop them.
    Leaving,
    /// The tasks stopped, but a leave's writes did not finish (it failed or was cancelled): a
    /// later leave writes again.
    LeaveUnfinished,
    Ended(&'static str),
}

/// Records how a leave ended when it goes out of scope, so a leave whose future is dropped
/// midway leaves the silo re-leavable rather than "left".
struct LeaveEnd<'a> {
    run: &'a Mutex<Run>,
    left: bool,
}

impl Drop for LeaveEnd<'_> {
    fn drop(&mut self) {
        let mut run = self.run.lock().unwrap_or_else(PoisonError::into_inner);
        *run = if self.left {
            Run::Ended("left")
        } else {
            Run::LeaveUnfinished
        };
    }
}

/// What runs while the silo is a member.
#[derive(Debug)]
struct Tasks {
    heartbeat: Heartbeat,
    detector: JoinHandle<()>,
    cleanup: Option<DefunctCleanup>,
}

impl Tasks {
    /// Ends every task at once, touching no entry.
    fn abort(self) {
        self.heartbeat.abort();
        self.detector.abort();
        // Detaches from the shared cleanup (the last silo's handle stops it).
        drop(self.cleanup);
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

    fn start(
        table: Arc<dyn MembershipTable>,
        joined: Joined,
        first_view: ClusterView,
        options: MembershipOptions,
        clock: Arc<dyn Clock>,
        cleanup: Option<DefunctCleanup>,
        limits: ProtocolLimits,
    ) -> Silo {
        let address = joined.address;
        let heartbeat = Heartbeat::spawn(Arc::clone(&table), &joined, &options, Arc::clone(&clock));
        let start_time = joined.start_time;
        let views = ViewPublisher::new(first_view);
        let view = views.subscribe();
        let detector = {
            let (table, clock, options) = (Arc::clone(&table), Arc::clone(&clock), options.clone());
            let mut health = heartbeat.health();
            let report = heartbeat.own_entry_report();
            task::spawn(async move {
                let period = options.i_am_alive_table_publish_timeout;
                let mut failed_rounds = 0u32;
                // The kind of the last failed round (an outage until one failed otherwise).
                let mut last_cause = crate::FailureCause::Outage;
                loop {
                    // `biased`: one order for every run (a simulation's seed fixes the history).
                    tokio::select! {
                        biased;
                        _ = health.wait_for(SiloHealth::is_final) => return,
                        _ = tokio::time::sleep(period) => {}
                    }
                    // The round's first read tells this silo whether it was declared dead or
                    // lost its entry — within one period on every backend, no extra round trip
                    // — and is reported before any vote. Its whole-table reads are the view.
                    // A round that starts past the deadline: the own row is unknown already.
                    if !regress::on(Regression::FenceCountsRounds)
                        && tokio::time::Instant::now() >= report.own_row_until()
                    {
                        report.own_entry_unknown(last_cause);
                    }
                    let mut read = false;
                    let now = clock.now();
                    let sent = tokio::time::Instant::now();
                    let counts_rounds = regress::on(Regression::FenceCountsRounds);
                    let round = protocol::detection_round_reporting(
                        table.as_ref(),
                        &address,
                        Some(start_time),
                        &options,
                        now,
                        |own| report.own_entry(own, sent),
                        |snapshot, read_at| {
                            read = true;
                            // An older version only after the cluster was deleted and
                            // created again: the kept view is marked stale.
                            let _ = views.read(snapshot, read_at);
                            // Every read of the round that holds the own row vouches for it from
                            // when it was sent (the re-reads before votes too: a long round
                            // must not fence a silo its own reads show live), or ends it.
                            let own = snapshot
                                .get(&address)
                                .filter(|r| r.entry.start_time == start_time)
                                .map(|r| r.entry.status);
                            if own.is_some() && !counts_rounds {
                                let offset = Duration::from_millis(
                                    u64::try_from(read_at.as_millis() - now.as_millis())
                                        .unwrap_or(0),
                                );
                                report.own_entry(own, protocol::instant_after(sent, offset));
                            }
                        },
                    );
                    // The own row unread for a detection horizon: this silo cannot know it is
                    // still a member, however long the reads in flight still take — fenced at
                    // that instant, not after a count of rounds that each take a period plus a
                    // call ([`docs::fencing`](crate::docs::fencing)).
                    // The round goes on past that instant: its read may still answer. The
                    // deadline is read again whenever the timer fires, since this round's own
                    // first read may have moved it on meanwhile.
                    let round = {
                        let mut round = pin!(round);
                        let mut moved = report.own_row_moves();
                        loop {
                            let unread_at = report.own_row_until();
                            let armed = !counts_rounds && tokio::time::Instant::now() < unread_at;
                            tokio::select! {
                                biased;
                                r = &mut round => break r,
                                _ = tokio::time::sleep_until(unread_at), if armed => {
                                    if tokio::time::Instant::now() >= report.own_row_until() {
                                        report.own_entry_unknown(last_cause);
                                    }
                                }
                                // A read moved the deadline on: armed again for the new one.
                                _ = moved.changed(), if !counts_rounds => {}
                            }
                        }
                    };
                    match round {
                        Ok(_) => {
                            failed_rounds = 0;
                            last_cause = crate::FailureCause::Outage;
                            // A round that ended past the deadline its reads left.
                            if !counts_rounds
                                && tokio::time::Instant::now() >= report.own_row_until()
                            {
                                report.own_entry_unknown(last_cause);
                            }
                        }
                        Err(e) => {
                            if !read {
                                views.failed(&e, clock.now());
                            }
                            failed_rounds = failed_rounds.saturating_add(1);
                            last_cause = crate::FailureCause::of(&e);
                            warn!(silo = %address, error = %e, failed_rounds, "failure detection round failed");
                            let unread = tokio::time::Instant::now() >= report.own_row_until();
                            let by_rounds =
                                failed_rounds >= options.num_missed_table_i_am_alive_limit;
                            if if counts_rounds { by_rounds } else { unread } {
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
            health: heartbeat.health(),
            fence: heartbeat.fence(),
            run: Mutex::new(Run::Running(Tasks {
                heartbeat,
                detector,
                cleanup,
            })),
            leaving: tokio::sync::Mutex::new(()),
            limits,
            leave_limits: ProtocolLimits::for_leave(&options),
            view,
        }
    }

    /// Marks a leave under way: `Ok` with the tasks still to stop (none when an earlier leave
    /// stopped them), `Err` with how the silo already ended.
    fn begin_leave(&self) -> std::result::Result<Option<Tasks>, &'static str> {
        let mut run = self.run.lock().unwrap_or_else(PoisonError::into_inner);
        match std::mem::replace(&mut *run, Run::Leaving) {
            Run::Running(tasks) => Ok(Some(tasks)),
            Run::Leaving | Run::LeaveUnfinished => Ok(None),
            Run::Ended(before) => {
                *run = Run::Ended(before);
                Err(before)
            }
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
        self.health.clone()
    }

    /// The cluster as this silo sees it: a watch of [`ClusterView`]s, each one committed table
    /// version as one whole-table read saw it, their versions never going backwards.
    ///
    /// Published from the reads the failure detector already makes (its read of the whole table
    /// every publish period, and its re-read before each vote) and from the join's one read: no
    /// statement of its own. A change any silo commits shows here within one publish period plus
    /// one detection round (one `read_all` when nobody is suspected; see
    /// [`docs::costs`](crate::docs::costs)). `changed()` wakes on changes of membership (a new
    /// version, an entry added, changed or removed) or staleness (reads failing), not on
    /// I-am-alive times alone. The watch ends (`changed()` errs, the last view stays) when the
    /// silo leaves, crashes or is declared dead.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use cassandra_membership::{InMemoryMembershipTable, Silo};
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let table = Arc::new(InMemoryMembershipTable::new("my-cluster"));
    /// let silo = Silo::join(table.clone(), "10.0.0.1:11111@1".parse()?).await?;
    /// let view = silo.view().borrow().clone();
    /// let members: Vec<_> = view.active().map(|e| e.address).collect();
    /// assert_eq!(members, [silo.address()]);
    /// silo.leave().await?;
    /// # Ok::<(), cassandra_membership::MembershipError>(())
    /// # }).unwrap();
    /// ```
    pub fn view(&self) -> watch::Receiver<ClusterView> {
        self.view.clone()
    }

    /// [`Silo::view`] as a stream: the current view first, then each change (a slow consumer
    /// skips to the latest). It ends when the view's watch does.
    ///
    /// ```no_run
    /// # async fn host(silo: cassandra_membership::Silo) {
    /// use tokio_stream::StreamExt;
    /// let mut views = silo.views();
    /// while let Some(view) = views.next().await {
    ///     println!("version {}: {} active", view.version().version, view.active().count());
    /// }
    /// # }
    /// ```
    pub fn views(&self) -> impl Stream<Item = ClusterView> + Send + Unpin + 'static {
        view::stream_of(self.view.clone())
    }

    /// True while the host may take work now: decided against the clock when asked, so it is
    /// false once the fence horizon has passed even if no task has run since (a process resumed
    /// after a pause). See [`Fence::should_serve`].
    pub fn should_serve(&self) -> bool {
        self.fence.should_serve()
    }

    /// A clonable handle that answers [`Silo::should_serve`] where the silo itself is not at hand
    /// (request handlers, a readiness probe); after [`Silo::leave`] or [`Silo::crash`] it answers
    /// false.
    pub fn fence(&self) -> Fence {
        self.fence.clone()
    }

    /// True when this silo takes part in the periodic defunct cleanup this process's silos on
    /// the table share, and its rounds remove entries: the age limit is not covered by storage
    /// expiry (asked now), or `max_defunct_silo_entries` is set.
    pub fn runs_defunct_cleanup(&self) -> bool {
        match &*self.run.lock().unwrap_or_else(PoisonError::into_inner) {
            Run::Running(tasks) => tasks
                .cleanup
                .as_ref()
                .is_some_and(DefunctCleanup::is_active),
            Run::Leaving | Run::LeaveUnfinished | Run::Ended(_) => false,
        }
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

    /// Leaves gracefully: stops the tasks, then moves the entry to ShuttingDown and Dead, all
    /// within one bound, the table's `leave_timeout` (60 s by default; see
    /// [`MembershipOptions::leave_timeout`]): past it, the last error is returned and the
    /// entry stays as far as it got (the others then declare it dead, as a crashed silo's).
    ///
    /// Takes `&self`, so it is called on a silo shared as `Arc<Silo>`. The first call stops the
    /// tasks for good (the silo serves no more). A leave that returned an error, or whose future
    /// was dropped midway (a host's own timeout), did not finish: a later `leave` writes again,
    /// with a `leave_timeout` of its own, so a host retries once storage is back. Calls made
    /// while a leave is under way wait for it, then answer as it ended. Once a leave finished,
    /// or the silo crashed, `leave` answers [`MembershipError::NotAMember`] at once, writing
    /// nothing, its `state` saying how the silo ended (`"left"`, `"crashed"`).
    pub async fn leave(&self) -> Result<()> {
        let _one = self.leaving.lock().await;
        let deadline = protocol::deadline_after(self.leave_limits.step_deadline);
        let tasks = self
            .begin_leave()
            .map_err(|state| MembershipError::NotAMember {
                silo: self.address.to_string(),
                state,
            })?;
        // From here, however this future ends, the silo is left or re-leavable.
        let mut end = LeaveEnd {
            run: &self.run,
            left: false,
        };
        if let Some(tasks) = tasks {
            tasks.detector.abort();
            // Dropped midway, the stop (already signalled) and the cleanup's end still happen.
            tasks.heartbeat.stop(deadline).await;
            if let Some(c) = tasks.cleanup {
                // Told to stop, a cleanup round ends soon; the leave's writes do not wait past it.
                let _ = tokio::time::timeout_at(deadline, c.stop()).await;
            }
        }
        protocol::leave_until(
            self.table.as_ref(),
            &self.address,
            self.clock.now(),
            self.leave_limits.call_timeout,
            deadline,
        )
        .await?;
        end.left = true;
        Ok(())
    }

    /// Stops everything without touching the entry, as if the process had crashed. Does
    /// nothing on a silo that already left or crashed, nor while a leave is under way; after
    /// a leave that did not finish, it ends the silo (a later `leave` answers
    /// [`MembershipError::NotAMember`]).
    pub fn crash(&self) {
        let mut run = self.run.lock().unwrap_or_else(PoisonError::into_inner);
        match std::mem::replace(&mut *run, Run::Ended("crashed")) {
            Run::Running(tasks) => tasks.abort(),
            Run::LeaveUnfinished => {}
            before @ (Run::Leaving | Run::Ended(_)) => *run = before,
        }
    }

    /// Waits until the heartbeat stops for good or `timeout` passes; returns the last health.
    pub async fn wait_final(&self, timeout: Duration) -> SiloHealth {
        let mut h = self.health();
        let _ = tokio::time::timeout(timeout, h.wait_for(SiloHealth::is_final)).await;
        h.borrow().clone()
    }
}

impl Drop for Silo {
    /// A silo that neither left nor crashed is crashed here, loudly: its entry stays Active
    /// until the others declare it dead.
    fn drop(&mut self) {
        let run = std::mem::replace(
            self.run.get_mut().unwrap_or_else(PoisonError::into_inner),
            Run::Ended("dropped"),
        );
        if let Run::Running(tasks) = run {
            warn!(cluster = self.table.cluster_id(), silo = %self.address, "a Silo was dropped without leave() or crash(): a crash; its entry stays Active until the others declare it dead");
            tasks.abort();
        }
    }
}

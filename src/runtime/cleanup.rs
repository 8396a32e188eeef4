//! The periodic defunct-silo cleanup, as Orleans runs it: first at a random point of the first
//! period, then every period plus jitter; one per table identity per process, shared by the
//! process's silos on that table; each round removes entries older than the age limit (idle
//! while storage expiry covers that, unless forced) and, when a local silo is the first Active
//! one, the oldest Dead entries beyond `max_defunct_silo_entries`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::clock::Clock;
use crate::error::{MembershipError, Result};
use crate::model::{SiloAddress, Timestamp};
use crate::options::MembershipOptions;
use crate::runtime::cleanup_rules::{CleanupSchedule, excess_dead_cutoff, first_active_silo};
use crate::runtime::jitter;
use crate::runtime::protocol::bounded;
use crate::table::MembershipTable;

/// The options every silo sharing a cleanup must agree on (the first silo's run it).
#[derive(Clone, Debug, PartialEq, Eq)]
struct CleanupSettings {
    period: Option<Duration>,
    jitter: Duration,
    expiration: Duration,
    force: bool,
    max_dead: Option<i64>,
}

impl CleanupSettings {
    fn of(o: &MembershipOptions) -> Self {
        CleanupSettings {
            period: o.defunct_silo_cleanup_period,
            jitter: o.defunct_silo_cleanup_jitter,
            expiration: o.defunct_silo_expiration,
            force: o.force_defunct_cleanup,
            max_dead: o.max_defunct_silo_entries,
        }
    }

    /// The first option in which `other` differs, if any.
    fn differs(&self, other: &CleanupSettings) -> Option<&'static str> {
        [
            (self.period != other.period, "defunct_silo_cleanup_period"),
            (self.jitter != other.jitter, "defunct_silo_cleanup_jitter"),
            (
                self.expiration != other.expiration,
                "defunct_silo_expiration",
            ),
            (self.force != other.force, "force_defunct_cleanup"),
            (self.max_dead != other.max_dead, "max_defunct_silo_entries"),
        ]
        .into_iter()
        .find_map(|(differs, name)| differs.then_some(name))
    }
}

/// One table's cleanup in this process, shared by every handle attached to it; the task runs
/// while a handle lives, on the tokio runtime of an attached handle.
struct Shared {
    identity: String,
    settings: CleanupSettings,
    schedule: CleanupSchedule,
    round: Round,
    /// Every attached handle and the runtime it attached from: when the runtime running the task
    /// goes with its handle, the task moves to another one's.
    handles: Mutex<Vec<Attached>>,
    task: Mutex<Option<Task>>,
    removed_tx: Arc<watch::Sender<u64>>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("identity", &self.identity)
            .field("settings", &self.settings)
            .field("silos", &*lock(&self.round.silos))
            .finish_non_exhaustive()
    }
}

/// An attached handle: its id, the runtime it attached from and its table (a Cassandra table's
/// session lives on the runtime that connected it, so a moved task uses the new owner's).
struct Attached {
    id: u64,
    runtime: Handle,
    table: Arc<dyn MembershipTable>,
}

/// The running task: which handle's runtime runs it, how to stop it.
struct Task {
    owner: u64,
    stop: watch::Sender<bool>,
    join: JoinHandle<()>,
}

impl Task {
    /// Signals the task to stop; its handle, to wait for it.
    fn stop(self) -> JoinHandle<()> {
        let _ = self.stop.send(true);
        self.join
    }
}

/// Ids of handles, unique in the process.
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(0);

impl Shared {
    /// Starts a task on `runtime` with `table`, owned by handle `owner`.
    fn start(&self, owner: u64, runtime: &Handle, table: &Arc<dyn MembershipTable>) -> Task {
        let (stop, stop_rx) = watch::channel(false);
        let mut round = self.round.clone();
        round.table = Arc::clone(table);
        let join = runtime.spawn(round.run(self.schedule, stop_rx, Arc::clone(&self.removed_tx)));
        Task { owner, stop, join }
    }

    /// True when the task runs (it ends only when stopped, or with its runtime).
    fn running(&self) -> bool {
        lock(&self.task)
            .as_ref()
            .is_some_and(|t| !t.join.is_finished())
    }
}

/// Every table identity's cleanup in this process. Every change of a `Shared`'s reference
/// count happens under this lock, so "the last handle" is decided once.
static SHARED: Mutex<BTreeMap<String, Weak<Shared>>> = Mutex::new(BTreeMap::new());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A handle on the periodic defunct cleanup of a table, shared by every silo of this process on
/// that table ([`MembershipTable::identity`]).
///
/// The first handle starts the task; later ones attach to it; it stops when the last one is
/// stopped or dropped — whichever silo started it. The first handle's options run it: a later
/// one whose cleanup options (`defunct_silo_cleanup_period`, `_jitter`, `defunct_silo_expiration`,
/// `force_defunct_cleanup`, `max_defunct_silo_entries`) differ is refused with
/// [`MembershipError::InvalidConfiguration`] naming the first that differs.
///
/// Each round (every period plus jitter, the first at a random point of the first period):
/// - **age limit**: [`MembershipTable::cleanup_defunct`] with now − `defunct_silo_expiration`,
///   skipped while storage-side expiry covers it ([`MembershipTable::storage_expiry`], asked every
///   round) unless `force_defunct_cleanup`;
/// - **count limit** (`max_defunct_silo_entries`): when one of the attached silos is the first
///   Active silo of the table ([`first_active_silo`]), the oldest Dead entries beyond the limit
///   ([`excess_dead_cutoff`]) — also while storage expiry is on, which bounds entries' age, not
///   their number.
///
/// When both apply, the age limit's call runs first, then the count limit's when its cutoff is
/// later. (Orleans' count rule removes every non-Active entry older than its cutoff; ours only
/// Dead entries — see [`excess_dead_cutoff`].)
#[derive(Debug)]
pub struct DefunctCleanup {
    shared: Option<Arc<Shared>>,
    silo: Option<SiloAddress>,
    id: u64,
}

/// Why no cleanup task was started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CleanupNotStarted {
    /// `defunct_silo_cleanup_period` is `None`.
    Disabled,
}

impl DefunctCleanup {
    /// Starts (or attaches to) this process's cleanup of `table`, on behalf of no silo: the age
    /// limit runs, the count limit only while some silo attached with
    /// [`DefunctCleanup::spawn_for`] is the first Active one. See [`DefunctCleanup::spawn_for`].
    pub fn spawn(
        table: Arc<dyn MembershipTable>,
        options: &MembershipOptions,
        clock: Arc<dyn Clock>,
    ) -> Result<std::result::Result<DefunctCleanup, CleanupNotStarted>> {
        Self::attach(table, options, clock, None)
    }

    /// Starts this process's cleanup of `table`, or attaches to the one already running for the
    /// same table identity, on behalf of `silo`. `Ok(Err(Disabled))` when
    /// `defunct_silo_cleanup_period` is off. Errors (before anything is written) when the
    /// running cleanup has other options, or `max_defunct_silo_entries` is negative.
    ///
    /// The task runs on the tokio runtime of an attached handle: when the handle whose runtime
    /// runs it detaches, it moves to another attached handle's runtime, and a handle attaching
    /// restarts it when its runtime has ended. (A host that drops a runtime while a silo
    /// started on it is still attached loses the task until the next attach or detach;
    /// [`DefunctCleanup::is_active`] then says false.)
    ///
    /// # Panics
    /// Outside a tokio runtime, as `tokio::spawn` does.
    pub fn spawn_for(
        table: Arc<dyn MembershipTable>,
        options: &MembershipOptions,
        clock: Arc<dyn Clock>,
        silo: SiloAddress,
    ) -> Result<std::result::Result<DefunctCleanup, CleanupNotStarted>> {
        Self::attach(table, options, clock, Some(silo))
    }

    fn attach(
        table: Arc<dyn MembershipTable>,
        options: &MembershipOptions,
        clock: Arc<dyn Clock>,
        silo: Option<SiloAddress>,
    ) -> Result<std::result::Result<DefunctCleanup, CleanupNotStarted>> {
        let Some(schedule) = CleanupSchedule::new(options) else {
            return Ok(Err(CleanupNotStarted::Disabled));
        };
        let max_dead = match options.max_defunct_silo_entries {
            None => None,
            Some(n) => Some(u64::try_from(n).map_err(|_| {
                MembershipError::config("max_defunct_silo_entries", "must be at least 0, or off")
            })?),
        };
        let identity = table.identity();
        let settings = CleanupSettings::of(options);
        let id = NEXT_HANDLE.fetch_add(1, AtomicOrdering::Relaxed);
        let runtime = Handle::current();
        let mut registry = lock(&SHARED);
        if let Some(shared) = registry.get(&identity).and_then(Weak::upgrade) {
            if let Some(option) = shared.settings.differs(&settings) {
                return Err(MembershipError::config(
                    option,
                    format!(
                        "differs from the defunct cleanup this process already runs for {identity} (with the first silo's options); the silos of one table in one process share it and must agree on its options"
                    ),
                ));
            }
            if let Some(s) = silo {
                lock(&shared.round.silos).push(s);
            }
            {
                let mut task = lock(&shared.task);
                // The runtime that ran it has ended: run it on this one.
                if task.as_ref().is_none_or(|t| t.join.is_finished()) {
                    drop(task.take().map(Task::stop));
                    *task = Some(shared.start(id, &runtime, &table));
                }
            }
            lock(&shared.handles).push(Attached { id, runtime, table });
            return Ok(Ok(DefunctCleanup {
                shared: Some(shared),
                silo,
                id,
            }));
        }
        // `send_replace` in the task: it updates the value with no receiver subscribed.
        let (removed_tx, _) = watch::channel(0u64);
        let shared = Arc::new(Shared {
            identity: identity.clone(),
            settings,
            schedule,
            round: Round {
                table: Arc::clone(&table),
                clock,
                silos: Arc::new(Mutex::new(silo.into_iter().collect())),
                expiration: options.defunct_silo_expiration,
                force: options.force_defunct_cleanup,
                max_dead,
                call_timeout: options.effective_table_operation_timeout(),
            },
            handles: Mutex::new(Vec::new()),
            task: Mutex::new(None),
            removed_tx: Arc::new(removed_tx),
        });
        *lock(&shared.task) = Some(shared.start(id, &runtime, &table));
        lock(&shared.handles).push(Attached { id, runtime, table });
        registry.retain(|_, w| w.strong_count() > 0);
        registry.insert(identity, Arc::downgrade(&shared));
        Ok(Ok(DefunctCleanup {
            shared: Some(shared),
            silo,
            id,
        }))
    }

    /// True when the task runs and a round removes entries: the age limit is not covered by
    /// storage-side expiry (asked now) or is forced, or a count limit is set and a silo is
    /// attached.
    pub fn is_active(&self) -> bool {
        self.shared.as_ref().is_some_and(|s| {
            s.running()
                && (s.settings.force
                    || !s.round.table.storage_expiry().covers_defunct_cleanup
                    || (s.settings.max_dead.is_some() && !lock(&s.round.silos).is_empty()))
        })
    }

    /// Total entries the shared cleanup removed so far, updated after each run.
    pub fn removed(&self) -> watch::Receiver<u64> {
        match &self.shared {
            Some(s) => s.removed_tx.subscribe(),
            None => watch::channel(0).1,
        }
    }

    /// Detaches this handle; when it was the last one, stops the task and waits for it (and when
    /// the task ran on this handle's runtime, moves it to another handle's and waits for the
    /// old one to end).
    pub async fn stop(mut self) {
        if let Some(task) = self.detach() {
            let _ = task.await;
        }
    }

    /// Detaches; the last handle signals the task to stop and returns it, and a handle whose
    /// runtime runs the task while others stay attached moves it to another's runtime and
    /// returns the old one.
    fn detach(&mut self) -> Option<JoinHandle<()>> {
        let shared = self.shared.take()?;
        let mut registry = lock(&SHARED);
        if let Some(silo) = self.silo {
            let mut silos = lock(&shared.round.silos);
            if let Some(i) = silos.iter().position(|s| *s == silo) {
                silos.swap_remove(i);
            }
        }
        lock(&shared.handles).retain(|a| a.id != self.id);
        match Arc::try_unwrap(shared) {
            Ok(last) => {
                if registry
                    .get(&last.identity)
                    .is_some_and(|w| w.strong_count() == 0)
                {
                    registry.remove(&last.identity);
                }
                lock(&last.task).take().map(Task::stop)
            }
            // Another handle still holds it (dropped here, under the lock).
            Err(shared) => {
                let mut task = lock(&shared.task);
                let moves = task
                    .as_ref()
                    .is_none_or(|t| t.owner == self.id || t.join.is_finished());
                if !moves {
                    return None;
                }
                let old = task.take().map(Task::stop);
                // The first remaining handle whose runtime still runs: a task spawned on a
                // runtime that has shut down is dropped at once (finished).
                for next in lock(&shared.handles).iter() {
                    let started = shared.start(next.id, &next.runtime, &next.table);
                    if !started.join.is_finished() {
                        *task = Some(started);
                        break;
                    }
                }
                old
            }
        }
    }
}

impl Drop for DefunctCleanup {
    /// A dropped handle detaches; the last one stops the task (without waiting for it).
    fn drop(&mut self) {
        drop(self.detach());
    }
}

/// What one cleanup task needs for its rounds.
#[derive(Clone)]
struct Round {
    table: Arc<dyn MembershipTable>,
    clock: Arc<dyn Clock>,
    silos: Arc<Mutex<Vec<SiloAddress>>>,
    expiration: Duration,
    force: bool,
    max_dead: Option<u64>,
    call_timeout: Duration,
}

impl Round {
    async fn run(
        self,
        schedule: CleanupSchedule,
        mut stop_rx: watch::Receiver<bool>,
        removed_tx: Arc<watch::Sender<u64>>,
    ) {
        let table = &self.table;
        let mut delay = schedule.first_delay(jitter::unit());
        // A task moved to another runtime goes on counting.
        let mut total = *removed_tx.borrow();
        let mut was_covered = table.storage_expiry().covers_defunct_cleanup && !self.force;
        if was_covered {
            info!(
                cluster = table.cluster_id(),
                "storage-side expiry removes defunct entries by age; the age limit of the periodic cleanup is idle (re-checked every period)"
            );
        }
        loop {
            // `biased`: one order for every run (a simulation's seed fixes the history).
            tokio::select! {
                biased;
                _ = stop_rx.changed() => return,
                _ = tokio::time::sleep(delay) => {}
            }
            delay = schedule.next_delay(jitter::unit());
            // Read every period: a table can stop being covered while the silo runs (a
            // renewal finds rows without TTL), and must then be cleaned.
            let covered = table.storage_expiry().covers_defunct_cleanup && !self.force;
            if covered != was_covered {
                info!(
                    cluster = table.cluster_id(),
                    covered,
                    "storage-side expiry covers the defunct cleanup's age limit: {covered}; the age limit {}",
                    if covered { "is idle" } else { "runs" }
                );
                was_covered = covered;
            }
            let by_age = (!covered).then(|| self.clock.now().saturating_sub(self.expiration));
            // Bounded like every runtime call, and abandoned on stop: a hung call must not hold
            // up `Silo::leave` (the next period, or another process, runs it again).
            let by_count = tokio::select! {
                biased;
                c = self.count_cutoff() => c,
                _ = stop_rx.changed() => return,
            };
            // The age limit removes every non-Active entry older than its cutoff; the count
            // limit only Dead ones, and only when its cutoff is later (else the first call
            // already removed them).
            let by_count = by_count.filter(|c| by_age.is_none_or(|a| *c > a));
            for (before, dead_only) in [(by_age, false), (by_count, true)] {
                let Some(before) = before else { continue };
                let operation = if dead_only {
                    "cleanup_dead_entries"
                } else {
                    "cleanup_defunct"
                };
                let call = async {
                    if dead_only {
                        table.cleanup_dead_entries(before).await
                    } else {
                        table.cleanup_defunct(before).await
                    }
                };
                let run = bounded(operation, true, self.call_timeout, call);
                let outcome = tokio::select! {
                    biased;
                    r = run => r,
                    _ = stop_rx.changed() => return,
                };
                match outcome {
                    Ok(n) => {
                        total += n as u64;
                        if n > 0 {
                            info!(
                                cluster = table.cluster_id(),
                                removed = n,
                                by_count = dead_only,
                                "cleaned defunct entries"
                            );
                        }
                        removed_tx.send_replace(total);
                    }
                    Err(e) => {
                        warn!(cluster = table.cluster_id(), error = %e, operation, "defunct cleanup failed; next period retries")
                    }
                }
            }
        }
    }

    /// The Dead-entry limit's cutoff, when a local silo is the first Active one and the table
    /// holds too many Dead entries.
    async fn count_cutoff(&self) -> Option<Timestamp> {
        let max = self.max_dead?;
        if lock(&self.silos).is_empty() {
            return None;
        }
        let read = bounded("read_all", false, self.call_timeout, self.table.read_all()).await;
        let snapshot = match read {
            Ok(s) => s,
            Err(e) => {
                warn!(cluster = self.table.cluster_id(), error = %e, "the defunct cleanup could not read the table for max_defunct_silo_entries; next period retries");
                return None;
            }
        };
        let entries = || snapshot.rows.iter().map(|r| &r.entry);
        let first = first_active_silo(entries())?;
        if !lock(&self.silos).contains(&first) {
            return None;
        }
        excess_dead_cutoff(entries(), max)
    }
}

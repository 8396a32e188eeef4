//! The simulation's storage: the in-memory reference table behind one handle per silo
//! incarnation, with the faults the Cassandra backend can show — latency, failures, calls that
//! never answer, writes that applied but answered `OutcomeUnknown` (and ones that did not), lost
//! conditional races, a silo cut off from storage — each call's fate drawn from the seed. A write
//! reaches storage on a task of its own, so it lands whatever happens to its caller (a timeout, a
//! pause, a crash), as a request on the wire does. Each write is checked where it lands.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::{Invariant, Violation};
use crate::clock::Clock;
use crate::error::{MembershipError, Result};
use crate::memory::InMemoryMembershipTable;
use crate::model::{
    ETag, MembershipEntry, MembershipSnapshot, SiloAddress, SiloStatus, TableVersion, Timestamp,
};
use crate::options::MembershipOptions;
use crate::table::{HeartbeatOutcome, MembershipTable};

/// The wall-clock time every history starts at (fixed: part of what makes a history repeatable).
pub(super) const EPOCH_MS: i64 = 1_800_000_000_000;

/// Everything the silos share: the table, the fault switches, and what the checks need.
#[derive(Debug)]
pub(super) struct World {
    pub(super) table: InMemoryMembershipTable,
    pub(super) options: MembershipOptions,
    pub(super) skew_bound: Duration,
    start: Instant,
    state: Mutex<State>,
}

/// What changes as the history runs.
#[derive(Debug)]
pub(super) struct State {
    pub(super) rng: StdRng,
    pub(super) log: Vec<String>,
    pub(super) violations: Vec<Violation>,
    /// Storage misbehaves far more often while set.
    pub(super) storm: bool,
    /// Silos whose calls do not reach storage.
    pub(super) cut: BTreeSet<SiloAddress>,
    /// When each silo was last disturbed ([`World::last_disturbed`]).
    pub(super) disturbed: BTreeMap<SiloAddress, Duration>,
    /// The last instant a storm was on.
    pub(super) storm_seen: Option<Duration>,
    /// Heartbeats do not check the entry's status (the Cassandra table between lease renewals
    /// answers `Refreshed` on a Dead row): a silo learns it is dead only from its reads.
    pub(super) blind_heartbeats: bool,
    /// Incarnations that crashed or are leaving: their fence is false by design.
    pub(super) ended: BTreeSet<SiloAddress>,
    /// Silos paused now.
    pub(super) paused: BTreeSet<SiloAddress>,
    /// When each silo joined.
    pub(super) joined: BTreeMap<SiloAddress, Duration>,
    /// Deaths an operator wrote (the silo learns them only from its reads).
    pub(super) by_operator: BTreeSet<SiloAddress>,
    /// The latest I-am-alive time each silo stored (heartbeat, or its join's writes), on the
    /// simulation's time line.
    pub(super) landed: BTreeMap<SiloAddress, Duration>,
    /// The start of each silo's latest publish that answered it with success.
    pub(super) published: BTreeMap<SiloAddress, Duration>,
    /// The start of each silo's latest read that answered it with its own row live.
    pub(super) own_read: BTreeMap<SiloAddress, Duration>,
    /// When each silo's entry turned Dead.
    pub(super) deaths: BTreeMap<SiloAddress, Duration>,
    /// Each committed version's statuses.
    pub(super) versions: BTreeMap<u64, BTreeMap<SiloAddress, SiloStatus>>,
    /// The worst of each measured bound.
    pub(super) worst: BTreeMap<&'static str, Duration>,
    /// Each joined silo's fence, asked as its host would.
    pub(super) fences: BTreeMap<SiloAddress, crate::runtime::health::Fence>,
}

impl World {
    pub(super) fn new(seed: u64, options: MembershipOptions, skew_bound: Duration) -> Arc<World> {
        let start = Instant::now();
        let clock: Arc<dyn Clock> = Arc::new(SkewedClock::new(start, 0));
        let table = InMemoryMembershipTable::new("sim")
            .with_clock(clock)
            .with_options(options.clone());
        Arc::new(World {
            table,
            options,
            skew_bound,
            start,
            state: Mutex::new(State {
                rng: StdRng::seed_from_u64(seed),
                log: Vec::new(),
                violations: Vec::new(),
                storm: false,
                cut: BTreeSet::new(),
                disturbed: BTreeMap::new(),
                storm_seen: None,
                blind_heartbeats: false,
                ended: BTreeSet::new(),
                by_operator: BTreeSet::new(),
                joined: BTreeMap::new(),
                paused: BTreeSet::new(),
                landed: BTreeMap::new(),
                published: BTreeMap::new(),
                own_read: BTreeMap::new(),
                deaths: BTreeMap::new(),
                versions: BTreeMap::new(),
                worst: BTreeMap::new(),
                fences: BTreeMap::new(),
            }),
        })
    }

    /// A wall clock of this history's, `skew_ms` off.
    pub(super) fn clock(&self, skew_ms: i64) -> SkewedClock {
        SkewedClock::new(self.start, skew_ms)
    }

    /// Simulated time since the start.
    pub(super) fn now(&self) -> Duration {
        self.start.elapsed()
    }

    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends an event to the history.
    pub(super) fn log(&self, what: impl std::fmt::Display) {
        let line = format!("{:>10.3} {what}", self.now().as_secs_f64());
        self.state().log.push(line);
    }

    /// Records a broken guarantee (and logs it).
    pub(super) fn violated(&self, invariant: Invariant, detail: String) {
        self.log(format_args!("VIOLATION {invariant:?}: {detail}"));
        let at = self.now();
        self.state().violations.push(Violation {
            invariant,
            at,
            detail,
        });
    }

    /// Keeps `value` as the worst of `bound` if it is.
    pub(super) fn measured(&self, bound: &'static str, value: Duration) {
        let mut st = self.state();
        let worst = st.worst.entry(bound).or_default();
        *worst = (*worst).max(value);
    }

    /// The fate of one call of `silo`'s: its latency each way and what happens to it.
    fn plan(
        &self,
        silo: &SiloAddress,
        write: bool,
        conditional: bool,
    ) -> (Duration, Duration, Fate) {
        let mut st = self.state();
        let cut = st.cut.contains(silo);
        let storm = st.storm;
        let rng = &mut st.rng;
        let ms =
            |rng: &mut StdRng, lo: u64, hi: u64| Duration::from_millis(rng.random_range(lo..=hi));
        let call = self.options.effective_table_operation_timeout().as_millis() as u64;
        let (out, back) = if storm && rng.random_bool(0.05) {
            // Slower than the caller waits: a write that lands after its caller gave up.
            (ms(rng, call / 2, call * 2), ms(rng, 1, call))
        } else if storm && rng.random_bool(0.3) {
            (ms(rng, 5, 2_000), ms(rng, 5, 2_000))
        } else if rng.random_bool(0.02) {
            (ms(rng, 20, 400), ms(rng, 1, 400))
        } else {
            (ms(rng, 1, 8), ms(rng, 1, 8))
        };
        if cut {
            let fate = if rng.random_bool(0.5) {
                Fate::Hang
            } else {
                Fate::Unavailable
            };
            let now = self.now();
            st.disturbed.insert(*silo, now);
            return (out, back, fate);
        }
        let scale = if storm { 40.0 } else { 1.0 };
        let p = |base: f64| (base * scale).min(0.5);
        let roll: f64 = rng.random();
        let mut at = 0.0;
        let mut next = |pr: f64| {
            at += pr;
            roll < at
        };
        let fate = if next(p(0.002)) {
            Fate::Hang
        } else if next(p(0.002)) {
            if write {
                Fate::Unavailable
            } else {
                Fate::TimedOut
            }
        } else if write && next(p(0.002)) {
            Fate::AppliedUnknown
        } else if write && next(p(0.001)) {
            Fate::LostUnknown
        } else if conditional && next(p(0.002)) {
            Fate::LostRace
        } else {
            Fate::Answer
        };
        // A silo whose call did not simply answer, or answered slowly, is not steady now.
        if fate != Fate::Answer || out + back > Duration::from_millis(call / 4) {
            let now = self.now();
            st.disturbed.insert(*silo, now);
        }
        (out, back, fate)
    }

    /// When `silo` was last disturbed (a call that failed, hung or was slow; a pause or a cut;
    /// a storm), or `None`.
    pub(super) fn last_disturbed(&self, silo: &SiloAddress) -> Option<Duration> {
        let st = self.state();
        st.disturbed.get(silo).copied().max(st.storm_seen)
    }
}

/// What happens to one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Answer,
    /// No answer ever (the caller's bound ends it); a write never reaches storage.
    Hang,
    /// Refused before storage: nothing applied.
    Unavailable,
    /// A read that gave up.
    TimedOut,
    /// Applied, but the answer says the outcome is unknown.
    AppliedUnknown,
    /// Not applied, and the answer says the outcome is unknown.
    LostUnknown,
    /// A conditional write answered `false` without applying (a lost Paxos round).
    LostRace,
}

/// A wall clock `skew` milliseconds off the simulation's time.
#[derive(Debug)]
pub(super) struct SkewedClock {
    start: Instant,
    skew_ms: i64,
}

impl SkewedClock {
    /// A clock of the history that started at `start`.
    pub(super) fn new(start: Instant, skew_ms: i64) -> Self {
        SkewedClock { start, skew_ms }
    }
}

impl Clock for SkewedClock {
    fn now(&self) -> Timestamp {
        let elapsed = i64::try_from(self.start.elapsed().as_millis()).unwrap_or(i64::MAX);
        Timestamp::from_millis(
            EPOCH_MS
                .saturating_add(elapsed)
                .saturating_add(self.skew_ms),
        )
    }
}

/// One incarnation's handle on the storage.
#[derive(Debug)]
pub(super) struct SiloTable {
    pub(super) world: Arc<World>,
    pub(super) me: SiloAddress,
    /// This incarnation's clock skew (for the vote check).
    pub(super) skew_ms: i64,
}

fn unavailable(operation: &'static str) -> MembershipError {
    MembershipError::Unavailable {
        operation,
        source: "simulated: storage unreachable".into(),
    }
}

fn unknown(operation: &'static str) -> MembershipError {
    MembershipError::OutcomeUnknown {
        operation,
        detail: "simulated".into(),
        source: "simulated: no answer".into(),
    }
}

impl SiloTable {
    async fn read(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<MembershipSnapshot>> + Send + 'static,
    ) -> Result<MembershipSnapshot> {
        let sent = self.world.now();
        let (out, back, fate) = self.world.plan(&self.me, false, false);
        match fate {
            Fate::Hang => std::future::pending().await,
            Fate::Unavailable => {
                tokio::time::sleep(out).await;
                Err(unavailable(operation))
            }
            Fate::TimedOut => {
                tokio::time::sleep(out + back).await;
                Err(MembershipError::Timeout {
                    operation,
                    source: "simulated: read timeout".into(),
                })
            }
            _ => {
                // Served `out` after it is sent, on a task of its own: a caller paused meanwhile
                // gets the answer storage gave then, not a fresh one at its resume.
                let served = tokio::spawn(async move {
                    tokio::time::sleep(out).await;
                    call.await
                });
                let snapshot = served
                    .await
                    .unwrap_or_else(|_| Err(unavailable(operation)))?;
                tokio::time::sleep(back).await;
                let live = snapshot
                    .get(&self.me)
                    .is_some_and(|r| r.entry.status != SiloStatus::Dead);
                if live {
                    let mut st = self.world.state();
                    let last = st.own_read.entry(self.me).or_default();
                    *last = (*last).max(sent);
                }
                Ok(snapshot)
            }
        }
    }

    /// A write: reaches storage `out` after it is sent, on a task of its own; `lost` is what a
    /// lost conditional race answers.
    async fn write<T, F, Fut>(
        &self,
        operation: &'static str,
        lost: Option<T>,
        apply: F,
    ) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(InMemoryMembershipTable) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + Send,
    {
        let sent = self.world.now();
        let (out, back, fate) = self.world.plan(&self.me, true, lost.is_some());
        let land = |world: Arc<World>, writer: SiloAddress, skew_ms: i64| async move {
            tokio::time::sleep(out).await;
            let before = world.table.read_all().await;
            let result = apply(world.table.clone()).await;
            let after = world.table.read_all().await;
            if let (Ok(before), Ok(after)) = (before, after) {
                super::check::landed(&world, writer, skew_ms, sent, &before, &after);
            }
            result
        };
        match fate {
            Fate::Hang => std::future::pending().await,
            Fate::Unavailable | Fate::TimedOut => {
                tokio::time::sleep(out).await;
                Err(unavailable(operation))
            }
            Fate::LostUnknown => {
                tokio::time::sleep(out + back).await;
                Err(unknown(operation))
            }
            Fate::LostRace => {
                tokio::time::sleep(out + back).await;
                lost.ok_or_else(|| unknown(operation))
            }
            Fate::AppliedUnknown => {
                tokio::spawn(land(Arc::clone(&self.world), self.me, self.skew_ms));
                tokio::time::sleep(out + back).await;
                Err(unknown(operation))
            }
            Fate::Answer => {
                let landed = tokio::spawn(land(Arc::clone(&self.world), self.me, self.skew_ms));
                let result = landed.await.unwrap_or_else(|_| Err(unavailable(operation)));
                tokio::time::sleep(back).await;
                result
            }
        }
    }

    /// A publish of this silo's answered with success: the fence may count from `sent`.
    fn published(&self, sent: Duration) {
        let mut st = self.world.state();
        let last = st.published.entry(self.me).or_default();
        *last = (*last).max(sent);
    }
}

#[async_trait]
impl MembershipTable for SiloTable {
    fn cluster_id(&self) -> &str {
        self.world.table.cluster_id()
    }

    fn membership_options(&self) -> &MembershipOptions {
        &self.world.options
    }

    async fn initialize(&self, try_init_version: bool) -> Result<()> {
        self.write("initialize", None, move |t| async move {
            t.initialize(try_init_version).await
        })
        .await
    }

    async fn read_all(&self) -> Result<MembershipSnapshot> {
        let table = self.world.table.clone();
        self.read("read_all", async move { table.read_all().await })
            .await
    }

    async fn read_row(&self, address: &SiloAddress) -> Result<MembershipSnapshot> {
        let (table, address) = (self.world.table.clone(), *address);
        self.read("read_row", async move { table.read_row(&address).await })
            .await
    }

    async fn insert_row(
        &self,
        entry: &MembershipEntry,
        new_version: &TableVersion,
    ) -> Result<bool> {
        let (entry, version) = (entry.clone(), new_version.clone());
        let sent = self.world.now();
        let applied = self
            .write("insert_row", Some(false), move |t| async move {
                t.insert_row(&entry, &version).await
            })
            .await;
        if matches!(applied, Ok(true)) {
            self.published(sent);
        }
        applied
    }

    async fn update_row(
        &self,
        entry: &MembershipEntry,
        etag: &ETag,
        new_version: &TableVersion,
    ) -> Result<bool> {
        let own = entry.address == self.me && entry.status == SiloStatus::Active;
        let (entry, etag, version) = (entry.clone(), etag.clone(), new_version.clone());
        let sent = self.world.now();
        let applied = self
            .write("update_row", Some(false), move |t| async move {
                t.update_row(&entry, &etag, &version).await
            })
            .await;
        if own && matches!(applied, Ok(true)) {
            self.published(sent);
        }
        applied
    }

    async fn update_i_am_alive(
        &self,
        address: &SiloAddress,
        time: Timestamp,
    ) -> Result<HeartbeatOutcome> {
        let address = *address;
        let sent = self.world.now();
        let outcome = self
            .write("update_i_am_alive", None, move |t| async move {
                t.update_i_am_alive(&address, time).await
            })
            .await
            .map(|outcome| match outcome {
                HeartbeatOutcome::DeclaredDead { lease } if self.world.state().blind_heartbeats => {
                    HeartbeatOutcome::Refreshed { lease }
                }
                other => other,
            });
        if matches!(outcome, Ok(HeartbeatOutcome::Refreshed { .. })) {
            self.published(sent);
        }
        outcome
    }

    async fn cleanup_defunct(&self, before: Timestamp) -> Result<usize> {
        self.world.table.cleanup_defunct(before).await
    }

    async fn cleanup_dead_entries(&self, before: Timestamp) -> Result<usize> {
        self.world.table.cleanup_dead_entries(before).await
    }

    async fn delete_cluster(&self, cluster_id: &str) -> Result<()> {
        self.world.table.delete_cluster(cluster_id).await
    }
}

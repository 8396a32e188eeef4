//! The simulation's driver: starts the silos, draws process and storage faults from the seed,
//! keeps an agenda of what ends them (a resume, a heal, a restart), checks every silo's fence
//! every tick, and reports.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rand::Rng;
use tokio::task::JoinHandle;

use super::check::name;
use super::storage::{SiloTable, World};
use super::{Invariant, SimConfig, SimReport};
use crate::model::{SiloAddress, SiloStatus, Timestamp};
use crate::runtime::health::SiloHealth;
use crate::runtime::protocol;
use crate::runtime::silo::Silo;
use crate::runtime::task::Pause;
use crate::table::MembershipTable;

/// How often every fence is asked.
const TICK: Duration = Duration::from_millis(250);

/// One incarnation of a silo process.
struct Incarnation {
    address: SiloAddress,
    pause: Pause,
    silo: Arc<Mutex<Option<Arc<Silo>>>>,
    host: JoinHandle<()>,
    started: Duration,
    leaving: bool,
    crashed: bool,
}

impl Incarnation {
    fn silo(&self) -> Option<Arc<Silo>> {
        self.silo
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// What the agenda holds: the ends of faults, and restarts.
#[derive(Clone, Copy, Debug)]
enum Due {
    Resume(SiloAddress),
    Heal(SiloAddress),
    StormEnds,
    Restart(usize),
    /// A crashed silo must be Dead by now if enough steady voters remain.
    CheckDead(SiloAddress),
}

struct Driver {
    world: Arc<World>,
    config: SimConfig,
    /// Per slot (10.0.0.<slot + 1>): its generations so far and the running one.
    slots: Vec<(i32, Option<Incarnation>)>,
    agenda: BTreeMap<(Duration, u64), Due>,
    next_id: u64,
    silo_time: Duration,
}

pub(super) async fn simulate(seed: u64, config: SimConfig) -> SimReport {
    let world = World::new(seed, config.options.clone(), config.skew);
    let _ = world.table.initialize(true).await;
    let mut d = Driver {
        world: Arc::clone(&world),
        slots: (0..config.silos.clamp(1, 250)).map(|_| (0, None)).collect(),
        config,
        agenda: BTreeMap::new(),
        next_id: 0,
        silo_time: Duration::ZERO,
    };
    let blind = d.chance(0.5);
    world.state().blind_heartbeats = blind;
    let o = &d.config.options;
    world.log(format_args!(
        "seed {seed}: {} silos, {:?} publish period, {:?} horizon, {:?} of history, skew up to {:?}, heartbeats {} the entry's status",
        d.slots.len(),
        o.i_am_alive_table_publish_timeout,
        o.detection_horizon(),
        d.config.duration,
        d.config.skew,
        if blind { "do not check" } else { "check" }
    ));
    let checker = tokio::spawn(check_fences(Arc::clone(&world)));
    let period = d.config.options.i_am_alive_table_publish_timeout;
    // A third of the histories start cold: every silo at once (a rollout, a cluster's first
    // start), so their periodic rounds begin in step.
    let cold = d.chance(0.34);
    world.log(if cold {
        "cold start: every silo at once"
    } else {
        "staggered start: each silo within the first period"
    });
    for slot in 0..d.slots.len() {
        let at = if cold {
            Duration::ZERO
        } else {
            d.random(Duration::ZERO, period)
        };
        d.schedule(at, Due::Restart(slot));
    }
    let tail_start = d.config.duration.saturating_sub(d.config.quiet_tail());
    loop {
        let fault_at = world.now() + d.exponential(d.config.fault_every);
        let next_due = d.agenda.keys().next().map(|k| k.0);
        let until = next_due
            .map_or(fault_at, |due| due.min(fault_at))
            .min(tail_start);
        tokio::time::sleep_until(tokio::time::Instant::now() + until.saturating_sub(world.now()))
            .await;
        if world.now() >= tail_start {
            break;
        }
        if next_due.is_some_and(|due| due <= world.now()) {
            if let Some((_, due)) = d.agenda.pop_first() {
                d.apply(due);
            }
        } else {
            d.fault();
        }
        d.restart_failed_joins();
    }
    // The quiet tail: every fault healed, nothing new; the crashed stay down.
    world.log("quiet tail: faults healed, no new ones");
    for (key, due) in std::mem::take(&mut d.agenda) {
        match due {
            Due::Restart(_) => {}
            Due::CheckDead(_) => {
                d.agenda.insert(key, due);
            }
            other => d.apply(other),
        }
    }
    // The crashes' checks that fall in the tail, each at its time.
    while let Some(((at, _), due)) = d.agenda.pop_first() {
        if at > d.config.duration {
            break;
        }
        tokio::time::sleep_until(tokio::time::Instant::now() + at.saturating_sub(world.now()))
            .await;
        d.apply(due);
    }
    let crashed: Vec<SiloAddress> = d.down_and_not_dead();
    // Let the resumed and reconnected settle (one period), then count who can vote.
    tokio::time::sleep(d.config.options.i_am_alive_table_publish_timeout).await;
    let voters = d.live_voters();
    tokio::time::sleep(d.config.duration.saturating_sub(world.now())).await;
    let bound = d.config.detection_bound();
    if voters >= d.config.options.num_votes_for_death_declaration {
        for address in crashed {
            let st = world.state();
            let dead = st.deaths.contains_key(&address);
            let silent_since = st.landed.get(&address).copied().unwrap_or_default();
            drop(st);
            if !dead && silent_since + bound < world.now() {
                world.violated(
                    Invariant::DeadWithinBound,
                    format!(
                        "{} crashed and is not Dead {:.3}s after the I-am-alive time it last stored, with {voters} live voters (bound {bound:?})",
                        name(&address),
                        (world.now() - silent_since).as_secs_f64()
                    ),
                );
            }
        }
    }
    checker.abort();
    d.end_all();
    let st = world.state();
    SimReport {
        seed,
        log: st.log.clone(),
        violations: st.violations.clone(),
        silo_hours: d.silo_time.as_secs_f64() / 3_600.0,
        worst: st.worst.clone(),
    }
}

impl Driver {
    fn random(&self, lo: Duration, hi: Duration) -> Duration {
        let (lo, hi) = (
            lo.as_millis() as u64,
            hi.as_millis().max(lo.as_millis()) as u64,
        );
        Duration::from_millis(self.world.state().rng.random_range(lo..=hi))
    }

    fn exponential(&self, mean: Duration) -> Duration {
        let u: f64 = self.world.state().rng.random_range(1e-9..1.0);
        Duration::from_secs_f64((-u.ln() * mean.as_secs_f64()).min(mean.as_secs_f64() * 20.0))
    }

    fn chance(&self, p: f64) -> bool {
        self.world.state().rng.random_bool(p)
    }

    fn schedule(&mut self, at: Duration, due: Due) {
        self.next_id += 1;
        self.agenda.insert((at, self.next_id), due);
    }

    /// The running incarnations (joined or joining, not crashed, not leaving).
    fn running(&self) -> Vec<SiloAddress> {
        self.slots
            .iter()
            .filter_map(|(_, i)| i.as_ref())
            .filter(|i| !i.crashed && !i.leaving)
            .map(|i| i.address)
            .collect()
    }

    fn incarnation(&mut self, address: &SiloAddress) -> Option<&mut Incarnation> {
        self.slots
            .iter_mut()
            .filter_map(|(_, i)| i.as_mut())
            .find(|i| i.address == *address)
    }

    fn pick(&self, pool: &[SiloAddress]) -> Option<SiloAddress> {
        if pool.is_empty() {
            return None;
        }
        let i = self.world.state().rng.random_range(0..pool.len());
        Some(pool[i])
    }

    /// One fault, drawn from the seed.
    fn fault(&mut self) {
        let horizon = self.config.options.detection_horizon();
        let period = self.config.options.i_am_alive_table_publish_timeout;
        let running = self.running();
        let now = self.world.now();
        let roll: f64 = self.world.state().rng.random();
        if roll < 0.2 {
            let Some(a) = self.pick(&running) else { return };
            self.world.log(format_args!("{} crashes", name(&a)));
            self.end(&a, true);
            let back = self.random(period, horizon * 3);
            self.schedule(now + back, Due::Restart(slot_of(&a)));
            // A member (its join ended Active) must be declared dead; a crash mid-join leaves a
            // Joining entry, which no one votes on (defunct cleanup or expiry removes it).
            let (landed, member) = {
                let st = self.world.state();
                let alive = !st.deaths.contains_key(&a);
                (
                    st.landed.get(&a).copied(),
                    alive && st.joined.contains_key(&a),
                )
            };
            if member {
                let check = (landed.unwrap_or(now) + self.config.detection_bound()).max(now);
                self.schedule(check, Due::CheckDead(a));
            }
        } else if roll < 0.45 {
            let paused: Vec<SiloAddress> = running
                .iter()
                .copied()
                .filter(|a| {
                    self.incarnation_ref(a)
                        .is_some_and(|i| !i.pause.is_paused())
                })
                .collect();
            let Some(a) = self.pick(&paused) else { return };
            let long = self.chance(0.4);
            let d = if long {
                self.random(horizon, horizon * 3)
            } else {
                self.random(period / 10, period * 2)
            };
            self.world.log(format_args!(
                "{} pauses for {:.3}s",
                name(&a),
                d.as_secs_f64()
            ));
            if let Some(i) = self.incarnation(&a) {
                i.pause.set(true);
            }
            self.world.state().disturbed.insert(a, now);
            self.world.state().paused.insert(a);
            self.schedule(now + d, Due::Resume(a));
        } else if roll < 0.55 {
            let Some(a) = self.pick(&running) else { return };
            self.leave(&a);
        } else if roll < 0.75 {
            let Some(a) = self.pick(&running) else { return };
            let d = self.random(period / 2, horizon * 3);
            self.world.log(format_args!(
                "{} cut off from storage for {:.3}s",
                name(&a),
                d.as_secs_f64()
            ));
            self.world.state().cut.insert(a);
            self.world.state().disturbed.insert(a, now);
            self.schedule(now + d, Due::Heal(a));
            // Cut off past its detection bound: the others must declare it dead by then.
            let (landed, member) = {
                let st = self.world.state();
                let alive = !st.deaths.contains_key(&a);
                (
                    st.landed.get(&a).copied(),
                    alive && st.joined.contains_key(&a),
                )
            };
            let due = landed.unwrap_or(now) + self.config.detection_bound();
            if member && now + d > due {
                self.schedule(due.max(now), Due::CheckDead(a));
            }
        } else if roll < 0.85 {
            let d = self.random(period / 10, period * 2);
            self.world
                .log(format_args!("storage storm for {:.3}s", d.as_secs_f64()));
            let mut st = self.world.state();
            st.storm = true;
            st.storm_seen = Some(now);
            drop(st);
            self.schedule(now + d, Due::StormEnds);
        } else if roll < 0.9 {
            // A member not already Dead (else its death by votes would read as the operator's).
            let alive: Vec<SiloAddress> = {
                let st = self.world.state();
                running
                    .iter()
                    .copied()
                    .filter(|a| !st.deaths.contains_key(a))
                    .collect()
            };
            let Some(a) = self.pick(&alive) else { return };
            self.operator_declares_dead(a);
        }
        // Otherwise a quiet spell.
    }

    fn incarnation_ref(&self, address: &SiloAddress) -> Option<&Incarnation> {
        self.slots
            .iter()
            .filter_map(|(_, i)| i.as_ref())
            .find(|i| i.address == *address)
    }

    fn apply(&mut self, due: Due) {
        let now = self.world.now();
        match due {
            Due::Resume(a) => {
                if let Some(i) = self.incarnation(&a) {
                    i.pause.set(false);
                    self.world.log(format_args!("{} resumes", name(&a)));
                }
                self.world.state().disturbed.insert(a, now);
                self.world.state().paused.remove(&a);
            }
            Due::Heal(a) => {
                let mut st = self.world.state();
                st.cut.remove(&a);
                st.disturbed.insert(a, now);
                drop(st);
                self.world
                    .log(format_args!("{} reaches storage again", name(&a)));
            }
            Due::StormEnds => {
                let mut st = self.world.state();
                st.storm = false;
                st.storm_seen = Some(now);
                drop(st);
                self.world.log("storage calm again");
            }
            Due::Restart(slot) => self.start(slot),
            Due::CheckDead(a) => self.check_dead(a),
        }
    }

    /// Starts a new incarnation in `slot` (ending the one there, if any).
    fn start(&mut self, slot: usize) {
        if let Some(old) = self.slots[slot].1.take() {
            self.retire(old);
        }
        let generation = self.slots[slot].0 + 1;
        self.slots[slot].0 = generation;
        let ip = std::net::Ipv4Addr::new(10, 0, 0, u8::try_from(slot + 1).unwrap_or(u8::MAX));
        let address = SiloAddress::from_v4(std::net::SocketAddrV4::new(ip, 11111), generation);
        let skew = self.config.skew.as_millis() as i64;
        let skew_ms = self.world.state().rng.random_range(-skew..=skew);
        let table = Arc::new(SiloTable {
            world: Arc::clone(&self.world),
            me: address,
            skew_ms,
        });
        let pause = Pause::default();
        let holder = Arc::new(Mutex::new(None));
        let world = Arc::clone(&self.world);
        self.world.log(format_args!(
            "{} starts (clock {skew_ms:+} ms)",
            name(&address)
        ));
        let host = pause.spawn(host(world, table, address, skew_ms, Arc::clone(&holder)));
        self.slots[slot].1 = Some(Incarnation {
            address,
            pause,
            silo: holder,
            host,
            started: self.world.now(),
            leaving: false,
            crashed: false,
        });
    }

    /// Incarnations whose join failed (the host ended with no silo) start again a period later.
    fn restart_failed_joins(&mut self) {
        let period = self.config.options.i_am_alive_table_publish_timeout;
        let now = self.world.now();
        let failed: Vec<usize> = (0..self.slots.len())
            .filter(|&s| {
                self.slots[s].1.as_ref().is_some_and(|i| {
                    i.host.is_finished() && i.silo().is_none() && !i.crashed && !i.leaving
                })
            })
            .collect();
        for slot in failed {
            if let Some(mut i) = self.slots[slot].1.take() {
                i.crashed = true;
                self.retire(i);
            }
            self.schedule(now + period, Due::Restart(slot));
        }
    }

    /// Crashes (`crash`) or just stops tracking an incarnation.
    fn end(&mut self, address: &SiloAddress, crash: bool) {
        self.world.state().ended.insert(*address);
        if let Some(i) = self.incarnation(address)
            && crash
        {
            i.crashed = true;
            i.host.abort();
            if let Some(silo) = i.silo() {
                silo.crash();
            }
            i.pause.set(false);
        }
    }

    fn retire(&mut self, i: Incarnation) {
        self.silo_time += self.world.now().saturating_sub(i.started);
        if let Some(silo) = i.silo() {
            silo.crash();
        }
        i.host.abort();
        i.pause.set(false);
    }

    /// A graceful leave, on the silo's own (pausable) side; a new incarnation later.
    fn leave(&mut self, address: &SiloAddress) {
        let now = self.world.now();
        let horizon = self.config.options.detection_horizon();
        let back = self.random(horizon / 3, horizon * 2);
        let timeout = self.config.options.leave_timeout;
        let world = Arc::clone(&self.world);
        let Some(i) = self.incarnation(address) else {
            return;
        };
        let Some(silo) = i.silo() else { return };
        if i.pause.is_paused() {
            return;
        }
        i.leaving = true;
        let address = i.address;
        world.state().ended.insert(address);
        i.pause.spawn(async move {
            world.log(format_args!("{} leaves", name(&address)));
            let started = world.now();
            let left = silo.leave().await;
            let took = world.now() - started;
            world.measured("leave", took);
            world.log(format_args!(
                "{} leave ended after {:.3}s: {left:?}",
                name(&address),
                took.as_secs_f64()
            ));
            if took > timeout + Duration::from_millis(5) {
                world.violated(
                    Invariant::LeaveWithinTimeout,
                    format!(
                        "{} leave took {:.3}s (leave_timeout {timeout:?})",
                        name(&address),
                        took.as_secs_f64()
                    ),
                );
            }
        });
        self.schedule(now + back, Due::Restart(slot_of(&address)));
    }

    /// An operator declares `a` dead (`cassandra-membership declare-dead`): written directly,
    /// outside the silos; the silo learns it only from its reads (heartbeats may be blind).
    fn operator_declares_dead(&mut self, a: SiloAddress) {
        let world = Arc::clone(&self.world);
        world.state().by_operator.insert(a);
        world.log(format_args!("an operator declares {} dead", name(&a)));
        let at = world.now();
        tokio::spawn(async move {
            let table = &world.table;
            let before = table.read_all().await;
            let millis = i64::try_from(at.as_millis()).unwrap_or(i64::MAX);
            let now = Timestamp::from_millis(super::storage::EPOCH_MS.saturating_add(millis));
            let _ = protocol::set_status(table, &a, SiloStatus::Dead, now).await;
            let after = table.read_all().await;
            if let (Ok(before), Ok(after)) = (before, after) {
                super::check::landed(&world, a, 0, at, &before, &after);
            }
        });
    }

    /// [`Invariant::DeadWithinBound`] for a crashed silo or one still cut off from storage, at its
    /// bound: Dead, unless fewer than the votes needed were steady voters (serving, undisturbed)
    /// since its last I-am-alive time.
    fn check_dead(&mut self, a: SiloAddress) {
        // Only while it stays silent: crashed, or still cut off from storage.
        let crashed = self.incarnation_ref(&a).is_none_or(|i| i.crashed);
        if !crashed && !self.world.state().cut.contains(&a) {
            return;
        }
        let st = self.world.state();
        let since = st.landed.get(&a).copied().unwrap_or_default();
        let died = st.deaths.get(&a).copied();
        drop(st);
        // A write it sent before crashing may have landed since: the bound counts from it.
        let due = since + self.config.detection_bound();
        if died.is_none() && self.world.now() < due {
            self.schedule(due, Due::CheckDead(a));
            return;
        }
        let steady = self
            .slots
            .iter()
            .filter_map(|(_, i)| i.as_ref())
            .filter(|i| !i.crashed && !i.leaving && !i.pause.is_paused() && i.started < since)
            .filter(|i| {
                self.world
                    .last_disturbed(&i.address)
                    .is_none_or(|d| d < since)
            })
            .filter(|i| {
                self.world
                    .state()
                    .fences
                    .get(&i.address)
                    .is_some_and(crate::runtime::health::Fence::should_serve)
            })
            .count() as u32;
        if steady < self.config.options.num_votes_for_death_declaration {
            return;
        }
        match died {
            // The measured bound: crashes with enough steady voters only (the others may take
            // as long as their voters' troubles last).
            Some(died) => self.world.measured(
                "a crashed or cut-off member Dead after its last I-am-alive time (steady voters)",
                died.saturating_sub(since),
            ),
            None => self.world.violated(
                Invariant::DeadWithinBound,
                format!(
                    "{} crashed and is not Dead {:.3}s after the I-am-alive time it last stored, with {steady} steady voters (bound {:?})",
                    name(&a),
                    (self.world.now() - since).as_secs_f64(),
                    self.config.detection_bound()
                ),
            ),
        }
    }

    /// Members that can vote: joined, running, serving.
    fn live_voters(&self) -> u32 {
        let st = self.world.state();
        self.slots
            .iter()
            .filter_map(|(_, i)| i.as_ref())
            .filter(|i| !i.crashed && !i.leaving && !i.pause.is_paused())
            .filter(|i| st.fences.get(&i.address).is_some_and(|f| f.should_serve()))
            .count() as u32
    }

    /// Crashed incarnations still in their slot and not declared Dead.
    fn down_and_not_dead(&self) -> Vec<SiloAddress> {
        let st = self.world.state();
        self.slots
            .iter()
            .filter_map(|(_, i)| i.as_ref())
            .filter(|i| i.crashed && i.silo().is_some() && !st.deaths.contains_key(&i.address))
            .map(|i| i.address)
            .collect()
    }

    fn end_all(&mut self) {
        for slot in 0..self.slots.len() {
            if let Some(i) = self.slots[slot].1.take() {
                self.retire(i);
            }
        }
    }
}

fn slot_of(a: &SiloAddress) -> usize {
    match a.endpoint().ip() {
        std::net::IpAddr::V4(ip) => usize::from(ip.octets()[3]).saturating_sub(1),
        std::net::IpAddr::V6(_) => 0,
    }
}

/// A silo host: joins, then watches its silo (views and health, logged and checked) until it
/// ends. Runs inside the incarnation's pause, so a pause stops it as it stops the silo.
async fn host(
    world: Arc<World>,
    table: Arc<SiloTable>,
    address: SiloAddress,
    skew_ms: i64,
    holder: Arc<Mutex<Option<Arc<Silo>>>>,
) {
    let clock = Arc::new(world.clock(skew_ms));
    let table: Arc<dyn MembershipTable> = table;
    let silo = match Silo::builder(table, address).clock(clock).join().await {
        Ok(silo) => Arc::new(silo),
        Err(e) => {
            world.log(format_args!("{} join failed: {e}", name(&address)));
            return;
        }
    };
    world.log(format_args!("{} joined", name(&address)));
    let now = world.now();
    let mut st = world.state();
    st.fences.insert(address, silo.fence());
    st.joined.insert(address, now);
    drop(st);
    *holder.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::clone(&silo));
    // The observer is not the silo's: it sees each view and health as it is published.
    let (mut views, mut health) = (silo.view(), silo.health());
    drop(silo);
    tokio::spawn(async move {
        let mut last_version = 0u64;
        loop {
            tokio::select! {
                biased;
                changed = health.changed() => {
                    if changed.is_err() { return; }
                    let h = health.borrow_and_update().clone();
                    let cause = match &h {
                        SiloHealth::Failing { cause, .. } => format!(" ({cause:?})"),
                        SiloHealth::LeaseAtRisk { cause: Some(cause), .. } => format!(" ({cause:?})"),
                        _ => String::new(),
                    };
                    world.log(format_args!("{} health {}{cause}", name(&address), health_name(&h)));
                }
                changed = views.changed() => {
                    if changed.is_err() { return; }
                    let view = views.borrow_and_update().clone();
                    last_version = check_view(&world, &address, &view, last_version);
                }
            }
        }
    });
}

fn health_name(h: &SiloHealth) -> &'static str {
    match h {
        SiloHealth::Starting => "Starting",
        SiloHealth::Healthy { .. } => "Healthy",
        SiloHealth::Failing { .. } => "Failing",
        SiloHealth::LeaseAtRisk { .. } => "LeaseAtRisk",
        SiloHealth::EntryMissing => "EntryMissing",
        SiloHealth::DeclaredDead => "DeclaredDead",
        SiloHealth::Stopped => "Stopped",
    }
}

/// [`Invariant::ViewsMonotonic`] for one view of `me`'s.
fn check_view(
    world: &World,
    me: &SiloAddress,
    view: &crate::runtime::view::ClusterView,
    last: u64,
) -> u64 {
    let v = view.version().version;
    if v < last {
        world.violated(
            Invariant::ViewsMonotonic,
            format!("{} view went back from v{last} to v{v}", name(me)),
        );
        return last;
    }
    if view.is_stale() {
        return v;
    }
    let seen: BTreeMap<SiloAddress, _> = view
        .entries()
        .iter()
        .map(|e| (e.address, e.status))
        .collect();
    let committed = world.state().versions.get(&v).cloned();
    if let Some(committed) = committed
        && committed != seen
    {
        world.violated(
            Invariant::ViewsMonotonic,
            format!("{} view of v{v} differs from what v{v} committed", name(me)),
        );
    }
    v
}

/// [`Invariant::NoServingAfterDeath`] and [`Invariant::FenceBound`], asked of every silo's fence
/// every tick, paused or not (a host resumed at that instant would ask the same).
async fn check_fences(world: Arc<World>) {
    let offset = crate::runtime::fence_offset(&world.options);
    let horizon = world.options.detection_horizon();
    // Each silo's breach of each guarantee is reported once, not every tick it lasts.
    let mut reported = std::collections::BTreeSet::new();
    loop {
        tokio::time::sleep(TICK).await;
        let now = world.now();
        let mut broken = Vec::new();
        let (mut worst_publish, mut worst_read) = (Duration::ZERO, Duration::ZERO);
        {
            let st = world.state();
            for (address, fence) in &st.fences {
                if !fence.should_serve() {
                    // A silo whose calls have all answered promptly for a detection horizon and
                    // two periods, and that nobody declared dead, must serve.
                    let steady_since = st
                        .disturbed
                        .get(address)
                        .copied()
                        .max(st.storm_seen)
                        .max(st.joined.get(address).copied())
                        .unwrap_or_default();
                    let settled = horizon + world.options.i_am_alive_table_publish_timeout * 2;
                    if !st.ended.contains(address)
                        && !st.paused.contains(address)
                        && !st.cut.contains(address)
                        && !st.deaths.contains_key(address)
                        && now.saturating_sub(steady_since) > settled
                    {
                        broken.push((
                            Invariant::HealthySiloServes,
                            *address,
                            format!(
                                "{} refuses to serve though every call of its answered promptly for {:.3}s (health {:?})",
                                name(address),
                                now.saturating_sub(steady_since).as_secs_f64(),
                                fence.health()
                            ),
                        ));
                    }
                    continue;
                }
                if st.deaths.contains_key(address) && !st.by_operator.contains(address) {
                    broken.push((
                        Invariant::NoServingAfterDeath,
                        *address,
                        format!(
                            "{} answers should_serve() == true after its death",
                            name(address)
                        ),
                    ));
                }
                let published = st.published.get(address).copied().unwrap_or_default();
                let read = st.own_read.get(address).copied().unwrap_or_default();
                let since_publish = now.saturating_sub(published);
                let since_read = now.saturating_sub(read);
                worst_publish = worst_publish.max(since_publish);
                worst_read = worst_read.max(since_read);
                if since_publish >= offset {
                    broken.push((
                        Invariant::FenceBound,
                        *address,
                        format!(
                            "{} serves {:.3}s after its last successful publish began (fence horizon {offset:?})",
                            name(address),
                            since_publish.as_secs_f64()
                        ),
                    ));
                }
                if since_read >= horizon {
                    broken.push((
                        Invariant::FenceBound,
                        *address,
                        format!(
                            "{} serves {:.3}s after its last read of its own row began (bound {horizon:?})",
                            name(address),
                            since_read.as_secs_f64()
                        ),
                    ));
                }
            }
        }
        world.measured("served after the last publish began", worst_publish);
        world.measured("served after the last own-row read began", worst_read);
        for (invariant, address, detail) in broken {
            if reported.insert((invariant, address)) {
                world.violated(invariant, detail);
            }
        }
    }
}

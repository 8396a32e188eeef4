//! The defunct cleanup: one per table and process, once per period, asleep while storage expiry
//! covers it, and bounded when its call hangs.

use std::sync::Arc;
use std::time::Duration;

use cassandra_membership::conformance::faults::{Injection, Operation};
use cassandra_membership::runtime::{DefunctCleanup, protocol};
use cassandra_membership::{
    Clock, InMemoryMembershipTable, MembershipEntry, MembershipError, MembershipOptions,
    MembershipTable, SiloAddress, SiloStatus, Timestamp, TokioClock,
};

use crate::utils::{
    address, entry, faulty, faulty_on_paused_clock, faulty_on_paused_clock_with, join, options,
    try_join,
};

#[tokio::test(start_paused = true)]
async fn defunct_cleanup_runs_once_per_period_and_is_shared_within_a_process() {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::new());
    let table = Arc::new(InMemoryMembershipTable::new("cleanup").with_clock(clock.clone()));
    table.initialize(true).await.unwrap();
    let mut old = entry(9);
    old.status = SiloStatus::Dead;
    old.start_time = Timestamp::now().saturating_sub(Duration::from_secs(30 * 24 * 3600));
    old.i_am_alive_time = old.start_time;
    protocol::join(table.as_ref(), &old).await.unwrap();
    let o = MembershipOptions::default();
    let cleanup = DefunctCleanup::spawn(table.clone(), &o, clock.clone())
        .unwrap()
        .unwrap();
    let second = DefunctCleanup::spawn(table.clone(), &o, clock.clone())
        .unwrap()
        .expect("a second handle attaches to the running cleanup");
    let mut removed = cleanup.removed();
    tokio::time::timeout(Duration::from_secs(3600), removed.wait_for(|n| *n == 1))
        .await
        .expect("the first run falls within the first period")
        .unwrap();
    assert_eq!(*second.removed().borrow(), 1, "one cleanup, seen by both");
    assert!(table.read_all().await.unwrap().rows.is_empty());
    cleanup.stop().await;
    second.stop().await;
    // Once stopped, another may start.
    let again = DefunctCleanup::spawn(table.clone(), &o, clock.clone())
        .unwrap()
        .unwrap();
    assert_eq!(*again.removed().borrow(), 0, "a fresh cleanup");
    again.stop().await;
}

/// The cleanup task re-reads `storage_expiry()` every period: it sleeps while storage covers
/// the cleanup, and cleans once it no longer does (a flag read once, at start, would never clean
/// a table that stopped being covered).
#[tokio::test(start_paused = true)]
async fn cleanup_sleeps_while_storage_expiry_covers_it_and_runs_once_it_does_not() {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::new());
    let table =
        faulty(InMemoryMembershipTable::new("expiring").with_expiry(Duration::from_secs(3600)));
    table.set_covers_defunct_cleanup(Some(true));
    let o = MembershipOptions::default();
    let hour = Duration::from_secs(3600);
    let cleanup = DefunctCleanup::spawn(table.clone(), &o, clock.clone())
        .unwrap()
        .expect("the task starts, and watches whether storage still covers the cleanup");
    tokio::time::sleep(3 * hour).await;
    assert_eq!(
        table.calls(Operation::CleanupDefunct),
        0,
        "covered: no cleanup"
    );
    table.set_covers_defunct_cleanup(Some(false));
    tokio::time::sleep(2 * hour + o.defunct_silo_cleanup_jitter).await;
    let ran = table.calls(Operation::CleanupDefunct);
    assert!(ran >= 1, "no longer covered: the cleanup runs");
    assert!(cleanup.is_active());
    table.set_covers_defunct_cleanup(Some(true));
    tokio::time::sleep(2 * hour).await;
    let settled = table.calls(Operation::CleanupDefunct);
    assert!(
        settled <= ran + 1,
        "at most a run already due when covered again"
    );
    tokio::time::sleep(3 * hour).await;
    assert_eq!(
        table.calls(Operation::CleanupDefunct),
        settled,
        "covered again: none"
    );
    cleanup.stop().await;
    // Forced, it cleans even while covered.
    let mut forced = o;
    forced.force_defunct_cleanup = true;
    let cleanup = DefunctCleanup::spawn(table.clone(), &forced, clock)
        .unwrap()
        .unwrap();
    tokio::time::sleep(2 * hour).await;
    assert!(table.calls(Operation::CleanupDefunct) > settled);
    cleanup.stop().await;
}

/// Unrelated tables do not share a cleanup, and a silo whose cleanup options differ from the
/// shared cleanup's (the first silo's) is refused before anything is written.
#[tokio::test(start_paused = true)]
async fn silos_on_unrelated_tables_with_the_same_cluster_id_both_join() {
    let clock = Arc::new(TokioClock::new());
    let mut o = options();
    o.defunct_silo_cleanup_period = Some(Duration::from_secs(3600));
    let unrelated = || {
        InMemoryMembershipTable::new("default")
            .with_clock(clock.clone())
            .with_options(o.clone())
    };
    let first = Arc::new(unrelated());
    let second = Arc::new(unrelated());
    let a = join(first.clone(), 1, &clock).await;
    let b = try_join(second, 2, &clock)
        .await
        .expect("an unrelated table has its own cleanup");
    assert!(a.runs_defunct_cleanup() && b.runs_defunct_cleanup());
    // The same table (another handle on its store) with another cleanup period: refused,
    // naming the option, and before anything was written.
    let other = Arc::new(
        (*first).clone().with_options(
            o.clone()
                .defunct_silo_cleanup_period(Some(Duration::from_secs(60))),
        ),
    );
    let refused = try_join(other, 3, &clock).await;
    assert!(
        matches!(&refused, Err(MembershipError::InvalidConfiguration { option, .. }) if option == "defunct_silo_cleanup_period"),
        "{refused:?}"
    );
    let third: SiloAddress = "10.0.0.3:11111@1".parse().unwrap();
    assert!(
        first.read_row(&third).await.unwrap().rows.is_empty(),
        "the refused silo left an entry nobody heartbeats"
    );
    a.leave().await.unwrap();
    b.leave().await.unwrap();
}

/// A hung defunct cleanup is bounded (the next period runs again) and does not block
/// `leave` before its ShuttingDown and Dead writes.
#[tokio::test(start_paused = true)]
async fn a_hung_defunct_cleanup_is_bounded_and_does_not_block_leave() {
    let mut o = options();
    o.defunct_silo_cleanup_period = Some(Duration::from_secs(60));
    o.defunct_silo_cleanup_jitter = Duration::ZERO;
    let (clock, table) = faulty_on_paused_clock_with(o);
    table.inject(Injection::hang(Operation::CleanupDefunct));
    let silo = join(table.clone(), 1, &clock).await;
    assert!(silo.runs_defunct_cleanup());
    tokio::time::sleep(Duration::from_secs(200)).await;
    let runs = table.calls(Operation::CleanupDefunct);
    assert!(runs >= 2, "{runs} cleanup runs in 200 s at a 60 s period");
    let address = silo.address();
    tokio::time::timeout(Duration::from_secs(60), silo.leave())
        .await
        .expect("leave blocked by a hung cleanup")
        .unwrap();
    assert_eq!(
        table.inner().read_row(&address).await.unwrap().rows[0]
            .entry
            .status,
        SiloStatus::Dead
    );
}

/// Joins silo `n` on `table` (with the table's options) on the paused clock.
async fn join_with(
    table: Arc<impl MembershipTable + 'static>,
    n: u8,
    clock: &Arc<TokioClock>,
) -> cassandra_membership::Silo {
    try_join(table, n, clock)
        .await
        .unwrap_or_else(|e| panic!("silo {n} could not join: {e}"))
}

/// Issue 24: a host's own test of a three-silo cluster on the in-memory table, with the
/// default options, in one process.
#[tokio::test(start_paused = true)]
async fn three_silos_of_one_process_join_one_table_with_the_default_options() {
    let clock = Arc::new(TokioClock::new());
    // `new` gives the table the default options.
    let table = Arc::new(InMemoryMembershipTable::new("three").with_clock(clock.clone()));
    let mut silos = Vec::new();
    for n in 1..=3 {
        silos.push(join_with(table.clone(), n, &clock).await);
    }
    for silo in &silos {
        assert!(
            silo.runs_defunct_cleanup(),
            "{} shares the cleanup",
            silo.address()
        );
        assert_eq!(silo.entry_status().await.unwrap(), Some(SiloStatus::Active));
    }
    for silo in silos {
        silo.leave().await.unwrap();
    }
}

/// The silos of a process share one cleanup of a table: one run per period however many
/// silos are attached, still running after the silo that started it left, stopped with the
/// last one.
#[tokio::test(start_paused = true)]
async fn silos_of_one_process_share_one_cleanup_which_outlives_its_starter_and_stops_with_the_last()
{
    let mut o = MembershipOptions::default();
    let period = Duration::from_secs(60);
    o.defunct_silo_cleanup_period = Some(period);
    o.defunct_silo_cleanup_jitter = Duration::ZERO;
    let (clock, table) = faulty_on_paused_clock_with(o);
    let first = join_with(table.clone(), 1, &clock).await;
    let second = join_with(table.clone(), 2, &clock).await;
    let third = join_with(table.clone(), 3, &clock).await;
    let runs = || table.calls(Operation::CleanupDefunct);
    // The first run falls within the first period; then one per period.
    tokio::time::sleep(period).await;
    let start = runs();
    tokio::time::sleep(10 * period).await;
    let shared = runs() - start;
    assert!(
        (9..=11).contains(&shared),
        "{shared} cleanup runs in 10 periods with three silos: exactly one cleanup runs"
    );
    // The silo that started it leaves: the cleanup goes on for the two others.
    first.leave().await.unwrap();
    let start = runs();
    tokio::time::sleep(10 * period).await;
    let after_first = runs() - start;
    assert!(
        (9..=11).contains(&after_first),
        "{after_first} runs in 10 periods after the starter left"
    );
    assert!(second.runs_defunct_cleanup());
    // One leaves, one crashes: the last one gone, the cleanup stops.
    second.leave().await.unwrap();
    third.crash();
    tokio::time::sleep(period).await;
    let settled = runs();
    tokio::time::sleep(10 * period).await;
    assert_eq!(
        runs(),
        settled,
        "no cleanup runs after the last silo is gone"
    );
    // And a silo joining later starts a fresh one.
    let fourth = join_with(table.clone(), 4, &clock).await;
    tokio::time::sleep(2 * period).await;
    assert!(runs() > settled, "a later silo starts the cleanup again");
    fourth.leave().await.unwrap();
}

/// Entry `n` (10.0.0.n:11111@1) with `status`, last active `ago` before `clock`'s now.
fn entry_ago(n: u8, status: SiloStatus, ago: Duration, clock: &dyn Clock) -> MembershipEntry {
    let mut e = entry(n);
    e.status = status;
    e.start_time = clock.now().saturating_sub(ago);
    e.i_am_alive_time = e.start_time;
    e
}

async fn dead_entries(table: &dyn MembershipTable) -> std::collections::BTreeSet<SiloAddress> {
    table
        .read_all()
        .await
        .unwrap()
        .rows
        .iter()
        .filter(|r| r.entry.status == SiloStatus::Dead)
        .map(|r| r.entry.address)
        .collect()
}

fn every_minute_keeping(max: i64) -> MembershipOptions {
    MembershipOptions::default()
        .defunct_silo_cleanup_period(Some(Duration::from_secs(60)))
        .defunct_silo_cleanup_jitter(Duration::ZERO)
        .max_defunct_silo_entries(Some(max))
}

/// Issue 25: only the first Active silo by address order applies `max_defunct_silo_entries`;
/// a process whose silo is not first leaves the Dead entries alone, and once a first silo
/// attaches to the shared cleanup, the oldest excess Dead entries go.
#[tokio::test(start_paused = true)]
async fn only_the_first_active_silo_removes_the_oldest_excess_dead_entries() {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::new());
    let table = Arc::new(InMemoryMembershipTable::new("dead-limit").with_clock(clock.clone()));
    table.initialize(true).await.unwrap();
    let minute = Duration::from_secs(60);
    for n in [1, 2] {
        let active = entry_ago(n, SiloStatus::Active, Duration::ZERO, clock.as_ref());
        protocol::join(table.as_ref(), &active).await.unwrap();
    }
    // Six Dead entries, the newest (10.0.0.20) 1 min old, the oldest (10.0.0.25) 6 min old.
    for k in 0..6u8 {
        let dead = entry_ago(
            20 + k,
            SiloStatus::Dead,
            u32::from(k + 1) * minute,
            clock.as_ref(),
        );
        protocol::join(table.as_ref(), &dead).await.unwrap();
    }
    let o = every_minute_keeping(3);
    let second = DefunctCleanup::spawn_for(table.clone(), &o, clock.clone(), address(2))
        .unwrap()
        .unwrap();
    assert!(second.is_active());
    tokio::time::sleep(5 * minute).await;
    assert_eq!(
        dead_entries(table.as_ref()).await.len(),
        6,
        "10.0.0.2 is not the first Active silo: it removes no Dead entry"
    );
    let first = DefunctCleanup::spawn_for(table.clone(), &o, clock.clone(), address(1))
        .unwrap()
        .unwrap();
    tokio::time::sleep(2 * minute).await;
    assert_eq!(
        dead_entries(table.as_ref()).await,
        [address(20), address(21), address(22)].into(),
        "the three newest Dead entries stay"
    );
    assert_eq!(*first.removed().borrow(), 3);
    first.stop().await;
    second.stop().await;
}

/// The count limit is not the age limit: storage-side expiry removes entries by age and never
/// bounds how many Dead ones a churning cluster keeps, so the count limit runs while storage
/// expiry covers the age limit.
#[tokio::test(start_paused = true)]
async fn the_dead_entry_limit_runs_while_storage_expiry_covers_the_age_limit() {
    let (clock, table) = faulty_on_paused_clock();
    table.set_covers_defunct_cleanup(Some(true));
    table.initialize(true).await.unwrap();
    let minute = Duration::from_secs(60);
    let active = entry_ago(1, SiloStatus::Active, Duration::ZERO, clock.as_ref());
    protocol::join(table.as_ref(), &active).await.unwrap();
    for k in 0..5u8 {
        let dead = entry_ago(
            20 + k,
            SiloStatus::Dead,
            u32::from(k + 1) * minute,
            clock.as_ref(),
        );
        protocol::join(table.as_ref(), &dead).await.unwrap();
    }
    let cleanup = DefunctCleanup::spawn_for(
        table.clone(),
        &every_minute_keeping(2),
        clock.clone(),
        address(1),
    )
    .unwrap()
    .unwrap();
    assert!(cleanup.is_active(), "the count limit cleans");
    tokio::time::sleep(2 * minute).await;
    assert_eq!(
        dead_entries(table.as_ref()).await,
        [address(20), address(21)].into()
    );
    let calls = table.calls(Operation::CleanupDefunct);
    assert_eq!(
        calls, 1,
        "one call removed the excess; within the limit, none"
    );
    tokio::time::sleep(5 * minute).await;
    assert_eq!(table.calls(Operation::CleanupDefunct), calls);
    cleanup.stop().await;
    // Off, the cleanup is idle while storage covers the age limit.
    let o = every_minute_keeping(2).max_defunct_silo_entries(None);
    let idle = DefunctCleanup::spawn_for(table.clone(), &o, clock.clone(), address(1))
        .unwrap()
        .unwrap();
    assert!(!idle.is_active());
    idle.stop().await;
}

/// End to end: silos that leave become Dead entries; the first Active silo of the process keeps
/// only the newest `max_defunct_silo_entries` of them.
#[tokio::test(start_paused = true)]
async fn silos_that_left_are_pruned_down_to_the_dead_entry_limit() {
    let (clock, table) = faulty_on_paused_clock_with(every_minute_keeping(2));
    let mut silos = Vec::new();
    for n in 1..=5 {
        silos.push(join_with(table.clone(), n, &clock).await);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // 10.0.0.3, .4 and .5 leave, in that order, a second apart: .3 is the oldest Dead entry.
    for silo in silos.split_off(2) {
        silo.leave().await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // The first round runs at a random point of the first minute: it may already have removed
    // .3 (its row gone, not left in another status), never a newer one.
    let dead = dead_entries(table.as_ref()).await;
    let rows: std::collections::BTreeSet<_> = table
        .read_all()
        .await
        .unwrap()
        .rows
        .iter()
        .map(|r| r.entry.address)
        .collect();
    assert!(
        dead == [address(3), address(4), address(5)].into()
            || (dead == [address(4), address(5)].into() && !rows.contains(&address(3))),
        "three Dead entries, or the two newest and no row of .3: {dead:?}, rows {rows:?}"
    );
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(
        dead_entries(table.as_ref()).await,
        [address(4), address(5)].into()
    );
    for silo in silos {
        silo.leave().await.unwrap();
    }
}

/// The Dead-entry limit's cutoff follows recent deaths — a burst of them puts it a moment ago —
/// where silos that are joining or shutting down right now also are: the runtime's count limit
/// removes Dead entries only, and the age limit (one hour here) leaves the young non-Dead ones
/// alone.
#[tokio::test(start_paused = true)]
async fn the_dead_entry_limit_never_removes_a_silo_that_is_joining_or_shutting_down() {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::new());
    let table = Arc::new(InMemoryMembershipTable::new("dead-limit-live").with_clock(clock.clone()));
    table.initialize(true).await.unwrap();
    let second = Duration::from_secs(1);
    let first = entry_ago(1, SiloStatus::Active, Duration::ZERO, clock.as_ref());
    protocol::join(table.as_ref(), &first).await.unwrap();
    // Three silos died within the last seconds.
    for (n, ago) in [(20, 3), (21, 2), (22, 1)] {
        let dead = entry_ago(n, SiloStatus::Dead, ago * second, clock.as_ref());
        protocol::join(table.as_ref(), &dead).await.unwrap();
    }
    // Older than the newest Dead entry beyond the limit: one stopping, one joining.
    let stopping = entry_ago(30, SiloStatus::ShuttingDown, 10 * second, clock.as_ref());
    let joining = entry_ago(31, SiloStatus::Joining, 5 * second, clock.as_ref());
    for e in [&stopping, &joining] {
        protocol::join(table.as_ref(), e).await.unwrap();
    }
    let o = every_minute_keeping(1).defunct_silo_expiration(Duration::from_secs(3600));
    let cleanup = DefunctCleanup::spawn_for(table.clone(), &o, clock.clone(), address(1))
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(150)).await;
    let left: std::collections::BTreeSet<SiloAddress> = table
        .read_all()
        .await
        .unwrap()
        .rows
        .iter()
        .map(|r| r.entry.address)
        .collect();
    cleanup.stop().await;
    assert_eq!(
        left,
        [address(1), address(22), address(30), address(31)].into(),
        "the two oldest Dead entries go; the joining and the stopping silo stay"
    );
}

/// The shared cleanup's task starts on the runtime of the first silo that attaches; when that
/// silo leaves and its runtime ends, a silo on another runtime still has a running cleanup (the
/// task moved to its runtime) that removes an old Dead entry within a few periods.
#[test]
fn a_silo_on_another_runtime_keeps_its_cleanup_after_the_first_runtime_ends() {
    let o = MembershipOptions::default()
        .defunct_silo_cleanup_period(Some(Duration::from_secs(1)))
        .defunct_silo_cleanup_jitter(Duration::ZERO)
        .defunct_silo_expiration(Duration::from_secs(1));
    let table: Arc<dyn MembershipTable> =
        Arc::new(InMemoryMembershipTable::new("runtimes").with_options(o));
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    };
    let rt_a = runtime();
    let first = rt_a
        .block_on(cassandra_membership::Silo::join(
            Arc::clone(&table),
            address(1),
        ))
        .unwrap();
    let rt_b = runtime();
    let second = rt_b
        .block_on(cassandra_membership::Silo::join(
            Arc::clone(&table),
            address(2),
        ))
        .unwrap();
    rt_a.block_on(first.leave()).unwrap();
    drop(rt_a);
    rt_b.block_on(async {
        assert!(second.runs_defunct_cleanup());
        let mut gone = entry(9);
        gone.status = SiloStatus::Dead;
        gone.start_time = Timestamp::now().saturating_sub(Duration::from_secs(3600));
        gone.i_am_alive_time = gone.start_time;
        protocol::join(table.as_ref(), &gone).await.unwrap();
        tokio::time::sleep(Duration::from_secs(4)).await;
        let still = dead_entries(table.as_ref()).await.contains(&gone.address);
        second.leave().await.unwrap();
        assert!(!still, "the second silo's cleanup never ran in 4 periods");
    });
}

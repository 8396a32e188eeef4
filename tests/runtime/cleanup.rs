//! The defunct cleanup: one per table and process, once per period, asleep while storage expiry
//! covers it, and bounded when its call hangs.

use std::sync::Arc;
use std::time::Duration;

use cassandra_membership::conformance::faults::{Injection, Operation};
use cassandra_membership::runtime::{DefunctCleanup, protocol};
use cassandra_membership::{
    Clock, InMemoryMembershipTable, MembershipError, MembershipOptions, MembershipTable,
    SiloAddress, SiloStatus, Timestamp, TokioClock,
};

use crate::utils::{entry, faulty, faulty_on_paused_clock_with, join, options, try_join};

#[tokio::test(start_paused = true)]
async fn defunct_cleanup_runs_once_per_period_and_only_once_per_process() {
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
    let second = DefunctCleanup::spawn(table.clone(), &o, clock.clone());
    assert!(
        matches!(second, Err(MembershipError::InvalidConfiguration { .. })),
        "one per process"
    );
    let mut removed = cleanup.removed();
    tokio::time::timeout(Duration::from_secs(3600), removed.wait_for(|n| *n == 1))
        .await
        .expect("the first run falls within the first period")
        .unwrap();
    assert!(table.read_all().await.unwrap().rows.is_empty());
    cleanup.stop().await;
    // Once stopped, another may start.
    let again = DefunctCleanup::spawn(table.clone(), &o, clock.clone())
        .unwrap()
        .unwrap();
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

/// Unrelated tables do not share a cleanup registration, and a refused second cleanup
/// on the same table leaves nothing written.
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
    // The same table twice: refused, and before anything was written.
    let refused = try_join(first.clone(), 3, &clock).await;
    assert!(
        matches!(refused, Err(MembershipError::InvalidConfiguration { .. })),
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

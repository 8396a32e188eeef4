//! Joining and leaving: a silo joins Active within one deadline however its table calls fail,
//! hang or find its row damaged or Dead, and leaves Dead through version conflicts.

use std::sync::Arc;
use std::time::Duration;

use cassandra_membership::conformance::faults::{Injection, Operation};
use cassandra_membership::runtime::protocol;
use cassandra_membership::{
    Clock, MembershipError, MembershipTable, SiloHealth, SiloStatus, Timestamp, TokioClock,
};

use crate::utils::{entry, faulty_on_paused_clock, join, memory, options, try_join};

#[tokio::test(start_paused = true)]
async fn a_silo_joins_active_and_heartbeats_every_period_within_jitter() {
    let (clock, table) = faulty_on_paused_clock();
    let silo = join(table.clone(), 1, &clock).await;
    assert_eq!(silo.entry_status().await.unwrap(), Some(SiloStatus::Active));
    tokio::time::sleep(Duration::from_secs(100)).await;
    // First heartbeat at once, then one per 10 s ± 1 s: 10 or 11 in 100 s.
    let n = table.calls(Operation::UpdateIAmAlive);
    assert!((10..=11).contains(&n), "{n} heartbeats");
    let alive = table.read_row(&silo.address()).await.unwrap().rows[0]
        .entry
        .i_am_alive_time;
    assert!(clock.now().duration_since(alive) <= Duration::from_secs(11));
    assert!(matches!(
        *silo.health().borrow(),
        SiloHealth::Healthy { .. }
    ));
    silo.leave().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_join_whose_table_call_hangs_returns_an_error_by_the_join_deadline() {
    let (clock, table) = faulty_on_paused_clock();
    table.inject(Injection::hang(Operation::InsertRow));
    let joined = tokio::time::timeout(Duration::from_secs(3600), try_join(table, 1, &clock)).await;
    match joined {
        Ok(Err(_)) => {}
        Ok(Ok(_)) => panic!("joined through a hung insert"),
        Err(_) => panic!("join still hangs after an hour"),
    }
}

/// A read that gives up under contention is retried, within the join deadline.
#[tokio::test(start_paused = true)]
async fn join_retries_reads_that_give_up_under_contention() {
    let (clock, table) = faulty_on_paused_clock();
    table.inject(Injection::contention(Operation::ReadAll).times(20));
    let row_reads = table.inject(Injection::timeout(Operation::ReadRow, "injected").times(20));
    let silo = try_join(table.clone(), 1, &clock)
        .await
        .expect("joins once the reads succeed");
    assert_eq!(table.remaining(row_reads), 0);
    silo.leave().await.unwrap();
}

/// A join reads its own row; one that cannot be read fails the join at once (read_all
/// would skip it, and the insert would conflict with it until max_join_attempt_time).
#[tokio::test(start_paused = true)]
async fn a_join_whose_own_row_cannot_be_read_fails_at_once() {
    let (clock, table) = faulty_on_paused_clock();
    table.damage_row(entry(1).address);
    let started = tokio::time::Instant::now();
    let joined = try_join(table.clone(), 1, &clock).await;
    assert!(
        matches!(joined, Err(MembershipError::CorruptData { .. })),
        "{joined:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(table.inner().read_all().await.unwrap().rows.is_empty());
}

/// An Active step that finds the row Dead (or gone) fails the join.
#[tokio::test(start_paused = true)]
async fn a_join_whose_row_was_declared_dead_before_it_turned_active_fails() {
    let (clock, table) = faulty_on_paused_clock();
    table.declare_dead_after_next_insert();
    let joined = try_join(table.clone(), 1, &clock).await;
    assert!(joined.is_err(), "joined as a Dead entry: {joined:?}");
}

/// One deadline for the whole join — a slow initialize, an Active step that never gets
/// through and the Dead marking after it must not add up to several `max_join_attempt_time`s.
#[tokio::test(start_paused = true)]
async fn a_join_returns_within_max_join_attempt_time_however_its_steps_fail() {
    let (clock, table) = faulty_on_paused_clock();
    table.inject(Injection::delay(
        Operation::Initialize,
        Duration::from_secs(240),
    ));
    table.inject(Injection::hang(Operation::UpdateRow));
    let limit = table.membership_options().max_join_attempt_time;
    let start = tokio::time::Instant::now();
    let joined = try_join(table.clone(), 1, &clock).await;
    let took = start.elapsed();
    assert!(joined.is_err(), "{joined:?}");
    assert!(
        took <= limit,
        "join returned after {took:?} (max_join_attempt_time {limit:?})"
    );
}

/// An unbounded join deadline does not overflow.
#[tokio::test(start_paused = true)]
async fn a_join_with_an_unbounded_attempt_time_joins() {
    let clock = Arc::new(TokioClock::new());
    let mut o = options();
    o.max_join_attempt_time = Duration::MAX;
    let table = Arc::new(memory(&clock).with_options(o));
    let silo = join(table, 1, &clock).await;
    silo.leave().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn graceful_leave_retries_version_conflicts_and_ends_dead() {
    let clock = Arc::new(TokioClock::new());
    let table = Arc::new(memory(&clock));
    let silo = join(table.clone(), 1, &clock).await;
    let address = silo.address();
    // Another silo keeps moving the version while this one leaves.
    let busy = {
        let table = table.clone();
        tokio::spawn(async move {
            let other = entry(2);
            protocol::join(table.as_ref(), &other).await.unwrap();
            for i in 0..200 {
                let status = if i % 2 == 0 {
                    SiloStatus::Active
                } else {
                    SiloStatus::Joining
                };
                protocol::set_status(table.as_ref(), &other.address, status, Timestamp::now())
                    .await
                    .unwrap();
                tokio::task::yield_now().await;
            }
        })
    };
    tokio::task::yield_now().await;
    silo.leave().await.unwrap();
    busy.await.unwrap();
    assert_eq!(
        table.read_row(&address).await.unwrap().rows[0].entry.status,
        SiloStatus::Dead
    );
}

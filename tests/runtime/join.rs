//! Joining and leaving: a silo joins Active within one deadline however its table calls fail,
//! hang or find its row damaged or Dead, and leaves Dead through version conflicts.

use std::sync::Arc;
use std::time::Duration;

use cassandra_membership::conformance::faults::{Injection, Operation};
use cassandra_membership::runtime::protocol;
use cassandra_membership::{
    Clock, MembershipError, MembershipTable, SiloHealth, SiloStatus, Timestamp, TokioClock,
};

use crate::utils::{
    address, entry, entry_at, faulty, faulty_on_paused_clock, join, memory, options, try_join,
};

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

/// One source of options: the silo runs with the table's. Two tables with different publish
/// periods heartbeat at their own period, each silo told nothing but its address.
#[tokio::test(start_paused = true)]
async fn a_silo_heartbeats_at_its_table_s_publish_period() {
    let clock = Arc::new(TokioClock::new());
    let mut fast = options();
    fast.i_am_alive_table_publish_timeout = Duration::from_secs(2);
    fast.i_am_alive_jitter_percent = 0;
    let mut slow = fast.clone();
    slow.i_am_alive_table_publish_timeout = Duration::from_secs(20);
    let fast_table = faulty(memory(&clock).with_options(fast));
    let slow_table = faulty(memory(&clock).for_cluster("other").with_options(slow));
    let a = join(fast_table.clone(), 1, &clock).await;
    let b = join(slow_table.clone(), 2, &clock).await;
    tokio::time::sleep(Duration::from_secs(100)).await;
    // First heartbeat at once, then one per period: 51 at 2 s, 6 at 20 s.
    let (fast_beats, slow_beats) = (
        fast_table.calls(Operation::UpdateIAmAlive),
        slow_table.calls(Operation::UpdateIAmAlive),
    );
    assert!((50..=52).contains(&fast_beats), "{fast_beats} at 2 s");
    assert!((5..=7).contains(&slow_beats), "{slow_beats} at 20 s");
    a.leave().await.unwrap();
    b.leave().await.unwrap();
}

/// The table's options are checked before anything is written.
#[tokio::test(start_paused = true)]
async fn a_join_on_a_table_with_invalid_options_fails_naming_the_option_and_writes_nothing() {
    let clock = Arc::new(TokioClock::new());
    let table = Arc::new(memory(&clock).with_options(options().num_votes_for_death_declaration(0)));
    match try_join(table.clone(), 1, &clock).await {
        Err(MembershipError::InvalidConfiguration { option, .. }) => {
            assert_eq!(option, "num_votes_for_death_declaration")
        }
        other => panic!("{other:?}"),
    }
    let s = table.read_all().await.unwrap();
    assert!(s.rows.is_empty() && s.version.version == 0, "{s:?}");
}

/// What the builder sets is what the entry holds; its times are the clock's.
#[tokio::test(start_paused = true)]
async fn the_builder_s_names_ports_and_zones_are_stored_and_its_clock_stamps_the_entry() {
    let clock = Arc::new(cassandra_membership::ManualClock::new(
        Timestamp::from_millis(1_700_000_000_000),
    ));
    let table = Arc::new(memory(&clock));
    let silo = cassandra_membership::Silo::builder(table.clone(), address(7))
        .silo_name("silo-7")
        .host_name("host-a")
        .proxy_port(30007)
        .role_name("frontend")
        .update_zone(3)
        .fault_zone(4)
        .clock(clock.clone())
        .join()
        .await
        .unwrap();
    let e = table.read_row(&address(7)).await.unwrap().rows[0]
        .entry
        .clone();
    assert_eq!(e.status, SiloStatus::Active);
    assert_eq!(
        (
            e.silo_name.as_str(),
            e.host_name.as_str(),
            e.role_name.as_str()
        ),
        ("silo-7", "host-a", "frontend")
    );
    assert_eq!((e.proxy_port, e.update_zone, e.fault_zone), (30007, 3, 4));
    assert_eq!(e.start_time, Timestamp::from_millis(1_700_000_000_000));
    silo.leave().await.unwrap();
}

/// Another incarnation at an address that already has an entry is refused as what it is — the
/// address is taken — not as a configuration error, and nothing is written.
#[tokio::test(start_paused = true)]
async fn a_second_incarnation_at_a_taken_address_is_refused_as_entry_exists() {
    let clock = Arc::new(TokioClock::new());
    let table = memory(&clock);
    let e = entry_at(1, &*clock);
    protocol::join(&table, &e).await.unwrap();
    let version = table.read_all().await.unwrap().version;
    let mut other = e.clone();
    other.start_time = e.start_time.saturating_add(Duration::from_secs(1));
    let err = protocol::join(&table, &other).await.unwrap_err();
    assert!(
        matches!(&err, MembershipError::EntryExists { silo, status } if silo == "10.0.0.1:11111@1" && status == "Joining"),
        "{err:?}"
    );
    assert!(!err.is_transient(), "{err:?}");
    assert!(err.to_string().contains("10.0.0.1:11111@1"), "{err}");
    assert_eq!(table.read_all().await.unwrap().version, version);
}

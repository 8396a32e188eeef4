//! Fencing: a silo that cannot publish (failing, hung or unread) is told to fence before the
//! others can declare it dead, never turns Healthy while stored Dead, and a healthy one is never
//! told to fence; settings that leave no margin are refused.

use std::sync::Arc;
use std::time::Duration;

use cassandra_membership::conformance::faults::{Injection, Operation};
use cassandra_membership::runtime::protocol;
use cassandra_membership::{
    Clock, MembershipError, MembershipOptions, MembershipTable, SiloHealth, SiloStatus, TokioClock,
};

use crate::logs::Captured;
use crate::utils::{
    faulty, faulty_on_paused_clock, faulty_on_paused_clock_with, join, memory, options, poll_until,
    record,
};

#[tokio::test(start_paused = true)]
async fn failing_heartbeats_retry_with_backoff_and_warn_before_the_lease_lapses() {
    let clock = Arc::new(TokioClock::new());
    // Failure detection far away (100 missed periods): the lease is the first horizon here.
    let mut o = options();
    o.num_missed_table_i_am_alive_limit = 100;
    let inner = memory(&clock)
        .with_expiry(Duration::from_secs(100))
        .with_options(o);
    let table = faulty(inner);
    let silo = join(table.clone(), 1, &clock).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let lease = match silo.health().borrow().clone() {
        SiloHealth::Healthy { lease } => lease,
        other => panic!("{other:?}"),
    };
    let (refresh_by, expires_at) = (lease.refresh_by.unwrap(), lease.expires_at.unwrap());
    let failing = table.inject(Injection::timeout(Operation::UpdateIAmAlive, "injected"));
    let before = table.calls(Operation::UpdateIAmAlive);
    let mut health = silo.health();
    health
        .wait_for(|h| matches!(h, SiloHealth::Failing { .. }))
        .await
        .unwrap();
    health
        .wait_for(|h| matches!(h, SiloHealth::LeaseAtRisk { .. }))
        .await
        .unwrap();
    let at_risk = clock.now();
    assert!(
        at_risk >= refresh_by && at_risk < expires_at,
        "warned in time: {at_risk} vs {refresh_by}..{expires_at}"
    );
    // Backoff: 1, 2, 4, 8, then every period (10 s); not a storm.
    let tries = table.calls(Operation::UpdateIAmAlive) - before;
    assert!(
        (8..=14).contains(&tries),
        "{tries} retries in {:?}",
        at_risk.duration_since(lease.granted_at)
    );
    table.clear(failing);
    health
        .wait_for(|h| matches!(h, SiloHealth::Healthy { .. }))
        .await
        .unwrap();
    silo.leave().await.unwrap();
}

/// Three silos; A's heartbeats fail. Returns (A told to fence, A declared dead), as offsets from
/// the moment A's heartbeats started failing.
async fn fence_and_death(ttl: Option<Duration>) -> (Option<Duration>, Option<Duration>) {
    let clock = Arc::new(TokioClock::new());
    let mut inner = memory(&clock);
    if let Some(ttl) = ttl {
        inner = inner.with_expiry(ttl);
    }
    let a_table = faulty(inner.clone());
    let a = join(a_table.clone(), 1, &clock).await;
    let b = join(Arc::new(inner.clone()), 2, &clock).await;
    let c = join(Arc::new(inner.clone()), 3, &clock).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    a_table.inject(Injection::timeout(Operation::UpdateIAmAlive, "injected"));
    let start = tokio::time::Instant::now();
    let (mut fenced, mut dead) = (None, None);
    let health = a.health();
    let address = a.address();
    while start.elapsed() < Duration::from_secs(600) && dead.is_none() {
        if fenced.is_none() && matches!(*health.borrow(), SiloHealth::LeaseAtRisk { .. }) {
            fenced = Some(start.elapsed());
        }
        if inner.read_row(&address).await.unwrap().rows[0].entry.status == SiloStatus::Dead {
            dead = Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    a.crash();
    b.leave().await.unwrap();
    c.leave().await.unwrap();
    (fenced, dead)
}

/// The host is told to fence before the others can declare it dead, TTL on or off.
#[tokio::test(start_paused = true)]
async fn a_silo_that_cannot_publish_is_told_to_fence_before_the_others_declare_it_dead_ttl_off() {
    let (fenced, dead) = fence_and_death(None).await;
    let dead = dead.expect("the others declare it dead");
    let fenced = fenced.unwrap_or_else(|| panic!("never told to fence; declared dead at {dead:?}"));
    assert!(
        fenced + Duration::from_secs(5) <= dead,
        "fenced at {fenced:?}, declared dead at {dead:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_silo_that_cannot_publish_is_told_to_fence_before_the_others_declare_it_dead_ttl_on() {
    let (fenced, dead) = fence_and_death(Some(Duration::from_secs(3600))).await;
    let dead = dead.expect("the others declare it dead");
    let fenced = fenced.unwrap_or_else(|| panic!("never told to fence; declared dead at {dead:?}"));
    assert!(
        fenced + Duration::from_secs(5) <= dead,
        "fenced at {fenced:?}, declared dead at {dead:?}"
    );
}

/// A hung heartbeat is a failed heartbeat, and the fence signal comes on time.
#[tokio::test(start_paused = true)]
async fn a_hung_heartbeat_counts_as_failed_and_the_host_is_told_to_fence_on_time() {
    let (clock, table) = faulty_on_paused_clock();
    let silo = join(table.clone(), 1, &clock).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    table.inject(Injection::hang(Operation::UpdateIAmAlive));
    let health = silo.health();
    let failed = poll_until(Duration::from_secs(30), || {
        matches!(
            *health.borrow(),
            SiloHealth::Failing { .. } | SiloHealth::LeaseAtRisk { .. }
        )
    })
    .await;
    assert!(
        failed,
        "still {:?} 30 s into a hung heartbeat",
        *health.borrow()
    );
    // Publish period 10 s × 3 missed: the others may decide 30 s after the last publish;
    // the host hears it at least one period earlier.
    let at_risk = poll_until(Duration::from_secs(30), || {
        matches!(*health.borrow(), SiloHealth::LeaseAtRisk { .. })
    })
    .await;
    assert!(at_risk, "{:?}", *health.borrow());
    silo.crash();
}

/// A fenced silo whose row was declared Dead meanwhile must not turn Healthy when its
/// (unchecked) heartbeat gets through again — the Cassandra table between renewals.
#[tokio::test(start_paused = true)]
async fn a_fenced_silo_declared_dead_meanwhile_never_turns_healthy_when_publishing_recovers() {
    let (clock, table) = faulty_on_paused_clock();
    table.set_blind_heartbeats(true);
    let silo = join(table.clone(), 1, &clock).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Storage is cut for this silo: heartbeats and the detector's reads fail.
    let failing = table.inject(Injection::timeout(Operation::UpdateIAmAlive, "injected"));
    table.inject(Injection::contention(Operation::ReadAll));
    let mut health = silo.health();
    health
        .wait_for(|h| matches!(h, SiloHealth::LeaseAtRisk { .. }))
        .await
        .unwrap();
    let seen = record(&silo);
    // The others declare it dead while it is fenced.
    assert!(
        protocol::set_status(
            table.inner().as_ref(),
            &silo.address(),
            SiloStatus::Dead,
            clock.now()
        )
        .await
        .unwrap()
    );
    // The heartbeat gets through again; the detector still cannot read.
    table.clear(failing);
    let last = silo.wait_final(Duration::from_secs(30)).await;
    let seen = seen.lock().unwrap().clone();
    assert!(
        !seen.iter().any(|h| matches!(h, SiloHealth::Healthy { .. })),
        "told Healthy while its row was Dead: {seen:?}"
    );
    assert_eq!(last, SiloHealth::DeclaredDead, "{seen:?}");
    silo.crash();
}

/// A detector that cannot read must not leave a zombie Healthy: once its own row is unread for
/// `num_missed_table_i_am_alive_limit` periods the silo's own status is unknown: fence.
#[tokio::test(start_paused = true)]
async fn a_silo_whose_detector_cannot_read_is_fenced_after_the_missed_limit_of_rounds() {
    let (clock, table) = faulty_on_paused_clock();
    table.set_blind_heartbeats(true);
    let silo = join(table.clone(), 1, &clock).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let failing_reads = table.inject(Injection::contention(Operation::ReadAll));
    assert!(
        protocol::set_status(
            table.inner().as_ref(),
            &silo.address(),
            SiloStatus::Dead,
            clock.now()
        )
        .await
        .unwrap()
    );
    let health = silo.health();
    // The own row was last read by the join, 1 s ago: fenced 3 periods (30 s) after that read
    // (`should_serve` at that instant; the health watch at the detector's round then).
    let fence = silo.fence();
    assert!(
        !poll_until(Duration::from_millis(28_900), || !fence.should_serve()).await,
        "fenced before its own row was unread for 30 s"
    );
    assert!(
        poll_until(Duration::from_millis(200), || !fence.should_serve()).await,
        "still serving with its own row unread for 30 s"
    );
    let fenced = poll_until(Duration::from_secs(1), || {
        matches!(*health.borrow(), SiloHealth::LeaseAtRisk { .. })
    })
    .await;
    assert!(
        fenced,
        "still {:?} with its own row unread for 30 s",
        *health.borrow()
    );
    // Reads come back: the row says Dead.
    table.clear(failing_reads);
    assert_eq!(
        silo.wait_final(Duration::from_secs(15)).await,
        SiloHealth::DeclaredDead
    );
}

/// docs::fencing: a silo that cannot read its own row stops serving once the row is unread for
/// `num_missed_table_i_am_alive_limit` periods (3 × 10 s here), however long each failed read
/// hangs — the bound follows the monotonic time since the last successful read, not a count of
/// rounds (with reads hanging a round is a period plus a call, and three rounds took
/// 59 s for a 30 s promise). Its heartbeats land meanwhile; an operator declared it Dead.
#[tokio::test(start_paused = true)]
async fn a_silo_whose_reads_hang_stops_serving_within_the_missed_limit_of_periods_since_its_last_read()
 {
    let (clock, table) = faulty_on_paused_clock();
    table.set_blind_heartbeats(true);
    let silo = join(table.clone(), 1, &clock).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The join read the own row; from here every read hangs (each bounded by the 10 s call timeout).
    let cut = tokio::time::Instant::now();
    table.inject(Injection::hang(Operation::ReadAll));
    table.inject(Injection::hang(Operation::ReadRow));
    assert!(
        protocol::set_status(
            table.inner().as_ref(),
            &silo.address(),
            SiloStatus::Dead,
            clock.now()
        )
        .await
        .unwrap()
    );
    let fence = silo.fence();
    let mut last_served = None;
    while cut.elapsed() < Duration::from_secs(120) {
        if fence.should_serve() {
            last_served = Some(cut.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let last_served = last_served.expect("it served right after the cut");
    assert!(
        last_served < Duration::from_secs(30),
        "served {last_served:?} after its own row was last read (promised: 3 periods = 30 s)"
    );
    assert!(
        matches!(*silo.health().borrow(), SiloHealth::LeaseAtRisk { .. }),
        "{:?}",
        *silo.health().borrow()
    );
    silo.crash();
}

/// The own-row fence lifts again: once reads answer, the next detector round reads the row live
/// and the silo serves (the simulation found a first fix that fenced such a silo for good: the
/// fence's timer, already past, cancelled every later round before its read answered).
#[tokio::test(start_paused = true)]
async fn a_silo_fenced_for_an_unread_own_row_serves_again_once_reads_answer() {
    let (clock, table) = faulty_on_paused_clock();
    table.set_blind_heartbeats(true);
    let silo = join(table.clone(), 1, &clock).await;
    // Reads are slow (5 ms) as on a network, then hang for a minute.
    table.inject(Injection::delay(
        Operation::ReadAll,
        Duration::from_millis(5),
    ));
    let reads = table.inject(Injection::hang(Operation::ReadAll));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(!silo.should_serve(), "{:?}", *silo.health().borrow());
    table.clear(reads);
    let fence = silo.fence();
    let back = poll_until(Duration::from_secs(25), || fence.should_serve()).await;
    assert!(
        back,
        "still fenced 25 s after reads came back: {:?}",
        *silo.health().borrow()
    );
    silo.crash();
}

/// The fence horizon counts from the I-am-alive time the join stored, not from when the
/// heartbeat task started (the Active step may have retried for a long time in between).
#[tokio::test(start_paused = true)]
async fn the_fence_counts_from_the_i_am_alive_time_the_join_stored() {
    let (clock, table) = faulty_on_paused_clock();
    table.inject(Injection::timeout(Operation::UpdateIAmAlive, "injected"));
    // The Active step's first three writes hang (10 s each, the call timeout).
    table.inject(Injection::hang(Operation::UpdateRow).times(3));
    let start = tokio::time::Instant::now();
    let silo = join(table.clone(), 1, &clock).await;
    let joined = start.elapsed();
    assert!(joined >= Duration::from_secs(30), "joined after {joined:?}");
    let health = silo.health();
    // Stored at about 0 s: the others may vote from 30 s on; the fence is 20 s after the store.
    let fenced = poll_until(Duration::from_secs(30), || {
        matches!(*health.borrow(), SiloHealth::LeaseAtRisk { .. })
    })
    .await;
    let at = start.elapsed();
    assert!(fenced, "{:?}", *health.borrow());
    assert!(
        at <= joined + Duration::from_secs(1),
        "fenced {at:?} after the store (joined at {joined:?})"
    );
    silo.crash();
}

/// A healthy silo is never told to fence, even with the longest heartbeat delay
/// (period + jitter) and slow (but successful) calls; settings that leave no margin are refused.
#[tokio::test(start_paused = true)]
async fn a_healthy_silo_with_slow_calls_and_wide_jitter_is_never_fenced() {
    let mut o = options();
    o.num_missed_table_i_am_alive_limit = 2;
    o.i_am_alive_jitter_percent = 50;
    o.table_operation_timeout = Some(Duration::from_secs(1));
    let (clock, table) = faulty_on_paused_clock_with(o);
    table.inject(Injection::delay(
        Operation::UpdateIAmAlive,
        Duration::from_millis(900),
    ));
    let silo = join(table.clone(), 1, &clock).await;
    let seen = record(&silo);
    tokio::time::sleep(Duration::from_secs(1200)).await;
    let seen = seen.lock().unwrap().clone();
    assert!(
        !seen.iter().any(|h| matches!(
            h,
            SiloHealth::LeaseAtRisk { .. } | SiloHealth::Failing { .. }
        )),
        "a healthy silo was told to fence: {:?}",
        seen.iter()
            .filter(|h| !matches!(h, SiloHealth::Healthy { .. }))
            .collect::<Vec<_>>()
    );
    silo.leave().await.unwrap();
}

#[test]
fn settings_that_leave_no_fencing_margin_are_refused_naming_the_options() {
    let mut o = options();
    o.num_missed_table_i_am_alive_limit = 1;
    match o.validate() {
        Err(MembershipError::InvalidConfiguration { option, reason }) => {
            assert_eq!(option, "num_missed_table_i_am_alive_limit");
            for named in ["i_am_alive_jitter_percent", "table_operation_timeout"] {
                assert!(reason.contains(named), "{reason}");
            }
        }
        other => panic!("{other:?}"),
    }
    // Two missed periods and the default call timeout (one period): no room.
    o.num_missed_table_i_am_alive_limit = 2;
    assert!(o.validate().is_err());
    // With short calls there is.
    o.table_operation_timeout = Some(Duration::from_secs(1));
    o.validate().unwrap();
    assert!(MembershipOptions::default().validate().is_ok());
}

/// Moves tokio's paused clock on by `by` without letting any other task run — what a process
/// frozen that long (SIGSTOP, a GC pause, a VM freeze) finds on resume. `advance` moves the clock
/// on its first poll and then yields; dropping it there runs no task.
fn freeze(by: Duration) {
    use futures::FutureExt;
    assert!(tokio::time::advance(by).now_or_never().is_none());
}

/// A silo frozen past its fence horizon refuses work first thing on resume, before any of its
/// tasks (the heartbeat's timer among them) has run; one frozen for less keeps serving. It
/// serves again once a heartbeat got through and its own row was read live.
#[tokio::test(start_paused = true)]
async fn a_silo_frozen_past_its_fence_refuses_work_first_thing_on_resume() {
    let (clock, table) = faulty_on_paused_clock();
    let silo = join(table.clone(), 1, &clock).await;
    let fence = silo.fence();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(matches!(
        *silo.health().borrow(),
        SiloHealth::Healthy { .. }
    ));
    // Fence 21 s after the last publish (10 s period × 3, less a 9 s margin): 5 s is within it.
    freeze(Duration::from_secs(5));
    assert!(silo.should_serve(), "frozen 5 s");
    let until = fence.serve_until().expect("serving");
    freeze(Duration::from_secs(60));
    assert!(
        !silo.should_serve(),
        "served first thing after a 65 s freeze: {:?}",
        *silo.health().borrow()
    );
    assert!(!fence.should_serve() && fence.serve_until().is_none());
    assert!(tokio::time::Instant::now() >= until);
    // Resumed: the heartbeat task publishes again and reads its row (nobody declared it dead).
    assert!(
        poll_until(Duration::from_secs(30), || silo.should_serve()).await,
        "not serving again: {:?}",
        fence.health()
    );
    assert!(matches!(fence.health(), SiloHealth::Healthy { .. }));
    silo.leave().await.unwrap();
    assert!(!fence.should_serve(), "a silo that left serves no more");
}

/// A freeze during which the others declared the silo dead: on resume it refuses work at once,
/// and never serves again.
#[tokio::test(start_paused = true)]
async fn a_silo_declared_dead_while_frozen_never_serves_after_resuming() {
    let (clock, table) = faulty_on_paused_clock();
    table.set_blind_heartbeats(true);
    let silo = join(table.clone(), 1, &clock).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    freeze(Duration::from_secs(60));
    seen.lock().unwrap().push(silo.should_serve());
    // The others' verdict, written while it was frozen (no await ran this silo's tasks before
    // the first question above).
    assert!(
        protocol::set_status(
            table.inner().as_ref(),
            &silo.address(),
            SiloStatus::Dead,
            clock.now()
        )
        .await
        .unwrap()
    );
    let fence = silo.fence();
    let watcher = {
        let seen = seen.clone();
        tokio::spawn(async move {
            loop {
                seen.lock().unwrap().push(fence.should_serve());
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    assert_eq!(
        silo.wait_final(Duration::from_secs(30)).await,
        SiloHealth::DeclaredDead
    );
    watcher.abort();
    let seen = seen.lock().unwrap().clone();
    assert!(seen.len() > 1 && !seen.contains(&true), "served: {seen:?}");
}

/// Why heartbeats fail — the driver's cause, not only the operation — reaches the host's
/// health signal and the runtime's warning.
#[tokio::test(start_paused = true)]
async fn the_health_and_the_heartbeat_warning_carry_the_failure_s_cause() {
    let captured = Captured::default();
    let _logging = captured.warnings();
    let (clock, table) = faulty_on_paused_clock();
    let silo = join(table.clone(), 1, &clock).await;
    let cause = "Connection refused (injected cause)";
    table.inject(Injection::unavailable(Operation::UpdateIAmAlive, cause));
    let mut health = silo.health();
    health
        .wait_for(|h| matches!(h, SiloHealth::Failing { .. }))
        .await
        .unwrap();
    match health.borrow().clone() {
        SiloHealth::Failing { last_error, .. } => {
            assert!(last_error.contains(cause), "{last_error}")
        }
        other => panic!("{other:?}"),
    }
    let logged = captured.text();
    let warning = logged
        .lines()
        .find(|l| l.contains("heartbeat failed; retrying"))
        .unwrap_or_else(|| panic!("no heartbeat warning in {logged}"));
    assert!(warning.contains(cause), "{warning}");
}

/// The detector once armed its own-row timer from `own_row_until` as it was when the round began. A
/// round whose first read shows the own row live (moving the deadline on, clearing `unknown`) but
/// whose votes are slow still fires the old timer and fences the silo until the next round's
/// first read. Every read here answers at once; vote writes take 8 s (under the 10 s timeout).
#[tokio::test(start_paused = true)]
async fn a_round_with_slow_votes_does_not_fence_a_silo_whose_own_row_it_just_read_live() {
    let (clock, table) = faulty_on_paused_clock();
    let silo = join(table.clone(), 1, &clock).await;
    // Two silos silent for 40 s: silo 1 alone votes on them each round (one vote never declares).
    for n in [2u8, 3] {
        let mut e = crate::utils::entry_at(n, clock.as_ref());
        e.status = SiloStatus::Active;
        e.i_am_alive_time = clock.now().saturating_sub(Duration::from_secs(40));
        protocol::join(table.as_ref(), &e).await.unwrap();
    }
    table.inject(Injection::delay(
        Operation::UpdateRow,
        Duration::from_secs(8),
    ));
    let (fence, health) = (silo.fence(), silo.health());
    let started = tokio::time::Instant::now();
    let mut fenced: Vec<(Duration, String)> = Vec::new();
    while started.elapsed() < Duration::from_secs(120) {
        if !fence.should_serve() {
            fenced.push((started.elapsed(), format!("{:?}", *health.borrow())));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        fenced.is_empty(),
        "fenced in {} of 1200 samples, first at {:?}, last at {:?} (health then: {}); read_all answered at once {} times",
        fenced.len(),
        fenced.first().map(|f| f.0),
        fenced.last().map(|f| f.0),
        fenced.first().map(|f| f.1.clone()).unwrap_or_default(),
        table.calls(Operation::ReadAll)
    );
    silo.crash();
}

/// docs::fencing: "a silo whose heartbeats get through while the detector's reads keep failing
/// stays fenced (`LeaseAtRisk`)". With reads hanging, a round that starts after the own-row
/// deadline arms no timer (`told` is already true) and reports nothing until it fails a call
/// timeout later: meanwhile the health watch says Healthy while `should_serve()` is false.
#[tokio::test(start_paused = true)]
async fn the_health_says_lease_at_risk_whenever_the_own_row_fence_refuses() {
    let (clock, table) = faulty_on_paused_clock();
    let silo = join(table.clone(), 1, &clock).await;
    table.inject(Injection::hang(Operation::ReadAll));
    table.inject(Injection::hang(Operation::ReadRow));
    let (fence, health) = (silo.fence(), silo.health());
    let started = tokio::time::Instant::now();
    let mut window: Option<(Duration, Duration)> = None;
    while started.elapsed() < Duration::from_secs(90) {
        // The fence answers at the deadline's instant; the health is published by the silo's
        // tasks as that instant's timers run: a discrepancy must not outlive the instant.
        let differ = || health.borrow().should_serve() && !fence.should_serve();
        if differ() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if differ() {
            let now = started.elapsed();
            window = Some((window.map_or(now, |w| w.0), now));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        window.is_none(),
        "the health watch said {:?}-may-serve while should_serve() was false, from {:?} to {:?}",
        "Healthy",
        window.map(|w| w.0),
        window.map(|w| w.1)
    );
    silo.crash();
}

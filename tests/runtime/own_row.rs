//! The own-row fence under long detection rounds: every read that shows the
//! own row live vouches for it (docs::fencing), the re-reads before votes too, and the health says
//! `LeaseAtRisk` whenever the fence refuses for an unread row.

use std::time::Duration;

use cassandra_membership::conformance::faults::{Injection, Operation};
use cassandra_membership::runtime::protocol;
use cassandra_membership::{Clock, SiloStatus};

use crate::utils::{faulty_on_paused_clock, join};

/// The instants (of 1,200, one per 100 ms) at which `silo` refused to serve, with its health.
async fn fenced_samples(silo: &cassandra_membership::Silo) -> Vec<(Duration, String)> {
    let (fence, health) = (silo.fence(), silo.health());
    let started = tokio::time::Instant::now();
    let mut fenced = Vec::new();
    while started.elapsed() < Duration::from_secs(120) {
        if !fence.should_serve() {
            fenced.push((started.elapsed(), format!("{:?}", *health.borrow())));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    fenced
}

async fn silent_suspects(
    table: &std::sync::Arc<cassandra_membership::conformance::faults::FaultyTable>,
    clock: &std::sync::Arc<cassandra_membership::TokioClock>,
    n: u8,
) {
    for k in 0..n {
        let mut e = crate::utils::entry_at(2 + k, clock.as_ref());
        e.status = SiloStatus::Active;
        e.i_am_alive_time = clock.now().saturating_sub(Duration::from_secs(40));
        protocol::join(table.as_ref(), &e).await.unwrap();
    }
}

/// Two silent suspects; each vote write takes 6 s (under the 10 s call timeout) and loses its
/// race (another detector's write moved the version). One attempt a round: a 12 s round. Three
/// attempts a round: 36 s, past the 30 s horizon counted from the round's first read only.
#[tokio::test(start_paused = true)]
async fn vote_retries_that_outlast_the_horizon_do_not_fence_a_silo_whose_re_reads_show_its_row() {
    let (clock, table) = faulty_on_paused_clock();
    let silo = join(table.clone(), 1, &clock).await;
    silent_suspects(&table, &clock, 2).await;
    table.inject(Injection::delay(
        Operation::UpdateRow,
        Duration::from_secs(6),
    ));
    table.inject(Injection::not_applied(Operation::UpdateRow));
    let fenced = fenced_samples(&silo).await;
    assert!(
        fenced.is_empty(),
        "fenced in {} of 1200 samples, first at {:?}, last at {:?} (health then: {})",
        fenced.len(),
        fenced.first().map(|f| f.0),
        fenced.last().map(|f| f.0),
        fenced.first().map(|f| f.1.clone()).unwrap_or_default(),
    );
    silo.crash();
}

/// Four silent suspects; each vote write takes 8 s and applies (one vote never declares): a 32 s
/// round, past the 30 s horizon, while the re-read before every vote shows the own row live.
#[tokio::test(start_paused = true)]
async fn four_slow_votes_do_not_fence_a_silo_whose_re_reads_show_its_row_live() {
    let (clock, table) = faulty_on_paused_clock();
    let silo = join(table.clone(), 1, &clock).await;
    silent_suspects(&table, &clock, 4).await;
    table.inject(Injection::delay(
        Operation::UpdateRow,
        Duration::from_secs(8),
    ));
    let fenced = fenced_samples(&silo).await;
    assert!(
        fenced.is_empty(),
        "fenced in {} of 1200 samples, first at {:?}, last at {:?} (health then: {})",
        fenced.len(),
        fenced.first().map(|f| f.0),
        fenced.last().map(|f| f.0),
        fenced.first().map(|f| f.1.clone()).unwrap_or_default(),
    );
    silo.crash();
}

/// A round that starts past the own-row deadline arms no timer (`armed` is computed once, false);
/// its first read then moves the deadline on and clears `unknown`, and when the slow round
/// outlasts that new deadline nothing reports it: the health says Healthy while the fence refuses.
#[tokio::test(start_paused = true)]
async fn a_round_that_started_late_keeps_the_health_and_the_fence_in_agreement() {
    let (clock, table) = faulty_on_paused_clock();
    let silo = join(table.clone(), 1, &clock).await;
    silent_suspects(&table, &clock, 4).await;
    table.inject(Injection::delay(
        Operation::UpdateRow,
        Duration::from_secs(8),
    ));
    let (fence, health) = (silo.fence(), silo.health());
    let started = tokio::time::Instant::now();
    let mut window: Option<(Duration, Duration)> = None;
    while started.elapsed() < Duration::from_secs(120) {
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
        "Healthy while should_serve() was false, from {:?} to {:?}",
        window.map(|w| w.0),
        window.map(|w| w.1)
    );
    silo.crash();
}

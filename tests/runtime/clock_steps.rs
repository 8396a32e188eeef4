//! Wall-clock steps: a backward step delays neither the fence signal nor the fence that follows
//! the I-am-alive time storage kept.

use std::sync::Arc;
use std::time::Duration;

use cassandra_membership::conformance::faults::{Injection, Operation};
use cassandra_membership::{Clock, SiloHealth, Timestamp};

use crate::utils::{faulty, join, memory, options};

/// A backward wall-clock step does not delay the fence signal.
#[tokio::test(start_paused = true)]
async fn a_backward_wall_clock_step_does_not_delay_the_fence_signal() {
    let clock = Arc::new(cassandra_membership::ManualClock::new(Timestamp::now()));
    let mut o = options();
    // Detection far away: only the lease (refresh by 90 s) bounds the fence.
    o.num_missed_table_i_am_alive_limit = 100;
    let inner = memory(&clock)
        .with_expiry(Duration::from_secs(100))
        .with_options(o);
    let table = faulty(inner);
    let silo = join(table.clone(), 1, &clock).await;
    let health = silo.health();
    // Wall time moves with tokio's until the first heartbeat.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        clock.advance(Duration::from_millis(100));
    }
    assert!(
        matches!(*health.borrow(), SiloHealth::Healthy { .. }),
        "{:?}",
        *health.borrow()
    );
    table.inject(Injection::timeout(Operation::UpdateIAmAlive, "injected"));
    clock.set(clock.now().saturating_sub(Duration::from_secs(3600)));
    let mut fenced = false;
    for _ in 0..1000 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        clock.advance(Duration::from_millis(100));
        if matches!(*health.borrow(), SiloHealth::LeaseAtRisk { .. }) {
            fenced = true;
            break;
        }
    }
    assert!(
        fenced,
        "not told to fence 100 s after the last renewal: {:?}",
        *health.borrow()
    );
    silo.crash();
}

/// After a backward wall-clock step the backend keeps the larger stored I-am-alive time,
/// so heartbeats that "succeed" publish nothing new: the others see a silent silo. The fence must
/// come from what was stored, not from when the writes succeeded.
#[tokio::test(start_paused = true)]
async fn after_a_backward_wall_clock_step_the_fence_follows_the_stored_i_am_alive_time() {
    let clock = Arc::new(cassandra_membership::ManualClock::new(Timestamp::now()));
    let table = faulty(memory(&clock));
    let silo = join(table.clone(), 1, &clock).await;
    let health = silo.health();
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        clock.advance(Duration::from_millis(100));
    }
    assert!(matches!(*health.borrow(), SiloHealth::Healthy { .. }));
    let stored = table.inner().read_row(&silo.address()).await.unwrap().rows[0]
        .entry
        .i_am_alive_time;
    clock.set(clock.now().saturating_sub(Duration::from_secs(3600)));
    let step = tokio::time::Instant::now();
    let mut fenced = None;
    for _ in 0..400 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        clock.advance(Duration::from_millis(100));
        if matches!(*health.borrow(), SiloHealth::LeaseAtRisk { .. }) {
            fenced = Some(step.elapsed());
            break;
        }
    }
    let now_stored = table.inner().read_row(&silo.address()).await.unwrap().rows[0]
        .entry
        .i_am_alive_time;
    assert_eq!(
        now_stored, stored,
        "the stored I-am-alive time did not move"
    );
    // The others may vote 30 s after the stored time (3 × 10 s): fence before that.
    let fenced = fenced.unwrap_or_else(|| {
        panic!(
            "still {:?} 40 s after the step; the others see it silent",
            *health.borrow()
        )
    });
    assert!(
        fenced < Duration::from_secs(30),
        "fenced {fenced:?} after the step"
    );
    silo.crash();
}

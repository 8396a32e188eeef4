//! A process that is not a silo follows the cluster (`ClusterWatcher`): it only reads, keeps its
//! last view marked stale through an outage and recovers, and stops when dropped.

use std::sync::Arc;
use std::time::Duration;

use cassandra_membership::conformance::faults::{Injection, Operation};
use cassandra_membership::{
    Clock, ClusterWatcher, ClusterWatcherOptions, FailureCause, MembershipError, MembershipTable,
    TokioClock,
};
use tokio_stream::StreamExt;

use crate::utils::{address, faulty, join, memory};

fn every(secs: u64) -> ClusterWatcherOptions {
    ClusterWatcherOptions::default().refresh_period(Duration::from_secs(secs))
}

#[tokio::test(start_paused = true)]
async fn a_watcher_follows_joins_and_leaves_and_only_ever_reads_the_whole_table() {
    let clock = Arc::new(cassandra_membership::TokioClock::new());
    let inner = memory(&clock);
    // The watcher's own table value, counting its calls.
    let counted = faulty(inner.clone());
    let watcher = ClusterWatcher::start_on(counted.clone(), every(5), clock.clone())
        .await
        .unwrap();
    let mut views = watcher.views();
    assert!(views.next().await.unwrap().entries().is_empty());
    let silo = join(Arc::new(inner.clone()), 1, &clock).await;
    let joined_at = tokio::time::Instant::now();
    let view = views.next().await.unwrap();
    assert!(view.is_member(&silo.address()));
    assert!(joined_at.elapsed() <= Duration::from_secs(5));
    let address = silo.address();
    silo.leave().await.unwrap();
    let view = views.next().await.unwrap();
    assert!(view.is_dead(&address) && !view.is_member(&address));
    tokio::time::sleep(Duration::from_secs(60)).await;
    for op in Operation::ALL {
        let calls = counted.calls(op);
        match op {
            // The first read, then one per 5 s period.
            Operation::ReadAll => assert!(calls >= 14, "{calls} reads"),
            _ => assert_eq!(calls, 0, "{op:?}: a watcher only reads the whole table"),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_watcher_keeps_its_last_view_marked_stale_through_an_outage_and_then_recovers() {
    let clock = Arc::new(cassandra_membership::TokioClock::new());
    let inner = memory(&clock);
    let first = join(Arc::new(inner.clone()), 1, &clock).await;
    let table = faulty(inner.clone());
    let watcher = ClusterWatcher::start_on(table.clone(), every(5), clock.clone())
        .await
        .unwrap();
    let mut rx = watcher.view();
    let before = rx.borrow_and_update().clone();
    let outage = table.inject(Injection::timeout(Operation::ReadAll, "node down"));
    let went_down = clock.now();
    // Told once, when the view turns stale.
    rx.changed().await.unwrap();
    let second = join(Arc::new(inner.clone()), 2, &clock).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let stale = watcher.current();
    assert_eq!(stale.version(), before.version(), "the last view is kept");
    assert!(!stale.is_member(&second.address()));
    let s = stale.stale().expect("marked stale");
    assert_eq!(s.cause, FailureCause::Outage);
    assert!(s.failed_refreshes >= 6, "{s:?}");
    assert!(s.since >= went_down && s.since <= went_down.saturating_add(Duration::from_secs(5)));
    assert!(stale.age(clock.now()) >= Duration::from_secs(30));
    assert!(!rx.has_changed().unwrap(), "further failures are not news");
    table.clear(outage);
    rx.changed().await.unwrap();
    let back = rx.borrow_and_update().clone();
    assert!(!back.is_stale());
    assert!(back.is_member(&second.address()) && back.is_member(&first.address()));
    assert!(back.age(clock.now()) < Duration::from_secs(5));
    first.leave().await.unwrap();
    second.leave().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_dropped_watcher_stops_reading_and_ends_its_watches_and_streams() {
    let clock = Arc::new(cassandra_membership::TokioClock::new());
    let table = faulty(memory(&clock));
    let watcher = ClusterWatcher::start(table.clone(), every(1))
        .await
        .unwrap();
    let mut rx = watcher.view();
    let mut views = watcher.views();
    assert!(views.next().await.is_some());
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    drop(watcher);
    let reads = table.calls(Operation::ReadAll);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        table.calls(Operation::ReadAll),
        reads,
        "no read after the drop"
    );
    assert!(rx.changed().await.is_err());
    assert!(views.next().await.is_none());
    // Stopping explicitly waits for the task.
    let watcher = ClusterWatcher::start(table.clone(), every(1))
        .await
        .unwrap();
    watcher.stop().await;
    let reads = table.calls(Operation::ReadAll);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(table.calls(Operation::ReadAll), reads);
}

#[tokio::test(start_paused = true)]
async fn a_watcher_that_cannot_read_at_start_or_has_bad_options_says_so() {
    let clock = Arc::new(cassandra_membership::TokioClock::new());
    let table = faulty(memory(&clock));
    table.inject(Injection::timeout(Operation::ReadAll, "node down"));
    let e = ClusterWatcher::start(table.clone(), every(1))
        .await
        .unwrap_err();
    assert!(matches!(e, MembershipError::Timeout { .. }), "{e:?}");
    table.clear_all();
    let e = ClusterWatcher::start(table.clone(), every(0))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, MembershipError::InvalidConfiguration { option, .. } if option == "refresh_period"),
        "{e:?}"
    );
    let zero = every(1).read_timeout(Some(Duration::ZERO));
    let e = ClusterWatcher::start(table.clone(), zero)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, MembershipError::InvalidConfiguration { option, .. } if option == "read_timeout"),
        "{e:?}"
    );
    assert_eq!(
        table.calls(Operation::ReadAll),
        1,
        "bad options read nothing"
    );
}

#[tokio::test(start_paused = true)]
async fn a_cluster_deleted_and_created_again_leaves_the_view_kept_and_marked_stale() {
    let clock = Arc::new(cassandra_membership::TokioClock::new());
    let inner = memory(&clock);
    let silo = join(Arc::new(inner.clone()), 1, &clock).await;
    let watcher = ClusterWatcher::start(Arc::new(inner.clone()), every(1))
        .await
        .unwrap();
    let before = watcher.current();
    silo.crash();
    inner.delete_cluster("c").await.unwrap();
    inner.initialize(true).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let now = watcher.current();
    assert_eq!(
        now.version(),
        before.version(),
        "never back to an older version"
    );
    let s = now.stale().expect("marked stale");
    assert!(s.last_error.contains("went back"), "{s:?}");
    assert!(now.is_member(&address(1)));
}

#[tokio::test(start_paused = true)]
async fn a_refresh_reads_now_and_moves_the_background_refresh_on() {
    let clock = Arc::new(cassandra_membership::TokioClock::new());
    let inner = memory(&clock);
    let table = faulty(inner.clone());
    let watcher = ClusterWatcher::start(table.clone(), every(5))
        .await
        .unwrap();
    let mut rx = watcher.view();
    rx.borrow_and_update();
    let silo = join(Arc::new(inner.clone()), 1, &clock).await;
    // At once, without waiting for the period; the watch is told too.
    assert!(watcher.refresh().await.unwrap().is_member(&silo.address()));
    assert!(rx.has_changed().unwrap());
    // A caller refreshing every 2 s: the background refresh (every 5 s) never reads.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        watcher.refresh().await.unwrap();
    }
    assert_eq!(table.calls(Operation::ReadAll), 1 + 11);
    // Left alone, it reads every period again.
    tokio::time::sleep(Duration::from_millis(10_500)).await;
    assert_eq!(table.calls(Operation::ReadAll), 1 + 11 + 2);
    // A failed refresh is returned, and the kept view is marked stale.
    let outage = table.inject(Injection::timeout(Operation::ReadAll, "node down"));
    assert!(watcher.refresh().await.is_err());
    assert!(watcher.current().is_stale());
    table.clear(outage);
    assert!(!watcher.refresh().await.unwrap().is_stale());
    silo.leave().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_on_demand_watcher_reads_only_when_refreshed() {
    let clock = Arc::new(cassandra_membership::TokioClock::new());
    let inner = memory(&clock);
    let table = faulty(inner.clone());
    let watcher = ClusterWatcher::on_demand(table.clone(), None)
        .await
        .unwrap();
    let mut views = watcher.views();
    assert!(views.next().await.unwrap().entries().is_empty());
    let silo = join(Arc::new(inner.clone()), 1, &clock).await;
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(
        table.calls(Operation::ReadAll),
        1,
        "nothing reads by itself"
    );
    assert!(watcher.current().entries().is_empty());
    assert!(watcher.refresh().await.unwrap().is_member(&silo.address()));
    assert!(views.next().await.unwrap().is_member(&silo.address()));
    drop(watcher);
    assert!(views.next().await.is_none());
    silo.leave().await.unwrap();
}

/// After the cluster is deleted and created again (its version starts over),
/// `refresh()` answered `Ok` with the old cluster's membership (rio's `members()` reads through
/// it). It now answers `TableVersionWentBack`, the kept view marked stale.
#[tokio::test(start_paused = true)]
async fn a_refresh_after_the_cluster_was_created_again_says_the_version_went_back() {
    let clock = Arc::new(TokioClock::new());
    let inner = memory(&clock);
    let mut old = Vec::new();
    for n in 1..=4 {
        old.push(join(Arc::new(inner.clone()), n, &clock).await);
    }
    let watcher = ClusterWatcher::on_demand(Arc::new(inner.clone()), None)
        .await
        .unwrap();
    let before = watcher.refresh().await.unwrap();
    for s in old {
        s.crash();
    }
    inner.delete_cluster(inner.cluster_id()).await.unwrap();
    let _fresh = join(Arc::new(inner.clone()), 9, &clock).await;
    let after = watcher.refresh().await;
    assert!(
        matches!(after, Err(MembershipError::TableVersionWentBack { from, .. }) if from == before.version().version),
        "{after:?}"
    );
    assert!(watcher.current().is_stale());
}

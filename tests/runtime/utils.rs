//! What the runtime tests share: options with a 10 s publish period and no cleanup (the tables'
//! options), entries 10.0.0.n:11111@1, joining on a clock, a fault-injecting in-memory table,
//! polling and recording a silo's health.

use std::sync::Arc;
use std::time::Duration;

use cassandra_membership::conformance::faults::FaultyTable;
use cassandra_membership::{
    Clock, InMemoryMembershipTable, MembershipEntry, MembershipOptions, MembershipTable,
    SiloAddress, SiloHealth, SiloStatus, Timestamp, TokioClock,
};

pub(crate) fn options() -> MembershipOptions {
    let mut o = MembershipOptions::default();
    o.i_am_alive_table_publish_timeout = Duration::from_secs(10);
    o.defunct_silo_cleanup_period = None;
    o
}

/// Joins as 10.0.0.n:11111@1 on `clock`, with the table's options.
pub(crate) async fn join(
    table: Arc<impl MembershipTable + 'static>,
    n: u8,
    clock: &Arc<impl Clock + 'static>,
) -> cassandra_membership::Silo {
    try_join(table, n, clock).await.unwrap()
}

/// [`join`], for a join expected to fail.
pub(crate) async fn try_join(
    table: Arc<impl MembershipTable + 'static>,
    n: u8,
    clock: &Arc<impl Clock + 'static>,
) -> cassandra_membership::Result<cassandra_membership::Silo> {
    cassandra_membership::Silo::builder(table, address(n))
        .clock(clock.clone())
        .join()
        .await
}

pub(crate) fn address(n: u8) -> SiloAddress {
    format!("10.0.0.{n}:11111@1").parse().unwrap()
}

pub(crate) fn entry(n: u8) -> MembershipEntry {
    MembershipEntry::new(address(n), SiloStatus::Joining, Timestamp::now())
}

pub(crate) fn entry_at(n: u8, clock: &dyn Clock) -> MembershipEntry {
    let mut e = entry(n);
    e.start_time = clock.now();
    e
}

/// `inner` behind a fault-injecting wrapper with no fault yet.
pub(crate) fn faulty(inner: InMemoryMembershipTable) -> Arc<FaultyTable> {
    Arc::new(FaultyTable::new(Arc::new(inner)))
}

/// A fault-injecting in-memory table of cluster `c` with [`options`] on the test's (paused)
/// tokio clock, and that clock: the set-up of most runtime tests.
pub(crate) fn faulty_on_paused_clock() -> (Arc<TokioClock>, Arc<FaultyTable>) {
    faulty_on_paused_clock_with(options())
}

/// [`faulty_on_paused_clock`] with other membership options.
pub(crate) fn faulty_on_paused_clock_with(
    o: MembershipOptions,
) -> (Arc<TokioClock>, Arc<FaultyTable>) {
    let clock = Arc::new(TokioClock::new());
    let table = faulty(memory(&clock).with_options(o));
    (clock, table)
}

/// An in-memory table of cluster `c` with [`options`] on `clock`.
pub(crate) fn memory(clock: &Arc<impl Clock + 'static>) -> InMemoryMembershipTable {
    InMemoryMembershipTable::new("c")
        .with_clock(clock.clone())
        .with_options(options())
}

/// Polls every 100 ms of (paused) time until `done` or `limit` passes.
pub(crate) async fn poll_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let started = tokio::time::Instant::now();
    while started.elapsed() < limit {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    done()
}

/// Records every health change of `silo` from now on.
pub(crate) fn record(silo: &cassandra_membership::Silo) -> Arc<std::sync::Mutex<Vec<SiloHealth>>> {
    let seen = Arc::new(std::sync::Mutex::new(vec![silo.health().borrow().clone()]));
    let mut rx = silo.health();
    let out = seen.clone();
    tokio::spawn(async move {
        while rx.changed().await.is_ok() {
            let h = rx.borrow_and_update().clone();
            out.lock().unwrap().push(h);
        }
    });
    seen
}

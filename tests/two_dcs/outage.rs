//! dc2 down: a dc1 cluster on `local_quorum` keeps every operation, its histories linearizable;
//! on `quorum` (which needs dc2's replica too) every call answers a typed error in time and
//! nothing is written.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cassandra_membership::conformance::history::{History, HistoryOp, HistoryRet};
use cassandra_membership::conformance::workload::{self, WorkloadOptions};
use cassandra_membership::{
    MembershipEntry, MembershipError, MembershipOptions, MembershipTable, Silo, SiloAddress,
    SiloHealth, SiloStatus, Timestamp,
};

use crate::utils::*;

fn fast_membership() -> MembershipOptions {
    let mut m = MembershipOptions::default();
    m.i_am_alive_table_publish_timeout = Duration::from_secs(1);
    m.defunct_silo_cleanup_period = None;
    m
}

/// With dc2 down: a dc1 cluster on `local_quorum` keeps every operation.
async fn local_quorum_keeps_every_operation() {
    // The table's every operation, expiry on, on a table created while dc2 is down.
    let cluster = unique("outage-ops");
    let table = unique("t").replace('-', "_");
    every_operation(
        &connect(local(&cluster).table(table.clone()).ttl(true)).await,
        &cluster,
    )
    .await;
    // A silo joins, heartbeats, is Healthy, leaves.
    let membership = fast_membership();
    let t = connect(local(&unique("outage-silo")).membership(membership)).await;
    let address = SiloAddress::new(std::net::SocketAddr::from(([10, 3, 0, 1], 11111)), 1).unwrap();
    let silo = Silo::join(Arc::new(t), address)
        .await
        .expect("a silo joins with dc2 down");
    let mut health = silo.health();
    tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            if let SiloHealth::Healthy { .. } = *health.borrow_and_update() {
                return;
            }
            health.changed().await.expect("the heartbeat runs");
        }
    })
    .await
    .expect("Healthy within 15 s with dc2 down");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        matches!(*silo.health().borrow(), SiloHealth::Healthy { .. }),
        "still Healthy after three heartbeats: {:?}",
        *silo.health().borrow()
    );
    silo.leave().await.expect("leave with dc2 down");
    // Three dc1 clients of one cluster at once: the history is linearizable, nothing fails.
    let cluster = unique("outage-history");
    let mut tables: Vec<Arc<dyn MembershipTable>> = Vec::new();
    for _ in 0..3 {
        tables.push(Arc::new(connect(local(&cluster)).await));
    }
    tables[0].initialize(true).await.expect("initialize");
    let history = Arc::new(History::new());
    let options = WorkloadOptions {
        hung_after: REQUEST_TIMEOUT * 10,
        pause: Duration::from_millis(300),
        ..WorkloadOptions::default()
    };
    let until = Instant::now() + Duration::from_secs(20);
    let report = workload::run(tables.clone(), history.clone(), options, until).await;
    let t = history.thread();
    history.invoke(t, HistoryOp::ReadAll);
    let end = tables[0].read_all().await.expect("a final read");
    history.respond(t, HistoryRet::snapshot(&end));
    let verdict = history.check().expect("a well-formed history");
    println!(
        "dc2 down, local_quorum: {} operations, {} writes applied, failures {:?}; linearizable = {}",
        verdict.operations,
        report.applied,
        report.by_kind(),
        verdict.linearizable
    );
    assert!(verdict.linearizable, "the history is not linearizable");
    assert!(report.applied > 10, "the workload made progress");
    assert!(
        report.failures.is_empty(),
        "with dc2 down nothing of a dc1 cluster fails: {:#?}",
        report.failures
    );
}

/// Runs `call`, asserting it fails with one of `kinds` within `bound`.
async fn refused<T: std::fmt::Debug>(
    what: &str,
    bound: Duration,
    kinds: &[&str],
    call: impl std::future::Future<Output = cassandra_membership::Result<T>>,
) -> String {
    let started = Instant::now();
    let result = call.await;
    let took = started.elapsed();
    let e: MembershipError = match result {
        Err(e) => e,
        Ok(v) => panic!("{what} succeeded with dc2 down on quorum: {v:?}"),
    };
    let kind = workload::kind(&e);
    assert!(
        kinds.contains(&kind.as_str()),
        "{what}: {kind} is not one of {kinds:?}: {e}"
    );
    assert!(
        took <= bound,
        "{what} took {took:?}, over its bound {bound:?}"
    );
    println!("{what}: {kind} after {took:?}");
    kind
}

/// One outage for both profiles (restarting a node takes 30–60 s here): a `quorum` cluster made
/// on the healthy ring, dc2 killed, the `local_quorum` checks, the `quorum` checks, then healed and
/// the `quorum` cluster compared with what it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dc2_down_local_quorum_keeps_every_operation_and_quorum_fails_typed_writing_nothing() {
    let _serial = serial().await;
    let cluster = unique("outage-quorum");
    let table = connect(global(&cluster)).await;
    table
        .initialize(true)
        .await
        .expect("initialize on the healthy ring");
    let address = SiloAddress::new(std::net::SocketAddr::from(([10, 4, 0, 1], 11111)), 1).unwrap();
    let entry = MembershipEntry::new(address, SiloStatus::Joining, Timestamp::now());
    let version = table.read_all().await.expect("read").version;
    assert!(
        table
            .insert_row(&entry, &version.next())
            .await
            .expect("insert")
    );
    let before = table.read_all().await.expect("read");
    kill_dc2().await;
    local_quorum_keeps_every_operation().await;
    let rt = REQUEST_TIMEOUT;
    // Reads: 2 request timeouts at most (README "Bounded time"); a read changes nothing.
    refused("read_all", 2 * rt, &["Unavailable"], table.read_all()).await;
    refused(
        "read_row",
        2 * rt,
        &["Unavailable"],
        table.read_row(&address),
    )
    .await;
    // A heartbeat is a plain write: not stored, safe to repeat.
    refused(
        "update_i_am_alive",
        2 * rt,
        &["Unavailable"],
        table.update_i_am_alive(&address, Timestamp::now()),
    )
    .await;
    // A conditional write: Unavailable at the serial level, Paxos's check before proposing,
    // proves it never applied (errors.rs `refused_before_execution`); at most 12 timeouts.
    let other = SiloAddress::new(std::net::SocketAddr::from(([10, 4, 0, 2], 11111)), 1).unwrap();
    let second = MembershipEntry::new(other, SiloStatus::Joining, Timestamp::now());
    refused(
        "insert_row",
        12 * rt,
        &["Unavailable"],
        table.insert_row(&second, &before.version.next()),
    )
    .await;
    let mut dead = entry.clone();
    dead.status = SiloStatus::Dead;
    refused(
        "update_row",
        12 * rt,
        &["Unavailable"],
        table.update_row(&dead, &before.rows[0].etag, &before.version.next()),
    )
    .await;
    // A silo cannot join: a typed error within max_join_attempt_time (and a little).
    let mut membership = fast_membership();
    membership.max_join_attempt_time = Duration::from_secs(10);
    let joiner = connect(global(&cluster).membership(membership.clone())).await;
    let third = SiloAddress::new(std::net::SocketAddr::from(([10, 4, 0, 3], 11111)), 1).unwrap();
    let started = Instant::now();
    let joined = Silo::join(Arc::new(joiner), third).await;
    assert!(joined.is_err(), "a silo joined on quorum with dc2 down");
    assert!(
        started.elapsed() < Duration::from_secs(10) + 2 * rt,
        "join gave up in time: {:?}",
        started.elapsed()
    );
    heal().await;
    // Nothing partial: the table is exactly what it was before the outage.
    let after = table.read_all().await.expect("read after healing");
    assert_eq!(after.version, before.version, "no version moved");
    assert_eq!(after.rows.len(), 1, "no row added: {:?}", after.rows);
    assert_eq!(after.rows[0].entry.status, SiloStatus::Joining);
    assert_eq!(
        after.rows[0].etag, before.rows[0].etag,
        "the row is untouched"
    );
}

/// Resumes dc2's node on drop (also when the test fails).
struct Paused;

impl Drop for Paused {
    fn drop(&mut self) {
        script(&["resume", &dc2_node().to_string()]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dc2_hung_a_dc1_silo_on_local_quorum_still_starts() {
    let _serial = serial().await;
    script(&["pause", &dc2_node().to_string()]);
    let _resume = Paused;
    // A node that hangs (SIGSTOP: a GC storm, a stuck VM) keeps its TCP connections open: nothing
    // sent there is refused, it is never answered.
    let started = Instant::now();
    let t = tokio::time::timeout(
        Duration::from_secs(30),
        connect(
            local(&unique("hung"))
                .table(unique("t").replace('-', "_"))
                .contact_points([dc1_point()]),
        ),
    )
    .await
    .expect("connect returns");
    t.initialize(true).await.expect("initialize with dc2 hung");
    let v = t.read_all().await.expect("read_all with dc2 hung").version;
    let address = SiloAddress::new(std::net::SocketAddr::from(([10, 5, 0, 1], 11111)), 1).unwrap();
    let entry = MembershipEntry::new(address, SiloStatus::Joining, Timestamp::now());
    assert!(
        t.insert_row(&entry, &v.next())
            .await
            .expect("insert with dc2 hung")
    );
    let took = started.elapsed();
    println!("dc2 hung: connect, initialize (a new table), read_all, insert_row in {took:?}");
    assert!(
        took < 2 * REQUEST_TIMEOUT,
        "a dc1 silo started in {took:?} with dc2 hung (bound {:?})",
        2 * REQUEST_TIMEOUT
    );
}

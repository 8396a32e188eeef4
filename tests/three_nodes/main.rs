//! Faults on three nodes: a workload of several table values (membership writes, consistent
//! reads, heartbeats) runs through a node killed, a node paused, two nodes down and restarts;
//! every versioned operation is recorded and the history checked for linearizability.
//!
//! Needs the three-node ring of `scripts/cassandra.sh start 3` (nodes `CASSANDRA_FIRST_NODE`..+2,
//! default 1..3, on 127.0.0.K) and sends it signals through that script. Not part of the
//! one-node run: `scripts/test.sh` runs it in its three-node stage (`cargo test --test three_nodes`).

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cassandra_membership::conformance::history::History;
use cassandra_membership::conformance::workload::{self, WorkloadOptions, WorkloadReport};
use cassandra_membership::{CassandraClusteringOptions, CassandraMembershipTable, MembershipTable};
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use tokio::sync::{Mutex, OnceCell};

/// The keyspace of the fault runs: replication factor 3, dropped and made anew once per run.
const KEYSPACE: &str = "cm_faults";
/// The per-statement timeout of the table values under test.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// One fault at a time: every test takes this for its whole run.
static SERIAL: Mutex<()> = Mutex::const_new(());
static KEYSPACE_READY: OnceCell<()> = OnceCell::const_new();

fn first_node() -> u32 {
    std::env::var("CASSANDRA_FIRST_NODE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

fn nodes() -> Vec<u32> {
    let f = first_node();
    vec![f, f + 1, f + 2]
}

fn contact_points() -> Vec<String> {
    nodes()
        .iter()
        .map(|i| format!("127.0.0.{i}:9042"))
        .collect()
}

/// `scripts/cassandra.sh COMMAND I`.
fn node(command: &str, i: u32) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/cassandra.sh");
    let status = Command::new("bash")
        .arg(script)
        .arg(command)
        .arg(i.to_string())
        .status()
        .expect("run scripts/cassandra.sh");
    assert!(
        status.success(),
        "scripts/cassandra.sh {command} {i} failed"
    );
}

fn cql_up(i: u32) -> bool {
    std::net::TcpStream::connect_timeout(
        &format!("127.0.0.{i}:9042").parse().unwrap(),
        Duration::from_secs(1),
    )
    .is_ok()
}

/// Brings every node back (resumes paused ones, restarts killed ones) and waits until each
/// answers and sees the others up.
async fn heal() {
    for i in nodes() {
        let _ = Command::new("bash")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/cassandra.sh"))
            .args(["resume", &i.to_string()])
            .status();
    }
    for i in nodes() {
        if !cql_up(i) {
            node("restart", i);
        }
    }
    // Gossip needs a moment to mark restarted peers up everywhere.
    let s = session().await;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let up = s
            .query_unpaged("SELECT peer FROM system.peers", ())
            .await
            .ok()
            .and_then(|r| r.into_rows_result().ok())
            .map(|r| r.rows_num())
            .unwrap_or(0);
        if up == 2 && s.await_schema_agreement().await.is_ok() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the ring did not heal within 90 s"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn session() -> Arc<Session> {
    let points = contact_points();
    Arc::new(
        SessionBuilder::new()
            .known_nodes(&points)
            .connection_timeout(Duration::from_secs(5))
            .build()
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "no three-node ring answers at {points:?} ({e}): start one with \
                     `scripts/cassandra.sh start 3`, or run `scripts/test.sh`"
                )
            }),
    )
}

async fn keyspace() {
    KEYSPACE_READY
        .get_or_init(|| async {
            let s = session().await;
            s.query_unpaged(format!("DROP KEYSPACE IF EXISTS {KEYSPACE}"), ())
                .await
                .expect("drop the previous run's keyspace");
            s.query_unpaged(
                format!(
                    "CREATE KEYSPACE {KEYSPACE} WITH replication = \
                     {{'class': 'SimpleStrategy', 'replication_factor': 3}}"
                ),
                (),
            )
            .await
            .expect("create the RF 3 keyspace");
            s.await_schema_agreement().await.expect("schema agreement");
        })
        .await;
}

fn options(cluster: &str) -> CassandraClusteringOptions {
    CassandraClusteringOptions::new(KEYSPACE, "faults", cluster)
        .contact_points(contact_points())
        .request_timeout(REQUEST_TIMEOUT)
}

/// `clients` table values, each with its own session, for a fresh initialized cluster.
async fn clients(cluster: &str, clients: usize) -> Vec<Arc<dyn MembershipTable>> {
    let mut tables: Vec<Arc<dyn MembershipTable>> = Vec::new();
    for _ in 0..clients {
        let t = CassandraMembershipTable::connect(options(cluster))
            .await
            .expect("connect");
        tables.push(Arc::new(t));
    }
    tables[0].initialize(true).await.expect("initialize");
    tables
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// Checks the history and prints the figures the README quotes.
fn checked(name: &str, history: &History, report: &WorkloadReport) {
    let t0 = Instant::now();
    let verdict = history.check().expect("a well-formed history");
    println!(
        "{name}: {} operations ({} returned, {} writes applied), {} failures {:?}, slowest call {:?}; \
         checked in {:?}: linearizable = {}",
        verdict.operations,
        verdict.returned,
        report.applied,
        report.failures.len(),
        report.by_kind(),
        report.slowest,
        t0.elapsed(),
        verdict.linearizable
    );
    assert!(
        verdict.linearizable,
        "{name}: the history is not linearizable"
    );
    assert!(report.applied > 0, "{name}: the workload made progress");
}

/// Rows stored in the cluster's partition (bypassing the provider) vs entries it reads: a torn
/// or partial row would be stored but not read.
async fn stored_rows(cluster: &str) -> usize {
    session()
        .await
        .query_unpaged(
            format!(
                "SELECT silo FROM {KEYSPACE}.membership WHERE service_id = 'faults' AND cluster_id = ?"
            ),
            (cluster,),
        )
        .await
        .expect("raw read")
        .into_rows_result()
        .expect("rows")
        .rows::<(Option<String>,)>()
        .expect("typed rows")
        .filter(|r| matches!(r, Ok((Some(_),))))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_node_killed_every_operation_still_succeeds_after_rerouting() {
    let _serial = SERIAL.lock().await;
    keyspace().await;
    heal().await;
    let cluster = unique("kill");
    let tables = clients(&cluster, 3).await;
    let history = Arc::new(History::new());
    let until = Instant::now() + Duration::from_secs(30);
    let run = tokio::spawn(workload::run(
        tables.clone(),
        history.clone(),
        WorkloadOptions::default(),
        until,
    ));
    tokio::time::sleep(Duration::from_secs(5)).await;
    let victim = nodes()[2];
    node("kill", victim);
    let killed_at = Duration::from_secs(5);
    // Silos starting meanwhile: many initialize at once, creating a new table while the dead
    // node cannot agree on schema.
    let table = unique("t").replace('-', "_");
    let mut starts = Vec::new();
    for k in 0..8 {
        let o = options(&format!("{cluster}-{k}")).table(table.clone());
        starts.push(tokio::spawn(async move {
            let t = CassandraMembershipTable::connect(o).await?;
            t.initialize(true).await?;
            t.read_all().await.map(|_| ())
        }));
    }
    for s in starts {
        s.await
            .expect("join")
            .expect("a silo starting while a node is dead initializes");
    }
    let report = run.await.expect("workload");
    heal().await;
    // The driver needs a moment to notice the dead node; after that, nothing may fail.
    let grace = killed_at + REQUEST_TIMEOUT * 2;
    let late = report.failures_after(grace);
    assert!(late.is_empty(), "failures after {grace:?}: {late:#?}");
    checked("one node killed", &history, &report);
    assert_eq!(
        stored_rows(&cluster).await,
        tables[0].read_all().await.expect("read").rows.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_node_paused_calls_return_in_time_with_honest_answers() {
    let _serial = SERIAL.lock().await;
    keyspace().await;
    heal().await;
    let cluster = unique("pause");
    let tables = clients(&cluster, 3).await;
    let history = Arc::new(History::new());
    let until = Instant::now() + Duration::from_secs(40);
    let run = tokio::spawn(workload::run(
        tables.clone(),
        history.clone(),
        WorkloadOptions::default(),
        until,
    ));
    tokio::time::sleep(Duration::from_secs(5)).await;
    let victim = nodes()[1];
    node("pause", victim);
    tokio::time::sleep(Duration::from_secs(20)).await;
    node("resume", victim);
    let resumed_at = Duration::from_secs(25);
    let report = run.await.expect("workload");
    heal().await;
    // A call may wait for one statement and, when ambiguous, a re-read: a few request timeouts.
    let bound = REQUEST_TIMEOUT * 4 + Duration::from_secs(2);
    assert!(
        report.slowest <= bound,
        "a call took {:?} (bound {bound:?})",
        report.slowest
    );
    for f in &report.failures {
        assert!(
            matches!(
                f.kind.as_str(),
                "Timeout" | "OutcomeUnknown" | "Unavailable" | "Contention"
            ),
            "an error a caller cannot act on: {f:?}"
        );
    }
    let grace = resumed_at + REQUEST_TIMEOUT * 2;
    let late = report.failures_after(grace);
    assert!(
        late.is_empty(),
        "failures after the node resumed: {late:#?}"
    );
    checked("one node paused", &history, &report);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_nodes_down_give_typed_unavailable_and_no_partial_state() {
    let _serial = SERIAL.lock().await;
    keyspace().await;
    heal().await;
    let cluster = unique("two");
    let tables = clients(&cluster, 3).await;
    let history = Arc::new(History::new());
    let until = Instant::now() + Duration::from_secs(30);
    let run = tokio::spawn(workload::run(
        tables.clone(),
        history.clone(),
        WorkloadOptions::default(),
        until,
    ));
    tokio::time::sleep(Duration::from_secs(5)).await;
    let [_, b, c] = nodes()[..] else {
        unreachable!()
    };
    node("kill", b);
    node("kill", c);
    let down_at = Duration::from_secs(5);
    tokio::time::sleep(Duration::from_secs(15)).await;
    // Restart while the workload still runs: the cluster must converge.
    node("restart", b);
    node("restart", c);
    let report = run.await.expect("workload");
    heal().await;
    let during: Vec<_> = report
        .failures
        .iter()
        .filter(|f| f.at >= down_at + REQUEST_TIMEOUT * 2 && f.at < Duration::from_secs(18))
        .collect();
    assert!(
        !during.is_empty(),
        "with two of three nodes down, calls fail"
    );
    for f in &during {
        assert!(
            matches!(
                f.kind.as_str(),
                "Unavailable" | "Timeout" | "OutcomeUnknown"
            ),
            "a typed error: {f:?}"
        );
    }
    assert!(
        during.iter().any(|f| f.kind == "Unavailable"),
        "at least some say Unavailable: {:?}",
        report.by_kind()
    );
    checked("two nodes down, then restarted", &history, &report);
    let read = tables[0].read_all().await.expect("read after healing");
    assert_eq!(stored_rows(&cluster).await, read.rows.len(), "no torn rows");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restarted_node_converges_and_no_acknowledged_write_is_lost() {
    let _serial = SERIAL.lock().await;
    keyspace().await;
    heal().await;
    let cluster = unique("restart");
    let tables = clients(&cluster, 3).await;
    let history = Arc::new(History::new());
    let until = Instant::now() + Duration::from_secs(35);
    let run = tokio::spawn(workload::run(
        tables.clone(),
        history.clone(),
        WorkloadOptions::default(),
        until,
    ));
    let victim = nodes()[0];
    tokio::time::sleep(Duration::from_secs(5)).await;
    node("kill", victim);
    tokio::time::sleep(Duration::from_secs(8)).await;
    node("restart", victim);
    let report = run.await.expect("workload");
    heal().await;
    checked("a node killed and restarted", &history, &report);
    // Each applied write moved the version by one: the final version counts them (plus
    // writes whose outcome stayed unknown and that did apply).
    let read = tables[1].read_all().await.expect("read");
    assert!(read.version.version >= report.applied);
}

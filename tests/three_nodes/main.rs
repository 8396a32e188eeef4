//! Faults on three nodes: a workload of several table values (membership writes, consistent
//! reads, heartbeats) runs through a node killed, a node paused, two nodes down and restarts;
//! every versioned operation is recorded and the history checked for linearizability.
//!
//! Needs the three-node ring of `scripts/cassandra.sh start 3` (nodes `CASSANDRA_FIRST_NODE`..+2,
//! default 1..3, on 127.0.0.K) and sends it signals through that script. Not part of the
//! one-node run: `scripts/test.sh` runs it in its three-node stage (`cargo test --test three_nodes`).

mod nemesis;
mod one_node_down;
mod outcomes;
#[path = "../common/ring.rs"]
mod ring;

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cassandra_membership::conformance::history::{History, HistoryOp, HistoryRet};
use cassandra_membership::conformance::workload::{self, WorkloadOptions, WorkloadReport};
use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, MembershipOptions, MembershipTable, Silo,
    SiloAddress,
};
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use tokio::sync::{Mutex, OnceCell};

/// The keyspace of the fault runs: replication factor 3, dropped and made anew once per run.
const KEYSPACE: &str = "cm_faults";
/// The per-statement timeout of the table values under test.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long after a node is killed (or paused) the others' gossip may take to convict it
/// (~19 s measured; more on two loaded cores). Until then a contended Paxos v1 round waits for
/// the replica believed alive and times out.
const CONVICTION: Duration = Duration::from_secs(24);

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

/// Waits until each other node's gossip has convicted node `victim` (its `nodetool status` shows
/// it `DN`): the moment docs::guarantees' "One node of three down" speaks of, measured rather
/// than assumed ([`CONVICTION`] is the bound load may stretch). Returns the time since `since`.
async fn convicted_by_the_others(victim: u32, since: Instant, limit: Duration) -> Duration {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/cassandra.sh");
    let down = format!("DN  127.0.0.{victim} ");
    for i in nodes().into_iter().filter(|&i| i != victim) {
        loop {
            let out = Command::new("bash")
                .arg(script)
                .args(["nodetool", &i.to_string(), "status"])
                .output()
                .expect("run scripts/cassandra.sh nodetool");
            if String::from_utf8_lossy(&out.stdout)
                .lines()
                .any(|l| l.starts_with(&down))
            {
                break;
            }
            assert!(
                since.elapsed() < limit,
                "node {i} did not mark 127.0.0.{victim} down within {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    since.elapsed()
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
    let s = tokio::time::timeout(Duration::from_secs(60), session())
        .await
        .expect("a session to the healed ring within 60 s");
    crate::ring::await_healed(&s, 2).await;
    every_coordinator_sees_every_replica(&s).await;
}

/// Waits until each node, as coordinator, sees all three replicas alive: a write at `ALL` through
/// it succeeds. A node restarted (or resumed) a moment ago answers CQL before the others' gossip
/// marks it up again; a test starting then met `Unavailable { alive: 1 }` from a coordinator
/// that still counted it down with one more node paused.
async fn every_coordinator_sees_every_replica(s: &Session) {
    use scylla::client::execution_profile::ExecutionProfile;
    use scylla::policies::load_balancing::{NodeIdentifier, SingleTargetLoadBalancingPolicy};
    use scylla::statement::Consistency;
    use scylla::statement::unprepared::Statement;

    // The first test of a run may heal before any test made the keyspace.
    keyspace().await;
    s.query_unpaged(
        format!("CREATE TABLE IF NOT EXISTS {KEYSPACE}.heal_probe (k int PRIMARY KEY)"),
        (),
    )
    .await
    .expect("the probe table");
    let _ = s.await_schema_agreement().await;
    let deadline = Instant::now() + Duration::from_secs(90);
    for node in s.get_cluster_state().get_nodes_info().to_vec() {
        loop {
            let mut probe =
                Statement::new(format!("INSERT INTO {KEYSPACE}.heal_probe (k) VALUES (0)"));
            probe.set_consistency(Consistency::All);
            probe.set_request_timeout(Some(Duration::from_secs(5)));
            let only = ExecutionProfile::builder()
                .load_balancing_policy(SingleTargetLoadBalancingPolicy::new(
                    NodeIdentifier::Node(node.clone()),
                    None,
                ))
                .build();
            probe.set_execution_profile_handle(Some(only.into_handle()));
            let answer = s.query_unpaged(probe, ()).await;
            if answer.is_ok() {
                break;
            }
            if Instant::now() >= deadline {
                // Best effort: the ring answers CQL and agrees on schema (await_healed); a test
                // that needs every replica will say so itself.
                eprintln!(
                    "heal: node {} still did not write at ALL after 90 s: {answer:?}",
                    node.address
                );
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
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
    CassandraClusteringOptions::default()
        .keyspace(KEYSPACE)
        .service_id("faults")
        .cluster_id(cluster)
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

/// Membership options of a silo started in a fault run: a 1 s publish period.
fn fast_membership() -> MembershipOptions {
    let mut m = MembershipOptions::default();
    m.i_am_alive_table_publish_timeout = Duration::from_secs(1);
    m.defunct_silo_cleanup_period = None;
    m
}

fn workload_options() -> WorkloadOptions {
    WorkloadOptions {
        // Well past any call's documented bound (a statement, a re-read, a fence, a re-read).
        hung_after: REQUEST_TIMEOUT * 10,
        // Three writers on one partition, a few membership changes a second each: far above a
        // real cluster's rate, yet not a Paxos duel on every write on two shared cores.
        pause: Duration::from_millis(400),
        ..WorkloadOptions::default()
    }
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// One more `read_all` after healing, recorded in the history: a write acknowledged during the
/// run and lost since would show here.
async fn final_read(history: &History, table: &Arc<dyn MembershipTable>) {
    let t = history.thread();
    history.invoke(t, HistoryOp::ReadAll);
    let s = table.read_all().await.expect("a read after healing");
    history.respond(t, HistoryRet::snapshot(&s));
}

/// `node("restart", i)` in the background: the workload goes on while the node starts.
fn restart_later(i: u32) -> tokio::task::JoinHandle<()> {
    tokio::task::spawn_blocking(move || node("restart", i))
}

/// Checks the history and prints the figures CONTRIBUTING.md ("Faults") quotes.
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

/// What a call may answer while a quorum of the live replicas is up, the fault applied at
/// `fault_at` into the workload: a heartbeat never fails (idempotent, speculated past a silent
/// coordinator); a conditional write may answer an unknown outcome or a timeout (it may have
/// reached the node as it died or froze, and is never sent twice) or lose a race
/// (`Contention`); a serial read (`read_all`, a Paxos round under v1) that the three writers'
/// rounds race may time out before gossip convicts the node ([`CONVICTION`]), never after.
/// Never `Unavailable`: two replicas of three answer.
fn failed_while_a_quorum_was_up(
    report: &WorkloadReport,
    fault_at: Duration,
) -> Vec<&workload::Failure> {
    report
        .failures
        .iter()
        .filter(|f| {
            let write = matches!(f.operation, "insert_row" | "update_row")
                && matches!(f.kind.as_str(), "Timeout" | "OutcomeUnknown" | "Contention");
            // In flight at the fault or started after it, and started before the conviction.
            let raced_read = f.operation == "read_all"
                && f.kind == "Timeout"
                && f.at + f.took >= fault_at
                && f.at < fault_at + CONVICTION;
            !(write || raced_read)
        })
        .collect()
}

/// Rows stored in the cluster's partition (bypassing the provider) vs entries it reads: a torn
/// or partial row would be stored but not read.
async fn stored_rows(cluster: &str) -> usize {
    session()
        .await
        .query_unpaged(
            format!(
                "SELECT silo, entry.etag AS etag FROM {KEYSPACE}.membership WHERE service_id = 'faults' AND cluster_id = ?"
            ),
            (cluster,),
        )
        .await
        .expect("raw read")
        .into_rows_result()
        .expect("rows")
        .rows::<(Option<String>, Option<uuid::Uuid>)>()
        .expect("typed rows")
        // Rows holding an entry: not the version's row (''), not a heartbeat cell alone.
        .filter(|r| matches!(r, Ok((Some(_), Some(_)))))
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
    // The kill at 5 s; the conviction allowed until 29 s; then 15 s that must be clean, and
    // room for a call started just before 29 s to end (a raced read: ~10 s).
    let until = Instant::now() + Duration::from_secs(45);
    let run = tokio::spawn(workload::run(
        tables.clone(),
        history.clone(),
        workload_options(),
        until,
    ));
    tokio::time::sleep(Duration::from_secs(5)).await;
    let victim = nodes()[2];
    node("kill", victim);
    let killed_at = Duration::from_secs(5);
    // Silos starting meanwhile, the way a host starts one (`Silo::join`: initialize, insert,
    // Active, retrying what fails for a passing reason): eight at once, creating a new table
    // while the dead node cannot agree on schema — and, until the others convict it, is still
    // asked for its replica.
    let table = unique("t").replace('-', "_");
    let mut starts = Vec::new();
    for k in 0..8u16 {
        let o = options(&cluster).table(table.clone());
        starts.push(tokio::spawn(async move {
            let membership = fast_membership();
            let t = CassandraMembershipTable::connect(o.membership(membership)).await?;
            let address =
                SiloAddress::new(std::net::SocketAddr::from(([10, 9, 0, 1], 40_000 + k)), 1)?;
            let started = Instant::now();
            let silo = Silo::join(Arc::new(t), address).await?;
            let took = started.elapsed();
            silo.leave().await?;
            Ok::<Duration, cassandra_membership::MembershipError>(took)
        }));
    }
    let mut joins = Vec::new();
    for s in starts {
        joins.push(
            s.await
                .expect("join task")
                .expect("a silo starting while a node is dead joins"),
        );
    }
    println!("eight silos started while a node was dead, joined after {joins:?}");
    let report = run.await.expect("workload");
    heal().await;
    final_read(&history, &tables[0]).await;
    // A quorum is up throughout: from the kill on, before gossip convicts the dead node and
    // after, no heartbeat fails, no read fails but a raced serial read before the conviction,
    // and nothing answers Unavailable.
    let failed = failed_while_a_quorum_was_up(&report, killed_at);
    assert!(
        failed.is_empty(),
        "calls failed while a quorum was up: {failed:#?}"
    );
    // And once the nodes have convicted the dead node, nothing fails: the last 16 s of the run
    // (from the end of the conviction's allowance on) are clean.
    let late = report.failures_after(killed_at + CONVICTION);
    assert!(late.is_empty(), "failures 20 s after the kill: {late:#?}");
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
    let until = Instant::now() + Duration::from_secs(65);
    let run = tokio::spawn(workload::run(
        tables.clone(),
        history.clone(),
        workload_options(),
        until,
    ));
    tokio::time::sleep(Duration::from_secs(5)).await;
    let victim = nodes()[1];
    node("pause", victim);
    let paused_at = Duration::from_secs(5);
    tokio::time::sleep(Duration::from_secs(20)).await;
    node("resume", victim);
    let resumed_at = Duration::from_secs(25);
    let report = run.await.expect("workload");
    heal().await;
    final_read(&history, &tables[0]).await;
    // The guide's bound (`docs::guarantees`, "Bounded time") for a conditional write with expiry off: 8 request timeouts when each
    // of its reads times out once and is sent again (a read_all of one page: 4).
    let bound = REQUEST_TIMEOUT * 8 + Duration::from_secs(2);
    assert!(
        report.slowest <= bound,
        "a call took {:?} (bound {bound:?})",
        report.slowest
    );
    // A quorum is up throughout (the paused node is one of three): heartbeats never fail, reads
    // only a raced serial read before the conviction, nothing answers Unavailable; a
    // conditional write the paused node coordinates may answer honestly that its outcome is
    // unknown.
    let failed = failed_while_a_quorum_was_up(&report, paused_at);
    assert!(
        failed.is_empty(),
        "calls failed while a quorum was up: {failed:#?}"
    );
    // A node resumed after 20 s has a backlog to work off (expired messages, hints, Paxos
    // rounds it missed); on two shared cores that takes a while. Once it has, nothing fails:
    // the last 15 s of the run (from 50 s, 25 s after the resume) are clean.
    let _ = resumed_at;
    // An unknown outcome stays an honest answer while Paxos rounds duel on two shared cores
    // (a CAS write timeout; the history check below judges it); nothing else may fail.
    let late: Vec<_> = report
        .failures_after(Duration::from_secs(50))
        .into_iter()
        .filter(|f| f.kind != "OutcomeUnknown")
        .collect();
    assert!(
        late.is_empty(),
        "failures 25 s after the node resumed: {late:#?}"
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
    let started = Instant::now();
    // The workload runs until the test ends it (20 s after the ring healed); the cap only bounds
    // a test that fails before that.
    let (until, until_rx) = tokio::sync::watch::channel(started + Duration::from_secs(600));
    let run = tokio::spawn(workload::run_until(
        tables.clone(),
        history.clone(),
        workload_options(),
        until_rx,
    ));
    tokio::time::sleep(Duration::from_secs(5)).await;
    let [_, b, c] = nodes()[..] else {
        unreachable!()
    };
    node("kill", b);
    node("kill", c);
    let down_at = Duration::from_secs(5);
    tokio::time::sleep(Duration::from_secs(15)).await;
    // Restart while the workload still runs (one node, then the other): the cluster must
    // converge, and the workload records what it does once a quorum is back — for 20 s after
    // every coordinator sees every replica again, however long the restarts took.
    let restarts = tokio::task::spawn_blocking(move || {
        node("restart", b);
        node("restart", c);
    });
    restarts.await.expect("restarts");
    heal().await;
    let healed = started.elapsed();
    until.send_replace(Instant::now() + Duration::from_secs(20));
    let report = run.await.expect("workload");
    final_read(&history, &tables[0]).await;
    let back = report.applied_at.iter().filter(|t| **t > healed).count();
    assert!(
        back > 0,
        "writes applied once the ring had healed ({healed:?} in): {report:?}"
    );
    let during: Vec<_> = report
        .failures
        .iter()
        // From shortly after the kill until the nodes are back (the restarts take a while).
        .filter(|f| f.at >= down_at + Duration::from_secs(1))
        .collect();
    assert!(
        !during.is_empty(),
        "with two of three nodes down, calls fail: {:?}",
        report.failures
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
    let started = Instant::now();
    // The workload runs until the test ends it (40 s after the second kill); the cap only bounds
    // a test that fails before that.
    let (until, until_rx) = tokio::sync::watch::channel(started + Duration::from_secs(600));
    let run = tokio::spawn(workload::run_until(
        tables.clone(),
        history.clone(),
        workload_options(),
        until_rx,
    ));
    let [a, b, _] = nodes()[..] else {
        unreachable!()
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    node("kill", a);
    tokio::time::sleep(Duration::from_secs(8)).await;
    restart_later(a).await.expect("restart");
    // Now the restarted node must carry the quorum: once every coordinator sees it up again
    // (a restart on a loaded machine can take a minute), take another one away, and let the
    // workload run 40 s past that kill whatever the restart took.
    every_coordinator_sees_every_replica(&*session().await).await;
    let second_kill_at = started.elapsed();
    node("kill", b);
    until.send_replace(Instant::now() + Duration::from_secs(40));
    let report = run.await.expect("workload");
    heal().await;
    final_read(&history, &tables[1]).await;
    checked("a node killed and restarted", &history, &report);
    let after = report
        .applied_at
        .iter()
        .filter(|t| **t > second_kill_at + Duration::from_secs(5))
        .count();
    assert!(
        after > 0,
        "writes applied with the restarted node in the quorum: {report:?}"
    );
}

/// The `silo_host` example, built once.
fn silo_host_binary() -> std::path::PathBuf {
    if let Ok(p) = std::env::var("SILO_HOST_BIN") {
        return p.into();
    }
    let manifest = env!("CARGO_MANIFEST_DIR");
    let status = Command::new(env!("CARGO"))
        .args(["build", "--quiet", "--example", "silo_host"])
        .current_dir(manifest)
        .status()
        .expect("cargo build --example silo_host");
    assert!(status.success(), "building the silo_host example failed");
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| format!("{manifest}/target"));
    std::path::Path::new(&target).join("debug/examples/silo_host")
}

/// A running host process and the lines it printed.
struct Host {
    child: tokio::process::Child,
    lines: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Host {
    fn spawn(bin: &std::path::Path, cluster: &str, port: u16) -> Host {
        let mut child = tokio::process::Command::new(bin)
            .args([
                "--contact-points",
                &contact_points().join(","),
                "--keyspace",
                KEYSPACE,
                "--rf",
                "3",
                "--cluster",
                cluster,
                "--port",
                &port.to_string(),
                "--period-ms",
                "1000",
            ])
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start a silo host");
        let lines = Arc::new(std::sync::Mutex::new(Vec::new()));
        let out = child.stdout.take().expect("stdout");
        let sink = lines.clone();
        tokio::spawn(async move {
            use tokio::io::AsyncBufReadExt;
            let mut reader = tokio::io::BufReader::new(out).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                sink.lock().unwrap().push(line);
            }
        });
        Host { child, lines }
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.id().expect("running").to_string();
        let ok = Command::new("kill")
            .args([sig, &pid])
            .status()
            .expect("kill");
        assert!(ok.success(), "kill {sig} {pid}");
    }

    fn printed(&self, needle: &str) -> bool {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains(needle))
    }

    fn address(&self) -> Option<String> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .find(|l| l.contains("\"joined\""))
            .and_then(|l| l.split("\"detail\":\"").nth(1))
            .map(|d| d.trim_end_matches("\"}").to_owned())
    }
}

/// Statuses seen for each address, in order, by polling the table.
type Observed = Arc<std::sync::Mutex<std::collections::BTreeMap<String, Vec<(Duration, i32)>>>>;

async fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !done() {
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    t0.elapsed()
}

fn last_status(observed: &Observed, address: &str) -> Option<i32> {
    observed
        .lock()
        .unwrap()
        .get(address)
        .and_then(|v| v.last())
        .map(|(_, s)| *s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn silo_host_processes_declare_killed_and_paused_hosts_dead_and_a_dead_host_stops() {
    const ACTIVE: i32 = 3;
    const DEAD: i32 = 6;
    let _serial = SERIAL.lock().await;
    keyspace().await;
    heal().await;
    let bin = silo_host_binary();
    let cluster = unique("hosts");
    let hosts: Vec<Host> = (0..4)
        .map(|k| Host::spawn(&bin, &cluster, 31_001 + k))
        .collect();
    // Observe the table from outside, the way an operator would.
    let observer = CassandraMembershipTable::connect(
        CassandraClusteringOptions::default()
            .keyspace(KEYSPACE)
            .service_id("hosts")
            .cluster_id(&cluster)
            .contact_points(contact_points()),
    )
    .await
    .expect("observer");
    let observed: Observed = Arc::default();
    let started = Instant::now();
    let poll = {
        let observed = observed.clone();
        tokio::spawn(async move {
            loop {
                if let Ok(s) = observer.read_all().await {
                    let mut o = observed.lock().unwrap();
                    for r in &s.rows {
                        let seq = o.entry(r.entry.address.to_string()).or_default();
                        let status = r.entry.status.code();
                        if seq.last().map(|(_, s)| *s) != Some(status) {
                            seq.push((started.elapsed(), status));
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    wait_until("four hosts joined", Duration::from_secs(90), || {
        hosts.iter().all(|h| h.address().is_some())
    })
    .await;
    let addresses: Vec<String> = hosts.iter().map(|h| h.address().unwrap()).collect();
    wait_until("four Active rows", Duration::from_secs(30), || {
        addresses
            .iter()
            .all(|a| last_status(&observed, a) == Some(ACTIVE))
    })
    .await;

    // Detection time with these options: 3 missed 1 s periods, then the votes of two others in
    // their next detection rounds (1 s each), plus the slack of a busy two-core machine.
    let detection = Duration::from_secs(3 + 2 + 5);

    hosts[0].signal("-KILL");
    let took = wait_until("the SIGKILLed host declared Dead", detection, || {
        last_status(&observed, &addresses[0]) == Some(DEAD)
    })
    .await;
    println!("SIGKILL: declared Dead after {took:?}");

    hosts[1].signal("-STOP");
    let took = wait_until("the SIGSTOPped host declared Dead", detection, || {
        last_status(&observed, &addresses[1]) == Some(DEAD)
    })
    .await;
    println!("SIGSTOP: declared Dead after {took:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cont_at_ms = cassandra_membership::Timestamp::now().as_millis();
    hosts[1].signal("-CONT");
    let took = wait_until(
        "the resumed host learns it is dead and stops",
        Duration::from_secs(15),
        || hosts[1].printed("\"stopped\""),
    )
    .await;
    println!("SIGCONT: the host stopped {took:?} after resuming");
    tokio::time::sleep(Duration::from_secs(5)).await;

    // Graceful leave of the two others.
    hosts[2].signal("-TERM");
    hosts[3].signal("-TERM");
    for h in &hosts[2..] {
        wait_until("a host left", Duration::from_secs(30), || {
            h.printed("\"left\"")
        })
        .await;
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    poll.abort();
    let observed = observed.lock().unwrap().clone();
    println!("statuses seen: {observed:?}");
    for (k, a) in addresses.iter().enumerate() {
        let seq = &observed[a];
        assert_eq!(
            seq.last().map(|(_, s)| *s),
            Some(DEAD),
            "host {k} ends Dead: {seq:?}"
        );
        // Once Dead, never back: a dead host never writes itself Active again.
        let first_dead = seq.iter().position(|(_, s)| *s == DEAD).unwrap();
        assert!(
            seq[first_dead..].iter().all(|(_, s)| *s == DEAD),
            "host {k} came back after Dead: {seq:?}"
        );
    }
    // Between SIGCONT and "stopped" the resumed host never told its host it was Healthy.
    let lines = hosts[1].lines.lock().unwrap().clone();
    let stop = lines
        .iter()
        .position(|l| l.contains("\"stopped\""))
        .expect("stopped");
    let healthy_since_cont = lines[..stop]
        .iter()
        .filter(|l| l.contains("Healthy"))
        .filter_map(|l| {
            l.split("\"at_ms\":")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<i64>()
                .ok()
        })
        .any(|at| at >= cont_at_ms);
    assert!(
        !healthy_since_cont,
        "the resumed host said Healthy: {lines:#?}"
    );
}

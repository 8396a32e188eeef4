//! One node of three down, before and after the others notice: every call a quorum of the live
//! replicas can serve succeeds.
//!
//! - killed: from table values whose contact points name the dead node first, for the whole
//!   stretch from the kill on (gossip convicts the dead node only ~19 s after the kill; the
//!   stretch covers that and more): no call answers `Unavailable` or a pool error, and every
//!   heartbeat, `connect` and read no other Paxos round races (`read_all`, `read_row` of a
//!   cluster of its own) succeeds. Before the conviction, Paxos v1 turns contention into
//!   timeouts: a conditional write (or a wave's `initialize`) may answer honestly — `false`,
//!   `OutcomeUnknown`, `Timeout` — and a serial read of a partition others use at once may
//!   answer `Timeout`; after it (past the stretch), the contenders' simultaneous reads succeed;
//! - paused (SIGSTOP: its connections stay open and it never answers): heartbeats and reads no
//!   one races succeed (a raced serial read as above, before the conviction); a conditional
//!   write whose coordinator is the paused node has reached it and cannot be sent elsewhere, so
//!   it may answer `OutcomeUnknown` / `Timeout`, within its bound — never `Unavailable`, a pool
//!   error or a wrong `false`;
//! - silos (`Silo::join`, publish period 1 s, 3 missed heartbeats, expiry on with a 60 s TTL)
//!   through a node kill and its restart: none is declared Dead, none fences itself.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cassandra_membership::conformance::workload;
use cassandra_membership::{
    CassandraMembershipTable, MembershipEntry, MembershipError, MembershipTable, Silo, SiloAddress,
    SiloHealth, SiloStatus, Timestamp,
};

use crate::{
    CONVICTION, KEYSPACE, SERIAL, contact_points, heal, keyspace, node, nodes, options, unique,
};

/// How long the operations run once the node is down: past gossip's conviction (~19 s).
const STRETCH: Duration = Duration::from_secs(28);

/// What one call came back with.
#[derive(Debug)]
struct Call {
    op: &'static str,
    at: Duration,
    took: Duration,
    /// `None`: it succeeded as the contract says (applied, where it writes).
    failure: Option<String>,
}

/// The contact points with `victim` first: the driver is asked for the dead node before any other.
fn dead_first(victim: u32) -> Vec<String> {
    let first = format!("127.0.0.{victim}:9042");
    let mut points = contact_points();
    points.retain(|p| *p != first);
    points.insert(0, first);
    points
}

fn silo(k: u16, n: u16) -> SiloAddress {
    SiloAddress::new(
        std::net::SocketAddr::from(([10, 41, k as u8, 1], 20_000 + n)),
        1,
    )
    .expect("a valid address")
}

fn failure<T: std::fmt::Debug>(
    r: &Result<T, MembershipError>,
    ok: impl Fn(&T) -> bool,
) -> Option<String> {
    match r {
        Ok(v) if ok(v) => None,
        Ok(v) => Some(format!("answered {v:?}")),
        Err(e) => Some(format!(
            "{}: {e} ({:.400})",
            workload::kind(e),
            format!("{e:?}")
        )),
    }
}

/// One table value's loop until `until`: on a cluster of its own (no other writer, so every
/// conditional write must apply), read_all, insert, read_row, update, heartbeat.
async fn worker(
    table: Arc<CassandraMembershipTable>,
    k: u16,
    t0: Instant,
    until: Instant,
) -> Vec<Call> {
    let own = silo(k, 0);
    let mut calls = Vec::new();
    let mut n = 1u16;
    let record = |calls: &mut Vec<Call>, op, started: Instant, failure| {
        calls.push(Call {
            op,
            at: started.duration_since(t0),
            took: started.elapsed(),
            failure,
        })
    };
    while Instant::now() < until {
        let s = Instant::now();
        let r = table.read_all().await;
        record(&mut calls, "read_all", s, failure(&r, |_| true));
        let Ok(snapshot) = r else { continue };

        let s = Instant::now();
        let entry = MembershipEntry::new(silo(k, n), SiloStatus::Joining, Timestamp::now());
        n += 1;
        let r = table.insert_row(&entry, &snapshot.version.next()).await;
        record(&mut calls, "insert_row", s, failure(&r, |applied| *applied));

        let s = Instant::now();
        let r = table.read_row(&own).await;
        record(
            &mut calls,
            "read_row",
            s,
            failure(&r, |s| s.get(&own).is_some()),
        );
        let Ok(row) = r else { continue };
        let Some(current) = row.get(&own) else {
            continue;
        };

        let s = Instant::now();
        let mut updated = current.entry.clone();
        updated.update_zone = updated.update_zone.wrapping_add(1);
        let r = table
            .update_row(&updated, &current.etag, &row.version.next())
            .await;
        record(&mut calls, "update_row", s, failure(&r, |applied| *applied));

        let s = Instant::now();
        let r = table.update_i_am_alive(&own, Timestamp::now()).await;
        record(&mut calls, "update_i_am_alive", s, failure(&r, |_| true));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    calls
}

/// A table value connecting while the node is down (the dead node its first contact point):
/// connect, initialize `cluster` (shared with the other newcomers of its wave), insert its own
/// row (read again and retried after a `false`: the others of the wave move the version).
async fn newcomer(victim: u32, cluster: String, k: u16, t0: Instant) -> Vec<Call> {
    let s = Instant::now();
    let connected =
        CassandraMembershipTable::connect(options(&cluster).contact_points(dead_first(victim)))
            .await;
    let mut calls = vec![Call {
        op: "connect",
        at: s.duration_since(t0),
        took: s.elapsed(),
        failure: failure(&connected, |_| true),
    }];
    let Ok(table) = connected else { return calls };
    let s = Instant::now();
    let r = table.initialize(true).await;
    calls.push(Call {
        op: "initialize",
        at: s.duration_since(t0),
        took: s.elapsed(),
        failure: failure(&r, |_| true),
    });
    let entry = MembershipEntry::new(silo(99, k), SiloStatus::Joining, Timestamp::now());
    // A timed-out read takes ~10 s: the retries end with the stretch (and 20 s more).
    let deadline = t0 + STRETCH + Duration::from_secs(20);
    for _ in 0..20 {
        if Instant::now() >= deadline {
            break;
        }
        let s = Instant::now();
        let read = table.read_all().await;
        calls.push(Call {
            op: "read_all (wave)",
            at: s.duration_since(t0),
            took: s.elapsed(),
            failure: failure(&read, |_| true),
        });
        let Ok(snapshot) = read else { continue };
        let s = Instant::now();
        let r = table.insert_row(&entry, &snapshot.version.next()).await;
        let lost_race = matches!(r, Ok(false));
        calls.push(Call {
            op: "insert_row (new table value)",
            at: s.duration_since(t0),
            took: s.elapsed(),
            failure: if lost_race {
                None
            } else {
                failure(&r, |applied| *applied)
            },
        });
        if !lost_race {
            break;
        }
    }
    calls
}

/// One of several table values writing one cluster at once: reads, and inserts or updates that
/// race the others' (a `false` is a lost race, an unknown outcome a Paxos duel: both honest).
async fn contender(
    table: Arc<CassandraMembershipTable>,
    k: u16,
    t0: Instant,
    until: Instant,
) -> Vec<Call> {
    let mut calls = Vec::new();
    let mut n = 0u16;
    while Instant::now() < until {
        let s = Instant::now();
        let r = table.read_all().await;
        calls.push(Call {
            op: "read_all (contended)",
            at: s.duration_since(t0),
            took: s.elapsed(),
            failure: failure(&r, |_| true),
        });
        let Ok(snapshot) = r else { continue };
        let s = Instant::now();
        let r = match snapshot.rows.first().filter(|_| n % 2 == 1) {
            Some(row) => {
                let mut e = row.entry.clone();
                e.update_zone = e.update_zone.wrapping_add(1);
                table
                    .update_row(&e, &row.etag, &snapshot.version.next())
                    .await
            }
            None => {
                let e =
                    MembershipEntry::new(silo(60 + k, n), SiloStatus::Joining, Timestamp::now());
                table.insert_row(&e, &snapshot.version.next()).await
            }
        };
        n += 1;
        calls.push(Call {
            op: "write (contended)",
            at: s.duration_since(t0),
            took: s.elapsed(),
            failure: match &r {
                Ok(_) => None,
                Err(e) => Some(format!("{}: {e}", workload::kind(e))),
            },
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    calls
}

/// Waits until every table value's driver sees `victim`'s connections closed (a killed node's
/// within a moment), at most 10 s. A conditional write in flight on the victim as it died may
/// have reached it: its answer is unknown, honestly (resolved by a re-read and a fence); the
/// stretch starts once the driver knows.
async fn driver_sees_down(tables: &[Arc<CassandraMembershipTable>], victim: u32) {
    let ip: std::net::IpAddr = format!("127.0.0.{victim}").parse().expect("an address");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let up = tables.iter().any(|t| {
            t.session()
                .get_cluster_state()
                .get_nodes_info()
                .iter()
                .any(|n| n.address.ip() == ip && n.is_connected())
        });
        if !up {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the driver still holds connections to node {victim}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs, for [`STRETCH`] after `fault` was applied to `victim` (every table value's contact
/// points start with it): three workers on clusters of their own, three contenders on one
/// shared cluster, and two waves of ten table values connecting, initializing one cluster and
/// inserting at once. Returns every call.
async fn run_through(fault: &'static str, victim: u32) -> Vec<Call> {
    let connect = |cluster: String| async move {
        let t =
            CassandraMembershipTable::connect(options(&cluster).contact_points(dead_first(victim)))
                .await
                .expect("connect while the ring is whole");
        t.initialize(true).await.expect("initialize");
        Arc::new(t)
    };
    let mut own = Vec::new();
    for k in 0..3u16 {
        let t = connect(unique(fault)).await;
        let v = t.read_all().await.expect("read").version.next();
        let e = MembershipEntry::new(silo(k, 0), SiloStatus::Joining, Timestamp::now());
        assert!(t.insert_row(&e, &v).await.expect("insert"), "insert");
        own.push(t);
    }
    let shared = unique(fault);
    let mut contenders = Vec::new();
    for _ in 0..3 {
        contenders.push(connect(shared.clone()).await);
    }
    node(fault, victim);
    if fault == "kill" {
        driver_sees_down(&own, victim).await;
    }
    let t0 = Instant::now();
    let until = t0 + STRETCH;
    let mut tasks = Vec::new();
    for (k, t) in own.iter().enumerate() {
        tasks.push(tokio::spawn(worker(t.clone(), k as u16, t0, until)));
    }
    for (k, t) in contenders.iter().enumerate() {
        tasks.push(tokio::spawn(contender(t.clone(), k as u16, t0, until)));
    }
    // Ten table values starting at once, at 1 s and at 20 s: before and after gossip notices.
    for at in [1u64, 20] {
        let wave = unique("wave");
        for k in 0..10u16 {
            let wave = wave.clone();
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep_until((t0 + Duration::from_secs(at)).into()).await;
                newcomer(victim, wave, k, t0).await
            }));
        }
    }
    let mut calls = Vec::new();
    for t in tasks {
        calls.extend(t.await.expect("a worker"));
    }
    // The allowance for raced reads ends at the conviction: past the stretch (the node still
    // down), the contenders read their cluster all at once — serial reads racing each other,
    // which must succeed now.
    let reads: Vec<_> = contenders
        .iter()
        .map(|t| {
            let t = t.clone();
            tokio::spawn(async move {
                let s = Instant::now();
                let r = t.read_all().await;
                Call {
                    op: "read_all (contended, after the conviction)",
                    at: s.duration_since(t0),
                    took: s.elapsed(),
                    failure: failure(&r, |_| true),
                }
            })
        })
        .collect();
    for r in reads {
        let call = r.await.expect("a read");
        assert!(
            call.at >= CONVICTION,
            "read before the conviction: {call:?}"
        );
        calls.push(call);
    }
    calls
}

/// Unavailable or a pool error: what a call must never answer while a quorum is up.
fn refused(c: &Call) -> bool {
    let f = c.failure.as_deref().unwrap_or("");
    f.starts_with("Unavailable") || f.contains("ConnectionPool")
}

/// A contended write's failure a race explains: another writer's Paxos round won or duelled
/// (the contenders, and the ten table values of a wave inserting into one cluster at once).
fn raced(c: &Call) -> bool {
    let f = c.failure.as_deref().unwrap_or("");
    matches!(c.op, "write (contended)" | "insert_row (new table value)")
        && (f.starts_with("OutcomeUnknown") || f.starts_with("Contention"))
}

/// A conditional write's (or a wave's `initialize`'s) honest answer while the dead node is not yet
/// convicted: Paxos v1 retries a contended round only once every replica it believes alive has
/// answered, so contention (or a stall of a live node on two loaded cores) ends in a timeout,
/// which the provider settles as `false` (fenced: it never applies), `OutcomeUnknown` or
/// `Timeout`. And a raced read's ([`raced_read`]). Never `Unavailable` or a pool error
/// ([`refused`]); never a read no one races, or a heartbeat.
fn honest_before_conviction(c: &Call) -> bool {
    let f = c.failure.as_deref().unwrap_or("");
    let contended_write = matches!(c.op, "insert_row" | "update_row" | "initialize")
        && (f.starts_with("answered false")
            || f.starts_with("OutcomeUnknown")
            || f.starts_with("Timeout"));
    (c.at < CONVICTION && contended_write) || raced_read(c)
}

/// A serial read of a partition others use at once (the contenders', a wave's) that timed out
/// before the conviction: it is a Paxos round too, raced by their reads and writes, and a raced
/// Paxos v1 round waits for the replica still believed alive (seen: a contender's `read_all`
/// 1 ms after a kill and 10 ms after a pause, both sends of both attempts unanswered).
fn raced_read(c: &Call) -> bool {
    let f = c.failure.as_deref().unwrap_or("");
    c.at < CONVICTION
        && matches!(c.op, "read_all (contended)" | "read_all (wave)")
        && f.starts_with("Timeout")
}

/// Counts by operation, and the failures.
fn summary<'a>(name: &str, calls: &'a [Call]) -> Vec<&'a Call> {
    let mut by_op: BTreeMap<&str, (usize, usize, Duration)> = BTreeMap::new();
    for c in calls {
        let e = by_op.entry(c.op).or_default();
        e.0 += 1;
        e.1 += usize::from(c.failure.is_some());
        e.2 = e.2.max(c.took);
    }
    println!("{name}: (calls, failed, slowest) by operation: {by_op:?}");
    let failed: Vec<&Call> = calls.iter().filter(|c| c.failure.is_some()).collect();
    for c in &failed {
        println!(
            "  {name}: {} at {:?} (took {:?}): {}",
            c.op,
            c.at,
            c.took,
            c.failure.as_deref().unwrap_or("")
        );
    }
    failed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_node_killed_every_call_a_quorum_can_serve_succeeds() {
    let _serial = SERIAL.lock().await;
    keyspace().await;
    heal().await;
    let victim = nodes()[2];
    let calls = run_through("kill", victim).await;
    heal().await;
    let failed = summary("one node killed", &calls);
    for op in [
        "read_all",
        "read_row",
        "insert_row",
        "update_row",
        "update_i_am_alive",
    ] {
        assert!(
            calls.iter().filter(|c| c.op == op).count() >= 5,
            "{op} ran throughout the stretch"
        );
    }
    let refusals: Vec<_> = failed.iter().filter(|c| refused(c)).collect();
    assert!(
        refusals.is_empty(),
        "{} calls failed Unavailable / with a pool error while a quorum was up: {refusals:#?}",
        refusals.len()
    );
    let unexplained: Vec<_> = failed
        .iter()
        .filter(|c| !raced(c) && !honest_before_conviction(c))
        .collect();
    assert!(
        unexplained.is_empty(),
        "{} calls failed while a quorum was up: {unexplained:#?}",
        unexplained.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_node_paused_reads_and_heartbeats_succeed_and_writes_answer_honestly() {
    let _serial = SERIAL.lock().await;
    keyspace().await;
    heal().await;
    let victim = nodes()[2];
    let calls = run_through("pause", victim).await;
    node("resume", victim);
    heal().await;
    let failed = summary("one node paused", &calls);
    let bound = crate::REQUEST_TIMEOUT * 8 + Duration::from_secs(2);
    for c in &calls {
        assert!(
            c.took <= bound,
            "{} took {:?} (bound {bound:?})",
            c.op,
            c.took
        );
    }
    // A table value connecting with the paused node among its contact points: the driver opens
    // a pool to every node it learns of and waits for each to finish its handshake, which the
    // paused node never answers — `connect` fails `Unavailable` within `connect_timeout` (5 s).
    // The contract promises that bound and that error, not a session.
    for c in calls.iter().filter(|c| c.op == "connect") {
        if let Some(f) = &c.failure {
            assert!(f.starts_with("Unavailable"), "connect: {f}");
            assert!(
                c.took <= Duration::from_secs(7),
                "connect took {:?}",
                c.took
            );
        }
    }
    let refusals: Vec<_> = failed
        .iter()
        .filter(|c| c.op != "connect" && refused(c))
        .collect();
    assert!(
        refusals.is_empty(),
        "{} calls failed Unavailable / with a pool error with one node paused: {refusals:#?}",
        refusals.len()
    );
    for c in failed
        .iter()
        .filter(|c| c.op != "connect" && !raced(c) && !raced_read(c))
    {
        let f = c.failure.as_deref().unwrap_or("");
        // The paused node holds whatever it was sent: a conditional write it coordinates may
        // apply when it resumes, so it is never sent elsewhere; the provider fences it off
        // (`false`: it never applies) or cannot tell (`OutcomeUnknown`). Heartbeats and reads
        // no one races never fail: unanswered, they are also sent to the next node.
        let ambiguous_write = matches!(
            c.op,
            "insert_row" | "update_row" | "insert_row (new table value)" | "write (contended)"
        ) && (f.starts_with("OutcomeUnknown")
            || f.starts_with("answered false"));
        assert!(ambiguous_write, "{} failed with one node paused: {f}", c.op);
    }
}

/// Membership options of the runtime test: the shortest periods of the field soak that found the fault.
fn short_periods() -> cassandra_membership::MembershipOptions {
    let mut m = crate::fast_membership();
    m.num_missed_table_i_am_alive_limit = 3;
    // The lease must outlast the window before gossip convicts the dead node (~19 s, more on two
    // loaded cores), in which a renewal's Paxos round may time out: `refresh_by` is TTL after
    // the last renewal (docs::guarantees). With 20 s, one loaded run fenced all four silos.
    m.defunct_silo_expiration = Duration::from_secs(60);
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn silos_on_the_ring_survive_a_node_kill_and_restart() {
    let _serial = SERIAL.lock().await;
    // The runtime's warnings (failed heartbeats and renewals) explain a failure.
    let _ = tracing_subscriber::fmt()
        .with_env_filter("cassandra_membership=warn")
        .with_timer(tracing_subscriber::fmt::time::uptime())
        .try_init();
    keyspace().await;
    heal().await;
    let victim = nodes()[2];
    let cluster = unique("silos");
    // A table of its own: the other tests' table carries no TTL, which a silo with expiry on
    // refuses (`TtlMismatch`).
    let table = unique("ttl").replace('-', "_");
    let mut silos = Vec::new();
    for k in 0..4u16 {
        let o = options(&cluster)
            .table(table.clone())
            .contact_points(dead_first(victim))
            .ttl(true)
            .membership(short_periods());
        let t = CassandraMembershipTable::connect(o).await.expect("connect");
        silos.push(Silo::join(Arc::new(t), silo(50, k)).await.expect("join"));
    }
    // Every health a silo shows, recorded as it changes.
    let seen: Arc<std::sync::Mutex<Vec<(SiloAddress, Duration, SiloHealth)>>> = Arc::default();
    let t0 = Instant::now();
    let mut watchers = Vec::new();
    for s in &silos {
        let (mut rx, address, seen) = (s.health(), s.address(), seen.clone());
        watchers.push(tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let h = rx.borrow_and_update().clone();
                seen.lock().unwrap().push((address, t0.elapsed(), h));
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    node("kill", victim);
    let killed = t0.elapsed();
    tokio::time::sleep(Duration::from_secs(30)).await;
    node("restart", victim);
    tokio::time::sleep(Duration::from_secs(15)).await;
    let observer = CassandraMembershipTable::connect(
        options(&cluster)
            .table(table)
            .ttl(true)
            .membership(short_periods()),
    )
    .await
    .expect("observer");
    let snapshot = observer.read_all().await.expect("read after the restart");
    for w in &watchers {
        w.abort();
    }
    let seen = seen.lock().unwrap().clone();
    println!("node killed at {killed:?}; health changes: {seen:#?}");
    let bad: Vec<_> = seen
        .iter()
        .filter(|(_, _, h)| !h.should_serve() && !matches!(h, SiloHealth::Starting))
        .collect();
    for s in &silos {
        let row = snapshot.get(&s.address()).expect("the silo's row");
        assert_eq!(
            row.entry.status,
            SiloStatus::Active,
            "{} is Active",
            s.address()
        );
    }
    assert!(
        bad.is_empty(),
        "silos stopped serving through one node's death: {bad:#?}"
    );
    for s in silos {
        s.leave().await.expect("leave");
    }
    let _ = KEYSPACE;
}

//! Faults between nodes and clocks: partitions (a minority cut off, a bridge, a one-way cut, a
//! node paused while partitioned), loss on one node's links, and a node whose clock is ahead or
//! behind — each with the table workload's history checked for linearizability and, where it
//! says so, silos joining, heartbeating, voting and leaving through it.
//!
//! The rules are iptables rules on the internode port (7000) between the nodes' loopback
//! addresses, so every node stays reachable by the clients on 9042. They only ever run inside a
//! network namespace that `scripts/nemesis.sh` created for the run (it exports its name as
//! `CM_NEMESIS_NETNS`, and every rule is refused elsewhere): the namespace has its own loopback
//! and its own rules, and both vanish with it. Clocks: the node is restarted under libfaketime
//! (`CASSANDRA_FAKETIME` of `scripts/cassandra.sh`).

mod schema_race;

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cassandra_membership::conformance::history::History;
use cassandra_membership::conformance::workload::{self, WorkloadReport};
use cassandra_membership::{CassandraMembershipTable, Silo, SiloAddress, SiloHealth, SiloStatus};

use crate::{
    REQUEST_TIMEOUT, SERIAL, checked, final_read, heal, keyspace, node, nodes, options, unique,
    workload_options,
};

/// The namespace this run may change, checked against the one this process is in: the named
/// namespace scripts/nemesis.sh created and exported (never the host's, which has no name). Every nemesis test calls it before it touches a rule or a node.
fn netns() -> String {
    let expected = std::env::var("CM_NEMESIS_NETNS")
        .ok()
        .filter(|n| n.starts_with("cm-nemesis-"))
        .unwrap_or_else(|| {
            panic!(
                "the nemesis tests change iptables rules and restart nodes: they run only inside \
                 the network namespace scripts/nemesis.sh creates (CM_NEMESIS_NETNS is not set)"
            )
        });
    // The namespace file scripts/nemesis.sh made is the one this process is in (its inode is
    // the namespace's), so no rule lands in the host's.
    use std::os::unix::fs::MetadataExt as _;
    let own = std::fs::read_link("/proc/self/ns/net").expect("this process's namespace");
    let named = std::fs::metadata(format!("/run/netns/{expected}"))
        .unwrap_or_else(|e| panic!("no namespace {expected:?}: {e}"))
        .ino();
    assert_eq!(
        own.to_string_lossy(),
        format!("net:[{named}]"),
        "this process is not in the namespace {expected:?}"
    );
    let out = Command::new("ip")
        .args(["netns", "identify"])
        .output()
        .expect("run `ip netns identify`");
    let actual = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert_eq!(
        actual, expected,
        "this process is not in the namespace {expected:?} (it is in {actual:?}): no rule is added outside it"
    );
    expected
}

/// The group id node `i` runs with (`CASSANDRA_NODE_GIDS` of scripts/cassandra.sh): on loopback
/// every internode connection leaves from 127.0.0.1, so a node's own packets are told apart by
/// their owner, not their source address.
fn gid(i: u32) -> String {
    (4000 + i).to_string()
}

/// The iptables rules (and the slow link's queueing discipline) of one scenario, removed when it
/// ends, also when it fails.
struct Net;

impl Net {
    fn new() -> Net {
        netns();
        Net::flush();
        Net
    }

    fn iptables(args: &[&str]) {
        let status = Command::new("iptables")
            .arg("-w")
            .args(args)
            .status()
            .expect("run iptables (scripts/nemesis.sh installs it)");
        assert!(status.success(), "iptables {args:?} failed");
    }

    fn tc(args: &[&str]) {
        let status = Command::new("tc")
            .args(args)
            .status()
            .expect("run tc (iproute2)");
        assert!(status.success(), "tc {args:?} failed");
    }

    /// Removes every rule; quietly, as it also runs while a failed test unwinds.
    fn flush() {
        for args in [
            &["-w", "-F", "OUTPUT"][..],
            &["-w", "-t", "mangle", "-F", "OUTPUT"][..],
        ] {
            let _ = Command::new("iptables").args(args).status();
        }
        let _ = Command::new("tc")
            .args(["qdisc", "del", "dev", "lo", "root"])
            .stderr(std::process::Stdio::null())
            .status();
    }

    fn addr(i: u32) -> String {
        format!("127.0.0.{i}")
    }

    /// Node `from`'s internode messages no longer reach `to` (everything its sockets send to
    /// `to`:7000 is dropped); `to`'s messages reach `from`.
    fn cut_one_way(&self, from: u32, to: u32) {
        let (g, t) = (gid(from), Net::addr(to));
        Net::iptables(&[
            "-A",
            "OUTPUT",
            "-m",
            "owner",
            "--gid-owner",
            &g,
            "-d",
            &t,
            "-p",
            "tcp",
            "--dport",
            "7000",
            "-j",
            "DROP",
        ]);
    }

    /// No internode messages between `a` and `b`, either way.
    fn cut(&self, a: u32, b: u32) {
        self.cut_one_way(a, b);
        self.cut_one_way(b, a);
    }

    /// Drops `percent` of node `i`'s internode messages and of those sent to it.
    fn loss(&self, i: u32, percent: u32) {
        let p = format!("{:.2}", f64::from(percent) / 100.0);
        let (g, a) = (gid(i), Net::addr(i));
        let stat = [
            "-m",
            "statistic",
            "--mode",
            "random",
            "--probability",
            &p,
            "-j",
            "DROP",
        ];
        let own = [
            "-A",
            "OUTPUT",
            "-m",
            "owner",
            "--gid-owner",
            &g,
            "-p",
            "tcp",
            "--dport",
            "7000",
        ];
        let to = ["-A", "OUTPUT", "-d", &a, "-p", "tcp", "--dport", "7000"];
        Net::iptables(&[&own[..], &stat[..]].concat());
        Net::iptables(&[&to[..], &stat[..]].concat());
    }

    /// Node `i`'s internode messages and those sent to it limited to `kbit` kbit/s (an HTB
    /// class; this kernel has neither `netem` for a fixed delay nor the `fw` classifier): they
    /// queue behind each other and arrive late. Its packets are marked (DSCP 10) by owner and
    /// destination, and the class takes what carries the mark.
    fn slow(&self, i: u32, kbit: u32) {
        let (g, a) = (gid(i), Net::addr(i));
        let mark = ["-j", "DSCP", "--set-dscp", "10"];
        let own = [
            "-t",
            "mangle",
            "-A",
            "OUTPUT",
            "-m",
            "owner",
            "--gid-owner",
            &g,
            "-p",
            "tcp",
            "--dport",
            "7000",
        ];
        let to = [
            "-t", "mangle", "-A", "OUTPUT", "-d", &a, "-p", "tcp", "--dport", "7000",
        ];
        Net::iptables(&[&own[..], &mark[..]].concat());
        Net::iptables(&[&to[..], &mark[..]].concat());
        let rate = format!("{kbit}kbit");
        Net::tc(&[
            "qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "10", "r2q",
            "1000",
        ]);
        Net::tc(&[
            "class", "add", "dev", "lo", "parent", "1:", "classid", "1:10", "htb", "rate", "10gbit",
        ]);
        Net::tc(&[
            "class", "add", "dev", "lo", "parent", "1:", "classid", "1:20", "htb", "rate", &rate,
            "ceil", &rate,
        ]);
        // DSCP 10 is TOS 0x28.
        Net::tc(&[
            "filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio", "1", "u32",
            "match", "ip", "tos", "0x28", "0xfc", "flowid", "1:20",
        ]);
    }

    /// Packets the rules of `table` dropped or marked so far: proof the fault met traffic.
    fn hits(&self, table: &str) -> u64 {
        let out = Command::new("iptables")
            .args(["-w", "-t", table, "-L", "OUTPUT", "-v", "-x", "-n"])
            .output()
            .expect("iptables -L");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .skip(2)
            .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    }

    /// Removes the fault, first asserting that it met traffic (a rule that matches nothing
    /// would make the scenario a run without a fault).
    fn heal(&self, name: &str) {
        let hits = self.hits("filter") + self.hits("mangle");
        println!("{name}: the fault's rules met {hits} packets");
        assert!(hits > 0, "{name}: the fault's rules met no packet");
        Net::flush();
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        Net::flush();
    }
}

/// The errors a caller can act on; anything else is a wrong answer.
fn actionable(report: &WorkloadReport, name: &str) {
    for f in &report.failures {
        assert!(
            matches!(
                f.kind.as_str(),
                "Timeout" | "OutcomeUnknown" | "Unavailable" | "Contention"
            ),
            "{name}: an error a caller cannot act on: {f:?}"
        );
    }
    // The guide's bound (docs::guarantees, "Bounded time"), as for a paused node.
    let bound = REQUEST_TIMEOUT * 8 + Duration::from_secs(2);
    assert!(
        report.slowest <= bound,
        "{name}: a call took {:?} (bound {bound:?})",
        report.slowest
    );
}

/// Writes applied while the fault held (from `from` to `to` since the workload started).
fn applied_between(report: &WorkloadReport, from: Duration, to: Duration) -> usize {
    report
        .applied_at
        .iter()
        .filter(|t| **t >= from && **t < to)
        .count()
}

/// Runs the table workload for `total`, with `fault` applied at 5 s and `unfault` after
/// `fault_for` (`rules`: the fault is rules of `Net`, which must meet packets); heals, reads once
/// more, checks the history. Returns the report.
async fn scenario(
    name: &str,
    total: Duration,
    fault_for: Duration,
    rules: bool,
    fault: impl FnOnce(&Net),
    unfault: impl FnOnce(&Net),
) -> WorkloadReport {
    let net = Net::new();
    keyspace().await;
    heal().await;
    let cluster = unique(name);
    let tables = initialized_clients(&cluster).await;
    let history = Arc::new(History::new());
    let until = Instant::now() + total;
    let run = tokio::spawn(workload::run(
        tables.clone(),
        history.clone(),
        workload_options(),
        until,
    ));
    tokio::time::sleep(Duration::from_secs(5)).await;
    fault(&net);
    tokio::time::sleep(fault_for).await;
    unfault(&net);
    if rules {
        net.heal(name);
    }
    let report = run.await.expect("workload");
    heal().await;
    final_read(&history, &tables[0]).await;
    actionable(&report, name);
    checked(name, &history, &report);
    report
}

/// Three table values of a fresh cluster, initialized — retried (at most 5 times) while the
/// faults of the previous scenario still echo (a restarted node, a busy ring): `initialize` is
/// idempotent, and an unknown outcome is settled by the next attempt.
async fn initialized_clients(
    cluster: &str,
) -> Vec<std::sync::Arc<dyn cassandra_membership::MembershipTable>> {
    let mut tables = Vec::new();
    for _ in 0..3 {
        // A node restarted a moment ago (under libfaketime, on a loaded machine) may accept a
        // connection and answer only seconds later: `connect` says Unavailable, and is asked again.
        let mut attempt = 1;
        let t = loop {
            match CassandraMembershipTable::connect(options(cluster)).await {
                Ok(t) => break t,
                Err(e) if attempt < 5 && e.is_transient() => {
                    println!("connect, attempt {attempt}: {e}; again");
                    attempt += 1;
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                Err(e) => panic!("connect: {e:?}"),
            }
        };
        tables.push(Arc::new(t) as Arc<dyn cassandra_membership::MembershipTable>);
    }
    for attempt in 1..=5 {
        match tables[0].initialize(true).await {
            Ok(()) => return tables,
            Err(e) if attempt < 5 && (e.is_transient() || e.is_outcome_unknown()) => {
                println!("initialize, attempt {attempt}: {e}; again");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Err(e) => panic!("initialize: {e:?}"),
        }
    }
    unreachable!()
}

/// Silos joined through their own connections.
async fn silos(cluster: &str, n: u16, ttl: bool) -> Vec<Silo> {
    let mut m = crate::fast_membership();
    // Detection within ~10 s (a 2 s period, 5 missed): fast enough for the run, slow enough that
    // three JVMs, the workload and the checker on two cores do not make a silo miss it.
    m.i_am_alive_table_publish_timeout = Duration::from_secs(2);
    m.num_missed_table_i_am_alive_limit = 5;
    m.num_votes_for_death_declaration = 2;
    let mut out = Vec::new();
    for k in 0..n {
        let mut o = options(cluster).membership(m.clone());
        if ttl {
            let mut m = m.clone();
            m.defunct_silo_expiration = Duration::from_secs(60);
            o = o.ttl(true).table("membership_ttl60").membership(m);
            o.ttl_renewal_interval = Some(Duration::from_secs(5));
        }
        let t = CassandraMembershipTable::connect(o).await.expect("connect");
        let address =
            SiloAddress::new(std::net::SocketAddr::from(([10, 8, 0, 1], 41_000 + k)), 1).unwrap();
        out.push(
            Silo::join(Arc::new(t), address)
                .await
                .expect("a silo joins"),
        );
    }
    out
}

/// Every silo's own entry is Active and none was told it is dead or missing.
async fn all_active(name: &str, silos: &[Silo]) {
    for s in silos {
        let h = s.health().borrow().clone();
        assert!(!h.is_final(), "{name}: silo {} is {h:?}", s.address());
        assert_eq!(
            s.entry_status().await.expect("the own entry reads"),
            Some(SiloStatus::Active),
            "{name}: silo {}",
            s.address()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_minority_node_cut_off_keeps_the_majority_going_and_the_silos_members() {
    let _serial = SERIAL.lock().await;
    let [a, b, c] = nodes()[..] else {
        unreachable!()
    };
    keyspace().await;
    heal().await;
    // Silos heartbeat through the fault: cut off from one node only, none may be declared dead.
    let silo_cluster = unique("split-silos");
    let joined = silos(&silo_cluster, 3, false).await;
    let fault_for = Duration::from_secs(25);
    let report = scenario(
        "minority cut off (1 | 2)",
        Duration::from_secs(45),
        fault_for,
        true,
        |net| {
            net.cut(a, b);
            net.cut(a, c);
        },
        |_| {},
    )
    .await;
    // The majority side serves: writes applied while the cut held (after 5 s to notice).
    let during = applied_between(&report, Duration::from_secs(10), Duration::from_secs(30));
    assert!(
        during > 0,
        "the majority made progress during the cut: {report:?}"
    );
    all_active("minority cut off", &joined).await;
    for s in joined {
        s.leave().await.expect("a silo leaves after the cut healed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bridge_node_seeing_both_sides_keeps_every_quorum() {
    let _serial = SERIAL.lock().await;
    let [a, _, c] = nodes()[..] else {
        unreachable!()
    };
    let report = scenario(
        "bridge (1 and 3 apart, 2 sees both)",
        Duration::from_secs(40),
        Duration::from_secs(25),
        true,
        |net| net.cut(a, c),
        |_| {},
    )
    .await;
    let during = applied_between(&report, Duration::from_secs(10), Duration::from_secs(30));
    assert!(during > 0, "progress through the bridge: {report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_one_way_cut_gives_honest_answers() {
    let _serial = SERIAL.lock().await;
    let [a, b, c] = nodes()[..] else {
        unreachable!()
    };
    let report = scenario(
        "one-way cut (1's messages lost)",
        Duration::from_secs(40),
        Duration::from_secs(25),
        true,
        |net| {
            net.cut_one_way(a, b);
            net.cut_one_way(a, c);
        },
        |_| {},
    )
    .await;
    let during = applied_between(&report, Duration::from_secs(10), Duration::from_secs(30));
    assert!(during > 0, "nodes 2 and 3 serve during the cut: {report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_paused_while_another_is_cut_off_loses_every_quorum_and_nothing_else() {
    let _serial = SERIAL.lock().await;
    let [a, b, c] = nodes()[..] else {
        unreachable!()
    };
    let report = scenario(
        "paused while partitioned (1 | 2, 3 paused)",
        Duration::from_secs(50),
        Duration::from_secs(20),
        true,
        |net| {
            net.cut(a, b);
            net.cut(a, c);
            node("pause", c);
        },
        |_| node("resume", c),
    )
    .await;
    // No side had a quorum from the pause to the heal; the workload made progress again after.
    let after = applied_between(&report, Duration::from_secs(35), Duration::from_secs(50));
    assert!(after > 0, "progress once healed: {report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn loss_on_one_nodes_links_slows_but_never_misleads() {
    let _serial = SERIAL.lock().await;
    let c = nodes()[2];
    let report = scenario(
        "20 % loss on node 3's links",
        Duration::from_secs(40),
        Duration::from_secs(25),
        true,
        |net| net.loss(c, 20),
        |_| {},
    )
    .await;
    let during = applied_between(&report, Duration::from_secs(5), Duration::from_secs(30));
    assert!(during > 0, "progress through the loss: {report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_link_on_one_node_delays_but_never_misleads() {
    let _serial = SERIAL.lock().await;
    let c = nodes()[2];
    let report = scenario(
        "node 3's links at 200 kbit/s",
        Duration::from_secs(40),
        Duration::from_secs(25),
        true,
        |net| net.slow(c, 200),
        |_| {},
    )
    .await;
    let during = applied_between(&report, Duration::from_secs(5), Duration::from_secs(30));
    assert!(during > 0, "progress through the slow link: {report:?}");
}

/// Restarts node `i` with its clock `skew` ("+8s", "-8s") off, or back on the true clock.
fn restart_with_clock(i: u32, skew: Option<&str>) {
    node("kill", i);
    // The restart reuses a node that still answers: wait until the killed one is gone.
    let deadline = Instant::now() + Duration::from_secs(60);
    while crate::cql_up(i) {
        assert!(
            Instant::now() < deadline,
            "node {i} still answers 60 s after SIGKILL"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/cassandra.sh");
    let mut c = Command::new("bash");
    c.arg(script).args(["restart", &i.to_string()]);
    match skew {
        // Under libfaketime the JVM starts several times slower; on a loaded machine that has
        // passed the usual 240 s.
        Some(s) => c
            .env("CASSANDRA_FAKETIME", s)
            .env("CASSANDRA_START_TIMEOUT", "600"),
        None => c.env_remove("CASSANDRA_FAKETIME"),
    };
    let status = c.status().expect("run scripts/cassandra.sh");
    assert!(status.success(), "restart node {i} (clock {skew:?}) failed");
}

/// How far node `i`'s clock is from this process's: its `now()`, asked of it alone, minus the
/// middle of the round trip (milliseconds).
async fn clock_offset(i: u32) -> i64 {
    use scylla::client::execution_profile::ExecutionProfile;
    use scylla::policies::load_balancing::{NodeIdentifier, SingleTargetLoadBalancingPolicy};
    use scylla::statement::unprepared::Statement;

    let s = crate::session().await;
    let target = SingleTargetLoadBalancingPolicy::new(
        NodeIdentifier::NodeAddress(format!("127.0.0.{i}:9042").parse().unwrap()),
        None,
    );
    let profile = ExecutionProfile::builder()
        .load_balancing_policy(target)
        .build()
        .into_handle();
    let mut q = Statement::new("SELECT toUnixTimestamp(now()) FROM system.local");
    q.set_execution_profile_handle(Some(profile));
    let before = cassandra_membership::Timestamp::now().as_millis();
    let (theirs,): (i64,) = s
        .query_unpaged(q, ())
        .await
        .expect("the node's clock")
        .into_rows_result()
        .expect("rows")
        .first_row()
        .expect("one row");
    let after = cassandra_membership::Timestamp::now().as_millis();
    theirs - (before + after) / 2
}

/// Puts node `i` back on the true clock when dropped (also when the scenario fails).
struct TrueClock(u32);

impl Drop for TrueClock {
    fn drop(&mut self) {
        restart_with_clock(self.0, None);
    }
}

/// Silos with storage-side expiry (TTL 60 s, renewal every 5 s) and the table workload run while
/// node 3's clock is off by `skew`, more than the renewal interval and less than the nodes'
/// internode timeouts (10 s: past them a node drops its peers' messages as expired, or they drop
/// its own — a deaf or mute node rather than a skewed one). Cells it writes as coordinator
/// expire `skew` off true time, and reads it coordinates judge expiry on its clock. No silo may
/// lose its entry or be declared dead, the table history stays linearizable, and once the clock
/// is true again every silo is Healthy. `serving`: every silo also keeps serving through it.
async fn clock_off(name: &str, skew: &str, serving: bool) {
    netns();
    let c = nodes()[2];
    keyspace().await;
    heal().await;
    // Joined on true clocks: a join *during* a skew beyond the renewal interval may be refused
    // with `TtlMismatch` (measured; docs::expiry, "Whose clock decides").
    let silo_cluster = unique("clock-silos");
    let joined = silos(&silo_cluster, 3, true).await;
    restart_with_clock(c, Some(skew));
    let restore = TrueClock(c);
    heal().await;
    // The fault is real: the node's own clock (its `now()`) is off by the skew.
    let off = clock_offset(c).await;
    let want: i64 = skew
        .trim_end_matches('s')
        .parse::<i64>()
        .expect("a skew in seconds")
        * 1000;
    assert!(
        (off - want).abs() < 3_000,
        "{name}: node {c}'s clock is {off} ms off, not {want} ms"
    );
    println!("{name}: node {c}'s clock is {off} ms off");
    scenario(
        name,
        Duration::from_secs(35),
        Duration::from_secs(1),
        false,
        |_| {},
        |_| {},
    )
    .await;
    for s in &joined {
        let h = s.health().borrow().clone();
        println!("{name}: silo {} at the end of the skew: {h:?}", s.address());
        assert!(!h.is_final(), "{name}: silo {} is {h:?}", s.address());
        if serving {
            assert!(h.should_serve(), "{name}: silo {} is {h:?}", s.address());
        }
    }
    drop(restore);
    heal().await;
    for s in &joined {
        let mut health = s.health();
        let healthy = tokio::time::timeout(
            Duration::from_secs(60),
            health.wait_for(|h| matches!(h, SiloHealth::Healthy { .. }) || h.is_final()),
        )
        .await;
        let h = s.health().borrow().clone();
        assert!(
            matches!(healthy, Ok(Ok(_))) && matches!(h, SiloHealth::Healthy { .. }),
            "{name}: silo {} is Healthy again once the clock is true: {h:?}",
            s.address()
        );
    }
    all_active(name, &joined).await;
    for s in joined {
        s.leave().await.expect("a silo leaves");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_whose_clock_runs_ahead_expires_no_live_entry() {
    let _serial = SERIAL.lock().await;
    clock_off("clock 8 s ahead on node 3", "+8s", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_whose_clock_runs_behind_loses_no_write() {
    let _serial = SERIAL.lock().await;
    clock_off("clock 8 s behind on node 3", "-8s", true).await;
}

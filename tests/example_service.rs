//! examples/service as a process: it answers its probes and its work while it serves, leaves
//! the cluster on SIGTERM and exits 0 (a stalled client cannot hold that up); it answers its
//! probes while it starts, and a signal then still ends in a leave and exit 0; it exits 1 once
//! the cluster declares it dead; and the Kubernetes probe snippet in its docs names the paths it
//! serves; an unspecified listen address without an advertised one exits 2 naming the flag and
//! the variables; and three of them on the real node (each with its own advertised address and
//! an options file) list each other in `/members`, and one SIGTERMed leaves within its bound
//! and shows Dead in the others' `/members`. Every wait is bounded, and the child is killed if
//! the test fails. The tests on Cassandra use the node `CASSANDRA_CONTACT_POINTS` names first
//! (default 127.0.0.1:9042).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cassandra_membership::runtime::protocol;
use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, MembershipTable, SiloAddress, SiloStatus,
    Timestamp,
};

/// The example's source: its module docs hold the probe snippet.
const SOURCE: &str = include_str!("../examples/service/main.rs");

/// How long any one step may take (a cold build of the example takes longer: see `build`).
const STEP: Duration = Duration::from_secs(60);

/// The child, killed when dropped (a failed assertion must not leave it running).
struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Running {
    /// The next line the example prints that starts with `prefix` (earlier lines are skipped).
    fn line_starting(&self, prefix: &str) -> String {
        loop {
            match self.lines.recv_timeout(STEP) {
                Ok(line) if line.starts_with(prefix) => return line,
                Ok(_) => {}
                Err(e) => panic!("no line starting with {prefix:?} within {STEP:?}: {e}"),
            }
        }
    }

    /// The exit status, once it exited within `within` (panics otherwise).
    fn exit_within(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "still running after {within:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn terminate(&self) {
        let pid = self.child.id().to_string();
        let kill = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(kill.success());
    }
}

/// Builds the example (as `cargo build --example service` does) and returns its binary.
fn build() -> PathBuf {
    let status = Command::new(env!("CARGO"))
        .args(["build", "--quiet", "--example", "service"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("cargo runs");
    assert!(status.success(), "cargo build --example service: {status}");
    // This test runs from target/<profile>/deps; the example is in target/<profile>/examples.
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let bin = profile_dir
        .join("examples")
        .join(format!("service{}", std::env::consts::EXE_SUFFIX));
    assert!(bin.exists(), "{} not built", bin.display());
    bin
}

fn start(bin: &PathBuf) -> Running {
    start_with(bin, &["--cluster", "example-test"])
}

/// The example listening on a free port, with `args`.
fn start_with(bin: &PathBuf, args: &[&str]) -> Running {
    let mut all = vec!["--listen", "127.0.0.1:0"];
    all.extend_from_slice(args);
    spawn(bin, &all, &[])
}

/// The example with `args` and, of its variables, only `env` (none inherited from the test's
/// environment).
fn spawn(bin: &PathBuf, args: &[&str], env: &[(&str, &str)]) -> Running {
    let mut command = Command::new(bin);
    for name in [
        "POD_IP",
        "SERVICE_ADVERTISE",
        "SERVICE_LISTEN",
        "SERVICE_CONFIG",
    ] {
        command.env_remove(name);
    }
    let mut child = command
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the example starts");
    let stdout = child.stdout.take().unwrap();
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            println!("service: {line}");
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    Running { child, lines }
}

/// `GET path` on `at`: the status code and the body.
fn get(at: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect_timeout(&at, STEP).expect("connects");
    stream.set_read_timeout(Some(STEP)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {at}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("a response");
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// The `path:` values of the YAML snippet in the example's module docs.
fn probe_paths() -> Vec<(String, String)> {
    let docs: Vec<&str> = SOURCE
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .map(str::trim_start)
        .collect();
    let mut probes = Vec::new();
    let mut probe = None;
    for line in docs {
        if let Some(name) = line.strip_suffix(':').filter(|n| n.ends_with("Probe")) {
            probe = Some(name.to_owned());
        }
        if let (Some(p), Some(path)) = (&probe, line.strip_prefix("path: ")) {
            probes.push((p.clone(), path.trim().to_owned()));
        }
    }
    probes
}

#[test]
fn the_docs_probe_snippet_names_startup_readiness_and_liveness() {
    assert_eq!(
        probe_paths(),
        [
            ("startupProbe".to_owned(), "/livez".to_owned()),
            ("readinessProbe".to_owned(), "/readyz".to_owned()),
            ("livenessProbe".to_owned(), "/livez".to_owned())
        ]
    );
}

#[test]
fn the_service_answers_its_probes_and_work_then_leaves_on_sigterm() {
    let bin = build();
    let mut service = start(&bin);
    // It listens (its probes say `starting`), then joins.
    let line = service.line_starting("listening on http://");
    let at: SocketAddr = line["listening on http://".len()..].parse().unwrap();
    let joined = service.line_starting("joined as ");
    let silo = joined["joined as ".len()..].to_owned();

    // The snippet's probes are served, and answer 200 while the silo serves.
    for (probe, path) in probe_paths() {
        let (status, body) = get(at, &path);
        assert_eq!(status, 200, "{probe} {path}: {body}");
    }
    let (status, body) = get(at, "/work");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body.trim(), format!("done by {silo}"));
    let members = members(at);
    assert_eq!(
        status_in(&members, &silo).as_deref(),
        Some("Active"),
        "{members}"
    );
    assert_eq!(members["stale"], serde_json::Value::Null, "{members}");
    assert!(
        members["version"].as_u64().is_some_and(|v| v > 0),
        "{members}"
    );
    assert_eq!(get(at, "/nowhere").0, 404, "only the documented routes");

    let pid = service.child.id().to_string();
    let kill = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(kill.success());
    service.line_starting("SIGTERM: leaving the cluster");
    let left = service.line_starting("left: ");
    assert_eq!(left, format!("left: entry of {silo} is Some(Dead)"));
    let status = service.exit_within(STEP);
    assert!(status.success(), "exit status {status}");
    assert!(
        TcpStream::connect_timeout(&at, Duration::from_secs(1)).is_err(),
        "no longer listening"
    );
}

/// One client that sent half a request must not hold axum's graceful shutdown (which has no
/// bound), and so the leave, until Kubernetes' SIGKILL: the leave starts at once, and the drain
/// ends after 10 s with the client still stalled. In-memory table.
#[test]
fn a_stalled_client_does_not_hold_up_the_leave_or_the_exit_after_sigterm() {
    let bin = build();
    let mut service = start_with(&bin, &["--cluster", "example-stall"]);
    let line = service.line_starting("listening on http://");
    let at: SocketAddr = line["listening on http://".len()..].parse().unwrap();
    let joined = service.line_starting("joined as ");
    let silo = joined["joined as ".len()..].to_owned();
    // A line a person reads (`ready: healthy, lease …`), not the health's Debug form.
    let (status, ready) = get(at, "/readyz");
    assert_eq!(status, 200);
    let ready = ready.trim();
    assert!(
        ready.starts_with("ready: ") && !ready.contains(['{', '(']),
        "{ready}"
    );
    // Half a request, then silence (the connection stays open until the end of the test).
    let mut stalled = TcpStream::connect(at).unwrap();
    stalled
        .write_all(b"GET /work HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let signalled = Instant::now();
    service.terminate();
    service.line_starting("SIGTERM: leaving the cluster");
    // The leave ran while the drain waited.
    let left = service.line_starting("left: ");
    assert_eq!(left, format!("left: entry of {silo} is Some(Dead)"));
    assert!(
        signalled.elapsed() < Duration::from_secs(5),
        "left {:?} after SIGTERM",
        signalled.elapsed()
    );
    service.line_starting("drain: connections still open after 10s");
    let status = service.exit_within(Duration::from_secs(20));
    let took = signalled.elapsed();
    assert!(status.success(), "exit status {status}");
    assert!(
        took < Duration::from_secs(15),
        "exited {took:?} after SIGTERM (the drain's bound is 10 s)"
    );
    drop(stalled);
}

/// The probes are answered during the start (unanswered, a slow join would restart the pod) and
/// SIGTERM then exits cleanly. Here the storage never answers (a listener that
/// accepts nothing): the probes say `starting` — readiness 503, liveness 200, work refused —
/// and SIGTERM exits 0.
#[test]
fn while_it_starts_it_answers_its_probes_and_a_signal_exits_0() {
    let bin = build();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let contact = silent.local_addr().unwrap().to_string();
    let mut service = start_with(
        &bin,
        &["--cluster", "example-starting", "--cassandra", &contact],
    );
    let line = service.line_starting("listening on http://");
    let at: SocketAddr = line["listening on http://".len()..].parse().unwrap();
    service.line_starting("storage: ");
    let (status, body) = get(at, "/readyz");
    assert_eq!((status, body.trim()), (503, "not ready: starting"));
    let (status, body) = get(at, "/livez");
    assert_eq!((status, body.trim()), (200, "live: starting"));
    assert_eq!(get(at, "/work").0, 503, "no work before the join");
    assert_eq!(get(at, "/members").0, 503, "no view before the join");
    service.terminate();
    service.line_starting("SIGTERM while connecting");
    let status = service.exit_within(STEP);
    assert!(status.success(), "exit status {status}");
    drop(silent);
}

/// The test node: the first of `CASSANDRA_CONTACT_POINTS`, or 127.0.0.1:9042.
fn contact() -> String {
    std::env::var("CASSANDRA_CONTACT_POINTS")
        .ok()
        .and_then(|c| c.split(',').next().map(|c| c.trim().to_owned()))
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "127.0.0.1:9042".into())
}

fn cassandra_options(cluster: &str) -> CassandraClusteringOptions {
    CassandraClusteringOptions::default()
        .keyspace("cm_service")
        .service_id("service-demo")
        .cluster_id(cluster)
        .contact_points([contact()])
        .create_keyspace_simple(1)
}

/// The stored status of `silo`'s entry on the real node.
fn stored_status(cluster: &str, silo: &SiloAddress) -> Option<SiloStatus> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let table = CassandraMembershipTable::connect(cassandra_options(cluster))
            .await
            .expect("the Cassandra node of CASSANDRA_CONTACT_POINTS");
        let rows = table.read_row(silo).await.unwrap();
        let status = rows.get(silo).map(|r| r.entry.status);
        table.delete_cluster(cluster).await.unwrap();
        status
    })
}

/// SIGTERM before `Silo::join` returned must not kill the process without a leave. On the real
/// node, SIGTERM as soon as it starts joining: the join finishes, the silo leaves
/// (its entry ends Dead) and the process exits 0.
#[test]
fn sigterm_during_the_join_leaves_and_exits_0() {
    let bin = build();
    let cluster = format!("example-term-{}", uuid::Uuid::new_v4().simple());
    let mut service = start_with(&bin, &["--cluster", &cluster, "--cassandra", &contact()]);
    let joining = service.line_starting("joining as ");
    let silo: SiloAddress = joining["joining as ".len()..].parse().unwrap();
    service.terminate();
    let left = service.line_starting("left: ");
    assert_eq!(left, format!("left: entry of {silo} is Some(Dead)"));
    let status = service.exit_within(STEP);
    assert!(status.success(), "exit status {status}");
    assert_eq!(stored_status(&cluster, &silo), Some(SiloStatus::Dead));
}

/// The example's claim (the reviewer's check): a silo the cluster declared dead stops and
/// exits 1. Another process marks its row Dead on the real node; the service notices within a
/// publish period (30 s by default, with jitter).
#[test]
fn the_service_exits_1_once_the_cluster_declares_it_dead() {
    let bin = build();
    let cluster = format!("example-dead-{}", uuid::Uuid::new_v4().simple());
    let mut service = start_with(&bin, &["--cluster", &cluster, "--cassandra", &contact()]);
    let line = service.line_starting("listening on http://");
    let at: SocketAddr = line["listening on http://".len()..].parse().unwrap();
    let joined = service.line_starting("joined as ");
    let silo: SiloAddress = joined["joined as ".len()..].parse().unwrap();
    assert_eq!(get(at, "/readyz").0, 200);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let table = CassandraMembershipTable::connect(cassandra_options(&cluster))
            .await
            .expect("the Cassandra node of CASSANDRA_CONTACT_POINTS");
        assert!(
            protocol::set_status(&table, &silo, SiloStatus::Dead, Timestamp::now())
                .await
                .unwrap()
        );
    });
    let stopped = service.line_starting("stopped by the cluster: ");
    assert!(stopped.contains("declared dead"), "{stopped}");
    let status = service.exit_within(STEP);
    assert_eq!(status.code(), Some(1), "{status}");
    assert_eq!(stored_status(&cluster, &silo), Some(SiloStatus::Dead));
}

/// `GET /members` on `at`, parsed.
fn members(at: SocketAddr) -> serde_json::Value {
    let (status, body) = get(at, "/members");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// The status of `silo`'s entry in a `/members` answer.
fn status_in(members: &serde_json::Value, silo: &str) -> Option<String> {
    members["members"]
        .as_array()?
        .iter()
        .find(|m| m["address"].as_str() == Some(silo))
        .and_then(|m| m["status"].as_str().map(str::to_owned))
}

/// Polls `done` every 200 ms until it holds or `within` passes (then panics with `what`).
fn wait_until(within: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A pod binds every interface: without an advertised address its silo's endpoint would be
/// 0.0.0.0, which no other silo can reach. It exits 2 before binding, naming the flag and both
/// variables.
#[test]
fn listening_on_0_0_0_0_without_an_advertised_address_exits_2_naming_the_flag_and_variables() {
    let bin = build();
    let mut command = Command::new(&bin);
    for name in ["POD_IP", "SERVICE_ADVERTISE", "SERVICE_CONFIG"] {
        command.env_remove(name);
    }
    let out = command
        .args(["--listen", "0.0.0.0:8080"])
        .output()
        .expect("the example runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    for name in ["--advertise", "SERVICE_ADVERTISE", "POD_IP", "0.0.0.0:8080"] {
        assert!(stderr.contains(name), "{name} not in {stderr:?}");
    }
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("listening on"),
        "refused before binding"
    );
}

/// The done-when of a deployable service: three service processes on the test node, each with
/// its own advertised address (from POD_IP, SERVICE_ADVERTISE and --advertise; one binds
/// 0.0.0.0) and an options file, list each other Active in `/members`; one SIGTERMed leaves
/// within the file's `leave_timeout` and exits 0, and the others' `/members` show it Dead.
/// Every wait is for a condition, with a bound.
#[test]
fn three_services_list_each_other_and_one_sigtermed_leaves_and_shows_dead_in_the_others() {
    let bin = build();
    let cluster = format!("example-three-{}", uuid::Uuid::new_v4().simple());
    let leave_timeout = Duration::from_secs(30);
    // Periods of 2 s: a change shows in every view within seconds. Calls get 5 s each and
    // nobody may vote before 10 missed periods: a loaded machine declares no silo dead here.
    let file = std::env::temp_dir().join(format!("{cluster}.toml"));
    std::fs::write(
        &file,
        format!(
            r#"storage = "cassandra"

[cassandra]
contact_points = ["{contact}"]
keyspace = "cm_service"
create_keyspace_with_replication = {{ class = "SimpleStrategy", replication_factor = "1" }}
service_id = "service-demo"
cluster_id = "{cluster}"

[cassandra.membership]
i_am_alive_table_publish_timeout = "2s"
num_missed_table_i_am_alive_limit = 10
table_operation_timeout = "5s"
defunct_silo_cleanup_period = "off"
leave_timeout = "{leave}s"
"#,
            contact = contact(),
            leave = leave_timeout.as_secs()
        ),
    )
    .unwrap();
    let config = file.display().to_string();
    let started = [
        spawn(
            &bin,
            &["--config", &config, "--listen", "0.0.0.0:0"],
            &[("POD_IP", "127.0.0.101"), ("HOSTNAME", "pod-1")],
        ),
        spawn(
            &bin,
            &["--config", &config, "--listen", "127.0.0.102:0"],
            &[("SERVICE_ADVERTISE", "127.0.0.102")],
        ),
        spawn(
            &bin,
            &[
                "--config",
                &config,
                "--listen",
                "127.0.0.103:0",
                "--advertise",
                "127.0.0.103",
            ],
            &[],
        ),
    ];
    let mut services = Vec::new();
    for (i, service) in started.into_iter().enumerate() {
        let line = service.line_starting("listening on http://");
        let bound: SocketAddr = line["listening on http://".len()..].parse().unwrap();
        let at = SocketAddr::new(
            format!("127.0.0.10{}", i + 1).parse().unwrap(),
            bound.port(),
        );
        services.push((service, at, String::new()));
    }
    for (i, (service, at, silo)) in services.iter_mut().enumerate() {
        let joined = service.line_starting("joined as ");
        *silo = joined["joined as ".len()..].to_owned();
        assert_eq!(
            silo.parse::<SiloAddress>().unwrap().endpoint(),
            *at,
            "service {i} advertises its own address"
        );
    }
    let silos: Vec<String> = services.iter().map(|(_, _, s)| s.clone()).collect();
    for (_, at, _) in &services {
        wait_until(
            Duration::from_secs(90),
            "every silo Active in /members",
            || {
                let m = members(*at);
                silos
                    .iter()
                    .all(|s| status_in(&m, s).as_deref() == Some("Active"))
            },
        );
    }

    let first = members(services[0].1);
    let named = first["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["address"].as_str() == Some(silos[0].as_str()))
        .map(|m| m["silo_name"].clone());
    assert_eq!(
        named,
        Some("pod-1".into()),
        "HOSTNAME names the silo: {first}"
    );

    let (mut leaving, _, gone) = services.pop().unwrap();
    let signalled = Instant::now();
    leaving.terminate();
    let left = leaving.line_starting("left: ");
    assert_eq!(left, format!("left: entry of {gone} is Some(Dead)"));
    let took = leaving.line_starting("leave took ");
    let took: u64 = took["leave took ".len()..]
        .trim_end_matches(" ms")
        .parse()
        .unwrap();
    assert!(
        Duration::from_millis(took) <= leave_timeout,
        "the leave took {took} ms, its bound is {leave_timeout:?}"
    );
    let status = leaving.exit_within(leave_timeout + Duration::from_secs(15));
    assert!(status.success(), "exit status {status}");
    println!(
        "SIGTERM to exit: {:?}, the leave {took} ms",
        signalled.elapsed()
    );

    for (_, at, _) in &services {
        wait_until(
            Duration::from_secs(60),
            "the one that left Dead in /members",
            || status_in(&members(*at), &gone).as_deref() == Some("Dead"),
        );
    }
    for (service, _, _) in &services {
        service.terminate();
        service.line_starting("left: ");
    }
    for (service, _, _) in &mut services {
        assert!(service.exit_within(STEP).success());
    }
    let _ = std::fs::remove_file(&file);
    let silo: SiloAddress = gone.parse().unwrap();
    assert_eq!(stored_status(&cluster, &silo), Some(SiloStatus::Dead));
}

//! examples/service.rs as a process: it answers its probes and its work while it serves, leaves
//! the cluster on SIGTERM and exits 0 (a stalled client cannot hold that up); it answers its
//! probes while it starts, and a signal then still ends in a leave and exit 0; it exits 1 once
//! the cluster declares it dead; and the Kubernetes probe snippet in its docs names the paths it
//! serves. Every wait is bounded, and the child is killed if the test fails. The tests with
//! `--cassandra` use the real node at 127.0.0.1:9042.

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
const SOURCE: &str = include_str!("../examples/service.rs");

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
    let mut child = Command::new(bin)
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
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
    assert_eq!(get(at, "/readyz").0, 200);
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
    service.terminate();
    service.line_starting("SIGTERM while connecting");
    let status = service.exit_within(STEP);
    assert!(status.success(), "exit status {status}");
    drop(silent);
}

fn cassandra_options(cluster: &str) -> CassandraClusteringOptions {
    CassandraClusteringOptions::default()
        .keyspace("cm_service")
        .service_id("service-demo")
        .cluster_id(cluster)
        .contact_points(["127.0.0.1:9042"])
        .create_keyspace_simple(1)
}

/// The stored status of `silo`'s entry on the real node.
fn stored_status(cluster: &str, silo: &SiloAddress) -> Option<SiloStatus> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let table = CassandraMembershipTable::connect(cassandra_options(cluster))
            .await
            .expect("the Cassandra node at 127.0.0.1:9042");
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
    let mut service = start_with(
        &bin,
        &["--cluster", &cluster, "--cassandra", "127.0.0.1:9042"],
    );
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
    let mut service = start_with(
        &bin,
        &["--cluster", &cluster, "--cassandra", "127.0.0.1:9042"],
    );
    let line = service.line_starting("listening on http://");
    let at: SocketAddr = line["listening on http://".len()..].parse().unwrap();
    let joined = service.line_starting("joined as ");
    let silo: SiloAddress = joined["joined as ".len()..].parse().unwrap();
    assert_eq!(get(at, "/readyz").0, 200);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let table = CassandraMembershipTable::connect(cassandra_options(&cluster))
            .await
            .expect("the Cassandra node at 127.0.0.1:9042");
        assert!(
            protocol::set_status(&table, &silo, SiloStatus::Dead, Timestamp::now())
                .await
                .unwrap()
        );
    });
    let stopped = service.line_starting("stopped by the cluster: ");
    assert!(stopped.contains("DeclaredDead"), "{stopped}");
    let status = service.exit_within(STEP);
    assert_eq!(status.code(), Some(1), "{status}");
    assert_eq!(stored_status(&cluster, &silo), Some(SiloStatus::Dead));
}

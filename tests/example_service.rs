//! examples/service.rs as a process: it answers its probes and its work while it serves, leaves
//! the cluster on SIGTERM and exits 0; and the Kubernetes probe snippet in its docs names the
//! paths it serves. Every wait is bounded, and the child is killed if the test fails.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

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
    let mut child = Command::new(bin)
        .args(["--listen", "127.0.0.1:0", "--cluster", "example-test"])
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
fn the_docs_probe_snippet_names_readiness_and_liveness() {
    assert_eq!(
        probe_paths(),
        [
            ("readinessProbe".to_owned(), "/readyz".to_owned()),
            ("livenessProbe".to_owned(), "/livez".to_owned())
        ]
    );
}

#[test]
fn the_service_answers_its_probes_and_work_then_leaves_on_sigterm() {
    let bin = build();
    let mut service = start(&bin);
    // It joins, then listens (so no probe is answered before the silo exists).
    let joined = service.line_starting("joined as ");
    let silo = joined["joined as ".len()..].to_owned();
    let line = service.line_starting("listening on http://");
    let at: SocketAddr = line["listening on http://".len()..].parse().unwrap();

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
    let deadline = std::time::Instant::now() + STEP;
    let status = loop {
        if let Some(status) = service.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still running {STEP:?} after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "exit status {status}");
    assert!(
        TcpStream::connect_timeout(&at, Duration::from_secs(1)).is_err(),
        "no longer listening"
    );
}

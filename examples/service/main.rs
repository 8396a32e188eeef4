//! A service the way a Kubernetes deployment runs one: an HTTP server around a silo. Readiness and
//! each piece of work ask the silo's [`Fence::should_serve`] (decided against the clock when
//! asked, so a process resumed after a pause past its fence refuses work before any of its tasks
//! has run); liveness is `!is_final()`; the work endpoint refuses work while the silo must fence; SIGTERM or Ctrl-C leaves the cluster gracefully (exit 0). A
//! silo the cluster declared dead (or whose entry is gone) stops and exits 1, so the
//! orchestrator starts a new incarnation.
//!
//!     cargo run --example service                                   # on the in-memory table
//!     cargo run --example service -- --cassandra 127.0.0.1:9042     # on Cassandra (a demo keyspace)
//!     cargo run --example service -- --config deploy/service.toml --advertise 10.0.0.7
//!
//! TLS to the nodes (`[cassandra.tls]`) needs the crate feature `rustls`: build the service with
//! `cargo build --release --example service --features rustls`. Without it a `tls` section exits
//! 2 with "TLS needs the crate feature rustls".
//!
//! Flags take `--flag VALUE` or `--flag=VALUE`; an unknown flag or one without its value exits 2
//! (`--help` lists them). `--listen IP:PORT` (or `SERVICE_LISTEN`; default `127.0.0.1:8080`;
//! port 0 picks a free one; anything but `IP:PORT` exits 2) is
//! where it serves; it prints `listening on http://ADDR` with the bound address. The silo's
//! endpoint — the address the other silos and clients reach — is `--advertise ADDR` (or
//! `SERVICE_ADVERTISE`; `IP:PORT`, or an IP with the listen port), else `POD_IP` (Kubernetes'
//! downward API) with the listen port, else the listen address. An unspecified address
//! (`0.0.0.0`, `::`) or port 0 as that endpoint is refused with exit 2, naming the flag and the
//! variables: `--listen 0.0.0.0:8080` needs one of them.
//!
//! `--config FILE` (or `SERVICE_CONFIG`) reads the options file: `storage`, `listen`,
//! `advertise`, and `[cassandra]`, the library's `CassandraClusteringOptions` with its
//! `[cassandra.membership]` (deploy/service.toml is an example); `SERVICE_*` variables override
//! it and flags override both (config.rs). `--cluster C` sets the cluster id (default
//! `service-demo`). An options file or value the service cannot use exits 2. `HOSTNAME` (in a
//! pod, its name) is the entry's `silo_name` and `host_name`.
//!
//! | path | answers |
//! |---|---|
//! | `GET /readyz` | 200 while `silo.should_serve()`; 503 while starting (before the join returned), fenced or leaving |
//! | `GET /livez` | 200 while the health is not final (starting included), else 503 |
//! | `GET /work` | 200 and a result while serving; 503 while starting, fenced or leaving |
//! | `GET /members` | the silo's membership view as JSON (members.rs documents the fields) |
//!
//! Readiness and liveness answer one line: `ready: healthy, lease until 2026-12-06T08:19:30.722Z`
//! (`lease without expiry` on a table without expiry), `not ready: lease at risk (3 heartbeats
//! failed), …`, `stopped: declared dead`.
//!
//! **Logs.** The library's tracing events (heartbeat failed, fenced, declared dead, …; the
//! crate's `docs::observability` lists them) and the service's own warnings go to stderr,
//! filtered by `RUST_LOG` (default `info`; one that does not parse exits 2), as text or, with
//! `--log-format json` (or `SERVICE_LOG_FORMAT=json`, the file's `log_format`), one JSON object
//! a line. stdout keeps the progress lines a watcher reads (`listening on`, `joined as`, `left:`).
//!
//! **Exit codes.** A fatal error prints `error: ` and its message (with its causes) on stderr.
//!
//! | code | when |
//! |---|---|
//! | 0 | left the cluster after SIGTERM / Ctrl-C (or a signal before the join wrote anything) |
//! | 1 | a storage or other failure (unreachable nodes, a missing keyspace, a failed join or leave); or the cluster declared the silo dead or its entry is gone |
//! | 2 | an option it cannot use: a flag, the options file, a `SERVICE_*` or `RUST_LOG` value, or what the library refuses as `InvalidConfiguration` (a password file that is not there, `[cassandra.tls]` without the feature `rustls`) or `TlsHandshake` |
//! | 130 | a second signal: exit without finishing the leave |
//!
//! **Start.** The signal handlers are installed first, then the probes are served (readiness
//! 503 `starting`, liveness 200), then it connects to the storage and joins. A signal while it
//! connects exits 0 at once (nothing was written); a signal while it joins lets the join finish
//! (at most `JOIN_GRACE`, 10 s: past it the join is dropped, and an entry it inserted stays
//! Joining until defunct cleanup or expiry removes it), leaves if it joined, and exits 0.
//!
//! **SIGTERM / Ctrl-C**, in this order: readiness and work answer 503 at once; `silo.leave()`
//! starts at once; the server stops accepting and drains its open connections — at the same
//! time as the leave, and for at most `DRAIN`, 10 s (a client that sent half a request cannot
//! hold it up: axum's graceful shutdown has no bound of its own); then, once the leave
//! returned and its entry was read back (at most `AFTER_LEAVE_READ`, 5 s), it exits 0. The
//! leave ends within the options' `leave_timeout` (60 s by default; the service refuses more
//! than `MAX_LEAVE_TIMEOUT`, 60 s), whatever the per-call timeouts. A second SIGTERM or Ctrl-C
//! exits 130 at once, without finishing the leave (the others then declare the silo dead).
//!
//! The probes of its pod (tests/example_service.rs checks that these paths are the ones served;
//! deploy/kubernetes.yaml is the whole manifest, checked against constants.rs):
//!
//! ```yaml
//! startupProbe:
//!   httpGet:
//!     path: /livez
//!     port: 8080
//!   periodSeconds: 5
//!   failureThreshold: 60
//! readinessProbe:
//!   httpGet:
//!     path: /readyz
//!     port: 8080
//!   periodSeconds: 5
//!   failureThreshold: 1
//! livenessProbe:
//!   httpGet:
//!     path: /livez
//!     port: 8080
//!   periodSeconds: 10
//!   failureThreshold: 3
//! ```
//!
//! Liveness answers 200 while the silo starts, so the startup probe passes once the server
//! answers; it does not wait for the join. A slow join (up to `max_join_attempt_time`, 5 min by
//! default) is not killed for it, and a join that fails exits 1: the orchestrator restarts the
//! pod. Readiness (503 `starting`) keeps traffic away until the join returned. `terminationGracePeriodSeconds: 90` (`TERMINATION_GRACE`) is above
//! the longest shutdown: an interrupted join's `JOIN_GRACE` (10 s), then the leave's bound
//! (`leave_timeout` ≤ 60 s) with the drain (10 s) alongside — so the pod's SIGTERM leaves the
//! cluster before it is killed.

mod config;
mod constants;
mod members;

use std::future::Future;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use cassandra_membership::{
    CassandraMembershipTable, InMemoryMembershipTable, MembershipError, MembershipTable, Silo,
    SiloAddress, SiloHealth, Timestamp,
};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use config::{LogFormat, Refused, Settings, Storage};
use constants::{AFTER_LEAVE_READ, DRAIN, JOIN_GRACE, LIVEZ, MEMBERS, POD_IP, READYZ, WORK};
use members::Members;

type Error = Box<dyn std::error::Error + Send + Sync>;

async fn table(settings: &Settings) -> Result<Arc<dyn MembershipTable>, Error> {
    let options = settings.cassandra.clone();
    let cluster = options.cluster_id.clone();
    match settings.storage {
        Storage::Memory => {
            println!("storage: the in-memory table, cluster {cluster}");
            Ok(Arc::new(
                InMemoryMembershipTable::new(&cluster).with_options(options.membership),
            ))
        }
        Storage::Cassandra => {
            println!(
                "storage: Cassandra at {}, keyspace {}, cluster {cluster}",
                options.contact_points.join(","),
                options.keyspace
            );
            Ok(Arc::new(CassandraMembershipTable::connect(options).await?))
        }
    }
}

/// What the handlers read: the silo once it joined (shared: the shutdown path leaves through
/// the same `Arc`), and whether the process is leaving.
#[derive(Clone)]
struct Service {
    silo: Arc<OnceLock<Arc<Silo>>>,
    leaving: Arc<AtomicBool>,
    address: SiloAddress,
}

impl Service {
    /// The silo's health; `None` while it starts (its join has not returned).
    fn health(&self) -> Option<SiloHealth> {
        self.silo.get().map(|s| s.health().borrow().clone())
    }

    /// Asked when work arrives: against the clock now, not the last health a timer wrote.
    fn serving(&self) -> bool {
        !self.leaving.load(Ordering::SeqCst) && self.silo.get().is_some_and(|s| s.should_serve())
    }
}

/// The health as one short line for a person: `healthy, lease until 2026-12-06T08:19:30.722Z`.
fn describe(health: &SiloHealth) -> String {
    let until = |lease: Option<&cassandra_membership::Lease>| match lease {
        Some(l) => match l.expires_at {
            Some(at) => format!("lease until {at}"),
            None => "lease without expiry".to_owned(),
        },
        None => "no lease".to_owned(),
    };
    match health {
        SiloHealth::Starting => "starting".to_owned(),
        SiloHealth::Healthy { lease } => format!("healthy, {}", until(Some(lease))),
        SiloHealth::Failing {
            failures,
            lease,
            last_error,
            ..
        } => format!(
            "failing ({failures} heartbeats), {}: {last_error}",
            until(lease.as_ref())
        ),
        SiloHealth::LeaseAtRisk {
            failures, lease, ..
        } => format!(
            "lease at risk ({failures} heartbeats failed), {}",
            until(lease.as_ref())
        ),
        SiloHealth::EntryMissing => "entry missing".to_owned(),
        SiloHealth::DeclaredDead => "declared dead".to_owned(),
        SiloHealth::Stopped => "stopped".to_owned(),
        other => format!("{other:?}"),
    }
}

async fn readyz(State(s): State<Service>) -> (StatusCode, String) {
    match s.health() {
        Some(health) if s.serving() => (StatusCode::OK, format!("ready: {}\n", describe(&health))),
        Some(health) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", describe(&health)),
        ),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: starting\n".into(),
        ),
    }
}

async fn livez(State(s): State<Service>) -> (StatusCode, String) {
    match s.health() {
        Some(health) if health.is_final() => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("stopped: {}\n", describe(&health)),
        ),
        Some(health) => (StatusCode::OK, format!("live: {}\n", describe(&health))),
        None => (StatusCode::OK, "live: starting\n".into()),
    }
}

/// The service's work: refused unless the silo may serve as a member.
async fn work(State(s): State<Service>) -> (StatusCode, String) {
    if s.serving() {
        (StatusCode::OK, format!("done by {}\n", s.address))
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "fenced: not accepting work\n".into(),
        )
    }
}

/// The membership view as JSON (also while leaving: the last view read, marked `ended`).
async fn members(State(s): State<Service>) -> impl IntoResponse {
    let (status, body) = match s.silo.get() {
        Some(silo) => {
            let view = silo.view().borrow().clone();
            let ended = s.leaving.load(Ordering::SeqCst);
            let body = serde_json::to_string(&Members::of(&view, Timestamp::now(), ended));
            (
                StatusCode::OK,
                body.unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}")),
            )
        }
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "{\"error\":\"starting: not joined yet\"}".to_owned(),
        ),
    };
    (status, [(header::CONTENT_TYPE, "application/json")], body)
}

/// SIGTERM (what Kubernetes sends) or Ctrl-C: the handlers are installed when this is called
/// (a signal before the first poll is kept), and the watch says which came first.
fn termination() -> watch::Receiver<Option<&'static str>> {
    let (tx, rx) = watch::channel(None);
    #[cfg(unix)]
    let first = {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).expect("a SIGTERM handler");
        let mut int = signal(SignalKind::interrupt()).expect("a SIGINT handler");
        async move {
            let first = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "Ctrl-C",
            };
            let second = async move {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            };
            (first, second)
        }
    };
    #[cfg(not(unix))]
    let first = async {
        let _ = tokio::signal::ctrl_c().await;
        ("Ctrl-C", ())
    };
    tokio::spawn(async move {
        #[cfg_attr(not(unix), allow(unused_variables))]
        let (first, second) = first.await;
        let _ = tx.send(Some(first));
        // A second signal means "now": exit without waiting for the leave (its entry is then
        // left as far as it got; the others declare the silo dead).
        #[cfg(unix)]
        {
            let _ = second.await;
            eprintln!("service: a second signal: exiting without finishing the leave");
            std::process::exit(130);
        }
    });
    rx
}

/// The signal, once one arrived.
async fn signalled(signal: &mut watch::Receiver<Option<&'static str>>) -> &'static str {
    match signal.wait_for(Option::is_some).await {
        Ok(name) => name.unwrap_or("signal"),
        Err(_) => std::future::pending().await,
    }
}

/// The HTTP server, and how to stop it.
struct Server {
    task: JoinHandle<std::io::Result<()>>,
    shutdown: oneshot::Sender<()>,
}

impl Server {
    /// Stops accepting, drains the open connections for at most [`DRAIN`], then closes the
    /// ones left.
    async fn drain(self) -> Result<(), Error> {
        let Server { mut task, shutdown } = self;
        let _ = shutdown.send(());
        match tokio::time::timeout(DRAIN, &mut task).await {
            Ok(served) => Ok(served??),
            Err(_) => {
                println!("drain: connections still open after {DRAIN:?}; closing them");
                task.abort();
                Ok(())
            }
        }
    }
}

/// The leave after a signal: readiness and work already answer 503; the leave starts at once
/// and the server drains meanwhile (bounded); returns once the leave returned.
async fn leave(
    signal: &str,
    silo: &Silo,
    table: &dyn MembershipTable,
    server: Server,
) -> Result<(), Error> {
    println!("{signal}: leaving the cluster");
    let address = silo.address();
    let leave = async {
        let started = std::time::Instant::now();
        silo.leave().await?;
        let took = started.elapsed();
        // Bounded: the pod's grace counts it (constants.rs), whatever the driver's timeouts.
        let status = tokio::time::timeout(AFTER_LEAVE_READ, table.read_row(&address))
            .await
            .map_err(|_| {
                format!("reading the entry after the leave: no answer within {AFTER_LEAVE_READ:?}")
            })??
            .get(&address)
            .map(|r| r.entry.status);
        println!("left: entry of {address} is {status:?}");
        println!("leave took {} ms", took.as_millis());
        Ok::<(), Error>(())
    };
    let (left, drained) = tokio::join!(leave, server.drain());
    left?;
    drained
}

/// `work` unless a signal comes first (`Err` names it).
async fn unless_signalled<T>(
    signal: &mut watch::Receiver<Option<&'static str>>,
    work: impl Future<Output = T>,
) -> Result<T, &'static str> {
    tokio::select! {
        done = work => Ok(done),
        name = signalled(signal) => Err(name),
    }
}

/// A setting the service cannot run with: said on stderr, exit 2 (as a usage error).
fn refuse(refused: Refused) -> ! {
    // clap's usage messages start with `error: ` already.
    let text = refused.to_string();
    match text.starts_with("error: ") {
        true => eprintln!("{text}"),
        false => eprintln!("error: {text}"),
    }
    std::process::exit(2);
}

/// The exit code of a fatal error (the module docs' table): 2 for an option the service cannot
/// use (the library's `InvalidConfiguration`, a TLS handshake the tls options failed), else 1.
fn exit_code(error: &(dyn std::error::Error + 'static)) -> u8 {
    match error.downcast_ref::<MembershipError>() {
        Some(
            MembershipError::InvalidConfiguration { .. }
            | MembershipError::InvalidSiloAddress { .. }
            | MembershipError::TlsHandshake { .. },
        ) => 2,
        _ => 1,
    }
}

/// The library's tracing events (and the service's own) on stderr, filtered by `RUST_LOG`
/// (default `info`); stdout keeps the service's progress lines. A `RUST_LOG` that does not
/// parse exits 2.
fn logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.is_empty() => EnvFilter::try_new(&directives)
            .unwrap_or_else(|e| refuse(Refused(format!("RUST_LOG: {e}")))),
        _ => EnvFilter::new("info"),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal: a pod's log collector would keep the escapes.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(exit_code(e.as_ref()))
        }
    }
}

async fn run() -> Result<(), Error> {
    // First of all, so a signal while it starts is not the default (an exit without a leave).
    let mut signal = termination();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let settings = Settings::load(&args).unwrap_or_else(|r| refuse(r));
    logging(settings.log_format);
    let pod_ip = std::env::var(POD_IP).ok().filter(|ip| !ip.is_empty());
    // Refused before binding: an unspecified listen address needs an advertised one.
    if let Ok(listen) = settings.listen.parse::<SocketAddr>() {
        settings
            .endpoint(listen, pod_ip.as_deref())
            .unwrap_or_else(|r| refuse(r));
    }

    let listener = tokio::net::TcpListener::bind(&settings.listen).await?;
    let bound = listener.local_addr()?;
    let endpoint = settings
        .endpoint(bound, pod_ip.as_deref())
        .unwrap_or_else(|r| refuse(r));
    let address = SiloAddress::new_incarnation(endpoint)?;

    // The probes are served from here on: starting until the join returns.
    let service = Service {
        silo: Arc::new(OnceLock::new()),
        leaving: Arc::new(AtomicBool::new(false)),
        address,
    };
    let app = Router::new()
        .route(READYZ, get(readyz))
        .route(LIVEZ, get(livez))
        .route(WORK, get(work))
        .route(MEMBERS, get(members))
        .with_state(service.clone());
    let (shutdown, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
    });
    let server = Server { task, shutdown };
    println!("listening on http://{bound}");

    let table = match unless_signalled(&mut signal, table(&settings)).await {
        Ok(table) => table?,
        Err(name) => {
            println!("{name} while connecting: exiting (nothing was written)");
            return server.drain().await;
        }
    };

    // The table's membership options (the file's `[cassandra.membership]`) govern the silo.
    println!("joining as {address}");
    // In a pod, HOSTNAME is the pod's name: what an operator looks for in `/members`.
    let host = std::env::var("HOSTNAME").unwrap_or_default();
    let joining = Silo::builder(Arc::clone(&table), address)
        .silo_name(host.clone())
        .host_name(host)
        .join();
    let mut join = tokio::spawn(joining);
    let silo = match unless_signalled(&mut signal, &mut join).await {
        Ok(joined) => Arc::new(joined??),
        Err(name) => {
            service.leaving.store(true, Ordering::SeqCst);
            println!("{name} while joining: the join may take {JOIN_GRACE:?} more, then it leaves");
            return match tokio::time::timeout(JOIN_GRACE, &mut join).await {
                Ok(joined) => match joined? {
                    Ok(silo) => {
                        println!("joined as {address}");
                        leave(name, &silo, table.as_ref(), server).await
                    }
                    Err(e) => {
                        println!("the join failed: {e}; nothing to leave");
                        server.drain().await
                    }
                },
                Err(_) => {
                    join.abort();
                    println!("the join did not finish within {JOIN_GRACE:?}: dropped");
                    server.drain().await
                }
            };
        }
    };
    // Readiness first: "joined" on stdout tells a watcher (and the tests) the probes say so.
    let _ = service.silo.set(Arc::clone(&silo));
    println!("joined as {address}");

    let mut health = silo.health();
    let stop = tokio::select! {
        name = signalled(&mut signal) => Ok(name),
        h = health.wait_for(SiloHealth::is_final) => Err(h.map(|h| h.clone()).unwrap_or(SiloHealth::Stopped)),
    };
    // Refuse work and fail readiness at once.
    service.leaving.store(true, Ordering::SeqCst);
    match stop {
        Ok(name) => leave(name, &silo, table.as_ref(), server).await,
        Err(health) => {
            tracing::warn!(
                health = describe(&health),
                "stopped by the cluster: exiting 1"
            );
            println!("stopped by the cluster: {}", describe(&health));
            silo.crash();
            server.drain().await?;
            std::process::exit(1);
        }
    }
}

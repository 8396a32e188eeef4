//! A service the way a Kubernetes deployment runs one: an HTTP server around a silo. Readiness and
//! each piece of work ask the silo's [`Fence::should_serve`] (decided against the clock when
//! asked, so a process resumed after a pause past its fence refuses work before any of its tasks
//! has run); liveness is `!is_final()`; the work endpoint refuses work while the silo must fence; SIGTERM or Ctrl-C leaves the cluster gracefully (exit 0). A
//! silo the cluster declared dead (or whose entry is gone) stops and exits 1, so the
//! orchestrator starts a new incarnation.
//!
//!     cargo run --example service                                   # on the in-memory table
//!     cargo run --example service -- --cassandra 127.0.0.1:9042     # on Cassandra
//!     cargo run --example service -- --listen 0.0.0.0:8080 --cluster blue
//!
//! `--listen ADDR` (or `SERVICE_LISTEN`; default `127.0.0.1:8080`; port 0 picks a free one) is
//! where it serves; it prints `listening on http://ADDR` with the bound address, and uses that
//! address as the silo's endpoint. `--cluster C` names the cluster (default `service-demo`).
//!
//! | path | answers |
//! |---|---|
//! | `GET /readyz` | 200 while `silo.fence().should_serve()`; 503 while starting (before the join returned), fenced or leaving |
//! | `GET /livez` | 200 while the health is not final (starting included), else 503 |
//! | `GET /work` | 200 and a result while serving; 503 while starting, fenced or leaving |
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
//! returned, it exits 0.
//!
//! The probes of its pod (tests/example_service.rs checks that these paths are the ones served):
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
//! The startup probe gives the join up to 5 min (`max_join_attempt_time`'s default) before the
//! liveness probe counts. With `terminationGracePeriodSeconds` above the leave's bound
//! (`max_join_attempt_time`; the drain runs meanwhile) the pod's SIGTERM leaves the cluster
//! before it is killed.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, Fence, InMemoryMembershipTable,
    MembershipTable, Silo, SiloAddress, SiloHealth,
};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// How long the server drains its open connections after a signal (the leave runs meanwhile).
const DRAIN: Duration = Duration::from_secs(10);
/// How long a join a signal interrupted may still take before it is dropped.
const JOIN_GRACE: Duration = Duration::from_secs(10);

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

async fn table(args: &[String], cluster: &str) -> Result<Arc<dyn MembershipTable>, Error> {
    match arg(args, "--cassandra") {
        None => {
            println!("storage: the in-memory table, cluster {cluster}");
            Ok(Arc::new(InMemoryMembershipTable::new(cluster)))
        }
        Some(contact) => {
            let options = CassandraClusteringOptions::default()
                .keyspace("cm_service")
                .service_id("service-demo")
                .cluster_id(cluster)
                .contact_points([contact.clone()])
                .create_keyspace_simple(1);
            println!("storage: Cassandra at {contact}, keyspace cm_service, cluster {cluster}");
            Ok(Arc::new(CassandraMembershipTable::connect(options).await?))
        }
    }
}

/// What the handlers read: the silo's fence once it joined, and whether the process is leaving.
#[derive(Clone)]
struct Service {
    fence: Arc<OnceLock<Fence>>,
    leaving: Arc<AtomicBool>,
    silo: SiloAddress,
}

impl Service {
    /// The silo's health; `None` while it starts (its join has not returned).
    fn health(&self) -> Option<SiloHealth> {
        self.fence.get().map(Fence::health)
    }

    /// Asked when work arrives: against the clock now, not the last health a timer wrote.
    fn serving(&self) -> bool {
        !self.leaving.load(Ordering::SeqCst) && self.fence.get().is_some_and(Fence::should_serve)
    }
}

async fn readyz(State(s): State<Service>) -> (StatusCode, String) {
    match s.health() {
        Some(health) if s.serving() => (StatusCode::OK, format!("ready: {health:?}\n")),
        Some(health) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {health:?}\n"),
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
            format!("stopped: {health:?}\n"),
        ),
        Some(health) => (StatusCode::OK, format!("live: {health:?}\n")),
        None => (StatusCode::OK, "live: starting\n".into()),
    }
}

/// The service's work: refused unless the silo may serve as a member.
async fn work(State(s): State<Service>) -> (StatusCode, String) {
    if s.serving() {
        (StatusCode::OK, format!("done by {}\n", s.silo))
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "fenced: not accepting work\n".into(),
        )
    }
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
            tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "Ctrl-C",
            }
        }
    };
    #[cfg(not(unix))]
    let first = async {
        let _ = tokio::signal::ctrl_c().await;
        "Ctrl-C"
    };
    tokio::spawn(async move {
        let _ = tx.send(Some(first.await));
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
    silo: Silo,
    table: &dyn MembershipTable,
    server: Server,
) -> Result<(), Error> {
    println!("{signal}: leaving the cluster");
    let address = silo.address();
    let leave = async {
        silo.leave().await?;
        let status = table
            .read_row(&address)
            .await?
            .get(&address)
            .map(|r| r.entry.status);
        println!("left: entry of {address} is {status:?}");
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

#[tokio::main]
async fn main() -> Result<(), Error> {
    // First of all, so a signal while it starts is not the default (an exit without a leave).
    let mut signal = termination();
    let args: Vec<String> = std::env::args().collect();
    let listen = arg(&args, "--listen")
        .or_else(|| std::env::var("SERVICE_LISTEN").ok())
        .unwrap_or_else(|| "127.0.0.1:8080".into());
    let cluster = arg(&args, "--cluster").unwrap_or_else(|| "service-demo".into());

    let listener = tokio::net::TcpListener::bind(&listen).await?;
    let bound = listener.local_addr()?;
    // Other silos reach this one where it listens; an unspecified address is not reachable.
    let endpoint = if bound.ip().is_unspecified() {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), bound.port())
    } else {
        bound
    };
    let address = SiloAddress::new_incarnation(endpoint)?;

    // The probes are served from here on: starting until the join returns.
    let service = Service {
        fence: Arc::new(OnceLock::new()),
        leaving: Arc::new(AtomicBool::new(false)),
        silo: address,
    };
    let app = Router::new()
        .route("/readyz", get(readyz))
        .route("/livez", get(livez))
        .route("/work", get(work))
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

    let table = match unless_signalled(&mut signal, table(&args, &cluster)).await {
        Ok(table) => table?,
        Err(name) => {
            println!("{name} while connecting: exiting (nothing was written)");
            return server.drain().await;
        }
    };

    // The table's membership options (defaults here) govern the silo.
    println!("joining as {address}");
    let mut join = tokio::spawn(Silo::join(Arc::clone(&table), address));
    let silo = match unless_signalled(&mut signal, &mut join).await {
        Ok(joined) => joined??,
        Err(name) => {
            service.leaving.store(true, Ordering::SeqCst);
            println!("{name} while joining: the join may take {JOIN_GRACE:?} more, then it leaves");
            return match tokio::time::timeout(JOIN_GRACE, &mut join).await {
                Ok(joined) => match joined? {
                    Ok(silo) => {
                        println!("joined as {address}");
                        leave(name, silo, table.as_ref(), server).await
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
    let _ = service.fence.set(silo.fence());
    println!("joined as {address}");

    let mut health = silo.health();
    let stop = tokio::select! {
        name = signalled(&mut signal) => Ok(name),
        h = health.wait_for(SiloHealth::is_final) => Err(h.map(|h| h.clone()).unwrap_or(SiloHealth::Stopped)),
    };
    // Refuse work and fail readiness at once.
    service.leaving.store(true, Ordering::SeqCst);
    match stop {
        Ok(name) => leave(name, silo, table.as_ref(), server).await,
        Err(health) => {
            println!("stopped by the cluster: {health:?}");
            silo.crash();
            server.drain().await?;
            std::process::exit(1);
        }
    }
}

//! A service the way a Kubernetes deployment runs one: an HTTP server around a silo. Readiness is
//! the silo's [`SiloHealth::should_serve`], liveness `!is_final()`; the work endpoint refuses
//! work while the silo must fence; SIGTERM or Ctrl-C leaves the cluster gracefully (stop
//! accepting, `silo.leave()`, exit 0). A silo the cluster declared dead (or whose entry is gone)
//! stops and exits 1, so the orchestrator starts a new incarnation.
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
//! | `GET /readyz` | 200 while `silo.health().borrow().should_serve()`, else 503 |
//! | `GET /livez` | 200 while the health is not final, else 503 |
//! | `GET /work` | 200 and a result while serving; 503 while fenced or leaving |
//!
//! The probes of its pod (tests/example_service.rs checks that these paths are the ones served):
//!
//! ```yaml
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
//! With `terminationGracePeriodSeconds` above the leave's bound (`max_join_attempt_time`) the
//! pod's SIGTERM leaves the cluster before it is killed.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, InMemoryMembershipTable, MembershipTable,
    Silo, SiloAddress, SiloHealth,
};
use tokio::sync::watch;

type Error = Box<dyn std::error::Error + Send + Sync>;

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

/// What the handlers read: the silo's health and whether the process is leaving.
#[derive(Clone)]
struct Service {
    health: watch::Receiver<SiloHealth>,
    leaving: Arc<AtomicBool>,
    silo: SiloAddress,
}

impl Service {
    fn serving(&self) -> bool {
        !self.leaving.load(Ordering::SeqCst) && self.health.borrow().should_serve()
    }
}

async fn readyz(State(s): State<Service>) -> (StatusCode, String) {
    let health = s.health.borrow().clone();
    if s.serving() {
        (StatusCode::OK, format!("ready: {health:?}\n"))
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {health:?}\n"),
        )
    }
}

async fn livez(State(s): State<Service>) -> (StatusCode, String) {
    let health = s.health.borrow().clone();
    if health.is_final() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("stopped: {health:?}\n"),
        )
    } else {
        (StatusCode::OK, format!("live: {health:?}\n"))
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

/// SIGTERM (what Kubernetes sends) or Ctrl-C.
async fn termination() -> &'static str {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("a SIGTERM handler");
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = tokio::signal::ctrl_c() => "Ctrl-C",
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
        "Ctrl-C"
    }
}

/// Why the server stopped.
enum Stop {
    Signal(&'static str),
    Final(SiloHealth),
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let listen = arg(&args, "--listen")
        .or_else(|| std::env::var("SERVICE_LISTEN").ok())
        .unwrap_or_else(|| "127.0.0.1:8080".into());
    let cluster = arg(&args, "--cluster").unwrap_or_else(|| "service-demo".into());
    let table = table(&args, &cluster).await?;

    let listener = tokio::net::TcpListener::bind(&listen).await?;
    let bound = listener.local_addr()?;
    // Other silos reach this one where it listens; an unspecified address is not reachable.
    let endpoint = if bound.ip().is_unspecified() {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), bound.port())
    } else {
        bound
    };
    let address = SiloAddress::new_incarnation(endpoint)?;
    // The table's membership options (defaults here) govern the silo.
    let silo = Silo::join(Arc::clone(&table), address).await?;
    println!("joined as {address}");

    let service = Service {
        health: silo.health(),
        leaving: Arc::new(AtomicBool::new(false)),
        silo: address,
    };
    let app = Router::new()
        .route("/readyz", get(readyz))
        .route("/livez", get(livez))
        .route("/work", get(work))
        .with_state(service.clone());

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<Stop>();
    let mut health = silo.health();
    let leaving = Arc::clone(&service.leaving);
    let watcher = tokio::spawn(async move {
        let stop = tokio::select! {
            signal = termination() => Stop::Signal(signal),
            h = health.wait_for(SiloHealth::is_final) => Stop::Final(h.map(|h| h.clone()).unwrap_or(SiloHealth::Stopped)),
        };
        // Refuse work and fail readiness at once; the server then stops accepting connections.
        leaving.store(true, Ordering::SeqCst);
        let _ = stop_tx.send(stop);
    });
    let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
    println!("listening on http://{bound}");
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = shutdown_rx.await;
            })
            .await
    });

    let stop = stop_rx.await?;
    let _ = shutdown_tx.send(());
    server.await??;
    watcher.await?;
    match stop {
        Stop::Signal(signal) => {
            println!("{signal}: leaving the cluster");
            silo.leave().await?;
            let status = table
                .read_row(&address)
                .await?
                .get(&address)
                .map(|r| r.entry.status);
            println!("left: entry of {address} is {status:?}");
            Ok(())
        }
        Stop::Final(health) => {
            println!("stopped by the cluster: {health:?}");
            silo.crash();
            std::process::exit(1);
        }
    }
}

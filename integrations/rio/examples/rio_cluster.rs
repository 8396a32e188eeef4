//! Three rio servers (separate processes, on this machine) find each other through the
//! membership table in Cassandra; a rio client sends messages to a service object. One server
//! is killed (SIGKILL) and the client keeps getting answers; then all stop, and the cluster's
//! partition disappears from Cassandra after the TTL with nothing running.
//!
//! ```sh
//! cargo run -p cassandra-membership-rio --example rio_cluster
//! ```
//!
//! Cassandra at `CASSANDRA_CONTACT_POINTS` (default 127.0.0.1:9042). Exits non-zero when an
//! expectation fails, so the test script runs it.

use std::error::Error;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, MembershipOptions, MembershipTable,
};
use cassandra_membership_rio::CassandraMembershipStorage;
use rio_rs::object_placement::local::LocalObjectPlacement;
use rio_rs::prelude::*;
use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};

type Result<T> = std::result::Result<T, Box<dyn Error>>;

const KEYSPACE: &str = "cm_rio_example";
const TABLE: &str = "rio_members";
const SERVICE: &str = "rio-example";
const TTL: Duration = Duration::from_secs(5);
const HEARTBEAT: Duration = Duration::from_secs(1);

fn options(cluster: &str) -> CassandraClusteringOptions {
    let points: Vec<String> = std::env::var("CASSANDRA_CONTACT_POINTS")
        .unwrap_or_else(|_| "127.0.0.1:9042".into())
        .split(',')
        .map(|s| s.trim().to_owned())
        .collect();
    let mut m = MembershipOptions::default();
    m.defunct_silo_expiration = TTL; // the TTL: a stopped server's entry lives this long
    m.i_am_alive_table_publish_timeout = HEARTBEAT;
    CassandraClusteringOptions::default()
        .keyspace(KEYSPACE)
        .service_id(SERVICE)
        .cluster_id(cluster)
        .contact_points(points)
        .table(TABLE)
        .create_keyspace_simple(1)
        .request_timeout(Duration::from_secs(30))
        .ttl(true)
        .membership(m)
}

// ---- the service object -------------------------------------------------------------------

static SERVED_BY: OnceLock<String> = OnceLock::new();

/// Counts the greetings it received; says which server it lives on.
#[derive(Default, WithId, TypeName)]
struct Greeter {
    id: String,
    greeted: u32,
}

#[derive(Default, Debug, Message, TypeName, Serialize, Deserialize)]
struct Hello {
    n: u32,
}

#[derive(Default, Debug, Message, TypeName, Serialize, Deserialize)]
struct Greeting {
    text: String,
    served_by: String,
}

#[async_trait]
impl Handler<Hello> for Greeter {
    type Returns = Greeting;
    type Error = NoopError;
    async fn handle(
        &mut self,
        message: Hello,
        _: Arc<AppData>,
    ) -> std::result::Result<Greeting, NoopError> {
        self.greeted += 1;
        Ok(Greeting {
            text: format!(
                "hello #{} ({} greetings on this activation of {})",
                message.n, self.greeted, self.id
            ),
            served_by: SERVED_BY.get().cloned().unwrap_or_default(),
        })
    }
}

// ---- one server process -------------------------------------------------------------------

async fn server(cluster: String, port: u16) -> Result<()> {
    let storage = CassandraMembershipStorage::connect(options(&cluster)).await?;
    let provider = PeerToPeerClusterProvider::builder()
        .members_storage(storage)
        .interval_secs(1)
        .num_failures_threshold(2)
        .interval_secs_threshold(5)
        .build();
    let mut registry = Registry::new();
    registry.add_type::<Greeter>();
    registry.add_handler::<Greeter, Hello>();
    // rio advertises the machine's first non-loopback address with the bound port (netwatch),
    // so the server listens on every interface for its advertised address to answer.
    let mut server = Server::builder()
        .address(format!("0.0.0.0:{port}"))
        .registry(registry)
        .cluster_provider(provider)
        .object_placement_provider(LocalObjectPlacement::default())
        .build();
    server.prepare().await?;
    let listener = server.bind().await.map_err(|e| format!("{e:?}"))?;
    let advertised = Server::<
        CassandraMembershipStorage,
        PeerToPeerClusterProvider<CassandraMembershipStorage>,
        LocalObjectPlacement,
    >::try_local_addr(&listener)
    .map_err(|e| format!("{e:?}"))?;
    SERVED_BY.set(advertised.to_string()).ok();
    eprintln!("  [server {advertised}] running");
    server.run(listener).await.map_err(|e| format!("{e:?}"))?;
    Ok(())
}

// ---- the demo -----------------------------------------------------------------------------

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("0.0.0.0:0")?
        .local_addr()?
        .port())
}

fn spawn_server(cluster: &str, port: u16) -> Result<Child> {
    Ok(Command::new(std::env::current_exe()?)
        .args(["--server", cluster, &port.to_string()])
        .kill_on_drop(true)
        .spawn()?)
}

fn check(ok: bool, what: &str) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(format!("expectation failed: {what}").into())
    }
}

async fn wait_for<F, Fut>(what: &str, within: Duration, mut f: F) -> Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let t0 = Instant::now();
    while !f().await? {
        check(t0.elapsed() < within, &format!("{what} within {within:?}"))?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(t0.elapsed())
}

async fn greet(
    client: &mut rio_rs::client::Client<CassandraMembershipStorage>,
    n: u32,
) -> Result<Greeting> {
    let t0 = Instant::now();
    let reply: Greeting = client
        .send::<Greeting, NoopError>("Greeter", "alice", &Hello { n })
        .await
        .map_err(|e| format!("message {n}: {e:?}"))?;
    println!(
        "  #{n:<2} answered by {} in {:>6.0?}: {}",
        reply.served_by,
        t0.elapsed(),
        reply.text
    );
    Ok(reply)
}

async fn demo() -> Result<()> {
    let cluster = format!("demo-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let storage = CassandraMembershipStorage::connect(options(&cluster)).await?;
    let raw = CassandraMembershipTable::connect(options(&cluster)).await?;
    let expiry = raw.storage_expiry();
    println!(
        "cluster {cluster} in {KEYSPACE}.{TABLE}: TTL {:?}, slack {:?}, heartbeat {HEARTBEAT:?}",
        TTL, expiry.slack
    );

    let ports = [free_port()?, free_port()?, free_port()?];
    let mut servers: Vec<(u16, Child)> = Vec::new();
    for port in ports {
        servers.push((port, spawn_server(&cluster, port)?));
    }
    let took = wait_for("three active members", Duration::from_secs(60), || async {
        Ok(storage.active_members().await?.len() == 3)
    })
    .await?;
    let listed: Vec<String> = storage
        .members()
        .await?
        .iter()
        .map(|m| m.address())
        .collect();
    println!("three servers active after {took:.1?}: {listed:?}");

    let mut client = ClientBuilder::new()
        .members_storage(storage.clone())
        .timeout_millis(2000)
        .build()?;
    let mut last = String::new();
    for n in 1..=5 {
        last = greet(&mut client, n).await?.served_by;
    }

    // Kill the server the object lives on: no goodbye, no table write.
    let victim = servers
        .iter()
        .position(|(port, _)| last.ends_with(&format!(":{port}")))
        .ok_or("the answering server is not one of ours")?;
    let (port, mut child) = servers.remove(victim);
    child.kill().await?;
    let killed_at = Instant::now();
    println!("killed the server on port {port} (SIGKILL)");
    for n in 6..=12 {
        let reply = greet(&mut client, n).await?;
        check(
            reply.served_by != last,
            "answers come from a surviving server",
        )?;
    }
    wait_for(
        "the killed server gone from the members",
        Duration::from_secs(30),
        || async { Ok(storage.members().await?.len() == 2) },
    )
    .await?;
    println!(
        "members {:.1?} after the kill: {:?}",
        killed_at.elapsed(),
        storage
            .members()
            .await?
            .iter()
            .map(|m| m.address())
            .collect::<Vec<_>>()
    );

    // Stop everything: no process of the cluster runs any more.
    for (_, mut child) in servers {
        child.kill().await?;
    }
    let stopped = Instant::now();
    drop(client);
    drop(storage);
    println!("killed the other two servers; nothing of the cluster runs");
    let rows = || async {
        let n = raw
            .session()
            .query_unpaged(
                format!("SELECT silo, version FROM {KEYSPACE}.{TABLE} WHERE service_id = ? AND cluster_id = ?"),
                (SERVICE, cluster.as_str()),
            )
            .await?
            .into_rows_result()?
            .rows_num();
        Ok::<_, Box<dyn Error>>(n)
    };
    println!(
        "rows in the cluster's partition right after: {}",
        rows().await?
    );
    let bound = TTL + expiry.slack + Duration::from_secs(2);
    wait_for("the cluster's partition gone", bound, || async {
        Ok(rows().await? == 0)
    })
    .await?;
    let gone = stopped.elapsed();
    println!(
        "the cluster's partition is gone from Cassandra {gone:.1?} after the last server stopped (TTL {TTL:?}, bound {bound:?})"
    );
    check(
        gone + Duration::from_secs(1) >= TTL,
        "nothing expires before the TTL",
    )?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--server") {
        let cluster = args.get(2).ok_or("--server CLUSTER PORT")?.clone();
        let port = args.get(3).ok_or("--server CLUSTER PORT")?.parse()?;
        return server(cluster, port).await;
    }
    demo().await
}

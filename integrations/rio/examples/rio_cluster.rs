//! Three rio servers (separate processes, on this machine) run on Cassandra alone: membership,
//! object placement and object state all live in Cassandra (no SQLite, Postgres or Redis
//! feature of rio). A client greets a service object, whose greeting count is its persisted
//! state; the server it lives on is killed (SIGKILL), and the object is re-placed on one live
//! server, once, with its state intact. Then all stop, and the cluster's membership, placement
//! and state rows disappear from Cassandra by themselves.
//!
//! ```sh
//! cargo run -p cassandra-membership-rio --example rio_cluster
//! ```
//!
//! Cassandra at `CASSANDRA_CONTACT_POINTS` (default 127.0.0.1:9042). Exits non-zero when an
//! expectation fails, so the test script runs it.

use std::collections::BTreeSet;
use std::error::Error;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, MembershipOptions, MembershipTable,
};
use cassandra_membership_rio::{
    CassandraMembershipStorage, CassandraObjectPlacement, CassandraState, FencedClusterProvider,
    PlacementOptions, StateOptions,
};
use rio_rs::prelude::*;
use rio_rs::registry::IdentifiableType;
use rio_rs::state::{ObjectStateManager, State};
use rio_rs::{LifecycleMessage, ServiceObject, ServiceObjectStateLoad};
use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};

type Result<T> = std::result::Result<T, Box<dyn Error>>;

const KEYSPACE: &str = "cm_rio_example";
const TABLE: &str = "rio_members";
const SERVICE: &str = "rio-example";
const TTL: Duration = Duration::from_secs(5);
const HEARTBEAT: Duration = Duration::from_secs(1);
/// States live this long after their last save: longer than the failover window (`greet`
/// retries for 30 s), so a state saved just before a server dies is still there when its object
/// is activated elsewhere; short enough that the demo leaves nothing behind.
const STATE_TTL: Duration = Duration::from_secs(35);

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

fn state_options() -> StateOptions {
    let mut o = StateOptions::default();
    o.ttl = Some(STATE_TTL);
    o
}

// ---- the service object -------------------------------------------------------------------

static SERVED_BY: OnceLock<String> = OnceLock::new();

/// Counts the greetings it received (persisted) and those of this activation (in memory).
#[derive(Default, WithId, TypeName)]
struct Greeter {
    id: String,
    greetings: Greetings,
    this_activation: u32,
}

/// The greeter's persisted state.
#[derive(Default, Debug, Clone, TypeName, Serialize, Deserialize)]
struct Greetings {
    total: u32,
}

impl ServiceObject for Greeter {}

impl State<Greetings> for Greeter {
    fn get_state(&self) -> &Greetings {
        &self.greetings
    }
    fn set_state(&mut self, value: Greetings) {
        self.greetings = value;
    }
}

#[async_trait]
impl ServiceObjectStateLoad for Greeter {
    async fn load(
        &mut self,
        app_data: &AppData,
    ) -> std::result::Result<(), ServiceObjectLifeCycleError> {
        // A new greeter has no state yet: it starts at 0 (and its first save must be the first).
        let _ = self
            .load_state::<Greetings, _>(app_data.get::<CassandraState>())
            .await;
        Ok(())
    }
}

#[derive(Default, Debug, Message, TypeName, Serialize, Deserialize)]
struct Hello {
    n: u32,
}

#[derive(Default, Debug, Message, TypeName, Serialize, Deserialize)]
struct Greeting {
    text: String,
    served_by: String,
    total: u32,
    this_activation: u32,
}

/// The greeting could not be stored (another activation saved first, or Cassandra failed).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct NotSaved;

impl std::fmt::Display for NotSaved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the greeting was not saved")
    }
}

impl Error for NotSaved {}

#[async_trait]
impl Handler<Hello> for Greeter {
    type Returns = Greeting;
    type Error = NotSaved;
    async fn handle(
        &mut self,
        message: Hello,
        app_data: Arc<AppData>,
    ) -> std::result::Result<Greeting, NotSaved> {
        let mut next = self.greetings.clone();
        next.total += 1;
        let saved = std::mem::replace(&mut self.greetings, next);
        // Saved before answering: a greeting counts once it is stored. A refused save (another
        // activation wrote first, or this one started from a default state because its load
        // failed) answers an error, and the state is loaded again: rio keeps this activation,
        // so without the reload every later save would be refused too, and it would serve a
        // stale count.
        let store = app_data.get::<CassandraState>();
        if self.save_state::<Greetings, _>(store).await.is_err() {
            self.greetings = saved;
            if let Err(e) = self.load_state::<Greetings, _>(store).await {
                tracing::warn!(error = ?e, "reload after a refused save failed");
            }
            return Err(NotSaved);
        }
        self.this_activation += 1;
        Ok(Greeting {
            text: format!(
                "hello #{} ({} greetings in all, {} on this activation of {})",
                message.n, self.greetings.total, self.this_activation, self.id
            ),
            served_by: SERVED_BY.get().cloned().unwrap_or_default(),
            total: self.greetings.total,
            this_activation: self.this_activation,
        })
    }
}

// ---- one server process -------------------------------------------------------------------

async fn server(cluster: String, port: u16) -> Result<()> {
    let storage = CassandraMembershipStorage::connect(options(&cluster)).await?;
    let placement =
        CassandraObjectPlacement::connect(&storage, PlacementOptions::default()).await?;
    let state = CassandraState::connect(&storage, state_options()).await?;
    // Fenced: the server stops when its entry is Dead or gone, and serves no object while its
    // lease is at risk.
    let provider = FencedClusterProvider::new(
        PeerToPeerClusterProvider::builder()
            .members_storage(storage)
            .interval_secs(1)
            .num_failures_threshold(2)
            .interval_secs_threshold(5)
            .build(),
    );
    let mut registry = Registry::new();
    registry.add_type::<Greeter>();
    registry.add_handler::<Greeter, LifecycleMessage>();
    registry.add_handler::<Greeter, Hello>();
    let app_data = AppData::new();
    app_data.set(state);
    // rio advertises the machine's first non-loopback address with the bound port (netwatch),
    // so the server listens on every interface for its advertised address to answer.
    let mut server = Server::builder()
        .address(format!("0.0.0.0:{port}"))
        .registry(registry)
        .cluster_provider(provider)
        .object_placement_provider(placement)
        .app_data(app_data)
        .build();
    server.prepare().await?;
    let listener = server.bind().await.map_err(|e| format!("{e:?}"))?;
    let advertised = Server::<
        CassandraMembershipStorage,
        FencedClusterProvider<PeerToPeerClusterProvider<CassandraMembershipStorage>>,
        CassandraObjectPlacement,
    >::try_local_addr(&listener)
    .map_err(|e| format!("{e:?}"))?;
    SERVED_BY.set(advertised.to_string()).ok();
    eprintln!("  [server {advertised}] running");
    server.run(listener).await.map_err(|e| format!("{e:?}"))?;
    eprintln!("  [server {advertised}] stopped: its membership entry is final");
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

/// Sends `Hello { n }`, retrying while the cluster fails over (rio's client gives up after its
/// own retries, or answers an error when the server it reached lost a placement race).
async fn greet(
    client: &mut rio_rs::client::Client<CassandraMembershipStorage>,
    object: &str,
    n: u32,
) -> Result<Greeting> {
    let t0 = Instant::now();
    let mut attempts = 0;
    loop {
        attempts += 1;
        match client
            .send::<Greeting, NotSaved>("Greeter", object, &Hello { n })
            .await
        {
            Ok(reply) => {
                let retried = if attempts > 1 {
                    format!(" after {attempts} attempts")
                } else {
                    String::new()
                };
                println!(
                    "  #{n:<2} answered by {} in {:>6.0?}{retried}: {}",
                    reply.served_by,
                    t0.elapsed(),
                    reply.text
                );
                return Ok(reply);
            }
            Err(e) if t0.elapsed() < Duration::from_secs(30) => {
                tracing::debug!(n, error = ?e, "retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(format!("message {n}: {e:?} after {attempts} attempts").into()),
        }
    }
}

/// How many rows a query of one partition returns.
async fn count(raw: &CassandraMembershipTable, cql: String, key: Vec<String>) -> Result<usize> {
    Ok(raw
        .session()
        .query_unpaged(cql, key)
        .await?
        .into_rows_result()?
        .rows_num())
}

async fn demo() -> Result<()> {
    let cluster = format!("demo-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    // State belongs to the service, not the cluster: a fresh object per run.
    let object = format!("alice-{}", &cluster[5..]);
    let storage = CassandraMembershipStorage::connect(options(&cluster)).await?;
    let placement =
        CassandraObjectPlacement::connect(&storage, PlacementOptions::default()).await?;
    let state = CassandraState::connect(&storage, state_options()).await?;
    let raw = CassandraMembershipTable::connect(options(&cluster)).await?;
    let expiry = raw.storage_expiry();
    let placement_ttl = placement.ttl().ok_or("placements without TTL")?;
    println!(
        "cluster {cluster} in keyspace {KEYSPACE}: membership TTL {:?} (slack {:?}), placements TTL {placement_ttl:?}, states TTL {STATE_TTL:?}, heartbeat {HEARTBEAT:?}",
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
    let mut before = BTreeSet::new();
    for n in 1..=5 {
        let reply = greet(&mut client, &object, n).await?;
        check(reply.total == n, "every greeting counted once")?;
        before.insert(reply.served_by);
    }
    check(
        before.len() == 1,
        "one server hosts the object (one placement in Cassandra)",
    )?;
    let first = before.pop_first().unwrap_or_default();
    let placed = placement.lookup_server("Greeter", &object).await?;
    println!("placement of Greeter/{object} in Cassandra: {placed:?}");
    check(
        placed.as_deref() == Some(first.as_str()),
        "the placement names the server that answered",
    )?;

    // Kill the server the object lives on: no goodbye, no table write.
    let victim = servers
        .iter()
        .position(|(port, _)| first.ends_with(&format!(":{port}")))
        .ok_or("the answering server is not one of ours")?;
    let (port, mut child) = servers.remove(victim);
    child.kill().await?;
    let killed_at = Instant::now();
    println!("killed the server on port {port} (SIGKILL)");
    let mut after = BTreeSet::new();
    let mut activations = Vec::new();
    for n in 6..=12 {
        let reply = greet(&mut client, &object, n).await?;
        check(
            reply.total == n,
            "the state survived the kill: no greeting lost or counted twice",
        )?;
        after.insert(reply.served_by);
        activations.push(reply.this_activation);
    }
    check(
        after.len() == 1 && !after.contains(&first),
        "re-placed on one surviving server",
    )?;
    check(
        activations == (1..=7).collect::<Vec<_>>(),
        "activated exactly once there",
    )?;
    let moved = placement.lookup_server("Greeter", &object).await?;
    println!(
        "re-placed once, {:.1?} after the kill: placement {moved:?}, state version {:?}",
        killed_at.elapsed(),
        state
            .load_versioned::<Greetings>("Greeter", &object, Greetings::user_defined_type_id())
            .await?
            .map(|(_, v)| v)
    );
    check(
        moved.as_ref() == after.first(),
        "the placement names the new server",
    )?;
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
    drop((storage, placement, state));
    println!("killed the other two servers; nothing of the cluster runs");
    let ks = KEYSPACE;
    let members = || {
        count(
            &raw,
            format!("SELECT silo FROM {ks}.{TABLE} WHERE service_id = ? AND cluster_id = ?"),
            vec![SERVICE.into(), cluster.clone()],
        )
    };
    let placements = || async {
        let mut n = count(
            &raw,
            format!("SELECT server FROM {ks}.rio_placements WHERE service_id = ? AND cluster_id = ? AND object_kind = ? AND object_id = ?"),
            vec![SERVICE.into(), cluster.clone(), "Greeter".into(), object.clone()],
        )
        .await?;
        for server in [&first, after.first().ok_or("no second server")?] {
            n += count(
                &raw,
                format!("SELECT object_id FROM {ks}.rio_placements_by_server WHERE service_id = ? AND cluster_id = ? AND server = ?"),
                vec![SERVICE.into(), cluster.clone(), server.clone()],
            )
            .await?;
        }
        Ok::<_, Box<dyn Error>>(n)
    };
    let states = || {
        count(
            &raw,
            format!(
                "SELECT version FROM {ks}.rio_state WHERE service_id = ? AND object_kind = ? AND object_id = ? AND state_type = ?"
            ),
            vec![
                SERVICE.into(),
                "Greeter".into(),
                object.clone(),
                "Greetings".into(),
            ],
        )
    };
    println!(
        "rows right after: membership {}, placements {}, state {}",
        members().await?,
        placements().await?,
        states().await?
    );
    let bound = placement_ttl.max(STATE_TTL).max(TTL + expiry.slack) + Duration::from_secs(3);
    let gone = std::cell::RefCell::new([None, None, None]);
    wait_for("every row of the cluster gone", bound, || async {
        let counts = [members().await?, placements().await?, states().await?];
        for (g, c) in gone.borrow_mut().iter_mut().zip(counts) {
            if c == 0 && g.is_none() {
                *g = Some(stopped.elapsed());
            }
        }
        Ok(counts == [0, 0, 0])
    })
    .await?;
    let [m, p, s] = gone.into_inner().map(|g| g.unwrap_or_default());
    println!(
        "gone from Cassandra after the last server stopped: membership {m:.1?} (TTL {TTL:?}), placements {p:.1?} (TTL {placement_ttl:?}), state {s:.1?} (TTL {STATE_TTL:?} from the last save)"
    );
    check(
        m + Duration::from_secs(1) >= TTL,
        "no membership row expires before the TTL",
    )?;
    check(
        p + Duration::from_secs(1) >= m,
        "no placement expires before its server's entry",
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

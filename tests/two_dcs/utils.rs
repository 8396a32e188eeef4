//! The two-DC ring's plumbing: its nodes, sessions, the keyspace, options, node signals.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, ConsistencyProfile, MembershipEntry,
    MembershipTable, SiloAddress, SiloStatus, Timestamp,
};
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::cluster::{ClusterState, NodeRef};
use scylla::policies::load_balancing::{FallbackPlan, LoadBalancingPolicy, RoutingInfo};
use scylla::routing::Shard;
use tokio::sync::{Mutex, MutexGuard, OnceCell};

/// The keyspace of these tests: one replica in each DC, dropped and made anew once per run.
pub(crate) const KEYSPACE: &str = "cm_dcs";
/// The per-statement timeout of the tables under test.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// One test at a time: outages and tracing need the ring to themselves.
static SERIAL: Mutex<()> = Mutex::const_new(());
static KEYSPACE_READY: OnceCell<()> = OnceCell::const_new();

/// Node index of dc1's node (`CASSANDRA_FIRST_NODE`, default 6); dc2's is the next.
pub(crate) fn dc1_node() -> u32 {
    std::env::var("CASSANDRA_FIRST_NODE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6)
}

pub(crate) fn dc2_node() -> u32 {
    dc1_node() + 1
}

pub(crate) fn address(node: u32) -> std::net::IpAddr {
    std::net::IpAddr::from([127, 0, 0, node as u8])
}

pub(crate) fn dc1_point() -> String {
    format!("{}:9042", address(dc1_node()))
}

pub(crate) fn dc2_point() -> String {
    format!("{}:9042", address(dc2_node()))
}

/// Takes the ring for one test, healed, with the keyspace in place.
pub(crate) async fn serial() -> MutexGuard<'static, ()> {
    let guard = SERIAL.lock().await;
    heal().await;
    keyspace().await;
    guard
}

pub(crate) fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// `local_quorum` pinned to dc1, both nodes as contact points.
pub(crate) fn local(cluster: &str) -> CassandraClusteringOptions {
    CassandraClusteringOptions::default()
        .keyspace(KEYSPACE)
        .service_id("dcs")
        .cluster_id(cluster)
        .contact_points([dc1_point(), dc2_point()])
        .consistency(ConsistencyProfile::LocalQuorum)
        .serial_datacenter("dc1")
        .request_timeout(REQUEST_TIMEOUT)
}

/// `quorum`, dc1 tried first.
pub(crate) fn global(cluster: &str) -> CassandraClusteringOptions {
    CassandraClusteringOptions::default()
        .keyspace(KEYSPACE)
        .service_id("dcs")
        .cluster_id(cluster)
        .contact_points([dc1_point(), dc2_point()])
        .serial_datacenter("dc1")
        .request_timeout(REQUEST_TIMEOUT)
}

pub(crate) async fn connect(options: CassandraClusteringOptions) -> CassandraMembershipTable {
    CassandraMembershipTable::connect(options)
        .await
        .expect("connect to the two-DC ring")
}

/// A plain session to both nodes (the driver's default policy: no DC preference).
pub(crate) async fn session() -> Arc<Session> {
    build(SessionBuilder::new()).await
}

async fn build(builder: SessionBuilder) -> Arc<Session> {
    let points = [dc1_point(), dc2_point()];
    Arc::new(
        builder
            .known_nodes(points.clone())
            .connection_timeout(Duration::from_secs(5))
            .build()
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "no two-DC ring answers at {points:?} ({e}): start one with \
                     `CASSANDRA_FIRST_NODE=6 scripts/cassandra.sh start-dcs dc1 dc2`, or run `scripts/test.sh`"
                )
            }),
    )
}

/// Sends each request to the next node of the ring in turn, whatever its DC: the kind of
/// session a host may hand to `with_session`.
#[derive(Debug, Default)]
pub(crate) struct RoundRobin(AtomicUsize);

impl LoadBalancingPolicy for RoundRobin {
    fn pick<'a>(
        &'a self,
        _request: &'a RoutingInfo,
        cluster: &'a ClusterState,
    ) -> Option<(NodeRef<'a>, Option<Shard>)> {
        let nodes = cluster.get_nodes_info();
        if nodes.is_empty() {
            return None;
        }
        let k = self.0.fetch_add(1, Ordering::Relaxed) % nodes.len();
        Some((&nodes[k], None))
    }

    fn fallback<'a>(
        &'a self,
        _request: &'a RoutingInfo,
        cluster: &'a ClusterState,
    ) -> FallbackPlan<'a> {
        let nodes = cluster.get_nodes_info();
        let k = self.0.fetch_add(1, Ordering::Relaxed);
        Box::new((0..nodes.len()).map(move |i| (&nodes[(k + i) % nodes.len()], None)))
    }

    fn name(&self) -> String {
        "RoundRobin".into()
    }
}

/// A session whose default profile round-robins over both DCs.
pub(crate) async fn round_robin_session() -> Arc<Session> {
    let profile = scylla::client::execution_profile::ExecutionProfile::builder()
        .load_balancing_policy(Arc::new(RoundRobin::default()))
        .build();
    build(SessionBuilder::new().default_execution_profile_handle(profile.into_handle())).await
}

async fn keyspace() {
    KEYSPACE_READY
        .get_or_init(|| async {
            let s = session().await;
            s.query_unpaged(format!("DROP KEYSPACE IF EXISTS {KEYSPACE}"), ())
                .await
                .expect("drop the previous run's keyspace");
            s.query_unpaged(
                format!(
                    "CREATE KEYSPACE {KEYSPACE} WITH replication = \
                     {{'class': 'NetworkTopologyStrategy', 'dc1': 1, 'dc2': 1}}"
                ),
                (),
            )
            .await
            .expect("create the two-DC keyspace");
            s.await_schema_agreement().await.expect("schema agreement");
        })
        .await;
}

/// `scripts/cassandra.sh COMMAND ARGS...`.
pub(crate) fn script(args: &[&str]) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/cassandra.sh");
    let status = Command::new("bash")
        .arg(path)
        .args(args)
        .status()
        .expect("run scripts/cassandra.sh");
    assert!(status.success(), "scripts/cassandra.sh {args:?} failed");
}

pub(crate) fn cql_up(node: u32) -> bool {
    std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::new(address(node), 9042),
        Duration::from_secs(1),
    )
    .is_ok()
}

/// Restarts a killed node and waits until both nodes see each other and agree on schema.
pub(crate) async fn heal() {
    for node in [dc1_node(), dc2_node()] {
        if !cql_up(node) {
            script(&["restart", &node.to_string()]);
        }
    }
    let s = tokio::time::timeout(Duration::from_secs(60), session())
        .await
        .expect("a session to the healed ring within 60 s");
    crate::ring::await_healed(&s, 1).await;
}

/// Kills dc2's node and waits until dc1's node has marked it down (then a coordinator answers
/// `Unavailable` at once instead of waiting for a replica that never answers).
pub(crate) async fn kill_dc2() {
    script(&["kill", &dc2_node().to_string()]);
    let down = format!("DN  {}", address(dc2_node()));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = Command::new("bash")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/cassandra.sh"))
            .args(["nodetool", &dc1_node().to_string(), "status"])
            .output()
            .expect("run nodetool status");
        if String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l.starts_with(&down))
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "dc1's node did not mark dc2's down within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Every operation of the contract once, on a table with expiry on (its TTL reads too).
pub(crate) async fn every_operation(table: &CassandraMembershipTable, cluster: &str) {
    table.initialize(true).await.expect("initialize");
    let address = SiloAddress::new(std::net::SocketAddr::from(([10, 2, 0, 1], 11111)), 7).unwrap();
    let mut entry = MembershipEntry::new(address, SiloStatus::Joining, Timestamp::now());
    let v = table.read_all().await.expect("read_all").version;
    assert!(table.insert_row(&entry, &v.next()).await.expect("insert"));
    table
        .update_i_am_alive(&address, Timestamp::now())
        .await
        .expect("heartbeat");
    let snapshot = table.read_row(&address).await.expect("read_row");
    let row = snapshot.rows.first().expect("the row").clone();
    entry.status = SiloStatus::Dead;
    assert!(
        table
            .update_row(&entry, &row.etag, &snapshot.version.next())
            .await
            .expect("update")
    );
    let removed = table
        .cleanup_defunct(Timestamp::now().saturating_add(Duration::from_secs(60)))
        .await
        .expect("cleanup");
    assert_eq!(removed, 1, "cleanup removed the Dead entry");
    table.delete_cluster(cluster).await.expect("delete_cluster");
}

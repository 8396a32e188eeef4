//! Shared test plumbing: the node's address and kind, sessions, a keyspace per run, unique names.

use std::sync::Arc;
use std::time::Duration;

use cassandra_membership::{CassandraClusteringOptions, CassandraMembershipTable};
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use tokio::sync::OnceCell;

/// The keyspace every test table lives in (dropped and re-created once per run). Set
/// `CM_TEST_KEYSPACE` at build time to give concurrent runs against one node their own.
pub(crate) const KEYSPACE: &str = match option_env!("CM_TEST_KEYSPACE") {
    Some(k) => k,
    None => "cm_test",
};

/// `CASSANDRA_CONTACT_POINTS` (default `127.0.0.1:9042`), each as `ip:port`: a bare address gets
/// CQL's port 9042, as the driver would give it (the fault-injecting proxy needs the port).
pub(crate) fn contact_points() -> Vec<String> {
    std::env::var("CASSANDRA_CONTACT_POINTS")
        .unwrap_or_else(|_| "127.0.0.1:9042".into())
        .split(',')
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .map(|s| match s.parse::<std::net::IpAddr>() {
            Ok(ip) => std::net::SocketAddr::new(ip, 9042).to_string(),
            Err(_) => s.to_owned(),
        })
        .collect()
}

/// The kind of node the tests run against, from `CASSANDRA_BACKEND`: `cassandra` (the default) or
/// `scylla`. The provider's contract is the same on both; a test whose expectation differs says so
/// and asserts each backend's own, and Cassandra-only tests live in `cassandra_only`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backend {
    /// Apache Cassandra 5.0.
    Cassandra,
    /// ScyllaDB (tablets off, so conditional writes work: see docker-compose.yml).
    Scylla,
}

/// The backend named by `CASSANDRA_BACKEND`. Panics on any other value: a typo must not run the
/// Cassandra expectations against a ScyllaDB node, or the other way round.
pub(crate) fn backend() -> Backend {
    match std::env::var("CASSANDRA_BACKEND").as_deref() {
        Err(_) | Ok("" | "cassandra") => Backend::Cassandra,
        Ok("scylla") => Backend::Scylla,
        Ok(other) => panic!("CASSANDRA_BACKEND={other:?}: expected \"cassandra\" or \"scylla\""),
    }
}

/// `CASSANDRA_LOCAL_DC`: on a multi-DC ring, the DC the tests' clusters live in. Their tables use
/// `local_quorum` with it as `serial_datacenter`, and the tests' own sessions prefer it (a raw
/// read coordinated in another DC could miss what LOCAL_QUORUM wrote).
pub(crate) fn local_dc() -> Option<String> {
    std::env::var("CASSANDRA_LOCAL_DC")
        .ok()
        .filter(|d| !d.is_empty())
}

/// A new session. Panics with instructions when no node answers: these tests never skip.
pub(crate) async fn session() -> Arc<Session> {
    let points = contact_points();
    let mut builder = SessionBuilder::new();
    if let Some(dc) = local_dc() {
        let policy = scylla::policies::load_balancing::DefaultPolicy::builder()
            .prefer_datacenter(dc)
            .permit_dc_failover(false)
            .build();
        let profile = scylla::client::execution_profile::ExecutionProfile::builder()
            .load_balancing_policy(policy)
            .build();
        builder = builder.default_execution_profile_handle(profile.into_handle());
    }
    match builder
        .known_nodes(&points)
        .connection_timeout(Duration::from_secs(5))
        .build()
        .await
    {
        Ok(s) => Arc::new(s),
        Err(e) => panic!(
            "no Cassandra node answers at {points:?} ({e}). Start one with `scripts/cassandra.sh start` \
             or run the whole suite with `scripts/test.sh`; set CASSANDRA_CONTACT_POINTS for another node."
        ),
    }
}

static KEYSPACE_READY: OnceCell<()> = OnceCell::const_new();

/// The replication factor the test keyspace uses: 1 for one node, 3 with three.
pub(crate) fn replication_factor() -> u32 {
    std::env::var("CASSANDRA_RF")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// The test keyspace's replication: `CASSANDRA_DC_REPLICATION` (`dc1:1,dc2:1`, a multi-DC ring)
/// as NetworkTopologyStrategy, else SimpleStrategy with [`replication_factor`].
fn replication() -> String {
    match std::env::var("CASSANDRA_DC_REPLICATION") {
        Ok(dcs) if !dcs.is_empty() => {
            let mut map = String::from("'class': 'NetworkTopologyStrategy'");
            for pair in dcs.split(',') {
                let (dc, factor) = pair
                    .split_once(':')
                    .unwrap_or_else(|| panic!("CASSANDRA_DC_REPLICATION={dcs:?}: dc:factor,..."));
                let factor: u32 = factor.trim().parse().expect("a replication factor");
                map.push_str(&format!(", '{}': {factor}", dc.trim()));
            }
            map
        }
        _ => format!(
            "'class': 'SimpleStrategy', 'replication_factor': {}",
            replication_factor()
        ),
    }
}

/// A session with the test keyspace created.
pub(crate) async fn session_with_keyspace() -> Arc<Session> {
    let s = session().await;
    KEYSPACE_READY
        .get_or_init(|| async {
            // A fresh keyspace per run: nothing an earlier run left can change this one.
            s.query_unpaged(format!("DROP KEYSPACE IF EXISTS {KEYSPACE}"), ())
                .await
                .expect("drop the previous run's keyspace");
            let cql = format!(
                "CREATE KEYSPACE IF NOT EXISTS {KEYSPACE} WITH replication = {{{}}}",
                replication()
            );
            s.query_unpaged(cql, ())
                .await
                .expect("create the test keyspace");
            s.await_schema_agreement().await.expect("schema agreement");
        })
        .await;
    s
}

/// A name nobody else uses in this run.
pub(crate) fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// Options for a unique cluster in the shared test table.
pub(crate) fn options(cluster_id: &str) -> CassandraClusteringOptions {
    let o = CassandraClusteringOptions::default()
        .keyspace(KEYSPACE)
        .service_id("test-service")
        .cluster_id(cluster_id)
        .contact_points(contact_points());
    match local_dc() {
        Some(dc) => o
            .consistency(cassandra_membership::ConsistencyProfile::LocalQuorum)
            .serial_datacenter(dc),
        None => o,
    }
}

/// An uninitialized table for `cluster_id` on `session`.
pub(crate) fn table_on(
    session: &Arc<Session>,
    options: CassandraClusteringOptions,
) -> CassandraMembershipTable {
    CassandraMembershipTable::with_session(Arc::clone(session), options).expect("valid options")
}

/// How many rows `cql` returns: tests look at what is stored, bypassing the provider.
pub(crate) async fn count_rows(
    s: &Session,
    cql: String,
    values: impl scylla::serialize::row::SerializeRow,
) -> usize {
    s.query_unpaged(cql, values)
        .await
        .expect("raw query")
        .into_rows_result()
        .expect("rows")
        .rows_num()
}

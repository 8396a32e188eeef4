//! The bench keyspace and its fixtures: session, provider tables, generated silos, warm-up.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, MembershipEntry, MembershipOptions,
    MembershipTable, SiloAddress, SiloStatus, Timestamp,
};
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;

/// The bench keyspace (`CM_BENCH_KEYSPACE`, default `cm_bench`): dropped and re-created at the start,
/// so two runs against one node need two names.
pub(crate) static KS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    std::env::var("CM_BENCH_KEYSPACE").unwrap_or_else(|_| "cm_bench".into())
});

/// Replication factor of the bench keyspace (`CASSANDRA_RF`, default 1; 3 on the three-node ring).
pub(crate) fn replication_factor() -> u32 {
    std::env::var("CASSANDRA_RF")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// The bench keyspace's replication: `CASSANDRA_DC_REPLICATION` (`dc1:1,dc2:1`) as
/// NetworkTopologyStrategy, else SimpleStrategy with [`replication_factor`].
pub(crate) fn replication() -> String {
    match std::env::var("CASSANDRA_DC_REPLICATION") {
        Ok(dcs) if !dcs.is_empty() => {
            let mut map = String::from("'class': 'NetworkTopologyStrategy'");
            for pair in dcs.split(',') {
                let (dc, factor) = pair.split_once(':').unwrap_or((pair, "1"));
                map.push_str(&format!(", '{}': {}", dc.trim(), factor.trim()));
            }
            map
        }
        _ => format!(
            "'class': 'SimpleStrategy', 'replication_factor': {}",
            replication_factor()
        ),
    }
}

pub(crate) type Res<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

pub(crate) fn address(n: u32, generation: i32) -> SiloAddress {
    SiloAddress::from_v4(
        std::net::SocketAddrV4::new(
            std::net::Ipv4Addr::new(10, (n >> 16) as u8, (n >> 8) as u8, n as u8),
            11111,
        ),
        generation,
    )
}

pub(crate) fn entry(n: u32) -> MembershipEntry {
    let mut e = MembershipEntry::new(address(n, 1), SiloStatus::Active, Timestamp::now());
    e.host_name = format!("host-{n}");
    e.silo_name = format!("silo-{n}");
    e.proxy_port = 30000;
    e
}

pub(crate) async fn session() -> Res<Arc<Session>> {
    let points =
        std::env::var("CASSANDRA_CONTACT_POINTS").unwrap_or_else(|_| "127.0.0.1:9042".into());
    let s = SessionBuilder::new()
        .known_nodes(points.split(','))
        .build()
        .await?;
    Ok(Arc::new(s))
}

pub(crate) fn opts(cluster: &str, table: &str, ttl: bool) -> CassandraClusteringOptions {
    let mut m = MembershipOptions::default();
    m.defunct_silo_expiration = Duration::from_secs(3600);
    CassandraClusteringOptions::default()
        .keyspace(KS.as_str())
        .service_id("bench")
        .cluster_id(cluster)
        .table(table)
        .ttl(ttl)
        .membership(m)
}

pub(crate) async fn provider(
    s: &Arc<Session>,
    cluster: &str,
    table: &str,
    ttl: bool,
) -> Res<CassandraMembershipTable> {
    let t = CassandraMembershipTable::with_session(Arc::clone(s), opts(cluster, table, ttl))?;
    t.initialize(true).await?;
    Ok(t)
}

pub(crate) async fn fill(t: &CassandraMembershipTable, from: u32, to: u32) -> Res<()> {
    for n in from..to {
        let v = t.read_all().await?.version;
        if !t.insert_row(&entry(n), &v.next()).await? {
            return Err("insert failed".into());
        }
    }
    Ok(())
}

/// Ten seconds of mixed traffic first, so the node's JIT has compiled the paths measured.
pub(crate) async fn warm_up(s: &Arc<Session>) -> Res<()> {
    let t = provider(s, "warm-up", "membership", false).await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut n = 0;
    while Instant::now() < deadline {
        let v = t.read_all().await?.version;
        t.insert_row(&entry(50_000 + n), &v.next()).await?;
        t.update_i_am_alive(&entry(50_000 + n).address, Timestamp::now())
            .await?;
        t.read_row(&entry(50_000 + n).address).await?;
        n += 1;
    }
    t.delete_cluster("warm-up").await?;
    Ok(())
}

//! Storage-side expiry on the real node, one module per behaviour: the contract point by point,
//! the `ttl_mismatch` policies, silos of one cluster on different settings, what delete and
//! cleanup leave behind, and expiry under transient faults. Here, what most of them share: a
//! table of their own per test with expiry on (TTL 4 s), rows planted with raw CQL as another
//! program or an older release writes them, raw TTL reads, heartbeaters.

mod contract;
mod leftovers;
mod mixed_settings;
mod policies;
mod under_faults;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, HeartbeatOutcome, MembershipEntry,
    MembershipOptions, MembershipTable, Timestamp,
};
use scylla::client::session::Session;
use scylla::value::CqlTimestamp;

use crate::utils::{KEYSPACE, count_rows, options, unique};

const TTL: u64 = 4;
/// Every write with TTL 4 s carries 4 + 1 (renewal) + 1 s.
const WRITE_TTL: i32 = 6;

fn table_name() -> String {
    unique("pol").replace('-', "_")[..24].to_owned()
}

fn ttl_on(o: CassandraClusteringOptions) -> CassandraClusteringOptions {
    let mut m = MembershipOptions::default();
    m.defunct_silo_expiration = Duration::from_secs(TTL);
    m.i_am_alive_table_publish_timeout = Duration::from_millis(500);
    o.ttl(true).membership(m)
}

/// Options for `service`/`cluster` in `table`.
fn opts(table: &str, service: &str, cluster: &str) -> CassandraClusteringOptions {
    options(cluster).table(table).service_id(service)
}

async fn insert(t: &dyn MembershipTable, e: &MembershipEntry) {
    for _ in 0..20 {
        let v = t.read_all().await.unwrap().version;
        if t.insert_row(e, &v.next()).await.unwrap() {
            return;
        }
    }
    panic!("insert kept losing races");
}

/// (silo, TTL(entry)) of every entry row of a partition, and TTL(version_etag) (row '').
async fn ttls(
    s: &Session,
    table: &str,
    service: &str,
    cluster: &str,
) -> (Vec<(String, Option<i32>)>, Option<i32>) {
    let rows: Vec<(Option<String>, Option<i32>, Option<i32>)> = s
        .query_unpaged(
            format!("SELECT silo, TTL(entry), TTL(version_etag) FROM {KEYSPACE}.{table} WHERE service_id = ? AND cluster_id = ?"),
            (service, cluster),
        )
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .rows()
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    let version = rows
        .iter()
        .find(|r| r.0.as_deref() == Some(""))
        .and_then(|r| r.2);
    (
        rows.into_iter()
            .filter_map(|(silo, t, _)| silo.filter(|s| !s.is_empty()).map(|s| (s, t)))
            .collect(),
        version,
    )
}

/// The keys of a partition's heartbeat cells, as stored.
async fn heartbeat_keys(s: &Session, table: &str, cluster: &str) -> Vec<String> {
    type Cell = (Option<CqlTimestamp>, Option<CqlTimestamp>);
    let rows: Vec<(Option<String>, Option<Cell>)> = s
        .query_unpaged(
            format!("SELECT silo, heartbeat FROM {KEYSPACE}.{table} WHERE service_id = 'svc' AND cluster_id = ?"),
            (cluster,),
        )
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .rows()
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    rows.into_iter()
        .filter_map(|(silo, cell)| cell.and(silo))
        .collect()
}

async fn raw_partition(s: &Session, table: &str, service: &str, cluster: &str) -> usize {
    count_rows(
        s,
        format!("SELECT silo, version, heartbeat FROM {KEYSPACE}.{table} WHERE service_id = ? AND cluster_id = ?"),
        (service, cluster),
    )
    .await
}

/// Writes a complete entry row by hand, as another program or an older binary would.
#[allow(clippy::too_many_arguments)]
async fn plant_row(
    s: &Session,
    table: &str,
    service: &str,
    cluster: &str,
    silo: &str,
    status: i32,
    i_am_alive: i64,
    ttl: i32,
) {
    s.query_unpaged(
        format!(
            "UPDATE {KEYSPACE}.{table} USING TTL ? SET entry = {{etag: ?, status: ?, suspect_times: [], proxy_port: 30000, \
             host_name: 'h', silo_name: 's', role_name: 'r', update_zone: 1, fault_zone: 2, start_time: ?, \
             i_am_alive: ?}} WHERE service_id = ? AND cluster_id = ? AND silo = ?"
        ),
        (
            ttl,
            uuid::Uuid::new_v4(),
            status,
            CqlTimestamp(1_000),
            CqlTimestamp(i_am_alive),
            service,
            cluster,
            silo,
        ),
    )
    .await
    .expect("plant a row");
}

fn heartbeater(
    t: Arc<CassandraMembershipTable>,
    e: MembershipEntry,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            match t.update_i_am_alive(&e.address, Timestamp::now()).await {
                Ok(HeartbeatOutcome::Refreshed { .. }) => {}
                other => panic!("a live silo's heartbeat: {other:?}"),
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
}

/// Reads every 200 ms for `how_long`: every entry of `expected` is there and the version never
/// goes back. Returns the last version seen.
async fn watch_entries(
    t: &CassandraMembershipTable,
    expected: &[&MembershipEntry],
    how_long: Duration,
    mut version: u64,
) -> u64 {
    let started = Instant::now();
    let mut samples = 0;
    while started.elapsed() < how_long {
        let snapshot = t.read_all().await.unwrap();
        for e in expected {
            assert!(
                snapshot.get(&e.address).is_some(),
                "entry {} vanished after {:?} (sample {samples})",
                e.address,
                started.elapsed()
            );
        }
        assert!(
            snapshot.version.version >= version,
            "the version went back from {version} to {} after {:?}",
            snapshot.version.version,
            started.elapsed()
        );
        version = snapshot.version.version;
        samples += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(samples > 10);
    version
}

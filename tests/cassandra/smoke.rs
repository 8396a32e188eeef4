//! Proves the node is a real node of the configured backend (`CASSANDRA_BACKEND`): TTL on a write
//! is visible and the row expires.

use std::time::Duration;

use crate::utils::{Backend, KEYSPACE, backend, count_rows, session_with_keyspace, unique};

#[tokio::test]
async fn the_node_is_the_configured_backend_and_expires_ttl_writes() {
    let s = session_with_keyspace().await;
    let version: (String,) = s
        .query_unpaged("SELECT release_version FROM system.local", ())
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .single_row()
        .unwrap();
    // ScyllaDB announces its shards in the protocol handshake (the driver then has a sharder for
    // the node); Apache Cassandra does not. ScyllaDB reports a fixed Cassandra-compatible
    // release_version, so the version check is Cassandra's alone.
    let shard_aware = s
        .get_cluster_state()
        .get_nodes_info()
        .iter()
        .any(|node| node.sharder().is_some());
    match backend() {
        Backend::Cassandra => {
            // The release scripts/cassandra.sh starts: CASSANDRA_VERSION (x.y.z), 5.0 by default.
            let expected = std::env::var("CASSANDRA_VERSION")
                .ok()
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| "5.0".into());
            let release: Vec<&str> = expected.split('.').take(2).collect();
            let release = release.join(".");
            assert!(
                version.0.starts_with(&format!("{release}.")) || version.0 == release,
                "expected Apache Cassandra {release} (CASSANDRA_VERSION={expected}), found \
                 release_version {}",
                version.0
            );
            assert!(
                !shard_aware,
                "the node announces ScyllaDB shards: set CASSANDRA_BACKEND=scylla for a ScyllaDB node"
            );
        }
        Backend::Scylla => assert!(
            shard_aware,
            "expected ScyllaDB (a shard-aware node), found a node without shards reporting \
             release_version {}: unset CASSANDRA_BACKEND for Apache Cassandra",
            version.0
        ),
    }

    let table = unique("smoke").replace('-', "_");
    s.query_unpaged(
        format!("CREATE TABLE {KEYSPACE}.{table} (k int PRIMARY KEY, v text)"),
        (),
    )
    .await
    .unwrap();
    s.await_schema_agreement().await.unwrap();
    s.query_unpaged(
        format!("INSERT INTO {KEYSPACE}.{table} (k, v) VALUES (1, 'x') USING TTL 2"),
        (),
    )
    .await
    .unwrap();
    let (ttl,): (Option<i32>,) = s
        .query_unpaged(
            format!("SELECT TTL(v) FROM {KEYSPACE}.{table} WHERE k = 1"),
            (),
        )
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .single_row()
        .unwrap();
    assert!(matches!(ttl, Some(1..=2)), "TTL(v) = {ttl:?}");
    tokio::time::sleep(Duration::from_millis(3200)).await;
    let rows = count_rows(
        &s,
        format!("SELECT v FROM {KEYSPACE}.{table} WHERE k = 1"),
        (),
    )
    .await;
    assert_eq!(rows, 0, "the row must be gone after its TTL");
    s.query_unpaged(format!("DROP TABLE {KEYSPACE}.{table}"), ())
        .await
        .unwrap();
}

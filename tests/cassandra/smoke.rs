//! Proves the node is a real Cassandra: TTL on a write is visible and the row expires.

use std::time::Duration;

use crate::utils::{KEYSPACE, count_rows, session_with_keyspace, unique};

#[tokio::test]
async fn the_node_is_a_real_cassandra_that_expires_ttl_writes() {
    let s = session_with_keyspace().await;
    let version: (String,) = s
        .query_unpaged("SELECT release_version FROM system.local", ())
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .single_row()
        .unwrap();
    assert!(
        version.0.starts_with("5.0"),
        "expected Apache Cassandra 5.0, found {}",
        version.0
    );

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

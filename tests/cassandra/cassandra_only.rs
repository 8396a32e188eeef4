//! Cassandra-only: Apache Cassandra 5.0 behaviour that the provider guards against and ScyllaDB does
//! not share (or has not been shown to share). `scripts/test.sh` excludes this module by name
//! (`--skip cassandra_only::`) when `CASSANDRA_BACKEND=scylla`, and prints the names it excludes;
//! run against ScyllaDB anyway, every test here fails instead of passing.

use std::time::{SystemTime, UNIX_EPOCH};

use cassandra_membership::cassandra::{EXPIRY_HORIZON_UNIX_SECONDS, MAX_TTL_SECONDS};

use crate::utils::{Backend, KEYSPACE, backend, session_with_keyspace, unique};

fn require_cassandra() {
    assert_eq!(
        backend(),
        Backend::Cassandra,
        "a Cassandra-only test ran against ScyllaDB; scripts/test.sh excludes cassandra_only:: there"
    );
}

/// The provider rejects a TTL whose cells would expire after `EXPIRY_HORIZON_UNIX_SECONDS`
/// because Cassandra 5.0, under its default `storage_compatibility_mode: CASSANDRA_4`, rejects
/// such writes: the provider's horizon is the server's (checked a minute either side).
#[tokio::test]
async fn writes_expiring_past_the_2038_horizon_are_rejected() {
    require_cassandra();
    let s = session_with_keyspace().await;
    let table = unique("horizon").replace('-', "_");
    s.query_unpaged(
        format!("CREATE TABLE {KEYSPACE}.{table} (k int PRIMARY KEY, v text)"),
        (),
    )
    .await
    .unwrap();
    s.await_schema_agreement().await.unwrap();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let to_horizon = EXPIRY_HORIZON_UNIX_SECONDS - now;
    assert!(
        to_horizon > 120 && to_horizon as u64 + 60 <= MAX_TTL_SECONDS,
        "the horizon is within Cassandra's TTL range from now"
    );
    let insert =
        |ttl: i64| format!("INSERT INTO {KEYSPACE}.{table} (k, v) VALUES (1, 'x') USING TTL {ttl}");

    s.query_unpaged(insert(to_horizon - 60), ())
        .await
        .expect("a cell expiring a minute before the horizon is accepted");
    let past = s
        .query_unpaged(insert(to_horizon + 60), ())
        .await
        .expect_err("a cell expiring a minute after the horizon is rejected");
    assert!(
        past.to_string().contains("2038-01-19T03:14:06"),
        "the rejection names the horizon: {past}"
    );

    s.query_unpaged(format!("DROP TABLE {KEYSPACE}.{table}"), ())
        .await
        .unwrap();
}

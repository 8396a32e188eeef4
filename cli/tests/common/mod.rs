//! What the CLI's node tests share: where the node is, the test keyspace, a connection that
//! panics with instructions when no node answers, and the binary without the caller's
//! environment. Each test binary uses part of it.
#![allow(dead_code)]

use std::time::Duration;

use assert_cmd::Command;
use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, MembershipEntry, MembershipTable,
    SiloAddress, SiloStatus, Timestamp,
};

/// The service id every test cluster runs under.
pub(crate) const SERVICE: &str = "shop";

pub(crate) fn contact_points() -> String {
    std::env::var("CASSANDRA_CONTACT_POINTS").unwrap_or_else(|_| "127.0.0.1:9042".into())
}

pub(crate) fn keyspace() -> String {
    std::env::var("CM_CLI_TEST_KEYSPACE").unwrap_or_else(|_| "cm_cli_test".into())
}

pub(crate) fn addr(text: &str) -> SiloAddress {
    text.parse().unwrap()
}

/// Options of cluster `cluster` of `table` in the test keyspace (created with replication 1
/// if missing); a generous timeout: the node is shared and conditional writes can be slow.
pub(crate) fn options(table: &str, cluster: &str) -> CassandraClusteringOptions {
    CassandraClusteringOptions::default()
        .keyspace(keyspace())
        .service_id(SERVICE)
        .cluster_id(cluster)
        .contact_points(contact_points().split(','))
        .table(table)
        .create_keyspace_simple(1)
        .request_timeout(Duration::from_secs(30))
}

/// Connects (nothing is created). Panics with instructions when no node answers: these tests
/// never skip.
pub(crate) async fn connect(o: CassandraClusteringOptions) -> CassandraMembershipTable {
    CassandraMembershipTable::connect(o)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "no Cassandra node answers at {} ({e}); start one with scripts/cassandra.sh start",
                contact_points()
            )
        })
}

/// The binary with no CASSANDRA_MEMBERSHIP_* variable nor RUST_LOG from the caller's
/// environment, no default config file (XDG_CONFIG_HOME points at nothing), killed after
/// `timeout`.
pub(crate) fn bare(timeout: Duration) -> Command {
    let mut c = Command::cargo_bin("cassandra-membership").unwrap();
    for (k, _) in std::env::vars() {
        if k.starts_with("CASSANDRA_MEMBERSHIP_") {
            c.env_remove(k);
        }
    }
    c.env_remove("RUST_LOG")
        .env(
            "XDG_CONFIG_HOME",
            std::env::temp_dir().join("cm-cli-no-config-here"),
        )
        .timeout(timeout);
    c
}

/// [`bare`] with the flags that reach `table` in the test keyspace.
pub(crate) fn connected(timeout: Duration, table: &str) -> Command {
    let mut c = bare(timeout);
    c.args([
        "--contact-points",
        &contact_points(),
        "--keyspace",
        &keyspace(),
        "--table",
        table,
        "--request-timeout",
        "30s",
    ]);
    c
}

/// Runs, expects exit `code`, returns (stdout, stderr).
pub(crate) fn exits(c: &mut Command, code: i32) -> (String, String) {
    let out = c.output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    (stdout, stderr)
}

/// Cluster `cluster` on a new table of its own (returned with the table's name), initialized,
/// with one Active silo, 10.0.0.1:11111@1.
pub(crate) async fn cluster_with_one_active_silo(
    cluster: &str,
) -> (String, CassandraMembershipTable) {
    let table = format!("t_{}", uuid::Uuid::new_v4().simple());
    let t = connect(options(&table, cluster)).await;
    t.initialize(true)
        .await
        .expect("initialize the test cluster");
    let version = t.read_all().await.unwrap().version;
    let entry = MembershipEntry::new(
        addr("10.0.0.1:11111@1"),
        SiloStatus::Active,
        Timestamp::now(),
    );
    assert!(t.insert_row(&entry, &version.next()).await.unwrap());
    (table, t)
}

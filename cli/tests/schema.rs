//! `cassandra-membership schema` against the real node at `CASSANDRA_CONTACT_POINTS`: the DDL it
//! prints, run on a fresh keyspace, is the schema the provider accepts and uses without creating
//! anything. (The grants are not exercised here: the one-node lane's node runs without
//! authentication, where `GRANT` is refused; the crate's unit tests check their text.)

use std::time::Duration;

use cassandra_membership::{
    CassandraClusteringOptions, MembershipEntry, MembershipTable, SiloStatus, Timestamp,
};
use serde_json::Value;

mod common;
use common::{SERVICE, addr, connect, contact_points};

const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// `schema --role silo --json` for `keyspace.table`, with `extra` global flags; no node is
/// contacted.
fn printed_schema(keyspace: &str, table: &str, extra: &[&str]) -> Value {
    let out = common::bare(COMMAND_TIMEOUT)
        // Nothing listens there: the command must not connect.
        .args(["--contact-points", "127.0.0.1:1", "--keyspace", keyspace])
        .args(["--table", table, "--json"])
        .args(extra)
        .args(["schema", "--role", "silo"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

fn options(keyspace: &str, table: &str, ttl: bool) -> CassandraClusteringOptions {
    CassandraClusteringOptions::default()
        .keyspace(keyspace)
        .table(table)
        .service_id(SERVICE)
        .cluster_id("blue")
        .contact_points(contact_points().split(','))
        .ttl(ttl)
        .request_timeout(Duration::from_secs(30))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_printed_ddl_creates_the_schema_the_provider_uses_as_it_is() {
    let keyspace = format!(
        "cm_schema_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    // Any session of the node, to make the keyspace as an operator would.
    let admin = connect(common::options("unused", "unused")).await;
    admin
        .session()
        .query_unpaged(
            format!(
                "CREATE KEYSPACE \"{keyspace}\" WITH replication = \
                 {{'class': 'SimpleStrategy', 'replication_factor': 1}}"
            ),
            (),
        )
        .await
        .unwrap();
    admin.session().await_schema_agreement().await.unwrap();

    for (table, ttl) in [("with_expiry", true), ("without_expiry", false)] {
        let flags = ["--ttl", if ttl { "true" } else { "false" }];
        let printed = printed_schema(&keyspace, table, &flags);
        let ddl: Vec<&str> = printed["ddl"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        assert_eq!(ddl.len(), 2, "the type and the table: {printed}");
        for statement in &ddl {
            admin.session().query_unpaged(*statement, ()).await.unwrap();
        }
        admin.session().await_schema_agreement().await.unwrap();
        let expected_ttl = if ttl { 604_800 } else { 0 };
        let row = admin
            .session()
            .query_unpaged(
                "SELECT id, default_time_to_live FROM system_schema.tables \
                 WHERE keyspace_name = ? AND table_name = ?",
                (&keyspace, table),
            )
            .await
            .unwrap()
            .into_rows_result()
            .unwrap()
            .single_row::<(uuid::Uuid, i32)>()
            .unwrap();
        assert_eq!(row.1, expected_ttl, "default_time_to_live of {table}");
        assert!(
            ddl[1].contains(&format!("WITH ID = {}", row.0)),
            "the table has the printed id: {}",
            ddl[1]
        );
        assert_eq!(
            printed["grants"],
            serde_json::json!([
                format!("GRANT SELECT ON TABLE \"{keyspace}\".\"{table}\" TO 'silo'"),
                format!("GRANT MODIFY ON TABLE \"{keyspace}\".\"{table}\" TO 'silo'"),
            ])
        );

        // The provider accepts the table as it is (its columns, and its TTL under the default
        // `throw` policy) and works on it.
        let t = connect(options(&keyspace, table, ttl)).await;
        t.initialize(true)
            .await
            .expect("initialize on the printed schema");
        let version = t.read_all().await.unwrap().version;
        let entry = MembershipEntry::new(
            addr("10.0.0.1:11111@1"),
            SiloStatus::Active,
            Timestamp::now(),
        );
        assert!(t.insert_row(&entry, &version.next()).await.unwrap());
        t.update_i_am_alive(&entry.address, Timestamp::now())
            .await
            .unwrap();
        assert_eq!(t.read_all().await.unwrap().rows.len(), 1);
        let audit = t.audit_ttl().await.unwrap();
        assert_eq!(
            audit.table_default_ttl, audit.configured_ttl,
            "the table's default TTL is the configured one"
        );
    }
    let _ = admin
        .session()
        .query_unpaged(format!("DROP KEYSPACE IF EXISTS \"{keyspace}\""), ())
        .await;
}

#[test]
fn the_text_form_is_a_cql_script_naming_the_role_of_the_credentials() {
    let out = common::bare(COMMAND_TIMEOUT)
        .env("CASSANDRA_MEMBERSHIP_USERNAME", "ops")
        .env("CASSANDRA_MEMBERSHIP_PASSWORD", "never-printed")
        .args([
            "--contact-points",
            "127.0.0.1:1",
            "--keyspace",
            "shop",
            "schema",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("CREATE TYPE IF NOT EXISTS \"shop\".\"membership_entry\""),
        "{text}"
    );
    assert!(
        text.contains("CREATE TABLE IF NOT EXISTS \"shop\".\"membership\""),
        "{text}"
    );
    assert!(
        text.contains("GRANT SELECT ON TABLE \"shop\".\"membership\" TO 'ops';"),
        "{text}"
    );
    assert!(
        text.contains("-- GRANT CREATE ON KEYSPACE \"shop\" TO 'ops';"),
        "{text}"
    );
    assert!(!text.contains("CREATE KEYSPACE"), "{text}");
    assert!(!text.contains("never-printed"), "{text}");
    // Every statement ends with `;`, so the text runs as it is in cqlsh.
    assert_eq!(
        text.matches(");\n").count() + text.matches("10800;\n").count(),
        2,
        "{text}"
    );
}

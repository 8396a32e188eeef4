//! Every statement coordinated in the local DC, seen by the server (probabilistic tracing at 1.0
//! on both nodes, then `system_traces.sessions`); a silo in dc2 naming dc1; what `initialize`
//! refuses.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, ConsistencyProfile, MembershipError,
    MembershipTable,
};

use crate::utils::*;

/// Traces every request on both nodes while alive; back to 0 on drop (also when a test fails).
struct Tracing;

impl Tracing {
    fn on() -> Tracing {
        for node in [dc1_node(), dc2_node()] {
            script(&["nodetool", &node.to_string(), "settraceprobability", "1"]);
        }
        Tracing
    }
}

impl Drop for Tracing {
    fn drop(&mut self) {
        for node in [dc1_node(), dc2_node()] {
            script(&["nodetool", &node.to_string(), "settraceprobability", "0"]);
        }
    }
}

/// (coordinator, request, query) of each traced request since `since` that names `table` or is a
/// batch (only the provider sends batches); preparing, which the driver does on every node, is
/// not an execution.
async fn traced(table: &str) -> Vec<(IpAddr, String, String)> {
    let s = session().await;
    // A trace session row is written when its request completes, asynchronously.
    tokio::time::sleep(Duration::from_secs(3)).await;
    // system_traces is SimpleStrategy (RF 2): every node holds a copy; at ALL, none is missed.
    let mut select = scylla::statement::unprepared::Statement::new(
        "SELECT coordinator, request, parameters FROM system_traces.sessions",
    );
    select.set_consistency(scylla::statement::Consistency::All);
    let rows = s
        .query_unpaged(select, ())
        .await
        .expect("read system_traces.sessions")
        .into_rows_result()
        .expect("rows");
    let mut seen = Vec::new();
    for row in rows
        .rows::<(
            Option<IpAddr>,
            Option<String>,
            Option<BTreeMap<String, String>>,
        )>()
        .expect("typed rows")
    {
        let (coordinator, request, parameters) = row.expect("a trace session");
        let request = request.unwrap_or_default();
        let query = parameters
            .and_then(|p| p.get("query").cloned())
            .unwrap_or_default();
        // The schema reads bind keyspace and table as values: matched by their own text (the
        // driver's metadata reads have other texts).
        let ours = query.contains(table)
            || request.contains("batch")
            || SCHEMA_READS.iter().any(|s| query.contains(s));
        if ours && !request.starts_with("Prepar") {
            seen.push((coordinator.expect("a coordinator"), request, query));
        }
    }
    seen
}

/// The provider's reads of `system_schema` (schema.rs, datacenter.rs).
const SCHEMA_READS: [&str; 4] = [
    "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = ?",
    "SELECT default_time_to_live, gc_grace_seconds FROM system_schema.tables",
    "SELECT column_name, type, kind, clustering_order FROM system_schema.columns",
    "SELECT replication FROM system_schema.keyspaces WHERE keyspace_name = ?",
];

async fn truncate_traces() {
    let s = session().await;
    for t in ["sessions", "events"] {
        let mut truncate =
            scylla::statement::unprepared::Statement::new(format!("TRUNCATE system_traces.{t}"));
        truncate.set_consistency(scylla::statement::Consistency::One);
        s.query_unpaged(truncate, ())
            .await
            .expect("truncate the traces");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_statement_of_every_operation_is_coordinated_in_the_local_dc() {
    let _serial = serial().await;
    truncate_traces().await;
    let table = format!("tr_{}", uuid::Uuid::new_v4().simple());
    let options = |cluster: &str| local(cluster).table(table.clone()).ttl(true);
    let tracing = Tracing::on();
    // Given only the dc2 node: the driver learns dc1 from it, and must still send nothing to dc2.
    let a = unique("trace-connect");
    let t = connect(options(&a).contact_points([dc2_point()])).await;
    every_operation(&t, &a).await;
    // A host's session whose default policy round-robins over both DCs.
    let b = unique("trace-host");
    let t = CassandraMembershipTable::with_session(round_robin_session().await, options(&b))
        .expect("valid options");
    every_operation(&t, &b).await;
    drop(tracing);
    let seen = traced(&table).await;
    let dc1 = address(dc1_node());
    let elsewhere: Vec<_> = seen.iter().filter(|(c, _, _)| *c != dc1).collect();
    assert!(
        elsewhere.is_empty(),
        "{} of {} statements were coordinated outside dc1: {elsewhere:#?}",
        elsewhere.len(),
        seen.len()
    );
    // Every kind of statement was seen (so the filter above looked at the provider's traffic).
    for (what, fragment) in [
        ("DDL", "CREATE TABLE"),
        ("a schema read", "FROM system_schema"),
        ("a serial read of the rows", "SELECT silo, version"),
        ("a heartbeat", "SET heartbeat ="),
        ("a cleanup delete", "DELETE "),
    ] {
        assert!(
            seen.iter().any(|(_, _, q)| q.contains(fragment)),
            "no traced {what} ({fragment:?}) among {} statements",
            seen.len()
        );
    }
    assert!(
        seen.iter().any(|(_, r, _)| r.contains("batch")),
        "no traced conditional batch"
    );
    println!(
        "{} statements traced, every one coordinated by {dc1} (dc1)",
        seen.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silo_in_dc2_naming_dc1_races_a_dc1_silo_with_one_winner_every_round() {
    let _serial = serial().await;
    let cluster = unique("cross-dc");
    // The silo in dc2 reaches only its own DC's node, yet its rounds run in dc1, the cluster's DC.
    let near = connect(local(&cluster).contact_points([dc1_point()])).await;
    let far = connect(local(&cluster).contact_points([dc2_point()])).await;
    let won = crate::race(&near, &far, 40).await;
    println!("a dc1 silo and a dc2 silo both naming dc1: {won} of 40 rounds won, none twice");
}

fn config_error(e: &MembershipError) -> (&str, &str) {
    match e {
        MembershipError::InvalidConfiguration { option, reason } => (option, reason),
        other => panic!("expected InvalidConfiguration, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn initialize_refuses_a_serial_datacenter_the_ring_or_the_keyspace_lacks() {
    let _serial = serial().await;
    // A DC the ring does not have, with either profile: named, with the DCs it has.
    for consistency in [ConsistencyProfile::LocalQuorum, ConsistencyProfile::Quorum] {
        let t = connect(
            local(&unique("no-dc"))
                .consistency(consistency)
                .serial_datacenter("dc3"),
        )
        .await;
        let started = std::time::Instant::now();
        let e = t.initialize(true).await.expect_err("dc3 does not exist");
        let (option, reason) = config_error(&e);
        assert_eq!(option, "serial_datacenter");
        assert!(
            reason.contains("dc3") && reason.contains("dc1, dc2"),
            "{reason}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "refused at once"
        );
    }
    let s = session().await;
    let keyspace = |name: &str, replication: &str| {
        let s = Arc::clone(&s);
        let cql =
            format!("CREATE KEYSPACE IF NOT EXISTS {name} WITH replication = {{{replication}}}");
        async move {
            s.query_unpaged(cql, ()).await.expect("create keyspace");
            s.await_schema_agreement().await.expect("agreement");
        }
    };
    keyspace(
        "cm_dcs_only2",
        "'class': 'NetworkTopologyStrategy', 'dc2': 1",
    )
    .await;
    keyspace(
        "cm_dcs_simple",
        "'class': 'SimpleStrategy', 'replication_factor': 1",
    )
    .await;
    let in_keyspace = |ks: &str| {
        CassandraClusteringOptions::default()
            .keyspace(ks)
            .service_id("dcs")
            .cluster_id(unique("ks"))
            .contact_points([dc1_point(), dc2_point()])
            .consistency(ConsistencyProfile::LocalQuorum)
            .serial_datacenter("dc1")
    };
    for (ks, expected) in [
        (
            "cm_dcs_only2",
            "keeps no replica in serial_datacenter \"dc1\"",
        ),
        ("cm_dcs_simple", "NetworkTopologyStrategy"),
    ] {
        let t = connect(in_keyspace(ks)).await;
        match t.initialize(true).await {
            Err(MembershipError::SchemaMismatch { detail, .. }) => {
                assert!(detail.contains(expected), "{ks}: {detail}");
                assert!(detail.contains(ks), "{ks}: names the keyspace: {detail}");
            }
            other => panic!("{ks}: expected SchemaMismatch, got {other:?}"),
        }
        let tables = s
            .query_unpaged(
                "SELECT table_name FROM system_schema.tables WHERE keyspace_name = ?",
                (ks,),
            )
            .await
            .expect("schema read")
            .into_rows_result()
            .expect("rows")
            .rows_num();
        assert_eq!(tables, 0, "{ks}: nothing was created");
    }
    // `quorum` in a SimpleStrategy keyspace is a quorum of all replicas: accepted.
    let t = connect(in_keyspace("cm_dcs_simple").consistency(ConsistencyProfile::Quorum)).await;
    t.initialize(true)
        .await
        .expect("quorum with SimpleStrategy");
}

//! A keyspace created through one node while silos initialize through another that has not
//! applied it yet: that node says the keyspace does not exist ("Keyspace 'ks' doesn't exist" on
//! Cassandra's DDL path) — a schema lag, not a missing keyspace. `initialize` asks again within
//! `schema_timeout` and every silo starts once the schema reaches the node.
//!
//! The lag is made, not hoped for: the node gets no internode messages (no schema push, no
//! gossip) for a few seconds around the keyspace's creation.

use std::sync::Arc;
use std::time::Duration;

use cassandra_membership::{CassandraClusteringOptions, CassandraMembershipTable, MembershipTable};
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::policies::host_filter::AllowListHostFilter;

use super::Net;
use crate::{SERIAL, heal, nodes};

/// Silos initializing at once in each round; rounds.
const SILOS: usize = 8;
const ROUNDS: usize = 2;
/// How long the lagging node gets no internode messages after the keyspace was created.
const LAG: Duration = Duration::from_secs(4);

/// A session that talks to `nodes` only. Without `await_agreement` a schema change returns as
/// soon as its coordinator applied it.
async fn session_on(nodes: &[u32], await_agreement: bool) -> Arc<Session> {
    let points: Vec<String> = nodes.iter().map(|i| format!("127.0.0.{i}:9042")).collect();
    let filter =
        AllowListHostFilter::new(points.iter().map(String::as_str)).expect("loopback addresses");
    Arc::new(
        SessionBuilder::new()
            .known_nodes(&points)
            .host_filter(Arc::new(filter))
            .auto_await_schema_agreement(await_agreement)
            .connection_timeout(Duration::from_secs(5))
            .build()
            .await
            .unwrap_or_else(|e| panic!("no ring node answers at {points:?} ({e})")),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn silos_initializing_through_a_node_that_has_not_applied_the_new_keyspace_yet_start() {
    let _serial = SERIAL.lock().await;
    let [a, b, c] = nodes()[..] else {
        unreachable!("three nodes")
    };
    heal().await;
    let creator = session_on(&[a], false).await;
    // The silos reach the creator's node and the lagging one.
    let silos = session_on(&[a, c], true).await;
    let mut failures = Vec::new();
    for round in 0..ROUNDS {
        let keyspace = format!("cm_keyspace_lag_{round}");
        creator
            .query_unpaged(format!("DROP KEYSPACE IF EXISTS {keyspace}"), ())
            .await
            .expect("drop an earlier run's keyspace");
        creator.await_schema_agreement().await.expect("agreement");
        let net = Net::new();
        net.cut_one_way(a, c);
        net.cut_one_way(b, c);
        creator
            .query_unpaged(
                format!(
                    "CREATE KEYSPACE {keyspace} WITH replication = \
                     {{'class': 'SimpleStrategy', 'replication_factor': 3}}"
                ),
                (),
            )
            .await
            .expect("create the keyspace through the first node");
        let starts = futures::future::join_all((0..SILOS).map(|silo| {
            // The lag itself lasts LAG; after it the lagging node must catch up through gossip,
            // which on a loaded 2-core machine has taken longer than the 30 s default for a schema
            // change's agreement. That would be an honest `Timeout`, not the defect under test
            // (a lag read as a missing keyspace), so the bound here is generous.
            let options = CassandraClusteringOptions::default()
                .keyspace(&keyspace)
                .table(format!("members_{silo}"))
                .service_id("lag")
                .cluster_id("c")
                .schema_timeout(Duration::from_secs(90));
            let table = CassandraMembershipTable::with_session(Arc::clone(&silos), options)
                .expect("valid options");
            async move {
                let started = std::time::Instant::now();
                let result = table.initialize(true).await;
                (result, started.elapsed())
            }
        }));
        let lift = async {
            tokio::time::sleep(LAG).await;
            net.heal("the lagging node's internode messages");
        };
        let (results, ()) = tokio::join!(starts, lift);
        for (silo, (result, took)) in results.into_iter().enumerate() {
            eprintln!(
                "round {round}, silo {silo}: {:?} after {took:?}",
                result.as_ref().err()
            );
            if let Err(e) = result {
                failures.push(format!(
                    "round {round}, silo {silo} after {took:?}: {e} ({e:?})"
                ));
            }
        }
    }
    heal().await;
    for round in 0..ROUNDS {
        let _ = creator
            .query_unpaged(
                format!("DROP KEYSPACE IF EXISTS cm_keyspace_lag_{round}"),
                (),
            )
            .await;
    }
    assert!(
        failures.is_empty(),
        "{} of {} silos failed to initialize: {failures:#?}",
        failures.len(),
        ROUNDS * SILOS
    );
}

//! Two data centres: `serial_datacenter` honoured by every statement, and a DC outage survived.
//!
//! Needs the two-DC ring of `scripts/cassandra.sh start-dcs dc1 dc2` with `CASSANDRA_FIRST_NODE`
//! (default 6): node K in dc1, node K+1 in dc2, on 127.0.0.K and 127.0.0.K+1. The keyspace
//! replicates once to each DC, so LOCAL_QUORUM / LOCAL_SERIAL in dc1 is dc1's one replica and
//! QUORUM / SERIAL needs both. Not part of the one-node run: `scripts/test.sh` runs it in its
//! two-DC stage (`cargo test --test two_dcs`).

mod outage;
#[path = "../common/ring.rs"]
mod ring;
mod routing;
mod utils;

use std::sync::Arc;

use cassandra_membership::{
    CassandraMembershipTable, MembershipEntry, MembershipTable, SiloAddress, SiloStatus, Timestamp,
};

use utils::*;

/// `rounds` rounds of two tables inserting different entries at the same version: each round,
/// at most one may win, and the table ends with one row and one version per won round.
async fn race(a: &CassandraMembershipTable, b: &CassandraMembershipTable, rounds: u16) -> usize {
    a.initialize(true).await.expect("initialize");
    let mut won = 0usize;
    let mut double = Vec::new();
    for k in 0..rounds {
        let snapshot = a.read_all().await.expect("read_all");
        let next = snapshot.version.next();
        let entry = |n: u16| {
            let address =
                SiloAddress::new(std::net::SocketAddr::from(([10, 1, 0, 1], n)), 1).unwrap();
            MembershipEntry::new(address, SiloStatus::Joining, Timestamp::now())
        };
        let (ea, eb) = (entry(2 * k + 1), entry(2 * k + 2));
        let (x, y) = tokio::join!(a.insert_row(&ea, &next), b.insert_row(&eb, &next));
        let x = x.unwrap_or_else(|e| panic!("round {k}: a's insert failed on a healthy ring: {e}"));
        let y = y.unwrap_or_else(|e| panic!("round {k}: b's insert failed on a healthy ring: {e}"));
        if x && y {
            double.push(k);
        }
        won += usize::from(x) + usize::from(y);
    }
    assert!(
        double.is_empty(),
        "{} of {rounds} rounds had two winners at one version (rounds {double:?})",
        double.len()
    );
    let end = a.read_all().await.expect("read_all");
    assert_eq!(end.rows.len(), won, "one row per won round");
    assert_eq!(end.version.version, won as u64, "one version per won round");
    // Two writers on one partition: a duel may let both lose a round, never most of them.
    assert!(
        won * 10 >= usize::from(rounds) * 9,
        "the race made progress: {won} of {rounds} rounds won"
    );
    won
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_silos_of_one_dc_racing_at_one_version_have_one_winner_every_round() {
    let _serial = serial().await;
    let cluster = unique("race");
    // As in the report: both given only the dc1 node; the driver finds dc2 by itself.
    let a = connect(local(&cluster).contact_points([dc1_point()])).await;
    let b = connect(local(&cluster).contact_points([dc1_point()])).await;
    let won = race(&a, &b, 60).await;
    println!("connect, local_quorum in dc1: {won} of 60 rounds won, none twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_race_through_a_host_round_robin_session_has_one_winner_every_round() {
    let _serial = serial().await;
    let cluster = unique("race-rr");
    let session = round_robin_session().await;
    let a = CassandraMembershipTable::with_session(Arc::clone(&session), local(&cluster))
        .expect("valid options");
    let b = CassandraMembershipTable::with_session(session, local(&cluster)).expect("options");
    let won = race(&a, &b, 60).await;
    println!("with_session on a round-robin session: {won} of 60 rounds won, none twice");
}

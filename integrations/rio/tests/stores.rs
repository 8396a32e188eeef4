//! The placement store, the state store and the server's fence on the real node
//! (`CASSANDRA_CONTACT_POINTS`, default 127.0.0.1:9042; these tests never skip). Keyspace
//! `cm_rio_test` (`CM_RIO_TEST_KEYSPACE` at build time), a unique cluster per test.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use cassandra_membership::conformance::faults::{Calls, FaultyTable, Injection, Operation};
use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, MembershipOptions, MembershipTable,
    SiloHealth, SiloStatus,
};
use cassandra_membership_rio::{
    CassandraMembershipStorage, CassandraObjectPlacement, CassandraState, FencedClusterProvider,
    PlacementOptions, RioStorageOptions, RioStoreError, StateOptions,
};
use rio_rs::ObjectId;
use rio_rs::cluster::storage::Member;
use rio_rs::errors::LoadStateError;
use rio_rs::object_placement::{ObjectPlacement, ObjectPlacementItem};
use rio_rs::prelude::*;
use rio_rs::state::{StateLoader, StateSaver};
use serde::{Deserialize, Serialize};

const KEYSPACE: &str = match option_env!("CM_RIO_TEST_KEYSPACE") {
    Some(k) => k,
    None => "cm_rio_test",
};
const SERVICE: &str = "rio-test";
const HEARTBEAT: Duration = Duration::from_secs(1);
const TTL: Duration = Duration::from_secs(5);

fn contact_points() -> Vec<String> {
    std::env::var("CASSANDRA_CONTACT_POINTS")
        .unwrap_or_else(|_| "127.0.0.1:9042".into())
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// Heartbeats every second (gone after 3 s); `ttl`: storage-side expiry with a 5 s TTL.
fn options(cluster: &str, ttl: bool) -> CassandraClusteringOptions {
    options_with(cluster, ttl, HEARTBEAT)
}

fn options_with(cluster: &str, ttl: bool, heartbeat: Duration) -> CassandraClusteringOptions {
    let mut m = MembershipOptions::default();
    m.i_am_alive_table_publish_timeout = heartbeat;
    m.defunct_silo_expiration = TTL;
    CassandraClusteringOptions::default()
        .keyspace(KEYSPACE)
        .service_id(SERVICE)
        .cluster_id(cluster)
        .contact_points(contact_points())
        .table(if ttl {
            "rio_members_ttl5"
        } else {
            "rio_members"
        })
        .create_keyspace_simple(1)
        .request_timeout(Duration::from_secs(30))
        .ttl(ttl)
        .membership(m)
}

async fn table(o: CassandraClusteringOptions) -> CassandraMembershipTable {
    let points = o.contact_points.clone();
    CassandraMembershipTable::connect(o).await.unwrap_or_else(|e| {
        panic!(
            "cannot use Cassandra at {points:?}: {e}. Start a node with `scripts/cassandra.sh start` \
             or run `scripts/test.sh`; set CASSANDRA_CONTACT_POINTS for another node."
        )
    })
}

async fn storage(o: CassandraClusteringOptions) -> CassandraMembershipStorage {
    let rio = RioStorageOptions::from_membership(&o.membership);
    CassandraMembershipStorage::with_cassandra_table(table(o).await, rio)
        .await
        .unwrap()
}

/// A server's storage and placement store, its member pushed at `127.0.0.1:port`.
async fn server(
    o: CassandraClusteringOptions,
    port: u16,
) -> (CassandraMembershipStorage, CassandraObjectPlacement, String) {
    let s = storage(o).await;
    let mut m = Member::new("127.0.0.1".into(), port.to_string());
    m.set_active(true);
    s.push(m).await.unwrap();
    let p = CassandraObjectPlacement::connect(&s, PlacementOptions::default())
        .await
        .unwrap();
    (s, p, format!("127.0.0.1:{port}"))
}

fn item(kind: &str, id: &str, server: &str) -> ObjectPlacementItem {
    ObjectPlacementItem::new(ObjectId::new(kind, id), Some(server.to_owned()))
}

async fn until(what: &str, within: Duration, mut done: impl AsyncFnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !done().await {
        assert!(t0.elapsed() < within, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    t0.elapsed()
}

mod placement {
    use super::*;

    /// rio's `update` from two servers at once for one new object, 40 times: each time exactly
    /// one wins, the other is refused, and both then see the winner.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_servers_racing_for_one_object_have_exactly_one_winner_every_time() {
        let cluster = unique("race");
        let (_sa, a, addr_a) = server(options(&cluster, false), 9001).await;
        let (_sb, b, addr_b) = server(options(&cluster, false), 9002).await;
        let (mut wins_a, mut wins_b) = (0, 0);
        let mut first_winner = String::new();
        const ROUNDS: usize = 40;
        for round in 0..ROUNDS {
            let id = format!("object-{round}");
            let (ra, rb) = tokio::join!(
                a.update(item("Race", &id, &addr_a)),
                b.update(item("Race", &id, &addr_b))
            );
            let winner = match (ra, rb) {
                (Ok(()), Err(_)) => {
                    wins_a += 1;
                    &addr_a
                }
                (Err(_), Ok(())) => {
                    wins_b += 1;
                    &addr_b
                }
                other => panic!("round {round}: not exactly one winner: {other:?}"),
            };
            if round == 0 {
                first_winner = winner.clone();
            }
            let key = ObjectId::new("Race", &id);
            assert_eq!(a.lookup(&key).await.unwrap().as_ref(), Some(winner));
            assert_eq!(b.lookup(&key).await.unwrap().as_ref(), Some(winner));
        }
        eprintln!("{ROUNDS} races: server a won {wins_a}, server b won {wins_b}");
        assert_eq!(wins_a + wins_b, ROUNDS);
        // Placing again: the holder succeeds (nothing written), the other learns who holds it.
        let (holder, other) = if first_winner == addr_a {
            (&a, &b)
        } else {
            (&b, &a)
        };
        let other_addr = if first_winner == addr_a {
            &addr_b
        } else {
            &addr_a
        };
        holder
            .place("Race", "object-0", &first_winner)
            .await
            .unwrap();
        match other.place("Race", "object-0", other_addr).await {
            Err(RioStoreError::PlacedElsewhere { owner, .. }) => assert_eq!(owner, first_winner),
            r => panic!("{r:?}"),
        }
    }

    /// A placement on an active server is never taken, nor on an inactive one that still
    /// heartbeats (rio marks a server inactive after two failed pings: it may still be
    /// serving); once that server is gone (no I-am-alive for `gone_after`) it is taken, by one
    /// server, and `clean_server` removes exactly the placements the server still holds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn clean_server_removes_a_gone_servers_placements_and_only_those() {
        let cluster = unique("clean");
        let (sa, a, addr_a) = server(options(&cluster, false), 9001).await;
        let (_sb, b, addr_b) = server(options(&cluster, false), 9002).await;
        for id in ["x", "y", "z"] {
            a.update(item("Clean", id, &addr_a)).await.unwrap();
        }
        b.update(item("Clean", "w", &addr_b)).await.unwrap();
        assert!(
            matches!(b.place("Clean", "x", &addr_b).await, Err(RioStoreError::PlacedElsewhere { owner, .. }) if owner == addr_a),
            "an active owner keeps it"
        );
        // a is found broken by its peers (rio's provider marks it inactive) but keeps
        // heartbeating: it may still serve x, so nobody else may take it yet.
        sa.set_inactive("127.0.0.1", "9001").await.unwrap();
        assert!(
            matches!(b.place("Clean", "x", &addr_b).await, Err(RioStoreError::PlacedElsewhere { owner, .. }) if owner == addr_a),
            "an inactive owner that still heartbeats keeps it"
        );
        assert_eq!(
            b.clean(&addr_a).await.unwrap(),
            0,
            "nor does clean_server take them"
        );
        assert_eq!(
            a.lookup(&ObjectId::new("Clean", "x"))
                .await
                .unwrap()
                .as_ref(),
            Some(&addr_a)
        );
        // a stops: gone after 3 s without an I-am-alive.
        drop((sa, a));
        tokio::time::sleep(Duration::from_millis(3500)).await;
        b.place("Clean", "x", &addr_b).await.unwrap();
        assert_eq!(b.clean(&addr_a).await.unwrap(), 2, "y and z; x is b's now");
        for (id, expected) in [
            ("x", Some(&addr_b)),
            ("y", None),
            ("z", None),
            ("w", Some(&addr_b)),
        ] {
            assert_eq!(
                b.lookup(&ObjectId::new("Clean", id))
                    .await
                    .unwrap()
                    .as_ref(),
                expected,
                "{id}"
            );
        }
        assert_eq!(b.clean(&addr_a).await.unwrap(), 0, "idempotent");
        b.update(item("Clean", "y", &addr_b)).await.unwrap();
        // rio's `remove` (an object shut down on its server) unassigns it.
        b.remove(&ObjectId::new("Clean", "y")).await.unwrap();
        assert_eq!(b.lookup(&ObjectId::new("Clean", "y")).await.unwrap(), None);
    }

    /// rio calls `remove` on the server whose activation ends (a panic, an admin shutdown):
    /// a stale activation on a, whose object b holds now, must not delete b's placement.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn remove_on_a_server_that_does_not_hold_the_object_deletes_nothing() {
        let cluster = unique("remove");
        let (_sa, a, _addr_a) = server(options(&cluster, false), 9001).await;
        let (_sb, b, addr_b) = server(options(&cluster, false), 9002).await;
        b.update(item("Remove", "o", &addr_b)).await.unwrap();
        assert_eq!(
            b.placed_count(),
            0,
            "without expiry nothing is renewed or remembered"
        );
        a.remove(&ObjectId::new("Remove", "o")).await.unwrap();
        assert_eq!(
            b.lookup(&ObjectId::new("Remove", "o"))
                .await
                .unwrap()
                .as_ref(),
            Some(&addr_b),
            "b's live placement stays"
        );
        b.remove(&ObjectId::new("Remove", "o")).await.unwrap();
        assert_eq!(b.lookup(&ObjectId::new("Remove", "o")).await.unwrap(), None);
    }

    /// A server restarted at the same address finds its old placements naming it: rio then
    /// never calls `update` for them, so the store must renew them from the lookup on, or they
    /// expire while served.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_restarted_server_renews_the_placements_its_lookups_find_naming_it() {
        let cluster = unique("adopt");
        let (sa, a, addr_a) = server(options(&cluster, true), 9001).await;
        a.update(item("Adopt", "o", &addr_a)).await.unwrap();
        assert_eq!(a.placed_count(), 1);
        drop((sa, a));
        let (_sa2, a2, _) = server(options(&cluster, true), 9001).await;
        assert_eq!(
            a2.lookup(&ObjectId::new("Adopt", "o"))
                .await
                .unwrap()
                .as_ref(),
            Some(&addr_a)
        );
        assert_eq!(a2.placed_count(), 1, "renewed from now on");
    }

    /// A row whose cells expired before its row marker (an INSERT with a long TTL, then an
    /// UPDATE by a server configured with a shorter one) names no server: the object must still
    /// be placeable, not refused until the marker expires.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_object_whose_placement_row_lost_its_server_can_be_placed() {
        let cluster = unique("null-server");
        let (_sa, a, addr_a) = server(options(&cluster, false), 9001).await;
        let raw = table(options(&cluster, false)).await;
        raw.session()
            .query_unpaged(
                format!(
                    "INSERT INTO {KEYSPACE}.rio_placements (service_id, cluster_id, object_kind, object_id, placed_at) VALUES (?, ?, 'Null', 'o', 0)"
                ),
                (SERVICE, &cluster),
            )
            .await
            .unwrap();
        assert_eq!(a.lookup(&ObjectId::new("Null", "o")).await.unwrap(), None);
        a.place("Null", "o", &addr_a).await.unwrap();
        assert_eq!(
            a.lookup(&ObjectId::new("Null", "o"))
                .await
                .unwrap()
                .as_ref(),
            Some(&addr_a)
        );
    }

    /// rio's server accepts requests before its provider has pushed its member: until then
    /// nobody can see it, fence it or take its objects over once it stops, so rio's `update`
    /// places nothing on it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_server_that_is_not_a_member_yet_places_nothing() {
        let cluster = unique("not-yet");
        let s = storage(options(&cluster, false)).await;
        let p = CassandraObjectPlacement::connect(&s, PlacementOptions::default())
            .await
            .unwrap();
        assert!(
            p.update(item("NotYet", "o", "127.0.0.1:9001"))
                .await
                .is_err()
        );
        assert_eq!(p.lookup(&ObjectId::new("NotYet", "o")).await.unwrap(), None);
        let mut m = Member::new("127.0.0.1".into(), "9001".into());
        m.set_active(true);
        s.push(m).await.unwrap();
        p.update(item("NotYet", "o", "127.0.0.1:9001"))
            .await
            .unwrap();
        assert_eq!(
            p.lookup(&ObjectId::new("NotYet", "o"))
                .await
                .unwrap()
                .as_deref(),
            Some("127.0.0.1:9001")
        );
    }

    /// With expiry on: a live server's placement stays for 2 × TTL (sampled every 250 ms);
    /// once the server is gone, it expires — never before its membership entry.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn placements_expire_with_their_server_and_never_before_its_entry() {
        let cluster = unique("expire");
        let (sa, a, addr_a) = server(options(&cluster, true), 9001).await;
        let observer = storage(options(&cluster, true)).await;
        let look = CassandraObjectPlacement::connect(&observer, PlacementOptions::default())
            .await
            .unwrap();
        let ttl = a.ttl().expect("expiry on");
        a.update(item("Expire", "o", &addr_a)).await.unwrap();
        let key = ObjectId::new("Expire", "o");
        let until_t = Instant::now() + 2 * TTL;
        while Instant::now() < until_t {
            assert_eq!(
                look.lookup(&key).await.unwrap().as_ref(),
                Some(&addr_a),
                "never early"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let address = sa.incarnation("127.0.0.1", "9001").unwrap();
        drop((sa, a));
        let stopped = Instant::now();
        let raw = table(options(&cluster, true)).await;
        let mut entry_gone = None;
        let gone = until(
            "the placement gone",
            ttl + Duration::from_secs(4),
            async || {
                if entry_gone.is_none() && raw.read_row(&address).await.unwrap().rows.is_empty() {
                    entry_gone = Some(stopped.elapsed());
                }
                look.lookup(&key).await.unwrap().is_none()
            },
        )
        .await;
        eprintln!(
            "entry gone after {entry_gone:?}, placement after {gone:?} (placement TTL {ttl:?})"
        );
        let entry_gone = entry_gone.expect("the entry expires before its placement");
        assert!(
            gone + Duration::from_millis(500) >= entry_gone,
            "{gone:?} < {entry_gone:?}"
        );
        assert!(gone <= ttl + Duration::from_secs(2), "{gone:?}");
    }
}

mod state {
    use super::*;

    #[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
    struct Counter {
        n: u32,
        by: String,
    }

    async fn stores(cluster: &str) -> (CassandraState, CassandraState) {
        let s = storage(options(cluster, false)).await;
        let a = CassandraState::connect(&s, StateOptions::default())
            .await
            .unwrap();
        let b = CassandraState::connect(&s, StateOptions::default())
            .await
            .unwrap();
        (a, b)
    }

    fn counter(n: u32, by: &str) -> Counter {
        Counter { n, by: by.into() }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_state_round_trips_and_each_save_moves_its_version_by_one() {
        let id = unique("rt");
        let (a, b) = stores(&unique("state")).await;
        let missing: Result<Counter, _> = a.load("Counter", &id, "Counter").await;
        assert_eq!(missing, Err(LoadStateError::ObjectNotFound));
        a.save("Counter", &id, "Counter", &counter(1, "a"))
            .await
            .unwrap();
        a.save("Counter", &id, "Counter", &counter(2, "a"))
            .await
            .unwrap();
        assert_eq!(a.known_version("Counter", &id, "Counter"), Some(Some(2)));
        let (loaded, version) = b
            .load_versioned::<Counter>("Counter", &id, "Counter")
            .await
            .unwrap()
            .unwrap();
        assert_eq!((loaded, version), (counter(2, "a"), 2));
        let other: Result<Counter, _> = b.load("Counter", &id, "OtherType").await;
        assert_eq!(other, Err(LoadStateError::ObjectNotFound), "per state type");
    }

    /// Two activations of one object (two servers' stores): whoever saves second, on a version
    /// it did not see, is refused and writes nothing, at the first save and at later ones.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_activations_never_overwrite_each_others_state() {
        let id = unique("conflict");
        let (a, b) = stores(&unique("state")).await;
        assert!(
            a.load_versioned::<Counter>("Counter", &id, "Counter")
                .await
                .unwrap()
                .is_none()
        );
        assert!(
            b.load_versioned::<Counter>("Counter", &id, "Counter")
                .await
                .unwrap()
                .is_none()
        );
        assert_eq!(
            a.save_versioned("Counter", &id, "Counter", &counter(1, "a"))
                .await
                .unwrap(),
            1
        );
        match b
            .save_versioned("Counter", &id, "Counter", &counter(1, "b"))
            .await
        {
            Err(RioStoreError::StateConflict {
                expected: None,
                found: Some(1),
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        // Through rio's trait the loser gets an error too.
        let via_rio =
            StateSaver::<Counter>::save(&b, "Counter", &id, "Counter", &counter(1, "b")).await;
        assert_eq!(via_rio, Err(LoadStateError::Unknown));
        // b reloads (a new activation would) and saves on top; a, still at 1, is refused.
        let (seen, _) = b
            .load_versioned::<Counter>("Counter", &id, "Counter")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(seen, counter(1, "a"));
        assert_eq!(
            b.save_versioned("Counter", &id, "Counter", &counter(2, "b"))
                .await
                .unwrap(),
            2
        );
        match a
            .save_versioned("Counter", &id, "Counter", &counter(2, "a"))
            .await
        {
            Err(RioStoreError::StateConflict {
                expected: Some(1),
                found: Some(2),
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        let (stored, version) = a
            .load_versioned::<Counter>("Counter", &id, "Counter")
            .await
            .unwrap()
            .unwrap();
        assert_eq!((stored, version), (counter(2, "b"), 2));
    }

    /// A state row whose cells expired before its row marker (saves with different TTLs) holds
    /// no version and no state: it loads as absent and the next save creates the state, instead
    /// of a load error and an insert refused until the marker expires.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_state_row_without_version_or_state_is_absent_and_can_be_saved() {
        let id = unique("null-state");
        let cluster = unique("state");
        let (a, _) = stores(&cluster).await;
        let raw = table(options(&cluster, false)).await;
        raw.session()
            .query_unpaged(
                format!(
                    "INSERT INTO {KEYSPACE}.rio_state (service_id, object_kind, object_id, state_type, written_at) VALUES (?, 'Counter', ?, 'Counter', 0)"
                ),
                (SERVICE, &id),
            )
            .await
            .unwrap();
        assert!(
            a.load_versioned::<Counter>("Counter", &id, "Counter")
                .await
                .unwrap()
                .is_none()
        );
        assert_eq!(
            a.save_versioned("Counter", &id, "Counter", &counter(1, "a"))
                .await
                .unwrap(),
            1
        );
        assert_eq!(
            a.load_versioned::<Counter>("Counter", &id, "Counter")
                .await
                .unwrap(),
            Some((counter(1, "a"), 1))
        );
    }

    /// Under `local_quorum` the state store still runs (its Paxos is `SERIAL`, as states are
    /// shared by every cluster of the service, one per data centre): the version check holds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_state_store_keeps_its_version_check_under_local_quorum() {
        let cluster = unique("state-lq");
        let raw = table(options(&cluster, false)).await;
        let dc: String = raw
            .session()
            .query_unpaged("SELECT data_center FROM system.local", ())
            .await
            .unwrap()
            .into_rows_result()
            .unwrap()
            .first_row::<(String,)>()
            .unwrap()
            .0;
        let o = options(&cluster, false)
            .consistency(cassandra_membership::ConsistencyProfile::LocalQuorum)
            .serial_datacenter(dc);
        let s = storage(o).await;
        let a = CassandraState::connect(&s, StateOptions::default())
            .await
            .unwrap();
        let b = CassandraState::connect(&s, StateOptions::default())
            .await
            .unwrap();
        let id = unique("lq");
        a.save_versioned("Counter", &id, "Counter", &counter(1, "a"))
            .await
            .unwrap();
        assert!(matches!(
            b.save_versioned("Counter", &id, "Counter", &counter(1, "b"))
                .await,
            Err(RioStoreError::StateConflict { .. })
        ));
        assert_eq!(
            b.load_versioned::<Counter>("Counter", &id, "Counter")
                .await
                .unwrap(),
            Some((counter(1, "a"), 1))
        );
    }

    /// Both activations save at once on the version both loaded, 20 times: one wins each time.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_saves_on_one_version_have_exactly_one_winner() {
        let id = unique("concurrent");
        let (a, b) = stores(&unique("state")).await;
        a.save_versioned("Counter", &id, "Counter", &counter(0, "a"))
            .await
            .unwrap();
        let mut wins = (0, 0);
        for round in 1..=20 {
            a.load_versioned::<Counter>("Counter", &id, "Counter")
                .await
                .unwrap();
            b.load_versioned::<Counter>("Counter", &id, "Counter")
                .await
                .unwrap();
            let (ca, cb) = (counter(round, "a"), counter(round, "b"));
            let (ra, rb) = tokio::join!(
                a.save_versioned("Counter", &id, "Counter", &ca),
                b.save_versioned("Counter", &id, "Counter", &cb)
            );
            let by = match (ra, rb) {
                (Ok(_), Err(RioStoreError::StateConflict { .. })) => {
                    wins.0 += 1;
                    "a"
                }
                (Err(RioStoreError::StateConflict { .. }), Ok(_)) => {
                    wins.1 += 1;
                    "b"
                }
                other => panic!("round {round}: {other:?}"),
            };
            let (stored, version) = a
                .load_versioned::<Counter>("Counter", &id, "Counter")
                .await
                .unwrap()
                .unwrap();
            assert_eq!(
                (stored, version),
                (counter(round, by), i64::from(round) + 1)
            );
        }
        eprintln!("20 concurrent saves: a won {}, b won {}", wins.0, wins.1);
    }
}

mod fencing {
    use super::*;

    static HANDLED: AtomicU32 = AtomicU32::new(0);

    #[derive(Default, WithId, TypeName)]
    struct Echo {
        id: String,
    }

    #[derive(Default, Debug, Message, TypeName, Serialize, Deserialize)]
    struct Ping;

    #[derive(Default, Debug, Message, TypeName, Serialize, Deserialize)]
    struct Pong {
        handled: u32,
    }

    #[async_trait]
    impl Handler<Ping> for Echo {
        type Returns = Pong;
        type Error = NoopError;
        async fn handle(&mut self, _: Ping, _: Arc<AppData>) -> Result<Pong, NoopError> {
            Ok(Pong {
                handled: HANDLED.fetch_add(1, Ordering::SeqCst) + 1,
            })
        }
    }

    /// Heartbeats fail for longer than `gone_after`: the peers may have taken the server for
    /// gone and re-placed its objects. When heartbeats work again it must not come back
    /// (Healthy) but end final.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_server_that_was_gone_does_not_come_back_when_heartbeats_work_again() {
        let cluster = unique("comeback");
        let o = || options(&cluster, false);
        let real = table(o()).await;
        let faulty = Arc::new(FaultyTable::new(Arc::new(table(o()).await)));
        let rio = RioStorageOptions::from_membership(&o().membership);
        let s = CassandraMembershipStorage::with_wrapped_table(faulty.clone(), &real, rio)
            .await
            .unwrap();
        let mut m = Member::new("127.0.0.1".into(), "9001".into());
        m.set_active(true);
        s.push(m).await.unwrap();
        until("healthy", Duration::from_secs(10), async || {
            matches!(
                s.health("127.0.0.1", "9001"),
                Some(SiloHealth::Healthy { .. })
            )
        })
        .await;
        let down = faulty.inject(Injection::unavailable(
            Calls::any_of([Operation::UpdateIAmAlive]),
            "injected: heartbeat unavailable",
        ));
        // gone after 3 s without an I-am-alive; the last one stored at most 1 s ago.
        tokio::time::sleep(s.options().gone_after() + Duration::from_millis(1500)).await;
        assert!(matches!(
            s.fenced(),
            Some((_, SiloHealth::LeaseAtRisk { .. }))
        ));
        faulty.clear(down);
        let mut health = None;
        until("final", Duration::from_secs(6), async || {
            health = s.health("127.0.0.1", "9001");
            assert!(
                !matches!(health, Some(SiloHealth::Healthy { .. })),
                "came back after it was gone: {health:?}"
            );
            health.as_ref().is_some_and(SiloHealth::is_final)
        })
        .await;
        assert!(s.fenced().is_some(), "{health:?}");
    }

    /// A place that takes long (its owner check waits on a slow read) while the server's lease
    /// falls at risk: it must not return Ok — rio would activate and serve the object on a
    /// fenced server.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_place_that_ends_after_the_fence_serves_nothing() {
        let cluster = unique("slow-place");
        let o = || options(&cluster, false);
        let real = table(o()).await;
        let faulty = Arc::new(FaultyTable::new(Arc::new(table(o()).await)));
        let rio = RioStorageOptions::from_membership(&o().membership);
        let s = CassandraMembershipStorage::with_wrapped_table(faulty.clone(), &real, rio)
            .await
            .unwrap();
        let mut m = Member::new("127.0.0.1".into(), "9001".into());
        m.set_active(true);
        s.push(m).await.unwrap();
        let p = CassandraObjectPlacement::connect(&s, PlacementOptions::default())
            .await
            .unwrap();
        until("healthy", Duration::from_secs(10), async || {
            matches!(
                s.health("127.0.0.1", "9001"),
                Some(SiloHealth::Healthy { .. })
            )
        })
        .await;
        // Held by a server that never joined: taken over after one membership read.
        p.place("Slow", "o", "127.0.0.1:9999").await.unwrap();
        let gate = cassandra_membership::conformance::faults::Gate::new();
        let held =
            faulty.inject(Injection::hold(Calls::any_of([Operation::ReadAll]), &gate).times(1));
        let placing = tokio::spawn({
            let p = p.clone();
            async move { p.place("Slow", "o", "127.0.0.1:9001").await }
        });
        until(
            "the owner check waiting",
            Duration::from_secs(5),
            async || gate.arrived() >= 1,
        )
        .await;
        let down = faulty.inject(Injection::unavailable(
            Calls::any_of([Operation::UpdateIAmAlive]),
            "injected: heartbeat unavailable",
        ));
        until("fenced", Duration::from_secs(8), async || {
            matches!(s.fenced(), Some((_, SiloHealth::LeaseAtRisk { .. })))
        })
        .await;
        gate.release();
        let placed = placing.await.unwrap();
        // Fenced (checked again before Ok), or out of time (the serve window ends about when
        // the fence does): never Ok.
        assert!(
            matches!(
                placed,
                Err(RioStoreError::Fenced { .. } | RioStoreError::OutcomeUnknown { .. })
            ),
            "{placed:?}"
        );
        faulty.clear(down);
        faulty.clear(held);
    }

    /// rio holds its placement lock while `update` runs, so every lookup of the server waits
    /// for it: a place whose reads hang gives up after the fence's serve window
    /// (`gone_after` − one period, 2 s here) instead of stalling the server.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_place_that_hangs_gives_up_within_the_fence_window() {
        let cluster = unique("hung-place");
        let o = || options(&cluster, false);
        let real = table(o()).await;
        let faulty = Arc::new(FaultyTable::new(Arc::new(table(o()).await)));
        let rio = RioStorageOptions::from_membership(&o().membership);
        let s = CassandraMembershipStorage::with_wrapped_table(faulty.clone(), &real, rio)
            .await
            .unwrap();
        let mut m = Member::new("127.0.0.1".into(), "9001".into());
        m.set_active(true);
        s.push(m).await.unwrap();
        let p = CassandraObjectPlacement::connect(&s, PlacementOptions::default())
            .await
            .unwrap();
        p.place("Hung", "o", "127.0.0.1:9999").await.unwrap();
        let held = faulty.inject(Injection::hang(Calls::any_of([Operation::ReadAll])));
        let t0 = Instant::now();
        let placed = tokio::time::timeout(
            Duration::from_secs(6),
            p.place("Hung", "o", "127.0.0.1:9001"),
        )
        .await
        .expect("the place gives up by itself");
        let took = t0.elapsed();
        faulty.clear(held);
        assert!(placed.is_err(), "{placed:?}");
        assert!(took < Duration::from_secs(3), "{took:?}");
    }

    /// A late save from a server whose lease is at risk would make the object's next holder
    /// the loser of the version check: the state store refuses it, writing nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fenced_server_saves_no_state() {
        let cluster = unique("fenced-save");
        let o = || options(&cluster, false);
        let real = table(o()).await;
        let faulty = Arc::new(FaultyTable::new(Arc::new(table(o()).await)));
        let rio = RioStorageOptions::from_membership(&o().membership);
        let s = CassandraMembershipStorage::with_wrapped_table(faulty.clone(), &real, rio)
            .await
            .unwrap();
        let mut m = Member::new("127.0.0.1".into(), "9001".into());
        m.set_active(true);
        s.push(m).await.unwrap();
        let state = CassandraState::connect(&s, StateOptions::default())
            .await
            .unwrap();
        let id = unique("o");
        state.save_versioned("K", &id, "S", &1u32).await.unwrap();
        let down = faulty.inject(Injection::unavailable(
            Calls::any_of([Operation::UpdateIAmAlive]),
            "injected: heartbeat unavailable",
        ));
        until("fenced", Duration::from_secs(8), async || {
            matches!(s.fenced(), Some((_, SiloHealth::LeaseAtRisk { .. })))
        })
        .await;
        let late = state.save_versioned("K", &id, "S", &2u32).await;
        assert!(
            matches!(late, Err(RioStoreError::Fenced { .. })),
            "{late:?}"
        );
        faulty.clear(down);
        let observer = CassandraState::connect(&storage(o()).await, StateOptions::default())
            .await
            .unwrap();
        assert_eq!(
            observer.load_versioned::<u32>("K", &id, "S").await.unwrap(),
            Some((1, 1)),
            "nothing written"
        );
    }

    /// A rio server whose heartbeats fail: past the fence horizon it answers every request
    /// with an error and handles none; healthy again, it serves; declared Dead, its `run`
    /// returns and its port is closed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fenced_server_answers_no_request_and_a_dead_one_stops() {
        let cluster = unique("fence");
        // Heartbeats every 2 s: fenced 4 s after the last one, gone (hidden from rio) at 6 s.
        let o = || options_with(&cluster, false, 2 * HEARTBEAT);
        let real = table(o()).await;
        let faulty = Arc::new(FaultyTable::new(Arc::new(table(o()).await)));
        let rio = RioStorageOptions::from_membership(&o().membership);
        let s = CassandraMembershipStorage::with_wrapped_table(faulty.clone(), &real, rio)
            .await
            .unwrap();
        let placement = CassandraObjectPlacement::connect(&s, PlacementOptions::default())
            .await
            .unwrap();
        let provider = FencedClusterProvider::new(
            PeerToPeerClusterProvider::builder()
                .members_storage(s.clone())
                .interval_secs(1)
                .build(),
        );
        let mut registry = Registry::new();
        registry.add_type::<Echo>();
        registry.add_handler::<Echo, Ping>();
        let mut server = Server::builder()
            .address("0.0.0.0:0".to_string())
            .registry(registry)
            .cluster_provider(provider)
            .object_placement_provider(placement)
            .build();
        let listener = server.bind().await.unwrap();
        let advertised = Server::<
            CassandraMembershipStorage,
            FencedClusterProvider<PeerToPeerClusterProvider<CassandraMembershipStorage>>,
            CassandraObjectPlacement,
        >::try_local_addr(&listener)
        .unwrap();
        let running = tokio::spawn(async move { server.run(listener).await });
        let (ip, port) = (advertised.ip().to_string(), advertised.port().to_string());
        until("healthy", Duration::from_secs(10), async || {
            matches!(s.health(&ip, &port), Some(SiloHealth::Healthy { .. }))
        })
        .await;

        let client_storage = storage(o()).await;
        let mut client = ClientBuilder::new()
            .members_storage(client_storage)
            .timeout_millis(2000)
            .build()
            .unwrap();
        let ping = async |client: &mut rio_rs::client::Client<CassandraMembershipStorage>,
                          id: &str| {
            tokio::time::timeout(
                Duration::from_secs(10),
                client.send::<Pong, NoopError>("Echo", id, &Ping),
            )
            .await
            .expect("an answer within 10 s")
        };
        let before = ping(&mut client, "one").await.unwrap().handled;

        // Every heartbeat fails from now on: fenced within the horizon (2 periods).
        let down = faulty.inject(Injection::unavailable(
            Calls::any_of([Operation::UpdateIAmAlive]),
            "injected: heartbeat unavailable",
        ));
        let fenced_after = until("fenced", Duration::from_secs(8), async || {
            matches!(s.fenced(), Some((_, SiloHealth::LeaseAtRisk { .. })))
        })
        .await;
        for id in ["one", "two", "three"] {
            // The server itself answers: it refuses the object (rio: "upstream error").
            match ping(&mut client, id).await {
                Err(RequestError::ResponseError(ResponseError::Unknown(text))) => {
                    assert!(text.contains("upstream"), "{text}")
                }
                other => panic!("a fenced server answered {id} with {other:?}"),
            }
        }
        assert_eq!(
            HANDLED.load(Ordering::SeqCst),
            before,
            "no request handled while fenced"
        );

        faulty.clear(down);
        until("healthy again", Duration::from_secs(8), async || {
            matches!(s.health(&ip, &port), Some(SiloHealth::Healthy { .. }))
        })
        .await;
        let mut served = None;
        until("served again", Duration::from_secs(8), async || {
            served = ping(&mut client, "one").await.ok();
            served.is_some()
        })
        .await;
        assert_eq!(served.unwrap().handled, before + 1);

        // The cluster declares it dead: the server stops, as documented.
        let address = s.incarnation(&ip, &port).unwrap();
        let snapshot = real.read_row(&address).await.unwrap();
        let mut dead = snapshot.rows[0].entry.clone();
        dead.status = SiloStatus::Dead;
        assert!(
            real.update_row(&dead, &snapshot.rows[0].etag, &snapshot.version.next())
                .await
                .unwrap()
        );
        let t0 = Instant::now();
        let ended = tokio::time::timeout(Duration::from_secs(10), running)
            .await
            .expect("run returns within 10 s of the death")
            .unwrap();
        eprintln!(
            "fenced {fenced_after:?} after heartbeats failed; stopped {:?} after Dead",
            t0.elapsed()
        );
        assert!(ended.is_ok(), "{ended:?}");
        assert_eq!(s.health(&ip, &port), Some(SiloHealth::DeclaredDead));
        assert!(
            tokio::net::TcpStream::connect(("127.0.0.1", advertised.port()))
                .await
                .is_err(),
            "a stopped server accepts no connection"
        );
    }
}

mod wiring {
    use super::*;
    use cassandra_membership::InMemoryMembershipTable;
    use cassandra_membership::MembershipError;

    /// A process paused past its fence horizon (SIGSTOP, a GC pause: the keeper task has not run
    /// since) is fenced the moment it resumes: `fenced()` compares the horizon with the clock
    /// when asked, not the health the keeper last wrote (before, it answered `None`, and the
    /// placement store served, until the keeper's timer ran).
    #[tokio::test(flavor = "current_thread")]
    async fn a_server_paused_past_its_fence_is_fenced_before_its_keeper_runs() {
        let memory = Arc::new(InMemoryMembershipTable::new("paused"));
        let mut rio = RioStorageOptions::default();
        rio.heartbeat_period = Duration::from_millis(500);
        let s = CassandraMembershipStorage::with_table(memory, rio)
            .await
            .unwrap();
        let mut m = Member::new("127.0.0.1".into(), "9001".into());
        m.set_active(true);
        s.push(m).await.unwrap();
        // Let the keeper publish once: healthy.
        until("healthy", Duration::from_secs(5), async || {
            matches!(
                s.health("127.0.0.1", "9001"),
                Some(SiloHealth::Healthy { .. })
            )
        })
        .await;
        assert!(s.fenced().is_none());
        // The runtime's only thread stops (no task runs: a SIGSTOP, a GC pause) for longer
        // than `gone_after`, then resumes: the first question, before any task has run, must
        // already be "fenced".
        std::thread::sleep(s.options().gone_after() + s.options().heartbeat_period);
        assert!(
            s.fenced().is_some(),
            "serving after a pause past the fence: health {:?}",
            s.health("127.0.0.1", "9001")
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_stores_refuse_a_storage_that_is_not_on_cassandra() {
        let memory = Arc::new(InMemoryMembershipTable::new("in-memory"));
        let s = CassandraMembershipStorage::with_table(memory, RioStorageOptions::default())
            .await
            .unwrap();
        let placement = CassandraObjectPlacement::connect(&s, PlacementOptions::default()).await;
        assert!(
            matches!(&placement, Err(RioStoreError::InvalidConfiguration { option, .. }) if option == "storage"),
            "{placement:?}"
        );
        let state = CassandraState::connect(&s, StateOptions::default()).await;
        assert!(
            matches!(&state, Err(RioStoreError::InvalidConfiguration { option, .. }) if option == "storage"),
            "{state:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wrapped_table_must_wrap_the_cassandra_table_it_names() {
        let (a, b) = (unique("wrap-a"), unique("wrap-b"));
        let real_b = table(options(&b, false)).await;
        let wrapped_a = Arc::new(FaultyTable::new(Arc::new(table(options(&a, false)).await)));
        let rio = RioStorageOptions::from_membership(&options(&a, false).membership);
        let refused =
            CassandraMembershipStorage::with_wrapped_table(wrapped_a, &real_b, rio.clone()).await;
        assert!(
            matches!(&refused, Err(MembershipError::InvalidConfiguration { option, .. }) if option == "table"),
            "{refused:?}"
        );
        let wrapped_b = Arc::new(FaultyTable::new(Arc::new(table(options(&b, false)).await)));
        CassandraMembershipStorage::with_wrapped_table(wrapped_b, &real_b, rio)
            .await
            .unwrap();
    }

    #[test]
    fn store_options_name_what_is_wrong() {
        let mut s = StateOptions::default();
        s.ttl = Some(Duration::from_millis(10));
        assert!(
            matches!(s.validate(), Err(RioStoreError::InvalidConfiguration { option, .. }) if option == "ttl")
        );
        s.ttl = None;
        s.table = "1table".into();
        assert!(
            matches!(s.validate(), Err(RioStoreError::InvalidConfiguration { option, .. }) if option == "table")
        );
        let bad: Result<PlacementOptions, _> = toml::from_str("tabel = \"x\"");
        assert!(bad.is_err(), "unknown fields are refused");
    }
}

/// Two real rio servers on one Cassandra placement table, each sent the same new object at the
/// same moment by its own client: rio activates it on exactly one of them, every round.
mod rio_servers {
    use super::*;
    use rio_rs::cluster::storage::local::LocalStorage;
    use rio_rs::{LifecycleMessage, ServiceObject, ServiceObjectStateLoad};
    use std::collections::HashMap;
    use std::sync::Mutex;

    /// Which server activated which object.
    static ACTIVATIONS: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

    struct ServerName(String);

    #[derive(Default, WithId, TypeName)]
    struct Racer {
        id: String,
        /// Set by rio's `Load`: a request handled on an instance rio never loaded is reported.
        loaded: bool,
    }

    impl ServiceObject for Racer {}

    #[async_trait]
    impl ServiceObjectStateLoad for Racer {
        async fn load(&mut self, app_data: &AppData) -> Result<(), ServiceObjectLifeCycleError> {
            let server = app_data.get::<ServerName>().0.clone();
            ACTIVATIONS.lock().unwrap().push((self.id.clone(), server));
            self.loaded = true;
            Ok(())
        }
    }

    #[derive(Default, Debug, Message, TypeName, Serialize, Deserialize)]
    struct Where;

    #[derive(Default, Debug, Message, TypeName, Serialize, Deserialize)]
    struct Here {
        server: String,
        loaded: bool,
        /// The object that answered: rio's client can hand a request the late answer of an
        /// earlier one it gave up on (same connection), which names another object.
        object: String,
    }

    #[async_trait]
    impl Handler<Where> for Racer {
        type Returns = Here;
        type Error = NoopError;
        async fn handle(&mut self, _: Where, app_data: Arc<AppData>) -> Result<Here, NoopError> {
            Ok(Here {
                server: app_data.get::<ServerName>().0.clone(),
                loaded: self.loaded,
                object: self.id.clone(),
            })
        }
    }

    type RioServer = Server<
        CassandraMembershipStorage,
        FencedClusterProvider<PeerToPeerClusterProvider<CassandraMembershipStorage>>,
        CassandraObjectPlacement,
    >;

    /// Starts a rio server of `cluster`; returns its advertised address and its task.
    async fn start(cluster: &str) -> (String, tokio::task::JoinHandle<()>) {
        let s = storage(options(cluster, false)).await;
        let placement = CassandraObjectPlacement::connect(&s, PlacementOptions::default())
            .await
            .unwrap();
        let provider = FencedClusterProvider::new(
            PeerToPeerClusterProvider::builder()
                .members_storage(s)
                .interval_secs(1)
                .build(),
        );
        let mut registry = Registry::new();
        registry.add_type::<Racer>();
        registry.add_handler::<Racer, LifecycleMessage>();
        registry.add_handler::<Racer, Where>();
        let mut server: RioServer = Server::builder()
            .address("0.0.0.0:0".to_string())
            .registry(registry)
            .cluster_provider(provider)
            .object_placement_provider(placement)
            .build();
        let listener = server.bind().await.unwrap();
        let address = RioServer::try_local_addr(&listener).unwrap().to_string();
        server.app_data(ServerName(address.clone()));
        let task = tokio::spawn(async move {
            let _ = server.run(listener).await;
        });
        (address, task)
    }

    /// A client that knows only `server`, so its requests go there first.
    async fn client_of(server: &str) -> rio_rs::client::Client<LocalStorage> {
        let (ip, port) = server.rsplit_once(':').unwrap();
        let only = LocalStorage::default();
        let mut m = Member::new(ip.into(), port.into());
        m.set_active(true);
        only.push(m).await.unwrap();
        ClientBuilder::new()
            .members_storage(only)
            .timeout_millis(2000)
            .build()
            .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_rio_servers_sent_one_new_object_at_once_activate_it_once() {
        let cluster = unique("rio-race");
        let (a, task_a) = start(&cluster).await;
        let (b, task_b) = start(&cluster).await;
        let observer = storage(options(&cluster, false)).await;
        until("both servers active", Duration::from_secs(10), async || {
            observer.active_members().await.unwrap().len() == 2
        })
        .await;
        const ROUNDS: usize = 20;
        let (mut refused, mut served_rounds) = (0, 0);
        let activations_of = |id: &str| -> Vec<String> {
            ACTIVATIONS
                .lock()
                .unwrap()
                .iter()
                .filter(|(object, _)| object == id)
                .map(|(_, server)| server.clone())
                .collect()
        };
        for round in 0..ROUNDS {
            let id = format!("{cluster}-{round}");
            // New clients every round: a client that gave up on a request (the timeout below)
            // can still receive its late answer on the same connection and hand it to the next
            // request, which would read as an answer from a server without the activation.
            let (mut to_a, mut to_b) = (client_of(&a).await, client_of(&b).await);
            // A request that takes longer (a loaded node: the storage retries slow reads) is
            // dropped by the client, but may still activate on the server: checked at the end.
            let (ra, rb) = tokio::join!(
                tokio::time::timeout(
                    Duration::from_secs(10),
                    to_a.send::<Here, NoopError>("Racer", &id, &Where)
                ),
                tokio::time::timeout(
                    Duration::from_secs(10),
                    to_b.send::<Here, NoopError>("Racer", &id, &Where)
                ),
            );
            let answers: Vec<String> = [ra, rb]
                .into_iter()
                .filter_map(|r| r.ok().and_then(|r| r.ok()))
                .map(|h| {
                    if h.object != id {
                        format!("{} (an answer for {})", h.server, h.object)
                    } else if h.loaded {
                        h.server
                    } else {
                        format!("{} (an instance rio never loaded)", h.server)
                    }
                })
                .collect();
            refused += 2 - answers.len();
            let activations = activations_of(&id);
            assert!(
                activations.len() <= 1,
                "round {round}: activated on {activations:?}"
            );
            // Every answer comes from the one server the object was activated on, for this
            // round's object: no second activation, and no answer from anywhere else.
            assert!(
                answers.iter().all(|s| activations.first() == Some(s)),
                "round {round}: answered by {answers:?}, activated on {activations:?}"
            );
            served_rounds += usize::from(!answers.is_empty());
        }
        // Requests a client gave up on have had time to finish on their server.
        tokio::time::sleep(Duration::from_secs(2)).await;
        for round in 0..ROUNDS {
            let activations = activations_of(&format!("{cluster}-{round}"));
            assert!(
                activations.len() <= 1,
                "round {round}: activated on {activations:?}"
            );
        }
        assert!(
            served_rounds >= ROUNDS / 2,
            "only {served_rounds} rounds answered"
        );
        let mut by_server: HashMap<String, usize> = HashMap::new();
        for (object, server) in ACTIVATIONS.lock().unwrap().iter() {
            if object.starts_with(&cluster) {
                *by_server.entry(server.clone()).or_default() += 1;
            }
        }
        eprintln!(
            "{ROUNDS} rounds, {served_rounds} answered: at most one activation each ({by_server:?}); {refused} of {} requests refused or unanswered",
            2 * ROUNDS
        );
        task_a.abort();
        task_b.abort();
    }
}

//! Conditional writes whose answer is lost, with real faults: a proxy between the driver and the
//! real node (`CASSANDRA_CONTACT_POINTS`, default 127.0.0.1:9042) holds back the node's answer
//! past the client's timeout (the write applied), or forges a CAS write timeout before the
//! node (it did not). The stores settle both by a serial read, never by guessing.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cassandra_membership::{CassandraClusteringOptions, CassandraMembershipTable};
use cassandra_membership_rio::{
    CassandraMembershipStorage, CassandraObjectPlacement, CassandraState, PlacementOptions,
    RioStorageOptions, RioStoreError, StateOptions,
};
use scylla::client::session_builder::SessionBuilder;
use scylla::errors::{DbError, WriteType};
use scylla::statement::Consistency;
use scylla_proxy::{
    Condition, Node, Proxy, Reaction, RequestFrame, RequestOpcode, RequestReaction, RequestRule,
    ResponseFrame, ResponseReaction, ResponseRule, RunningProxy, ShardAwareness, TargetShard,
    get_exclusive_local_address,
};
use tokio::sync::mpsc;

const KEYSPACE: &str = match option_env!("CM_RIO_TEST_KEYSPACE") {
    Some(k) => k,
    None => "cm_rio_test",
};

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

fn options(cluster: &str) -> CassandraClusteringOptions {
    let points: Vec<String> = std::env::var("CASSANDRA_CONTACT_POINTS")
        .unwrap_or_else(|_| "127.0.0.1:9042".into())
        .split(',')
        .map(|s| s.trim().to_owned())
        .collect();
    CassandraClusteringOptions::default()
        .keyspace(KEYSPACE)
        .service_id("rio-test")
        .cluster_id(cluster)
        .contact_points(points)
        .table("rio_members")
        .create_keyspace_simple(1)
        .request_timeout(Duration::from_millis(1500))
}

/// A membership storage whose session goes through a proxy in front of the first contact point.
async fn proxied(cluster: &str) -> (RunningProxy, CassandraMembershipStorage) {
    proxied_with(options(cluster)).await
}

async fn proxied_with(o: CassandraClusteringOptions) -> (RunningProxy, CassandraMembershipStorage) {
    // The keyspace and tables exist (created without the proxy, with generous timeouts).
    let direct =
        CassandraMembershipStorage::connect(o.clone().request_timeout(Duration::from_secs(30)))
            .await
            .unwrap_or_else(|e| panic!("cannot use Cassandra at {:?}: {e}", o.contact_points));
    CassandraState::connect(&direct, StateOptions::default())
        .await
        .unwrap();
    CassandraObjectPlacement::connect(&direct, PlacementOptions::default())
        .await
        .unwrap();
    let real: SocketAddr = o.contact_points[0]
        .parse()
        .expect("contact point is ip:port");
    let proxy_addr = SocketAddr::new(get_exclusive_local_address(), real.port());
    let proxy = Proxy::builder()
        .with_node(
            Node::builder()
                .real_address(real)
                .proxy_address(proxy_addr)
                .shard_awareness(ShardAwareness::Unaware)
                .build(),
        )
        .build()
        .run()
        .await
        .expect("proxy starts");
    let session = SessionBuilder::new()
        .known_node_addr(proxy_addr)
        .address_translator(Arc::new(HashMap::from([(real, proxy_addr)])))
        .build()
        .await
        .expect("session through the proxy");
    let rio = RioStorageOptions::from_membership(&o.membership);
    let table = CassandraMembershipTable::with_session(Arc::new(session), o).unwrap();
    let storage = CassandraMembershipStorage::with_cassandra_table(table, rio)
        .await
        .unwrap();
    (proxy, storage)
}

/// Counts how often a proxy reaction was performed.
type Fired<T> = mpsc::UnboundedReceiver<(T, Option<TargetShard>)>;

fn fired<T>(rx: &mut Fired<T>) -> usize {
    std::iter::from_fn(|| rx.try_recv().ok()).count()
}

/// The node's next answer carrying `[applied]` is held back past the client's 1.5 s timeout.
fn hold_back_next_answer(proxy: &mut RunningProxy) -> Fired<ResponseFrame> {
    let (tx, rx) = mpsc::unbounded_channel();
    proxy.running_nodes[0].change_response_rules(Some(vec![ResponseRule(
        Condition::BodyContainsCaseSensitive(b"[applied]".to_vec().into())
            .and(Condition::TrueForLimitedTimes(1)),
        ResponseReaction::delay(Duration::from_secs(4)).with_feedback_when_performed(tx),
    )]));
    rx
}

/// The execution whose body holds `marker`, after `skip` such executions pass, is answered by
/// the proxy with a CAS write timeout: it never reaches the node.
fn forge_cas_timeout(proxy: &mut RunningProxy, marker: &str, skip: usize) -> Fired<RequestFrame> {
    let (tx, rx) = mpsc::unbounded_channel();
    let matching = || {
        Condition::RequestOpcode(RequestOpcode::Execute).and(Condition::BodyContainsCaseSensitive(
            marker.as_bytes().to_vec().into(),
        ))
    };
    let mut rules = Vec::new();
    if skip > 0 {
        // The first matching rule reacts: this one lets the first `skip` through.
        rules.push(RequestRule(
            matching().and(Condition::TrueForLimitedTimes(skip)),
            RequestReaction::noop(),
        ));
    }
    rules.push(RequestRule(
        matching().and(Condition::TrueForLimitedTimes(1)),
        RequestReaction::forge_with_error(DbError::WriteTimeout {
            consistency: Consistency::Serial,
            received: 0,
            required: 1,
            write_type: WriteType::Cas,
        })
        .with_feedback_when_performed(tx),
    ));
    proxy.running_nodes[0].change_request_rules(Some(rules));
    rx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_save_whose_answer_is_lost_is_known_to_have_applied() {
    let (mut proxy, storage) = proxied(&unique("lost-save")).await;
    let state = CassandraState::connect(&storage, StateOptions::default())
        .await
        .unwrap();
    let id = unique("object");
    let mut f1 = hold_back_next_answer(&mut proxy);
    assert_eq!(
        state.save_versioned("K", &id, "S", &1u32).await.unwrap(),
        1,
        "the insert applied"
    );
    assert_eq!(fired(&mut f1), 1, "the fault was injected");
    let mut f2 = hold_back_next_answer(&mut proxy);
    assert_eq!(
        state.save_versioned("K", &id, "S", &2u32).await.unwrap(),
        2,
        "the update applied"
    );
    assert_eq!(fired(&mut f2), 1, "the fault was injected");
    let (value, version) = state
        .load_versioned::<u32>("K", &id, "S")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((value, version), (2, 2));
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_save_that_never_reached_the_node_is_sent_again_once_proven_lost() {
    let (mut proxy, storage) = proxied(&unique("forged-save")).await;
    let state = CassandraState::connect(&storage, StateOptions::default())
        .await
        .unwrap();
    let id = unique("object");
    // A save's first execution is its conditional write.
    let mut f3 = forge_cas_timeout(&mut proxy, &id, 0);
    assert_eq!(state.save_versioned("K", &id, "S", &1u32).await.unwrap(), 1);
    assert_eq!(fired(&mut f3), 1, "the fault was injected");
    let mut f4 = forge_cas_timeout(&mut proxy, &id, 0);
    assert_eq!(state.save_versioned("K", &id, "S", &2u32).await.unwrap(), 2);
    assert_eq!(fired(&mut f4), 1, "the fault was injected");
    let (value, version) = state
        .load_versioned::<u32>("K", &id, "S")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((value, version), (2, 2), "each save applied exactly once");
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placement_whose_answer_is_lost_is_known_to_be_ours() {
    let (mut proxy, storage) = proxied(&unique("lost-place")).await;
    let placement = CassandraObjectPlacement::connect(&storage, PlacementOptions::default())
        .await
        .unwrap();
    let id = unique("object");
    let mut f5 = hold_back_next_answer(&mut proxy);
    placement
        .place("K", &id, "127.0.0.1:9001")
        .await
        .expect("the insert applied");
    assert_eq!(fired(&mut f5), 1, "the fault was injected");
    let other = unique("object");
    // A placement writes its index row (plain) first, then the conditional insert.
    let mut f6 = forge_cas_timeout(&mut proxy, &other, 1);
    placement
        .place("K", &other, "127.0.0.1:9001")
        .await
        .expect("sent again once proven lost");
    assert_eq!(fired(&mut f6), 1, "the fault was injected");
    assert_eq!(
        placement.lookup_server("K", &id).await.unwrap().as_deref(),
        Some("127.0.0.1:9001")
    );
    assert_eq!(
        placement
            .lookup_server("K", &other)
            .await
            .unwrap()
            .as_deref(),
        Some("127.0.0.1:9001")
    );
    drop(proxy);
}

/// The execution whose body holds `marker` is answered by the proxy with a read timeout.
fn forge_read_timeout(proxy: &mut RunningProxy, marker: &str) -> Fired<RequestFrame> {
    let (tx, rx) = mpsc::unbounded_channel();
    proxy.running_nodes[0].change_request_rules(Some(vec![RequestRule(
        Condition::RequestOpcode(RequestOpcode::Execute)
            .and(Condition::BodyContainsCaseSensitive(
                marker.as_bytes().to_vec().into(),
            ))
            .and(Condition::TrueForLimitedTimes(1)),
        RequestReaction::forge_with_error(DbError::ReadTimeout {
            consistency: Consistency::Serial,
            received: 0,
            required: 1,
            data_present: false,
        })
        .with_feedback_when_performed(tx),
    )]));
    rx
}

/// An object loaded its state, was shut down and is activated again on the same server, whose
/// load now fails: rio starts it from its default state. Saving that default must be refused,
/// not applied on the version the first activation loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_save_after_a_failed_load_never_overwrites_the_stored_state() {
    let (mut proxy, storage) = proxied(&unique("failed-load")).await;
    let state = CassandraState::connect(&storage, StateOptions::default())
        .await
        .unwrap();
    let id = unique("object");
    state.save_versioned("K", &id, "S", &7u32).await.unwrap();
    assert_eq!(
        state.load_versioned::<u32>("K", &id, "S").await.unwrap(),
        Some((7, 1))
    );
    let mut f = forge_read_timeout(&mut proxy, &id);
    assert!(state.load_versioned::<u32>("K", &id, "S").await.is_err());
    assert_eq!(fired(&mut f), 1, "the fault was injected");
    let reset = state.save_versioned("K", &id, "S", &0u32).await;
    assert!(
        matches!(reset, Err(RioStoreError::StateConflict { .. })),
        "{reset:?}"
    );
    assert_eq!(
        state.load_versioned::<u32>("K", &id, "S").await.unwrap(),
        Some((7, 1)),
        "the stored state is intact"
    );
    drop(proxy);
}

/// With expiry on, one placement whose renewal keeps failing (every statement naming it is
/// answered with a CAS write timeout): the server's other placements are still renewed and
/// served; only that one is refused once its renewal is overdue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_placement_whose_renewal_fails_does_not_fence_the_others() {
    let mut m = cassandra_membership::MembershipOptions::default();
    m.defunct_silo_expiration = Duration::from_secs(5);
    m.i_am_alive_table_publish_timeout = Duration::from_secs(1);
    let o = options(&unique("renew-one"))
        .table("rio_members_ttl5")
        .ttl(true)
        .membership(m);
    let (mut proxy, storage) = proxied_with(o).await;
    let mut member = rio_rs::cluster::storage::Member::new("127.0.0.1".into(), "9001".into());
    member.set_active(true);
    rio_rs::cluster::storage::MembershipStorage::push(&storage, member)
        .await
        .unwrap();
    let placement = CassandraObjectPlacement::connect(&storage, PlacementOptions::default())
        .await
        .unwrap();
    let (bad, good) = (unique("bad"), unique("good"));
    placement.place("K", &bad, "127.0.0.1:9001").await.unwrap();
    placement.place("K", &good, "127.0.0.1:9001").await.unwrap();
    // Every statement naming `bad` from now on fails as if its outcome were unknown.
    let (tx, mut rx) = mpsc::unbounded_channel();
    proxy.running_nodes[0].change_request_rules(Some(vec![RequestRule(
        Condition::RequestOpcode(RequestOpcode::Execute).and(Condition::BodyContainsCaseSensitive(
            bad.as_bytes().to_vec().into(),
        )),
        RequestReaction::forge_with_error(DbError::WriteTimeout {
            consistency: Consistency::Serial,
            received: 0,
            required: 1,
            write_type: WriteType::Cas,
        })
        .with_feedback_when_performed(tx),
    )]));
    // The renewal margin: one interval (1 s) + gone_after (3 s).
    tokio::time::sleep(Duration::from_millis(5500)).await;
    assert!(fired(&mut rx) >= 2, "the renewals of `bad` failed");
    assert_eq!(
        placement
            .lookup_server("K", &good)
            .await
            .unwrap()
            .as_deref(),
        Some("127.0.0.1:9001"),
        "a placement renewed on time is served"
    );
    assert!(placement.lookup_server("K", &bad).await.is_err());
    drop(proxy);
}

/// A save whose answer is lost, and the serial read then finds a version beyond the one it
/// wrote, by another writer: the save may have applied (the other saved on top of it) or not.
/// That is an unknown outcome, not a conflict that "wrote nothing".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_save_overtaken_by_another_writer_is_unknown_not_a_conflict() {
    let cluster = unique("overtaken");
    let (mut proxy, storage) = proxied(&cluster).await;
    let a = CassandraState::connect(&storage, StateOptions::default())
        .await
        .unwrap();
    let direct = CassandraMembershipStorage::connect(
        options(&cluster).request_timeout(Duration::from_secs(30)),
    )
    .await
    .unwrap();
    let b = CassandraState::connect(&direct, StateOptions::default())
        .await
        .unwrap();
    let id = unique("object");
    assert_eq!(a.save_versioned("K", &id, "S", &1u32).await.unwrap(), 1);
    let mut held = hold_back_next_answer(&mut proxy);
    let saving = tokio::spawn({
        let (a, id) = (a.clone(), id.clone());
        async move { a.save_versioned("K", &id, "S", &2u32).await }
    });
    // Within the 1.5 s client timeout: b reads a's save and saves on top of it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        b.load_versioned::<u32>("K", &id, "S").await.unwrap(),
        Some((2, 2)),
        "a's save applied"
    );
    assert_eq!(b.save_versioned("K", &id, "S", &3u32).await.unwrap(), 3);
    let answer = saving.await.unwrap();
    assert_eq!(fired(&mut held), 1, "the fault was injected");
    assert!(
        matches!(answer, Err(RioStoreError::OutcomeUnknown { .. })),
        "{answer:?}"
    );
    drop(proxy);
}

/// rio's admin `Shutdown` ends `Server::run` on any error of `remove`: a delete whose answer is
/// a CAS timeout before it reached the node is proven not applied by the serial read and sent
/// again, and the placement is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remove_whose_delete_never_reached_the_node_is_sent_again() {
    let (mut proxy, storage) = proxied(&unique("lost-remove")).await;
    let mut member = rio_rs::cluster::storage::Member::new("127.0.0.1".into(), "9001".into());
    member.set_active(true);
    rio_rs::cluster::storage::MembershipStorage::push(&storage, member)
        .await
        .unwrap();
    let placement = CassandraObjectPlacement::connect(&storage, PlacementOptions::default())
        .await
        .unwrap();
    let id = unique("object");
    placement.place("K", &id, "127.0.0.1:9001").await.unwrap();
    // remove: a plain read of the holder, then the conditional delete (forged).
    let mut f = forge_cas_timeout(&mut proxy, &id, 1);
    rio_rs::object_placement::ObjectPlacement::remove(&placement, &rio_rs::ObjectId::new("K", &id))
        .await
        .unwrap();
    assert_eq!(fired(&mut f), 1, "the fault was injected");
    assert_eq!(placement.lookup_server("K", &id).await.unwrap(), None);
    drop(proxy);
}

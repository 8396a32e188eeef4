//! Every answer the node and the network can give a conditional write, forged or provoked with a
//! proxy between the driver and the real node: the provider's answer is checked against what the
//! table then shows — never `false` (or a plain error) while the write is visible.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cassandra_membership::conformance::new_entry;
use cassandra_membership::runtime::protocol;
use cassandra_membership::{
    ETag, MembershipEntry, MembershipError, MembershipTable, TableVersion, Timestamp,
};
use scylla::client::execution_profile::ExecutionProfile;
use scylla::errors::{DbError, WriteType};
use scylla::policies::retry::{RequestInfo, RetryDecision, RetryPolicy, RetrySession};
use scylla::statement::Consistency;
use scylla_proxy::{
    Condition, Reaction, RequestFrame, RequestOpcode, RequestReaction, RequestRule, ResponseFrame,
    ResponseOpcode, ResponseReaction, ResponseRule, RunningProxy,
};

use crate::outcomes::{proxied, proxied_with};
use crate::utils::{KEYSPACE, session_with_keyspace, unique};

/// The conditional batch writing `e`'s row.
fn batch_for(e: &MembershipEntry) -> Condition {
    Condition::RequestOpcode(RequestOpcode::Batch).and(Condition::BodyContainsCaseSensitive(
        e.address.to_string().into_bytes().into(),
    ))
}

/// The node's answer to a conditional write.
fn applied_reply() -> Condition {
    Condition::BodyContainsCaseSensitive(b"[applied]".to_vec().into())
}

/// What Paxos's commit phase throws after the proposal was accepted: Unavailable at the commit
/// level. (At the serial level it is the check before a round proposes, which proves the write
/// never applied: the provider reports that as `Unavailable`.)
fn unavailable() -> DbError {
    DbError::Unavailable {
        consistency: Consistency::Quorum,
        required: 1,
        alive: 0,
    }
}

/// The node's next answer to a conditional write is replaced by `error`: the write applied, the
/// client hears otherwise.
fn replace_next_answer(proxy: &mut RunningProxy, error: DbError) {
    proxy.running_nodes[0].change_response_rules(Some(vec![ResponseRule(
        applied_reply().and(Condition::TrueForLimitedTimes(1)),
        ResponseReaction::transform_frame(Arc::new(move |r: ResponseFrame| {
            ResponseFrame::forged_error(r.params, error.clone(), None).expect("valid error")
        })),
    )]));
}

/// How many conditional batches for `e` reach the node from now on.
fn count_batches(proxy: &mut RunningProxy, e: &MembershipEntry) -> Arc<AtomicUsize> {
    let sent = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&sent);
    proxy.running_nodes[0].change_request_rules(Some(vec![RequestRule(
        batch_for(e),
        RequestReaction::transform_frame(Arc::new(move |f: RequestFrame| {
            counter.fetch_add(1, Ordering::SeqCst);
            f
        })),
    )]));
    sent
}

async fn visible(table: &dyn MembershipTable, e: &MembershipEntry) -> bool {
    !table.read_row(&e.address).await.unwrap().rows.is_empty()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applied_false_reply_carrying_our_own_tags_is_reported_as_applied() {
    let (mut proxy, table) = proxied(&unique("own-tags")).await;
    let v = table.read_all().await.unwrap().version;
    let e = new_entry(Timestamp::now());
    // The node applies the batch; its reply is dropped and the proxy sends the same proposal
    // again. The node then checks the conditions against our own write and answers
    // `[applied] = false` with the tags we wrote — what a Paxos round that completed our
    // pre-empted proposal answers.
    let sent: Arc<Mutex<Option<RequestFrame>>> = Arc::default();
    let keep = Arc::clone(&sent);
    proxy.running_nodes[0].change_request_rules(Some(vec![RequestRule(
        batch_for(&e).and(Condition::TrueForLimitedTimes(1)),
        RequestReaction::transform_frame(Arc::new(move |f: RequestFrame| {
            *keep.lock().unwrap() = Some(f.clone());
            f
        })),
    )]));
    let replay = Arc::clone(&sent);
    proxy.running_nodes[0].change_response_rules(Some(vec![ResponseRule(
        applied_reply().and(Condition::TrueForLimitedTimes(1)),
        ResponseReaction::forge_response(Arc::new(move |_: ResponseFrame| {
            replay
                .lock()
                .unwrap()
                .clone()
                .expect("the batch went through")
        })),
    )]));
    let outcome = table.insert_row(&e, &v.next()).await;
    assert!(sent.lock().unwrap().is_some(), "the batch was replayed");
    assert!(visible(&table, &e).await, "the write applied");
    assert!(
        matches!(outcome, Ok(true)),
        "our own write is visible, so the answer must be true: {outcome:?}"
    );
    drop(table);
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_still_queued_after_the_client_gave_up_can_no_longer_apply_once_reported_false() {
    let (mut proxy, table) = proxied(&unique("late-write")).await;
    let v = table.read_all().await.unwrap().version;
    let e = new_entry(Timestamp::now());
    // The batch sits in the network for 4 s; the client gives up after 1.5 s and decides the
    // outcome while the write has not reached the node yet — and then it does.
    proxy.running_nodes[0].change_request_rules(Some(vec![RequestRule(
        batch_for(&e).and(Condition::TrueForLimitedTimes(1)),
        RequestReaction::delay(Duration::from_secs(4)),
    )]));
    let started = Instant::now();
    let outcome = table.insert_row(&e, &v.next()).await;
    let took = started.elapsed();
    tokio::time::sleep_until((started + Duration::from_secs(6)).into()).await;
    let now_visible = visible(&table, &e).await;
    match &outcome {
        Ok(false) => assert!(
            !now_visible,
            "reported false, but the write applied after the answer (took {took:?})"
        ),
        Ok(true) => assert!(now_visible),
        Err(err) => assert!(err.is_outcome_unknown(), "{err}"),
    }
    // With the fence, the answer is definite: false, and the late write failed its condition.
    assert!(matches!(outcome, Ok(false)), "{outcome:?}");
    let after = table.read_all().await.unwrap().version;
    assert_eq!(
        after.version, v.version,
        "the fence keeps the version number"
    );
    assert_ne!(after.etag, v.etag, "the fence moved the version tag");
    drop(table);
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unavailable_after_the_write_applied_is_not_reported_as_not_applied() {
    let (mut proxy, table) = proxied(&unique("unavailable")).await;
    let v = table.read_all().await.unwrap().version;
    let e = new_entry(Timestamp::now());
    // Paxos can throw Unavailable in its commit phase, after the proposal was accepted.
    replace_next_answer(&mut proxy, unavailable());
    let outcome = table.insert_row(&e, &v.next()).await;
    assert!(visible(&table, &e).await, "the write applied");
    assert!(
        matches!(outcome, Ok(true)),
        "the write is visible: never false, never a plain error: {outcome:?}"
    );
    drop(table);
    drop(proxy);
}

/// A host's own retry policy that retries every failure once on the same node.
#[derive(Debug)]
struct RetryEverythingOnce;

struct RetryEverythingOnceSession(bool);

impl RetryPolicy for RetryEverythingOnce {
    fn new_session(&self) -> Box<dyn RetrySession> {
        Box::new(RetryEverythingOnceSession(false))
    }
}

impl RetrySession for RetryEverythingOnceSession {
    fn decide_should_retry(&mut self, _: RequestInfo) -> RetryDecision {
        if std::mem::replace(&mut self.0, true) {
            RetryDecision::DontRetry
        } else {
            RetryDecision::RetrySameTarget(None)
        }
    }
    fn reset(&mut self) {
        self.0 = false;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hosts_retrying_session_never_resends_a_conditional_write() {
    let (mut proxy, table) = proxied_with(&unique("host-retry"), |b| {
        b.default_execution_profile_handle(
            ExecutionProfile::builder()
                .retry_policy(Arc::new(RetryEverythingOnce))
                .build()
                .into_handle(),
        )
    })
    .await;
    let v = table.read_all().await.unwrap().version;
    let e = new_entry(Timestamp::now());
    let sent = count_batches(&mut proxy, &e);
    replace_next_answer(&mut proxy, unavailable());
    let outcome = table.insert_row(&e, &v.next()).await;
    assert_eq!(sent.load(Ordering::SeqCst), 1, "the batch was sent once");
    assert!(visible(&table, &e).await, "the write applied");
    assert!(matches!(outcome, Ok(true)), "{outcome:?}");
    drop(table);
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_whose_insert_had_an_unknown_outcome_can_be_retried() {
    let (mut proxy, table) = proxied(&unique("join-retry")).await;
    let e = new_entry(Timestamp::now());
    // The join's insert (after its read): it applies, its answer is lost (Unavailable), and the
    // re-reads that would resolve it fail too — the caller gets OutcomeUnknown.
    let v = table.read_all().await.unwrap().version;
    replace_next_answer(&mut proxy, unavailable());
    proxy.running_nodes[0].change_request_rules(Some(vec![RequestRule(
        Condition::RequestOpcode(RequestOpcode::Execute),
        RequestReaction::forge_with_error(unavailable()),
    )]));
    let first = table.insert_row(&e, &v.next()).await;
    assert!(
        first
            .as_ref()
            .is_err_and(MembershipError::is_outcome_unknown),
        "{first:?}"
    );
    proxy.running_nodes[0].change_request_rules(None);
    proxy.running_nodes[0].change_response_rules(None);
    assert!(visible(&table, &e).await, "the insert had applied");
    // The caller retries the join with the same entry.
    protocol::join(&table, &e)
        .await
        .expect("retrying the join of the same incarnation continues");
    let s = table.read_all().await.unwrap();
    assert_eq!(s.rows.len(), 1);
    assert_eq!(s.version.version, 1, "the retry wrote nothing more");
    // Another incarnation at the same address (another start time) is still refused.
    let mut other = e.clone();
    other.start_time = e.start_time.saturating_add(Duration::from_secs(1));
    assert!(protocol::join(&table, &other).await.is_err());
    drop(table);
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_version_at_its_maximum_is_corrupt_data() {
    let s = session_with_keyspace().await;
    let (_proxy, table) = proxied(&unique("max-version")).await;
    s.query_unpaged(
        format!(
            "UPDATE {KEYSPACE}.membership SET version = ?, version_etag = ? \
             WHERE service_id = 'test-service' AND cluster_id = ? AND silo = ''"
        ),
        (i64::MAX, uuid::Uuid::new_v4(), table.cluster_id()),
    )
    .await
    .unwrap();
    let v = table.read_all().await.unwrap().version;
    let e = new_entry(Timestamp::now());
    let err = table.insert_row(&e, &v.next()).await.unwrap_err();
    assert!(
        matches!(err, MembershipError::CorruptData { .. }),
        "a version that cannot move on is corrupt data: {err}"
    );
}

fn cas_write_timeout() -> DbError {
    DbError::WriteTimeout {
        consistency: Consistency::Serial,
        received: 0,
        required: 1,
        write_type: WriteType::Cas,
    }
}

/// The next conditional batch for `e` is answered by the proxy with a CAS write timeout and
/// never reaches the node: the provider must resolve (and fence) it.
fn time_out_before_the_node(proxy: &mut RunningProxy, e: &MembershipEntry) {
    proxy.running_nodes[0].change_request_rules(Some(vec![RequestRule(
        batch_for(e).and(Condition::TrueForLimitedTimes(1)),
        RequestReaction::forge_with_error(cas_write_timeout()),
    )]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_answered_false_with_its_own_tag_had_applied_so_the_write_did_not() {
    let (mut proxy, table) = proxied(&unique("fence-own-tag")).await;
    let v = table.read_all().await.unwrap().version;
    let e = new_entry(Timestamp::now());
    // The batch never reaches the node; the fence (the provider's next conditional statement,
    // an EXECUTE) applies, its reply is dropped and the proxy sends the fence again: the node
    // answers `[applied] = false` showing the fence's own fresh tag.
    let last_execute: Arc<Mutex<Option<RequestFrame>>> = Arc::default();
    let keep = Arc::clone(&last_execute);
    proxy.running_nodes[0].change_request_rules(Some(vec![
        RequestRule(
            batch_for(&e).and(Condition::TrueForLimitedTimes(1)),
            RequestReaction::forge_with_error(cas_write_timeout()),
        ),
        RequestRule(
            Condition::RequestOpcode(RequestOpcode::Execute),
            RequestReaction::transform_frame(Arc::new(move |f: RequestFrame| {
                *keep.lock().unwrap() = Some(f.clone());
                f
            })),
        ),
    ]));
    let replay = Arc::clone(&last_execute);
    proxy.running_nodes[0].change_response_rules(Some(vec![ResponseRule(
        applied_reply().and(Condition::TrueForLimitedTimes(1)),
        ResponseReaction::forge_response(Arc::new(move |_: ResponseFrame| {
            replay
                .lock()
                .unwrap()
                .clone()
                .expect("the fence went through")
        })),
    )]));
    let outcome = table.insert_row(&e, &v.next()).await;
    proxy.running_nodes[0].change_request_rules(None);
    proxy.running_nodes[0].change_response_rules(None);
    assert!(
        !visible(&table, &e).await,
        "the write never reached the node"
    );
    let after = table.read_all().await.unwrap().version;
    assert_ne!(after.etag, v.etag, "the fence applied");
    assert!(
        matches!(outcome, Ok(false)),
        "the fence applied, so the write can never apply: {outcome:?}"
    );
    drop(table);
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_reply_to_a_write_that_applied_is_resolved_not_corrupt_data() {
    let (mut proxy, table) = proxied(&unique("void-reply")).await;
    let v = table.read_all().await.unwrap().version;
    let e = new_entry(Timestamp::now());
    // The node applies the batch; its reply is replaced by a RESULT of kind Void (no rows, no
    // [applied]): the write reached a coordinator, so the reply says nothing about its outcome.
    proxy.running_nodes[0].change_response_rules(Some(vec![ResponseRule(
        applied_reply().and(Condition::TrueForLimitedTimes(1)),
        ResponseReaction::transform_frame(Arc::new(|r: ResponseFrame| {
            ResponseFrame::new(r.params, ResponseOpcode::Result, vec![0, 0, 0, 1].into())
        })),
    )]));
    let outcome = table.insert_row(&e, &v.next()).await;
    assert!(visible(&table, &e).await, "the write applied");
    assert!(
        matches!(outcome, Ok(true)),
        "an unreadable reply is ambiguous, and the re-read shows our write: {outcome:?}"
    );
    drop(table);
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ambiguous_insert_never_fences_a_missing_or_damaged_version_into_existence() {
    let (mut proxy, table) = proxied(&unique("no-version")).await;
    // A cluster without any version (deleted, or never initialized with one).
    let bare = table.for_cluster(unique("no-version")).unwrap();
    let absent = bare.read_all().await.unwrap().version;
    assert!(absent.etag.is_absent());
    let e = new_entry(Timestamp::now());
    time_out_before_the_node(&mut proxy, &e);
    let outcome = bare.insert_row(&e, &absent.next()).await;
    proxy.running_nodes[0].change_request_rules(None);
    assert!(
        bare.read_all().await.unwrap().version.etag.is_absent(),
        "resolving the insert created a version ({outcome:?})"
    );
    assert!(
        outcome
            .as_ref()
            .is_err_and(MembershipError::is_outcome_unknown),
        "{outcome:?}"
    );
    // A damaged version: the tag is there, the number is not.
    let s = session_with_keyspace().await;
    let tag = uuid::Uuid::new_v4();
    s.query_unpaged(
        format!(
            "UPDATE {KEYSPACE}.membership SET version = null, version_etag = ? \
             WHERE service_id = 'test-service' AND cluster_id = ? AND silo = ''"
        ),
        (tag, table.cluster_id()),
    )
    .await
    .unwrap();
    let damaged = TableVersion {
        version: 7,
        etag: ETag::new(tag.to_string()),
    };
    let e = new_entry(Timestamp::now());
    time_out_before_the_node(&mut proxy, &e);
    let outcome = table.insert_row(&e, &damaged.next()).await;
    proxy.running_nodes[0].change_request_rules(None);
    let (version, etag): (Option<i64>, Option<uuid::Uuid>) = s
        .query_unpaged(
            format!(
                "SELECT version, version_etag FROM {KEYSPACE}.membership \
                 WHERE service_id = 'test-service' AND cluster_id = ? AND silo = ''"
            ),
            (table.cluster_id(),),
        )
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .first_row()
        .unwrap();
    assert_eq!(
        (version, etag),
        (None, Some(tag)),
        "resolving the insert rewrote the damaged version ({outcome:?})"
    );
    assert!(
        outcome
            .as_ref()
            .is_err_and(MembershipError::is_outcome_unknown),
        "{outcome:?}"
    );
    drop(table);
    drop(proxy);
}

/// A due lease renewal (a read, a TTL read, a Paxos round) slower than the heartbeat's
/// call — as while one node of three was dead and not yet convicted — kept the heartbeat's write
/// behind it from ever running: the runtime cut the call, and the lease, still due, made the next
/// heartbeat renew first again. The heartbeat lands first now; the renewal gets what is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_slower_than_the_call_never_keeps_the_heartbeat_from_landing() {
    use cassandra_membership::{HeartbeatOutcome, MembershipOptions};
    use scylla::client::session_builder::SessionBuilder;
    use scylla::policies::host_filter::AllowListHostFilter;

    crate::utils::session_with_keyspace().await;
    let (mut proxy, proxy_addr, real) = crate::outcomes::start_proxy().await;
    // Every statement through the proxy: on a ring the driver would reach the other nodes directly.
    let session = SessionBuilder::new()
        .known_node_addr(proxy_addr)
        .address_translator(Arc::new(std::collections::HashMap::from([(
            real, proxy_addr,
        )])))
        .host_filter(Arc::new(
            AllowListHostFilter::new([real]).expect("an address"),
        ))
        .build()
        .await
        .expect("session through the proxy");
    let call = Duration::from_secs(1);
    let mut membership = MembershipOptions::default();
    membership.i_am_alive_table_publish_timeout = call;
    membership.defunct_silo_expiration = Duration::from_secs(20);
    let table = cassandra_membership::CassandraMembershipTable::with_session(
        Arc::new(session),
        crate::utils::options(&unique("slow-renewal"))
            // A table of its own: the shared one carries no TTL (TtlMismatch when run after the
            // tests that create it).
            .table(unique("slow_renewal").replace('-', "_")[..24].to_owned())
            .ttl(true)
            .ttl_renewal_interval(Some(Duration::from_secs(1)))
            .membership(membership),
    )
    .expect("options");
    table.initialize(true).await.expect("initialize");
    let e = new_entry(Timestamp::now());
    let v = table.read_all().await.expect("read").version.next();
    assert!(table.insert_row(&e, &v).await.expect("insert"));
    table
        .update_i_am_alive(&e.address, Timestamp::now())
        .await
        .expect("a first heartbeat");
    tokio::time::sleep(Duration::from_millis(1_200)).await; // the renewal is due
    // The renewal's conditional batch is held 3 s: it outlasts the 1 s call.
    proxy.running_nodes[0].change_request_rules(Some(vec![RequestRule(
        Condition::RequestOpcode(RequestOpcode::Batch),
        RequestReaction::delay(Duration::from_secs(3)),
    )]));
    let time = Timestamp::now();
    let r = tokio::time::timeout(call, table.update_i_am_alive(&e.address, time)).await;
    proxy.running_nodes[0].change_request_rules(None);
    let outcome = r
        .expect("the heartbeat answers within its call")
        .expect("the heartbeat succeeds");
    assert!(
        matches!(outcome, HeartbeatOutcome::Refreshed { .. }),
        "{outcome:?}"
    );
    let row = table.read_row(&e.address).await.expect("read the row");
    let stored = row.get(&e.address).expect("the row").entry.i_am_alive_time;
    assert_eq!(stored.as_millis(), time.as_millis(), "the heartbeat landed");
}

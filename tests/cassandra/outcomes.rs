//! Honest outcomes of conditional writes, with real faults: a proxy between the driver and the
//! real node forges a CAS write timeout (the write never reached the node), or holds back the
//! node's answer until the client times out (the write did apply).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cassandra_membership::conformance::new_entry;
use cassandra_membership::{CassandraMembershipTable, MembershipTable, Timestamp};
use scylla::client::session_builder::SessionBuilder;
use scylla::errors::{DbError, WriteType};
use scylla::statement::Consistency;
use scylla_proxy::{
    Condition, Node, Proxy, Reaction, RequestOpcode, RequestReaction, RequestRule,
    ResponseReaction, ResponseRule, RunningProxy, ShardAwareness, get_exclusive_local_address,
};

use crate::utils::{contact_points, options, session_with_keyspace, unique};

/// A proxy in front of the first contact point, and a table whose session goes through it.
pub(crate) async fn proxied(cluster: &str) -> (RunningProxy, CassandraMembershipTable) {
    proxied_with(cluster, |b| b).await
}

/// A running proxy in front of the first contact point: (proxy, its address, the real address).
pub(crate) async fn start_proxy() -> (RunningProxy, SocketAddr, SocketAddr) {
    let real: SocketAddr = contact_points()[0]
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
    (proxy, proxy_addr, real)
}

/// [`proxied`] with a host's own session settings (e.g. its own retry policy).
pub(crate) async fn proxied_with(
    cluster: &str,
    host: impl FnOnce(SessionBuilder) -> SessionBuilder,
) -> (RunningProxy, CassandraMembershipTable) {
    session_with_keyspace().await; // the keyspace exists
    let (proxy, proxy_addr, real) = start_proxy().await;
    let session = host(
        SessionBuilder::new()
            .known_node_addr(proxy_addr)
            .address_translator(Arc::new(HashMap::from([(real, proxy_addr)]))),
    )
    .build()
    .await
    .expect("session through the proxy");
    let table = CassandraMembershipTable::with_session(
        Arc::new(session),
        options(cluster).request_timeout(Duration::from_millis(1500)),
    )
    .unwrap();
    table.initialize(true).await.unwrap();
    (proxy, table)
}

/// The node's next answer to a conditional write (it carries `[applied]`) is held back past the
/// client's 1.5 s timeout: the driver reports a timeout for a write the node did apply.
fn hold_back_next_answer(proxy: &mut RunningProxy) {
    proxy.running_nodes[0].change_response_rules(Some(vec![ResponseRule(
        Condition::BodyContainsCaseSensitive(b"[applied]".to_vec().into())
            .and(Condition::TrueForLimitedTimes(1)),
        ResponseReaction::delay(Duration::from_secs(4)),
    )]));
}

/// A CAS write timeout as a coordinator reports it: the write may or may not have applied.
pub(crate) fn cas_write_timeout() -> DbError {
    DbError::WriteTimeout {
        consistency: Consistency::Serial,
        received: 0,
        required: 1,
        write_type: WriteType::Cas,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cas_timeout_before_the_node_is_fenced_and_resolved_as_not_applied() {
    let (mut proxy, table) = proxied(&unique("cas-timeout")).await;
    let v = table.read_all().await.unwrap().version;
    let e = new_entry(Timestamp::now());
    // The batch carrying this silo's key is answered by the proxy and never reaches the node.
    proxy.running_nodes[0].change_request_rules(Some(vec![RequestRule(
        Condition::RequestOpcode(RequestOpcode::Batch)
            .and(Condition::BodyContainsCaseSensitive(
                e.address.to_string().into_bytes().into(),
            ))
            .and(Condition::TrueForLimitedTimes(1)),
        RequestReaction::forge_with_error(cas_write_timeout()),
    )]));
    let applied = table
        .insert_row(&e, &v.next())
        .await
        .expect("resolved by a serial re-read");
    assert!(
        !applied,
        "the write never reached the node, so it did not apply"
    );
    let s = table.read_all().await.unwrap();
    assert!(s.rows.is_empty());
    // The answer is final because the provider fenced the write off: same version number,
    // a fresh version tag, so the write can no longer apply wherever it still is.
    assert_eq!(s.version.version, v.version);
    assert_ne!(s.version.etag, v.etag);
    assert!(
        !table.insert_row(&e, &v.next()).await.unwrap(),
        "fenced off"
    );
    // The same insert on the current version applies.
    assert!(table.insert_row(&e, &s.version.next()).await.unwrap());
    drop(table);
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_after_the_node_applied_is_resolved_as_applied() {
    let (mut proxy, table) = proxied(&unique("late-answer")).await;
    let v = table.read_all().await.unwrap().version;
    let e = new_entry(Timestamp::now());
    // The node applies the batch; its answer ([applied] = true) is held back past the client's
    // timeout, so the driver reports a timeout for a write that happened.
    hold_back_next_answer(&mut proxy);
    let applied = table
        .insert_row(&e, &v.next())
        .await
        .expect("resolved by a serial re-read");
    assert!(
        applied,
        "the node applied the write: it must never be reported as false"
    );
    let s = table.read_all().await.unwrap();
    assert_eq!(s.rows.len(), 1);
    assert_eq!(s.version.version, 1);
    // An update whose answer is lost the same way is also reported as applied.
    hold_back_next_answer(&mut proxy);
    let mut changed = e.clone();
    changed.status = cassandra_membership::SiloStatus::Active;
    assert!(
        table
            .update_row(&changed, &s.rows[0].etag, &s.version.next())
            .await
            .unwrap()
    );
    assert_eq!(
        table.read_all().await.unwrap().rows[0].entry.status,
        cassandra_membership::SiloStatus::Active
    );
    drop(table);
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresolvable_outcome_is_reported_as_unknown() {
    let (mut proxy, table) = proxied(&unique("unknown")).await;
    let other = table.for_cluster(table.cluster_id().to_owned()).unwrap();
    let v = table.read_all().await.unwrap().version;
    let e = new_entry(Timestamp::now());
    // The write applies but its answer is lost; while the client waits, another writer moves the
    // table on and changes the row: the re-read can no longer tell whose write it sees.
    hold_back_next_answer(&mut proxy);
    let racer = tokio::spawn(async move {
        loop {
            let s = other.read_all().await.unwrap();
            if let Some(row) = s.rows.first() {
                let mut changed = row.entry.clone();
                changed.role_name = "changed by another silo".into();
                if other
                    .update_row(&changed, &row.etag, &s.version.next())
                    .await
                    .unwrap()
                {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let outcome = table.insert_row(&e, &v.next()).await;
    racer.await.unwrap();
    match outcome {
        Err(err) => assert!(err.is_outcome_unknown(), "{err}"),
        Ok(applied) => panic!("must not claim {applied} when the outcome cannot be known"),
    }
    drop(table);
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_provably_lost_to_another_at_its_version_answers_false() {
    let (mut proxy, table) = proxied(&unique("provably-lost")).await;
    let other = table.for_cluster(table.cluster_id().to_owned()).unwrap();
    let (a, b) = (new_entry(Timestamp::now()), new_entry(Timestamp::now()));
    let v = table.read_all().await.unwrap().version;
    assert!(table.insert_row(&a, &v.next()).await.unwrap());
    let v = table.read_all().await.unwrap().version;
    assert!(table.insert_row(&b, &v.next()).await.unwrap());
    let s = table.read_all().await.unwrap();
    let row = |e: &cassandra_membership::MembershipEntry| {
        s.rows
            .iter()
            .find(|r| r.entry.address == e.address)
            .unwrap()
            .clone()
    };
    let (row_a, row_b) = (row(&a), row(&b));
    // Our update of a never reaches the node: a CAS timeout is forged after 800 ms. Meanwhile
    // another silo updates b at the same version and wins the step.
    proxy.running_nodes[0].change_request_rules(Some(vec![RequestRule(
        Condition::RequestOpcode(RequestOpcode::Batch)
            .and(Condition::BodyContainsCaseSensitive(
                a.address.to_string().into_bytes().into(),
            ))
            .and(Condition::TrueForLimitedTimes(1)),
        RequestReaction::forge_with_error_lazy_delay(
            Box::new(cas_write_timeout),
            Some(Duration::from_millis(800)),
        ),
    )]));
    let mut changed_a = row_a.entry.clone();
    changed_a.status = cassandra_membership::SiloStatus::Dead;
    let mut changed_b = row_b.entry.clone();
    changed_b.status = cassandra_membership::SiloStatus::Dead;
    let version = s.version.clone();
    let racer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        other
            .update_row(&changed_b, &row_b.etag, &version.next())
            .await
    });
    let ours = table
        .update_row(&changed_a, &row_a.etag, &s.version.next())
        .await;
    assert!(racer.await.unwrap().unwrap(), "the other write wins");
    match ours {
        Ok(false) => {}
        other => panic!(
            "the version moved one step with another tag and a still shows the tag we expected: provably lost, got {other:?}"
        ),
    }
    let after = table.read_all().await.unwrap();
    assert_eq!(after.version.version, s.version.version + 1);
    assert!(
        after
            .rows
            .iter()
            .any(|r| r.entry.address == a.address && r.etag == row_a.etag),
        "a is unchanged"
    );
    drop(table);
    drop(proxy);
}

/// Defunct cleanup's count "can be low, never high": a delete whose outcome is unknown and whose
/// row is gone afterwards may have been another silo's, so it is not counted. Here the delete
/// never reaches the node (the proxy answers a CAS timeout after a pause) while another silo's
/// cleanup removes the row: the two counts add up to the one row removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ambiguous_cleanup_delete_whose_row_another_silo_removed_is_not_counted() {
    let cluster = unique("cleanup-ambiguous");
    let (mut proxy, table) = proxied(&cluster).await;
    let other = crate::utils::table_on(&session_with_keyspace().await, options(&cluster));
    let long_ago = Timestamp::now().saturating_sub(Duration::from_secs(3600));
    let mut e = new_entry(long_ago);
    e.status = cassandra_membership::SiloStatus::Dead;
    e.i_am_alive_time = long_ago;
    let v = table.read_all().await.unwrap().version;
    assert!(table.insert_row(&e, &v.next()).await.unwrap());

    let (sent, mut reached) = tokio::sync::mpsc::unbounded_channel();
    proxy.running_nodes[0].change_request_rules(Some(vec![RequestRule(
        Condition::RequestOpcode(RequestOpcode::Execute)
            .and(Condition::BodyContainsCaseSensitive(
                e.address.to_string().into_bytes().into(),
            ))
            .and(Condition::TrueForLimitedTimes(1)),
        RequestReaction::forge_with_error_lazy_delay(
            Box::new(cas_write_timeout),
            Some(Duration::from_millis(1000)),
        )
        .with_feedback_when_performed(sent),
    )]));
    let now = Timestamp::now();
    let first = tokio::spawn(async move { table.cleanup_defunct(now).await });
    reached.recv().await.expect("the delete was sent");
    let by_other = other.cleanup_defunct(now).await.unwrap();
    let by_first = first.await.unwrap().unwrap();
    println!(
        "removed by the other silo: {by_other}, by the one whose delete timed out: {by_first}"
    );
    assert_eq!(by_other, 1, "the other silo's delete applied");
    assert_eq!(
        by_first, 0,
        "a row gone after an ambiguous delete may be another's: never counted"
    );
    drop(proxy);
}

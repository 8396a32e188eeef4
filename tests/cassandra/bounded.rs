//! Every call returns within its configured timeout, whatever the network does; and refused
//! credentials are said to be refused, naming the user and never the password.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cassandra_membership::conformance::new_entry;
use cassandra_membership::{
    CassandraMembershipTable, MembershipError, MembershipTable, Result, Timestamp,
};
use scylla_proxy::{Condition, Reaction, RequestOpcode, RequestReaction, RequestRule};

use crate::outcomes::{proxied, start_proxy};
use crate::utils::{options, session_with_keyspace, unique};

/// How late a call may return after its timeout on this shared, busy machine.
const MARGIN: Duration = Duration::from_millis(1500);

/// Runs `call`, failing the test (instead of hanging) if it is not back within `limit` + margin.
async fn within<T>(limit: Duration, call: impl Future<Output = T>) -> (T, Duration) {
    let started = Instant::now();
    let outcome = tokio::time::timeout(limit + MARGIN + Duration::from_secs(10), call)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "still running {:?} after a {limit:?} timeout",
                started.elapsed()
            )
        });
    let took = started.elapsed();
    assert!(
        took <= limit + MARGIN,
        "took {took:?} for a {limit:?} timeout"
    );
    (outcome, took)
}

fn connect_options(point: String) -> cassandra_membership::CassandraClusteringOptions {
    options(&unique("bounded"))
        .contact_points([point])
        .request_timeout(Duration::from_secs(1))
        .connect_timeout(Duration::from_secs(1))
}

fn assert_unavailable(outcome: Result<CassandraMembershipTable>) {
    match outcome {
        Err(MembershipError::Unavailable { operation, .. }) => assert_eq!(operation, "connect"),
        other => panic!("expected Unavailable from connect, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_to_a_server_that_accepts_and_never_speaks_gives_up_at_the_connect_timeout() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut sockets = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            sockets.push(s); // accepted, never answered
        }
    });
    let (outcome, _) = within(
        Duration::from_secs(1),
        CassandraMembershipTable::connect(connect_options(addr.to_string())),
    )
    .await;
    assert_unavailable(outcome);
    held.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_to_a_node_that_goes_silent_after_the_handshake_gives_up_at_the_connect_timeout() {
    session_with_keyspace().await;
    let (mut proxy, proxy_addr, _) = start_proxy().await;
    // OPTIONS / STARTUP / REGISTER are answered; every query after the handshake is swallowed.
    proxy.running_nodes[0].change_request_rules(Some(vec![RequestRule(
        Condition::any([
            Condition::RequestOpcode(RequestOpcode::Query),
            Condition::RequestOpcode(RequestOpcode::Prepare),
            Condition::RequestOpcode(RequestOpcode::Execute),
            Condition::RequestOpcode(RequestOpcode::Batch),
        ]),
        RequestReaction::drop_frame(),
    )]));
    let (outcome, _) = within(
        Duration::from_secs(1),
        CassandraMembershipTable::connect(connect_options(proxy_addr.to_string())),
    )
    .await;
    assert_unavailable(outcome);
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initialize_against_a_silent_node_gives_up_at_the_request_timeout() {
    // The session (the host's own, with the driver's 30 s default) goes through the proxy.
    let (mut proxy, table) = proxied(&unique("silent-init")).await;
    let v = table.read_all().await.unwrap().version;
    let fresh = CassandraMembershipTable::with_session(
        Arc::clone(table.session()),
        table.options().clone().cluster_id(unique("silent-init")),
    )
    .unwrap();
    proxy.running_nodes[0].change_request_rules(Some(vec![RequestRule(
        Condition::any([
            Condition::RequestOpcode(RequestOpcode::Query),
            Condition::RequestOpcode(RequestOpcode::Prepare),
            Condition::RequestOpcode(RequestOpcode::Execute),
            Condition::RequestOpcode(RequestOpcode::Batch),
        ]),
        RequestReaction::drop_frame(),
    )]));
    let limit = table.options().request_timeout;
    let (outcome, _) = within(limit, fresh.initialize(true)).await;
    assert!(
        matches!(outcome, Err(MembershipError::Timeout { .. })),
        "{outcome:?}"
    );
    // A table value that has prepared its statements: every operation is bounded too.
    let e = new_entry(Timestamp::now());
    let (outcome, _) = within(limit, table.initialize(true)).await;
    assert!(outcome.is_err(), "{outcome:?}");
    let (outcome, _) = within(limit, table.read_all()).await;
    assert!(
        matches!(outcome, Err(MembershipError::Timeout { .. })),
        "{outcome:?}"
    );
    // An insert that times out is resolved by bounded re-reads: it cannot be, so it is unknown.
    let (outcome, _) = within(limit * 3, table.insert_row(&e, &v.next())).await;
    assert!(
        outcome
            .as_ref()
            .is_err_and(MembershipError::is_outcome_unknown),
        "{outcome:?}"
    );
    drop(table);
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_are_access_denied_naming_the_user_not_the_password() {
    session_with_keyspace().await;
    let (mut proxy, proxy_addr, _) = start_proxy().await;
    // The node refuses the login (forged: the test node has no authenticator).
    proxy.running_nodes[0].change_request_rules(Some(vec![RequestRule(
        Condition::RequestOpcode(RequestOpcode::Startup),
        RequestReaction::forge_with_error_and_message(
            scylla::errors::DbError::AuthenticationError,
            Some("Provided username cm_user and/or password are incorrect".into()),
        ),
    )]));
    let options = connect_options(proxy_addr.to_string()).credentials("cm_user", "s3cret-pw");
    let (outcome, _) = within(
        Duration::from_secs(1),
        CassandraMembershipTable::connect(options),
    )
    .await;
    let err = outcome.expect_err("the login was refused");
    assert!(
        matches!(err, MembershipError::AccessDenied { .. }),
        "{err:?}"
    );
    assert!(
        !err.is_transient(),
        "wrong credentials do not heal by retrying"
    );
    let text = format!("{err} {err:?}");
    assert!(text.contains("cm_user"), "{text}");
    assert!(!text.contains("s3cret-pw"), "{text}");
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_refused_for_lack_of_permission_is_access_denied() {
    let (mut proxy, table) = proxied(&unique("unauthorized")).await;
    let v = table.read_all().await.unwrap().version;
    proxy.running_nodes[0].change_request_rules(Some(vec![RequestRule(
        Condition::RequestOpcode(RequestOpcode::Batch),
        RequestReaction::forge_with_error(scylla::errors::DbError::Unauthorized),
    )]));
    let err = table
        .insert_row(&new_entry(Timestamp::now()), &v.next())
        .await
        .unwrap_err();
    assert!(
        matches!(err, MembershipError::AccessDenied { .. }),
        "{err:?}"
    );
    assert!(!err.is_transient());
    drop(table);
    drop(proxy);
}

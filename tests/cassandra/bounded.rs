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
use crate::utils::{contact_points, options, session_with_keyspace, unique};

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
    // A read statement that times out is sent once more (`docs::guarantees`, "Bounded time"): two timeouts.
    let (outcome, _) = within(limit * 2, table.initialize(true)).await;
    assert!(outcome.is_err(), "{outcome:?}");
    let (outcome, _) = within(limit * 2, table.read_all()).await;
    assert!(
        matches!(outcome, Err(MembershipError::Timeout { .. })),
        "{outcome:?}"
    );
    // An insert that times out is resolved by bounded re-reads: it cannot be, so it is unknown.
    // The guide's worst case with expiry off: 8 request timeouts.
    let (outcome, _) = within(limit * 8, table.insert_row(&e, &v.next())).await;
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
    // The table runs on the host's session: its credentials are the session's, not "none".
    let text = err.to_string();
    assert!(text.contains("host's session"), "{text}");
    assert!(!text.contains("no credentials configured"), "{text}");
    drop(table);
    drop(proxy);
}

/// A listener whose accept queue is full: the kernel drops every further SYN, so a connect to
/// it hangs like one to a host that is down or firewalled. Keep the value alive while in use.
async fn syn_dropping_listener() -> (tokio::net::TcpListener, tokio::net::TcpStream) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(0).unwrap();
    // With a backlog of 0 the queue holds one connection, never accepted.
    let queued = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    (listener, queued)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_reaches_a_live_contact_point_behind_a_dead_one_within_the_connect_timeout() {
    session_with_keyspace().await;
    let (dead, _queued) = syn_dropping_listener().await;
    let limit = Duration::from_secs(3);
    // The driver tries the contact points in random order: several rounds so that the dead
    // one comes first at least once (a chance of 1 in 16 that it never does).
    for round in 0..4 {
        let options = options(&unique("dead-first"))
            .contact_points([
                dead.local_addr().unwrap().to_string(),
                contact_points()[0].clone(),
            ])
            .connect_timeout(limit);
        let (outcome, took) = within(limit, CassandraMembershipTable::connect(options)).await;
        assert!(
            outcome.is_ok(),
            "round {round}: a live contact point must be reached (took {took:?}): {:?}",
            outcome.err()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auth_backend_timeout_at_login_is_transient_not_access_denied() {
    session_with_keyspace().await;
    let (mut proxy, proxy_addr, _) = start_proxy().await;
    // Cassandra's answer when its system_auth read times out during the login.
    proxy.running_nodes[0].change_request_rules(Some(vec![RequestRule(
        Condition::RequestOpcode(RequestOpcode::Startup),
        RequestReaction::forge_with_error_and_message(
            scylla::errors::DbError::AuthenticationError,
            Some(
                "Unable to perform authentication: Operation timed out - received only 0 responses."
                    .into(),
            ),
        ),
    )]));
    let options = connect_options(proxy_addr.to_string()).credentials("cm_user", "s3cret-pw");
    let (outcome, _) = within(
        Duration::from_secs(1),
        CassandraMembershipTable::connect(options),
    )
    .await;
    let err = outcome.expect_err("the login failed");
    assert!(
        matches!(err, MembershipError::Unavailable { .. }),
        "the credentials were never checked: {err:?}"
    );
    assert!(err.is_transient());
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_whose_permissions_could_not_be_checked_is_transient() {
    let (mut proxy, table) = proxied(&unique("authz-timeout")).await;
    proxy.running_nodes[0].change_request_rules(Some(vec![RequestRule(
        Condition::RequestOpcode(RequestOpcode::Execute),
        RequestReaction::forge_with_error_and_message(
            scylla::errors::DbError::Unauthorized,
            Some(
                "Unable to perform authorization of permissions: Operation timed out - received only 0 responses."
                    .into(),
            ),
        ),
    )]));
    let err = table.read_all().await.unwrap_err();
    assert!(
        matches!(err, MembershipError::Unavailable { .. }),
        "{err:?}"
    );
    assert!(err.is_transient());
    drop(table);
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_failure_to_prepare_is_not_a_schema_mismatch() {
    let (mut proxy, table) = proxied(&unique("prepare-overloaded")).await;
    // A table value that has not prepared its statements yet, on the same session.
    let fresh = CassandraMembershipTable::with_session(
        Arc::clone(table.session()),
        table.options().clone(),
    )
    .unwrap();
    proxy.running_nodes[0].change_request_rules(Some(vec![RequestRule(
        Condition::RequestOpcode(RequestOpcode::Prepare),
        RequestReaction::forge_with_error(scylla::errors::DbError::Overloaded),
    )]));
    let err = fresh.read_all().await.unwrap_err();
    assert!(
        matches!(err, MembershipError::Unavailable { .. }),
        "an overloaded node is no schema problem: {err:?}"
    );
    assert!(err.is_transient());
    // A statement the node refuses is one.
    proxy.running_nodes[0].change_request_rules(Some(vec![RequestRule(
        Condition::RequestOpcode(RequestOpcode::Prepare),
        RequestReaction::forge_with_error_and_message(
            scylla::errors::DbError::Invalid,
            Some("unconfigured table membership".into()),
        ),
    )]));
    let err = fresh.read_all().await.unwrap_err();
    assert!(
        matches!(err, MembershipError::SchemaMismatch { .. }),
        "{err:?}"
    );
    drop(table);
    drop(proxy);
}

/// `entry_conditions = auto` chooses whole-value conditions only when the server refuses the
/// statement with a condition on a field (ScyllaDB): a node that is overloaded while it prepares
/// fails that call, and the next one prepares the field conditions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passing_failure_to_prepare_field_conditions_does_not_switch_to_whole_value_ones() {
    let (mut proxy, table) = proxied(&unique("prepare-field-overloaded")).await;
    let fresh = CassandraMembershipTable::with_session(
        Arc::clone(table.session()),
        table.options().clone(),
    )
    .unwrap();
    proxy.running_nodes[0].change_request_rules(Some(vec![RequestRule(
        Condition::RequestOpcode(RequestOpcode::Prepare).and(Condition::BodyContainsCaseSensitive(
            b"IF entry.etag".to_vec().into(),
        )),
        RequestReaction::forge_with_error(scylla::errors::DbError::Overloaded),
    )]));
    let first = fresh.read_all().await;
    println!("while the field conditions cannot be prepared: {first:?}");
    assert!(
        matches!(first, Err(MembershipError::Unavailable { .. })),
        "an overloaded node is no answer about field conditions: {first:?}"
    );
    // Now the whole-value statements are the ones refused: a table value that chose them
    // would not get here.
    proxy.running_nodes[0].change_request_rules(Some(vec![RequestRule(
        Condition::RequestOpcode(RequestOpcode::Prepare).and(Condition::BodyContainsCaseSensitive(
            b"IF entry = :expected_entry".to_vec().into(),
        )),
        RequestReaction::forge_with_error(scylla::errors::DbError::Invalid),
    )]));
    fresh
        .read_all()
        .await
        .expect("the field conditions are prepared");
    drop(fresh);
    drop(table);
    drop(proxy);
}

/// A table name nobody else uses, so `initialize` creates it.
fn unique_table() -> String {
    format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..20])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creating_the_table_is_bounded_by_the_schema_timeout_not_the_request_timeout() {
    let (mut proxy, table) = proxied(&unique("slow-ddl")).await;
    let fresh = CassandraMembershipTable::with_session(
        Arc::clone(table.session()),
        table
            .options()
            .clone()
            .table(unique_table())
            .request_timeout(Duration::from_secs(1))
            .schema_timeout(Duration::from_secs(30)),
    )
    .unwrap();
    // The schema change takes longer than a request may, well within the schema timeout.
    proxy.running_nodes[0].change_request_rules(Some(vec![RequestRule(
        Condition::RequestOpcode(RequestOpcode::Query)
            .and(Condition::BodyContainsCaseSensitive(
                b"CREATE TABLE".to_vec().into(),
            ))
            .and(Condition::TrueForLimitedTimes(1)),
        RequestReaction::delay(Duration::from_secs(2)),
    )]));
    fresh
        .initialize(true)
        .await
        .expect("a schema change may take up to schema_timeout");
    drop(table);
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_agreement_wait_after_creating_the_table_is_transient_not_a_storage_error() {
    let (mut proxy, table) = proxied(&unique("no-agreement")).await;
    let fresh = CassandraMembershipTable::with_session(
        Arc::clone(table.session()),
        table.options().clone().table(unique_table()),
    )
    .unwrap();
    // The table is created; the driver's schema-version reads that follow fail.
    proxy.running_nodes[0].change_request_rules(Some(vec![RequestRule(
        Condition::RequestOpcode(RequestOpcode::Query).and(Condition::BodyContainsCaseSensitive(
            b"schema_version".to_vec().into(),
        )),
        RequestReaction::forge_with_error(scylla::errors::DbError::ServerError),
    )]));
    let err = fresh.initialize(true).await.unwrap_err();
    assert!(
        matches!(
            err,
            MembershipError::Unavailable { .. } | MembershipError::Timeout { .. }
        ),
        "the schema change applied; only the agreement wait failed: {err:?}"
    );
    assert!(err.is_transient());
    drop(table);
    drop(proxy);
}

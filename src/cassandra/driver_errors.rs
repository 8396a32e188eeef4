//! Maps driver errors to [`MembershipError`], tells which failures leave a conditional write's
//! outcome unknown, and the retry policies the provider sets on every statement it runs.

use scylla::errors::{
    ConnectionError, ConnectionPoolError, ConnectionSetupRequestErrorKind, DbError, ExecutionError,
    MetadataError, NewSessionError, RequestAttemptError,
};
use scylla::policies::retry::{RequestInfo, RetryDecision, RetryPolicy, RetrySession};

use crate::error::MembershipError;

/// True when the request may have reached a replica and been applied (or may still be):
/// timeouts, broken connections and server-side failures after the request was accepted.
/// False when it certainly did not apply (refused before any replica acted, or never sent).
///
/// `Unavailable` and `Overloaded` count as ambiguous: Paxos throws `Unavailable` in its commit
/// phase too, after the proposal was accepted, and Cassandra's write path throws `Overloaded`
/// (too many hints in flight) after a mutation was sent.
pub(crate) fn may_have_applied(err: &ExecutionError) -> bool {
    match err {
        ExecutionError::BadQuery(_)
        | ExecutionError::EmptyPlan
        | ExecutionError::PrepareError(_)
        | ExecutionError::ConnectionPoolError(_)
        | ExecutionError::UseKeyspaceError(_)
        | ExecutionError::SchemaAgreementError(_) => false,
        ExecutionError::RequestTimeout(_) => true,
        ExecutionError::LastAttemptError(attempt) => match attempt {
            RequestAttemptError::SerializationError(_)
            | RequestAttemptError::CqlRequestSerialization(_)
            | RequestAttemptError::UnableToAllocStreamId => false,
            RequestAttemptError::DbError(db, _) => !refused_before_execution(db),
            _ => true,
        },
        _ => true,
    }
}

/// Errors a coordinator returns before it executes anything.
fn refused_before_execution(db: &DbError) -> bool {
    matches!(
        db,
        DbError::IsBootstrapping
            | DbError::SyntaxError
            | DbError::Invalid
            | DbError::AlreadyExists { .. }
            | DbError::Unauthorized
            | DbError::AuthenticationError
            | DbError::ProtocolError
            | DbError::ConfigError
            | DbError::Unprepared { .. }
            | DbError::RateLimitReached { .. }
    )
}

fn is_access_denied(db: &DbError) -> bool {
    matches!(db, DbError::Unauthorized | DbError::AuthenticationError)
}

/// True when a connection was refused for its credentials (or their absence).
fn connection_access_denied(err: &ConnectionError) -> bool {
    match err {
        ConnectionError::ConnectionSetupRequestError(e) => {
            matches!(
                &e.error,
                ConnectionSetupRequestErrorKind::DbError(db, _) if is_access_denied(db)
            ) || matches!(
                &e.error,
                ConnectionSetupRequestErrorKind::MissingAuthentication
                    | ConnectionSetupRequestErrorKind::StartAuthSessionError(_)
                    | ConnectionSetupRequestErrorKind::AuthChallengeEvaluationError(_)
                    | ConnectionSetupRequestErrorKind::AuthFinishError(_)
            )
        }
        _ => false,
    }
}

fn pool_access_denied(err: &ConnectionPoolError) -> bool {
    matches!(err, ConnectionPoolError::Broken { last_connection_error } if connection_access_denied(last_connection_error))
}

/// True when a statement failed for the credentials or the role's permissions.
pub(crate) fn execution_access_denied(err: &ExecutionError) -> bool {
    match err {
        ExecutionError::LastAttemptError(RequestAttemptError::DbError(db, _)) => {
            is_access_denied(db)
        }
        ExecutionError::ConnectionPoolError(p) => pool_access_denied(p),
        _ => false,
    }
}

/// True when preparing failed for the credentials or the role's permissions.
pub(crate) fn prepare_access_denied(err: &scylla::errors::PrepareError) -> bool {
    match err {
        scylla::errors::PrepareError::ConnectionPoolError(p) => pool_access_denied(p),
        scylla::errors::PrepareError::AllAttemptsFailed {
            first_attempt: RequestAttemptError::DbError(db, _),
        } => is_access_denied(db),
        _ => false,
    }
}

/// True when a session could not be built because the login was refused.
pub(crate) fn session_access_denied(err: &NewSessionError) -> bool {
    match err {
        NewSessionError::MetadataError(MetadataError::ConnectionPoolError(p)) => {
            pool_access_denied(p)
        }
        NewSessionError::UseKeyspaceError(scylla::errors::UseKeyspaceError::RequestError(
            RequestAttemptError::DbError(db, _),
        )) => is_access_denied(db),
        _ => false,
    }
}

/// The error for a failure that did not leave anything ambiguous (reads, refused writes).
/// An access failure names no user here; the table fills it in (see `CassandraMembershipTable::named`).
pub(crate) fn to_error(operation: &'static str, err: ExecutionError) -> MembershipError {
    if execution_access_denied(&err) {
        return MembershipError::AccessDenied {
            operation,
            user: None,
            source: Box::new(err),
        };
    }
    let unavailable = matches!(
        &err,
        ExecutionError::EmptyPlan
            | ExecutionError::ConnectionPoolError(_)
            | ExecutionError::LastAttemptError(RequestAttemptError::BrokenConnectionError(_))
            | ExecutionError::LastAttemptError(RequestAttemptError::DbError(
                DbError::Unavailable { .. } | DbError::Overloaded | DbError::IsBootstrapping,
                _
            ))
    );
    let timeout = matches!(
        &err,
        ExecutionError::RequestTimeout(_)
            | ExecutionError::LastAttemptError(RequestAttemptError::DbError(
                DbError::ReadTimeout { .. } | DbError::WriteTimeout { .. },
                _
            ))
    );
    let source = Box::new(err);
    if unavailable {
        MembershipError::Unavailable { operation, source }
    } else if timeout {
        MembershipError::Timeout { operation, source }
    } else {
        MembershipError::Storage { operation, source }
    }
}

/// What a statement is, for its retry policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StatementKind {
    /// A conditional write (LWT or conditional batch): never sent twice. Once it may have
    /// reached a coordinator, a second attempt could apply after, or answer `[applied] = false`
    /// because of, the first; the provider resolves the outcome itself instead.
    Conditional,
    /// A read (serial or not) or a plain write with an explicit timestamp: repeating it
    /// changes nothing, so it may be retried within the statement's request timeout.
    Idempotent,
}

/// How many times an idempotent statement is retried (the request timeout bounds them all).
const IDEMPOTENT_RETRIES: u32 = 2;

/// The decision for the `attempt`-th failure (0-based) of a statement of `kind`.
pub(crate) fn decide(
    kind: StatementKind,
    error: &RequestAttemptError,
    attempt: u32,
) -> RetryDecision {
    match kind {
        StatementKind::Conditional => RetryDecision::DontRetry,
        StatementKind::Idempotent if attempt >= IDEMPOTENT_RETRIES => RetryDecision::DontRetry,
        StatementKind::Idempotent => match error {
            RequestAttemptError::BrokenConnectionError(_) => RetryDecision::RetryNextTarget(None),
            RequestAttemptError::DbError(db, _) => match db {
                DbError::Unavailable { .. }
                | DbError::Overloaded
                | DbError::IsBootstrapping
                | DbError::ServerError
                | DbError::RateLimitReached { .. } => RetryDecision::RetryNextTarget(None),
                // A serial read that finds a proposal in progress completes it, and may time
                // out doing so (as a CAS write timeout): the same node can finish next time.
                DbError::ReadTimeout { .. } | DbError::WriteTimeout { .. } => {
                    RetryDecision::RetrySameTarget(None)
                }
                _ => RetryDecision::DontRetry,
            },
            _ => RetryDecision::DontRetry,
        },
    }
}

/// The provider's retry policy, set on each statement so that it holds on a host's own session
/// whatever that session's default policy is.
#[derive(Debug)]
pub(crate) struct ProviderRetryPolicy(pub(crate) StatementKind);

struct ProviderRetrySession {
    kind: StatementKind,
    attempt: u32,
}

impl RetryPolicy for ProviderRetryPolicy {
    fn new_session(&self) -> Box<dyn RetrySession> {
        Box::new(ProviderRetrySession {
            kind: self.0,
            attempt: 0,
        })
    }
}

impl RetrySession for ProviderRetrySession {
    fn decide_should_retry(&mut self, request_info: RequestInfo) -> RetryDecision {
        let decision = decide(self.kind, request_info.error, self.attempt);
        self.attempt += 1;
        decision
    }

    fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use scylla::errors::{BrokenConnectionErrorKind, WriteType};
    use scylla::statement::Consistency;

    fn db(e: DbError) -> RequestAttemptError {
        RequestAttemptError::DbError(e, "msg".into())
    }

    fn unavailable() -> DbError {
        DbError::Unavailable {
            consistency: Consistency::Serial,
            required: 2,
            alive: 1,
        }
    }

    #[test]
    fn a_conditional_write_is_never_retried() {
        for e in [
            db(unavailable()),
            db(DbError::Overloaded),
            db(DbError::WriteTimeout {
                consistency: Consistency::Serial,
                received: 0,
                required: 1,
                write_type: WriteType::Cas,
            }),
            RequestAttemptError::BrokenConnectionError(
                BrokenConnectionErrorKind::ChannelError.into(),
            ),
        ] {
            assert_eq!(
                decide(StatementKind::Conditional, &e, 0),
                RetryDecision::DontRetry
            );
        }
    }

    #[test]
    fn idempotent_statements_are_retried_a_bounded_number_of_times() {
        let e = db(unavailable());
        assert_eq!(
            decide(StatementKind::Idempotent, &e, 0),
            RetryDecision::RetryNextTarget(None)
        );
        assert_eq!(
            decide(StatementKind::Idempotent, &e, IDEMPOTENT_RETRIES),
            RetryDecision::DontRetry
        );
        assert_eq!(
            decide(StatementKind::Idempotent, &db(DbError::SyntaxError), 0),
            RetryDecision::DontRetry
        );
    }

    #[test]
    fn unavailable_may_have_applied_a_conditional_write() {
        let e = ExecutionError::LastAttemptError(db(unavailable()));
        assert!(may_have_applied(&e));
        let refused = ExecutionError::LastAttemptError(db(DbError::Unauthorized));
        assert!(!may_have_applied(&refused));
    }

    #[test]
    fn refused_credentials_and_permissions_are_access_denied() {
        for e in [DbError::Unauthorized, DbError::AuthenticationError] {
            let err = to_error("read", ExecutionError::LastAttemptError(db(e)));
            assert!(
                matches!(err, MembershipError::AccessDenied { .. }),
                "{err:?}"
            );
            assert!(!err.is_transient());
        }
        // The login path (a refused STARTUP inside a broken pool) is exercised through a proxy
        // in tests/cassandra/bounded.rs: its driver error types cannot be built here.
    }
}

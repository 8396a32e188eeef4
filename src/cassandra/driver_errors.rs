//! Maps driver errors to [`MembershipError`], and tells which failures leave a conditional
//! write's outcome unknown.

use scylla::errors::{DbError, ExecutionError, RequestAttemptError};

use crate::error::MembershipError;

/// True when the request may have reached a replica and been applied (or may still be):
/// timeouts, broken connections and server-side failures after the request was accepted.
/// False when it certainly did not apply (refused before any replica acted, or never sent).
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
            RequestAttemptError::DbError(db, _) => !matches!(
                db,
                DbError::Unavailable { .. }
                    | DbError::Overloaded
                    | DbError::IsBootstrapping
                    | DbError::SyntaxError
                    | DbError::Invalid
                    | DbError::AlreadyExists { .. }
                    | DbError::Unauthorized
                    | DbError::AuthenticationError
                    | DbError::ProtocolError
                    | DbError::ConfigError
                    | DbError::Unprepared { .. }
                    | DbError::RateLimitReached { .. }
            ),
            _ => true,
        },
        _ => true,
    }
}

/// The error for a failure that did not leave anything ambiguous (reads, refused writes).
pub(crate) fn to_error(operation: &'static str, err: ExecutionError) -> MembershipError {
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

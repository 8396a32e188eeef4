//! The retry policy the provider sets on every statement it runs: conditional writes are never
//! sent twice, idempotent statements a bounded number of times.

use scylla::errors::{DbError, RequestAttemptError};
use scylla::policies::retry::{RequestInfo, RetryDecision, RetryPolicy, RetrySession};

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
                // A timeout on the next node, not the same: a coordinator cut off from the other
                // replicas times out every attempt, and any node can complete a proposal a
                // serial read found in progress.
                DbError::ReadTimeout { .. } | DbError::WriteTimeout { .. } => {
                    RetryDecision::RetryNextTarget(None)
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
    use super::super::errors::tests::{db, unavailable};
    use super::*;
    use scylla::errors::{BrokenConnectionErrorKind, WriteType};
    use scylla::statement::Consistency;

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
    fn a_timed_out_idempotent_statement_is_sent_to_the_next_node() {
        // A coordinator cut off from the other replicas times out every attempt it gets: the
        // same node again would spend the call on it (seen: a silo heartbeating through a
        // node cut off from the rest was declared dead).
        for e in [
            db(DbError::WriteTimeout {
                consistency: Consistency::Quorum,
                received: 1,
                required: 2,
                write_type: WriteType::Simple,
            }),
            db(DbError::WriteTimeout {
                consistency: Consistency::Serial,
                received: 0,
                required: 2,
                write_type: WriteType::Cas,
            }),
            db(DbError::ReadTimeout {
                consistency: Consistency::Quorum,
                received: 1,
                required: 2,
                data_present: false,
            }),
        ] {
            assert_eq!(
                decide(StatementKind::Idempotent, &e, 0),
                RetryDecision::RetryNextTarget(None),
                "{e:?}"
            );
        }
    }
}

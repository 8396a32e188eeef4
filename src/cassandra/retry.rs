//! The retry policy the provider sets on every statement it runs: an attempt that never executed
//! goes to the next node whatever the statement, a conditional write that may have reached a
//! coordinator is never sent twice, idempotent statements are retried a bounded number of times.
//!
//! The driver itself moves to the next node of the plan, without asking this policy, when it
//! cannot take a connection to a node (its pool is broken: connection refused, the node known
//! down): nothing was sent. What reaches this policy is an attempt that had a connection.

use scylla::errors::{DbError, RequestAttemptError};
use scylla::policies::retry::{RequestInfo, RetryDecision, RetryPolicy, RetrySession};
use scylla::statement::Consistency;

/// What a statement is, for its retry policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StatementKind {
    /// A conditional write (LWT or conditional batch): never sent twice once it may have
    /// reached a coordinator — a second attempt could apply after, or answer `[applied] = false`
    /// because of, the first; the provider resolves the outcome itself instead. An attempt that
    /// provably never executed ([`never_executed`]) goes to the next node.
    Conditional,
    /// A read (serial or not) or a plain write with an explicit timestamp: repeating it
    /// changes nothing, so it may be retried within the statement's request timeout.
    Idempotent,
}

/// How many times a statement is retried (the request timeout bounds them all): with three
/// replicas, each node of the plan once.
const IDEMPOTENT_RETRIES: u32 = 2;

/// True when the attempt provably executed nowhere, and another coordinator may serve it: safe
/// to send to the next node whatever the statement. The request never left the client (no
/// stream id to send it on), or the coordinator refused it before doing anything (see
/// `errors::refused_before_execution`; only the refusals another node may not repeat: it is
/// bootstrapping, it finds too few replicas alive for a Paxos round — its own view, which
/// another coordinator may not share —, or it is over its rate limit).
fn never_executed(error: &RequestAttemptError) -> bool {
    match error {
        RequestAttemptError::UnableToAllocStreamId => true,
        RequestAttemptError::DbError(db, _) => matches!(
            db,
            DbError::IsBootstrapping
                | DbError::Unavailable {
                    consistency: Consistency::Serial | Consistency::LocalSerial,
                    ..
                }
                | DbError::RateLimitReached {
                    rejected_by_coordinator: true,
                    ..
                }
        ),
        _ => false,
    }
}

/// The decision for the `attempt`-th failure (0-based) of a statement of `kind`.
pub(crate) fn decide(
    kind: StatementKind,
    error: &RequestAttemptError,
    attempt: u32,
) -> RetryDecision {
    if attempt >= IDEMPOTENT_RETRIES {
        return RetryDecision::DontRetry;
    }
    if never_executed(error) {
        return RetryDecision::RetryNextTarget(None);
    }
    match kind {
        // It may have reached a coordinator (a timeout, a broken connection, a failure after
        // the round began): sending it again could apply it twice.
        StatementKind::Conditional => RetryDecision::DontRetry,
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

    /// A conditional write that may have reached a coordinator is never sent again: a timeout,
    /// a broken connection (the request may have been written before it broke), Unavailable at
    /// the commit level (Paxos's commit phase), Overloaded (after the mutation was sent).
    #[test]
    fn a_conditional_write_that_may_have_reached_a_coordinator_is_never_retried() {
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
            RequestAttemptError::BrokenConnectionError(
                BrokenConnectionErrorKind::WriteError(std::io::ErrorKind::BrokenPipe.into()).into(),
            ),
        ] {
            assert!(super::super::errors::may_have_applied(
                &scylla::errors::ExecutionError::LastAttemptError(e.clone())
            ));
            assert_eq!(
                decide(StatementKind::Conditional, &e, 0),
                RetryDecision::DontRetry,
                "{e:?}"
            );
        }
    }

    /// A request that never executed goes to the next node whatever its kind, a bounded
    /// number of times (a serial statement met a dead node and failed although two
    /// live ones could serve it).
    #[test]
    fn a_request_that_never_executed_goes_to_the_next_node_whatever_its_kind() {
        let serial_unavailable = db(DbError::Unavailable {
            consistency: Consistency::Serial,
            required: 2,
            alive: 1,
        });
        for e in [
            RequestAttemptError::UnableToAllocStreamId,
            db(DbError::IsBootstrapping),
            serial_unavailable,
            db(DbError::RateLimitReached {
                op_type: scylla::errors::OperationType::Write,
                rejected_by_coordinator: true,
            }),
        ] {
            assert!(!super::super::errors::may_have_applied(
                &scylla::errors::ExecutionError::LastAttemptError(e.clone())
            ));
            for kind in [StatementKind::Conditional, StatementKind::Idempotent] {
                assert_eq!(
                    decide(kind, &e, 0),
                    RetryDecision::RetryNextTarget(None),
                    "{kind:?} {e:?}"
                );
                assert_eq!(
                    decide(kind, &e, IDEMPOTENT_RETRIES),
                    RetryDecision::DontRetry,
                    "bounded: {kind:?} {e:?}"
                );
            }
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

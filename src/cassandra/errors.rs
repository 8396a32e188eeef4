//! Maps driver errors to [`MembershipError`], and tells which failures leave a conditional
//! write's outcome unknown.

use scylla::errors::{
    ConnectionError, ConnectionPoolError, ConnectionSetupRequestErrorKind, DbError, ExecutionError,
    MetadataError, NewSessionError, RequestAttemptError,
};

use scylla::statement::Consistency;

use super::statements::PrepareFailure;
use crate::error::MembershipError;

/// True when the request may have reached a replica and been applied (or may still be):
/// timeouts, broken connections and server-side failures after the request was accepted.
/// False when it certainly did not apply (refused before any replica acted, or never sent).
///
/// `Unavailable` at the commit level and `Overloaded` count as ambiguous: Paxos throws
/// `Unavailable` in its commit phase too, after the proposal was accepted (with the commit
/// consistency, QUORUM / LOCAL_QUORUM), and Cassandra's write path throws `Overloaded` (too many
/// hints in flight) after a mutation was sent. `Unavailable` at the *serial* level is refused:
/// see [`refused_before_execution`].
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
///
/// `Unavailable` at SERIAL / LOCAL_SERIAL is the Paxos liveness check at the start of a round's
/// attempt, before it proposes. A round tries again (and so checks again) only after every replica
/// refused its proposal: one accepted anywhere ends the round with a write timeout instead
/// (Cassandra v1 `proposePaxos(…, timeoutIfPartial)`, v2 "superseded with side effects",
/// ScyllaDB `timeout_if_partially_accepted`). So that error proves this write never applied,
/// and never will.
fn refused_before_execution(db: &DbError) -> bool {
    matches!(
        db,
        DbError::Unavailable {
            consistency: Consistency::Serial | Consistency::LocalSerial,
            ..
        }
    ) || matches!(
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
    ) || matches!(
        // A replica may reject the write after the coordinator sent it to the others.
        db,
        DbError::RateLimitReached {
            rejected_by_coordinator: true,
            ..
        }
    )
}

/// True when Cassandra could not *check* the credentials or permissions: its `system_auth` read
/// timed out or was unavailable. It wraps that as `AuthenticationException("Unable to perform
/// authentication: …")` or `UnauthorizedException("Unable to perform authorization of …")` —
/// the same error codes as a refusal, told apart only by the message. It heals by itself.
fn auth_backend_failure(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    message.contains("unable to perform authentication")
        || message.contains("unable to perform authorization")
}

/// A refusal of the credentials or of a permission (not a failure to check them).
fn is_access_denied(db: &DbError, message: &str) -> bool {
    matches!(db, DbError::Unauthorized | DbError::AuthenticationError)
        && !auth_backend_failure(message)
}

/// A failure to check the credentials or permissions (see [`auth_backend_failure`]).
fn is_auth_backend_failure(db: &DbError, message: &str) -> bool {
    matches!(db, DbError::Unauthorized | DbError::AuthenticationError)
        && auth_backend_failure(message)
}

/// Errors of a node that cannot serve right now: retrying later may succeed.
fn is_transient_db(db: &DbError, message: &str) -> bool {
    matches!(
        db,
        DbError::Unavailable { .. }
            | DbError::Overloaded
            | DbError::IsBootstrapping
            | DbError::RateLimitReached { .. }
    ) || is_auth_backend_failure(db, message)
}

/// True when a connection was refused for its credentials (or their absence).
fn connection_access_denied(err: &ConnectionError) -> bool {
    match err {
        ConnectionError::ConnectionSetupRequestError(e) => {
            matches!(
                &e.error,
                ConnectionSetupRequestErrorKind::DbError(db, message) if is_access_denied(db, message)
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
        ExecutionError::LastAttemptError(RequestAttemptError::DbError(db, message)) => {
            is_access_denied(db, message)
        }
        ExecutionError::ConnectionPoolError(p) => pool_access_denied(p),
        _ => false,
    }
}

/// True when preparing failed for the credentials or the role's permissions.
fn prepare_access_denied(err: &scylla::errors::PrepareError) -> bool {
    match err {
        scylla::errors::PrepareError::ConnectionPoolError(p) => pool_access_denied(p),
        scylla::errors::PrepareError::AllAttemptsFailed {
            first_attempt: RequestAttemptError::DbError(db, message),
        } => is_access_denied(db, message),
        _ => false,
    }
}

/// True when preparing failed because the node refused the statement itself (the table is
/// missing or has another shape): a schema problem. Anything else — no connection, a broken
/// one, an overloaded or bootstrapping node, a failure to check permissions, ids that differ
/// between connections (a schema change in progress) — may heal by itself.
pub(crate) fn prepare_refused_statement(err: &scylla::errors::PrepareError) -> bool {
    matches!(
        err,
        scylla::errors::PrepareError::AllAttemptsFailed {
            first_attempt: RequestAttemptError::DbError(
                DbError::Invalid | DbError::SyntaxError | DbError::ConfigError,
                _
            ),
        }
    )
}

/// The error for statements that did not prepare against `table`.
pub(crate) fn prepare_error(table: &str, e: PrepareFailure) -> MembershipError {
    match e {
        PrepareFailure::Timeout => MembershipError::Timeout {
            operation: "prepare",
            source: Box::new(e),
        },
        PrepareFailure::Refused(e) if prepare_access_denied(&e) => MembershipError::AccessDenied {
            operation: "prepare",
            user: None,
            host_session: false,
            source: Box::new(e),
        },
        // Only the node refusing a statement means the table is missing or has another shape;
        // no connection, a broken one, an overloaded node, or ids differing mid-schema-change
        // heal by themselves.
        PrepareFailure::Refused(e) if prepare_refused_statement(&e) => {
            MembershipError::SchemaMismatch {
                table: table.to_owned(),
                detail: format!("the provider's statements do not prepare against it: {e}"),
            }
        }
        PrepareFailure::Refused(e) => MembershipError::Unavailable {
            operation: "prepare",
            source: Box::new(e),
        },
    }
}

/// True when a session could not be built because the login was refused.
pub(crate) fn session_access_denied(err: &NewSessionError) -> bool {
    match err {
        NewSessionError::MetadataError(MetadataError::ConnectionPoolError(p)) => {
            pool_access_denied(p)
        }
        NewSessionError::UseKeyspaceError(scylla::errors::UseKeyspaceError::RequestError(
            RequestAttemptError::DbError(db, message),
        )) => is_access_denied(db, message),
        _ => false,
    }
}

/// True when a connection failed in its TLS handshake: tokio-rustls reports rustls' error as
/// an `io::Error` wrapping it. The same configuration fails the same way every time.
fn connection_tls_failed(err: &ConnectionError) -> bool {
    match err {
        #[cfg(feature = "rustls")]
        ConnectionError::IoError(io) => io
            .get_ref()
            .and_then(|e| e.downcast_ref::<rustls::Error>())
            .is_some_and(tls_configuration_error),
        _ => false,
    }
}

/// A TLS failure that configuration causes and only configuration fixes: a certificate not
/// trusted, expired or refused, no common protocol, a port that does not speak TLS. Not an
/// alert like `InternalError`, which a TLS-terminating proxy sends while its backend is down
/// (transient: it stays `Unavailable`).
#[cfg(feature = "rustls")]
fn tls_configuration_error(e: &rustls::Error) -> bool {
    use rustls::AlertDescription as A;
    match e {
        rustls::Error::InvalidCertificate(_)
        | rustls::Error::NoCertificatesPresented
        | rustls::Error::InvalidMessage(_)
        | rustls::Error::PeerIncompatible(_)
        | rustls::Error::InvalidCertRevocationList(_) => true,
        rustls::Error::AlertReceived(alert) => matches!(
            alert,
            A::HandshakeFailure
                | A::NoCertificate
                | A::BadCertificate
                | A::UnsupportedCertificate
                | A::CertificateRevoked
                | A::CertificateExpired
                | A::CertificateUnknown
                | A::UnknownCA
                | A::AccessDenied
                | A::ProtocolVersion
                | A::InsufficientSecurity
                | A::CertificateRequired
                | A::UnrecognisedName
        ),
        _ => false,
    }
}

fn pool_tls_failed(err: &ConnectionPoolError) -> bool {
    matches!(err, ConnectionPoolError::Broken { last_connection_error } if connection_tls_failed(last_connection_error))
}

/// True when a session could not be built because the TLS handshake failed.
fn session_tls_failed(err: &NewSessionError) -> bool {
    matches!(err, NewSessionError::MetadataError(MetadataError::ConnectionPoolError(p)) if pool_tls_failed(p))
}

/// The error for a session that could not be built; `user` is the configured username.
pub(crate) fn session_error(err: NewSessionError, user: Option<String>) -> MembershipError {
    if session_tls_failed(&err) {
        return MembershipError::TlsHandshake {
            operation: "connect",
            source: Box::new(err),
        };
    }
    if session_access_denied(&err) {
        return MembershipError::AccessDenied {
            operation: "connect",
            user,
            host_session: false,
            source: Box::new(err),
        };
    }
    MembershipError::Unavailable {
        operation: "connect",
        source: Box::new(err),
    }
}

/// The error for a failure that did not leave anything ambiguous (reads, refused writes).
/// An access failure names no user here; the table fills it in (see `CassandraMembershipTable::named`).
pub(crate) fn to_error(operation: &'static str, err: ExecutionError) -> MembershipError {
    if execution_access_denied(&err) {
        return MembershipError::AccessDenied {
            operation,
            user: None,
            host_session: false,
            source: Box::new(err),
        };
    }
    if matches!(&err, ExecutionError::ConnectionPoolError(p) if pool_tls_failed(p)) {
        return MembershipError::TlsHandshake {
            operation,
            source: Box::new(err),
        };
    }
    let unavailable = match &err {
        ExecutionError::EmptyPlan
        | ExecutionError::ConnectionPoolError(_)
        | ExecutionError::LastAttemptError(RequestAttemptError::BrokenConnectionError(_)) => true,
        ExecutionError::LastAttemptError(RequestAttemptError::DbError(db, message)) => {
            is_transient_db(db, message)
        }
        // The driver's schema-agreement wait after a schema change that did apply: no
        // agreement yet is not a refusal of the change.
        ExecutionError::SchemaAgreementError(e) => {
            !matches!(e, scylla::errors::SchemaAgreementError::Timeout(_))
        }
        _ => false,
    };
    let timeout = matches!(
        &err,
        ExecutionError::RequestTimeout(_)
            | ExecutionError::SchemaAgreementError(scylla::errors::SchemaAgreementError::Timeout(
                _
            ))
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

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use scylla::errors::BrokenConnectionErrorKind;

    /// A node's refusal `e` (its message does not matter).
    pub(in crate::cassandra) fn db(e: DbError) -> RequestAttemptError {
        RequestAttemptError::DbError(e, "msg".into())
    }

    /// Unavailable at the commit level: what Paxos's commit phase throws after a proposal was
    /// accepted.
    pub(in crate::cassandra) fn unavailable() -> DbError {
        DbError::Unavailable {
            consistency: Consistency::Quorum,
            required: 2,
            alive: 1,
        }
    }

    #[test]
    fn unavailable_at_the_commit_level_may_have_applied_a_conditional_write() {
        for consistency in [Consistency::Quorum, Consistency::LocalQuorum] {
            let e = ExecutionError::LastAttemptError(db(DbError::Unavailable {
                consistency,
                required: 2,
                alive: 1,
            }));
            assert!(may_have_applied(&e), "{consistency:?}");
        }
        let refused = ExecutionError::LastAttemptError(db(DbError::Unauthorized));
        assert!(!may_have_applied(&refused));
    }

    #[test]
    fn unavailable_at_the_serial_level_is_a_round_that_never_proposed() {
        for consistency in [Consistency::Serial, Consistency::LocalSerial] {
            let e = ExecutionError::LastAttemptError(db(DbError::Unavailable {
                consistency,
                required: 2,
                alive: 1,
            }));
            assert!(!may_have_applied(&e), "{consistency:?}");
            assert!(matches!(
                to_error("insert_row", e),
                MembershipError::Unavailable { .. }
            ));
        }
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

    fn db_msg(e: DbError, message: &str) -> RequestAttemptError {
        RequestAttemptError::DbError(e, message.into())
    }

    #[test]
    fn an_auth_backend_that_cannot_answer_is_transient_not_access_denied() {
        // Cassandra's own texts when its system_auth read times out or is unavailable.
        for (e, message) in [
            (
                DbError::AuthenticationError,
                "Unable to perform authentication: Operation timed out - received only 0 responses.",
            ),
            (
                DbError::Unauthorized,
                "Unable to perform authorization of login privileges: Cannot achieve consistency level QUORUM",
            ),
            (
                DbError::Unauthorized,
                "Unable to perform authorization of super-user permission: Operation timed out",
            ),
        ] {
            let err = ExecutionError::LastAttemptError(db_msg(e, message));
            assert!(!execution_access_denied(&err), "{message}");
            let err = to_error("read", err);
            assert!(
                matches!(err, MembershipError::Unavailable { .. }),
                "{message}: {err:?}"
            );
            assert!(err.is_transient());
        }
        // A real refusal stays AccessDenied.
        let refused = ExecutionError::LastAttemptError(db_msg(
            DbError::AuthenticationError,
            "Provided username cm_user and/or password are incorrect",
        ));
        assert!(execution_access_denied(&refused));
    }

    #[test]
    fn only_a_coordinators_rate_limit_proves_nothing_applied() {
        use scylla::errors::OperationType;
        let limited = |rejected_by_coordinator| {
            ExecutionError::LastAttemptError(db(DbError::RateLimitReached {
                op_type: OperationType::Write,
                rejected_by_coordinator,
            }))
        };
        assert!(!may_have_applied(&limited(true)));
        assert!(
            may_have_applied(&limited(false)),
            "a replica's rejection comes after the coordinator sent the write on"
        );
        assert!(to_error("read", limited(true)).is_transient());
    }

    #[test]
    fn only_a_refused_statement_is_a_schema_problem_when_preparing() {
        use scylla::errors::PrepareError;
        let failed = |e| PrepareError::AllAttemptsFailed { first_attempt: e };
        assert!(prepare_refused_statement(&failed(db(DbError::Invalid))));
        assert!(prepare_refused_statement(&failed(db(DbError::SyntaxError))));
        for transient in [
            failed(RequestAttemptError::BrokenConnectionError(
                BrokenConnectionErrorKind::ChannelError.into(),
            )),
            failed(db(DbError::Overloaded)),
            failed(db(DbError::IsBootstrapping)),
            failed(db_msg(
                DbError::Unauthorized,
                "Unable to perform authorization of permissions: Operation timed out",
            )),
            PrepareError::PreparedStatementIdsMismatch,
            PrepareError::ConnectionPoolError(ConnectionPoolError::Initializing),
        ] {
            assert!(!prepare_refused_statement(&transient), "{transient:?}");
        }
    }

    /// What the driver answers when every connection failed with `io` (the TLS stream reports a
    /// failed handshake as an `io::Error` wrapping the `rustls::Error`).
    #[cfg(feature = "rustls")]
    fn session_failing_with(io: std::io::Error) -> NewSessionError {
        NewSessionError::MetadataError(MetadataError::ConnectionPoolError(
            ConnectionPoolError::Broken {
                last_connection_error: ConnectionError::IoError(std::sync::Arc::new(io)),
            },
        ))
    }

    /// A wrong CA (or a node's certificate for another name) fails the same way on every retry:
    /// a configuration error that says so, not an outage a retry loop waits out. The values are
    /// built here as the driver and tokio-rustls build them; tests/cassandra/secure.rs meets
    /// the real ones on the TLS node.
    #[cfg(feature = "rustls")]
    #[test]
    fn an_untrusted_server_certificate_is_a_configuration_error_not_transient() {
        use rustls::{AlertDescription, CertificateError};
        for tls in [
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
            rustls::Error::InvalidCertificate(CertificateError::NotValidForName),
            rustls::Error::AlertReceived(AlertDescription::UnknownCA),
        ] {
            let io = std::io::Error::new(std::io::ErrorKind::InvalidData, tls.clone());
            let err = session_error(session_failing_with(io), None);
            assert!(!err.is_transient(), "{tls:?}: {err:?}");
            assert!(
                !matches!(err, MembershipError::Unavailable { .. }),
                "{err:?}"
            );
            let text = err.to_string();
            assert!(text.contains(&tls.to_string()), "{text}");
        }
        // A proxy's InternalError alert (its backend is down) is an outage, not configuration.
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(AlertDescription::InternalError),
        );
        let proxied = session_error(session_failing_with(io), None);
        assert!(proxied.is_transient(), "{proxied:?}");
        // A refused TCP connection is still an outage.
        let refused = session_error(
            session_failing_with(std::io::Error::from_raw_os_error(111)),
            None,
        );
        assert!(refused.is_transient(), "{refused:?}");
    }

    #[test]
    fn a_failed_schema_agreement_wait_after_a_schema_change_is_not_a_storage_error() {
        use scylla::errors::SchemaAgreementError;
        let timed_out = to_error(
            "initialize",
            ExecutionError::SchemaAgreementError(SchemaAgreementError::Timeout(
                std::time::Duration::from_secs(1),
            )),
        );
        assert!(
            matches!(timed_out, MembershipError::Timeout { .. }),
            "{timed_out:?}"
        );
        let failed = to_error(
            "initialize",
            ExecutionError::SchemaAgreementError(SchemaAgreementError::RequestError(db(
                DbError::ServerError,
            ))),
        );
        assert!(
            matches!(failed, MembershipError::Unavailable { .. }),
            "{failed:?}"
        );
    }
}

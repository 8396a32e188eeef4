//! The one error type of this crate. Each variant's doc says whether the failed call changed state.

use std::time::Duration;

/// Whose credentials an `AccessDenied` is about, for its message.
fn access_subject(user: Option<&str>, host_session: bool) -> String {
    match (host_session, user) {
        (true, _) => " with the credentials of the host's session".into(),
        (false, Some(u)) => format!(" to user {u:?}"),
        (false, None) => " (no credentials configured)".into(),
    }
}

/// A boxed underlying error (driver or I/O), kept as the error's `source()`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An underlying error and its own causes, `: `-separated, each once: a cause whose text is
/// already there is skipped (the driver's errors quote the error below them in their message).
struct Causes<'a>(&'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Causes<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut text = self.0.to_string();
        let mut next = self.0.source();
        while let Some(cause) = next {
            let message = cause.to_string();
            if !message.is_empty() && !text.contains(&message) {
                text.push_str(": ");
                text.push_str(&message);
            }
            next = cause.source();
        }
        f.write_str(&text)
    }
}

/// Everything that can go wrong, as variants a caller can act on.
///
/// # Printing
///
/// `Display` (`{}`, `%e` in a `tracing` field, `to_string()`) is the whole story on one line:
/// what failed, then the causes the driver or the system gave (`connection refused`, a TLS
/// certificate error), `: `-separated and each once. Print it as it is. [`source`] still returns
/// the driver's error, for code that inspects it (downcast to
/// `scylla::errors::ExecutionError`), not for printing: a reporter that walks `source()` and
/// prints every level (anyhow's `{:#}`, eyre) shows those causes a second time.
///
/// ```
/// use cassandra_membership::MembershipError;
/// let e = MembershipError::Unavailable {
///     operation: "connect",
///     source: std::io::Error::other("connection refused").into(),
/// };
/// assert_eq!(e.to_string(), "storage unavailable during connect: connection refused");
/// ```
///
/// [`source`]: std::error::Error::source
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MembershipError {
    /// An option or argument is invalid. Nothing was sent to storage.
    #[error("invalid configuration: {option}: {reason}")]
    InvalidConfiguration {
        /// The option's name, as in the options struct (e.g. `keyspace`).
        option: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A silo address's text form could not be parsed, or an endpoint cannot be a silo address
    /// (an IPv6 scope id, which the text form cannot carry). Nothing was sent to storage.
    #[error("invalid silo address {text:?}: {reason}")]
    InvalidSiloAddress {
        /// The text (at most 128 characters of it).
        text: String,
        /// What is wrong with it.
        reason: String,
    },

    /// Storage could not be reached or had too few replicas alive, or `connect` did not finish
    /// within `connect_timeout`. The operation did not apply. (A conditional write that may have
    /// reached a coordinator never reports this: it is resolved, or `OutcomeUnknown`.)
    #[error("storage unavailable during {operation}: {}", Causes(&**source))]
    Unavailable {
        /// The table operation.
        operation: &'static str,
        /// The driver's error.
        #[source]
        source: BoxError,
    },

    /// A read or a plain write timed out. A read changed nothing; a plain write (heartbeat) may
    /// or may not have been stored and is safe to repeat.
    #[error("{operation} timed out: {}", Causes(&**source))]
    Timeout {
        /// The table operation.
        operation: &'static str,
        /// The driver's error.
        #[source]
        source: BoxError,
    },

    /// A conditional write's result is not known: it may have applied, or may still apply later.
    /// Re-read the table before deciding anything; never assume it failed.
    #[error("outcome of {operation} is unknown: {detail}: {}", Causes(&**source))]
    OutcomeUnknown {
        /// The table operation.
        operation: &'static str,
        /// Why the outcome could not be resolved.
        detail: String,
        /// The driver's error that made it ambiguous.
        #[source]
        source: BoxError,
    },

    /// The configured keyspace does not exist. Nothing was written (the provider never chooses
    /// a replication for you). Create the keyspace with the replication your cluster needs
    /// (`CREATE KEYSPACE … WITH replication = {…}`), or, in development only, set
    /// `create_keyspace_with_replication` so that `initialize` creates it. Distinct from
    /// [`MembershipError::SchemaMismatch`]: here nothing is wrong with a table, there is none.
    #[error(
        "keyspace {keyspace:?} does not exist: create it with the replication your cluster needs (the provider does not choose one), or for development set create_keyspace_with_replication"
    )]
    KeyspaceMissing {
        /// The keyspace's name.
        keyspace: String,
    },

    /// The stored table does not have the shape this version of the library needs (a table of
    /// another shape, a keyspace that keeps no replica where it must), or the provider's
    /// statements do not prepare against it (the table is missing where it was not created).
    /// Nothing was written. A missing keyspace is [`MembershipError::KeyspaceMissing`].
    #[error("schema mismatch on {table}: {detail}")]
    SchemaMismatch {
        /// `keyspace.table`.
        table: String,
        /// What differs.
        detail: String,
    },

    /// The table has the shape of cassandra-membership 0.2 and earlier (one column per entry
    /// field, the version and a heartbeat map in static columns), which this release never
    /// reads or writes: every expired generation there costs eleven tombstone cells (and a map element) a read scans.
    /// Nothing was written. Stop the cluster's silos, copy the table with
    /// `cassandra-membership migrate --to-table <new table>` (resumable; the old table is left as
    /// it is), and configure the new table. See the guide's migration page.
    #[error(
        "{table} has the table shape of cassandra-membership 0.2 and earlier, which this release does not read: stop the silos, run `cassandra-membership migrate --to-table <new table>` and configure that table (docs::migration)"
    )]
    TableNeedsMigration {
        /// `keyspace.table`.
        table: String,
    },

    /// The existing table's expiry settings or rows disagree with the configured TTL, and the
    /// mismatch policy is `throw`. Nothing was written.
    #[error(
        "TTL mismatch on {table}: the table's default_time_to_live is {table_ttl_seconds} s, the configured TTL is {configured_ttl_seconds} s, and {rows_disagreeing} row(s) carry other TTLs (rows of this very configuration read so when a node that wrote them runs its clock ahead by more than ttl_renewal_interval: keep clocks in sync); ttl_mismatch = \"allow\" would keep the table and its rows as they are and write new data with the configured TTL; ttl_mismatch = \"patch\" would alter the table default and rewrite each row to expire as if the configured TTL had always applied"
    )]
    TtlMismatch {
        /// `keyspace.table`.
        table: String,
        /// The table's `default_time_to_live`.
        table_ttl_seconds: u64,
        /// The configured TTL (0 when expiry is off).
        configured_ttl_seconds: u64,
        /// How many rows (of all clusters in the table) carry cells with other TTLs.
        rows_disagreeing: u64,
    },

    /// Stored data could not be understood (a row written by hand or by another program).
    /// Nothing was written.
    #[error("corrupt stored data{}: {reason}", silo.as_deref().map(|s| format!(" for silo {s}")).unwrap_or_default())]
    CorruptData {
        /// The row's key, when the damage is in one row.
        silo: Option<String>,
        /// What is wrong.
        reason: String,
    },

    /// Storage refused the credentials (authentication) or the role lacks a permission
    /// (authorization). Nothing was written. Never transient: retrying with the same
    /// configuration fails the same way; fix the credentials or grants.
    #[error("access denied{} during {operation}: the credentials were refused or the role lacks a permission: {}", access_subject(user.as_deref(), *host_session), Causes(&**source))]
    AccessDenied {
        /// The table operation (`connect` for a refused login).
        operation: &'static str,
        /// The configured username, if any. The password is never kept.
        user: Option<String>,
        /// True when the table runs on a host's own session (`with_session`): the credentials
        /// are that session's, which the provider does not know.
        host_session: bool,
        /// The driver's error (it names the user at most, never the password).
        #[source]
        source: BoxError,
    },

    /// Storage refused the request for another reason (permissions, invalid request, server
    /// error). A conditional write that failed this way did not apply.
    #[error("storage error during {operation}: {}", Causes(&**source))]
    Storage {
        /// The table operation.
        operation: &'static str,
        /// The driver's error.
        #[source]
        source: BoxError,
    },

    /// A read of one cluster's partition met more tombstones (deleted and expired cells) than
    /// the node lets one read scan (`tombstone_failure_threshold`, 100,000 by default), and the
    /// node aborted it. Nothing was written. Not transient: every read of that partition fails
    /// the same way until the tombstones are purged — after the table's `gc_grace_seconds`, by
    /// compaction — or the partition is deleted. Other clusters of the table are not affected.
    /// See the guide's tombstones page (`docs::tombstones`) for the budget and what to do.
    #[error(
        "{operation} of cluster {cluster_id:?} (service {service_id:?}) was aborted by Cassandra: the partition holds more tombstones than one read may scan (tombstone_failure_threshold){}. Expired and removed entries stay tombstones until the table's gc_grace_seconds has passed and compaction has run: lower gc_grace_seconds (ALTER TABLE … WITH gc_grace_seconds = …), compact once it has passed (nodetool compact <keyspace> <table>), or, for a cluster that is gone, remove it with `cassandra-membership delete-cluster`. The node's answer: {}",
        last_scanned.map(|n| format!("; the last read of it that answered scanned {n}")).unwrap_or_default(),
        Causes(&**source)
    )]
    TooManyTombstones {
        /// The table operation.
        operation: &'static str,
        /// The cluster's service id.
        service_id: String,
        /// The cluster whose partition is buried.
        cluster_id: String,
        /// The tombstones the last read of this partition that answered reported scanning (see
        /// `CassandraMembershipTable::tombstones_scanned`), if one did past the warning threshold.
        last_scanned: Option<u64>,
        /// The driver's error.
        #[source]
        source: BoxError,
    },

    /// The TLS handshake with the nodes failed: the configured CA does not trust the server's
    /// certificate (`UnknownIssuer`), the certificate is not valid for the name connected to or
    /// has expired, the node does not speak TLS on that port, or the two sides share no
    /// protocol version. Nothing was sent. Never transient: the same `tls` options fail the same
    /// way on every retry; fix the CA, the server name or the node's certificate. Other TLS
    /// failures (an `InternalError` alert from a proxy whose backend is down) stay
    /// `Unavailable`. A session is classified by the driver's last connection attempt: with
    /// one misconfigured node among refusing ones, a connect may answer either.
    #[error("TLS handshake failed during {operation} (check the tls options — ca_file, server_name — against the nodes' certificates): {}", Causes(&**source))]
    TlsHandshake {
        /// The table operation (`connect` for a session being built).
        operation: &'static str,
        /// The driver's error, holding the `rustls::Error`.
        #[source]
        source: BoxError,
    },

    /// The silo's address already has an entry of another incarnation (another start time, or
    /// a status that moved on since its join): a silo incarnation joins once. Nothing was
    /// written. Not transient: join as a new incarnation (a new generation in the address).
    #[error(
        "{silo} already has an entry of another incarnation (status {status}): a silo incarnation joins once; join with a new generation"
    )]
    EntryExists {
        /// The silo's address.
        silo: String,
        /// The status of the entry found.
        status: String,
    },

    /// This silo's entry turned Dead or disappeared while the silo was joining (the others
    /// declared it dead, an operator removed it). What was written stays written; join again
    /// as a new incarnation (a new generation).
    #[error("silo {silo} is not a member: its entry is {state}")]
    NotAMember {
        /// The silo's address.
        silo: String,
        /// What was found (e.g. `"dead or missing"`).
        state: &'static str,
    },

    /// A read found the table version lower than one read before: the cluster's data was
    /// deleted (or expired) and created again since. Nothing was written; a
    /// [`ClusterView`](crate::ClusterView) keeps its last view and is marked stale with this.
    #[error(
        "the table version went back from {from} to {to}: the cluster's data was deleted (or expired) and created again"
    )]
    TableVersionWentBack {
        /// The version read before.
        from: u64,
        /// The version read now.
        to: u64,
    },

    /// A retry budget ran out while the table kept changing (e.g. a paged read saw the version
    /// move on every attempt). Nothing was written.
    #[error("{operation} gave up after {attempts} attempts over {elapsed:?} of concurrent changes")]
    Contention {
        /// The table operation.
        operation: &'static str,
        /// How many attempts were made.
        attempts: u32,
        /// How long they took.
        elapsed: Duration,
    },
}

impl MembershipError {
    pub(crate) fn config(option: impl Into<String>, reason: impl Into<String>) -> Self {
        MembershipError::InvalidConfiguration {
            option: option.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn corrupt(silo: Option<&str>, reason: impl Into<String>) -> Self {
        MembershipError::CorruptData {
            silo: silo.map(|s| s.chars().take(128).collect()),
            reason: reason.into(),
        }
    }

    /// True when the caller must not assume the write failed: see [`MembershipError::OutcomeUnknown`].
    pub fn is_outcome_unknown(&self) -> bool {
        matches!(self, MembershipError::OutcomeUnknown { .. })
    }

    /// True for failures that may go away by themselves and after which the same call may be
    /// sent again as it is: [`Unavailable`](MembershipError::Unavailable),
    /// [`Timeout`](MembershipError::Timeout) and [`Contention`](MembershipError::Contention).
    /// Configuration errors never are, whatever layer reported them: a refused login
    /// ([`AccessDenied`](MembershipError::AccessDenied)), a certificate the configured CA does not
    /// trust ([`TlsHandshake`](MembershipError::TlsHandshake)), a taken address
    /// ([`EntryExists`](MembershipError::EntryExists)) fail the same way on every retry.
    ///
    /// Never true for [`OutcomeUnknown`](MembershipError::OutcomeUnknown): that write may have
    /// applied (or still apply), so a blind retry is wrong — re-read the table and decide from
    /// what it holds (test it with [`MembershipError::is_outcome_unknown`]). A retry loop that
    /// re-reads before each conditional write may retry on `is_transient() ||
    /// is_outcome_unknown()`.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            MembershipError::Unavailable { .. }
                | MembershipError::Timeout { .. }
                | MembershipError::Contention { .. }
        )
    }
}

/// This crate's `Result`.
pub type Result<T, E = MembershipError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use scylla::errors::{ConnectionError, ConnectionPoolError, MetadataError, NewSessionError};

    /// What the driver answers when no contact point accepts a connection: each level quotes the
    /// one below in its own message, and the pool's last connection error is not a `source()`.
    fn refused_session() -> NewSessionError {
        NewSessionError::MetadataError(MetadataError::ConnectionPoolError(
            ConnectionPoolError::Broken {
                last_connection_error: ConnectionError::IoError(Arc::new(
                    std::io::Error::from_raw_os_error(111),
                )),
            },
        ))
    }

    #[test]
    fn display_carries_the_cause_and_each_cause_once() {
        let refused = std::io::Error::from_raw_os_error(111).to_string();
        let e = MembershipError::Unavailable {
            operation: "connect",
            source: Box::new(refused_session()),
        };
        let text = e.to_string();
        assert!(
            text.starts_with("storage unavailable during connect: "),
            "{text}"
        );
        assert_eq!(text.matches(&refused).count(), 1, "{text}");
        // A cause that does not quote its own source gets it appended.
        let e = MembershipError::Storage {
            operation: "read",
            source: Box::new(std::io::Error::other(Wrapped(std::io::Error::other(
                "the root cause",
            )))),
        };
        let text = e.to_string();
        assert!(text.ends_with(": wrapped: the root cause"), "{text}");
    }

    /// An error that does not quote its source in its message.
    #[derive(Debug)]
    struct Wrapped(std::io::Error);

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("wrapped")
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }
}

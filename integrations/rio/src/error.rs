//! The one error type of the placement and state stores. Each variant's doc says whether the
//! failed call changed anything.

use cassandra_membership::{BoxError, MembershipError};

/// What can go wrong placing objects or storing their state, as variants a caller can act on.
///
/// rio's own error types carry no more than a word (`ObjectPlacementError::Upstream`,
/// `LoadStateError::Unknown`): the trait implementations log this error (its whole source chain)
/// at `warn` before handing rio its variant, and the inherent methods
/// ([`CassandraObjectPlacement::place`](crate::CassandraObjectPlacement::place),
/// [`CassandraState::save_versioned`](crate::CassandraState::save_versioned), …) return it
/// whole.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RioStoreError {
    /// An option is invalid. Nothing was sent to storage.
    #[error("invalid configuration: {option}: {reason}")]
    InvalidConfiguration {
        /// The option's name, as in the options struct (e.g. `table`).
        option: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The object is placed on another server that is live. Nothing was written: send the
    /// request to `owner` (rio's client does so when a server answers with a redirect).
    #[error("{object} is placed on {owner}, a live server")]
    PlacedElsewhere {
        /// `kind/id` of the object.
        object: String,
        /// The server that holds the placement.
        owner: String,
    },

    /// This server's membership does not allow it to serve (its health is `LeaseAtRisk`, or
    /// final: Dead, missing, stopped), or its placement renewals have failed for so long that
    /// its placements may lapse. Nothing was written. A server at risk serves again once its
    /// heartbeat is `Healthy` (or a renewal succeeds); a final one never does.
    #[error("server {server} is fenced ({health}): it serves no object")]
    Fenced {
        /// The server's address.
        server: String,
        /// Its membership health, or the renewal failure, as text.
        health: String,
    },

    /// Another activation saved this state first (or the state was created meanwhile): the
    /// version stored is not the one this activation loaded or last saved. Nothing was written.
    /// Reload the state (a new activation does) before saving again.
    #[error(
        "state {state_type} of {object} was written by another activation: expected version {expected:?}, found {found:?}"
    )]
    StateConflict {
        /// `kind/id` of the object.
        object: String,
        /// The state type.
        state_type: String,
        /// The version this value expected (`None`: none stored).
        expected: Option<i64>,
        /// The version stored (`None`: none).
        found: Option<i64>,
    },

    /// The state could not be serialized or a stored one deserialized (JSON). Nothing was
    /// written.
    #[error("state {state_type} of {object}: {source}")]
    Serialization {
        /// `kind/id` of the object.
        object: String,
        /// The state type.
        state_type: String,
        /// serde_json's error.
        #[source]
        source: serde_json::Error,
    },

    /// Storage could not be reached, had too few replicas alive, refused the statement or timed
    /// out on a read or a plain write. A read changed nothing; a plain write (an index row) is
    /// safe to repeat; a conditional write reports [`RioStoreError::OutcomeUnknown`] instead.
    #[error("{operation} failed in Cassandra")]
    Cassandra {
        /// The operation.
        operation: &'static str,
        /// The driver's error.
        #[source]
        source: BoxError,
    },

    /// A conditional write's result is not known: it may have applied, or may still. The
    /// stores settle it themselves by a serial read where they can; this is what is left when
    /// that read failed too. Re-read before deciding anything.
    #[error("outcome of {operation} is unknown")]
    OutcomeUnknown {
        /// The operation.
        operation: &'static str,
        /// The driver's error.
        #[source]
        source: BoxError,
    },

    /// A row read back does not have the shape the statements write (a column missing or of
    /// another type). Nothing was written.
    #[error("unexpected data in {table}: {detail}")]
    CorruptData {
        /// The table.
        table: String,
        /// What was wrong.
        detail: String,
    },

    /// The membership table reported an error (a liveness check of a placement's owner).
    #[error(transparent)]
    Membership(#[from] MembershipError),
}

/// The stores' results.
pub type RioStoreResult<T> = std::result::Result<T, RioStoreError>;

impl RioStoreError {
    /// True for failures worth retrying as they are (storage unavailable or slow); false for
    /// decisions (placed elsewhere, fenced, a conflict) and configuration errors.
    pub fn is_transient(&self) -> bool {
        match self {
            RioStoreError::Cassandra { .. } | RioStoreError::OutcomeUnknown { .. } => true,
            RioStoreError::Membership(e) => e.is_transient(),
            _ => false,
        }
    }

    pub(crate) fn config(option: &str, reason: impl Into<String>) -> Self {
        RioStoreError::InvalidConfiguration {
            option: option.to_owned(),
            reason: reason.into(),
        }
    }

    /// The error with its whole source chain, for rio's text-only errors and for logs.
    pub(crate) fn chain(&self) -> String {
        // The library's error prints its causes itself, each once.
        if let RioStoreError::Membership(e) = self {
            return e.to_string();
        }
        let mut text = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(s) = source {
            text.push_str(": ");
            text.push_str(&s.to_string());
            source = s.source();
        }
        text
    }
}

//! A coordinator's answer that it does not know a schema object the provider uses (its keyspace,
//! table or entry type): what a node says while a schema change another node made has not
//! reached it yet — and also what it says when the object really is missing. Only the caller can
//! tell the two apart, by asking again for a bounded time (`initialize`: `schema_timeout`).
//!
//! Each release words it its own way, so the node's English is not the interface: an answer is
//! recognised by its kind (an `Invalid` request, or ScyllaDB's `ServerError` for `CREATE TYPE`),
//! a word saying the object is missing, and **the object's own name** among its words. The texts
//! of each release (their sources quoted in the tests below):
//!
//! | release | keyspace | table | type |
//! |---|---|---|---|
//! | Cassandra 4.0–5.0, DDL | `Keyspace 'ks' doesn't exist` | | `Unknown type ks.t_entry` |
//! | Cassandra 4.0–5.0, statements | `keyspace ks does not exist` | `table t does not exist` | |
//! | Cassandra, `USE` | `Keyspace 'ks' does not exist` | | |
//! | ScyllaDB, statements | `Keyspace ks does not exist` | `unconfigured table t` | |
//! | ScyllaDB 6.1+, `CREATE TABLE` | `Cannot create a table in a non-existent keyspace: ks` | | `Unknown type ks.t_entry` |
//! | ScyllaDB 5.4–6.0, `CREATE TABLE` | `Unknown keyspace ks` | | |
//! | ScyllaDB, `CREATE TYPE` (`ServerError`) | `Can't find a keyspace ks` | | |
//!
//! A replica that has not applied a table its coordinator knows fails the read or write
//! (`ReadFailure` / `WriteFailure` naming `INCOMPATIBLE_SCHEMA` or `UNKNOWN_TABLE`, Cassandra's
//! failure reasons); older releases and the coordinator's own lookup say `Unknown CF` /
//! `Unknown keyspace/cf pair`.

use scylla::errors::{DbError, ExecutionError, PrepareError, RequestAttemptError};

use crate::error::MembershipError;

/// Which object a node said it does not know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unapplied {
    /// The keyspace.
    Keyspace,
    /// The table.
    Table,
    /// The table's entry type.
    EntryType,
    /// A replica that does not know the table (a failed read or write).
    OnReplica,
}

/// The names of the objects one table value uses, as the node spells them in its answers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SchemaNames<'a> {
    pub(crate) keyspace: &'a str,
    pub(crate) table: &'a str,
    pub(crate) entry_type: &'a str,
}

/// Words a node uses to say an object is missing, across releases (lower case).
/// "Unknown" only before the kind of object: "Unknown field 'x' in value of user defined type
/// t_entry" is a type of another shape, not one missing.
const MISSING: [&str; 11] = [
    "does not exist",
    "doesn't exist",
    "unconfigured",
    "unknown type",
    "unknown keyspace",
    "unknown table",
    "non-existent",
    "can't find",
    "cannot find",
    "not found",
    "couldn't find",
];

/// Cassandra's failure reasons for a replica that has not applied a table.
const REPLICA_REASONS: [&str; 2] = ["INCOMPATIBLE_SCHEMA", "UNKNOWN_TABLE"];

/// The node's refusal inside `err`, if it is one: its kind and its message.
fn refusal(err: &MembershipError) -> Option<(&DbError, &str)> {
    let source = match err {
        MembershipError::Storage { source, .. }
        | MembershipError::Unavailable { source, .. }
        | MembershipError::Timeout { source, .. } => source.as_ref(),
        _ => return None,
    };
    let attempt = if let Some(e) = source.downcast_ref::<ExecutionError>() {
        match e {
            ExecutionError::LastAttemptError(attempt) => attempt,
            ExecutionError::PrepareError(PrepareError::AllAttemptsFailed { first_attempt }) => {
                first_attempt
            }
            _ => return None,
        }
    } else if let Some(PrepareError::AllAttemptsFailed { first_attempt }) =
        source.downcast_ref::<PrepareError>()
    {
        first_attempt
    } else {
        return None;
    };
    match attempt {
        RequestAttemptError::DbError(db, message) => Some((db, message.as_str())),
        _ => None,
    }
}

/// The identifier-like words of `message`, lower case (`'ks.t_entry'` → `ks`, `t_entry`).
fn words(message: &str) -> impl Iterator<Item = String> + '_ {
    message
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_lowercase)
}

/// Which of `names`' objects `err` says a node does not know, if it says so.
pub(crate) fn unapplied(err: &MembershipError, names: SchemaNames<'_>) -> Option<Unapplied> {
    let (db, message) = refusal(err)?;
    match db {
        DbError::ReadFailure { .. } | DbError::WriteFailure { .. } => {
            return REPLICA_REASONS
                .iter()
                .any(|reason| message.contains(reason))
                .then_some(Unapplied::OnReplica);
        }
        DbError::Invalid | DbError::ServerError => {}
        _ => return None,
    }
    let lower = message.to_ascii_lowercase();
    // The coordinator's own lookup of a table it does not have (`Unknown keyspace/cf pair`).
    if lower.contains("unknown cf") || lower.contains("keyspace/cf pair") {
        return Some(Unapplied::OnReplica);
    }
    if !MISSING.iter().any(|sign| lower.contains(sign)) {
        return None;
    }
    let named: Vec<String> = words(message).collect();
    let has = |name: &str| named.iter().any(|w| w.eq_ignore_ascii_case(name));
    // Every release's keyspace message says "keyspace"; a type's message names it qualified.
    if has(names.entry_type) {
        Some(Unapplied::EntryType)
    } else if has(names.keyspace) && has("keyspace") {
        Some(Unapplied::Keyspace)
    } else if has(names.table) {
        Some(Unapplied::Table)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: SchemaNames<'static> = SchemaNames {
        keyspace: "cm_test",
        table: "members",
        entry_type: "members_entry",
    };

    fn refused(db: DbError, message: &str) -> MembershipError {
        MembershipError::Storage {
            operation: "initialize",
            source: Box::new(ExecutionError::LastAttemptError(
                RequestAttemptError::DbError(db, message.into()),
            )),
        }
    }

    fn invalid(message: &str) -> Option<Unapplied> {
        unapplied(&refused(DbError::Invalid, message), NAMES)
    }

    /// Apache Cassandra 4.0, 4.1 and 5.0 (`AlterSchemaStatement`/`CreateTypeStatement`/
    /// `CreateTableStatement`: "Keyspace '%s' doesn't exist"; `Schema.validateTable`:
    /// "keyspace %s does not exist", "table %s does not exist"; `ClientState.setKeyspace`:
    /// "Keyspace '…' does not exist"; `CQL3Type.RawUT`: "Unknown type " + ks.name).
    #[test]
    fn cassandra_words_each_missing_object_its_own_way_and_each_is_recognised() {
        // The race seen on a fresh ring: CREATE TYPE reached a node without the keyspace.
        assert_eq!(
            invalid("Keyspace 'cm_test' doesn't exist"),
            Some(Unapplied::Keyspace)
        );
        assert_eq!(
            invalid("keyspace cm_test does not exist"),
            Some(Unapplied::Keyspace)
        );
        assert_eq!(
            invalid("Keyspace 'cm_test' does not exist"),
            Some(Unapplied::Keyspace)
        );
        assert_eq!(
            invalid("table members does not exist"),
            Some(Unapplied::Table)
        );
        assert_eq!(
            invalid("Unknown type cm_test.members_entry"),
            Some(Unapplied::EntryType)
        );
    }

    /// ScyllaDB 5.4, 6.x and 2025.1 (`validation.cc`: "Keyspace {} does not exist",
    /// "unconfigured table {}"; `create_table_statement.cc` 6.1+: "Cannot create a table in a
    /// non-existent keyspace: "; `cql3_type.cc` 5.4/6.0: "Unknown keyspace "; `CREATE TYPE`:
    /// "Can't find a keyspace {}" as a server error).
    #[test]
    fn scylla_words_are_recognised_too() {
        assert_eq!(
            invalid("Keyspace cm_test does not exist"),
            Some(Unapplied::Keyspace)
        );
        assert_eq!(
            invalid("unconfigured table members"),
            Some(Unapplied::Table)
        );
        assert_eq!(
            invalid("Cannot create a table in a non-existent keyspace: cm_test"),
            Some(Unapplied::Keyspace)
        );
        assert_eq!(
            invalid("Unknown keyspace cm_test"),
            Some(Unapplied::Keyspace)
        );
        assert_eq!(
            unapplied(
                &refused(DbError::ServerError, "Can't find a keyspace cm_test"),
                NAMES
            ),
            Some(Unapplied::Keyspace)
        );
        assert_eq!(
            invalid("Unknown type \"cm_test\".members_entry"),
            Some(Unapplied::EntryType)
        );
    }

    #[test]
    fn a_replica_without_the_table_fails_the_read_with_its_reason() {
        let failure = DbError::ReadFailure {
            consistency: scylla::statement::Consistency::Serial,
            received: 1,
            required: 2,
            numfailures: 1,
            data_present: false,
        };
        let e = refused(
            failure.clone(),
            "Operation failed - received 1 responses and 1 failures: INCOMPATIBLE_SCHEMA from /127.0.0.2:7000",
        );
        assert_eq!(unapplied(&e, NAMES), Some(Unapplied::OnReplica));
        let other = refused(
            failure,
            "Operation failed - received 1 responses and 1 failures: READ_TOO_MANY_TOMBSTONES from /127.0.0.2:7000",
        );
        assert_eq!(unapplied(&other, NAMES), None);
        assert_eq!(
            unapplied(
                &refused(
                    DbError::ServerError,
                    "java.lang.IllegalArgumentException: Unknown keyspace/cf pair (cm_test.members)"
                ),
                NAMES
            ),
            Some(Unapplied::OnReplica)
        );
    }

    /// Only an answer naming one of this table value's objects counts: another keyspace's or
    /// table's absence, a column problem or a syntax error is the operator's.
    #[test]
    fn other_objects_and_other_refusals_are_not_a_lag() {
        assert_eq!(invalid("keyspace other_ks does not exist"), None);
        assert_eq!(invalid("table members_old does not exist"), None);
        assert_eq!(
            invalid("Undefined column name status in table members"),
            None
        );
        assert_eq!(invalid("Invalid column name status"), None);
        assert_eq!(
            unapplied(
                &refused(DbError::SyntaxError, "line 1:0 no viable alternative"),
                NAMES
            ),
            None
        );
        assert_eq!(
            unapplied(
                &refused(DbError::Unauthorized, "keyspace cm_test does not exist"),
                NAMES
            ),
            None
        );
        // A type of another shape is the operator's (a schema mismatch), not a lag.
        assert_eq!(
            invalid("Unknown field 'etag' in value of user defined type members_entry"),
            None
        );
        // Whole names only: a longer type name is another type.
        assert_eq!(
            invalid("Unknown type cm_test.members_entry_v2"),
            None,
            "a longer name is another object"
        );
    }
}

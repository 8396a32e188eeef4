//! The statements of the placement and state stores (`cql/*.cql`, the exact text run) and the
//! three ways they are sent: reads, plain writes, conditional writes.

use std::sync::Arc;
use std::time::Duration;

use cassandra_membership::{CassandraClusteringOptions, ConsistencyProfile};
use scylla::client::session::Session;
use scylla::errors::ExecutionError;
use scylla::response::query_result::{QueryResult, QueryRowsResult};
use scylla::response::{PagingState, PagingStateResponse};
use scylla::serialize::row::SerializeRow;
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::{Consistency, SerialConsistency};
use scylla::value::{CqlValue, Row};

use crate::error::{RioStoreError, RioStoreResult};

pub(crate) const CREATE_PLACEMENTS: &str = include_str!("../cql/create_placements.cql");
pub(crate) const CREATE_PLACEMENTS_BY_SERVER: &str =
    include_str!("../cql/create_placements_by_server.cql");
pub(crate) const PLACE: &str = include_str!("../cql/place.cql");
pub(crate) const MOVE_PLACEMENT: &str = include_str!("../cql/move_placement.cql");
pub(crate) const LOOKUP_PLACEMENT: &str = include_str!("../cql/lookup_placement.cql");
pub(crate) const DELETE_PLACEMENT: &str = include_str!("../cql/delete_placement.cql");
pub(crate) const INDEX_PLACEMENT: &str = include_str!("../cql/index_placement.cql");
pub(crate) const UNINDEX_PLACEMENT: &str = include_str!("../cql/unindex_placement.cql");
pub(crate) const READ_SERVER_PLACEMENTS: &str = include_str!("../cql/read_server_placements.cql");
pub(crate) const CREATE_STATE: &str = include_str!("../cql/create_state.cql");
pub(crate) const LOAD_STATE: &str = include_str!("../cql/load_state.cql");
pub(crate) const INSERT_STATE: &str = include_str!("../cql/insert_state.cql");
pub(crate) const UPDATE_STATE: &str = include_str!("../cql/update_state.cql");

/// Checks a table name the way CQL accepts it unquoted (letters, digits, underscores, at most
/// 48 characters, a letter first), so that the quoted name means exactly what was configured.
pub(crate) fn validate_table(option: &str, name: &str) -> RioStoreResult<()> {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    if !first_ok || name.len() > 48 || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Err(RioStoreError::config(
            option,
            format!(
                "{name:?} is not a table name: 1 to 48 ASCII letters, digits or underscores, a letter first"
            ),
        ));
    }
    Ok(())
}

/// The id a store's table is created with: the same for every server creating it at once
/// (concurrent `CREATE TABLE IF NOT EXISTS` with random ids can leave conflicting tables).
pub(crate) fn table_id(keyspace: &str, table: &str) -> uuid::Uuid {
    const NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x3f1c_9a2e_71d4_4b08_a6e5_c2d9_58b7_04e3);
    uuid::Uuid::new_v5(
        &NAMESPACE,
        format!("cassandra-membership-rio/1/{keyspace}.{table}").as_bytes(),
    )
}

/// `"keyspace"."table"`, both validated (the keyspace by the library's options).
pub(crate) fn qualified(keyspace: &str, table: &str) -> String {
    format!("\"{keyspace}\".\"{table}\"")
}

/// Where the stores' statements go and how: the membership table's session, keyspace,
/// consistency profile and request timeout.
#[derive(Clone)]
pub(crate) struct Cql {
    pub(crate) session: Arc<Session>,
    pub(crate) keyspace: String,
    consistency: Consistency,
    serial: SerialConsistency,
    request_timeout: Duration,
}

impl std::fmt::Debug for Cql {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cql")
            .field("keyspace", &self.keyspace)
            .finish_non_exhaustive()
    }
}

/// What a store's rows are keyed by, which decides how far its Paxos rounds must reach.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Keyed {
    /// By cluster (placements): under `local_quorum` a cluster lives in one data centre, so
    /// only that data centre writes these rows and `LOCAL_SERIAL` is linearizable for them.
    Cluster,
    /// By service only (states, which outlive a cluster): every cluster of the service writes
    /// the same rows — under `local_quorum`, one cluster per data centre, each activating the
    /// same object. `LOCAL_SERIAL` would let each data centre's Paxos accept its own save on
    /// the same version (both apply, the version check defeated), so these always use `SERIAL`:
    /// state saves and loads then need a quorum of all replicas, and fail — never overwrite —
    /// while data centres are cut apart. Refusing `local_quorum` for the state store instead
    /// would leave a multi-DC service with no state store at all.
    Service,
}

/// The consistency of plain statements and the serial consistency of conditional ones.
pub(crate) fn levels(
    profile: ConsistencyProfile,
    keyed: Keyed,
) -> (Consistency, SerialConsistency) {
    match (profile, keyed) {
        (ConsistencyProfile::Quorum, _) => (Consistency::Quorum, SerialConsistency::Serial),
        (ConsistencyProfile::LocalQuorum, Keyed::Cluster) => {
            (Consistency::LocalQuorum, SerialConsistency::LocalSerial)
        }
        (ConsistencyProfile::LocalQuorum, Keyed::Service) => {
            (Consistency::LocalQuorum, SerialConsistency::Serial)
        }
    }
}

impl Cql {
    pub(crate) fn new(
        session: Arc<Session>,
        options: &CassandraClusteringOptions,
        keyed: Keyed,
    ) -> Self {
        let (consistency, serial) = levels(options.consistency, keyed);
        Cql {
            session,
            keyspace: options.keyspace.clone(),
            consistency,
            serial,
            request_timeout: options.request_timeout,
        }
    }

    /// Runs a DDL statement (`CREATE TABLE IF NOT EXISTS … WITH ID`), waiting for schema
    /// agreement.
    pub(crate) async fn ddl(&self, text: &str, table: &str) -> RioStoreResult<()> {
        let cql = text
            .replace("{table}", &qualified(&self.keyspace, table))
            .replace("{table_id}", &table_id(&self.keyspace, table).to_string());
        self.session
            .query_unpaged(cql, ())
            .await
            .map_err(|e| cassandra("create table", e))?;
        self.session
            .await_schema_agreement()
            .await
            .map_err(|e| cassandra("create table", e))?;
        Ok(())
    }

    /// Prepares a statement file for `table`; `serial_read` makes a read linearizable.
    pub(crate) async fn prepare(
        &self,
        text: &str,
        table: &str,
        serial_read: bool,
    ) -> RioStoreResult<PreparedStatement> {
        let cql = text.replace("{table}", &qualified(&self.keyspace, table));
        let mut statement =
            self.session
                .prepare(cql)
                .await
                .map_err(|e| RioStoreError::Cassandra {
                    operation: "prepare",
                    source: Box::new(e),
                })?;
        statement.set_consistency(if serial_read {
            match self.serial {
                SerialConsistency::Serial => Consistency::Serial,
                SerialConsistency::LocalSerial => Consistency::LocalSerial,
            }
        } else {
            self.consistency
        });
        statement.set_serial_consistency(Some(self.serial));
        statement.set_request_timeout(Some(self.request_timeout));
        Ok(statement)
    }

    pub(crate) async fn read(
        &self,
        operation: &'static str,
        statement: &PreparedStatement,
        values: impl SerializeRow,
    ) -> RioStoreResult<QueryRowsResult> {
        self.session
            .execute_unpaged(statement, values)
            .await
            .map_err(|e| cassandra(operation, e))?
            .into_rows_result()
            .map_err(|e| RioStoreError::Cassandra {
                operation,
                source: Box::new(e),
            })
    }

    /// Every row of a (possibly large) partition, page by page.
    pub(crate) async fn read_all_pages<R>(
        &self,
        operation: &'static str,
        statement: &PreparedStatement,
        values: impl SerializeRow,
        mut decode: impl FnMut(&QueryRowsResult) -> RioStoreResult<Vec<R>>,
    ) -> RioStoreResult<Vec<R>> {
        let mut out = Vec::new();
        let mut paging = PagingState::start();
        loop {
            let (result, next) = self
                .session
                .execute_single_page(statement, &values, paging)
                .await
                .map_err(|e| cassandra(operation, e))?;
            let rows = result
                .into_rows_result()
                .map_err(|e| RioStoreError::Cassandra {
                    operation,
                    source: Box::new(e),
                })?;
            out.extend(decode(&rows)?);
            match next {
                PagingStateResponse::HasMorePages { state } => paging = state,
                PagingStateResponse::NoMorePages => return Ok(out),
            }
        }
    }

    pub(crate) async fn plain(
        &self,
        operation: &'static str,
        statement: &PreparedStatement,
        values: impl SerializeRow,
    ) -> RioStoreResult<()> {
        self.session
            .execute_unpaged(statement, values)
            .await
            .map_err(|e| cassandra(operation, e))?;
        Ok(())
    }

    /// Sends a conditional write once: `[applied]` and the current values of the columns named
    /// in its condition. A failure after it may have reached a replica is `OutcomeUnknown`.
    pub(crate) async fn conditional(
        &self,
        operation: &'static str,
        statement: &PreparedStatement,
        values: impl SerializeRow,
    ) -> RioStoreResult<CasReply> {
        let result = self
            .session
            .execute_unpaged(statement, values)
            .await
            .map_err(|e| {
                if refused(&e) {
                    cassandra(operation, e)
                } else {
                    RioStoreError::OutcomeUnknown {
                        operation,
                        source: Box::new(e),
                    }
                }
            })?;
        CasReply::read(operation, result)
    }
}

/// Errors after which a statement certainly did not run: it never reached a coordinator.
/// Everything else after sending (timeouts, lost connections, server errors) may have applied.
fn refused(e: &ExecutionError) -> bool {
    matches!(
        e,
        ExecutionError::BadQuery(_)
            | ExecutionError::EmptyPlan
            | ExecutionError::PrepareError(_)
            | ExecutionError::ConnectionPoolError(_)
            | ExecutionError::UseKeyspaceError(_)
    )
}

fn cassandra(
    operation: &'static str,
    e: impl std::error::Error + Send + Sync + 'static,
) -> RioStoreError {
    RioStoreError::Cassandra {
        operation,
        source: Box::new(e),
    }
}

/// A conditional write's answer.
#[derive(Debug)]
pub(crate) struct CasReply {
    pub(crate) applied: bool,
    names: Vec<String>,
    row: Option<Row>,
}

impl CasReply {
    fn read(operation: &'static str, result: QueryResult) -> RioStoreResult<CasReply> {
        let corrupt = |detail: String| RioStoreError::CorruptData {
            table: operation.to_owned(),
            detail,
        };
        let rows = result
            .into_rows_result()
            .map_err(|e| corrupt(format!("no [applied] row: {e}")))?;
        let names = rows
            .column_specs()
            .iter()
            .map(|c| c.name().to_owned())
            .collect();
        let row: Option<Row> = rows
            .maybe_first_row::<Row>()
            .map_err(|e| corrupt(format!("unreadable [applied] row: {e}")))?;
        // `[applied]` comes first (read by position: ScyllaDB names it the same, but position
        // is what both promise).
        let applied = match row
            .as_ref()
            .and_then(|r| r.columns.first().cloned().flatten())
        {
            Some(CqlValue::Boolean(b)) => b,
            other => return Err(corrupt(format!("unexpected [applied] column: {other:?}"))),
        };
        Ok(CasReply {
            applied,
            names,
            row,
        })
    }

    /// The current value of `column` a failed condition returned (`None` when the row is absent
    /// or the column null).
    pub(crate) fn current(&self, column: &str) -> Option<&CqlValue> {
        let at = self.names.iter().position(|n| n == column)?;
        self.row.as_ref()?.columns.get(at)?.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_keyed_by_service_use_serial_paxos_even_under_local_quorum() {
        use ConsistencyProfile::{LocalQuorum, Quorum};
        assert_eq!(
            levels(LocalQuorum, Keyed::Service),
            (Consistency::LocalQuorum, SerialConsistency::Serial)
        );
        assert_eq!(
            levels(LocalQuorum, Keyed::Cluster),
            (Consistency::LocalQuorum, SerialConsistency::LocalSerial)
        );
        for keyed in [Keyed::Cluster, Keyed::Service] {
            assert_eq!(
                levels(Quorum, keyed),
                (Consistency::Quorum, SerialConsistency::Serial)
            );
        }
    }

    #[test]
    fn a_table_id_depends_on_keyspace_and_table_only() {
        assert_eq!(table_id("ks", "rio_state"), table_id("ks", "rio_state"));
        assert_ne!(table_id("ks", "rio_state"), table_id("ks2", "rio_state"));
        assert_ne!(
            table_id("ks", "rio_state"),
            table_id("ks", "rio_placements")
        );
        assert_eq!(table_id("ks", "t").get_version_num(), 5);
    }

    #[test]
    fn every_ddl_names_its_table_and_id() {
        for ddl in [CREATE_PLACEMENTS, CREATE_PLACEMENTS_BY_SERVER, CREATE_STATE] {
            assert!(
                ddl.contains("{table}") && ddl.contains("WITH ID = {table_id}"),
                "{ddl}"
            );
        }
    }
}

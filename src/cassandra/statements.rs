//! The CQL in `cql/`, bound to one table and prepared once per table instance.

use std::collections::BTreeMap;

use scylla::client::execution_profile::ExecutionProfileHandle;
use scylla::client::session::Session;
use scylla::policies::speculative_execution::SimpleSpeculativeExecutionPolicy;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::{Consistency, SerialConsistency};

use super::errors::prepare_refused_statement;
use super::options::{ConsistencyProfile, EntryConditions};
use super::retry::{ProviderRetryPolicy, StatementKind};
use super::routing::ConnectedFirst;

pub(crate) const CREATE_KEYSPACE: &str = include_str!("../../cql/create_keyspace.cql");
pub(crate) const CREATE_ENTRY_TYPE: &str = include_str!("../../cql/create_entry_type.cql");
pub(crate) const CREATE_TABLE: &str = include_str!("../../cql/create_table.cql");
const INIT_VERSION: &str = include_str!("../../cql/init_version.cql");
const READ_STATICS: &str = include_str!("../../cql/read_statics.cql");
const READ_ROWS: &str = include_str!("../../cql/read_rows.cql");
const READ_ROW: &str = include_str!("../../cql/read_row.cql");
const INSERT_ENTRY: &str = include_str!("../../cql/insert_entry.cql");
const UPDATE_ENTRY: &str = include_str!("../../cql/update_entry.cql");
const WRITE_VERSION: &str = include_str!("../../cql/write_version.cql");
const HEARTBEAT: &str = include_str!("../../cql/heartbeat.cql");
const DELETE_ENTRY: &str = include_str!("../../cql/delete_entry.cql");
const UPDATE_ENTRY_WHOLE: &str = include_str!("../../cql/update_entry_whole.cql");
const DELETE_ENTRY_WHOLE: &str = include_str!("../../cql/delete_entry_whole.cql");
const DELETE_HEARTBEAT_BEFORE: &str = include_str!("../../cql/delete_heartbeat_before.cql");
const DELETE_ROW: &str = include_str!("../../cql/delete_row.cql");
const DELETE_STATICS: &str = include_str!("../../cql/delete_statics.cql");
const DELETE_PARTITION: &str = include_str!("../../cql/delete_partition.cql");
const ALTER_TABLE_TTL: &str = include_str!("../../cql/alter_table_ttl.cql");
const AUDIT_PARTITION: &str = include_str!("../../cql/audit_partition.cql");
const READ_KEYS: &str = include_str!("../../cql/read_keys.cql");
const READ_HEARTBEATS: &str = include_str!("../../cql/read_heartbeats.cql");
const READ_TTLS: &str = include_str!("../../cql/read_ttls.cql");
const READ_VERSION_TTL: &str = include_str!("../../cql/read_version_ttl.cql");
const LIST_CLUSTERS: &str = include_str!("../../cql/list_clusters.cql");

/// Double-quotes a name that `validate_identifier` accepted (so it holds no quote to escape).
pub(crate) fn quote(name: &str) -> String {
    format!("\"{name}\"")
}

/// `"keyspace"."table"`.
pub(crate) fn qualified(keyspace: &str, table: &str) -> String {
    format!("{}.{}", quote(keyspace), quote(table))
}

/// Substitutes the quoted table name into a statement file.
pub(crate) fn bind_table(cql: &str, qualified_table: &str) -> String {
    cql.replace("{table}", qualified_table)
}

/// The DDL creating the keyspace, from validated options.
pub(crate) fn create_keyspace_cql(
    keyspace: &str,
    replication: &BTreeMap<String, String>,
) -> String {
    // Keys and values were validated to letters, digits, '.', '_' and '-': no quote can occur.
    let map = replication
        .iter()
        .map(|(k, v)| format!("'{k}': '{v}'"))
        .collect::<Vec<_>>()
        .join(", ");
    CREATE_KEYSPACE
        .replace("{keyspace}", &quote(keyspace))
        .replace("{replication}", &format!("{{{map}}}"))
}

/// The table id every silo uses for `keyspace.table`: concurrent `CREATE TABLE IF NOT EXISTS`
/// through different coordinators then agree, instead of leaving the cluster with two table ids
/// for one name (a known hazard of concurrent schema changes before Cassandra 5.1).
pub(crate) fn table_id(keyspace: &str, table: &str) -> uuid::Uuid {
    const NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x6d0b_7f3e_2c1a_4c55_9a8e_3b6f_0d2e_7a11);
    uuid::Uuid::new_v5(
        &NAMESPACE,
        // "/2/": the tombstone-lean shape. A 0.2 binary creating the same name at the same time
        // (a botched rollout) makes a table of another id, never one id with two shapes.
        format!("cassandra-membership/2/{keyspace}.{table}").as_bytes(),
    )
}

/// The entry type's name for a table: `<table>_entry`, in lower case (a validated table name
/// stays a valid identifier with the suffix). Lower case because Cassandra reports any other
/// type name quoted (`frozen<"Members_entry">`), which the driver's schema metadata cannot parse
/// (its refresh then fails for the whole keyspace); tables whose names differ only in case share
/// the one definition.
pub(crate) fn entry_type_name(table: &str) -> String {
    format!("{}_entry", table.to_ascii_lowercase())
}

/// The DDL creating the entry type of `table` in `keyspace`.
pub(crate) fn create_entry_type_cql(keyspace: &str, table: &str) -> String {
    CREATE_ENTRY_TYPE.replace(
        "{entry_type}",
        &qualified(keyspace, &entry_type_name(table)),
    )
}

/// The DDL creating the table, from validated options.
pub(crate) fn create_table_cql(
    qualified_table: &str,
    table: &str,
    table_id: uuid::Uuid,
    default_ttl: u64,
    gc_grace_seconds: u64,
) -> String {
    bind_table(CREATE_TABLE, qualified_table)
        .replace("{entry_type_name}", &quote(&entry_type_name(table)))
        .replace("{table_id}", &table_id.to_string())
        .replace("{default_time_to_live}", &default_ttl.to_string())
        .replace("{gc_grace_seconds}", &gc_grace_seconds.to_string())
}

/// The DDL changing the table's default TTL (the `patch` policy).
pub(crate) fn alter_table_ttl_cql(qualified_table: &str, default_ttl: u64) -> String {
    bind_table(ALTER_TABLE_TTL, qualified_table)
        .replace("{default_time_to_live}", &default_ttl.to_string())
}

/// Every statement of the provider, prepared against one table.
pub(crate) struct Statements {
    pub(crate) init_version: PreparedStatement,
    pub(crate) read_statics: PreparedStatement,
    pub(crate) read_rows: PreparedStatement,
    pub(crate) read_row: PreparedStatement,
    /// The same reads at the commit level (not serial), for lease renewals that a CAS verifies.
    pub(crate) read_row_quorum: PreparedStatement,
    pub(crate) heartbeat: PreparedStatement,
    pub(crate) delete_heartbeat_before: PreparedStatement,
    pub(crate) delete_entry: PreparedStatement,
    /// insert_entry + write_version: insert_row (expecting no entry).
    pub(crate) insert_batch: Batch,
    /// update_entry + write_version: update_row, lease renewal, a patch's rewrite (conditioned on
    /// the row tag and the heartbeat cell as read).
    pub(crate) update_batch: Batch,
    pub(crate) delete_row: PreparedStatement,
    pub(crate) delete_statics: PreparedStatement,
    /// The whole partition, unfenced: `delete_cluster` of a partition no read can scan.
    pub(crate) delete_partition: PreparedStatement,
    pub(crate) write_version: PreparedStatement,
    pub(crate) audit_partition: PreparedStatement,
    /// Every stored row key and the raw version tag (serial): `delete_cluster`.
    pub(crate) read_keys: PreparedStatement,
    /// Heartbeat cells with their write times and TTLs (commit level).
    pub(crate) read_heartbeats: PreparedStatement,
    /// A row's and the version's current TTL (commit level), before a write with expiry on.
    pub(crate) read_ttls: PreparedStatement,
    /// The version's current TTL (commit level), before an insert with expiry on.
    pub(crate) read_version_ttl: PreparedStatement,
    /// Every partition key of the table (commit level, paged): the operators' cluster listing.
    pub(crate) list_clusters: PreparedStatement,
    /// The entry is expected whole (`*_whole.cql`), not by its tag: the server compares no field
    /// of a frozen user type (ScyllaDB), or the options say so.
    pub(crate) whole_entry_conditions: bool,
    profile: ConsistencyProfile,
    routing: Option<ExecutionProfileHandle>,
}

impl std::fmt::Debug for Statements {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Statements")
            .field("profile", &self.profile)
            .finish_non_exhaustive()
    }
}

impl Statements {
    // One call site (mod.rs), each argument an option the statements carry.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn prepare(
        session: &Session,
        qualified_table: &str,
        profile: ConsistencyProfile,
        routing: Option<&ExecutionProfileHandle>,
        request_timeout: std::time::Duration,
        heartbeat_call: std::time::Duration,
        page_size: u32,
        conditions: EntryConditions,
    ) -> Result<Statements, PrepareFailure> {
        let (commit, serial) = levels(profile);
        // Every statement carries the provider's profile: the DC routing (datacenter.rs), or the
        // session's default, with a plan that never ends on an unreachable node (routing.rs).
        let routing =
            &connected_first(routing.unwrap_or(session.get_default_execution_profile_handle()));
        // Idempotent statements (reads, plain deletes) unanswered after a quarter of their
        // bound (the request timeout, or the runtime's call if shorter) are also sent to the
        // next node: a paused coordinator keeps its connections open and never answers, and a
        // read sent again only after a whole request timeout, to a node picked at random, may
        // meet it again (one node of three SIGSTOPped, 3 of 19 `read_all` calls timed out
        // twice). Whichever answer comes first counts; a healthy read answers long before and
        // stays one statement. The quarter is of the call, not only of the request timeout:
        // the driver holds an error it may retry elsewhere (a read failure: too many
        // tombstones) until the next speculative send has had its turn, so an interval longer
        // than the call turned every such error into the runtime's timeout.
        let bound = request_timeout.min(heartbeat_call);
        let speculated = &speculative(routing, bound, 4, 2, "reads");
        // A serial read is a Paxos round: a speculative send of it competes with the first (and,
        // still running after the first answered, with the caller's next conditional write).
        // While a killed node is not yet convicted by gossip, Paxos v1 retries a contended round
        // only once every replica it believes alive has answered, so contention there ends in a
        // timeout (an uncontended write answered `false` under load). So a
        // serial read is sent again only once, after half its bound: the paused coordinator it
        // exists for never answers at all.
        let serial_speculated = &speculative(routing, bound, 2, 1, "serial reads");
        let prep = |cql: &'static str, read_level: Consistency| {
            let text = bind_table(cql, qualified_table);
            async move {
                // Preparing has no timeout of its own in the driver.
                let mut p = tokio::time::timeout(request_timeout, session.prepare(text))
                    .await
                    .map_err(|_| PrepareFailure::Timeout)??;
                p.set_consistency(read_level);
                p.set_serial_consistency(Some(serial));
                p.set_request_timeout(Some(request_timeout));
                // Routing is the statement's, not the session's: see datacenter.rs.
                p.set_execution_profile_handle(Some(routing.clone()));
                // Conditional writes are never idempotent: a retry could apply twice.
                p.set_is_idempotent(false);
                p.set_retry_policy(Some(retry_policy(StatementKind::Conditional)));
                Ok::<_, PrepareFailure>(p)
            }
        };
        let serial_read = match serial {
            SerialConsistency::Serial => Consistency::Serial,
            SerialConsistency::LocalSerial => Consistency::LocalSerial,
        };
        let mut read_rows = prep(READ_ROWS, serial_read).await?;
        read_rows.set_page_size(i32::try_from(page_size).unwrap_or(i32::MAX));
        let insert_entry = prep(INSERT_ENTRY, commit).await?;
        // The field conditions where the server takes them (Cassandra 4.0+), else (ScyllaDB)
        // the whole value: which it is, only preparing tells.
        let by_field = match conditions {
            EntryConditions::WholeValue => None,
            EntryConditions::Field => Some((
                prep(UPDATE_ENTRY, commit).await?,
                prep(DELETE_ENTRY, commit).await?,
            )),
            EntryConditions::Auto => match prep(UPDATE_ENTRY, commit).await {
                Ok(update) => Some((update, prep(DELETE_ENTRY, commit).await?)),
                // Only the server refusing the statement itself says it takes no condition on
                // a field; an overloaded or unreachable node says nothing about it (this
                // preparation fails, and the next operation prepares again).
                Err(PrepareFailure::Refused(e)) if prepare_refused_statement(&e) => {
                    tracing::warn!(error = %e, "the server refuses a condition on a field of the entry (ScyllaDB?); conditional writes expect the whole entry, and an update reads it first");
                    None
                }
                Err(e) => return Err(e),
            },
        };
        let whole_entry_conditions = by_field.is_none();
        let (update_entry, delete_entry) = match by_field {
            Some(pair) => pair,
            None => (
                prep(UPDATE_ENTRY_WHOLE, commit).await?,
                prep(DELETE_ENTRY_WHOLE, commit).await?,
            ),
        };
        let write_version = prep(WRITE_VERSION, commit).await?;
        // A heartbeat is a plain write with an explicit timestamp: repeating it is harmless.
        let mut heartbeat = idempotent(prep(HEARTBEAT, commit).await?, speculated);
        heartbeat.set_execution_profile_handle(Some(speculative(
            routing,
            bound,
            4,
            2,
            "heartbeat",
        )));
        let delete_heartbeat_before =
            idempotent(prep(DELETE_HEARTBEAT_BEFORE, commit).await?, speculated);
        Ok(Statements {
            init_version: prep(INIT_VERSION, commit).await?,
            read_statics: idempotent(prep(READ_STATICS, serial_read).await?, serial_speculated),
            read_rows: idempotent(read_rows, serial_speculated),
            read_row: idempotent(prep(READ_ROW, serial_read).await?, serial_speculated),
            read_row_quorum: idempotent(prep(READ_ROW, commit).await?, speculated),
            heartbeat,
            delete_heartbeat_before,
            delete_entry,
            insert_batch: batch(
                profile,
                Some(routing),
                request_timeout,
                [&insert_entry, &write_version],
            ),
            update_batch: batch(
                profile,
                Some(routing),
                request_timeout,
                [&update_entry, &write_version],
            ),
            delete_row: prep(DELETE_ROW, commit).await?,
            delete_statics: prep(DELETE_STATICS, commit).await?,
            // Plain and stamped by the coordinator: repeating it is harmless.
            delete_partition: idempotent(prep(DELETE_PARTITION, commit).await?, speculated),
            write_version: write_version.clone(),
            audit_partition: idempotent(prep(AUDIT_PARTITION, commit).await?, speculated),
            read_keys: idempotent(prep(READ_KEYS, serial_read).await?, serial_speculated),
            read_heartbeats: idempotent(prep(READ_HEARTBEATS, commit).await?, speculated),
            read_ttls: idempotent(prep(READ_TTLS, commit).await?, speculated),
            read_version_ttl: idempotent(prep(READ_VERSION_TTL, commit).await?, speculated),
            list_clusters: idempotent(prep(LIST_CLUSTERS, commit).await?, speculated),
            whole_entry_conditions,
            profile,
            routing: Some(routing.clone()),
        })
    }

    /// A conditional batch of the given statements at this table's levels.
    pub(crate) fn batch_of<'a>(
        &self,
        statements: impl IntoIterator<Item = &'a PreparedStatement>,
        request_timeout: std::time::Duration,
    ) -> Batch {
        batch(
            self.profile,
            self.routing.as_ref(),
            request_timeout,
            statements,
        )
    }
}

/// Why the statements could not be prepared.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PrepareFailure {
    /// The node refused a statement (the table is missing or has another shape).
    #[error(transparent)]
    Refused(#[from] scylla::errors::PrepareError),
    /// No answer within the request timeout.
    #[error("preparing a statement took longer than the request timeout")]
    Timeout,
}

/// An idempotent statement (a read, a plain write with an explicit timestamp) with `profile`.
fn idempotent(mut p: PreparedStatement, profile: &ExecutionProfileHandle) -> PreparedStatement {
    p.set_execution_profile_handle(Some(profile.clone()));
    p.set_is_idempotent(true);
    p.set_retry_policy(Some(retry_policy(StatementKind::Idempotent)));
    p
}

/// The heartbeat's profile (and the reads', see `prepare`): `base` (the statements' routing),
/// plus up to `sends` speculative sends, one every `call / fraction`. A heartbeat is what keeps a silo alive: one whose coordinator is cut off
/// from the other replicas (it times out, and is not yet down for the driver) would spend its
/// whole call there, and a few such heartbeats in a row get the silo declared dead. Unanswered
/// after a quarter of its call (`call`), it is also sent to the next node of the plan, and to a
/// third after another quarter; the plain write is idempotent (one cell, one timestamp), so
/// whichever lands first counts and the others change nothing. A healthy heartbeat answers long
/// before: it stays one write.
fn speculative(
    base: &ExecutionProfileHandle,
    call: std::time::Duration,
    fraction: u32,
    sends: usize,
    what: &str,
) -> ExecutionProfileHandle {
    let policy = SimpleSpeculativeExecutionPolicy {
        max_retry_count: sends,
        retry_interval: (call / fraction).max(std::time::Duration::from_millis(50)),
    };
    base.pointee_to_builder()
        .speculative_execution_policy(Some(std::sync::Arc::new(policy)))
        .build()
        .into_handle_with_label(format!("cassandra-membership {what}"))
}

/// `base` with its load balancing wrapped in [`ConnectedFirst`]: the handle every statement
/// carries. A copy of `base` as it is now (a host remapping its session's default profile later
/// does not change the provider's statements).
fn connected_first(base: &ExecutionProfileHandle) -> ExecutionProfileHandle {
    let policy = base.to_profile().get_load_balancing_policy().clone();
    base.pointee_to_builder()
        .load_balancing_policy(std::sync::Arc::new(ConnectedFirst::new(policy)))
        .build()
        .into_handle_with_label("cassandra-membership statements".to_owned())
}

/// Set on each statement, so it holds on a host's own session whatever its default policy.
fn retry_policy(kind: StatementKind) -> std::sync::Arc<dyn scylla::policies::retry::RetryPolicy> {
    std::sync::Arc::new(ProviderRetryPolicy(kind))
}

fn levels(profile: ConsistencyProfile) -> (Consistency, SerialConsistency) {
    match profile {
        ConsistencyProfile::Quorum => (Consistency::Quorum, SerialConsistency::Serial),
        ConsistencyProfile::LocalQuorum => {
            (Consistency::LocalQuorum, SerialConsistency::LocalSerial)
        }
    }
}

fn batch<'a>(
    profile: ConsistencyProfile,
    routing: Option<&ExecutionProfileHandle>,
    request_timeout: std::time::Duration,
    statements: impl IntoIterator<Item = &'a PreparedStatement>,
) -> Batch {
    let (commit, serial) = levels(profile);
    let mut b = Batch::new(BatchType::Logged);
    for s in statements {
        b.append_statement(s.clone());
    }
    b.set_consistency(commit);
    b.set_serial_consistency(Some(serial));
    b.set_request_timeout(Some(request_timeout));
    b.set_execution_profile_handle(routing.cloned());
    b.set_is_idempotent(false);
    // A batch's own policy, not its statements', decides its retries.
    b.set_retry_policy(Some(retry_policy(StatementKind::Conditional)));
    b
}

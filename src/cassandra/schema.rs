//! Schema: keyspace and table creation, schema agreement, column and settings checks, `initialize`.

use std::collections::HashMap;
use std::time::Duration;

use tracing::debug;
use uuid::Uuid;

use super::CassandraMembershipTable;
use super::bind::InitVersionValues;
use super::errors::to_error;
use super::exec::Outcome;
use super::schema_lag::Unapplied;
use super::statements::{
    self, create_entry_type_cql, create_keyspace_cql, create_table_cql, entry_type_name,
};
use crate::error::{MembershipError, Result};

/// How long `initialize` asks again before it reports a missing keyspace.
const KEYSPACE_SETTLE: Duration = Duration::from_secs(3);

/// How many times `initialize` writes a version that is still missing after an ambiguous write.
const INIT_VERSION_ATTEMPTS: u32 = 4;

/// What a set-up prepares.
#[derive(Clone, Copy, Debug)]
enum SetUp {
    /// A silo's `initialize`: the schema, the TTL audit, the cluster's version if asked.
    Silo { try_init_version: bool },
    /// A migration's target: the schema alone.
    CopyTarget,
}

/// The schema-check detail for a table whose columns are not (yet) listed.
const NO_COLUMNS: &str = "the table has no columns (yet)";

impl CassandraMembershipTable {
    /// `initialize`: the schema, the TTL reconciliation, then the cluster's version if asked.
    pub(super) async fn initialize_cluster(&self, try_init_version: bool) -> Result<()> {
        self.set_up(SetUp::Silo { try_init_version }).await
    }

    /// A migration's target: the table created if missing and its shape checked, as
    /// `initialize` does, but no TTL audit — the cells a migration copies keep the source's
    /// TTLs by design, so the silos' policy (`throw`, `patch`) must not judge or rewrite them —
    /// and no version.
    pub(super) async fn set_up_copy_target(&self) -> Result<()> {
        self.set_up(SetUp::CopyTarget).await
    }

    async fn set_up(&self, what: SetUp) -> Result<()> {
        // Every step is idempotent (IF NOT EXISTS, a conditional version insert, an audit), so a
        // passing failure — `Unavailable`, `Timeout`, or a schema lag (`schema_lag.rs`: a node
        // that has not applied the keyspace, entry type or table another node has, in whatever
        // words its release uses), a connection lost while many silos start at once — is retried
        // while request_timeout has not passed since the first try (a silent node must not hold a
        // caller much longer than that).
        // A schema lag answers at once (no silent node behind it) and can last as long as a schema
        // change takes to spread: it gets schema_timeout. A keyspace still unknown then is
        // `KeyspaceMissing`, whichever node said so.
        let o = self.options();
        let started = tokio::time::Instant::now();
        let passing = started + o.request_timeout.min(o.schema_timeout);
        let lagging = started + o.schema_timeout;
        let mut attempt = 0u32;
        loop {
            let e = match self.initialize_once(what).await {
                Err(e) => e,
                ok => return ok,
            };
            let now = tokio::time::Instant::now();
            let unapplied = self.unapplied(&e);
            let retry = (matches!(
                e,
                MembershipError::Unavailable { .. } | MembershipError::Timeout { .. }
            ) && now < passing)
                || (unapplied.is_some() && now < lagging);
            if !retry {
                return Err(match unapplied {
                    Some(Unapplied::Keyspace) => self.keyspace_still_unapplied(e).await,
                    _ => e,
                });
            }
            attempt += 1;
            debug!(attempt, error = %e, ?unapplied, "initialize failed for a passing reason; again");
            let pause = 200 * u64::from(attempt.min(10)) + rand::random_range(0..200);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }

    /// A coordinator still said it does not know the keyspace when `schema_timeout` ran out:
    /// `KeyspaceMissing` if the schema tables say so too; if they list it, some node has not
    /// applied it for all that time — a schema disagreement, reported as a `Timeout` (a silo's
    /// join tries again), never as the operator's missing keyspace.
    async fn keyspace_still_unapplied(&self, e: MembershipError) -> MembershipError {
        let o = self.options();
        match self.keyspace_exists().await {
            Ok(false) => MembershipError::KeyspaceMissing {
                keyspace: o.keyspace.clone(),
            },
            Ok(true) | Err(_) => MembershipError::Timeout {
                operation: "initialize",
                source: format!(
                    "keyspace {:?} exists, but a coordinator had not applied it within \
                     schema_timeout ({:?}): {e}",
                    o.keyspace, o.schema_timeout
                )
                .into(),
            },
        }
    }

    async fn initialize_once(&self, what: SetUp) -> Result<()> {
        self.ensure_schema().await?;
        // Another silo may have just created the table: its schema can be listed a moment before
        // the node serves it, so preparing is retried for a short while. (The keyspace was
        // there a moment ago: a node that says it is missing has not applied it yet.)
        let settle = tokio::time::Instant::now() + self.options().schema_timeout;
        let st = loop {
            match self.statements().await {
                Ok(st) => break st,
                Err(
                    MembershipError::SchemaMismatch { .. }
                    | MembershipError::KeyspaceMissing { .. },
                ) if tokio::time::Instant::now() < settle => {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => return Err(e),
            }
        };
        let SetUp::Silo { try_init_version } = what else {
            return Ok(());
        };
        let version_present = self.reconcile_ttl().await?;
        // A version seen by the serial read above needs no conditional insert: skipping it spares
        // every silo after the first a Paxos round that races the joins of the others. (Should
        // it expire or be deleted right after, the next insert expects no version: as after any
        // expiry.)
        if !try_init_version || version_present {
            return Ok(());
        }
        // Silos starting at once duel over this one Paxos round; a duel times out (more so while
        // a node is down and not yet convicted). A version still missing after an ambiguous
        // write is written again: `IF NOT EXISTS` applies once whichever attempt lands (an
        // older attempt's proposal completed later is ordered before the newer commit).
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let values = InitVersionValues {
                ttl: self.version_ttl(),
                new_version_etag: Uuid::new_v4(),
                service_id: self.service_id(),
                cluster_id: &self.cluster_id,
            };
            match self
                .conditional("initialize", &st.init_version, values)
                .await?
            {
                outcome @ (Outcome::Applied | Outcome::NotApplied) => {
                    debug!(created = outcome.applied(), "table version initialized");
                    return Ok(());
                }
                Outcome::Ambiguous(e) => {
                    // Either this write or another silo's created the version, or none did:
                    // look.
                    let statics = self.read_statics(self.pk()).await?;
                    if statics.version_etag.is_some() {
                        return Ok(());
                    }
                    if attempt >= INIT_VERSION_ATTEMPTS {
                        return Err(MembershipError::OutcomeUnknown {
                            operation: "initialize",
                            detail: "the version is still missing after an ambiguous write".into(),
                            source: e,
                        });
                    }
                    // Apart from the duelling silos, at a random point of up to 200 ms.
                    let pause = Duration::from_millis(50 + rand::random::<u64>() % 150);
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }

    async fn ensure_schema(&self) -> Result<()> {
        let o = self.options();
        self.check_datacenter_known()?;
        // Only when it is missing: Cassandra checks CREATE permission before IF NOT EXISTS, so
        // a role holding only the silo's grants would be refused on a keyspace the DBA made.
        if let Some(replication) = &o.create_keyspace_with_replication
            && !self.keyspace_exists().await?
        {
            self.schema_change(create_keyspace_cql(&o.keyspace, replication))
                .await?;
            self.await_schema_agreement().await?;
        }
        if !self.keyspace_exists_settled().await? {
            return Err(MembershipError::KeyspaceMissing {
                keyspace: o.keyspace.clone(),
            });
        }
        self.check_serial_datacenter().await?;
        if self.table_settings().await?.is_none() {
            // The entry type first: the table's `entry` column is of it.
            self.schema_change(create_entry_type_cql(&o.keyspace, &o.table))
                .await?;
            let ddl = create_table_cql(
                &self.shared.qualified,
                &o.table,
                statements::table_id(&o.keyspace, &o.table),
                o.ttl_seconds().unwrap_or(0),
                o.gc_grace.as_secs(),
            );
            self.schema_change(ddl).await?;
        }
        // Also when another silo just created the table: until every node has its schema, a
        // quorum read of it can fail (INCOMPATIBLE_SCHEMA) on the nodes that do not.
        self.await_schema_agreement().await?;
        // A table another silo has just created may be listed before its columns are.
        for _ in 0..40 {
            match self.check_columns().await {
                Err(MembershipError::SchemaMismatch { detail, .. }) if detail == NO_COLUMNS => {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                other => return other,
            }
        }
        self.check_columns().await
    }

    /// Waits for schema agreement, at most `schema_timeout` (the driver's own bound is the
    /// session's, 60 s by default, or whatever a host's session says).
    pub(super) async fn await_schema_agreement(&self) -> Result<()> {
        let limit = self.options().schema_timeout;
        match tokio::time::timeout(limit, self.session().await_schema_agreement()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(MembershipError::Unavailable {
                operation: "initialize",
                source: Box::new(e),
            }),
            Err(_) => Err(MembershipError::Timeout {
                operation: "initialize",
                source: format!("no schema agreement within schema_timeout ({limit:?})").into(),
            }),
        }
    }

    /// A read of the schema tables, bounded by `request_timeout` whatever the session's defaults.
    pub(super) async fn query_bounded(
        &self,
        cql: impl Into<String>,
        values: impl scylla::serialize::row::SerializeRow,
    ) -> std::result::Result<
        scylla::response::query_result::QueryResult,
        scylla::errors::ExecutionError,
    > {
        self.query_within(cql.into(), values, self.options().request_timeout)
            .await
    }

    /// A schema change (DDL), bounded by `schema_timeout`: the change itself and the
    /// schema-agreement wait the driver follows it with, which the request timeout does not cover.
    /// A failed wait is reported as `Timeout` / `Unavailable`: the change itself applied.
    pub(super) async fn schema_change(&self, cql: impl Into<String>) -> Result<()> {
        self.query_within(cql.into(), (), self.options().schema_timeout)
            .await
            .map(drop)
            .map_err(|e| to_error("initialize", e))
    }

    async fn query_within(
        &self,
        cql: String,
        values: impl scylla::serialize::row::SerializeRow,
        limit: Duration,
    ) -> std::result::Result<
        scylla::response::query_result::QueryResult,
        scylla::errors::ExecutionError,
    > {
        let mut statement = scylla::statement::unprepared::Statement::new(cql);
        statement.set_request_timeout(Some(limit));
        statement.set_execution_profile_handle(self.shared.routing.clone());
        tokio::time::timeout(limit, self.session().query_unpaged(statement, values))
            .await
            .unwrap_or(Err(scylla::errors::ExecutionError::RequestTimeout(limit)))
    }

    /// The rows of a read of `system_schema`, bounded as [`Self::query_bounded`].
    async fn read_system_schema(
        &self,
        cql: &'static str,
        values: impl scylla::serialize::row::SerializeRow,
    ) -> Result<scylla::response::query_result::QueryRowsResult> {
        self.query_bounded(cql, values)
            .await
            .map_err(|e| to_error("initialize", e))?
            .into_rows_result()
            .map_err(|e| MembershipError::corrupt(None, format!("system_schema read: {e}")))
    }

    /// Whether the keyspace exists, asked again for a moment when the node says no: a node that
    /// has not applied a keyspace created just now answers "no such keyspace" (seen on a fresh
    /// ring, right after the driver reported schema agreement), which must not read as the
    /// operator's error. A keyspace that is really missing costs `initialize` these seconds.
    /// A node that says no while another lists the keyspace has not applied it yet: the keyspace
    /// exists, and the statements that meet that node are retried as a schema lag.
    async fn keyspace_exists_settled(&self) -> Result<bool> {
        let deadline =
            tokio::time::Instant::now() + self.options().schema_timeout.min(KEYSPACE_SETTLE);
        loop {
            if self.keyspace_exists().await? || self.keyspace_listed_by_any_node().await {
                return Ok(true);
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Whether any node the session knows lists the keyspace (each asked on its own; a node that
    /// does not answer counts as not listing it).
    async fn keyspace_listed_by_any_node(&self) -> bool {
        use scylla::client::execution_profile::ExecutionProfile;
        use scylla::policies::load_balancing::{NodeIdentifier, SingleTargetLoadBalancingPolicy};

        let o = self.options();
        let nodes = self.session().get_cluster_state().get_nodes_info().to_vec();
        for node in nodes {
            let mut statement = scylla::statement::unprepared::Statement::new(
                "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = ?",
            );
            statement.set_request_timeout(Some(o.request_timeout));
            let only = ExecutionProfile::builder()
                .load_balancing_policy(SingleTargetLoadBalancingPolicy::new(
                    NodeIdentifier::Node(node),
                    None,
                ))
                .build();
            statement.set_execution_profile_handle(Some(only.into_handle()));
            let asked = self.session().query_unpaged(statement, (&o.keyspace,));
            if let Ok(Ok(answer)) = tokio::time::timeout(o.request_timeout, asked).await
                && answer
                    .into_rows_result()
                    .is_ok_and(|rows| rows.rows_num() > 0)
            {
                return true;
            }
        }
        false
    }

    pub(super) async fn keyspace_exists(&self) -> Result<bool> {
        let rows = self
            .read_system_schema(
                "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = ?",
                (&self.options().keyspace,),
            )
            .await?;
        Ok(rows.rows_num() > 0)
    }

    /// `default_time_to_live` and `gc_grace_seconds` of the table, if it exists.
    pub(super) async fn table_settings(&self) -> Result<Option<(i32, i32)>> {
        let o = self.options();
        let rows = self
            .read_system_schema(
                "SELECT default_time_to_live, gc_grace_seconds FROM system_schema.tables \
                 WHERE keyspace_name = ? AND table_name = ?",
                (&o.keyspace, &o.table),
            )
            .await?;
        rows.maybe_first_row::<(Option<i32>, Option<i32>)>()
            .map(|r| r.map(|(ttl, gc)| (ttl.unwrap_or(0), gc.unwrap_or(0))))
            .map_err(|e| MembershipError::corrupt(None, format!("system_schema read: {e}")))
    }

    async fn check_columns(&self) -> Result<()> {
        let o = self.options();
        let rows = self
            .read_system_schema(
                "SELECT column_name, type, kind, clustering_order FROM system_schema.columns WHERE keyspace_name = ? AND table_name = ?",
                (&o.keyspace, &o.table),
            )
            .await?;
        let mut actual = HashMap::new();
        let mut descending = false;
        for row in rows
            .rows::<(String, String, String, Option<String>)>()
            .map_err(|e| MembershipError::corrupt(None, format!("system_schema read: {e}")))?
        {
            let (name, ty, kind, order) = row
                .map_err(|e| MembershipError::corrupt(None, format!("system_schema read: {e}")))?;
            // A paged read finds the version's row ('') on its first page: ascending keys.
            descending |= name == "silo" && order.as_deref() == Some("desc");
            actual.insert(name, (ty, kind));
        }
        if actual.is_empty() {
            return Err(MembershipError::SchemaMismatch {
                table: self.shared.qualified.clone(),
                detail: NO_COLUMNS.into(),
            });
        }
        // The 0.2 shape is recognised by its static version or heartbeat map: it is never read,
        // whatever else the table holds.
        if ["version", "heartbeats"]
            .iter()
            .any(|c| actual.get(*c).is_some_and(|(_, kind)| kind == "static"))
        {
            return Err(MembershipError::TableNeedsMigration {
                table: self.shared.qualified.clone(),
            });
        }
        let entry_type = format!("frozen<{}>", entry_type_name(&o.table));
        let expected: &[(&str, &str, &str)] = &[
            ("service_id", "text", "partition_key"),
            ("cluster_id", "text", "partition_key"),
            ("silo", "text", "clustering"),
            ("version", "bigint", "regular"),
            ("version_etag", "uuid", "regular"),
            ("entry", &entry_type, "regular"),
            (
                "heartbeat",
                "frozen<tuple<timestamp, timestamp>>",
                "regular",
            ),
        ];
        let mut problems = Vec::new();
        if descending {
            problems
                .push("column silo is clustered in descending order, expected ascending".into());
        }
        for (name, ty, kind) in expected {
            match actual.get(*name) {
                None => problems.push(format!("column {name} is missing")),
                // Cassandra quotes a type name that is not all lower case: compare unquoted.
                Some((t, k))
                    if t.replace([' ', '"'], "") != ty.replace([' ', '"'], "") || k != kind =>
                {
                    problems.push(format!("column {name} is {k} {t}, expected {kind} {ty}"))
                }
                Some(_) => {}
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(MembershipError::SchemaMismatch {
                table: self.shared.qualified.clone(),
                detail: problems.join("; "),
            })
        }
    }
}

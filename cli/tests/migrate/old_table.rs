//! A table of the 0.2 shape, created and filled by hand the way the 0.2 provider wrote it, and the
//! raw reads the tests compare a copy with.

use cassandra_membership::{CassandraMembershipTable, MembershipEntry, MembershipTable, Timestamp};

use crate::common::{SERVICE, connect, keyspace, options};

/// `git show v0.2:cql/create_table.cql`, as cassandra-membership 0.2 created its tables (without
/// the derived table id).
const OLD_CREATE_TABLE: &str = include_str!("../../../tests/fixtures/create_table_0_2.cql");

pub(crate) fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

/// A table value on `table` (nothing is created).
pub(crate) async fn open(table: &str, cluster: &str) -> CassandraMembershipTable {
    connect(options(table, cluster)).await
}

pub(crate) fn q(table: &str) -> String {
    format!("\"{}\".\"{table}\"", keyspace())
}

/// A CQL timestamp literal (milliseconds): the test binds no driver types of its own.
pub(crate) fn ms(t: Timestamp) -> i64 {
    t.as_millis()
}

pub(crate) fn micros(t: Timestamp) -> i64 {
    t.as_millis() * 1000
}

/// An old table, filled as the 0.2 provider wrote it.
pub(crate) struct OldTable {
    pub(crate) table: String,
    /// A table value whose session the raw statements use.
    pub(crate) conn: CassandraMembershipTable,
}

impl OldTable {
    pub(crate) async fn create() -> Self {
        let table = unique("old");
        // The library's keyspace creation (development replication), on a table of its own.
        let scratch = open(&unique("scratch"), "x").await;
        scratch
            .initialize(false)
            .await
            .expect("create the test keyspace");
        let session = scratch.session();
        session
            .query_unpaged(
                format!("DROP TABLE IF EXISTS {}", scratch.qualified_table()),
                (),
            )
            .await
            .unwrap();
        session
            .query_unpaged(OLD_CREATE_TABLE.replace("{table}", &q(&table)), ())
            .await
            .expect("create the old-shape table");
        session.await_schema_agreement().await.unwrap();
        OldTable {
            table,
            conn: scratch,
        }
    }

    pub(crate) async fn version(
        &self,
        cluster: &str,
        version: i64,
        etag: uuid::Uuid,
        ttl: i32,
        at: Timestamp,
    ) {
        self.conn
            .session()
            .query_unpaged(
                format!(
                    "UPDATE {} USING TTL ? AND TIMESTAMP ? SET version = ?, version_etag = ? \
                     WHERE service_id = ? AND cluster_id = ?",
                    q(&self.table)
                ),
                (ttl, micros(at), version, etag, SERVICE, cluster),
            )
            .await
            .unwrap();
    }

    /// All entry columns in one statement, as the 0.2 provider's conditional writes did.
    pub(crate) async fn entry(
        &self,
        cluster: &str,
        e: &MembershipEntry,
        etag: uuid::Uuid,
        ttl: i32,
        at: Timestamp,
    ) {
        let suspects: Vec<String> = e
            .suspect_times
            .iter()
            .map(|s| format!("('{}', {})", s.suspecting_silo, ms(s.time)))
            .collect();
        self.conn
            .session()
            .query_unpaged(
                format!(
                    "UPDATE {} USING TTL ? AND TIMESTAMP ? SET etag = ?, status = ?, \
                     suspect_times = [{}], proxy_port = ?, host_name = ?, silo_name = ?, \
                     role_name = ?, update_zone = ?, fault_zone = ?, start_time = {}, \
                     i_am_alive = {} WHERE service_id = ? AND cluster_id = ? AND silo = ?",
                    q(&self.table),
                    suspects.join(", "),
                    ms(e.start_time),
                    ms(e.i_am_alive_time)
                ),
                (
                    ttl,
                    micros(at),
                    etag,
                    e.status.code(),
                    i32::from(e.proxy_port),
                    &e.host_name,
                    &e.silo_name,
                    &e.role_name,
                    e.update_zone,
                    e.fault_zone,
                    SERVICE,
                    cluster,
                    e.address.to_string(),
                ),
            )
            .await
            .unwrap();
    }

    /// A heartbeat element, stamped with its I-am-alive time as the 0.2 provider did.
    pub(crate) async fn heartbeat(
        &self,
        cluster: &str,
        e: &MembershipEntry,
        alive: Timestamp,
        ttl: i32,
    ) {
        self.conn
            .session()
            .query_unpaged(
                format!(
                    "UPDATE {} USING TTL ? AND TIMESTAMP ? SET heartbeats[?] = ({}, {}) \
                     WHERE service_id = ? AND cluster_id = ?",
                    q(&self.table),
                    ms(e.start_time),
                    ms(alive)
                ),
                (ttl, micros(alive), e.address.to_string(), SERVICE, cluster),
            )
            .await
            .unwrap();
    }

    /// Every cell of the table with its write time, one JSON text per row. TTLs move, so
    /// they are compared apart ([`assert_cells`]).
    pub(crate) async fn dump(&self) -> Vec<String> {
        let rows = self
            .conn
            .session()
            .query_unpaged(
                format!(
                    "SELECT JSON cluster_id, silo, etag, status, suspect_times, proxy_port, \
                     host_name, silo_name, role_name, update_zone, fault_zone, start_time, \
                     i_am_alive, WRITETIME(etag), version, version_etag, \
                     WRITETIME(version_etag), heartbeats, WRITETIME(heartbeats) FROM {}",
                    q(&self.table)
                ),
                (),
            )
            .await
            .unwrap()
            .into_rows_result()
            .unwrap();
        let mut out: Vec<String> = rows
            .rows::<(String,)>()
            .unwrap()
            .map(|r| r.unwrap().0)
            .collect();
        out.sort();
        out
    }
}

/// Best effort: drops the tables (and the new tables' entry types) a test created; a leftover in
/// the test keyspace harms nothing.
pub(crate) async fn drop_tables(conn: &CassandraMembershipTable, tables: &[&str]) {
    for t in tables {
        let _ = conn
            .session()
            .query_unpaged(format!("DROP TABLE IF EXISTS {}", q(t)), ())
            .await;
        let _ = conn
            .session()
            .query_unpaged(
                format!("DROP TYPE IF EXISTS {}", q(&format!("{t}_entry"))),
                (),
            )
            .await;
    }
}

/// (TTL, WRITETIME) of `column` in a row of `table`.
pub(crate) async fn cell(
    conn: &CassandraMembershipTable,
    table: &str,
    column: &str,
    cluster: &str,
    silo: &str,
) -> (Option<i32>, Option<i64>) {
    let rows = conn
        .session()
        .query_unpaged(
            format!(
                "SELECT TTL({column}), WRITETIME({column}) FROM {} \
                 WHERE service_id = ? AND cluster_id = ? AND silo = ?",
                q(table)
            ),
            (SERVICE, cluster, silo),
        )
        .await
        .unwrap()
        .into_rows_result()
        .unwrap();
    rows.maybe_first_row::<(Option<i32>, Option<i64>)>()
        .unwrap()
        .unwrap_or((None, None))
}

pub(crate) fn within(actual: Option<i32>, expected: Option<i32>, slack: i32) -> bool {
    match (actual, expected) {
        (Some(a), Some(e)) => a <= e && a >= e - slack,
        (None, None) => true,
        _ => false,
    }
}

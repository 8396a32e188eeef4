//! The raw-driver floor: the provider's own CQL prepared directly, and the values it binds.

use cassandra_membership::{ETag, MembershipEntry};
use scylla::client::session::Session;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::{Consistency, SerialConsistency};
use scylla::value::CqlTimestamp;
use uuid::Uuid;

use crate::fixture::{KS, Res};

/// The provider's own CQL, prepared directly: the floor.
pub(crate) struct Floor {
    pub(crate) read_heartbeats: PreparedStatement,
    pub(crate) read_rows: PreparedStatement,
    pub(crate) read_row: PreparedStatement,
    pub(crate) read_row_from: PreparedStatement,
    pub(crate) read_last_row: PreparedStatement,
    /// With expiry on, a membership write first reads the TTLs it must not shorten.
    pub(crate) read_ttls: PreparedStatement,
    pub(crate) read_version_ttl: PreparedStatement,
    pub(crate) heartbeat: PreparedStatement,
    pub(crate) insert: Batch,
    pub(crate) update: Batch,
    pub(crate) local: PreparedStatement,
}

pub(crate) async fn floor(s: &Session, table: &str) -> Res<Floor> {
    let q = format!("\"{}\".\"{table}\"", *KS);
    let prep = |cql: &str, c: Consistency| {
        let text = cql.replace("{table}", &q);
        async move {
            let mut p = s.prepare(text).await?;
            p.set_consistency(c);
            p.set_serial_consistency(Some(SerialConsistency::Serial));
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(p)
        }
    };
    let batch = |stmts: Vec<PreparedStatement>| {
        let mut b = Batch::new(BatchType::Logged);
        for st in stmts {
            b.append_statement(st);
        }
        b.set_consistency(Consistency::Quorum);
        b.set_serial_consistency(Some(SerialConsistency::Serial));
        b
    };
    let update_entry = prep(
        include_str!("../../cql/update_entry.cql"),
        Consistency::Quorum,
    )
    .await?;
    let write_version = prep(
        include_str!("../../cql/write_version.cql"),
        Consistency::Quorum,
    )
    .await?;
    Ok(Floor {
        read_heartbeats: prep(
            include_str!("../../cql/read_heartbeat_values.cql"),
            Consistency::Quorum,
        )
        .await?,
        read_rows: prep(include_str!("../../cql/read_rows.cql"), Consistency::Serial).await?,
        read_row: prep(include_str!("../../cql/read_row.cql"), Consistency::Serial).await?,
        read_row_from: prep(
            include_str!("../../cql/read_row_from.cql"),
            Consistency::Serial,
        )
        .await?,
        read_last_row: prep(
            include_str!("../../cql/read_last_row.cql"),
            Consistency::Serial,
        )
        .await?,
        read_ttls: prep(include_str!("../../cql/read_ttls.cql"), Consistency::Quorum).await?,
        read_version_ttl: prep(
            include_str!("../../cql/read_version_ttl.cql"),
            Consistency::Quorum,
        )
        .await?,
        heartbeat: prep(include_str!("../../cql/heartbeat.cql"), Consistency::Quorum).await?,
        insert: batch(vec![update_entry.clone(), write_version.clone()]),
        update: batch(vec![update_entry, write_version]),
        local: s
            .prepare("SELECT release_version FROM system.local")
            .await?,
    })
}

pub(crate) type EntryTuple = (
    String,
    String,
    String,
    Uuid,
    i32,
    Vec<(String, CqlTimestamp)>,
    i32,
    String,
    String,
    String,
    i32,
    i32,
    CqlTimestamp,
    CqlTimestamp,
    i32,
);

pub(crate) fn entry_values(cluster: &str, e: &MembershipEntry, etag: Uuid, ttl: i32) -> EntryTuple {
    (
        "bench".into(),
        cluster.into(),
        e.address.to_string(),
        etag,
        e.status.code(),
        vec![],
        i32::from(e.proxy_port),
        e.host_name.clone(),
        e.silo_name.clone(),
        e.role_name.clone(),
        e.update_zone,
        e.fault_zone,
        CqlTimestamp(e.start_time.as_millis()),
        CqlTimestamp(e.i_am_alive_time.as_millis()),
        ttl,
    )
}

pub(crate) type UpdateTuple = (
    i32,
    Uuid,
    i32,
    Vec<(String, CqlTimestamp)>,
    i32,
    String,
    String,
    String,
    i32,
    i32,
    CqlTimestamp,
    CqlTimestamp,
    String,
    String,
    String,
    Option<Uuid>,
);

/// `update_entry.cql`'s markers in order (insert_row passes no expected etag).
pub(crate) fn update_values(v: EntryTuple, expected: Option<Uuid>) -> UpdateTuple {
    (
        v.14, v.3, v.4, v.5, v.6, v.7, v.8, v.9, v.10, v.11, v.12, v.13, v.0, v.1, v.2, expected,
    )
}

/// `read_all`'s statements: the first (only) page at SERIAL together with the heartbeat map.
pub(crate) async fn read_all_floor(s: &Session, f: &Floor, pk: (&str, &str)) -> Res<()> {
    let (rows, heartbeats) = tokio::join!(
        s.execute_unpaged(&f.read_rows, pk),
        s.execute_unpaged(&f.read_heartbeats, pk)
    );
    rows?;
    heartbeats?;
    Ok(())
}

pub(crate) fn uuid_of(e: &ETag) -> Uuid {
    Uuid::parse_str(e.as_str()).unwrap_or_default()
}

//! The raw-driver floor: the provider's own CQL prepared directly, and the values it binds.

use cassandra_membership::{ETag, MembershipEntry, TableVersion};
use scylla::SerializeRow;
use scylla::client::session::Session;
use scylla::response::PagingState;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::{Consistency, SerialConsistency};
use scylla::value::CqlTimestamp;
use uuid::Uuid;

use crate::fixture::{KS, Res};

/// The provider's default page size (`CassandraClusteringOptions::page_size`).
const PAGE_SIZE: i32 = 1000;

/// The provider's own CQL, prepared directly: the floor.
pub(crate) struct Floor {
    /// One serial page of the partition: all `read_all` sends (heartbeat cells come in its rows).
    pub(crate) read_rows: PreparedStatement,
    /// One serial names read of the version's row and the silo's: `read_row`, present or absent.
    pub(crate) read_row: PreparedStatement,
    /// The version's row alone, serial.
    pub(crate) read_statics: PreparedStatement,
    /// With expiry on, a membership write first reads the TTLs it must not shorten.
    pub(crate) read_ttls: PreparedStatement,
    pub(crate) read_version_ttl: PreparedStatement,
    pub(crate) heartbeat: PreparedStatement,
    pub(crate) insert: Batch,
    pub(crate) update: Batch,
    pub(crate) local: PreparedStatement,
}

/// `"keyspace"."table"` of the bench keyspace.
pub(crate) fn qualified(table: &str) -> String {
    format!("\"{}\".\"{table}\"", *KS)
}

pub(crate) async fn floor(s: &Session, table: &str) -> Res<Floor> {
    let q = qualified(table);
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
    let insert_entry = prep(
        include_str!("../../cql/insert_entry.cql"),
        Consistency::Quorum,
    )
    .await?;
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
        read_rows: {
            let mut p = prep(include_str!("../../cql/read_rows.cql"), Consistency::Serial).await?;
            p.set_page_size(PAGE_SIZE);
            p
        },
        read_row: prep(include_str!("../../cql/read_row.cql"), Consistency::Serial).await?,
        read_statics: prep(
            include_str!("../../cql/read_statics.cql"),
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
        insert: batch(vec![insert_entry, write_version.clone()]),
        update: batch(vec![update_entry, write_version]),
        local: s
            .prepare("SELECT release_version FROM system.local")
            .await?,
    })
}

/// A heartbeat cell's value: (start time, I-am-alive time).
pub(crate) type HeartbeatCell = (Option<CqlTimestamp>, Option<CqlTimestamp>);

/// `insert_entry.cql`'s markers (bound by name, as the provider binds them).
#[derive(SerializeRow, Clone)]
pub(crate) struct EntryValues {
    pub(crate) service_id: String,
    pub(crate) cluster_id: String,
    pub(crate) silo: String,
    pub(crate) new_etag: Uuid,
    pub(crate) status: i32,
    pub(crate) suspect_times: Vec<(String, CqlTimestamp)>,
    pub(crate) proxy_port: i32,
    pub(crate) host_name: String,
    pub(crate) silo_name: String,
    pub(crate) role_name: String,
    pub(crate) update_zone: i32,
    pub(crate) fault_zone: i32,
    pub(crate) start_time: CqlTimestamp,
    pub(crate) i_am_alive: CqlTimestamp,
    pub(crate) ttl: i32,
}

/// `update_entry.cql`'s markers: the entry, and the row tag and heartbeat cell the read saw.
#[derive(SerializeRow)]
pub(crate) struct UpdateValues {
    #[scylla(flatten)]
    pub(crate) entry: EntryValues,
    pub(crate) expected_etag: Option<Uuid>,
    pub(crate) expected_heartbeat: Option<HeartbeatCell>,
}

/// `write_version.cql`'s markers.
#[derive(SerializeRow)]
pub(crate) struct VersionValues<'a> {
    pub(crate) ttl: i32,
    pub(crate) version: i64,
    pub(crate) new_version_etag: Uuid,
    pub(crate) service_id: &'a str,
    pub(crate) cluster_id: &'a str,
    pub(crate) expected_version_etag: Option<Uuid>,
}

/// `heartbeat.cql`'s markers.
#[derive(SerializeRow)]
pub(crate) struct HeartbeatValues<'a> {
    pub(crate) ttl: i32,
    pub(crate) write_time_micros: i64,
    pub(crate) heartbeat: (CqlTimestamp, CqlTimestamp),
    pub(crate) service_id: &'a str,
    pub(crate) cluster_id: &'a str,
    pub(crate) silo: &'a str,
}

/// The markers of the names reads of one silo's row (`read_row.cql`, `read_ttls.cql`).
#[derive(SerializeRow)]
pub(crate) struct RowKey<'a> {
    pub(crate) service_id: &'a str,
    pub(crate) cluster_id: &'a str,
    pub(crate) silo: &'a str,
}

pub(crate) fn entry_values(
    cluster: &str,
    e: &MembershipEntry,
    etag: Uuid,
    ttl: i32,
) -> EntryValues {
    EntryValues {
        service_id: "bench".into(),
        cluster_id: cluster.into(),
        silo: e.address.to_string(),
        new_etag: etag,
        status: e.status.code(),
        suspect_times: vec![],
        proxy_port: i32::from(e.proxy_port),
        host_name: e.host_name.clone(),
        silo_name: e.silo_name.clone(),
        role_name: e.role_name.clone(),
        update_zone: e.update_zone,
        fault_zone: e.fault_zone,
        start_time: CqlTimestamp(e.start_time.as_millis()),
        i_am_alive: CqlTimestamp(e.i_am_alive_time.as_millis()),
        ttl,
    }
}

impl Floor {
    /// `update_row`'s statements, decided on a read that saw `row_etag` and `version`: with
    /// expiry on the TTL read (the row's and the version's, by name), then the conditional batch.
    pub(crate) async fn update_row(
        &self,
        s: &Session,
        cluster: &str,
        e: &MembershipEntry,
        (row_etag, version): (&ETag, &TableVersion),
        (expiry, ttl): (bool, i32),
    ) -> Res<()> {
        let key = e.address.to_string();
        if expiry {
            let row = RowKey {
                service_id: "bench",
                cluster_id: cluster,
                silo: &key,
            };
            s.execute_unpaged(&self.read_ttls, row).await?;
        }
        let (row, heartbeat) = row_tags(row_etag);
        let entry = UpdateValues {
            entry: entry_values(cluster, e, Uuid::new_v4(), ttl),
            expected_etag: Some(row),
            expected_heartbeat: heartbeat,
        };
        s.batch(&self.update, (entry, next_version(cluster, version, ttl)))
            .await?;
        Ok(())
    }

    /// `insert_row`'s statements: with expiry on the version's TTL read, then the conditional
    /// batch.
    pub(crate) async fn insert_row(
        &self,
        s: &Session,
        cluster: &str,
        e: &MembershipEntry,
        version: &TableVersion,
        (expiry, ttl): (bool, i32),
    ) -> Res<()> {
        if expiry {
            s.execute_unpaged(&self.read_version_ttl, ("bench", cluster))
                .await?;
        }
        let entry = entry_values(cluster, e, Uuid::new_v4(), ttl);
        s.batch(&self.insert, (entry, next_version(cluster, version, ttl)))
            .await?;
        Ok(())
    }
}

/// The next version after `v`, expecting its tag (`write_version.cql`'s markers).
pub(crate) fn next_version<'a>(cluster: &'a str, v: &TableVersion, ttl: i32) -> VersionValues<'a> {
    VersionValues {
        ttl,
        version: v.version as i64 + 1,
        new_version_etag: Uuid::new_v4(),
        service_id: "bench",
        cluster_id: cluster,
        expected_version_etag: (!v.etag.is_absent()).then(|| uuid_of(&v.etag)),
    }
}

/// `read_all`'s statements: one serial page of the partition (the version's row and every
/// entry with its heartbeat cell), of the provider's page size.
pub(crate) async fn read_all_floor(s: &Session, f: &Floor, pk: (&str, &str)) -> Res<()> {
    s.execute_single_page(&f.read_rows, pk, PagingState::start())
        .await?;
    Ok(())
}

/// [`read_all_floor`], its rows decoded too (as generic CQL values): how much of the provider's
/// overhead is turning the page into values at all.
pub(crate) async fn read_all_floor_decoded(s: &Session, f: &Floor, pk: (&str, &str)) -> Res<()> {
    let (page, _) = s
        .execute_single_page(&f.read_rows, pk, PagingState::start())
        .await?;
    let rows = page.into_rows_result()?;
    for row in rows.rows::<scylla::value::Row>()? {
        std::hint::black_box(row?);
    }
    Ok(())
}

/// The version's tag (absent: nil).
pub(crate) fn uuid_of(e: &ETag) -> Uuid {
    Uuid::parse_str(e.as_str()).unwrap_or_default()
}

/// A row etag as the provider hands it out (`<uuid>` or `<uuid>/<start ms>/<I-am-alive ms>`, `-`
/// for a null field): the row tag and the heartbeat cell its write is conditioned on.
pub(crate) fn row_tags(e: &ETag) -> (Uuid, Option<HeartbeatCell>) {
    let field = |f: &str| f.parse::<i64>().ok().map(CqlTimestamp);
    let mut parts = e.as_str().split('/');
    let row = parts
        .next()
        .and_then(|p| Uuid::parse_str(p).ok())
        .unwrap_or_default();
    match (parts.next(), parts.next()) {
        (Some(start), Some(alive)) => (row, Some((field(start), field(alive)))),
        _ => (row, None),
    }
}

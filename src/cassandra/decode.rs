//! Decoding stored rows without trusting them: every column is read as optional and checked,
//! so a row written by hand or by another program yields a reason, never a panic. A result
//! without the expected columns is a schema mismatch.

use scylla::DeserializeRow;
use scylla::deserialize::row::DeserializeRow as DeserializeRowTrait;
use scylla::response::query_result::QueryResult;
use scylla::value::CqlTimestamp;
use uuid::Uuid;

use super::CassandraMembershipTable;
use super::heartbeats::StoredHeartbeat;
use crate::error::{MembershipError, Result};
use crate::model::{
    ETag, MembershipEntry, SiloAddress, SiloStatus, SuspectTime, TableVersion, Timestamp,
};

/// A row key as the provider reads it: `None` for the version's row (key `''`, which no silo
/// address can be), the silo key otherwise.
pub(crate) fn row_key(silo: Option<String>) -> Option<String> {
    silo.filter(|s| !s.is_empty())
}

/// `read_statics.cql`.
#[derive(Debug, DeserializeRow)]
pub(crate) struct StaticsRow {
    pub(crate) version: Option<i64>,
    pub(crate) version_etag: Option<Uuid>,
}

/// Declares the two row types that carry an entry, from one list of its columns: [`EntryRow`]
/// (the entry's fields, `entry.<field>` selected by name, with the version cells of row '') and
/// [`EntryWithStaticsRow`] (the same columns and the heartbeat cell), which `read_rows.cql` and
/// `read_row.cql` return.
/// The driver's `DeserializeRow` matches columns by name and has no `flatten`, and a field it
/// does not find is an error: so the list is written once here, and expanded into both.
macro_rules! entry_rows {
    ($($column:ident: $ty:ty,)*) => {
        /// The entry columns and the version cells (only row '' has those).
        #[derive(Debug, DeserializeRow)]
        pub(crate) struct EntryRow {
            $(pub(crate) $column: $ty,)*
        }

        /// `read_rows.cql` / `read_row.cql`: a row with its heartbeat cell.
        #[derive(Debug, DeserializeRow)]
        pub(crate) struct EntryWithStaticsRow {
            pub(crate) heartbeat: Option<StoredHeartbeat>,
            $(pub(crate) $column: $ty,)*
        }

        impl EntryWithStaticsRow {
            /// The row (its key `None` for the version's row) and its heartbeat cell.
            pub(crate) fn split(self) -> (EntryRow, Option<StoredHeartbeat>) {
                let mut row = EntryRow { $($column: self.$column,)* };
                row.silo = row_key(row.silo);
                (row, self.heartbeat)
            }
        }
    };
}

entry_rows! {
    silo: Option<String>,
    version: Option<i64>,
    version_etag: Option<Uuid>,
    etag: Option<Uuid>,
    status: Option<i32>,
    suspect_times: Option<Vec<(Option<String>, Option<CqlTimestamp>)>>,
    proxy_port: Option<i32>,
    host_name: Option<String>,
    silo_name: Option<String>,
    role_name: Option<String>,
    update_zone: Option<i32>,
    fault_zone: Option<i32>,
    start_time: Option<CqlTimestamp>,
    i_am_alive: Option<CqlTimestamp>,
}

impl EntryRow {
    /// A row without an entry (a heartbeat cell that outlived it, or the version's row): nothing
    /// to decode.
    pub(crate) fn is_empty(&self) -> bool {
        self.etag.is_none()
            && self.status.is_none()
            && self.suspect_times.is_none()
            && self.proxy_port.is_none()
            && self.host_name.is_none()
            && self.silo_name.is_none()
            && self.role_name.is_none()
            && self.update_zone.is_none()
            && self.fault_zone.is_none()
            && self.start_time.is_none()
            && self.i_am_alive.is_none()
    }
}

/// An entry as stored, before the heartbeat cell is merged in.
#[derive(Clone, Debug)]
pub(crate) struct StoredEntry {
    pub(crate) entry: MembershipEntry,
    pub(crate) etag: Uuid,
}

/// The table version from the two cells of its row.
pub(crate) fn decode_version(version: Option<i64>, etag: Option<Uuid>) -> Result<TableVersion> {
    match (version, etag) {
        (None, None) => Ok(TableVersion::absent()),
        (Some(v), Some(e)) if v >= 0 => Ok(TableVersion {
            version: v as u64,
            etag: ETag::new(e.to_string()),
        }),
        (Some(v), Some(_)) => Err(MembershipError::corrupt(
            None,
            format!("the table version is negative ({v})"),
        )),
        (v, e) => Err(MembershipError::corrupt(
            None,
            format!("the table version is incomplete (version {v:?}, version_etag {e:?})"),
        )),
    }
}

fn required<T>(value: Option<T>, column: &str) -> std::result::Result<T, String> {
    value.ok_or_else(|| format!("column {column} is null"))
}

fn text(value: Option<String>, column: &str) -> std::result::Result<String, String> {
    required(value, column)
}

/// Decodes one entry row. `Err` carries the silo key (if readable) and what is wrong.
pub(crate) fn decode_entry(
    row: EntryRow,
) -> std::result::Result<StoredEntry, (Option<String>, String)> {
    let key = row.silo.clone();
    let fail = |reason: String| (key.clone(), reason);
    let silo = required(row.silo, "silo").map_err(fail)?;
    let address: SiloAddress = silo
        .parse()
        .map_err(|e: MembershipError| fail(format!("the row key is not a silo address: {e}")))?;
    let etag = required(row.etag, "etag").map_err(fail)?;
    let code = required(row.status, "status").map_err(fail)?;
    let status =
        SiloStatus::from_code(code).ok_or_else(|| fail(format!("unknown status number {code}")))?;
    let suspect_times = required(row.suspect_times, "suspect_times")
        .map_err(fail)?
        .into_iter()
        .enumerate()
        .map(|(i, (who, when))| {
            let who = who.ok_or_else(|| format!("suspect_times[{i}] has no suspecting silo"))?;
            let suspecting_silo = who
                .parse()
                .map_err(|e: MembershipError| format!("suspect_times[{i}]: {e}"))?;
            let time = when.ok_or_else(|| format!("suspect_times[{i}] has no time"))?;
            Ok(SuspectTime {
                suspecting_silo,
                time: Timestamp::from_millis(time.0),
            })
        })
        .collect::<std::result::Result<Vec<_>, String>>()
        .map_err(fail)?;
    let port = required(row.proxy_port, "proxy_port").map_err(fail)?;
    let proxy_port =
        u16::try_from(port).map_err(|_| fail(format!("proxy_port {port} is not a port number")))?;
    let entry = MembershipEntry {
        address,
        status,
        suspect_times,
        proxy_port,
        host_name: text(row.host_name, "host_name").map_err(fail)?,
        silo_name: text(row.silo_name, "silo_name").map_err(fail)?,
        role_name: text(row.role_name, "role_name").map_err(fail)?,
        update_zone: required(row.update_zone, "update_zone").map_err(fail)?,
        fault_zone: required(row.fault_zone, "fault_zone").map_err(fail)?,
        start_time: Timestamp::from_millis(required(row.start_time, "start_time").map_err(fail)?.0),
        i_am_alive_time: Timestamp::from_millis(
            required(row.i_am_alive, "i_am_alive").map_err(fail)?.0,
        ),
    };
    Ok(StoredEntry { entry, etag })
}

impl CassandraMembershipTable {
    /// The error for a result that does not have the columns a statement of this table asks for.
    pub(super) fn shape_error(&self, e: impl std::fmt::Display) -> MembershipError {
        MembershipError::SchemaMismatch {
            table: self.shared.qualified.clone(),
            detail: format!("a result does not have the expected columns: {e}"),
        }
    }

    /// The first row of a read's result, if any. A result that holds no rows at all is corrupt
    /// (`what` and `silo` name it); rows of another shape are a schema mismatch.
    pub(super) fn first_row<R>(
        &self,
        result: QueryResult,
        silo: Option<&str>,
        what: &str,
    ) -> Result<Option<R>>
    where
        R: for<'frame, 'metadata> DeserializeRowTrait<'frame, 'metadata>,
    {
        let rows = result
            .into_rows_result()
            .map_err(|e| MembershipError::corrupt(silo, format!("{what}: {e}")))?;
        rows.maybe_first_row::<R>().map_err(|e| self.shape_error(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good_row() -> EntryRow {
        EntryRow {
            silo: Some("127.0.0.1:1@1".into()),
            version: Some(1),
            version_etag: Some(Uuid::nil()),
            etag: Some(Uuid::nil()),
            status: Some(3),
            suspect_times: Some(vec![(Some("127.0.0.1:2@2".into()), Some(CqlTimestamp(5)))]),
            proxy_port: Some(30000),
            host_name: Some("h".into()),
            silo_name: Some("s".into()),
            role_name: Some("r".into()),
            update_zone: Some(1),
            fault_zone: Some(2),
            start_time: Some(CqlTimestamp(1)),
            i_am_alive: Some(CqlTimestamp(2)),
        }
    }

    #[test]
    fn a_complete_row_decodes() {
        let e = decode_entry(good_row()).unwrap();
        assert_eq!(e.entry.status, SiloStatus::Active);
        assert_eq!(e.entry.suspect_times.len(), 1);
    }

    #[test]
    fn damaged_rows_give_reasons_not_panics() {
        type Damage = Box<dyn Fn(&mut EntryRow)>;
        let cases: Vec<(Damage, &str)> = vec![
            (Box::new(|r| r.status = Some(42)), "unknown status"),
            (Box::new(|r| r.status = None), "status is null"),
            (
                Box::new(|r| r.silo = Some("garbage".into())),
                "not a silo address",
            ),
            (Box::new(|r| r.silo = None), "silo is null"),
            // A key in a non-canonical form: read_row, heartbeats and cleanup address the
            // canonical key and could never reach it.
            (
                Box::new(|r| r.silo = Some("1.2.3.4:5@+6".into())),
                "not in canonical form",
            ),
            (Box::new(|r| r.proxy_port = Some(-1)), "not a port"),
            (Box::new(|r| r.start_time = None), "start_time is null"),
            (
                Box::new(|r| r.suspect_times = Some(vec![(None, Some(CqlTimestamp(1)))])),
                "no suspecting silo",
            ),
            (
                Box::new(|r| {
                    r.suspect_times = Some(vec![(Some("x".into()), Some(CqlTimestamp(1)))])
                }),
                "suspect_times[0]",
            ),
            (
                Box::new(|r| r.suspect_times = Some(vec![(Some("1.2.3.4:5@6".into()), None)])),
                "no time",
            ),
        ];
        for (damage, expected) in cases {
            let mut row = good_row();
            damage(&mut row);
            let (_, reason) = decode_entry(row).unwrap_err();
            assert!(
                reason.contains(expected),
                "{reason:?} should mention {expected:?}"
            );
        }
    }

    #[test]
    fn version_cells_must_agree() {
        assert_eq!(decode_version(None, None).unwrap(), TableVersion::absent());
        assert!(decode_version(Some(1), None).is_err());
        assert!(decode_version(None, Some(Uuid::nil())).is_err());
        assert!(decode_version(Some(-1), Some(Uuid::nil())).is_err());
        assert_eq!(
            decode_version(Some(7), Some(Uuid::nil())).unwrap().version,
            7
        );
    }
}

//! Bind values: one struct per statement file, field names being the bind marker names.

use scylla::serialize::SerializationError;
use scylla::serialize::row::{RowSerializationContext, SerializeRow};
use scylla::serialize::writers::RowWriter;
use scylla::value::CqlTimestamp;
use scylla::{SerializeRow, SerializeValue};
use uuid::Uuid;

use super::Pk;
use super::decode::StoredEntry;
use super::heartbeats::StoredHeartbeat;
use crate::model::{MembershipEntry, Timestamp};

#[derive(SerializeRow)]
pub(super) struct InitVersionValues<'a> {
    pub(super) ttl: i32,
    pub(super) new_version_etag: Uuid,
    pub(super) service_id: &'a str,
    pub(super) cluster_id: &'a str,
}

#[derive(SerializeRow)]
pub(super) struct ReadRowValues<'a> {
    pub(super) service_id: &'a str,
    pub(super) cluster_id: &'a str,
    pub(super) silo: &'a str,
}

#[derive(Clone, SerializeRow)]
pub(super) struct EntryValues<'a> {
    pub(super) service_id: &'a str,
    pub(super) cluster_id: &'a str,
    pub(super) silo: &'a str,
    pub(super) new_etag: Uuid,
    pub(super) status: i32,
    pub(super) suspect_times: Vec<(String, CqlTimestamp)>,
    pub(super) proxy_port: i32,
    pub(super) host_name: &'a str,
    pub(super) silo_name: &'a str,
    pub(super) role_name: &'a str,
    pub(super) update_zone: i32,
    pub(super) fault_zone: i32,
    pub(super) start_time: CqlTimestamp,
    pub(super) i_am_alive: CqlTimestamp,
    pub(super) ttl: i32,
}

impl<'a> EntryValues<'a> {
    /// The whole entry, written to the row `silo` of `pk` with the tag `new_etag`.
    pub(super) fn new(
        pk: Pk<'a>,
        entry: &'a MembershipEntry,
        silo: &'a str,
        new_etag: Uuid,
        ttl: i32,
    ) -> Self {
        EntryValues {
            service_id: pk.service_id,
            cluster_id: pk.cluster_id,
            silo,
            new_etag,
            status: entry.status.code(),
            suspect_times: entry
                .suspect_times
                .iter()
                .map(|s| (s.suspecting_silo.to_string(), to_cql(s.time)))
                .collect(),
            proxy_port: i32::from(entry.proxy_port),
            host_name: &entry.host_name,
            silo_name: &entry.silo_name,
            role_name: &entry.role_name,
            update_zone: entry.update_zone,
            fault_zone: entry.fault_zone,
            start_time: to_cql(entry.start_time),
            i_am_alive: to_cql(entry.i_am_alive_time),
            ttl,
        }
    }
}

/// The entry a conditional write expects: its tag (`IF entry.etag = ?`), or the whole value as
/// read (`IF entry = ?`, where the server compares no field: see `EntryConditions`).
#[derive(Clone)]
pub(super) enum Expected<'a> {
    Tag(Option<Uuid>),
    Whole(Option<EntryUdt<'a>>),
}

impl<'a> Expected<'a> {
    /// `stored` expected by tag, or whole when the statements compare whole values.
    pub(super) fn of(whole: bool, stored: &'a StoredEntry) -> Self {
        if whole {
            Expected::Whole(Some(EntryUdt::of(stored)))
        } else {
            Expected::Tag(Some(stored.etag))
        }
    }
}

/// The entry as one value of the table's entry type: what a whole-value condition compares.
/// The same fields, values and order as the `entry = {...}` the provider writes, so a stored
/// entry and this value of it serialize to the same bytes.
#[derive(Clone, SerializeValue)]
pub(super) struct EntryUdt<'a> {
    etag: Uuid,
    status: i32,
    suspect_times: Vec<(String, CqlTimestamp)>,
    proxy_port: i32,
    host_name: &'a str,
    silo_name: &'a str,
    role_name: &'a str,
    update_zone: i32,
    fault_zone: i32,
    start_time: CqlTimestamp,
    i_am_alive: CqlTimestamp,
}

impl<'a> EntryUdt<'a> {
    pub(super) fn of(stored: &'a StoredEntry) -> Self {
        let e = &stored.entry;
        EntryUdt {
            etag: stored.etag,
            status: e.status.code(),
            suspect_times: e
                .suspect_times
                .iter()
                .map(|s| (s.suspecting_silo.to_string(), to_cql(s.time)))
                .collect(),
            proxy_port: i32::from(e.proxy_port),
            host_name: &e.host_name,
            silo_name: &e.silo_name,
            role_name: &e.role_name,
            update_zone: e.update_zone,
            fault_zone: e.fault_zone,
            start_time: to_cql(e.start_time),
            i_am_alive: to_cql(e.i_am_alive_time),
        }
    }
}

/// `update_entry.cql` / `update_entry_whole.cql`, by what the write expects.
pub(super) struct UpdateEntryValues<'a> {
    pub(super) entry: EntryValues<'a>,
    pub(super) expected: Expected<'a>,
    /// The heartbeat cell as the read saw it (`None`: it had none).
    pub(super) expected_heartbeat: Option<StoredHeartbeat>,
}

#[derive(SerializeRow)]
struct UpdateByTag<'a> {
    #[scylla(flatten)]
    entry: EntryValues<'a>,
    expected_etag: Option<Uuid>,
    expected_heartbeat: Option<StoredHeartbeat>,
}

#[derive(SerializeRow)]
struct UpdateWhole<'a> {
    #[scylla(flatten)]
    entry: EntryValues<'a>,
    expected_entry: Option<EntryUdt<'a>>,
    expected_heartbeat: Option<StoredHeartbeat>,
}

impl SerializeRow for UpdateEntryValues<'_> {
    fn serialize(
        &self,
        ctx: &RowSerializationContext<'_>,
        writer: &mut RowWriter,
    ) -> std::result::Result<(), SerializationError> {
        let (entry, expected_heartbeat) = (self.entry.clone(), self.expected_heartbeat);
        match &self.expected {
            Expected::Tag(tag) => UpdateByTag {
                entry,
                expected_etag: *tag,
                expected_heartbeat,
            }
            .serialize(ctx, writer),
            Expected::Whole(whole) => UpdateWhole {
                entry,
                expected_entry: whole.clone(),
                expected_heartbeat,
            }
            .serialize(ctx, writer),
        }
    }

    fn is_empty(&self) -> bool {
        false
    }
}

#[derive(SerializeRow)]
pub(super) struct WriteVersionValues<'a> {
    pub(super) ttl: i32,
    pub(super) version: i64,
    pub(super) new_version_etag: Uuid,
    pub(super) service_id: &'a str,
    pub(super) cluster_id: &'a str,
    pub(super) expected_version_etag: Option<Uuid>,
}

impl<'a> WriteVersionValues<'a> {
    /// The version of `pk` written as `version` with the tag `new_etag`, expecting `expected`.
    pub(super) fn new(
        pk: Pk<'a>,
        version: i64,
        new_etag: Uuid,
        expected: Option<Uuid>,
        ttl: i32,
    ) -> Self {
        WriteVersionValues {
            ttl,
            version,
            new_version_etag: new_etag,
            service_id: pk.service_id,
            cluster_id: pk.cluster_id,
            expected_version_etag: expected,
        }
    }
}

#[derive(SerializeRow)]
pub(super) struct SiloKey<'a> {
    pub(super) silo: &'a str,
    pub(super) service_id: &'a str,
    pub(super) cluster_id: &'a str,
}

/// `delete_entry.cql` / `delete_entry_whole.cql`, by what the delete expects.
pub(super) struct DeleteEntryValues<'a> {
    pub(super) service_id: &'a str,
    pub(super) cluster_id: &'a str,
    pub(super) silo: &'a str,
    pub(super) expected: Expected<'a>,
    pub(super) expected_heartbeat: Option<StoredHeartbeat>,
}

#[derive(SerializeRow)]
struct DeleteByTag<'a> {
    service_id: &'a str,
    cluster_id: &'a str,
    silo: &'a str,
    expected_etag: Option<Uuid>,
    expected_heartbeat: Option<StoredHeartbeat>,
}

#[derive(SerializeRow)]
struct DeleteWhole<'a> {
    service_id: &'a str,
    cluster_id: &'a str,
    silo: &'a str,
    expected_entry: Option<EntryUdt<'a>>,
    expected_heartbeat: Option<StoredHeartbeat>,
}

impl SerializeRow for DeleteEntryValues<'_> {
    fn serialize(
        &self,
        ctx: &RowSerializationContext<'_>,
        writer: &mut RowWriter,
    ) -> std::result::Result<(), SerializationError> {
        let (service_id, cluster_id, silo) = (self.service_id, self.cluster_id, self.silo);
        let expected_heartbeat = self.expected_heartbeat;
        match &self.expected {
            Expected::Tag(tag) => DeleteByTag {
                service_id,
                cluster_id,
                silo,
                expected_etag: *tag,
                expected_heartbeat,
            }
            .serialize(ctx, writer),
            Expected::Whole(whole) => DeleteWhole {
                service_id,
                cluster_id,
                silo,
                expected_entry: whole.clone(),
                expected_heartbeat,
            }
            .serialize(ctx, writer),
        }
    }

    fn is_empty(&self) -> bool {
        false
    }
}

#[derive(SerializeRow)]
pub(super) struct DeleteStaticsValues<'a> {
    pub(super) service_id: &'a str,
    pub(super) cluster_id: &'a str,
    pub(super) expected_version_etag: Option<Uuid>,
}

/// The values of one statement of a `delete_cluster` batch.
pub(super) enum DeleteClusterValues<'a> {
    Row(SiloKey<'a>),
    Statics(DeleteStaticsValues<'a>),
}

impl scylla::serialize::row::SerializeRow for DeleteClusterValues<'_> {
    fn serialize(
        &self,
        ctx: &scylla::serialize::row::RowSerializationContext<'_>,
        writer: &mut scylla::serialize::writers::RowWriter,
    ) -> std::result::Result<(), scylla::serialize::SerializationError> {
        match self {
            DeleteClusterValues::Row(v) => v.serialize(ctx, writer),
            DeleteClusterValues::Statics(v) => v.serialize(ctx, writer),
        }
    }

    fn is_empty(&self) -> bool {
        false
    }
}

pub(super) fn ttl_value(seconds: u64) -> i32 {
    // Validated options keep every TTL under MAX_TTL_SECONDS, which fits an i32.
    i32::try_from(seconds).unwrap_or(i32::MAX)
}

pub(super) fn to_cql(t: Timestamp) -> CqlTimestamp {
    CqlTimestamp(t.as_millis())
}

/// `delete_partition.cql`.
#[derive(SerializeRow)]
pub(crate) struct DeletePartitionValues<'a> {
    pub(crate) write_time_micros: i64,
    pub(crate) service_id: &'a str,
    pub(crate) cluster_id: &'a str,
}

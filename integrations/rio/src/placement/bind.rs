//! The bind values of the placement statements (`cql/*.cql`), by marker name.

use scylla::SerializeRow;
use scylla::value::CqlTimestamp;

#[derive(SerializeRow)]
pub(super) struct ObjectKey<'a> {
    pub(super) service_id: &'a str,
    pub(super) cluster_id: &'a str,
    pub(super) object_kind: &'a str,
    pub(super) object_id: &'a str,
}

#[derive(SerializeRow)]
pub(super) struct PlaceValues<'a> {
    pub(super) service_id: &'a str,
    pub(super) cluster_id: &'a str,
    pub(super) object_kind: &'a str,
    pub(super) object_id: &'a str,
    pub(super) server: &'a str,
    pub(super) placed_at: CqlTimestamp,
    pub(super) ttl: i32,
}

#[derive(SerializeRow)]
pub(super) struct MoveValues<'a> {
    pub(super) service_id: &'a str,
    pub(super) cluster_id: &'a str,
    pub(super) object_kind: &'a str,
    pub(super) object_id: &'a str,
    pub(super) server: &'a str,
    pub(super) placed_at: CqlTimestamp,
    /// `None` binds null: `IF server = null` matches a row whose server cell expired.
    pub(super) previous: Option<&'a str>,
    pub(super) ttl: i32,
}

#[derive(SerializeRow)]
pub(super) struct DeleteValues<'a> {
    pub(super) service_id: &'a str,
    pub(super) cluster_id: &'a str,
    pub(super) object_kind: &'a str,
    pub(super) object_id: &'a str,
    pub(super) server: &'a str,
}

#[derive(SerializeRow)]
pub(super) struct IndexValues<'a> {
    pub(super) service_id: &'a str,
    pub(super) cluster_id: &'a str,
    pub(super) server: &'a str,
    pub(super) object_kind: &'a str,
    pub(super) object_id: &'a str,
    pub(super) ttl: i32,
}

#[derive(SerializeRow)]
pub(super) struct UnindexValues<'a> {
    pub(super) service_id: &'a str,
    pub(super) cluster_id: &'a str,
    pub(super) server: &'a str,
    pub(super) object_kind: &'a str,
    pub(super) object_id: &'a str,
}

#[derive(SerializeRow)]
pub(super) struct ServerKey<'a> {
    pub(super) service_id: &'a str,
    pub(super) cluster_id: &'a str,
    pub(super) server: &'a str,
}

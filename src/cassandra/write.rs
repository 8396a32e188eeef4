//! Conditional writes: the versioned insert/update batch, `[applied]`, and resolving ambiguous outcomes.

use scylla::errors::ExecutionError;
use scylla::statement::batch::Batch;
use scylla::value::{CqlValue, Row};
use tracing::{Span, info, warn};
use uuid::Uuid;

use super::driver_errors::{may_have_applied, to_error};
use super::lease::LeaseState;
use super::rows::parse_row_etag;
use super::values::{EntryValues, Pk, UpdateEntryValues, WriteVersionValues, to_cql};
use super::{CassandraMembershipTable, bump};
use crate::error::{BoxError, MembershipError, Result};
use crate::model::{ETag, MembershipEntry, TableVersion, Timestamp};

/// An insert or update in flight: what identifies its effect if its outcome must be resolved.
struct VersionedWrite<'a> {
    operation: &'static str,
    entry: &'a MembershipEntry,
    expected_version: Option<Uuid>,
    /// The row tag an update expects (`None` for an insert).
    expected_row: Option<Uuid>,
    /// The version number the write moves the table to.
    new_version: i64,
    new_row_etag: Uuid,
    new_version_etag: Uuid,
}

/// `Some(None)` for the absent tag, `Some(Some(id))` for a tag this provider issued, `None` for
/// anything else (which can never match).
pub(super) fn parse_etag(etag: &ETag) -> Option<Option<Uuid>> {
    if etag.is_absent() {
        Some(None)
    } else {
        Uuid::parse_str(etag.as_str()).ok().map(Some)
    }
}

/// A conditional write's answer: `[applied]`, and on failure the current values of the
/// conditioned tags (Cassandra returns them after `[applied]`; ScyllaDB returns one row per
/// batch statement with every column), read by column name.
#[derive(Debug, Default)]
pub(super) struct CasReply {
    pub(super) applied: bool,
    /// Every `etag` value the reply carried.
    pub(super) etags: Vec<Uuid>,
    /// Every `version_etag` value the reply carried.
    pub(super) version_etags: Vec<Uuid>,
}

impl CasReply {
    /// True if the write carrying these fresh tags took effect: `[applied]`, or a reply
    /// `[applied] = false` that shows our own tags. Paxos answers that when it completed our
    /// pre-empted proposal before checking the condition again, now against our own write;
    /// the tags are random and issued once, so seeing them proves the write applied.
    pub(super) fn took_effect(&self, row_etag: Option<Uuid>, version_etag: Uuid) -> bool {
        self.applied
            || self.version_etags.contains(&version_etag)
            || row_etag.is_some_and(|e| self.etags.contains(&e))
    }
}

fn cas_reply(result: scylla::response::query_result::QueryResult) -> Result<CasReply> {
    let rows = result.into_rows_result().map_err(|e| {
        MembershipError::corrupt(
            None,
            format!("conditional write returned no [applied] row: {e}"),
        )
    })?;
    let names: Vec<String> = rows
        .column_specs()
        .iter()
        .map(|c| c.name().to_owned())
        .collect();
    let column = |name: &str| names.iter().position(|n| n == name);
    let (applied_at, etag_at, version_etag_at) =
        (column("[applied]"), column("etag"), column("version_etag"));
    let mut reply = CasReply::default();
    let mut seen_applied = None;
    for row in rows
        .rows::<Row>()
        .map_err(|e| MembershipError::corrupt(None, format!("unreadable [applied] row: {e}")))?
    {
        let row = row.map_err(|e| {
            MembershipError::corrupt(None, format!("unreadable [applied] row: {e}"))
        })?;
        let value = |at: Option<usize>| at.and_then(|i| row.columns.get(i).cloned().flatten());
        // ScyllaDB repeats [applied] in every row; any row names the batch's outcome.
        match value(applied_at.or(Some(0))) {
            Some(CqlValue::Boolean(b)) => seen_applied = Some(b),
            other => {
                return Err(MembershipError::corrupt(
                    None,
                    format!("unexpected [applied] column: {other:?}"),
                ));
            }
        }
        if let Some(CqlValue::Uuid(u)) = value(etag_at) {
            reply.etags.push(u);
        }
        if let Some(CqlValue::Uuid(u)) = value(version_etag_at) {
            reply.version_etags.push(u);
        }
    }
    reply.applied = seen_applied
        .ok_or_else(|| MembershipError::corrupt(None, "conditional write returned no rows"))?;
    Ok(reply)
}

fn applied(result: scylla::response::query_result::QueryResult) -> Result<bool> {
    cas_reply(result).map(|r| r.applied)
}

impl VersionedWrite<'_> {
    /// True when a serial re-read that shows neither our tags nor the version tag we expected
    /// proves that the write never applied (and, its expected tag being gone for good, never
    /// will). Tags are random and issued once, and only a write that moves the version gives a
    /// row a new tag, so:
    /// - an update whose row still carries the tag it expected never applied (it would have
    ///   replaced it);
    /// - a row carrying another tag at the very version the write would have created was written
    ///   by another writer that took that step (ours would have left our tag there).
    ///
    /// A missing row proves nothing (a defunct cleanup may have removed it since).
    fn provably_lost(&self, row_etag: Option<Uuid>, current_version: Option<i64>) -> bool {
        match row_etag {
            Some(tag) if tag == self.new_row_etag => false,
            Some(tag) if Some(tag) == self.expected_row => true,
            Some(_) => current_version == Some(self.new_version),
            None => false,
        }
    }
}

impl CassandraMembershipTable {
    pub(super) async fn exec_conditional_batch(
        &self,
        batch: &Batch,
        values: impl scylla::serialize::batch::BatchValues,
    ) -> std::result::Result<Result<bool>, ExecutionError> {
        bump(&self.shared.counters.conditional_writes);
        match self.session_ref().batch(batch, values).await {
            Ok(r) => Ok(applied(r)),
            Err(e) => Err(e),
        }
    }

    /// A conditional batch whose reply must be read in full (see [`CasReply`]).
    pub(super) async fn exec_cas_batch(
        &self,
        batch: &Batch,
        values: impl scylla::serialize::batch::BatchValues,
    ) -> std::result::Result<Result<CasReply>, ExecutionError> {
        bump(&self.shared.counters.conditional_writes);
        match self.session_ref().batch(batch, values).await {
            Ok(r) => Ok(cas_reply(r)),
            Err(e) => Err(e),
        }
    }

    /// A conditional statement whose reply must be read in full (see [`CasReply`]).
    pub(super) async fn exec_cas(
        &self,
        statement: &scylla::statement::prepared::PreparedStatement,
        values: impl scylla::serialize::row::SerializeRow,
    ) -> std::result::Result<Result<CasReply>, ExecutionError> {
        bump(&self.shared.counters.conditional_writes);
        match self.session_ref().execute_unpaged(statement, values).await {
            Ok(r) => Ok(cas_reply(r)),
            Err(e) => Err(e),
        }
    }

    pub(super) async fn exec_conditional(
        &self,
        statement: &scylla::statement::prepared::PreparedStatement,
        values: impl scylla::serialize::row::SerializeRow,
    ) -> std::result::Result<Result<bool>, ExecutionError> {
        bump(&self.shared.counters.conditional_writes);
        match self.session_ref().execute_unpaged(statement, values).await {
            Ok(r) => Ok(applied(r)),
            Err(e) => Err(e),
        }
    }

    pub(super) fn entry_values_in<'a>(
        &'a self,
        pk: Pk<'a>,
        entry: &'a MembershipEntry,
        silo: &'a str,
        new_etag: Uuid,
        ttl: i32,
    ) -> EntryValues<'a> {
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

    pub(super) fn version_values_in<'a>(
        &self,
        pk: Pk<'a>,
        version: i64,
        new_etag: Uuid,
        expected: Option<Uuid>,
        ttl: i32,
    ) -> WriteVersionValues<'a> {
        WriteVersionValues {
            ttl,
            version,
            new_version_etag: new_etag,
            service_id: pk.service_id,
            cluster_id: pk.cluster_id,
            expected_version_etag: expected,
        }
    }

    /// `insert_row` / `update_row`: writes the whole entry and the next version in one
    /// conditional batch, expecting `row_etag` (absent for an insert) and the caller's version tag.
    pub(super) async fn write_entry(
        &self,
        operation: &'static str,
        entry: &MembershipEntry,
        row_etag: Option<&ETag>,
        new_version: &TableVersion,
    ) -> Result<bool> {
        // Versions come from `read().version.next()`: one past i64::MAX means the stored
        // version is at the maximum, which no write of this provider produces.
        let version = i64::try_from(new_version.version).map_err(|_| {
            MembershipError::corrupt(
                None,
                format!(
                    "the table version cannot move on: {} does not fit a CQL bigint (the stored version is at its maximum)",
                    new_version.version
                ),
            )
        })?;
        // An update expects the row tag and the heartbeat element its read saw (`row_etag`).
        let expected_row = match row_etag {
            None => None,
            Some(etag) if etag.is_absent() => None,
            Some(etag) => match parse_row_etag(etag) {
                Some(tags) => Some(tags),
                None => return Ok(false), // a tag this table never issued cannot match
            },
        };
        let Some(expected) = parse_etag(&new_version.etag) else {
            return Ok(false); // tags this table never issued cannot match
        };
        let st = self.statements().await?;
        let key = entry.address.to_string();
        let (new_row_etag, new_version_etag) = (Uuid::new_v4(), Uuid::new_v4());
        // With expiry on, a row or version without TTL keeps none (expiry.rs).
        let (row_ttl, version_ttl) = self.ttls_for_write(&key, expected_row.is_none()).await?;
        let row_values = self.entry_values_in(self.pk(), entry, &key, new_row_etag, row_ttl);
        let version_values =
            self.version_values_in(self.pk(), version, new_version_etag, expected, version_ttl);
        let write = VersionedWrite {
            operation,
            entry,
            expected_version: expected,
            expected_row: expected_row.map(|(tag, _)| tag),
            new_version: version,
            new_row_etag,
            new_version_etag,
        };
        match expected_row {
            None => {
                self.versioned_write(&st.insert_batch, (row_values, version_values), write)
                    .await
            }
            Some((expected_etag, expected_heartbeat)) => {
                let values = UpdateEntryValues {
                    entry: row_values,
                    expected_etag: Some(expected_etag),
                    heartbeat_key: &key,
                    expected_heartbeat,
                };
                self.versioned_write(&st.update_batch, (values, version_values), write)
                    .await
            }
        }
    }

    /// Runs an insert or update batch; an ambiguous failure is resolved by [`Self::resolve`].
    async fn versioned_write(
        &self,
        batch: &Batch,
        values: impl scylla::serialize::batch::BatchValues,
        w: VersionedWrite<'_>,
    ) -> Result<bool> {
        let sent_at = Timestamp::now();
        let applied = match self.exec_cas_batch(batch, values).await {
            Ok(Ok(reply)) => reply.took_effect(Some(w.new_row_etag), w.new_version_etag),
            // The batch reached a coordinator, so a reply that cannot be read says nothing
            // about whether it applied.
            Ok(Err(reply_err)) => self.resolve(&w, Box::new(reply_err)).await?,
            Err(e) if may_have_applied(&e) => self.resolve(&w, Box::new(e)).await?,
            Err(e) => return Err(to_error(w.operation, e)),
        };
        if applied {
            self.remember_lease(w.entry.address, LeaseState::after_write(w.entry, sent_at));
        }
        Span::current().record("applied", applied);
        Ok(applied)
    }

    /// Decides an ambiguous conditional write by a linearizable re-read: a serial read completes
    /// or supersedes any in-flight Paxos proposal, so what it shows is final.
    async fn resolve(&self, w: &VersionedWrite<'_>, err: BoxError) -> Result<bool> {
        let (operation, address) = (w.operation, &w.entry.address);
        let (expected_version, new_row_etag, new_version_etag) =
            (w.expected_version, w.new_row_etag, w.new_version_etag);
        warn!(operation, silo = %address, error = %err, "conditional write outcome unknown; re-reading serially");
        let unknown = |detail: String, err: BoxError| MembershipError::OutcomeUnknown {
            operation,
            detail,
            source: err,
        };
        let found = match self.read_one(address, true).await {
            Ok(Some((row, version, _))) => Some((row.etag, version)),
            Ok(None) => None,
            Err(read_err) => {
                return Err(unknown(format!("the re-read failed too: {read_err}"), err));
            }
        };
        // The version as stored: a row's read validated it; without a row the raw statics.
        let (current_version, current_version_etag) = match &found {
            Some((_, v)) => match parse_etag(&v.etag).flatten() {
                Some(tag) => (i64::try_from(v.version).ok(), Some(tag)),
                None => (None, None),
            },
            None => match self.read_statics(self.pk()).await {
                Ok(s) => (s.version, s.version_etag),
                Err(read_err) => {
                    return Err(unknown(format!("the re-read failed too: {read_err}"), err));
                }
            },
        };
        let row_is_ours = found
            .as_ref()
            .is_some_and(|(etag, _)| *etag == new_row_etag);
        if row_is_ours || current_version_etag == Some(new_version_etag) {
            info!(operation, silo = %address, "ambiguous conditional write had applied");
            return Ok(true);
        }
        if current_version_etag == expected_version {
            // Not applied *yet*: the request may still be queued at a coordinator, or a
            // coordinator may be retrying contention, and apply later. Fence it off — but only
            // a sound version: a fence would create a missing one (a deleted cluster's) or
            // overwrite a damaged one with a number it made up.
            return match (current_version, current_version_etag) {
                (Some(version), Some(_)) if version >= 0 => self.fence(w, version, err).await,
                (version, tag) => Err(unknown(
                    format!(
                        "the table version is missing or damaged (version {version:?}, version_etag {tag:?}): \
                         the provider does not rewrite it to settle this write, so whether it applied cannot be told"
                    ),
                    err,
                )),
            };
        }
        if w.provably_lost(found.as_ref().map(|(etag, _)| *etag), current_version) {
            info!(operation, silo = %address, "ambiguous conditional write lost to another write at its version");
            return Ok(false);
        }
        Err(unknown(
            "the table changed since; whether this write applied cannot be told".into(),
            err,
        ))
    }

    /// Moves the version tag away from the one the write expects — same version number, same
    /// entries, a fresh tag — so that the write, wherever it still is, can no longer apply.
    /// Applied: the write did not and never will (`false`). Not applied: the reply's tag tells
    /// whether ours got there first (`true`); anything else is someone else's write, and whether
    /// ours applied before it cannot be told (`OutcomeUnknown`).
    async fn fence(
        &self,
        w: &VersionedWrite<'_>,
        current_version: i64,
        err: BoxError,
    ) -> Result<bool> {
        let (operation, address) = (w.operation, &w.entry.address);
        let unknown = |detail: String, err: BoxError| MembershipError::OutcomeUnknown {
            operation,
            detail,
            source: err,
        };
        let st = self.statements().await?;
        // The fence keeps the version number (readers see the same version and entries) and
        // the version's TTL: it never lowers or removes it. Without the TTL read, no fence.
        let ttl = match self.fence_ttl().await {
            Ok(ttl) => ttl,
            Err(read_err) => {
                return Err(unknown(
                    format!(
                        "the version's TTL could not be read, so the provider does not rewrite the version to settle this write: {read_err}"
                    ),
                    err,
                ));
            }
        };
        let fence_etag = Uuid::new_v4();
        let values = self.version_values_in(
            self.pk(),
            current_version,
            fence_etag,
            w.expected_version,
            ttl,
        );
        match self.exec_cas(&st.write_version, values).await {
            // `[applied] = false` showing the fence's own fresh tag: Paxos completed the fence's
            // pre-empted proposal before checking it again (see `CasReply::took_effect`).
            Ok(Ok(reply)) if reply.took_effect(None, fence_etag) => {
                info!(operation, silo = %address, "ambiguous conditional write fenced off: it did not apply");
                Ok(false)
            }
            Ok(Ok(reply)) if reply.version_etags.contains(&w.new_version_etag) => {
                info!(operation, silo = %address, "ambiguous conditional write had applied");
                Ok(true)
            }
            Ok(Ok(_)) => match self.read_one(address, true).await {
                Ok(Some((row, _, _))) if row.etag == w.new_row_etag => Ok(true),
                // The fence lost to a write that moved the version away from the tag ours
                // expects, so ours can no longer apply; whether it did before, the row may prove.
                Ok(Some((row, version, _)))
                    if w.provably_lost(Some(row.etag), i64::try_from(version.version).ok()) =>
                {
                    info!(operation, silo = %address, "ambiguous conditional write lost to another write at its version");
                    Ok(false)
                }
                Ok(_) => Err(unknown(
                    "another write moved the table before the fence; whether this write applied first cannot be told".into(),
                    err,
                )),
                Err(read_err) => Err(unknown(format!("the re-read failed too: {read_err}"), err)),
            },
            Ok(Err(reply_err)) => Err(unknown(
                format!("the fence's reply was unreadable: {reply_err}"),
                err,
            )),
            Err(fence_err) => Err(unknown(
                format!("the fence failed too: {fence_err}"),
                err,
            )),
        }
    }
}

//! Settling an ambiguous membership write: a linearizable re-read tells applied, lost, or
//! still pending; a pending write is fenced off by moving the version tag it expects.

use tracing::{info, warn};
use uuid::Uuid;

use super::CassandraMembershipTable;
use super::bind::WriteVersionValues;
use super::etags::parse_etag;
use super::exec::Sent;
use crate::error::{BoxError, MembershipError, Result};
use crate::model::MembershipEntry;

/// An insert or update in flight: what identifies its effect if its outcome must be resolved.
pub(super) struct VersionedWrite<'a> {
    pub(super) operation: &'static str,
    pub(super) entry: &'a MembershipEntry,
    pub(super) expected_version: Option<Uuid>,
    /// The row tag an update expects (`None` for an insert).
    pub(super) expected_row: Option<Uuid>,
    /// The version number the write moves the table to.
    pub(super) new_version: i64,
    pub(super) new_row_etag: Uuid,
    pub(super) new_version_etag: Uuid,
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
    /// Decides an ambiguous conditional write by a linearizable re-read: a serial read completes
    /// or supersedes any in-flight Paxos proposal, so what it shows is final.
    pub(super) async fn resolve(&self, w: &VersionedWrite<'_>, err: BoxError) -> Result<bool> {
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
        let values = WriteVersionValues::new(
            self.pk(),
            current_version,
            fence_etag,
            w.expected_version,
            ttl,
        );
        match self.send_conditional(&st.write_version, values).await {
            // `[applied] = false` showing the fence's own fresh tag: Paxos completed the fence's
            // pre-empted proposal before checking it again (see `CasReply::took_effect`).
            Sent::Answered(reply) if reply.took_effect(None, fence_etag) => {
                info!(operation, silo = %address, "ambiguous conditional write fenced off: it did not apply");
                Ok(false)
            }
            Sent::Answered(reply) if reply.version_etags.contains(&w.new_version_etag) => {
                info!(operation, silo = %address, "ambiguous conditional write had applied");
                Ok(true)
            }
            Sent::Answered(_) => match self.read_one(address, true).await {
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
            Sent::Unreadable(reply_err) => Err(unknown(
                format!("the fence's reply was unreadable: {reply_err}"),
                err,
            )),
            Sent::Ambiguous(fence_err) | Sent::Refused(fence_err) => Err(unknown(
                format!("the fence failed too: {fence_err}"),
                err,
            )),
        }
    }
}

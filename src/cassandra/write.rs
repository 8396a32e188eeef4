//! Membership writes: `insert_row` / `update_row` as one conditional batch of the entry and the
//! next version. An ambiguous outcome is settled in `resolve.rs`.

use scylla::serialize::batch::BatchValues;
use scylla::statement::batch::Batch;
use tracing::Span;
use uuid::Uuid;

use super::CassandraMembershipTable;
use super::bind::{EntryValues, Expected, UpdateEntryValues, WriteVersionValues};
use super::errors::to_error;
use super::etags::{parse_etag, parse_row_etag};
use super::exec::Sent;
use super::lease::LeaseState;
use super::resolve::VersionedWrite;
use crate::error::{MembershipError, Result};
use crate::model::{ETag, MembershipEntry, TableVersion, Timestamp};

impl CassandraMembershipTable {
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
        // An update expects the row tag and the heartbeat cell its read saw (`row_etag`).
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
        let row_values = EntryValues::new(self.pk(), entry, &key, new_row_etag, row_ttl);
        let version_values =
            WriteVersionValues::new(self.pk(), version, new_version_etag, expected, version_ttl);
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
                // Where the server compares only whole entries, the entry the tag names is read
                // first (serially) and expected whole; another tag there now: the write could
                // not apply, and is not sent.
                let stored = match st.whole_entry_conditions {
                    false => None,
                    true => match self.read_one(&entry.address, true).await? {
                        Some((stored, _, _)) if stored.etag == expected_etag => Some(stored),
                        _ => return Ok(false),
                    },
                };
                let expected = match &stored {
                    None => Expected::Tag(Some(expected_etag)),
                    Some(stored) => Expected::of(true, stored),
                };
                let values = UpdateEntryValues {
                    entry: row_values,
                    expected,
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
        values: impl BatchValues,
        w: VersionedWrite<'_>,
    ) -> Result<bool> {
        let sent_at = Timestamp::now();
        let applied = match self.send_conditional(batch, values).await {
            Sent::Answered(reply) => reply.took_effect(Some(w.new_row_etag), w.new_version_etag),
            // The batch reached a coordinator, so a reply that cannot be read says nothing
            // about whether it applied.
            Sent::Unreadable(reply_err) => self.resolve(&w, Box::new(reply_err)).await?,
            Sent::Ambiguous(e) => self.resolve(&w, Box::new(e)).await?,
            Sent::Refused(e) => return Err(to_error(w.operation, e)),
        };
        if applied {
            self.remember_lease(w.entry.address, LeaseState::after_write(w.entry, sent_at));
        }
        Span::current().record("applied", applied);
        Ok(applied)
    }
}

//! The table version outside the membership writes that move it: the TTL it keeps when a write
//! must rewrite it without moving it (a fence), and its recovery when it is lost while rows stay.
//!
//! Two invariants hold whatever faults happen:
//! - a fault never lowers or removes the version's TTL: a write that cannot read the TTL the
//!   version carries does not rewrite it (it fails, or answers `OutcomeUnknown`);
//! - the version a reader sees never goes backwards for the life of a partition: a version lost
//!   while rows stay (rows that outlived it, an interrupted `delete_cluster`) is never read as
//!   absent (reads answer `CorruptData` and write nothing, so `delete_cluster`'s close holds and
//!   dry runs stay dry); a silo's `initialize` re-creates it at a number no earlier version of the
//!   partition can have reached.

use tracing::warn;
use uuid::Uuid;

use super::bind::WriteVersionValues;
use super::{CassandraMembershipTable, Pk};
use crate::cassandra::exec::Scan;
use crate::error::Result;
use crate::model::Timestamp;

/// The number a lost version is re-created at: microseconds since the Unix epoch. A version
/// moves by one per conditional write, and no partition takes a conditional write per
/// microsecond, so this is above every version the partition had — including one re-created
/// earlier, as long as the recovering clients' clocks disagree by less than the time the
/// partition took to lose it again (at least the TTL).
pub(super) fn recovered_version_number(now: Timestamp) -> i64 {
    now.as_millis().saturating_mul(1000).max(1)
}

impl CassandraMembershipTable {
    /// The version's remaining TTL by one plain read: `None` when there is no version,
    /// `Some(None)` for a version without TTL.
    pub(super) async fn read_version_ttl(
        &self,
        operation: &'static str,
    ) -> Result<Option<Option<i32>>> {
        let st = self.statements().await?;
        let result = self
            .exec_read(
                operation,
                &st.read_version_ttl,
                self.pk(),
                false,
                Scan::Part(self.pk()),
            )
            .await?;
        let row: Option<(Option<Uuid>, Option<i32>)> =
            self.first_row(result, None, "version TTL read returned no rows")?;
        Ok(match row {
            Some((Some(_), ttl)) => Some(ttl),
            _ => None,
        })
    }

    /// The TTL a fence writes the version with: what the version carries now, never less (and
    /// never a TTL where it has none). A failed read is an error: the fence is then not sent.
    pub(super) async fn fence_ttl(&self) -> Result<i32> {
        if self.options().ttl_seconds().is_none() {
            return Ok(0);
        }
        Ok(match self.read_version_ttl("fence").await? {
            Some(current) => self.version_ttl_over(current, self.write_ttl()),
            // No version: the fence's condition cannot hold, whatever it carries.
            None => 0,
        })
    }

    /// Re-creates the version of a partition whose rows outlived it, at
    /// [`recovered_version_number`], conditionally on there still being none. Whoever wins,
    /// the caller reads again; an ambiguous outcome is settled by that read too. `false` (nothing
    /// sent) when no row holding an entry is left: the partition ends, and starts again at 0.
    pub(super) async fn recover_lost_version(&self, pk: Pk<'_>) -> Result<bool> {
        const OPERATION: &str = "read (version recovery)";
        let st = self.statements().await?;
        let version = recovered_version_number(Timestamp::now());
        let Some(ttl) = self.recovered_version_ttl(pk).await? else {
            return Ok(false);
        };
        warn!(table = %self.shared.qualified, cluster = pk.cluster_id, version, ttl,
            "the table version is missing while entries remain; re-creating it at a number no earlier version can have reached");
        let values = WriteVersionValues::new(pk, version, Uuid::new_v4(), None, ttl);
        // Applied, not, or ambiguous: the caller's next read tells.
        self.conditional(OPERATION, &st.write_version, values)
            .await
            .map(|_| true)
    }

    /// The TTL a re-created version needs to outlive every row, from the rows alone (silos of
    /// other configurations may own them): none if some row has none, else the longest remaining
    /// row TTL. `None` when no row holding an entry is left.
    async fn recovered_version_ttl(&self, pk: Pk<'_>) -> Result<Option<i32>> {
        let mut longest = None;
        for row in self.scan_partition(pk).await? {
            if row.silo.is_none() || row.etag.is_none() {
                continue; // the version's row, or a row without an entry (nothing to outlive)
            }
            match row.etag_ttl {
                Some(t) => longest = Some(longest.unwrap_or(1).max(t)),
                None => return Ok(Some(0)),
            }
        }
        Ok(longest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recovered_version_is_above_any_count_of_writes_and_grows_with_time() {
        let now = Timestamp::now();
        let v = recovered_version_number(now);
        // 30,000 years of 1,000 conditional writes a second stay below it.
        assert!(v > 1_000 * 3600 * 24 * 365 * 30_000);
        assert!(recovered_version_number(Timestamp::from_millis(now.as_millis() + 1)) > v);
        assert_eq!(
            recovered_version_number(Timestamp::from_millis(i64::MIN)),
            1
        );
        assert_eq!(
            recovered_version_number(Timestamp::from_millis(i64::MAX)),
            i64::MAX
        );
    }
}

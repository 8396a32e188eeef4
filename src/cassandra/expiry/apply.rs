//! What `initialize` does about a table or partition that disagrees with the configuration —
//! the `throw` / `allow` / `patch` policies, the version repair every policy makes, the
//! re-creation of a lost version — and the writes that apply a plan. Every write of a patch is
//! conditional on the tags its plan was read with; a write that loses a race, or whose outcome
//! is unknown, makes the patch read and plan again (every step is safe to repeat).

use std::time::Instant;

use tracing::{info, warn};
use uuid::Uuid;

use super::audit::TtlAudit;
use super::plan::{CellPatch, Plan, RowPatch, VersionPatch};
use super::ttl::TtlRules;
use crate::cassandra::bind::{
    DeleteEntryValues, DeleteStaticsValues, EntryValues, Expected, UpdateEntryValues,
    WriteVersionValues,
};
use crate::cassandra::exec::Outcome;
use crate::cassandra::statements::{Statements, alter_table_ttl_cql};
use crate::cassandra::{CassandraMembershipTable, MAX_ATTEMPTS, Pk, TtlMismatchPolicy};
use crate::error::{MembershipError, Result};
use crate::model::Timestamp;

const PATCH: &str = "initialize (ttl patch)";

/// What one conditional write of a patch came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// It applied: the patch goes on.
    Applied,
    /// It lost a race, or its outcome is unknown: the patch reads and plans again.
    Replan,
}

/// The step a conditional write of a patch came to; a hard error (invalid, unauthorized, an
/// unreadable reply) is returned as such, never retried.
fn settle(outcome: Result<Outcome>) -> Result<Step> {
    Ok(if outcome?.applied() {
        Step::Applied
    } else {
        Step::Replan
    })
}

/// The rows a patch rewrote and removed, counted as sent over all its attempts.
#[derive(Default)]
struct PatchCounts {
    rewritten: usize,
    removed: usize,
}

impl CassandraMembershipTable {
    /// Decides, at `initialize`, what to do about a table or partition that disagrees with the
    /// configuration, and records what the table value learnt for its own writes.
    /// Returns whether the cluster's version was there when its partition was read (a serial
    /// read), so `initialize` need not race other starting silos to create it.
    pub(crate) async fn reconcile_ttl(&self) -> Result<bool> {
        let (audit, first) = match self.audit_and_plan().await {
            // A partition buried in tombstones cannot be audited, but it can be joined (every
            // write reads by name): nothing is reconciled, and until a renewal's scan succeeds
            // again this table value gives the version no TTL and leaves cleanup to the silos
            // (the safe side: never early).
            // Without a version the buried partition may still hold entries (a lost version),
            // which no read can rule out: never answered absent (the version would restart at 0).
            Err(e @ MembershipError::TooManyTombstones { .. }) => {
                if self.read_statics(self.pk()).await?.version_etag.is_none() {
                    return Err(e);
                }
                warn!(table = %self.shared.qualified, cluster = %self.cluster_id, error = %e,
                    "cannot audit the TTLs of a partition buried in tombstones; starting without");
                self.expiry_state.record_damaged();
                return Ok(true);
            }
            other => other?,
        };
        // A damaged version is corrupt data under every policy: no policy writes over it (that
        // would restart the version, or invent one).
        let first = first?;
        let mut plan = if !audit.agrees() && self.resolve_disagreement(&audit, &first).await? {
            // What stays changed: plan again.
            self.plan_partition(self.pk()).await
        } else {
            Ok(first)
        };
        // A version lost while entries remain is re-created above any earlier number under every
        // policy: `initialize` must never answer it absent (it would start it again at 0).
        for _ in 0..2 {
            if !matches!(&plan, Ok(p) if p.read.version_lost) {
                break;
            }
            self.recover_lost_version(self.pk()).await?;
            plan = self.plan_partition(self.pk()).await;
        }
        if matches!(&plan, Ok(p) if p.read.version_lost) {
            return Err(crate::cassandra::read::lost_version_error(None));
        }
        // What stays decides the version's TTL and whether storage covers cleanup.
        match plan {
            Ok(plan) => {
                self.expiry_state
                    .record_plan(plan.floor, plan.storage_covers_cleanup());
                Ok(plan.read.version_etag.is_some())
            }
            // Damaged since the first plan (a concurrent change): nothing is written over it.
            Err(e) => {
                self.expiry_state.record_damaged();
                Err(e)
            }
        }
    }

    /// Applies the policy to a disagreement `plan` was made for; returns whether it wrote
    /// anything (the partition is then planned again).
    async fn resolve_disagreement(&self, audit: &TtlAudit, plan: &Plan) -> Result<bool> {
        if audit.only_the_version_disagrees() {
            // The version's TTL alone is what the provider's own protocol can leave behind (a
            // fence or a failed renewal of an earlier release, a rolling change of settings): it
            // is repaired under every policy, touching no entry.
            info!(table = %audit.table, cluster = %self.cluster_id, "giving the table version the TTL its rows imply");
            self.repair_version(self.pk(), plan).await?;
            return Ok(true);
        }
        match self.options().ttl_mismatch {
            TtlMismatchPolicy::Throw => Err(MembershipError::TtlMismatch {
                table: audit.table.clone(),
                table_ttl_seconds: audit.table_default_ttl,
                configured_ttl_seconds: audit.configured_ttl,
                rows_disagreeing: audit.disagreeing(),
            }),
            TtlMismatchPolicy::Allow => {
                warn!(
                    table = %audit.table,
                    cluster = %self.cluster_id,
                    table_ttl = audit.table_default_ttl,
                    configured_ttl = audit.configured_ttl,
                    rows_disagreeing = audit.disagreeing(),
                    "the table's TTL settings disagree with the configuration; ttl_mismatch = allow leaves them as they are, new writes use the configured TTL"
                );
                Ok(false)
            }
            TtlMismatchPolicy::Patch => {
                self.patch_ttl(audit).await?;
                Ok(true)
            }
        }
    }

    /// Gives the version the TTL `plan` says, conditionally on its tag and touching nothing else
    /// (the repair of a version-only disagreement, under every policy). A lost race or an
    /// ambiguous outcome is left to the next write or start: every write applies the same rules.
    async fn repair_version(&self, pk: Pk<'_>, plan: &Plan) -> Result<()> {
        let read = &plan.read;
        let Some(tag) = read.version_etag else {
            if read.version_lost {
                self.recover_lost_version(pk).await?;
            }
            return Ok(());
        };
        let Some(ttl) = plan.version_repair_ttl(self.write_ttl()) else {
            return Ok(());
        };
        let st = self.statements().await?;
        let values = WriteVersionValues::new(pk, read.version.version as i64, tag, Some(tag), ttl);
        // A lost race or an ambiguous outcome leaves the repair to the next write or start.
        self.conditional("initialize (version TTL repair)", &st.write_version, values)
            .await
            .map(|_| ())
    }

    async fn patch_ttl(&self, audit: &TtlAudit) -> Result<()> {
        if audit.table_default_ttl != audit.configured_ttl {
            // The table default is shared by every cluster in the table; ours never relies on it
            // (every write carries its TTL), but writes of other programs do.
            self.schema_change(alter_table_ttl_cql(
                &self.shared.qualified,
                audit.configured_ttl,
            ))
            .await?;
            self.await_schema_agreement().await?;
        }
        if audit.rows.is_empty() {
            return Ok(());
        }
        let (rewritten, removed) = self.patch_partition(self.pk()).await?;
        info!(table = %audit.table, cluster = %self.cluster_id, rewritten, removed, "patched rows to the configured TTL");
        Ok(())
    }

    /// Patches one partition: its rows, then its version, then its heartbeat cells; reads
    /// and plans again when a write does not apply. Hard errors are returned as such.
    async fn patch_partition(&self, pk: Pk<'_>) -> Result<(usize, usize)> {
        let st = self.statements().await?;
        let mut counts = PatchCounts::default();
        let started = Instant::now();
        for _ in 0..MAX_ATTEMPTS {
            let plan = self.plan_partition(pk).await?;
            let Some(version_etag) = plan.read.version_etag else {
                // Rows without a version: re-create it (above any earlier number), plan again.
                if plan.version_line().is_some() && self.recover_lost_version(pk).await? {
                    continue;
                }
                // Nothing to re-create it from: the patch gives up, as one that keeps losing.
                break;
            };
            let attempt = PatchAttempt {
                table: self,
                st,
                pk,
                plan: &plan,
                version_etag,
            };
            if attempt.rows(&mut counts).await? == Step::Replan
                || attempt.version().await? == Step::Replan
            {
                continue;
            }
            self.patch_heartbeats(pk, &plan).await?;
            return Ok((counts.rewritten, counts.removed));
        }
        Err(MembershipError::Contention {
            operation: PATCH,
            attempts: MAX_ATTEMPTS,
            elapsed: started.elapsed(),
        })
    }

    /// Gives heartbeat cells the TTL the configuration implies, or removes them
    /// ([`Plan::heartbeat_patch`]). Each write is stamped relative to the element's own write
    /// time: a newer heartbeat always wins, and a later delete (stamped with the element's write
    /// time) still removes it.
    async fn patch_heartbeats(&self, pk: Pk<'_>, plan: &Plan) -> Result<()> {
        let now = Timestamp::now();
        let rules = TtlRules::of(self.options());
        for cell in self.read_heartbeat_cells(pk, PATCH).await? {
            match plan.heartbeat_patch(&cell, now, &rules) {
                CellPatch::Leave => {}
                CellPatch::Restamp {
                    value,
                    ttl,
                    written,
                } => {
                    self.write_heartbeat_cell(pk, &cell.key, value, ttl, written, PATCH)
                        .await?
                }
                CellPatch::Delete { written } => {
                    self.delete_heartbeat_cell(pk, &cell.key, written, PATCH)
                        .await?
                }
            }
        }
        Ok(())
    }
}

/// One attempt of a patch: the writes of one plan, each expecting the tags the plan was read
/// with.
#[derive(Clone, Copy)]
struct PatchAttempt<'a> {
    table: &'a CassandraMembershipTable,
    st: &'a Statements,
    pk: Pk<'a>,
    plan: &'a Plan,
    /// The version's tag as the plan read it: every write expects it, and keeps it.
    version_etag: Uuid,
}

impl PatchAttempt<'_> {
    /// The version as read, unchanged but for its TTL, expecting (and keeping) its tag.
    fn kept_version(&self, ttl: i32) -> WriteVersionValues<'_> {
        let version = self.plan.read.version.version as i64;
        let tag = self.version_etag;
        WriteVersionValues::new(self.pk, version, tag, Some(tag), ttl)
    }

    /// Rewrites (in a batch with the version, which keeps its tag) or removes the rows the plan
    /// says, in its order; stops at the first write that does not apply.
    async fn rows(&self, counts: &mut PatchCounts) -> Result<Step> {
        let Self {
            table,
            st,
            pk,
            plan,
            ..
        } = *self;
        for patch in plan.row_patches() {
            let step = match patch {
                RowPatch::Rewrite {
                    silo,
                    stored,
                    heartbeat,
                    ttl,
                } => {
                    let values = (
                        UpdateEntryValues {
                            entry: EntryValues::new(pk, &stored.entry, silo, stored.etag, ttl),
                            expected: Expected::of(st.whole_entry_conditions, stored),
                            expected_heartbeat: heartbeat,
                        },
                        self.kept_version(plan.batch_version_ttl()),
                    );
                    counts.rewritten += 1;
                    settle(table.conditional(PATCH, &st.update_batch, values).await)?
                }
                RowPatch::Remove {
                    silo,
                    stored,
                    heartbeat,
                } => {
                    let values = DeleteEntryValues {
                        service_id: pk.service_id,
                        cluster_id: pk.cluster_id,
                        silo,
                        expected: Expected::of(st.whole_entry_conditions, stored),
                        expected_heartbeat: heartbeat,
                    };
                    counts.removed += 1;
                    settle(table.conditional(PATCH, &st.delete_entry, values).await)?
                }
            };
            if step == Step::Replan {
                return Ok(Step::Replan);
            }
        }
        Ok(Step::Applied)
    }

    /// The version alone once the rows are done: its rewrite, or its removal when nothing stays.
    async fn version(&self) -> Result<Step> {
        let (table, st) = (self.table, self.st);
        match self.plan.version_patch() {
            VersionPatch::Leave => Ok(Step::Applied),
            VersionPatch::DeleteStatics => {
                let values = DeleteStaticsValues {
                    service_id: self.pk.service_id,
                    cluster_id: self.pk.cluster_id,
                    expected_version_etag: Some(self.version_etag),
                };
                settle(table.conditional(PATCH, &st.delete_statics, values).await)
            }
            VersionPatch::Rewrite { ttl } => {
                let values = self.kept_version(ttl);
                settle(table.conditional(PATCH, &st.write_version, values).await)
            }
        }
    }
}

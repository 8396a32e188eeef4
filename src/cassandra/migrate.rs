//! The offline copy of a table of the 0.2 shape (per-field columns, the version and a heartbeat
//! map in static columns) into a table of the current shape: `migrate_to`, which
//! `cassandra-membership migrate` runs. See the guide's migration page (`docs::migration`).
//!
//! Every cell is copied with a plain write stamped with the old cell's own write time and carrying
//! its remaining TTL, so a run can be repeated or resumed at any point: it writes the same cells at
//! the same timestamps, and whatever was written to the new table later wins over them. The old
//! table is only read.
//!
//! By responsibility: `plan.rs` decides what to write for one old partition (pure), `rerun.rs`
//! what to do with a cluster the target already holds cells of (pure), `source.rs` reads the old
//! table, `copy.rs` sets up, reads and writes the target; this file holds the public types and
//! the run's order.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tracing::{Span, info, instrument, warn};

use super::options::validate_identifier;
use super::statements::qualified;
use super::{CassandraMembershipTable, Pk};
use crate::error::{MembershipError, Result};
use crate::model::{TableVersion, Timestamp};

mod copy;
mod plan;
mod rerun;
mod source;

use plan::{CopyWrite, plan_cluster};

/// How long a cluster must have been quiet (no heartbeat, no membership write) before it is
/// copied: 2 minutes. Migration is offline, and a silo that stopped writing may still serve until
/// it fences (63 s after its last successful heartbeat with the defaults) and counts as alive to
/// the others until the detection horizon (90 s): a window shorter than these would take a silo
/// that is still serving for a stopped one.
pub const DEFAULT_MIGRATION_QUIET_FOR: Duration = Duration::from_secs(120);

/// What [`CassandraMembershipTable::migrate_to`] copies, and how carefully.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct MigrationPlan {
    /// The table to copy into, in the same keyspace; created with the source table's options
    /// (TTL, `gc_grace`) when missing. Must differ from the source.
    pub to_table: String,
    /// A cluster any of whose entries heartbeated or was written within this window is refused
    /// (its silos still run). Default [`DEFAULT_MIGRATION_QUIET_FOR`].
    pub quiet_for: Duration,
    /// Copy clusters that are not quiet too.
    pub force: bool,
    /// Read, check and report what would be copied; write (and create) nothing.
    pub dry_run: bool,
    /// Only the clusters of this service.
    pub service_id: Option<String>,
    /// Only the clusters with this id.
    pub cluster_id: Option<String>,
}

impl MigrationPlan {
    /// Every cluster of the source into `to_table`, refusing clusters active within
    /// [`DEFAULT_MIGRATION_QUIET_FOR`].
    pub fn new(to_table: impl Into<String>) -> Self {
        MigrationPlan {
            to_table: to_table.into(),
            quiet_for: DEFAULT_MIGRATION_QUIET_FOR,
            force: false,
            dry_run: false,
            service_id: None,
            cluster_id: None,
        }
    }

    /// Sets [`Self::quiet_for`].
    pub fn quiet_for(mut self, window: Duration) -> Self {
        self.quiet_for = window;
        self
    }

    /// Sets [`Self::force`].
    pub fn force(mut self, force: bool) -> Self {
        self.force = force;
        self
    }

    /// Sets [`Self::dry_run`].
    pub fn dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }

    /// Restricts the copy to the clusters of one service ([`Self::service_id`]) and / or with one
    /// cluster id ([`Self::cluster_id`]).
    pub fn only(mut self, service_id: Option<String>, cluster_id: Option<String>) -> Self {
        self.service_id = service_id;
        self.cluster_id = cluster_id;
        self
    }
}

/// What a migration did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MigrationReport {
    /// The source, `"keyspace"."table"` (read only, never changed).
    pub source: String,
    /// The target, `"keyspace"."table"`.
    pub target: String,
    /// Nothing was written: a dry run.
    pub dry_run: bool,
    /// Nothing was written: a cluster was active within the quiet window and `force` was not
    /// set (see each cluster's [`ClusterMigration::recent_activity`]).
    pub refused: bool,
    /// Each cluster, in the order the source listed them (token order).
    pub clusters: Vec<ClusterMigration>,
}

impl MigrationReport {
    /// True when every cluster was copied and read back equal, or was not copied again because
    /// its silos already wrote on the target ([`Verification::TargetMovedOn`]). False for a
    /// dry run, a refused run, a mismatch, and a source that changed since an earlier copy
    /// ([`Verification::SourceChanged`]).
    pub fn all_verified(&self) -> bool {
        self.clusters.iter().all(|c| {
            matches!(
                c.verification,
                Verification::Verified | Verification::TargetMovedOn
            )
        })
    }
}

/// One cluster of a migration.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClusterMigration {
    /// The service id.
    pub service_id: String,
    /// The cluster id.
    pub cluster_id: String,
    /// Entries written (or, in a dry run, to write); 0 for a refused run and for a cluster left
    /// as the target holds it ([`Verification::TargetMovedOn`], [`Verification::SourceChanged`]).
    /// A dry run does not read the target: its count is what the source holds to copy, even for
    /// a cluster the real run would then leave as the target holds it.
    pub entries_copied: usize,
    /// Heartbeat cells written (or to write); 0 for a cluster left as it is, like
    /// `entries_copied`.
    pub heartbeats_copied: usize,
    /// The table version copied, if the cluster had one.
    pub version: Option<u64>,
    /// Entries the target already held as copied, before this run: a resumed or repeated run.
    pub already_present: usize,
    /// Rows and cells not copied, and why (damaged, expired during the migration, a heartbeat
    /// without its entry).
    pub skipped: Vec<SkippedCell>,
    /// The newest sign of life in the cluster (an I-am-alive time or a write time), with the
    /// silo it came from (`None`: the version's write).
    pub last_activity: Option<(Timestamp, Option<String>)>,
    /// The cluster was active within the quiet window: with `force`, it was copied anyway.
    pub recent_activity: bool,
    /// Heartbeat cells were dated by their own I-am-alive time (a server that cannot report a
    /// map element's write time, Cassandra before 5.0).
    pub heartbeats_dated_by_value: bool,
    /// The read-back of the copy.
    pub verification: Verification,
}

impl ClusterMigration {
    /// The run wrote nothing of this cluster: it counts nothing as copied.
    pub(crate) fn nothing_written(&mut self) {
        self.entries_copied = 0;
        self.heartbeats_copied = 0;
    }

    /// The target already held part of this cluster (a repeated or resumed run).
    pub fn resumed(&self) -> bool {
        self.already_present > 0
    }
}

/// A row or cell a migration did not copy.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SkippedCell {
    /// The row's key (`None`: the version).
    pub silo: Option<String>,
    /// Why.
    pub reason: String,
}

/// How the copy of a cluster read back from the target table.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verification {
    /// Not read back (a dry run, a refused migration).
    NotRun,
    /// The provider's read of the target returned exactly the entries and version copied.
    Verified,
    /// It did not: what differs (or why the read failed).
    Mismatch(String),
    /// Not copied again: the target holds a cell written later than every cell of the source,
    /// so its silos wrote there after an earlier copy, and a copy could bring back what they
    /// removed. The migration of this cluster is done.
    TargetMovedOn,
    /// Not copied, **not verified**: the target holds a copy of the source as it was at an
    /// earlier run (another version, or none), and the source has changed since (its silos ran
    /// on it again, its version expired). Writing over that copy cannot take back what was
    /// removed since, so it is left as it is: copy into a new table. The reason, for the
    /// operator.
    SourceChanged(String),
}

impl CassandraMembershipTable {
    /// Copies this table, of the 0.2 shape, into `plan.to_table` (the current shape, created
    /// with these options but for its name), cluster by cluster, and reads every copied cluster
    /// back through the provider to verify it. Offline: the clusters' silos must be stopped (a
    /// cluster active within `plan.quiet_for` refuses the whole run, writing nothing, unless
    /// `plan.force`). Idempotent and resumable: a cluster the target already holds is copied
    /// again only when the target holds the source's current version and nothing newer than the
    /// source (see [`Verification`] and the guide's migration page). This table is never
    /// written.
    ///
    /// Errors: [`MembershipError::SchemaMismatch`] when this table is not of the 0.2 shape (or
    /// missing), [`MembershipError::TableNeedsMigration`] when the target is, an
    /// [`MembershipError::InvalidConfiguration`] for a bad target name; storage errors as every
    /// operation, including the read of what the target holds of a cluster (the run stops there
    /// rather than copy without knowing). A failure part-way leaves a partial copy that a new
    /// run completes, as long as the source does not change meanwhile.
    #[instrument(level = "info", skip(self, plan), fields(source = %self.shared.qualified, target = %plan.to_table, dry_run = plan.dry_run, clusters))]
    pub async fn migrate_to(&self, plan: &MigrationPlan) -> Result<MigrationReport> {
        let o = self.options();
        validate_identifier("to_table", &plan.to_table)?;
        if plan.to_table == o.table {
            return Err(MembershipError::config(
                "to_table",
                "the target must be another table than the source (the shapes cannot be mixed)",
            ));
        }
        self.check_old_shape().await?;
        let target_name = qualified(&o.keyspace, &plan.to_table);
        let source = self.prepare_source().await?;
        let mut clusters = self.list_old_clusters(&source).await?;
        clusters.retain(|(s, c)| {
            plan.service_id.as_ref().is_none_or(|x| x == s)
                && plan.cluster_id.as_ref().is_none_or(|x| x == c)
        });
        Span::current().record("clusters", clusters.len());
        // Every cluster is read and checked before anything is written: a refusal changes nothing.
        let started = Instant::now();
        let mut reads = Vec::new();
        for (service_id, cluster_id) in clusters {
            let pk = Pk {
                service_id: &service_id,
                cluster_id: &cluster_id,
            };
            let old = self.read_old_partition(&source, pk).await?;
            reads.push((service_id, cluster_id, old, Instant::now()));
        }
        info!(
            clusters = reads.len(),
            rows = reads.iter().map(|r| r.2.rows.len()).sum::<usize>(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "source read"
        );
        let now = Timestamp::now();
        let mut report = MigrationReport {
            source: self.shared.qualified.clone(),
            target: target_name.clone(),
            dry_run: plan.dry_run,
            refused: false,
            clusters: Vec::new(),
        };
        let mut copies = Vec::new();
        for (service_id, cluster_id, old, read_at) in reads {
            let copy = plan_cluster(&old, read_at.elapsed());
            let recent = copy
                .last_activity
                .as_ref()
                .is_some_and(|(t, _)| now.duration_since(*t) < plan.quiet_for);
            // A cell stamped in the future (a coordinator's clock was ahead when it was written)
            // would outvote the new table's Paxos ballots, which start from the wall clock: every
            // conditional write on it would answer applied and lose. Never copied, even forced.
            let now_micros = now.as_millis().saturating_mul(1000);
            let future = copy.latest_write_micros().is_some_and(|w| w > now_micros);
            if future {
                warn!(service = %service_id, cluster = %cluster_id,
                    "a cell of this cluster is stamped in the future: it cannot be copied (not even with force) until the clock passes it");
            }
            report.refused |= future || (recent && !plan.force);
            report.clusters.push(ClusterMigration {
                service_id,
                cluster_id,
                entries_copied: copy.count(|w| matches!(w, CopyWrite::Entry { .. })),
                heartbeats_copied: copy.count(|w| matches!(w, CopyWrite::Heartbeat { .. })),
                version: (copy.expected.version != TableVersion::absent())
                    .then_some(copy.expected.version.version),
                already_present: 0,
                skipped: copy.skipped.clone(),
                last_activity: copy.last_activity.clone(),
                recent_activity: recent || future,
                heartbeats_dated_by_value: old.heartbeats_dated_by_value,
                verification: Verification::NotRun,
            });
            copies.push((old, read_at));
        }
        if report.refused || plan.dry_run {
            if report.refused {
                warn!("a cluster was active within the quiet window: nothing copied");
                if !plan.dry_run {
                    report
                        .clusters
                        .iter_mut()
                        .for_each(ClusterMigration::nothing_written);
                }
            }
            return Ok(report);
        }
        let mut target_options = o.clone().table(plan.to_table.clone());
        // An operator's tool never creates a keyspace.
        target_options.create_keyspace_with_replication = None;
        let target = Self::on_session(
            self.session().clone(),
            target_options,
            self.shared.host_session,
        )?;
        // Creates the table (with the options' TTL and gc_grace) and checks its shape; no TTL
        // policy is applied: a copy's TTLs are the source's by design.
        target.set_up_copy_target().await?;
        info!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            "target table ready"
        );
        let writes = self.prepare_target(&target_name).await?;
        let mut targets: BTreeMap<String, CassandraMembershipTable> = BTreeMap::new();
        for (cluster, (old, read_at)) in report.clusters.iter_mut().zip(copies) {
            let service = match targets.get(&cluster.service_id) {
                Some(t) => t,
                None => {
                    let options = target
                        .options()
                        .clone()
                        .service_id(cluster.service_id.clone());
                    let t = Self::on_session(
                        self.session().clone(),
                        options,
                        self.shared.host_session,
                    )?;
                    targets.entry(cluster.service_id.clone()).or_insert(t)
                }
            };
            let table = service.for_cluster(cluster.cluster_id.clone())?;
            // Planned again now: the TTLs copied are what is left of them at this moment, not at
            // the check above (the target's creation and earlier clusters took time).
            let copy = plan_cluster(&old, read_at.elapsed());
            cluster.entries_copied = copy.count(|w| matches!(w, CopyWrite::Entry { .. }));
            cluster.heartbeats_copied = copy.count(|w| matches!(w, CopyWrite::Heartbeat { .. }));
            cluster.skipped = copy.skipped.clone();
            self.copy_cluster(&writes, &table, cluster, &copy).await?;
        }
        Ok(report)
    }
}

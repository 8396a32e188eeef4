//! `migrate`: the offline copy of a table of the 0.2 shape into a new table of the current
//! shape (the library's `migrate_to`). Refuses a cluster whose silos still run (exit 3, nothing
//! written); a copy that does not read back equal, or a target holding a copy of a source that has
//! changed since, is exit 1. The source is never changed.

use std::time::{Duration, Instant};

use cassandra_membership::cassandra::{
    ClusterMigration, MigrationPlan, MigrationReport, Verification,
};
use cassandra_membership::{CassandraMembershipTable, Timestamp};
use comfy_table::{Table, presets};
use serde::Serialize;

use crate::config::CliError;
use crate::print;

#[derive(Serialize)]
struct MigrateReport {
    source: String,
    target: String,
    dry_run: bool,
    /// A cluster was active within the quiet window and --force was not given: nothing written.
    refused: bool,
    quiet_for_seconds: u64,
    elapsed_ms: u64,
    clusters: Vec<ClusterReport>,
}

#[derive(Serialize)]
struct ClusterReport {
    service_id: String,
    cluster_id: String,
    entries_copied: usize,
    heartbeats_copied: usize,
    version: Option<u64>,
    /// Entries the target already held as copied: a repeated or resumed run.
    already_present: usize,
    resumed: bool,
    /// RFC 3339, the newest I-am-alive or write time of the cluster.
    last_activity: Option<String>,
    last_activity_silo: Option<String>,
    recent_activity: bool,
    heartbeats_dated_by_value: bool,
    /// `verified`, `target_moved_on`, `source_changed`, `mismatch` or `not_run`.
    verification: &'static str,
    /// Why a cluster is not verified (`mismatch`, `source_changed`).
    reason: Option<String>,
    skipped: Vec<SkippedReport>,
}

#[derive(Serialize)]
struct SkippedReport {
    silo: Option<String>,
    reason: String,
}

impl ClusterReport {
    fn new(c: &ClusterMigration) -> Self {
        let (verification, reason) = match &c.verification {
            Verification::Verified => ("verified", None),
            Verification::Mismatch(m) => ("mismatch", Some(m.clone())),
            Verification::TargetMovedOn => ("target_moved_on", None),
            Verification::SourceChanged(why) => ("source_changed", Some(why.clone())),
            _ => ("not_run", None),
        };
        ClusterReport {
            service_id: c.service_id.clone(),
            cluster_id: c.cluster_id.clone(),
            entries_copied: c.entries_copied,
            heartbeats_copied: c.heartbeats_copied,
            version: c.version,
            already_present: c.already_present,
            resumed: c.resumed(),
            last_activity: c.last_activity.as_ref().map(|(t, _)| t.to_string()),
            last_activity_silo: c.last_activity.as_ref().and_then(|(_, s)| s.clone()),
            recent_activity: c.recent_activity,
            heartbeats_dated_by_value: c.heartbeats_dated_by_value,
            verification,
            reason,
            skipped: c
                .skipped
                .iter()
                .map(|s| SkippedReport {
                    silo: s.silo.clone(),
                    reason: s.reason.clone(),
                })
                .collect(),
        }
    }
}

pub(crate) async fn migrate(
    table: &CassandraMembershipTable,
    plan: MigrationPlan,
    json: bool,
) -> Result<(), CliError> {
    let started = Instant::now();
    let report = table.migrate_to(&plan).await?;
    let r = MigrateReport {
        source: report.source.clone(),
        target: report.target.clone(),
        dry_run: report.dry_run,
        refused: report.refused,
        quiet_for_seconds: plan.quiet_for.as_secs(),
        elapsed_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        clusters: report.clusters.iter().map(ClusterReport::new).collect(),
    };
    print(json, &r, || text(&r, &report, plan.quiet_for))?;
    if report.refused {
        let busy: Vec<String> = report
            .clusters
            .iter()
            .filter(|c| c.recent_activity)
            .map(|c| format!("{}/{}", c.service_id, c.cluster_id))
            .collect();
        return Err(CliError::Refused(format!(
            "refusing to migrate: {} was active within the last {} (its silos must be stopped; \
             --force copies it anyway); nothing was written",
            busy.join(", "),
            humantime::format_duration(plan.quiet_for)
        )));
    }
    let named = |f: fn(&Verification) -> bool| -> Vec<String> {
        report
            .clusters
            .iter()
            .filter(|c| f(&c.verification))
            .map(|c| format!("{}/{}", c.service_id, c.cluster_id))
            .collect()
    };
    let changed = named(|v| matches!(v, Verification::SourceChanged(_)));
    let failed = named(|v| matches!(v, Verification::Mismatch(_)));
    let mut problems = Vec::new();
    if !changed.is_empty() {
        problems.push(format!(
            "{} cluster(s) changed on the source since an earlier copy into {}: {}; the stale \
             copy there was left as it is (a copy cannot take back what was removed since): \
             migrate into a new table",
            changed.len(),
            report.target,
            changed.join(", ")
        ));
    }
    if !failed.is_empty() {
        problems.push(format!(
            "{} cluster(s) did not read back as copied: {}; the source is unchanged, run migrate \
             again",
            failed.len(),
            failed.join(", ")
        ));
    }
    if !problems.is_empty() {
        return Err(CliError::Failed(format!(
            "{} (see above)",
            problems.join("; ")
        )));
    }
    Ok(())
}

fn text(r: &MigrateReport, report: &MigrationReport, quiet_for: Duration) -> String {
    let mut out = format!(
        "{} {} -> {}{}\n",
        if r.dry_run {
            "would migrate"
        } else {
            "migrate"
        },
        r.source,
        r.target,
        if r.refused {
            " (refused: nothing written)"
        } else {
            ""
        }
    );
    if r.clusters.is_empty() {
        out.push_str("no clusters in the source table\n");
        return out;
    }
    let mut t = Table::new();
    t.load_preset(presets::NOTHING);
    t.set_header([
        "SERVICE",
        "CLUSTER",
        "ENTRIES",
        "HEARTBEATS",
        "VERSION",
        "LAST ACTIVITY",
        "RESULT",
    ]);
    let now = Timestamp::now();
    for (c, lib) in r.clusters.iter().zip(&report.clusters) {
        let activity = match &lib.last_activity {
            Some((at, _)) => {
                let age = humantime::format_duration(Duration::from_secs(
                    now.duration_since(*at).as_secs(),
                ));
                if c.recent_activity {
                    format!("{age} ago (< {})", humantime::format_duration(quiet_for))
                } else {
                    format!("{age} ago")
                }
            }
            None => "-".into(),
        };
        let result = match (c.verification, c.resumed) {
            ("verified", true) => {
                format!("verified (resumed: {} already there)", c.already_present)
            }
            ("verified", false) => "verified".into(),
            ("mismatch", _) => format!("MISMATCH: {}", c.reason.as_deref().unwrap_or("")),
            ("source_changed", _) => format!(
                "SOURCE CHANGED since an earlier copy, not copied: {}",
                c.reason.as_deref().unwrap_or("")
            ),
            ("target_moved_on", _) => "target moved on (its silos wrote there): not copied".into(),
            _ if r.refused && c.recent_activity => "refused: active".into(),
            _ if r.dry_run && !r.refused => "would copy".into(),
            _ => "not copied".into(),
        };
        t.add_row([
            c.service_id.clone(),
            c.cluster_id.clone(),
            c.entries_copied.to_string(),
            c.heartbeats_copied.to_string(),
            c.version.map_or("-".into(), |v| v.to_string()),
            activity,
            result,
        ]);
    }
    let lines: Vec<String> = t.lines().map(|l| l.trim_end().to_owned()).collect();
    out.push_str(&lines.join("\n"));
    out.push('\n');
    for c in &r.clusters {
        for s in &c.skipped {
            out.push_str(&format!(
                "skipped {}/{} {}: {}\n",
                c.service_id,
                c.cluster_id,
                s.silo.as_deref().unwrap_or("(version)"),
                s.reason
            ));
        }
        if c.heartbeats_dated_by_value {
            out.push_str(&format!(
                "{}/{}: heartbeats dated by their I-am-alive time (the server reports no write time of a map element)\n",
                c.service_id, c.cluster_id
            ));
        }
    }
    if !r.dry_run && !r.refused {
        out.push_str(&format!(
            "done in {:.1}s; {} was not changed: check the new table, configure table = {:?} \
             for the silos, and drop the old table once they run on it\n",
            r.elapsed_ms as f64 / 1000.0,
            r.source,
            report
                .target
                .rsplit('.')
                .next()
                .unwrap_or_default()
                .trim_matches('"')
        ));
    }
    out
}

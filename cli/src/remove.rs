//! The commands that change or remove entries: `declare-dead`, `cleanup`, `delete-cluster`.
//! Each says what it will change before changing it, and refuses without `--yes` (exit 3).

use std::time::Duration;

use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, MembershipEntry, MembershipError,
    MembershipTable, SiloAddress, SiloStatus, Timestamp,
};
use comfy_table::{Table, presets};
use serde::Serialize;

use crate::config::CliError;
use crate::print;
use crate::report::status_name;

/// The shortest `cleanup --older-than` without `--force`.
pub(crate) const CLEANUP_FLOOR: Duration = Duration::from_secs(3600);

/// How many times `declare-dead` reads and writes again when a silo changed the table between
/// its read and its write (each conditional write loses to any other write of the cluster).
const DECLARE_DEAD_ATTEMPTS: u32 = 5;

/// The error of a command naming a cluster that has neither a version nor entries.
pub(crate) fn no_such_cluster(table: &CassandraMembershipTable, cluster: &str) -> CliError {
    CliError::Failed(format!(
        "no such cluster: service {} has no cluster {cluster} in {}",
        table.options().service_id,
        table.qualified_table()
    ))
}

fn entries(n: usize) -> String {
    format!("{n} entr{}", if n == 1 { "y" } else { "ies" })
}

#[derive(Serialize)]
struct DeclareDeadReport {
    service_id: String,
    cluster_id: String,
    silo: String,
    /// The status found before (e.g. `active`).
    previous_status: &'static str,
    silo_name: String,
    host_name: String,
    /// The table version read before the write.
    version_read: u64,
    /// The table version the write created; `null` when nothing was written.
    version_written: Option<u64>,
    /// How many versioned writes were tried (0: nothing written).
    attempts: u32,
    /// Whether the entry is Dead now because of this command (false: it already was, or
    /// --yes was missing).
    declared: bool,
}

/// `declare-dead`: the entry's status becomes Dead in one versioned write (the row's tag and
/// the table version read), as a silo's failure detector writes it.
pub(crate) async fn declare_dead(
    table: &CassandraMembershipTable,
    silo: &str,
    yes: bool,
    json: bool,
) -> Result<(), CliError> {
    let address: SiloAddress = silo.parse()?;
    let started = std::time::Instant::now();
    let mut attempts = 0;
    loop {
        let snapshot = table.read_row(&address).await?;
        let Some(row) = snapshot
            .rows
            .into_iter()
            .find(|r| r.entry.address == address)
        else {
            let all = table.read_all().await?;
            if all.version.etag.is_absent() && all.rows.is_empty() {
                return Err(no_such_cluster(table, table.cluster_id()));
            }
            return Err(CliError::Failed(format!(
                "no such silo: {address} is not in service {} cluster {} ({}; `members` lists them)",
                table.options().service_id,
                table.cluster_id(),
                entries(all.rows.len())
            )));
        };
        let mut r = DeclareDeadReport {
            service_id: table.options().service_id.clone(),
            cluster_id: table.cluster_id().to_owned(),
            silo: address.to_string(),
            previous_status: status_name(row.entry.status),
            silo_name: row.entry.silo_name.clone(),
            host_name: row.entry.host_name.clone(),
            version_read: snapshot.version.version,
            version_written: None,
            attempts,
            declared: false,
        };
        if row.entry.status == SiloStatus::Dead {
            return print(json, &r, || {
                format!(
                    "{address} ({}) is already dead in service {} cluster {}; nothing written",
                    r.silo_name, r.service_id, r.cluster_id
                )
            });
        }
        if !yes {
            // Say what would change before anything changes (under --json the stdout document
            // says it: stderr holds JSON lines only).
            if !json {
                eprintln!(
                    "declare-dead: {address} (silo {}, host {}) is {} in service {} cluster {}, \
                     last I-am-alive {}; with --yes its status becomes dead",
                    r.silo_name,
                    r.host_name,
                    r.previous_status,
                    r.service_id,
                    r.cluster_id,
                    row.entry.i_am_alive_time
                );
            }
            print(json, &r, || "nothing written".into())?;
            return Err(CliError::Refused(format!(
                "refusing to declare {address} dead without --yes"
            )));
        }
        if attempts >= DECLARE_DEAD_ATTEMPTS {
            return Err(CliError::Membership(MembershipError::Contention {
                operation: "declare-dead",
                attempts,
                elapsed: started.elapsed(),
            }));
        }
        attempts += 1;
        let mut dead: MembershipEntry = row.entry.clone();
        dead.status = SiloStatus::Dead;
        let next = snapshot.version.next();
        // `false`: the row or the version moved since the read (a silo wrote): read again.
        if table.update_row(&dead, &row.etag, &next).await? {
            r.version_written = Some(next.version);
            r.attempts = attempts;
            r.declared = true;
            return print(json, &r, || {
                format!(
                    "declared {address} (silo {}) dead in service {} cluster {}: it was {}; \
                     table version {} -> {} ({} attempt{})",
                    r.silo_name,
                    r.service_id,
                    r.cluster_id,
                    r.previous_status,
                    r.version_read,
                    next.version,
                    attempts,
                    if attempts == 1 { "" } else { "s" }
                )
            });
        }
        tracing::info!(%address, attempts, "the table changed since it was read; reading again");
    }
}

/// A versioned write (`declare-dead`) carries the configured expiry on the entry and on the
/// table version: with `ttl` off (the library's default) it writes them `USING TTL 0`, with it
/// on it gives them the configured TTL. Written with expiry other than the cluster's, the Dead
/// entry and the partition would never expire (or expire on another schedule) and the
/// cluster's silos would fail `TtlMismatch` at their next start.
///
/// So when `ttl` was not set (no `--ttl`, no `ttl` in the file) the command adopts the table's:
/// `default_time_to_live` > 0 means expiry on with that TTL as `defunct_silo_expiration` (the
/// table is created with exactly that) — `Some(options)` to reconnect with. When `ttl` was set
/// the cluster must agree with it as a starting silo's audit sees it (a version without TTL
/// alone is what a silo repairs itself), or the command is a usage error (exit 2) saying what
/// to pass. (`cleanup` and `delete-cluster` only delete; `patch` needs an explicit `ttl`
/// because changing the table to it is its purpose.)
/// The options of one write with expiry on: the command never renews, so its write carries the
/// shortest TTL the rules allow (TTL + 1 s renewal + 1 s). The library keeps a row's longer
/// remaining TTL, and the silos accept any TTL up to TTL + 2 × their renewal + 1 s, so the entry
/// lands within what the cluster's silos accept whatever their `ttl_renewal_interval`. The
/// heartbeat period is capped to a quarter of the TTL for the same reason: the CLI does not
/// heartbeat, and a short-TTL cluster's silos configure a shorter one than the default.
fn one_write(mut options: CassandraClusteringOptions) -> CassandraClusteringOptions {
    options.ttl_renewal_interval = Some(Duration::from_secs(1));
    let quarter = options.membership.defunct_silo_expiration / 4;
    let period = &mut options.membership.i_am_alive_table_publish_timeout;
    *period = (*period).min(quarter).max(Duration::from_millis(1));
    options
}

pub(crate) async fn expiry_of_the_cluster(
    table: &CassandraMembershipTable,
    ttl_explicit: bool,
) -> Result<Option<CassandraClusteringOptions>, CliError> {
    let audit = table.audit_ttl().await?;
    let configured = table.options();
    if !ttl_explicit {
        if audit.table_default_ttl == 0 {
            return Ok(None);
        }
        let mut adopted = configured.clone();
        adopted.ttl = true;
        adopted.membership.defunct_silo_expiration = Duration::from_secs(audit.table_default_ttl);
        tracing::info!(
            ttl_seconds = audit.table_default_ttl,
            "ttl not set: writing with the table's default_time_to_live"
        );
        return Ok(Some(one_write(adopted)));
    }
    if audit.agrees() || audit.only_the_version_disagrees() {
        return Ok(configured.ttl.then(|| one_write(configured.clone())));
    }
    let what = |ttl: u64| {
        if ttl == 0 {
            "no expiry".to_string()
        } else {
            format!("a TTL of {ttl} s")
        }
    };
    let rows = match audit.disagreeing() {
        0 => String::new(),
        n => format!(
            ", {n} of cluster {}'s rows (or its version) disagree",
            configured.cluster_id
        ),
    };
    Err(CliError::Usage(format!(
        "{} has {} (default_time_to_live){rows}, while the configured expiry is {} (ttl = {}, \
         defunct_silo_expiration): this write would leave the entry and the table version \
         expiring other than the cluster's silos expect, and those silos would fail \
         TtlMismatch at their next start; leave ttl unset (no --ttl) to write with the table's \
         TTL, or configure ttl and defunct_silo_expiration as the cluster's silos do",
        audit.table,
        what(audit.table_default_ttl),
        what(audit.configured_ttl),
        configured.ttl,
    )))
}

#[derive(Serialize)]
struct CleanupReport {
    service_id: String,
    cluster_id: String,
    older_than_seconds: u64,
    cutoff: String,
    /// Only listed, nothing removed (`--dry-run`, or `--yes` missing).
    dry_run: bool,
    /// The entries the rule selects (for a real run: those found before removing).
    candidates: Vec<CandidateReport>,
    /// How many entries were removed; `null` when nothing was tried.
    removed: Option<usize>,
}

#[derive(Serialize)]
struct CandidateReport {
    address: String,
    status: &'static str,
    silo_name: String,
    /// The latest of I-am-alive, start time and suspicion votes: what the cutoff is compared to.
    last_activity: String,
}

/// The rule of the library's `cleanup_defunct` (src/cassandra/cleanup.rs): not Active, and no
/// activity (I-am-alive, start, a suspicion vote) since the cutoff.
fn removable(entry: &MembershipEntry, cutoff: Timestamp) -> bool {
    entry.status != SiloStatus::Active && entry.last_activity() < cutoff
}

pub(crate) async fn cleanup(
    table: &CassandraMembershipTable,
    older_than: Duration,
    dry_run: bool,
    yes: bool,
    json: bool,
) -> Result<(), CliError> {
    let cutoff = Timestamp::now().saturating_sub(older_than);
    let inspection = table.inspect().await?;
    let candidates: Vec<CandidateReport> = inspection
        .entries
        .iter()
        .map(|e| &e.entry)
        .filter(|e| removable(e, cutoff))
        .map(|e| CandidateReport {
            address: e.address.to_string(),
            status: status_name(e.status),
            silo_name: e.silo_name.clone(),
            last_activity: e.last_activity().to_string(),
        })
        .collect();
    let mut r = CleanupReport {
        service_id: table.options().service_id.clone(),
        cluster_id: table.cluster_id().to_owned(),
        older_than_seconds: older_than.as_secs(),
        cutoff: cutoff.to_string(),
        dry_run: dry_run || !yes,
        candidates,
        removed: None,
    };
    if dry_run || !yes {
        print(json, &r, || {
            format!(
                "would remove {} of service {} cluster {} (not Active, no activity since {}){}",
                entries(r.candidates.len()),
                r.service_id,
                r.cluster_id,
                r.cutoff,
                candidates_table(&r.candidates)
            )
        })?;
        if dry_run {
            return Ok(());
        }
        return Err(CliError::Refused(format!(
            "refusing to remove {} without --yes (--dry-run lists them only)",
            entries(r.candidates.len())
        )));
    }
    let removed = table.cleanup_defunct(cutoff).await?;
    r.removed = Some(removed);
    print(json, &r, || {
        format!(
            "removed {} defunct {} of service {} cluster {} (not Active, no activity since {}){}",
            removed,
            if removed == 1 { "entry" } else { "entries" },
            r.service_id,
            r.cluster_id,
            r.cutoff,
            candidates_table(&r.candidates)
        )
    })
}

fn candidates_table(c: &[CandidateReport]) -> String {
    if c.is_empty() {
        return String::new();
    }
    let mut t = Table::new();
    t.load_preset(presets::NOTHING);
    t.set_header(["ADDRESS", "STATUS", "SILO", "LAST ACTIVITY"]);
    for e in c {
        t.add_row([
            e.address.clone(),
            e.status.to_owned(),
            e.silo_name.clone(),
            e.last_activity.clone(),
        ]);
    }
    let lines: Vec<String> = t.lines().map(|l| l.trim_end().to_owned()).collect();
    format!(":\n{}", lines.join("\n"))
}

#[derive(Serialize)]
struct DeleteReport {
    service_id: String,
    cluster_id: String,
    version: Option<u64>,
    /// `null` when the cluster could not be read (past the tombstone cliff): live silos may remain.
    entries: Option<usize>,
    /// Why the cluster could not be inspected before deleting (a damaged version), if so.
    damaged: Option<String>,
    deleted: bool,
}

pub(crate) async fn delete_cluster(
    table: &CassandraMembershipTable,
    target: &str,
    yes: bool,
    json: bool,
) -> Result<(), CliError> {
    let service = table.options().service_id.clone();
    let (version, entries, damaged) = match table.inspect_cluster(&service, target).await {
        Ok(c) => (
            (!c.version.etag.is_absent()).then_some(c.version.version),
            Some(c.entries.len() + c.unreadable.len()),
            None,
        ),
        // A damaged version cannot be inspected, yet delete_cluster removes it: say so, go on.
        Err(e @ MembershipError::CorruptData { .. }) => (None, Some(0), Some(e.to_string())),
        // Nor can a partition past the tombstone cliff, which delete_cluster shadows whole: what
        // it holds is unknown (silos may still be live in it).
        Err(MembershipError::TooManyTombstones { .. }) => (
            None,
            None,
            Some("more tombstones than a read may scan: it could not be read, live silos may remain; the partition is deleted whole".into()),
        ),
        Err(e) => return Err(e.into()),
    };
    if version.is_none() && entries == Some(0) && damaged.is_none() {
        return Err(no_such_cluster(table, target));
    }
    let mut r = DeleteReport {
        service_id: service.clone(),
        cluster_id: target.to_owned(),
        version,
        entries,
        damaged,
        deleted: false,
    };
    // Say what will go before anything goes (under --json the stdout document says it).
    if !json {
        eprintln!(
            "delete-cluster: service {service} cluster {target}: {} and the table version ({}) of {}",
            r.entries.map_or("unknown entries".into(), self::entries),
            match (&r.damaged, r.version) {
                (Some(why), _) => format!("damaged: {why}"),
                (None, Some(v)) => format!("version {v}"),
                (None, None) => "none".into(),
            },
            table.qualified_table(),
        );
    }
    if !yes {
        print(json, &r, || "nothing deleted".into())?;
        return Err(CliError::Refused(format!(
            "refusing to delete cluster {target} without --yes"
        )));
    }
    table.delete_cluster(target).await?;
    r.deleted = true;
    print(json, &r, || {
        format!("deleted service {service} cluster {target}")
    })
}

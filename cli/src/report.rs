//! What each command reports, as serializable types with stable field names (the `--json`
//! output) and as tables for people. Times are RFC 3339 UTC; durations are whole seconds in
//! JSON and human-readable ("6d 23h 59m") in tables.

use std::time::Duration;

use cassandra_membership::cassandra::{ClusterInspection, EntryInspection, PatchAction, TtlAudit};
use cassandra_membership::{MembershipOptions, SiloStatus, Timestamp};
use comfy_table::{Table, presets};
use serde::Serialize;

/// The version of the `--json` documents' shape: raised when a field changes meaning or goes
/// away (adding a field keeps it).
pub(crate) const JSON_SCHEMA: u32 = 1;

/// Every `--json` document: an object with the schema version and the command's fields.
#[derive(Debug, Serialize)]
pub(crate) struct Document<'a, T: Serialize> {
    schema: u32,
    #[serde(flatten)]
    body: &'a T,
}

impl<'a, T: Serialize> Document<'a, T> {
    pub(crate) fn new(body: &'a T) -> Self {
        Document {
            schema: JSON_SCHEMA,
            body,
        }
    }
}

/// `clusters`: every cluster of the table.
#[derive(Debug, Serialize)]
pub(crate) struct ClustersReport {
    pub(crate) clusters: Vec<ClusterReport>,
}

/// The stable name of a status in JSON and tables.
pub(crate) fn status_name(s: SiloStatus) -> &'static str {
    match s {
        SiloStatus::None => "none",
        SiloStatus::Created => "created",
        SiloStatus::Joining => "joining",
        SiloStatus::Active => "active",
        SiloStatus::ShuttingDown => "shutting_down",
        SiloStatus::Stopping => "stopping",
        SiloStatus::Dead => "dead",
    }
}

/// `clusters`: one cluster of the table.
#[derive(Debug, Serialize)]
pub(crate) struct ClusterReport {
    pub(crate) service_id: String,
    pub(crate) cluster_id: String,
    /// `null` when the cluster has no version (or could not be read).
    pub(crate) version: Option<u64>,
    pub(crate) entries: usize,
    /// Every status, zero included, so the keys never change.
    pub(crate) entries_by_status: std::collections::BTreeMap<&'static str, usize>,
    pub(crate) unreadable_entries: usize,
    pub(crate) newest_i_am_alive: Option<String>,
    /// `null`: the version never expires — when `version` is not `null`; with `version` `null`
    /// there is no version to expire (read `version` first).
    pub(crate) version_ttl_seconds: Option<u32>,
    pub(crate) version_expires_at: Option<String>,
    /// The tombstones one statement of the read scanned, as the node reported it; `null` below
    /// its `tombstone_warn_threshold` (1,000 by default). Past `tombstone_failure_threshold`
    /// (100,000) reads of the cluster fail: see `error`.
    pub(crate) tombstones_scanned: Option<u64>,
    /// Why the cluster could not be read (e.g. a damaged version); `null` otherwise.
    pub(crate) error: Option<String>,
}

impl ClusterReport {
    pub(crate) fn from_inspection(c: &ClusterInspection) -> Self {
        ClusterReport {
            service_id: c.service_id.clone(),
            cluster_id: c.cluster_id.clone(),
            version: (!c.version.etag.is_absent()).then_some(c.version.version),
            entries: c.entries.len(),
            entries_by_status: SiloStatus::ALL
                .into_iter()
                .map(|s| (status_name(s), c.count(s)))
                .collect(),
            unreadable_entries: c.unreadable.len(),
            newest_i_am_alive: c.newest_i_am_alive().map(|t| t.to_string()),
            version_ttl_seconds: c.version_ttl_seconds,
            version_expires_at: c.version_expires_at().map(|t| t.to_string()),
            tombstones_scanned: c.tombstones_scanned,
            error: None,
        }
    }

    pub(crate) fn failed(service_id: String, cluster_id: String, error: String) -> Self {
        ClusterReport {
            service_id,
            cluster_id,
            version: None,
            entries: 0,
            entries_by_status: SiloStatus::ALL
                .into_iter()
                .map(|s| (status_name(s), 0))
                .collect(),
            unreadable_entries: 0,
            newest_i_am_alive: None,
            version_ttl_seconds: None,
            version_expires_at: None,
            tombstones_scanned: None,
            error: Some(error),
        }
    }
}

/// `members`: one cluster with one line per entry.
#[derive(Debug, Serialize)]
pub(crate) struct MembersReport {
    pub(crate) service_id: String,
    pub(crate) cluster_id: String,
    pub(crate) version: Option<u64>,
    pub(crate) version_ttl_seconds: Option<u32>,
    pub(crate) read_at: String,
    pub(crate) members: Vec<MemberReport>,
    /// Keys of rows that could not be decoded.
    pub(crate) unreadable: Vec<String>,
}

/// One entry.
#[derive(Debug, Serialize)]
pub(crate) struct MemberReport {
    pub(crate) address: String,
    pub(crate) status: &'static str,
    pub(crate) silo_name: String,
    pub(crate) host_name: String,
    pub(crate) role: String,
    pub(crate) update_zone: i32,
    pub(crate) fault_zone: i32,
    pub(crate) proxy_port: u16,
    pub(crate) start_time: String,
    pub(crate) i_am_alive: String,
    /// Seconds since the last I-am-alive, on this machine's clock (negative: clock skew).
    pub(crate) i_am_alive_age_seconds: i64,
    pub(crate) suspicions: Vec<SuspicionReport>,
    /// `null`: the entry never expires.
    pub(crate) ttl_seconds: Option<u32>,
    pub(crate) expires_at: Option<String>,
    /// Status Dead.
    pub(crate) dead: bool,
    /// Not Dead, but no I-am-alive for longer than the failure detector allows
    /// (`i_am_alive_table_publish_timeout` × `num_missed_table_i_am_alive_limit`).
    pub(crate) stale: bool,
    /// Has a TTL and nobody renews it (Dead or stale): storage removes it at `expires_at`.
    pub(crate) expiring: bool,
}

/// One suspicion against an entry.
#[derive(Debug, Serialize)]
pub(crate) struct SuspicionReport {
    pub(crate) suspecting_silo: String,
    pub(crate) time: String,
}

fn age_seconds(now: Timestamp, then: Timestamp) -> i64 {
    (now.as_millis().saturating_sub(then.as_millis())).div_euclid(1000)
}

impl MembersReport {
    pub(crate) fn from_inspection(c: &ClusterInspection, membership: &MembershipOptions) -> Self {
        let stale_after = membership
            .i_am_alive_table_publish_timeout
            .saturating_mul(membership.num_missed_table_i_am_alive_limit);
        let member = |e: &EntryInspection| {
            let age = age_seconds(c.read_at, e.entry.i_am_alive_time);
            let dead = e.entry.status == SiloStatus::Dead;
            let stale = !dead
                && u64::try_from(age).unwrap_or(0) > stale_after.as_secs()
                && stale_after > Duration::ZERO;
            MemberReport {
                address: e.entry.address.to_string(),
                status: status_name(e.entry.status),
                silo_name: e.entry.silo_name.clone(),
                host_name: e.entry.host_name.clone(),
                role: e.entry.role_name.clone(),
                update_zone: e.entry.update_zone,
                fault_zone: e.entry.fault_zone,
                proxy_port: e.entry.proxy_port,
                start_time: e.entry.start_time.to_string(),
                i_am_alive: e.entry.i_am_alive_time.to_string(),
                i_am_alive_age_seconds: age,
                suspicions: e
                    .entry
                    .suspect_times
                    .iter()
                    .map(|s| SuspicionReport {
                        suspecting_silo: s.suspecting_silo.to_string(),
                        time: s.time.to_string(),
                    })
                    .collect(),
                ttl_seconds: e.ttl_seconds,
                expires_at: e.expires_at.map(|t| t.to_string()),
                dead,
                stale,
                expiring: e.ttl_seconds.is_some() && (dead || stale),
            }
        };
        MembersReport {
            service_id: c.service_id.clone(),
            cluster_id: c.cluster_id.clone(),
            version: (!c.version.etag.is_absent()).then_some(c.version.version),
            version_ttl_seconds: c.version_ttl_seconds,
            read_at: c.read_at.to_string(),
            members: c.entries.iter().map(member).collect(),
            unreadable: c.unreadable.clone(),
        }
    }
}

/// `audit` (and each half of `patch`): the library's `TtlAudit`.
#[derive(Debug, Serialize)]
pub(crate) struct AuditReport {
    pub(crate) table: String,
    pub(crate) table_default_ttl_seconds: u64,
    pub(crate) configured_ttl_seconds: u64,
    pub(crate) agrees: bool,
    pub(crate) rows_disagreeing: u64,
    pub(crate) rows: Vec<AuditRowReport>,
}

/// One disagreeing row and what `patch` does with it.
#[derive(Debug, Serialize)]
pub(crate) struct AuditRowReport {
    pub(crate) service_id: String,
    pub(crate) cluster_id: String,
    /// `null`: the cluster's version (its static cells).
    pub(crate) silo: Option<String>,
    /// `null`: no TTL.
    pub(crate) current_ttl_seconds: Option<u32>,
    /// `keep`, `rewrite`, `remove` or `unreadable`.
    pub(crate) action: &'static str,
    /// For `rewrite`: the TTL the rewrite carries (0: never expires).
    pub(crate) new_ttl_seconds: Option<u32>,
}

impl AuditReport {
    pub(crate) fn from_audit(a: &TtlAudit) -> Self {
        AuditReport {
            table: a.table.clone(),
            table_default_ttl_seconds: a.table_default_ttl,
            configured_ttl_seconds: a.configured_ttl,
            agrees: a.agrees(),
            rows_disagreeing: a.disagreeing(),
            rows: a
                .rows
                .iter()
                .map(|r| {
                    let (action, new_ttl_seconds) = match r.action {
                        PatchAction::Keep => ("keep", None),
                        PatchAction::Rewrite { ttl_seconds } => ("rewrite", Some(ttl_seconds)),
                        PatchAction::Remove => ("remove", None),
                        PatchAction::Unreadable => ("unreadable", None),
                        PatchAction::KeepWhileLive => ("keep_while_live", None),
                        // A variant added to the library later: shown, never guessed at.
                        _ => ("other", None),
                    };
                    AuditRowReport {
                        service_id: r.service_id.clone(),
                        cluster_id: r.cluster_id.clone(),
                        silo: r.silo.clone(),
                        current_ttl_seconds: r.current_ttl,
                        action,
                        new_ttl_seconds,
                    }
                })
                .collect(),
        }
    }
}

/// The table's text without the padding comfy-table leaves at the end of each line.
fn render(t: &Table) -> String {
    t.lines()
        .map(|l| l.trim_end().to_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

fn table() -> Table {
    let mut t = Table::new();
    // Plain aligned columns (like `kubectl get`): easy to read, grep and paste into tickets.
    t.load_preset(presets::NOTHING);
    t
}

/// A duration in whole seconds, human-readable ("6d 23h 59m 58s").
pub(crate) fn seconds(s: u64) -> String {
    if s == 0 {
        return "0s".into();
    }
    humantime::format_duration(Duration::from_secs(s)).to_string()
}

fn ttl_cell(ttl: Option<u32>, expires_at: Option<&String>) -> String {
    match (ttl, expires_at) {
        (Some(t), Some(at)) => format!("{} (at {at})", seconds(u64::from(t))),
        (Some(t), None) => seconds(u64::from(t)),
        (None, _) => "never expires".into(),
    }
}

fn age_cell(age: i64) -> String {
    if age < 0 {
        format!("in {} (clock skew)", seconds(age.unsigned_abs()))
    } else {
        format!("{} ago", seconds(age as u64))
    }
}

pub(crate) fn clusters_table(clusters: &[ClusterReport]) -> String {
    if clusters.is_empty() {
        return "no clusters in this table".into();
    }
    let mut t = table();
    t.set_header([
        "SERVICE",
        "CLUSTER",
        "VERSION",
        "ENTRIES",
        "NEWEST I-AM-ALIVE",
        "VERSION TTL",
        "TOMBSTONES",
    ]);
    for c in clusters {
        let entries = if let Some(e) = &c.error {
            format!("cannot read: {e}")
        } else {
            let mut parts: Vec<String> = c
                .entries_by_status
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(s, n)| format!("{n} {s}"))
                .collect();
            if c.unreadable_entries > 0 {
                parts.push(format!("{} unreadable", c.unreadable_entries));
            }
            if parts.is_empty() {
                "none".into()
            } else {
                parts.join(", ")
            }
        };
        t.add_row([
            c.service_id.clone(),
            c.cluster_id.clone(),
            c.version.map_or("-".into(), |v| v.to_string()),
            entries,
            c.newest_i_am_alive.clone().unwrap_or_else(|| "-".into()),
            if c.version.is_none() {
                "-".into()
            } else {
                ttl_cell(c.version_ttl_seconds, c.version_expires_at.as_ref())
            },
            // What one read statement scanned; "-" below the node's warning threshold.
            c.tombstones_scanned.map_or("-".into(), |n| n.to_string()),
        ]);
    }
    render(&t)
}

pub(crate) fn members_table(m: &MembersReport) -> String {
    let mut out = format!(
        "service {} cluster {}: version {}, {} entr{}, version {}\n",
        m.service_id,
        m.cluster_id,
        m.version.map_or("none".into(), |v| v.to_string()),
        m.members.len(),
        if m.members.len() == 1 { "y" } else { "ies" },
        match m.version_ttl_seconds {
            Some(t) => format!("expires in {}", seconds(u64::from(t))),
            None => "never expires".into(),
        },
    );
    if m.members.is_empty() {
        out.push_str("no entries\n");
    } else {
        let mut t = table();
        t.set_header([
            "",
            "ADDRESS",
            "STATUS",
            "SILO",
            "ROLE",
            "ZONES",
            "I-AM-ALIVE",
            "SUSPECT",
            "TTL",
        ]);
        for e in &m.members {
            // The mark column: what an operator must notice first.
            let mark = match (e.dead, e.stale, e.expiring) {
                (true, _, true) => "DEAD, EXPIRING",
                (true, _, false) => "DEAD",
                (false, true, true) => "STALE, EXPIRING",
                (false, true, false) => "STALE",
                _ => "",
            };
            t.add_row([
                mark.to_owned(),
                e.address.clone(),
                e.status.to_owned(),
                e.silo_name.clone(),
                e.role.clone(),
                format!("u{} f{}", e.update_zone, e.fault_zone),
                age_cell(e.i_am_alive_age_seconds),
                if e.suspicions.is_empty() {
                    "-".into()
                } else {
                    let by: Vec<&str> = e
                        .suspicions
                        .iter()
                        .map(|s| s.suspecting_silo.as_str())
                        .collect();
                    format!("{} by {}", e.suspicions.len(), by.join(" "))
                },
                ttl_cell(e.ttl_seconds, e.expires_at.as_ref()),
            ]);
        }
        out.push_str(&render(&t));
        out.push('\n');
    }
    for u in &m.unreadable {
        out.push_str(&format!("unreadable row (left alone): {u}\n"));
    }
    out
}

pub(crate) fn audit_text(a: &AuditReport) -> String {
    let mut out = format!(
        "table {}: default_time_to_live {} s, configured TTL {} s{}\n",
        a.table,
        a.table_default_ttl_seconds,
        a.configured_ttl_seconds,
        if a.table_default_ttl_seconds == a.configured_ttl_seconds {
            ""
        } else {
            " (patch would alter the table default)"
        },
    );
    if a.agrees {
        out.push_str(
            "the table and every row agree with the configuration; patch would do nothing\n",
        );
        return out;
    }
    out.push_str(&format!(
        "{} row(s) disagree; what patch would do:\n",
        a.rows_disagreeing
    ));
    if !a.rows.is_empty() {
        let mut t = table();
        t.set_header(["SERVICE", "CLUSTER", "ROW", "CURRENT TTL", "PATCH"]);
        for r in &a.rows {
            t.add_row([
                r.service_id.clone(),
                r.cluster_id.clone(),
                r.silo.clone().unwrap_or_else(|| "(version)".into()),
                r.current_ttl_seconds
                    .map_or("none".into(), |s| seconds(u64::from(s))),
                match (r.action, r.new_ttl_seconds) {
                    ("rewrite", Some(0)) => "rewrite without TTL".into(),
                    ("rewrite", Some(s)) => format!("rewrite, expire in {}", seconds(u64::from(s))),
                    ("remove", _) => "remove (already past the TTL)".into(),
                    ("unreadable", _) => "leave alone (unreadable)".into(),
                    (other, _) => other.to_owned(),
                },
            ]);
        }
        out.push_str(&render(&t));
        out.push('\n');
    }
    out
}

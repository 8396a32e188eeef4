//! Expiry per cluster: the audit of THIS cluster's partition against the configured TTL, the
//! `throw` / `allow` / `patch` policies, and what a table value learns from it (whether the
//! version may carry a TTL, whether storage covers defunct cleanup).
//!
//! Two rules make expiry safe in every configuration, including silos of one cluster running
//! with different settings (a rolling change) or older binaries that never renew anything:
//! - a row is given a TTL only when no running silo can own it any more (Dead, or silent for
//!   longer than the TTL); a row without TTL that may be live stays without TTL — its silo may
//!   run with expiry off and would never renew it. A membership write with expiry on keeps a row
//!   (and the version) without TTL if it has none, and never shortens a TTL (`read_ttls.cql`);
//!   a silo with expiry off takes back a TTL someone gave its own row or the version;
//! - the version carries no TTL while any row of the partition has none (or a longer one than
//!   this configuration renews), and otherwise at least the longest row TTL: the version must
//!   outlive every entry.
//!
//! Other clusters' rows are never read for the verdict and never written.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use scylla::DeserializeRow;
use scylla::response::{PagingState, PagingStateResponse};
use tracing::{info, warn};
use uuid::Uuid;

use super::bind::{
    DeleteEntryValues, DeleteStaticsValues, EntryValues, SiloKey, UpdateEntryValues,
    WriteVersionValues,
};
use super::heartbeats::merge_heartbeat;
use super::options::MAX_TTL_SECONDS;
use super::read::PartitionRead;
use super::statements::alter_table_ttl_cql;
use super::{CassandraMembershipTable, Pk};
use crate::error::{MembershipError, Result};
use crate::model::{SiloStatus, Timestamp};

const PATCH: &str = "initialize (ttl patch)";

/// What `patch` would do (or did) with one row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PatchAction {
    /// The row already agrees with the configuration.
    Keep,
    /// Rewrite the row's cells, unchanged, to expire in this many seconds (0: never). For the
    /// version of a cluster whose rows have no version, write one.
    Rewrite {
        /// The TTL the rewrite carries.
        ttl_seconds: u32,
    },
    /// The row is older than the configured TTL allows: delete it.
    Remove,
    /// The row cannot be decoded (written by hand or another program); it is left alone
    /// (`delete_cluster` removes it).
    Unreadable,
    /// The row carries no TTL (or a longer one) and its silo may still be running — not Dead,
    /// alive within the TTL — possibly with expiry off, never renewing a TTL: giving it one could
    /// expire a live entry. It is left as it is until its silo is Dead or silent for the TTL
    /// (then `patch` at a later start, or defunct cleanup, removes it); meanwhile the version
    /// carries no TTL either.
    KeepWhileLive,
}

/// One row of the audit. `silo` is `None` for the cluster's table version (its static cells).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowAudit {
    /// The row's service id.
    pub service_id: String,
    /// The row's cluster id.
    pub cluster_id: String,
    /// The silo key, or `None` for the table version.
    pub silo: Option<String>,
    /// The TTL its cells carry now, in seconds (`None`: no TTL).
    pub current_ttl: Option<u32>,
    /// What `patch` does with it.
    pub action: PatchAction,
}

/// What [`CassandraMembershipTable::audit_ttl`] found: the table's default and this cluster's
/// partition against the configuration, one line per row that disagrees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TtlAudit {
    /// `keyspace.table`.
    pub table: String,
    /// The table's `default_time_to_live`.
    pub table_default_ttl: u64,
    /// The configured TTL (DefunctSiloExpiration, 0 when expiry is off).
    pub configured_ttl: u64,
    /// Rows (and the version) of this cluster that disagree with the configuration, with what
    /// `patch` does.
    pub rows: Vec<RowAudit>,
}

impl TtlAudit {
    /// True when neither the table default nor any row of this cluster disagrees.
    pub fn agrees(&self) -> bool {
        self.table_default_ttl == self.configured_ttl && self.rows.is_empty()
    }

    /// How many rows (and versions) disagree.
    pub fn disagreeing(&self) -> u64 {
        self.rows.len() as u64
    }

    /// True when the table default agrees and only the cluster's version (not an entry)
    /// disagrees: a state the provider repairs by itself at `initialize`, whatever the policy.
    pub fn only_the_version_disagrees(&self) -> bool {
        self.table_default_ttl == self.configured_ttl
            && !self.rows.is_empty()
            && self.rows.iter().all(|r| r.silo.is_none())
    }
}

/// What a table value knows of its partition's expiry, from its last audit or scan.
#[derive(Debug, Default)]
pub(super) struct ExpiryState {
    /// Some row has no TTL (or a longer one than this configuration renews): the version must
    /// carry none.
    unbounded_rows: AtomicBool,
    /// The longest TTL (seconds) a row read at the last scan: the version must outlive it.
    longest_row_ttl: AtomicI64,
    /// The last audit at `initialize` found nothing that storage would never remove.
    covered: AtomicBool,
    /// When this table value last scanned its partition (whatever the outcome): renewals scan
    /// at most once per renewal interval per table value, not once per silo.
    scanned_at: Mutex<Option<Instant>>,
}

/// One row of `audit_partition.cql`.
#[derive(DeserializeRow)]
pub(super) struct ScanRow {
    pub(super) silo: Option<String>,
    pub(super) etag: Option<Uuid>,
    pub(super) etag_ttl: Option<i32>,
    version_etag: Option<Uuid>,
    pub(super) version_ttl: Option<i32>,
    version_written: Option<i64>,
}

/// A partition's plan.
struct PartitionPlan {
    read: PartitionRead,
    lines: Vec<RowAudit>,
    /// The version's planned TTL when rows are rewritten in a batch with it.
    version_target: i32,
    /// Rows that may never expire (no TTL, or a longer one) stay: the version takes no TTL.
    unbounded: bool,
    /// Something stays that storage never removes (a row or the version without TTL, an
    /// unreadable row, a marker-only row).
    leftovers: bool,
    /// Silos whose rows stay as they are because their silo may be live.
    live_kept: HashSet<String>,
    /// The longest TTL among rows that stay: the version must outlive it.
    longest_stay: i64,
}

/// Seconds left to something last alive at `last` had every write carried `write_ttl` seconds;
/// saturating, so no stored time can overflow.
pub(super) fn remaining_seconds(last: Timestamp, now: Timestamp, write_ttl: u64) -> i64 {
    let expires = last
        .as_millis()
        .saturating_add((write_ttl as i64).saturating_mul(1000));
    expires.saturating_sub(now.as_millis()).div_euclid(1000)
}

/// The TTL a write gives something that carries `current` now, when this configuration writes
/// `w`: never shorter than what it has (another silo may rely on a longer TTL, e.g. during a
/// rolling change of DefunctSiloExpiration), and none stays none (a silo with expiry off never
/// renews it).
pub(super) fn keep_longer(current: Option<i32>, w: i32) -> i32 {
    match current {
        None => 0,
        Some(t) => t.max(w).clamp(1, MAX_TTL_SECONDS as i32),
    }
}

/// A TTL Cassandra accepts: between 1 s and `max` (itself at most 630,720,000 s).
fn clamp_ttl(seconds: i64, max: u64) -> u32 {
    let max = max.clamp(1, MAX_TTL_SECONDS) as i64;
    seconds.clamp(1, max) as u32
}

impl CassandraMembershipTable {
    /// How much longer than the TTL it writes a stored TTL may read and still agree: `TTL()`
    /// is computed on the reading coordinator's clock, which may be ahead of the writer's.
    fn ttl_tolerance(&self) -> u64 {
        self.options().renewal_seconds()
    }

    /// True when a row with this remaining TTL expires within what this configuration renews.
    fn bounded(&self, ttl: Option<i32>) -> bool {
        match ttl {
            None => false,
            Some(t) => {
                (t.max(0) as u64) <= self.options().write_ttl_seconds() + self.ttl_tolerance()
            }
        }
    }

    /// The TTL the version is written with when nothing is known of its current one: none
    /// while rows without TTL (or with a longer one) may outlive it, else at least the longest
    /// row TTL seen.
    pub(super) fn version_ttl(&self) -> i32 {
        if self.expiry_state.unbounded_rows.load(Ordering::Relaxed) {
            0
        } else {
            self.write_ttl()
                .max(self.longest_row_ttl())
                .min(MAX_TTL_SECONDS as i32)
        }
    }

    fn longest_row_ttl(&self) -> i32 {
        let t = self.expiry_state.longest_row_ttl.load(Ordering::Relaxed);
        t.clamp(0, MAX_TTL_SECONDS as i64) as i32
    }

    /// The version's TTL for a write that gives a row `row_ttl` and finds the version with
    /// `current`: never shorter than the version has or than any row, none while any row has
    /// none.
    pub(super) fn version_ttl_over(&self, current: Option<i32>, row_ttl: i32) -> i32 {
        let floor = self.version_ttl();
        match current {
            Some(v) if row_ttl > 0 && floor > 0 => v.max(row_ttl).max(floor),
            _ => 0,
        }
    }

    /// Whether storage covers defunct cleanup for this cluster (see README "Expiry").
    pub(super) fn storage_covers_cleanup(&self) -> bool {
        self.options().ttl_seconds().is_some() && self.expiry_state.covered.load(Ordering::Relaxed)
    }

    /// Reports, without writing anything, how the table default and every row of this
    /// cluster's partition compare with the configured TTL, and what `patch` would do row by row.
    /// Other clusters' rows are not read.
    pub async fn audit_ttl(&self) -> Result<TtlAudit> {
        Ok(self.audit_and_plan().await?.0)
    }

    /// The audit and the partition plan it was made from (`Err(CorruptData)`: the cluster's
    /// version is damaged and cannot be planned; reported as an unreadable line).
    async fn audit_and_plan(&self) -> Result<(TtlAudit, Result<PartitionPlan>)> {
        let table_default_ttl = self
            .table_settings()
            .await?
            .map_or(0, |(ttl, _)| ttl.max(0) as u64);
        let plan = match self.plan_partition(self.pk()).await {
            Err(e) if !matches!(e, MembershipError::CorruptData { .. }) => return Err(e),
            plan => plan,
        };
        let rows = match &plan {
            Ok(plan) => plan.lines.clone(),
            // A cluster whose version is damaged cannot be planned; report it, touch nothing.
            Err(e) => {
                warn!(cluster = %self.cluster_id, error = %e, "cannot audit a damaged cluster");
                vec![RowAudit {
                    service_id: self.service_id().to_owned(),
                    cluster_id: self.cluster_id.clone(),
                    silo: None,
                    current_ttl: None,
                    action: PatchAction::Unreadable,
                }]
            }
        };
        let audit = TtlAudit {
            table: self.shared.qualified.clone(),
            table_default_ttl,
            configured_ttl: self.options().ttl_seconds().unwrap_or(0),
            rows,
        };
        Ok((audit, plan))
    }

    /// One paged plain read of the partition's tags and TTLs.
    pub(super) async fn scan_partition(&self, pk: Pk<'_>) -> Result<Vec<ScanRow>> {
        let st = self.statements().await?;
        let mut out = Vec::new();
        let mut paging = PagingState::start();
        loop {
            let (result, next) = self
                .read_page("audit_ttl", &st.audit_partition, pk, paging, false)
                .await?;
            let rows = result
                .into_rows_result()
                .map_err(|e| MembershipError::corrupt(None, format!("audit: {e}")))?;
            for row in rows.rows::<ScanRow>().map_err(|e| self.shape_error(e))? {
                out.push(row.map_err(|e| self.shape_error(e))?);
            }
            match next {
                PagingStateResponse::HasMorePages { state } => paging = state,
                PagingStateResponse::NoMorePages => return Ok(out),
            }
        }
    }

    /// Scans the partition's TTLs and records what a renewal needs: whether rows without TTL
    /// (or with a longer one) share it, and the longest row TTL. Returns the scan.
    async fn refresh_expiry_state(&self) -> Result<Vec<ScanRow>> {
        let scan = self.scan_partition(self.pk()).await?;
        let rows = scan.iter().filter(|r| r.silo.is_some() && r.etag.is_some());
        let (mut unbounded, mut longest) = (false, 0i64);
        for r in rows {
            if self.bounded(r.etag_ttl) {
                longest = longest.max(i64::from(r.etag_ttl.unwrap_or(0)));
            } else {
                unbounded = true;
            }
        }
        let state = &self.expiry_state;
        state.unbounded_rows.store(unbounded, Ordering::Relaxed);
        state.longest_row_ttl.store(longest, Ordering::Relaxed);
        if unbounded {
            state.covered.store(false, Ordering::Relaxed);
        }
        Ok(scan)
    }

    /// The TTLs a renewal (with expiry on) gives the silo's own row and the version; `None`
    /// when the row is gone meanwhile (the renewal reads it again).
    ///
    /// The partition is scanned at most once per renewal interval per table value; in between,
    /// one plain read of the row's and version's TTLs. A version without TTL gets one only from
    /// a fresh scan that finds every row with a TTL. A read that fails fails the renewal: a
    /// renewal that does not know the TTLs it would overwrite writes nothing (the heartbeat is
    /// still published, and the next one renews). A failed scan teaches nothing about the
    /// partition: the renewal reads its own TTLs instead, and the next one scans again.
    pub(super) async fn renewal_ttls(&self, silo: &str) -> Result<Option<(i32, i32)>> {
        let w = self.write_ttl();
        let renewal = Duration::from_secs(self.options().renewal_seconds());
        let due = {
            let mut at = self
                .expiry_state
                .scanned_at
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let due = at.is_none_or(|t| t.elapsed() >= renewal);
            if due {
                *at = Some(Instant::now());
            }
            due
        };
        if due {
            match self.refresh_expiry_state().await {
                Ok(scan) => {
                    let version = scan
                        .iter()
                        .find(|r| r.version_etag.is_some())
                        .and_then(|r| r.version_ttl);
                    let Some(row) = scan.iter().find(|r| r.silo.as_deref() == Some(silo)) else {
                        return Ok(None);
                    };
                    // A fresh scan: a version without TTL may get one if every row has one.
                    let row_ttl = row.etag_ttl.map_or(w, |t| t.max(w));
                    let version = version.or(Some(0));
                    return Ok(Some((row_ttl, self.version_ttl_over(version, row_ttl))));
                }
                Err(e) => {
                    warn!(cluster = %self.cluster_id, error = %e, "cannot scan the partition's TTLs; this renewal reads its own, the next one scans again");
                    *self
                        .expiry_state
                        .scanned_at
                        .lock()
                        .unwrap_or_else(|p| p.into_inner()) = None;
                }
            }
        }
        let Some((row, version)) = self.read_row_ttls("update_i_am_alive", silo).await? else {
            return Ok(None);
        };
        // Its own row: this silo renews it, so a row without TTL gets one.
        let row_ttl = row.map_or(w, |t| t.max(w));
        Ok(Some((row_ttl, self.version_ttl_over(version, row_ttl))))
    }

    /// `read_ttls.cql`: the TTLs a row and the version carry now (`None`: no row).
    pub(super) async fn read_row_ttls(
        &self,
        operation: &'static str,
        silo: &str,
    ) -> Result<Option<(Option<i32>, Option<i32>)>> {
        let st = self.statements().await?;
        let r = self
            .exec_read(
                operation,
                &st.read_ttls,
                SiloKey {
                    silo,
                    service_id: self.service_id(),
                    cluster_id: &self.cluster_id,
                },
                false,
            )
            .await?;
        let rows = r.into_rows_result().map_err(|e| {
            MembershipError::corrupt(Some(silo), format!("TTL read returned no rows: {e}"))
        })?;
        rows.maybe_first_row().map_err(|e| self.shape_error(e))
    }

    /// The TTLs a membership write gives the row and the version. With expiry on, a write never
    /// shortens a TTL ([`keep_longer`]) and keeps none where there is none: a row or version
    /// without TTL was written by a silo with expiry off (maybe an older binary), which never
    /// renews it. Whatever cannot be read as expected gets no TTL (the safe side).
    pub(super) async fn ttls_for_write(&self, silo: &str, insert: bool) -> Result<(i32, i32)> {
        if self.options().ttl_seconds().is_none() {
            return Ok((0, 0));
        }
        let w = self.write_ttl();
        if insert {
            // No version yet: the insert creates it, with the TTL a new version gets.
            let current = self
                .read_version_ttl("insert_row")
                .await?
                .unwrap_or(Some(0));
            return Ok((w, self.version_ttl_over(current, w)));
        }
        Ok(match self.read_row_ttls("update_row", silo).await? {
            Some((row_ttl, version_ttl)) => {
                let row = keep_longer(row_ttl, w);
                (row, self.version_ttl_over(version_ttl, row))
            }
            None => (0, 0),
        })
    }

    async fn plan_partition(&self, pk: Pk<'_>) -> Result<PartitionPlan> {
        let now = Timestamp::now();
        let read = self.read_partition(pk).await?;
        let scan = self.scan_partition(pk).await?;
        let ttl_on = self.options().ttl_seconds().is_some();
        let w = self.options().write_ttl_seconds();
        let cap = w + self.ttl_tolerance();
        let line = |silo: Option<String>, current: Option<i32>, action| RowAudit {
            service_id: pk.service_id.to_owned(),
            cluster_id: pk.cluster_id.to_owned(),
            silo,
            current_ttl: current.map(|t| t.max(0) as u32),
            action,
        };
        let entries: HashMap<String, _> = read
            .entries
            .iter()
            .map(|e| (e.entry.address.to_string(), e))
            .collect();
        let empty: HashSet<&String> = read.empty_rows.iter().collect();
        let mut lines = Vec::new();
        let (mut unbounded, mut leftovers) = (false, false);
        let mut live_kept = HashSet::new();
        // The version must outlive every row that stays: the longest TTL among them.
        let mut latest_stay: i64 = 0;
        let mut version: Option<(Option<i32>, Option<i64>)> = None;
        let mut any_row = false;
        for row in &scan {
            if row.version_etag.is_some() {
                version = Some((row.version_ttl, row.version_written));
            }
            let Some(silo) = &row.silo else { continue };
            any_row = true;
            let Some(stored) = entries.get(silo) else {
                if empty.contains(silo) || row.etag.is_none() {
                    // Only a marker (or null cells) left: no entry; defunct cleanup removes it.
                    leftovers = true;
                } else if ttl_on != row.etag_ttl.is_some()
                    || (ttl_on && !self.bounded(row.etag_ttl))
                {
                    // (With expiry off a row without TTL agrees; `bounded` is about TTLs this
                    // configuration writes. It may also be a row inserted between the two reads.)
                    if row.etag_ttl.is_none() {
                        leftovers = true;
                    }
                    lines.push(line(
                        Some(silo.clone()),
                        row.etag_ttl,
                        PatchAction::Unreadable,
                    ));
                }
                continue;
            };
            if !ttl_on {
                if row.etag_ttl.is_some() {
                    lines.push(line(
                        Some(silo.clone()),
                        row.etag_ttl,
                        PatchAction::Rewrite { ttl_seconds: 0 },
                    ));
                }
                continue;
            }
            if self.bounded(row.etag_ttl) {
                latest_stay = latest_stay.max(i64::from(row.etag_ttl.unwrap_or(0)));
                continue;
            }
            let entry = merge_heartbeat(stored.entry.clone(), read.heartbeats.get(silo).copied());
            let remaining = remaining_seconds(entry.last_activity(), now, w);
            let action = if remaining <= 0 {
                PatchAction::Remove
            } else if entry.status == SiloStatus::Dead {
                let t = clamp_ttl(remaining, w);
                latest_stay = latest_stay.max(i64::from(t));
                PatchAction::Rewrite { ttl_seconds: t }
            } else {
                // Possibly live, possibly a silo with expiry off: never give it a TTL.
                unbounded = true;
                live_kept.insert(silo.clone());
                match row.etag_ttl {
                    None => leftovers = true,
                    Some(t) => latest_stay = latest_stay.max(i64::from(t)),
                }
                PatchAction::KeepWhileLive
            };
            lines.push(line(Some(silo.clone()), row.etag_ttl, action));
        }
        let mut version_target = 0;
        match version {
            None if any_row => {
                // Rows without a version: patch writes one (version 0, a fresh tag).
                let t = if ttl_on && !unbounded { w as u32 } else { 0 };
                lines.push(line(None, None, PatchAction::Rewrite { ttl_seconds: t }));
            }
            None => {}
            Some((None, _)) if !ttl_on => {}
            Some((current, _)) if !ttl_on => {
                lines.push(line(None, current, PatchAction::Rewrite { ttl_seconds: 0 }));
            }
            Some((current, _)) if unbounded => {
                leftovers = true;
                if current.is_some() {
                    lines.push(line(None, current, PatchAction::Rewrite { ttl_seconds: 0 }));
                }
            }
            Some((current, written)) => {
                let written = Timestamp::from_millis(written.unwrap_or(0).div_euclid(1000));
                let needed = remaining_seconds(written, now, w).max(latest_stay);
                version_target = clamp_ttl(needed, cap) as i32;
                if !self.bounded(current) {
                    let action = if needed <= 0 {
                        PatchAction::Remove
                    } else {
                        PatchAction::Rewrite {
                            ttl_seconds: version_target as u32,
                        }
                    };
                    lines.push(line(None, current, action));
                }
            }
        }
        Ok(PartitionPlan {
            read,
            lines,
            version_target,
            unbounded,
            leftovers,
            live_kept,
            longest_stay: latest_stay,
        })
    }

    /// Decides, at `initialize`, what to do about a table or partition that disagrees with the
    /// configuration, and records what the table value learnt for its own writes.
    /// Returns whether the cluster's version was there when its partition was read (a serial
    /// read), so `initialize` need not race other starting silos to create it.
    pub(super) async fn reconcile_ttl(&self) -> Result<bool> {
        let (audit, plan) = self.audit_and_plan().await?;
        // A damaged version is corrupt data under every policy: no policy writes over it (that
        // would restart the version, or invent one).
        let mut plan = Ok(plan?);
        if !audit.agrees() && audit.only_the_version_disagrees() {
            // The version's TTL alone is what the provider's own protocol can leave behind (a
            // fence or a failed renewal of an earlier release, a rolling change of settings): it
            // is repaired under every policy, touching no entry.
            if let Ok(p) = &plan {
                info!(table = %audit.table, cluster = %self.cluster_id, "giving the table version the TTL its rows imply");
                self.repair_version(self.pk(), p).await?;
                plan = self.plan_partition(self.pk()).await;
            }
        } else if !audit.agrees() {
            match self.options().ttl_mismatch {
                super::TtlMismatchPolicy::Throw => {
                    return Err(MembershipError::TtlMismatch {
                        table: audit.table.clone(),
                        table_ttl_seconds: audit.table_default_ttl,
                        configured_ttl_seconds: audit.configured_ttl,
                        rows_disagreeing: audit.disagreeing(),
                    });
                }
                super::TtlMismatchPolicy::Allow => {
                    warn!(
                        table = %audit.table,
                        cluster = %self.cluster_id,
                        table_ttl = audit.table_default_ttl,
                        configured_ttl = audit.configured_ttl,
                        rows_disagreeing = audit.disagreeing(),
                        "the table's TTL settings disagree with the configuration; ttl_mismatch = allow leaves them as they are, new writes use the configured TTL"
                    );
                }
                super::TtlMismatchPolicy::Patch => {
                    self.patch_ttl(&audit).await?;
                    // The patch changed what stays: plan again.
                    plan = self.plan_partition(self.pk()).await;
                }
            }
        }
        // A version lost while entries remain is re-created above any earlier number under every
        // policy: `initialize` must never answer it absent (it would start it again at 0).
        for _ in 0..2 {
            match &plan {
                Ok(p) if p.read.version_lost => {
                    self.recover_lost_version(self.pk()).await?;
                    plan = self.plan_partition(self.pk()).await;
                }
                _ => break,
            }
        }
        if matches!(&plan, Ok(p) if p.read.version_lost) {
            return Err(super::read::lost_version_error(None));
        }
        // What stays decides the version's TTL and whether storage covers cleanup.
        match plan {
            Ok(plan) => {
                let version_present = plan.read.version_etag.is_some();
                let open = plan
                    .lines
                    .iter()
                    .any(|l| l.action != PatchAction::KeepWhileLive);
                self.expiry_state
                    .unbounded_rows
                    .store(plan.unbounded, Ordering::Relaxed);
                self.expiry_state
                    .longest_row_ttl
                    .store(plan.longest_stay, Ordering::Relaxed);
                self.expiry_state
                    .covered
                    .store(!plan.leftovers && !open, Ordering::Relaxed);
                Ok(version_present)
            }
            // Damaged since the first plan (a concurrent change): nothing is written over it.
            Err(e) => {
                self.expiry_state
                    .unbounded_rows
                    .store(true, Ordering::Relaxed);
                self.expiry_state.covered.store(false, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// Gives the version the TTL `plan` says, conditionally on its tag and touching nothing else
    /// (the repair of a version-only disagreement, under every policy). A lost race or an
    /// ambiguous outcome is left to the next write or start: every write applies the same rules.
    async fn repair_version(&self, pk: Pk<'_>, plan: &PartitionPlan) -> Result<()> {
        let read = &plan.read;
        let Some(tag) = read.version_etag else {
            if read.version_lost {
                self.recover_lost_version(pk).await?;
            }
            return Ok(());
        };
        let ttl = match plan
            .lines
            .iter()
            .find(|l| l.silo.is_none())
            .map(|l| l.action)
        {
            Some(PatchAction::Rewrite { ttl_seconds }) => ttl_seconds as i32,
            // An old version no row needs: it gets the write TTL and expires as everything else,
            // rather than being removed (a removal would restart the version at 0).
            Some(PatchAction::Remove) => self.write_ttl(),
            _ => return Ok(()),
        };
        let st = self.statements().await?;
        let values = WriteVersionValues::new(pk, read.version.version as i64, tag, Some(tag), ttl);
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

    /// Patches one partition; re-plans and retries when a concurrent write wins a condition.
    /// Hard errors (invalid, unauthorized, …) are returned as such, never retried.
    async fn patch_partition(&self, pk: Pk<'_>) -> Result<(usize, usize)> {
        let st = self.statements().await?;
        let (mut rewritten, mut removed) = (0, 0);
        let started = std::time::Instant::now();
        // Not applied, or an unknown outcome: re-plan (every step is safe to repeat).
        'attempt: for _ in 0..super::MAX_ATTEMPTS {
            let plan = self.plan_partition(pk).await?;
            let read = &plan.read;
            let Some(version_etag) = read.version_etag else {
                if plan.lines.iter().any(|l| l.silo.is_none()) {
                    // Rows without a version: re-create it (above any earlier number), plan again.
                    if self.recover_lost_version(pk).await? {
                        continue;
                    }
                }
                break;
            };
            for l in &plan.lines {
                let Some(silo) = &l.silo else { continue };
                let Some(stored) = read
                    .entries
                    .iter()
                    .find(|e| &e.entry.address.to_string() == silo)
                else {
                    continue;
                };
                let applied = match l.action {
                    PatchAction::Rewrite { ttl_seconds } => {
                        let ttl = ttl_seconds as i32;
                        let values = (
                            EntryValues::new(pk, &stored.entry, silo, stored.etag, ttl),
                            UpdateEntryValues {
                                entry: EntryValues::new(pk, &stored.entry, silo, stored.etag, ttl),
                                expected_etag: Some(stored.etag),
                                heartbeat_key: silo,
                                expected_heartbeat: read.heartbeats.get(silo).copied(),
                            },
                            WriteVersionValues::new(
                                pk,
                                read.version.version as i64,
                                version_etag,
                                Some(version_etag),
                                if plan.unbounded {
                                    0
                                } else {
                                    plan.version_target
                                },
                            ),
                        );
                        rewritten += 1;
                        self.conditional(PATCH, &st.patch_batch, values)
                            .await?
                            .applied()
                    }
                    PatchAction::Remove => {
                        let values = DeleteEntryValues {
                            service_id: pk.service_id,
                            cluster_id: pk.cluster_id,
                            silo,
                            expected_etag: stored.etag,
                            heartbeat_key: silo,
                            expected_heartbeat: read.heartbeats.get(silo).copied(),
                        };
                        removed += 1;
                        self.conditional(PATCH, &st.delete_entry, values)
                            .await?
                            .applied()
                    }
                    _ => true,
                };
                if !applied {
                    continue 'attempt;
                }
            }
            // The version alone, or its removal when nothing stays.
            if let Some(v) = plan.lines.iter().find(|l| l.silo.is_none()) {
                let removes = plan
                    .lines
                    .iter()
                    .filter(|l| l.silo.is_some() && l.action == PatchAction::Remove)
                    .count();
                let applied = match v.action {
                    PatchAction::Remove if read.entries.len() == removes => self
                        .conditional(
                            PATCH,
                            &st.delete_statics,
                            DeleteStaticsValues {
                                service_id: pk.service_id,
                                cluster_id: pk.cluster_id,
                                expected_version_etag: Some(version_etag),
                            },
                        )
                        .await?
                        .applied(),
                    PatchAction::Rewrite { ttl_seconds } => self
                        .conditional(
                            PATCH,
                            &st.write_version,
                            WriteVersionValues::new(
                                pk,
                                read.version.version as i64,
                                version_etag,
                                Some(version_etag),
                                ttl_seconds as i32,
                            ),
                        )
                        .await?
                        .applied(),
                    _ => true,
                };
                if !applied {
                    continue;
                }
            }
            self.patch_heartbeats(pk, &plan).await?;
            return Ok((rewritten, removed));
        }
        Err(MembershipError::Contention {
            operation: PATCH,
            attempts: super::MAX_ATTEMPTS,
            elapsed: started.elapsed(),
        })
    }

    /// Gives heartbeat elements the TTL the configuration implies — except elements of silos
    /// that may be live and run without TTL — or removes them when already past it. Each write
    /// is stamped relative to the element's own write time: a newer heartbeat always wins, and a
    /// later delete (stamped with the element's write time) still removes it.
    async fn patch_heartbeats(&self, pk: Pk<'_>, plan: &PartitionPlan) -> Result<()> {
        let now = Timestamp::now();
        let ttl_on = self.options().ttl_seconds().is_some();
        let w = self.options().write_ttl_seconds();
        for cell in self.read_heartbeat_cells(pk, PATCH).await? {
            if plan.live_kept.contains(&cell.key) {
                continue;
            }
            let Some(written) = cell.written else {
                continue;
            };
            if !ttl_on {
                if let (Some(_), Some(value)) = (cell.ttl, cell.value) {
                    self.write_heartbeat_cell(pk, &cell.key, value, 0, written, PATCH)
                        .await?;
                }
                continue;
            }
            if self.bounded(cell.ttl) {
                continue;
            }
            let remaining = cell.value.and_then(|(_, time)| time).map_or(0, |t| {
                remaining_seconds(Timestamp::from_millis(t.0), now, w)
            });
            match cell.value {
                Some(value) if remaining > 0 => {
                    let ttl = clamp_ttl(remaining, w) as i32;
                    self.write_heartbeat_cell(pk, &cell.key, value, ttl, written, PATCH)
                        .await?;
                }
                _ => {
                    self.delete_heartbeat_cell(pk, &cell.key, written, PATCH)
                        .await?
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remaining_time_never_overflows() {
        let now = Timestamp::now();
        for t in [i64::MIN, i64::MIN + 1, -1, 0, i64::MAX - 1, i64::MAX] {
            let r = remaining_seconds(Timestamp::from_millis(t), now, 630_720_000);
            let c = clamp_ttl(r, 630_720_000);
            assert!((1..=630_720_000).contains(&c), "{t}: {r} → {c}");
        }
        assert!(remaining_seconds(Timestamp::from_millis(i64::MIN), now, 6) < 0);
        assert_eq!(clamp_ttl(i64::MAX, 6), 6);
        assert_eq!(clamp_ttl(4_102_444_800, 900_000_000), 630_720_000);
    }

    #[test]
    fn durations_are_whole_seconds() {
        let now = Timestamp::from_millis(10_000);
        assert_eq!(remaining_seconds(Timestamp::from_millis(9_000), now, 6), 5);
        assert_eq!(remaining_seconds(Timestamp::from_millis(0), now, 6), -4);
    }
}

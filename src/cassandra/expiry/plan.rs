//! The pure planner: from the rows of one cluster's partition — the serial read of its entries
//! and the plain scan of its tags and TTLs — and the time, what the audit reports and what
//! `patch` and the version repair write: which rows stay, get a TTL or go; whether the version
//! is rewritten, removed or written afresh; which heartbeat cells are restamped or removed;
//! and what the version must outlive. No IO and no clock: the reads are given, and so is `now`.

use std::collections::{HashMap, HashSet};

use scylla::DeserializeRow;
use uuid::Uuid;

use super::audit::{PatchAction, RowAudit};
use super::ttl::{TtlRules, clamp_ttl, remaining_seconds};
use crate::cassandra::Pk;
use crate::cassandra::decode::StoredEntry;
use crate::cassandra::heartbeats::HeartbeatCell;
use crate::cassandra::heartbeats::{StoredHeartbeat, merge_heartbeat};
use crate::cassandra::read::PartitionRead;
use crate::model::{SiloStatus, Timestamp};

/// One row of `audit_partition.cql`.
#[derive(DeserializeRow)]
pub(crate) struct ScanRow {
    pub(crate) silo: Option<String>,
    pub(crate) etag: Option<Uuid>,
    pub(crate) etag_ttl: Option<i32>,
    /// The heartbeat cell's TTL (`None`: no cell, or one without TTL).
    pub(crate) heartbeat_ttl: Option<i32>,
    pub(super) version_etag: Option<Uuid>,
    pub(crate) version_ttl: Option<i32>,
    pub(super) version_written: Option<i64>,
}

/// What the version must outlive.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct VersionFloor {
    /// Some row may never expire (no TTL, or a longer one than this configuration renews):
    /// the version must carry none.
    pub(super) unbounded_rows: bool,
    /// The longest TTL (seconds) a row that stays carries: the version must outlive it.
    pub(super) longest_row_ttl: i64,
}

impl VersionFloor {
    fn outlive(&mut self, row_ttl: i64) {
        self.longest_row_ttl = self.longest_row_ttl.max(row_ttl);
    }
}

/// The floor from a scan alone, for renewals: every row holding an entry stays.
pub(super) fn version_floor(scan: &[ScanRow], rules: &TtlRules) -> VersionFloor {
    let mut floor = VersionFloor::default();
    for row in scan.iter().filter(|r| r.silo.is_some() && r.etag.is_some()) {
        if rules.bounded(row.etag_ttl) {
            floor.outlive(i64::from(row.etag_ttl.unwrap_or(0)));
        } else {
            floor.unbounded_rows = true;
        }
    }
    floor
}

/// What the planner decides from: one partition's two reads.
pub(super) struct PartitionRows<'a> {
    pub(super) pk: Pk<'a>,
    /// The serial read of its entries, heartbeats and version.
    pub(super) read: PartitionRead,
    /// The plain scan of its tags and TTLs (`audit_partition.cql`).
    pub(super) scan: Vec<ScanRow>,
}

/// A partition's plan.
pub(super) struct Plan {
    /// The serial read the plan was made from: `patch` writes on the tags it holds.
    pub(super) read: PartitionRead,
    /// The rows (and the version, last) that disagree with the configuration, with what `patch`
    /// does.
    pub(super) lines: Vec<RowAudit>,
    /// The version's planned TTL when rows are rewritten in a batch with it.
    pub(super) version_target: i32,
    /// What the version must outlive among the rows that stay.
    pub(super) floor: VersionFloor,
    /// Something stays that storage never removes (a row or the version without TTL, an
    /// unreadable row, a row left with only its heartbeat cell).
    pub(super) leftovers: bool,
    /// Silos whose rows stay as they are because their silo may be live.
    pub(super) live_kept: HashSet<String>,
}

/// One row write of `patch`.
#[derive(Debug)]
pub(super) enum RowPatch<'a> {
    /// Rewrite the entry unchanged with this TTL, in a batch with the version.
    Rewrite {
        silo: &'a str,
        stored: &'a StoredEntry,
        heartbeat: Option<StoredHeartbeat>,
        ttl: i32,
    },
    /// Delete the entry (its cell; the heartbeat cell left goes at its own write time).
    Remove {
        silo: &'a str,
        stored: &'a StoredEntry,
        heartbeat: Option<StoredHeartbeat>,
    },
}

/// What `patch` writes to the version once the rows are done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum VersionPatch {
    /// Nothing.
    Leave,
    /// Rewrite it, unchanged, with this TTL.
    Rewrite { ttl: i32 },
    /// Remove the version (its row): no entry stays.
    DeleteStatics,
}

/// What `patch` does with one heartbeat cell. Writes are stamped relative to the cell's
/// own write time (`written`, µs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CellPatch {
    /// Nothing.
    Leave,
    /// Rewrite it unchanged with this TTL (0: none).
    Restamp {
        value: StoredHeartbeat,
        ttl: i32,
        written: i64,
    },
    /// Remove it: it is past the TTL.
    Delete { written: i64 },
}

/// Decides what the audit reports and `patch` does, from the partition's rows as read at `now`.
pub(super) fn plan(rows: PartitionRows<'_>, now: Timestamp, rules: &TtlRules) -> Plan {
    let PartitionRows { pk, read, scan } = rows;
    let mut planner = Planner {
        pk,
        now,
        rules,
        lines: Vec::new(),
        floor: VersionFloor::default(),
        leftovers: false,
        live_kept: HashSet::new(),
    };
    let entries: HashMap<String, &StoredEntry> = read
        .entries
        .iter()
        .map(|e| (e.entry.address.to_string(), e))
        .collect();
    let empty: HashSet<&String> = read.empty_rows.iter().collect();
    let mut version = None;
    let mut any_row = false;
    for row in &scan {
        if row.version_etag.is_some() {
            version = Some(StoredVersion {
                ttl: row.version_ttl,
                written_micros: row.version_written,
            });
        }
        let Some(silo) = &row.silo else { continue };
        any_row = true;
        match entries.get(silo) {
            Some(stored) => planner.entry_row(
                silo,
                row.etag_ttl,
                stored,
                read.heartbeats.get(silo).copied(),
            ),
            None => planner.row_without_entry(silo, row, empty.contains(silo)),
        }
    }
    let version_target = planner.version(version, any_row);
    Plan {
        read,
        lines: planner.lines,
        version_target,
        floor: planner.floor,
        leftovers: planner.leftovers,
        live_kept: planner.live_kept,
    }
}

/// The version's cells (row `''`) as scanned.
struct StoredVersion {
    ttl: Option<i32>,
    written_micros: Option<i64>,
}

/// The plan being made, row by row.
struct Planner<'a> {
    pk: Pk<'a>,
    now: Timestamp,
    rules: &'a TtlRules,
    lines: Vec<RowAudit>,
    floor: VersionFloor,
    leftovers: bool,
    live_kept: HashSet<String>,
}

impl Planner<'_> {
    fn line(&mut self, silo: Option<&str>, current: Option<i32>, action: PatchAction) {
        self.lines.push(RowAudit {
            service_id: self.pk.service_id.to_owned(),
            cluster_id: self.pk.cluster_id.to_owned(),
            silo: silo.map(str::to_owned),
            current_ttl: current.map(|t| t.max(0) as u32),
            action,
        });
    }

    /// A row the serial read holds no entry of.
    fn row_without_entry(&mut self, silo: &str, row: &ScanRow, marker_only: bool) {
        let rules = self.rules;
        if marker_only || row.etag.is_none() {
            // No entry left. A heartbeat cell with a TTL this configuration writes expires on
            // its own (an entry removed, or expired a renewal interval before its last
            // heartbeat); anything else (a cell without TTL, a bare row marker) is defunct
            // cleanup's.
            if !(rules.expiry_on && rules.bounded(row.heartbeat_ttl)) {
                self.leftovers = true;
            }
        } else if rules.expiry_on != row.etag_ttl.is_some()
            || (rules.expiry_on && !rules.bounded(row.etag_ttl))
        {
            // (With expiry off a row without TTL agrees; `bounded` is about TTLs this
            // configuration writes. It may also be a row inserted between the two reads.)
            if row.etag_ttl.is_none() {
                self.leftovers = true;
            }
            self.line(Some(silo), row.etag_ttl, PatchAction::Unreadable);
        }
    }

    /// A row holding an entry whose cells carry `ttl`.
    fn entry_row(
        &mut self,
        silo: &str,
        ttl: Option<i32>,
        stored: &StoredEntry,
        heartbeat: Option<StoredHeartbeat>,
    ) {
        let rules = self.rules;
        if !rules.expiry_on {
            if ttl.is_some() {
                self.line(Some(silo), ttl, PatchAction::Rewrite { ttl_seconds: 0 });
            }
            return;
        }
        if rules.bounded(ttl) {
            self.floor.outlive(i64::from(ttl.unwrap_or(0)));
            return;
        }
        let entry = merge_heartbeat(stored.entry.clone(), heartbeat);
        let remaining = remaining_seconds(entry.last_activity(), self.now, rules.write_ttl);
        let action = if remaining <= 0 {
            PatchAction::Remove
        } else if entry.status == SiloStatus::Dead {
            let t = clamp_ttl(remaining, rules.write_ttl);
            self.floor.outlive(i64::from(t));
            PatchAction::Rewrite { ttl_seconds: t }
        } else {
            // Possibly live, possibly a silo with expiry off: never give it a TTL.
            self.floor.unbounded_rows = true;
            self.live_kept.insert(silo.to_owned());
            match ttl {
                None => self.leftovers = true,
                Some(t) => self.floor.outlive(i64::from(t)),
            }
            PatchAction::KeepWhileLive
        };
        self.line(Some(silo), ttl, action);
    }

    /// The version's line, once every row's is made (it depends on what stays). Returns the TTL
    /// a batch rewriting a row gives the version.
    fn version(&mut self, version: Option<StoredVersion>, any_row: bool) -> i32 {
        let rules = self.rules;
        let Some(StoredVersion {
            ttl: current,
            written_micros,
        }) = version
        else {
            if any_row {
                // Rows without a version: patch writes one (version 0, a fresh tag).
                let t = if rules.expiry_on && !self.floor.unbounded_rows {
                    rules.write_ttl as u32
                } else {
                    0
                };
                self.line(None, None, PatchAction::Rewrite { ttl_seconds: t });
            }
            return 0;
        };
        if !rules.expiry_on {
            // With expiry off a silo takes back a TTL someone gave the version.
            if current.is_some() {
                self.line(None, current, PatchAction::Rewrite { ttl_seconds: 0 });
            }
            return 0;
        }
        if self.floor.unbounded_rows {
            // A row that may never expire stays: the version carries no TTL either.
            self.leftovers = true;
            if current.is_some() {
                self.line(None, current, PatchAction::Rewrite { ttl_seconds: 0 });
            }
            return 0;
        }
        let written = Timestamp::from_millis(written_micros.unwrap_or(0).div_euclid(1000));
        let needed =
            remaining_seconds(written, self.now, rules.write_ttl).max(self.floor.longest_row_ttl);
        let target = clamp_ttl(needed, rules.cap());
        if !rules.bounded(current) {
            let action = if needed <= 0 {
                PatchAction::Remove
            } else {
                PatchAction::Rewrite {
                    ttl_seconds: target,
                }
            };
            self.line(None, current, action);
        }
        target as i32
    }
}

impl Plan {
    /// The version's line, when the version disagrees (or is missing while rows stay).
    pub(super) fn version_line(&self) -> Option<&RowAudit> {
        self.lines.iter().find(|l| l.silo.is_none())
    }

    /// Storage covers defunct cleanup: nothing stays that storage never removes, and nothing
    /// disagrees but rows kept while their silo may be live.
    pub(super) fn storage_covers_cleanup(&self) -> bool {
        let open = self
            .lines
            .iter()
            .any(|l| l.action != PatchAction::KeepWhileLive);
        !self.leftovers && !open
    }

    /// The row writes of `patch`, in line order: rows the serial read holds an entry of.
    pub(super) fn row_patches(&self) -> impl Iterator<Item = RowPatch<'_>> {
        self.lines.iter().filter_map(|l| {
            let silo = l.silo.as_deref()?;
            let stored = self
                .read
                .entries
                .iter()
                .find(|e| e.entry.address.to_string() == silo)?;
            let heartbeat = self.read.heartbeats.get(silo).copied();
            match l.action {
                PatchAction::Rewrite { ttl_seconds } => Some(RowPatch::Rewrite {
                    silo,
                    stored,
                    heartbeat,
                    ttl: ttl_seconds as i32,
                }),
                PatchAction::Remove => Some(RowPatch::Remove {
                    silo,
                    stored,
                    heartbeat,
                }),
                _ => None,
            }
        })
    }

    /// The TTL a batch rewriting a row gives the version: none while a row may never expire.
    pub(super) fn batch_version_ttl(&self) -> i32 {
        if self.floor.unbounded_rows {
            0
        } else {
            self.version_target
        }
    }

    /// What `patch` writes to the version after the rows: its rewrite, or its removal when the
    /// plan removes every entry the read holds.
    pub(super) fn version_patch(&self) -> VersionPatch {
        let Some(version) = self.version_line() else {
            return VersionPatch::Leave;
        };
        let removes = self
            .lines
            .iter()
            .filter(|l| l.silo.is_some() && l.action == PatchAction::Remove)
            .count();
        match version.action {
            PatchAction::Remove if self.read.entries.len() == removes => {
                VersionPatch::DeleteStatics
            }
            PatchAction::Rewrite { ttl_seconds } => VersionPatch::Rewrite {
                ttl: ttl_seconds as i32,
            },
            _ => VersionPatch::Leave,
        }
    }

    /// The TTL the version repair (a version-only disagreement, under every policy) gives the
    /// version; `None`: nothing to write.
    pub(super) fn version_repair_ttl(&self, write_ttl: i32) -> Option<i32> {
        match self.version_line()?.action {
            PatchAction::Rewrite { ttl_seconds } => Some(ttl_seconds as i32),
            // An old version no row needs: it gets the write TTL and expires as everything else,
            // rather than being removed (a removal would restart the version at 0).
            PatchAction::Remove => Some(write_ttl),
            _ => None,
        }
    }

    /// What `patch` does with a heartbeat cell read at `now`: it gets the TTL the
    /// configuration implies — except cells of silos that may be live and run without TTL — or
    /// goes when already past it. A cell without a write time cannot be dated: it stays.
    pub(super) fn heartbeat_patch(
        &self,
        cell: &HeartbeatCell,
        now: Timestamp,
        rules: &TtlRules,
    ) -> CellPatch {
        if self.live_kept.contains(&cell.key) {
            return CellPatch::Leave;
        }
        let Some(written) = cell.written else {
            return CellPatch::Leave;
        };
        if !rules.expiry_on {
            return match (cell.ttl, cell.value) {
                (Some(_), Some(value)) => CellPatch::Restamp {
                    value,
                    ttl: 0,
                    written,
                },
                _ => CellPatch::Leave,
            };
        }
        if rules.bounded(cell.ttl) {
            return CellPatch::Leave;
        }
        let remaining = cell.value.and_then(|(_, time)| time).map_or(0, |t| {
            remaining_seconds(Timestamp::from_millis(t.0), now, rules.write_ttl)
        });
        match cell.value {
            Some(value) if remaining > 0 => CellPatch::Restamp {
                value,
                ttl: clamp_ttl(remaining, rules.write_ttl) as i32,
                written,
            },
            _ => CellPatch::Delete { written },
        }
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;

//! What a table value knows of its partition's expiry ([`ExpiryState`]: what the version must
//! outlive and whether storage covers defunct cleanup, learnt at its last audit or scan, and
//! when it last scanned), and the TTLs its membership writes and renewals carry from that: a
//! write never shortens a TTL, a renewal scans the partition at most once per renewal interval.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use tracing::warn;

use super::plan::{ScanRow, VersionFloor, version_floor};
use super::ttl::{self, TtlRules, keep_longer, renewed_row_ttl};
use crate::cassandra::CassandraMembershipTable;
use crate::cassandra::bind::SiloKey;
use crate::cassandra::decode::row_key;
use crate::cassandra::exec::Scan;
use crate::cassandra::options::MAX_TTL_SECONDS;
use crate::error::{MembershipError, Result};

/// What a table value knows of its partition's expiry, from its last audit or scan.
#[derive(Debug, Default)]
pub(crate) struct ExpiryState {
    /// Some row has no TTL (or a longer one than this configuration renews): the version must
    /// carry none.
    unbounded_rows: AtomicBool,
    /// The longest TTL (seconds) a row that stays carries, at the last audit or scan: the
    /// version must outlive it.
    longest_row_ttl: AtomicI64,
    /// The last audit at `initialize` found nothing that storage would never remove.
    covered: AtomicBool,
    /// When this table value last scanned its partition (whatever the outcome): renewals scan
    /// at most once per renewal interval per table value, not once per silo.
    scanned_at: Mutex<Option<Instant>>,
}

impl ExpiryState {
    fn record_floor(&self, floor: VersionFloor) {
        self.unbounded_rows
            .store(floor.unbounded_rows, Ordering::Relaxed);
        self.longest_row_ttl
            .store(floor.longest_row_ttl, Ordering::Relaxed);
    }

    /// What a renewal's scan found: a row that may never expire also means storage no longer
    /// covers cleanup.
    fn record_scan(&self, floor: VersionFloor) {
        self.record_floor(floor);
        if floor.unbounded_rows {
            self.covered.store(false, Ordering::Relaxed);
        }
    }

    /// What the last plan at `initialize` found.
    pub(super) fn record_plan(&self, floor: VersionFloor, covered: bool) {
        self.record_floor(floor);
        self.covered.store(covered, Ordering::Relaxed);
    }

    /// The cluster's version is damaged: the version takes no TTL, storage covers nothing.
    pub(super) fn record_damaged(&self) {
        self.unbounded_rows.store(true, Ordering::Relaxed);
        self.covered.store(false, Ordering::Relaxed);
    }

    fn longest_row_ttl(&self) -> i32 {
        let t = self.longest_row_ttl.load(Ordering::Relaxed);
        t.clamp(0, MAX_TTL_SECONDS as i64) as i32
    }

    /// True when this caller is to scan the partition (none did within `interval`); the scan is
    /// then counted as made, whatever its outcome.
    fn claim_scan(&self, interval: Duration) -> bool {
        let mut at = self.scanned_at.lock().unwrap_or_else(|p| p.into_inner());
        let due = at.is_none_or(|t| t.elapsed() >= interval);
        if due {
            *at = Some(Instant::now());
        }
        due
    }

    /// A failed scan teaches nothing: the next renewal scans again.
    fn forget_scan(&self) {
        *self.scanned_at.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

impl CassandraMembershipTable {
    /// The TTL the version is written with when nothing is known of its current one: none
    /// while rows without TTL (or with a longer one) may outlive it, else at least the longest
    /// row TTL seen.
    pub(crate) fn version_ttl(&self) -> i32 {
        let state = &self.expiry_state;
        ttl::version_floor_ttl(
            state.unbounded_rows.load(Ordering::Relaxed),
            self.write_ttl(),
            state.longest_row_ttl(),
        )
    }

    /// The version's TTL for a write that gives a row `row_ttl` and finds the version with
    /// `current`: never shorter than the version has or than any row, none while any row has
    /// none.
    pub(crate) fn version_ttl_over(&self, current: Option<i32>, row_ttl: i32) -> i32 {
        ttl::version_ttl_over(self.version_ttl(), current, row_ttl)
    }

    /// Whether storage covers defunct cleanup for this cluster (see `docs::expiry`).
    pub(crate) fn storage_covers_cleanup(&self) -> bool {
        self.options().ttl_seconds().is_some() && self.expiry_state.covered.load(Ordering::Relaxed)
    }

    /// Scans the partition's TTLs and records what a renewal needs: whether rows without TTL
    /// (or with a longer one) share it, and the longest row TTL. Returns the scan.
    async fn refresh_expiry_state(&self) -> Result<Vec<ScanRow>> {
        let scan = self.scan_partition(self.pk()).await?;
        let floor = version_floor(&scan, &TtlRules::of(self.options()));
        self.expiry_state.record_scan(floor);
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
    pub(crate) async fn renewal_ttls(&self, silo: &str) -> Result<Option<(i32, i32)>> {
        let interval = Duration::from_secs(self.options().renewal_seconds());
        if self.expiry_state.claim_scan(interval) {
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
                    return Ok(Some(self.renewed_ttls(row.etag_ttl, version.or(Some(0)))));
                }
                Err(e) => {
                    warn!(cluster = %self.cluster_id, error = %e, "cannot scan the partition's TTLs; this renewal reads its own, the next one scans again");
                    self.expiry_state.forget_scan();
                }
            }
        }
        let Some((row, version)) = self.read_row_ttls("update_i_am_alive", silo).await? else {
            return Ok(None);
        };
        Ok(Some(self.renewed_ttls(row, version)))
    }

    /// The TTLs a renewal gives its silo's own row, which carries `row` now, and the version,
    /// which carries `version`.
    fn renewed_ttls(&self, row: Option<i32>, version: Option<i32>) -> (i32, i32) {
        let row_ttl = renewed_row_ttl(row, self.write_ttl());
        (row_ttl, self.version_ttl_over(version, row_ttl))
    }

    /// `read_ttls.cql`: the TTLs a row and the version carry now (`None`: no row).
    pub(crate) async fn read_row_ttls(
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
                Scan::Part(self.pk()),
            )
            .await?;
        let rows = r.into_rows_result().map_err(|e| {
            MembershipError::corrupt(Some(silo), format!("TTL read returned no rows: {e}"))
        })?;
        let mut version_ttl = None;
        let mut row_ttl = None;
        for row in rows
            .rows::<(Option<String>, Option<i32>, Option<i32>)>()
            .map_err(|e| self.shape_error(e))?
        {
            let (key, etag_ttl, ttl) = row.map_err(|e| self.shape_error(e))?;
            match row_key(key) {
                None => version_ttl = ttl,
                Some(key) if key == silo => row_ttl = Some(etag_ttl),
                Some(_) => {}
            }
        }
        Ok(row_ttl.map(|row| (row, version_ttl)))
    }

    /// The TTLs a membership write gives the row and the version. With expiry on, a write never
    /// shortens a TTL ([`keep_longer`]) and keeps none where there is none: a row or version
    /// without TTL was written by a silo with expiry off (maybe an older binary), which never
    /// renews it. Whatever cannot be read as expected gets no TTL (the safe side).
    pub(crate) async fn ttls_for_write(&self, silo: &str, insert: bool) -> Result<(i32, i32)> {
        if self.options().ttl_seconds().is_none() {
            return Ok((0, 0));
        }
        let write_ttl = self.write_ttl();
        if insert {
            // No version yet: the insert creates it, with the TTL a new version gets.
            let current = self
                .read_version_ttl("insert_row")
                .await?
                .unwrap_or(Some(0));
            return Ok((write_ttl, self.version_ttl_over(current, write_ttl)));
        }
        Ok(match self.read_row_ttls("update_row", silo).await? {
            Some((row_ttl, version_ttl)) => {
                let row = keep_longer(row_ttl, write_ttl);
                (row, self.version_ttl_over(version_ttl, row))
            }
            None => (0, 0),
        })
    }
}

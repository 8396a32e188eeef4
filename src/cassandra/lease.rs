//! Leases: what a table value knows of each entry's TTL, renewal, and `update_i_am_alive`.

use std::time::Duration;

use tracing::{Span, warn};
use uuid::Uuid;

use super::bind::{EntryValues, Expected, UpdateEntryValues, WriteVersionValues, to_cql};
use super::decode::StoredEntry;
use super::etags::parse_etag;
use super::exec::Outcome;
use super::heartbeats::StoredHeartbeat;
use super::{CassandraMembershipTable, MAX_ATTEMPTS};
use crate::error::{MembershipError, Result};
use crate::model::{MembershipEntry, SiloAddress, SiloStatus, Timestamp};
use crate::table::{HeartbeatOutcome, Lease, StorageExpiry};

/// Entries whose lease state a table value remembers before it starts forgetting.
const MAX_LEASES: usize = 100_000;

/// Every statement of a heartbeat and its renewal runs as part of `update_i_am_alive`.
const OPERATION: &str = "update_i_am_alive";

/// What a renewal does after reading the entry.
enum Renewal {
    /// Rewrite the entry and the version unchanged, with these TTLs.
    Rewrite(Rewrite),
    /// The row went away between the reads: read again.
    Reread,
    /// Nothing to renew (expiry off, and no TTL to take back).
    Nothing,
}

/// The TTLs a renewal writes, and the tag the version moves to (`None`: no version was read).
struct Rewrite {
    row_ttl: i32,
    version_ttl: i32,
    new_version_etag: Option<Uuid>,
}

/// What a table value knows of an entry's lease from its own writes.
#[derive(Clone, Copy, Debug)]
pub(super) struct LeaseState {
    /// Local time taken before the write that last refreshed (or checked) the entry was sent.
    renewed_at: Timestamp,
    /// The same moment on the monotonic clock: when the next renewal is due does not move with
    /// wall-clock steps.
    renewed_mono: std::time::Instant,
    dead: bool,
    /// The entry's start time: heartbeat cells carry it to name their incarnation.
    start_time: Timestamp,
}

impl LeaseState {
    pub(super) fn after_write(entry: &MembershipEntry, renewed_at: Timestamp) -> Self {
        LeaseState {
            renewed_at,
            // Taken now, just after the write: at most a write's latency later than
            // `renewed_at`, which only makes the renewal due that much later.
            renewed_mono: std::time::Instant::now(),
            dead: entry.status == SiloStatus::Dead,
            start_time: entry.start_time,
        }
    }
}

impl CassandraMembershipTable {
    pub(super) fn expiry(&self) -> StorageExpiry {
        match self.options().ttl_seconds() {
            None => StorageExpiry::OFF,
            Some(ttl) => StorageExpiry {
                ttl: Some(Duration::from_secs(ttl)),
                slack: Duration::from_secs(self.options().renewal_seconds() + 1),
                // True only when the audit at `initialize` found nothing in this cluster's
                // partition that storage would never remove (`docs::expiry`).
                covers_defunct_cleanup: self.storage_covers_cleanup(),
            },
        }
    }

    fn lease_for(&self, renewed_at: Timestamp) -> Lease {
        match self.options().ttl_seconds() {
            None => Lease::unbounded(renewed_at),
            Some(ttl) => {
                let renewal = self.options().renewal_seconds();
                Lease {
                    granted_at: renewed_at,
                    expires_at: Some(renewed_at.saturating_add(Duration::from_secs(ttl + renewal))),
                    refresh_by: Some(renewed_at.saturating_add(Duration::from_secs(ttl))),
                }
            }
        }
    }

    pub(super) fn remember_lease(&self, address: SiloAddress, state: LeaseState) {
        let mut leases = self.leases.lock().unwrap_or_else(|p| p.into_inner());
        if leases.len() >= MAX_LEASES && !leases.contains_key(&address) {
            // Forgetting only costs an extra check on that silo's next heartbeat.
            leases.clear();
        }
        leases.insert(address, state);
    }

    pub(super) fn forget_lease(&self, address: &SiloAddress) {
        self.leases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(address);
    }

    pub(super) fn forget_all_leases(&self) {
        self.leases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// The lease this table value granted `address` with its last write or check, if it knows one.
    pub fn known_lease(&self, address: &SiloAddress) -> Option<Lease> {
        let state = *self
            .leases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(address)?;
        Some(self.lease_for(state.renewed_at))
    }

    /// Renews the TTL of an entry and of the version by rewriting them unchanged, conditionally
    /// on both being unchanged. With expiry off, takes back a TTL someone else gave them
    /// instead. Returns the entry as read, or `None` if it is gone.
    async fn renew(&self, address: &SiloAddress) -> Result<Option<MembershipEntry>> {
        let key = address.to_string();
        for _ in 0..MAX_ATTEMPTS {
            // A plain read is enough: the conditional write below re-checks both tags.
            let Some((stored, version, heartbeat)) = self.read_one(address, false).await? else {
                return Ok(None);
            };
            let version_etag = parse_etag(&version.etag).flatten();
            let rewrite = match self.renewal_of(address, &key, version_etag).await? {
                Renewal::Rewrite(rewrite) => rewrite,
                Renewal::Reread => continue,
                Renewal::Nothing => return Ok(Some(stored.entry)),
            };
            let (Some(expected_version), Some(new_version_etag)) =
                (version_etag, rewrite.new_version_etag)
            else {
                return Err(MembershipError::corrupt(
                    None,
                    "an entry exists but the table version does not; re-initialize the cluster",
                ));
            };
            let version_tags = (version.version as i64, expected_version, new_version_etag);
            if self
                .rewrite_unchanged(&key, &stored, heartbeat, version_tags, &rewrite)
                .await?
            {
                return Ok(Some(stored.entry));
            }
            // Lost a race with a membership change: read again.
        }
        Err(MembershipError::Contention {
            operation: OPERATION,
            attempts: MAX_ATTEMPTS,
            elapsed: Duration::ZERO,
        })
    }

    /// What a renewal of the entry `key` writes, the version carrying `version_etag` now.
    async fn renewal_of(
        &self,
        address: &SiloAddress,
        key: &str,
        version_etag: Option<Uuid>,
    ) -> Result<Renewal> {
        if self.options().ttl_seconds().is_some() {
            // A renewal that cannot read the TTLs it would overwrite writes nothing.
            return Ok(match self.renewal_ttls(key).await? {
                Some((row_ttl, version_ttl)) => Renewal::Rewrite(Rewrite {
                    row_ttl,
                    version_ttl,
                    new_version_etag: version_etag,
                }),
                None => Renewal::Reread, // the row went away meanwhile
            });
        }
        // Expiry off: this silo never renews a TTL, so its row and the version must carry none.
        // A silo with expiry on of a previous release gives the rows it votes on, and the
        // version, its TTL: take it back, rewriting them unchanged without TTL. The version
        // moves to a fresh tag (same number, same entries, as a fence does) so that a concurrent
        // renewal that decided on the old TTLs cannot apply after this.
        match self.read_row_ttls(OPERATION, key).await? {
            Some((None, None)) | None => Ok(Renewal::Nothing),
            Some(_) => {
                warn!(silo = %address, "the entry or the version carries a TTL although this silo runs with expiry off (a silo with expiry on of an older release?); removing it");
                Ok(Renewal::Rewrite(Rewrite {
                    row_ttl: 0,
                    version_ttl: 0,
                    new_version_etag: Some(Uuid::new_v4()),
                }))
            }
        }
    }

    /// Rewrites the entry as read and the version `(number, expected tag, new tag)` with the
    /// renewal's TTLs, conditionally on both tags and the heartbeat cell as read. `false`:
    /// a membership change won the race.
    async fn rewrite_unchanged(
        &self,
        key: &str,
        stored: &StoredEntry,
        heartbeat: Option<StoredHeartbeat>,
        (version, expected_version, new_version_etag): (i64, Uuid, Uuid),
        rewrite: &Rewrite,
    ) -> Result<bool> {
        let st = self.statements().await?;
        let values = (
            UpdateEntryValues {
                entry: EntryValues::new(
                    self.pk(),
                    &stored.entry,
                    key,
                    stored.etag,
                    rewrite.row_ttl,
                ),
                expected: Expected::of(st.whole_entry_conditions, stored),
                // The cell as read: only this silo writes it, and none of its heartbeats is
                // in flight now (a late one costs one more read).
                expected_heartbeat: heartbeat,
            },
            WriteVersionValues::new(
                self.pk(),
                version,
                new_version_etag,
                Some(expected_version),
                rewrite.version_ttl,
            ),
        );
        match self
            .conditional(OPERATION, &st.update_batch, values)
            .await?
        {
            Outcome::Applied => Ok(true),
            Outcome::NotApplied => Ok(false),
            // Rewriting unchanged values is harmless either way; report the failure so the
            // caller retries the heartbeat.
            Outcome::Ambiguous(e) => Err(MembershipError::Timeout {
                operation: OPERATION,
                source: e,
            }),
        }
    }

    /// `update_i_am_alive`: one plain write of the entry's heartbeat cell, plus a check (and
    /// with TTL a renewal) of the entry once per renewal interval.
    ///
    /// A known entry's heartbeat is written first and its renewal, when due, runs in what is
    /// left of the call (`table_operation_timeout`, which bounds the whole heartbeat in the
    /// runtime). The renewal used to run first — a read, a TTL read and a Paxos round, each
    /// allowed a whole request timeout —, and while one node of three was dead but not yet
    /// convicted by gossip it outlasted the call: the runtime cut the call, the heartbeat write
    /// behind it never ran, the lease stayed due so the next heartbeat renewed first again, and
    /// after a few periods without a heartbeat the silo was declared dead. Now a slow renewal
    /// costs only itself: the heartbeat has landed, the lease is not extended, and the next
    /// heartbeat tries the renewal again (the host fences at `refresh_by` if none succeeds).
    pub(super) async fn heartbeat(
        &self,
        address: &SiloAddress,
        time: Timestamp,
    ) -> Result<HeartbeatOutcome> {
        let started = std::time::Instant::now();
        let known = self
            .leases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(address)
            .copied();
        let renewal = Duration::from_secs(self.options().renewal_seconds());
        let state = match known {
            Some(s) if s.renewed_mono.elapsed() < renewal => {
                self.publish(address, s, time).await?;
                s
            }
            Some(s) => {
                self.publish(address, s, time).await?;
                let renewed_at = Timestamp::now();
                let left = self.renewal_budget(started.elapsed());
                // Nothing left: not even started (a timeout of zero still polls once, which
                // would send its first read).
                let renewal = async {
                    if left.is_zero() {
                        std::future::pending().await
                    } else {
                        self.renew(address).await
                    }
                };
                match tokio::time::timeout(left, renewal).await {
                    Ok(Ok(Some(entry))) => {
                        let renewed = LeaseState::after_write(&entry, renewed_at);
                        self.remember_lease(*address, renewed);
                        renewed
                    }
                    Ok(Ok(None)) => {
                        // The entry is gone: the cell written above is taken back (a delete at
                        // its own write time wins the tie), so that a heartbeat answering
                        // `NotFound` leaves nothing behind (docs::expiry, "never partial").
                        let written = time.as_millis().saturating_mul(1000);
                        let key = address.to_string();
                        if let Err(e) = self
                            .delete_heartbeat_cell(self.pk(), &key, written, OPERATION)
                            .await
                        {
                            warn!(silo = %address, error = %e, "the heartbeat cell of a missing entry was not removed; it expires with its TTL, or the cleanup removes it");
                        }
                        return Ok(self.not_found(address));
                    }
                    // The I-am-alive time is published all the same: the others must not
                    // declare this silo dead while its lease still runs. The lease is not
                    // extended, so the next heartbeat retries the renewal, and the host is told
                    // to fence at the old lease's `refresh_by` if renewals keep failing.
                    Ok(Err(e)) => {
                        warn!(silo = %address, error = %e, "lease renewal failed; the heartbeat was published, the next one retries the renewal");
                        s
                    }
                    Err(_) => {
                        warn!(silo = %address, within = ?left, "lease renewal unfinished within the heartbeat's call; the heartbeat was published, the next one retries the renewal");
                        s
                    }
                }
            }
            None => {
                // Unknown entry: check it exists (and renew its TTL) before writing its cell,
                // which needs the entry's start time.
                let renewed_at = Timestamp::now();
                match self.renew(address).await? {
                    None => return Ok(self.not_found(address)),
                    Some(entry) => {
                        let s = LeaseState::after_write(&entry, renewed_at);
                        self.remember_lease(*address, s);
                        self.publish(address, s, time).await?;
                        s
                    }
                }
            }
        };
        let lease = self.lease_for(state.renewed_at);
        Ok(if state.dead {
            Span::current().record("outcome", "declared_dead");
            HeartbeatOutcome::DeclaredDead { lease }
        } else {
            Span::current().record("outcome", "refreshed");
            HeartbeatOutcome::Refreshed { lease }
        })
    }

    /// Writes the heartbeat cell of `address` for the incarnation `state` knows.
    async fn publish(
        &self,
        address: &SiloAddress,
        state: LeaseState,
        time: Timestamp,
    ) -> Result<()> {
        self.write_heartbeat(
            self.pk(),
            &address.to_string(),
            (to_cql(state.start_time), to_cql(time)),
            self.write_ttl(),
            time.as_millis().saturating_mul(1000),
            OPERATION,
        )
        .await
    }

    fn not_found(&self, address: &SiloAddress) -> HeartbeatOutcome {
        self.forget_lease(address);
        Span::current().record("outcome", "not_found");
        HeartbeatOutcome::NotFound
    }

    /// What a due renewal may take once the heartbeat took `spent` of the call: the rest of
    /// `table_operation_timeout`, less a tenth (at least 20 ms) so that this call answers before
    /// the runtime's bound cuts it.
    fn renewal_budget(&self, spent: Duration) -> Duration {
        renewal_budget(
            self.options()
                .membership
                .effective_table_operation_timeout(),
            spent,
        )
    }
}

/// See [`CassandraMembershipTable::renewal_budget`].
fn renewal_budget(call: Duration, spent: Duration) -> Duration {
    let margin = (call / 10).max(Duration::from_millis(20));
    call.saturating_sub(margin).saturating_sub(spent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_due_renewal_gets_what_the_heartbeat_left_of_the_call() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        assert_eq!(renewal_budget(s(1), ms(100)), ms(800));
        assert_eq!(renewal_budget(s(30), s(1)), s(26));
        assert_eq!(renewal_budget(ms(100), ms(10)), ms(70));
        // A heartbeat that took the whole call leaves nothing: the renewal is not started.
        assert_eq!(renewal_budget(s(1), s(2)), Duration::ZERO);
    }
}

//! How placements expire with their server: the TTL of their rows and their renewal.

use std::sync::Weak;
use std::time::Duration;

use cassandra_membership::Timestamp;
use cassandra_membership::cassandra::{EXPIRY_HORIZON_UNIX_SECONDS, MAX_TTL_SECONDS};
use scylla::value::CqlTimestamp;
use tracing::{debug, warn};

use super::bind::MoveValues;
use super::{CassandraObjectPlacement, Inner, Placed, object_name};
use crate::error::RioStoreResult;

/// The TTL of placement rows, within Cassandra's limits (0 without expiry): the membership
/// table's write TTL (an entry expires at most that long after its last write), plus
/// `gone_after` (peers' failure notices keep writing a dead server's entry until it is gone),
/// plus two renewal intervals (placements are rewritten every interval: one for the interval
/// since the last rewrite, one of margin for a late one).
pub(crate) fn placement_ttl_seconds(
    options: &cassandra_membership::CassandraClusteringOptions,
    gone_after: Duration,
    now_unix_seconds: i64,
) -> i32 {
    if options.ttl_seconds().is_none() {
        return 0;
    }
    let gone_after = gone_after
        .as_secs()
        .saturating_add(u64::from(gone_after.subsec_nanos() > 0));
    let wanted = options
        .write_ttl_seconds()
        .saturating_add(gone_after)
        .saturating_add(options.renewal_seconds().saturating_mul(2));
    // A cell may not expire after the 2038 horizon of Cassandra's default storage mode.
    let horizon = u64::try_from(EXPIRY_HORIZON_UNIX_SECONDS.saturating_sub(now_unix_seconds))
        .unwrap_or(0)
        .max(1);
    i32::try_from(wanted.min(MAX_TTL_SECONDS).min(horizon)).unwrap_or(i32::MAX)
}

/// How many placements a renewal pass rewrites at once: a pass of thousands finishes within an
/// interval, and one slow or failing object delays no other.
const RENEWALS_AT_ONCE: usize = 16;

impl CassandraObjectPlacement {
    /// Rewrites one placement with a fresh TTL, conditionally on `server` still holding it, and
    /// its index row. False when it is no longer `server`'s.
    pub(super) async fn renew_one(
        &self,
        kind: &str,
        id: &str,
        server: &str,
        at: Timestamp,
    ) -> RioStoreResult<bool> {
        let values = MoveValues {
            service_id: &self.inner.service_id,
            cluster_id: &self.inner.cluster_id,
            object_kind: kind,
            object_id: id,
            server,
            placed_at: CqlTimestamp(at.as_millis()),
            previous: Some(server),
            ttl: self.inner.ttl,
        };
        let applied = self
            .inner
            .cql
            .conditional(
                "renew placement",
                &self.inner.statements.move_placement,
                values,
            )
            .await?
            .applied;
        if applied {
            self.index(kind, id, server).await?;
        }
        Ok(applied)
    }

    /// Rewrites every placement this value made with a fresh TTL, conditionally on its server
    /// still holding it, [`RENEWALS_AT_ONCE`] at a time; a placement lost meanwhile is
    /// forgotten, one whose renewal fails is tried again next pass (and refused by `lookup`
    /// once overdue). Returns how many it renewed and how many failed.
    #[tracing::instrument(skip(self), fields(cluster = %self.inner.cluster_id))]
    pub(crate) async fn renew_all(&self) -> (usize, usize) {
        let placed: Vec<((String, String), Placed)> = self
            .placed()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut pending = placed.into_iter();
        let mut tasks = tokio::task::JoinSet::new();
        let (mut renewed, mut failed) = (0, 0);
        loop {
            while tasks.len() < RENEWALS_AT_ONCE {
                let Some(((kind, id), p)) = pending.next() else {
                    break;
                };
                let this = self.clone();
                tasks.spawn(async move {
                    let started = tokio::time::Instant::now();
                    let result = this.renew_one(&kind, &id, &p.server, p.at).await;
                    (kind, id, p.server, started, result)
                });
            }
            let Some(done) = tasks.join_next().await else {
                break;
            };
            let Ok((kind, id, server, started, result)) = done else {
                failed += 1; // a renewal task panicked: tried again next pass
                continue;
            };
            let key = (kind.clone(), id.clone());
            match result {
                Ok(true) => {
                    renewed += 1;
                    if let Some(p) = self.placed().get_mut(&key).filter(|p| p.server == server) {
                        p.renewed = p.renewed.max(started);
                    }
                }
                Ok(false) => {
                    debug!(object = %object_name(&kind, &id), "placement lost meanwhile: no longer renewed");
                    {
                        let mut p = self.placed();
                        if p.get(&key).is_some_and(|p| p.server == server) {
                            p.remove(&key);
                        }
                    }
                    self.unindex(&kind, &id, &server).await.ok();
                }
                Err(e) => {
                    failed += 1;
                    warn!(object = %object_name(&kind, &id), error = %e.chain(), "placement renewal failed: tried again next interval");
                }
            }
        }
        (renewed, failed)
    }
}

/// Renews the placements every `every` while this process's member is not final; once it is
/// (Dead, missing) the placements lapse with it.
pub(super) async fn renew(inner: Weak<Inner>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(inner) = inner.upgrade() else { return };
        let placement = CassandraObjectPlacement { inner };
        if let Some((server, health)) = placement.inner.storage.fenced()
            && health.is_final()
        {
            warn!(%server, ?health, "member is final: its placements are no longer renewed");
            return;
        }
        let (renewed, failed) = placement.renew_all().await;
        debug!(renewed, failed, "placements renewed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cassandra_membership::{CassandraClusteringOptions, MembershipOptions};

    fn options(ttl: Duration) -> CassandraClusteringOptions {
        let mut m = MembershipOptions::default();
        m.defunct_silo_expiration = ttl;
        m.i_am_alive_table_publish_timeout = Duration::from_secs(1);
        CassandraClusteringOptions::default()
            .ttl(true)
            .membership(m)
    }

    const NOW: i64 = 1_700_000_000;

    #[test]
    fn placements_outlive_the_entry_by_gone_after_and_two_renewal_intervals() {
        // TTL 5 s: renewal 1 s, entries written with 7 s; gone after 3 s: placements 12 s.
        let o = options(Duration::from_secs(5));
        assert_eq!(o.write_ttl_seconds(), 7);
        assert_eq!(placement_ttl_seconds(&o, Duration::from_secs(3), NOW), 12);
        assert_eq!(
            placement_ttl_seconds(&o, Duration::from_millis(2500), NOW),
            12,
            "whole seconds, rounded up"
        );
        // Defaults (7 d, gone after 90 s): 7 d + 3 × 16.8 h + 90 s + 1 s.
        let o = options(Duration::from_secs(7 * 86_400));
        assert_eq!(
            placement_ttl_seconds(&o, Duration::from_secs(90), NOW),
            7 * 86_400 + 3 * 60_480 + 91
        );
    }

    #[test]
    fn no_expiry_means_ttl_zero_and_limits_are_kept() {
        let mut o = options(Duration::from_secs(5));
        o.ttl = false;
        assert_eq!(placement_ttl_seconds(&o, Duration::from_secs(3), NOW), 0);
        let o = options(Duration::from_secs(7 * 86_400));
        assert_eq!(
            placement_ttl_seconds(
                &o,
                Duration::from_secs(3),
                EXPIRY_HORIZON_UNIX_SECONDS - 100
            ),
            100,
            "never past the 2038 horizon"
        );
    }
}

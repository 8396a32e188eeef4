//! How placements expire with their server: the TTL of their rows and their renewal.

use std::sync::Weak;
use std::time::Duration;

use cassandra_membership::{EXPIRY_HORIZON_UNIX_SECONDS, MAX_TTL_SECONDS, Timestamp};
use scylla::value::CqlTimestamp;
use tracing::{debug, warn};

use super::bind::MoveValues;
use super::{CassandraObjectPlacement, Inner, object_name};
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

impl CassandraObjectPlacement {
    /// Rewrites every placement this value made with a fresh TTL, conditionally on its server
    /// still holding it; a placement lost meanwhile is forgotten. Returns how many it renewed.
    #[tracing::instrument(skip(self), fields(cluster = %self.inner.cluster_id), err)]
    pub(crate) async fn renew_all(&self) -> RioStoreResult<usize> {
        let placed: Vec<((String, String), (String, Timestamp))> = self
            .placed()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut renewed = 0;
        for ((kind, id), (server, at)) in placed {
            let values = MoveValues {
                service_id: &self.inner.service_id,
                cluster_id: &self.inner.cluster_id,
                object_kind: &kind,
                object_id: &id,
                server: &server,
                placed_at: CqlTimestamp(at.as_millis()),
                previous: Some(&server),
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
                self.index(&kind, &id, &server).await?;
                renewed += 1;
            } else {
                debug!(object = %object_name(&kind, &id), "placement lost meanwhile: no longer renewed");
                {
                    let key = (kind.clone(), id.clone());
                    let mut p = self.placed();
                    if p.get(&key).is_some_and(|(s, _)| *s == server) {
                        p.remove(&key);
                    }
                }
                self.unindex(&kind, &id, &server).await.ok();
            }
        }
        Ok(renewed)
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
        let started = tokio::time::Instant::now();
        match placement.renew_all().await {
            Ok(n) => {
                *placement
                    .inner
                    .renewed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = started;
                debug!(renewed = n, "placements renewed");
            }
            // Retried at the next interval: the rows carry one interval of margin.
            Err(e) => warn!(error = %e.chain(), "placement renewal failed"),
        }
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

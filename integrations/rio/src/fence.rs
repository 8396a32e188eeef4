//! Fencing a rio server: when its membership lease is at risk it serves no object (the
//! placement store refuses, see [`CassandraObjectPlacement`](crate::CassandraObjectPlacement));
//! when its entry is Dead or gone, [`FencedClusterProvider`] ends the server's `run`.

use std::net::SocketAddr;
use std::time::Duration;

use async_trait::async_trait;
use rio_rs::cluster::membership_protocol::ClusterProvider;
use rio_rs::errors::ClusterProviderServeError;
use tokio::time::Instant;
use tracing::warn;

use crate::CassandraMembershipStorage;

/// When a server must stop serving: the earlier of the storage lease's `refresh_by` and the
/// moment the others may take it for gone (`gone_after` after the start of its last successful
/// heartbeat) less one heartbeat period. Pure: driven by the times it is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FenceHorizon {
    published: Instant,
    refresh_by: Option<Instant>,
    serve_for: Duration,
}

impl FenceHorizon {
    /// `published`: when the last write that stored this server's I-am-alive started.
    pub(crate) fn new(published: Instant, period: Duration, gone_after: Duration) -> Self {
        FenceHorizon {
            published,
            refresh_by: None,
            // One period of margin: a healthy server's next heartbeat starts one period after the
            // last and is bounded by half a period, so it lands half a period before this.
            serve_for: gone_after.saturating_sub(period),
        }
    }

    /// A heartbeat that started at `started` stored the I-am-alive; its lease must be renewed
    /// by `refresh_by` (monotonic; `None` without storage expiry).
    pub(crate) fn published(&mut self, started: Instant, refresh_by: Option<Instant>) {
        self.published = self.published.max(started);
        self.refresh_by = refresh_by;
    }

    /// When the last write that stored this server's I-am-alive started.
    pub(crate) fn last_published(&self) -> Instant {
        self.published
    }

    /// The instant from which the server must not serve.
    pub(crate) fn horizon(&self) -> Instant {
        let detection = self.published + self.serve_for;
        self.refresh_by.map_or(detection, |r| r.min(detection))
    }

    pub(crate) fn at_risk(&self, now: Instant) -> bool {
        now >= self.horizon()
    }
}

/// rio's cluster provider (normally `PeerToPeerClusterProvider`) with the server's fence: its
/// `serve` ends — and with it rio's `Server::run`, which then stops accepting connections and
/// aborts the ones it has — as soon as this server's membership entry is Dead or missing
/// ([`SiloHealth::is_final`](cassandra_membership::SiloHealth::is_final)). The server does not
/// rejoin: its process should exit, and a new one joins as a new incarnation.
///
/// While the entry is only at risk (`LeaseAtRisk`) the server keeps running and the placement
/// store refuses every object until the heartbeat is `Healthy` again.
///
/// ```no_run
/// # use cassandra_membership_rio::{CassandraMembershipStorage, FencedClusterProvider};
/// # use rio_rs::prelude::*;
/// # fn f(storage: CassandraMembershipStorage) {
/// let provider = FencedClusterProvider::new(
///     PeerToPeerClusterProvider::builder().members_storage(storage).build(),
/// );
/// # drop(provider); }
/// ```
#[derive(Clone, Debug)]
pub struct FencedClusterProvider<C> {
    inner: C,
}

impl<C> FencedClusterProvider<C> {
    /// Wraps `inner`, whose members storage must be the server's [`CassandraMembershipStorage`].
    pub fn new(inner: C) -> Self {
        FencedClusterProvider { inner }
    }

    /// The wrapped provider.
    pub fn inner(&self) -> &C {
        &self.inner
    }
}

#[async_trait]
impl<C> ClusterProvider<CassandraMembershipStorage> for FencedClusterProvider<C>
where
    C: ClusterProvider<CassandraMembershipStorage> + Clone + Send + Sync,
{
    fn members_storage(&self) -> &CassandraMembershipStorage {
        self.inner.members_storage()
    }

    async fn serve(&self, address: &str) -> Result<(), ClusterProviderServeError> {
        let endpoint: SocketAddr = address
            .parse()
            .map_err(|_| ClusterProviderServeError::SocketAddrParsingError)?;
        let storage = self.inner.members_storage().clone();
        tokio::select! {
            served = self.inner.serve(address) => served,
            health = storage.wait_final(endpoint) => {
                // Ok, not an error: rio's `run` aborts its tasks (listener, connections) only
                // when a task ends without error.
                warn!(server = %endpoint, ?health, "membership entry is final: stopping the server");
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Duration = Duration::from_secs(1);

    #[test]
    fn the_horizon_is_one_period_before_the_others_may_take_the_server_for_gone() {
        let t0 = Instant::now();
        let mut f = FenceHorizon::new(t0, P, 3 * P);
        assert_eq!(f.horizon(), t0 + 2 * P);
        assert!(!f.at_risk(t0 + 2 * P - Duration::from_millis(1)));
        assert!(f.at_risk(t0 + 2 * P));
        f.published(t0 + P, None);
        assert_eq!(f.horizon(), t0 + 3 * P, "a heartbeat moves it");
        f.published(t0, None);
        assert_eq!(
            f.horizon(),
            t0 + 3 * P,
            "an older start never moves it back"
        );
    }

    #[test]
    fn a_lease_that_must_be_renewed_sooner_fences_sooner() {
        let t0 = Instant::now();
        let mut f = FenceHorizon::new(t0, P, 3 * P);
        f.published(t0, Some(t0 + P));
        assert_eq!(f.horizon(), t0 + P);
        f.published(t0, Some(t0 + 10 * P));
        assert_eq!(f.horizon(), t0 + 2 * P);
    }

    #[test]
    fn a_healthy_heartbeat_lands_before_the_horizon() {
        // Heartbeats start one period apart and are bounded by half a period.
        let t0 = Instant::now();
        let f = FenceHorizon::new(t0, P, 3 * P);
        let next_lands_by = t0 + P + P / 2;
        assert!(!f.at_risk(next_lands_by));
    }
}

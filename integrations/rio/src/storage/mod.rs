//! [`CassandraMembershipStorage`]: rio's `MembershipStorage` on a membership table.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, ClusterView, ClusterWatcher,
    MembershipEntry, MembershipError, MembershipTable, Result, SiloAddress, SiloHealth, SiloStatus,
    SuspectTime, Timestamp,
};
use chrono::{DateTime, Utc};
use rio_rs::cluster::storage::Member;
use scylla::client::session::Session;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

mod lease;
mod rio;

use self::lease::keep_lease;
use crate::RioStorageOptions;
use crate::mapping::{self, endpoint, live_row, next_generation, older_incarnations, status_for};

/// rio's [`MembershipStorage`](rio_rs::cluster::storage::MembershipStorage) on a [`MembershipTable`] — normally a [`CassandraMembershipTable`].
///
/// Clones share one table value and one set of leases. A member pushed through a value is kept
/// alive (its I-am-alive published every [`RioStorageOptions::heartbeat_period`]) until it is
/// removed or every clone of the value is dropped; see the crate docs for the whole mapping.
#[derive(Clone)]
pub struct CassandraMembershipStorage {
    inner: Arc<Inner>,
}

struct Inner {
    table: Arc<dyn MembershipTable>,
    options: RioStorageOptions,
    /// The members this value pushed and keeps alive, by endpoint.
    own: Mutex<HashMap<SocketAddr, Own>>,
    /// The health of each member this value pushed (final states stay until a new push or a
    /// `remove` of that endpoint): what fences the server.
    health: watch::Sender<BTreeMap<SocketAddr, SiloHealth>>,
    /// Each serving member's fence horizon (monotonic): [`CassandraMembershipStorage::fenced`]
    /// compares it with the clock when asked, so a process resumed after a pause past it is
    /// fenced before its keeper task has run and written the health.
    serve_until: Mutex<HashMap<SocketAddr, tokio::time::Instant>>,
    /// The session and options when the table is a [`CassandraMembershipTable`]: the placement
    /// and state stores share them.
    cassandra: Option<(Arc<Session>, CassandraClusteringOptions)>,
    /// The cluster view `members()` refreshes (one read per call, as rio expects it fresh) and
    /// hosts follow; it reads nothing by itself: rio's provider lists the members every round.
    watcher: ClusterWatcher,
}

struct Own {
    address: SiloAddress,
    keeper: JoinHandle<()>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The last clone is gone: so is the server that pushed these members.
        if let Ok(own) = self.own.get_mut() {
            for (_, o) in own.drain() {
                o.keeper.abort();
            }
        }
    }
}

impl fmt::Debug for CassandraMembershipStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CassandraMembershipStorage")
            .field("cluster_id", &self.inner.table.cluster_id())
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

/// What a conditional change of a member's entry did.
#[derive(Debug, PartialEq, Eq)]
enum Change {
    Written,
    /// The entry already said what the change would write.
    Unchanged,
    /// No incarnation at that endpoint is live (none, Dead, or gone).
    NoLiveEntry,
}

impl CassandraMembershipStorage {
    /// Connects to Cassandra with `options`, creates what is missing (keyspace only if
    /// `create_keyspace_with_replication` says so, table, version) and returns the storage of
    /// `options.cluster_id`. Heartbeat period and missed-heartbeat limit come from
    /// `options.membership` ([`RioStorageOptions::from_membership`]).
    pub async fn connect(options: CassandraClusteringOptions) -> Result<Self> {
        let rio = RioStorageOptions::from_membership(&options.membership);
        let table = CassandraMembershipTable::connect(options).await?;
        Self::with_cassandra_table(table, rio).await
    }

    /// The storage on a [`CassandraMembershipTable`] the host built (e.g. with
    /// [`CassandraMembershipTable::with_session`]): like [`CassandraMembershipStorage::with_table`],
    /// and the placement and state stores can then share its session.
    pub async fn with_cassandra_table(
        table: CassandraMembershipTable,
        options: RioStorageOptions,
    ) -> Result<Self> {
        let cassandra = Some((Arc::clone(table.session()), table.options().clone()));
        Self::build(Arc::new(table), options, cassandra).await
    }

    /// The storage on a wrapper of `cassandra` (a fault-injecting table in tests, a host's
    /// instrumented table): rio's members go through `table`, and the placement and state
    /// stores use `cassandra`'s session and options. Both must be the same table
    /// ([`MembershipTable::identity`]), or this is `InvalidConfiguration`.
    pub async fn with_wrapped_table(
        table: Arc<dyn MembershipTable>,
        cassandra: &CassandraMembershipTable,
        options: RioStorageOptions,
    ) -> Result<Self> {
        if table.identity() != cassandra.identity() {
            return Err(MembershipError::InvalidConfiguration {
                option: "table".to_owned(),
                reason: format!(
                    "wraps {}, not the Cassandra table {}",
                    table.identity(),
                    cassandra.identity()
                ),
            });
        }
        let stores = Some((Arc::clone(cassandra.session()), cassandra.options().clone()));
        Self::build(table, options, stores).await
    }

    /// The storage on a table the host already has (any backend, e.g. the in-memory table in a
    /// host's own tests). Validates `options` and initializes the table (idempotent).
    pub async fn with_table(
        table: Arc<dyn MembershipTable>,
        options: RioStorageOptions,
    ) -> Result<Self> {
        Self::build(table, options, None).await
    }

    async fn build(
        table: Arc<dyn MembershipTable>,
        options: RioStorageOptions,
        cassandra: Option<(Arc<Session>, CassandraClusteringOptions)>,
    ) -> Result<Self> {
        options.validate()?;
        options.validate_against_ttl(table.storage_expiry().ttl)?;
        table.initialize(true).await?;
        let watcher = ClusterWatcher::on_demand(Arc::clone(&table), None).await?;
        Ok(CassandraMembershipStorage {
            inner: Arc::new(Inner {
                table,
                watcher,
                options,
                own: Mutex::default(),
                health: watch::Sender::new(BTreeMap::new()),
                serve_until: Mutex::default(),
                cassandra,
            }),
        })
    }

    /// The session and options of the Cassandra table, if the storage is on one.
    pub(crate) fn cassandra(&self) -> Option<&(Arc<Session>, CassandraClusteringOptions)> {
        self.inner.cassandra.as_ref()
    }

    /// The adapter's options.
    pub fn options(&self) -> &RioStorageOptions {
        &self.inner.options
    }

    /// The membership health of the member this value pushed at `ip:port` (`None` if it pushed
    /// none there, or removed it): `Starting` after the push, `Healthy` after each heartbeat,
    /// `Failing` / `LeaseAtRisk` while heartbeats fail, `DeclaredDead` / `EntryMissing` (final)
    /// once its entry is Dead or gone. See the crate docs (Fencing).
    pub fn health(&self, ip: &str, port: &str) -> Option<SiloHealth> {
        let ep = endpoint(ip, port).ok()?;
        self.inner.health.borrow().get(&ep).cloned()
    }

    /// The cluster as this value last read it (every `members()` call reads it anew; nothing
    /// else does, so it is as fresh as the last `members()`): a watch of
    /// [`ClusterView`]s, one committed table version each, never going back; it wakes on changes
    /// of membership or staleness. The core crate's view, with every entry (statuses, suspicions,
    /// I-am-alive times) rather than rio's `Member`s.
    pub fn view(&self) -> watch::Receiver<ClusterView> {
        self.inner.watcher.view()
    }

    /// [`CassandraMembershipStorage::view`] as a stream: the current view, then each change.
    pub fn views(&self) -> impl tokio_stream::Stream<Item = ClusterView> + Send + Unpin + 'static {
        self.inner.watcher.views()
    }

    /// Every change of the members' health, by endpoint.
    pub fn watch_health(&self) -> watch::Receiver<BTreeMap<SocketAddr, SiloHealth>> {
        self.inner.health.subscribe()
    }

    /// `None` while every member this value pushed may serve; otherwise one that may not, with
    /// its health. A process that pushed nothing (a client, or a server before its provider
    /// pushed it) is not fenced.
    ///
    /// Decided when asked: a member whose fence horizon has passed is fenced even if its keeper
    /// has not run since (a process resumed after a pause), with the health `LeaseAtRisk`.
    pub fn fenced(&self) -> Option<(SocketAddr, SiloHealth)> {
        lease::fenced(&self.inner, tokio::time::Instant::now())
    }

    /// Waits until the member this value pushed at `ep` is final (Dead, missing) and returns
    /// that health; pending while it has none or serves.
    pub(crate) async fn wait_final(&self, ep: SocketAddr) -> SiloHealth {
        let mut rx = self.inner.health.subscribe();
        let health = rx
            .wait_for(|m| m.get(&ep).is_some_and(SiloHealth::is_final))
            .await
            .map(|m| m.get(&ep).cloned().unwrap_or(SiloHealth::Stopped));
        match health {
            Ok(h) => h,
            // The sender lives in `Inner`, which this value keeps alive.
            Err(_) => std::future::pending().await,
        }
    }

    /// True while a process may still be serving as `ep`: some incarnation there, whatever its
    /// status, stored an I-am-alive less than `gone_after` ago. rio's "inactive" (two failed
    /// pings) and even Dead (written by a peer, seen by the server only at its next heartbeat)
    /// do not stop a server that still heartbeats; its fence does, one period before it is gone
    /// (see the crate docs, Fencing). One read, not retried: a caller deciding on a takeover
    /// gives up rather than stall.
    pub(crate) async fn may_be_serving(&self, ep: SocketAddr) -> Result<bool> {
        let snapshot = self.inner.table.read_all().await?;
        let now = Timestamp::now();
        Ok(snapshot.rows.iter().any(|r| {
            r.entry.address.endpoint() == ep && !mapping::is_gone(&r.entry, now, self.gone_after())
        }))
    }

    /// True when this value pushed a member at `ep` (this process is that server).
    pub(crate) fn is_own(&self, ep: SocketAddr) -> bool {
        self.own().contains_key(&ep)
    }

    /// The table the members live in.
    pub fn table(&self) -> &Arc<dyn MembershipTable> {
        &self.inner.table
    }

    /// The incarnation (address and generation) this value keeps alive for `ip:port`, if it
    /// pushed one.
    pub fn incarnation(&self, ip: &str, port: &str) -> Option<SiloAddress> {
        let ep = endpoint(ip, port).ok()?;
        self.own().get(&ep).map(|o| o.address)
    }

    fn own(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, Own>> {
        // A panic while holding this lock cannot leave the map inconsistent (single inserts/removes).
        self.inner.own.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn gone_after(&self) -> Duration {
        self.inner.options.gone_after()
    }

    /// Who a failure notice names as suspecting silo: the member this value pushed (the server
    /// itself), or `0.0.0.0:0@0` when it pushed none (rio's failure notices carry no sender).
    fn observer(&self) -> SiloAddress {
        self.own()
            .values()
            .map(|o| o.address)
            .min()
            .unwrap_or(SiloAddress::from_v4(
                SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0),
                0,
            ))
    }

    async fn backoff(attempt: u32) {
        // Jitter so that servers that lost the same race do not collide again.
        let jitter = u64::from(jitter_percent() % 20);
        let ms = 10u64.saturating_mul(u64::from(attempt.min(10))) + jitter;
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    fn contention(&self, operation: &'static str, started: Instant) -> MembershipError {
        MembershipError::Contention {
            operation,
            attempts: self.inner.options.write_attempts,
            elapsed: started.elapsed(),
        }
    }

    /// Runs `step` until it succeeds, fails for good, or transient failures (see
    /// [`MembershipError::is_transient`]) and unknown outcomes have lasted
    /// [`RioStorageOptions::retry_for`]: rio stops a server's membership loop on any storage
    /// error, so a timeout, a node restart or a burst of lost races must not reach it. Each step
    /// is safe to repeat, an unknown outcome included: it re-reads the table and writes
    /// conditionally on what it read (a write that did apply is recognised on the re-read).
    async fn retrying<T, F, Fut>(&self, operation: &'static str, mut step: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let started = Instant::now();
        let budget = self.inner.options.retry_for;
        let mut delay = Duration::from_millis(50);
        loop {
            match step().await {
                Err(e) if e.is_transient() || e.is_outcome_unknown() => {
                    // Full jitter in [delay/2, delay]: servers that failed together spread out.
                    let wait = delay / 2 + delay.mul_f64(f64::from(jitter_percent()) / 200.0);
                    if started.elapsed() + wait >= budget {
                        warn!(operation, error = %e, elapsed = ?started.elapsed(), "transient failure lasted the whole retry budget: reporting it to rio");
                        return Err(e);
                    }
                    debug!(operation, error = %e, ?wait, "transient failure: retrying");
                    tokio::time::sleep(wait).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
                other => return other,
            }
        }
    }

    /// Applies `change` to the live incarnation at `ep`, conditionally on what was read, retrying
    /// when another writer was first. `change` returns `None` when the entry already holds what
    /// it would write: that is also how a write whose outcome was unknown is recognised on the
    /// re-read.
    async fn change(
        &self,
        operation: &'static str,
        ep: SocketAddr,
        change: impl Fn(&MembershipEntry) -> Option<MembershipEntry>,
    ) -> Result<Change> {
        let table = &self.inner.table;
        let started = Instant::now();
        for attempt in 1..=self.inner.options.write_attempts {
            let snapshot = table.read_all().await?;
            let Some(row) = live_row(&snapshot, ep, Timestamp::now(), self.gone_after()) else {
                return Ok(Change::NoLiveEntry);
            };
            let Some(new) = change(&row.entry) else {
                return Ok(Change::Unchanged);
            };
            match table
                .update_row(&new, &row.etag, &snapshot.version.next())
                .await
            {
                Ok(true) => return Ok(Change::Written),
                Ok(false) => Self::backoff(attempt).await,
                Err(e) if e.is_outcome_unknown() => {
                    warn!(operation, error = %e, "re-reading to learn the outcome")
                }
                Err(e) => return Err(e),
            }
        }
        Err(self.contention(operation, started))
    }

    /// `push`: a new incarnation of the endpoint, then the older ones declared Dead.
    #[tracing::instrument(skip(self), fields(cluster = self.inner.table.cluster_id()), err)]
    async fn push_member(&self, ep: SocketAddr, active: bool) -> Result<SiloAddress> {
        // Retried step by step: a repeated insert would start yet another incarnation. The
        // fence counts from before the insert that stored the first I-am-alive.
        let published = tokio::time::Instant::now();
        let address = self
            .retrying("push", || self.insert_incarnation(ep, status_for(active)))
            .await?;
        self.keep_alive(address, published);
        self.retrying("push", || self.retire_older(address)).await?;
        info!(%address, "member pushed");
        Ok(address)
    }

    async fn insert_incarnation(&self, ep: SocketAddr, status: SiloStatus) -> Result<SiloAddress> {
        let table = &self.inner.table;
        let started = Instant::now();
        for attempt in 1..=self.inner.options.write_attempts {
            let snapshot = table.read_all().await?;
            let now = Timestamp::now();
            let address = SiloAddress::new(ep, next_generation(&snapshot, ep, now))?;
            let mut entry = MembershipEntry::new(address, status, now);
            entry.host_name = ep.ip().to_string();
            entry.role_name = "rio".to_owned();
            match table.insert_row(&entry, &snapshot.version.next()).await {
                Ok(true) => return Ok(address),
                Ok(false) => Self::backoff(attempt).await,
                Err(e) if e.is_outcome_unknown() => {
                    // The generation is new, so its row exists exactly when this insert applied.
                    if !table.read_row(&address).await?.rows.is_empty() {
                        return Ok(address);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Err(self.contention("push", started))
    }

    async fn retire_older(&self, current: SiloAddress) -> Result<()> {
        let table = &self.inner.table;
        let started = Instant::now();
        for attempt in 1..=self.inner.options.write_attempts {
            let snapshot = table.read_all().await?;
            let Some(old) = older_incarnations(&snapshot, current).into_iter().next() else {
                return Ok(());
            };
            let mut dead = old.entry.clone();
            dead.status = SiloStatus::Dead;
            match table
                .update_row(&dead, &old.etag, &snapshot.version.next())
                .await
            {
                Ok(true) => info!(address = %dead.address, "older incarnation declared Dead"),
                Ok(false) => Self::backoff(attempt).await,
                Err(e) if e.is_outcome_unknown() => {
                    warn!(error = %e, "re-reading to learn the outcome")
                }
                Err(e) => return Err(e),
            }
        }
        Err(self.contention("push", started))
    }

    /// Starts (or restarts) renewing `address`'s lease from this process.
    fn keep_alive(&self, address: SiloAddress, published: tokio::time::Instant) {
        let o = &self.inner.options;
        let horizon =
            crate::fence::FenceHorizon::new(published, o.heartbeat_period, o.gone_after());
        lease::serve_until(&self.inner, address.endpoint(), Some(horizon.horizon()));
        let keeper = tokio::spawn(keep_lease(Arc::downgrade(&self.inner), address, published));
        let mut own = self.own();
        if let Some(old) = own.insert(address.endpoint(), Own { address, keeper }) {
            old.keeper.abort();
        }
        self.inner.health.send_modify(|m| {
            m.insert(address.endpoint(), SiloHealth::Starting);
        });
    }

    /// `remove`: every incarnation of the endpoint that is not Dead yet is declared Dead (the
    /// table has no unversioned delete of one entry; Dead is Orleans' "left for good").
    #[tracing::instrument(skip(self), fields(cluster = self.inner.table.cluster_id()), err)]
    async fn remove_member(&self, ep: SocketAddr) -> Result<usize> {
        if let Some(o) = self.own().remove(&ep) {
            o.keeper.abort();
        }
        lease::serve_until(&self.inner, ep, None);
        self.inner
            .health
            .send_if_modified(|m| m.remove(&ep).is_some());
        self.retrying("remove", || self.retire_endpoint(ep)).await
    }

    async fn retire_endpoint(&self, ep: SocketAddr) -> Result<usize> {
        let table = &self.inner.table;
        let started = Instant::now();
        let mut removed = 0;
        for attempt in 1..=self.inner.options.write_attempts {
            let snapshot = table.read_all().await?;
            let Some(row) = snapshot
                .rows
                .iter()
                .find(|r| r.entry.address.endpoint() == ep && r.entry.status != SiloStatus::Dead)
            else {
                return Ok(removed);
            };
            let mut dead = row.entry.clone();
            dead.status = SiloStatus::Dead;
            match table
                .update_row(&dead, &row.etag, &snapshot.version.next())
                .await
            {
                Ok(true) => removed += 1,
                Ok(false) => Self::backoff(attempt).await,
                Err(e) if e.is_outcome_unknown() => {
                    warn!(error = %e, "re-reading to learn the outcome")
                }
                Err(e) => return Err(e),
            }
        }
        Err(self.contention("remove", started))
    }

    #[tracing::instrument(skip(self), fields(cluster = self.inner.table.cluster_id()), err)]
    async fn set_member_active(&self, ep: SocketAddr, active: bool) -> Result<()> {
        let status = status_for(active);
        let done = self
            .retrying("set_is_active", || {
                self.change("set_is_active", ep, |e| {
                    (e.status != status).then(|| MembershipEntry {
                        status,
                        ..e.clone()
                    })
                })
            })
            .await?;
        debug!(?done);
        Ok(())
    }

    #[tracing::instrument(skip(self), fields(cluster = self.inner.table.cluster_id()), err)]
    async fn record_failure(&self, ep: SocketAddr) -> Result<()> {
        let notice = SuspectTime {
            suspecting_silo: self.observer(),
            time: Timestamp::now(),
        };
        let kept = self.inner.options.failures_kept;
        let done = self
            .retrying("notify_failure", || {
                self.change("notify_failure", ep, |e| {
                    // Also how a retry after an unknown outcome recognises its own write.
                    if e.suspect_times.contains(&notice) {
                        return None;
                    }
                    let mut new = e.clone();
                    new.suspect_times.push(notice.clone());
                    let excess = new.suspect_times.len().saturating_sub(kept);
                    new.suspect_times.drain(..excess);
                    Some(new)
                })
            })
            .await?;
        if done == Change::NoLiveEntry {
            // Suspicions live on the suspected entry; without a live one there is nothing to
            // suspect, and writing would keep a gone server's row alive.
            debug!("no live entry at this address: failure not recorded");
        }
        Ok(())
    }

    #[tracing::instrument(skip(self), fields(cluster = self.inner.table.cluster_id()), err)]
    async fn failures_of(&self, ep: SocketAddr) -> Result<Vec<DateTime<Utc>>> {
        let snapshot = self
            .retrying("member_failures", || self.inner.table.read_all())
            .await?;
        Ok(live_row(&snapshot, ep, Timestamp::now(), self.gone_after())
            .map(|r| {
                r.entry
                    .suspect_times
                    .iter()
                    .map(|s| mapping::to_utc(s.time))
                    .collect()
            })
            .unwrap_or_default())
    }

    #[tracing::instrument(skip(self), fields(cluster = self.inner.table.cluster_id()), err)]
    async fn list_members(&self) -> Result<Vec<Member>> {
        let entries = match self
            .retrying("members", || self.inner.watcher.refresh())
            .await
        {
            Ok(view) => view.entries().to_vec(),
            // The cluster was deleted and created again: the watcher keeps the old cluster's
            // view (stale); rio is answered from the table as it is now.
            Err(MembershipError::TableVersionWentBack { from, to }) => {
                warn!(
                    from,
                    to,
                    "the cluster's version went back (deleted and created again): members read directly; the storage's view() stays stale"
                );
                let snapshot = self
                    .retrying("members", || self.inner.table.read_all())
                    .await?;
                snapshot.rows.into_iter().map(|r| r.entry).collect()
            }
            Err(e) => return Err(e),
        };
        self.check_own_rows(&entries).await;
        Ok(mapping::members(
            &entries,
            Timestamp::now(),
            self.gone_after(),
        ))
    }
}

/// 0..=99, from the clock's nanoseconds: enough to spread servers that failed at the same moment.
fn jitter_percent() -> u32 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos()
        % 100
}

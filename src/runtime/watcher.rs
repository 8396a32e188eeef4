//! A read-only follower of one cluster's table, for processes that are not silos: clients,
//! gateways, dashboards, request routers.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_stream::Stream;
use tracing::{debug, warn};

use crate::clock::{Clock, SystemClock};
use crate::error::{MembershipError, Result};
use crate::runtime::protocol::{bounded, instant_after};
use crate::runtime::view::{self, ClusterView, ViewPublisher};
use crate::table::MembershipTable;

/// How a [`ClusterWatcher`] reads. Durations are human-readable in serialized form (`"5s"`).
///
/// ```
/// use cassandra_membership::ClusterWatcherOptions;
/// let o: ClusterWatcherOptions = toml::from_str(r#"refresh_period = "5s""#).unwrap();
/// assert_eq!(o.refresh_period.as_secs(), 5);
/// assert_eq!(o.read_timeout, None);
/// o.validate().unwrap();
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ClusterWatcherOptions {
    /// How often the table is read: one `read_all` per period (its cost: `docs::costs`). A
    /// change shows in the view within one period plus one read. Default 30 s (a silo's publish
    /// period, so a watcher is as fresh as a silo's own view with the defaults).
    #[serde(with = "humantime_serde")]
    pub refresh_period: Duration,
    /// The bound on one read; a read that takes longer counts as failed. `None` (the default)
    /// means the table's `table_operation_timeout` (one publish period unless set).
    #[serde(with = "humantime_serde")]
    pub read_timeout: Option<Duration>,
}

impl Default for ClusterWatcherOptions {
    fn default() -> Self {
        ClusterWatcherOptions {
            refresh_period: Duration::from_secs(30),
            read_timeout: None,
        }
    }
}

impl ClusterWatcherOptions {
    /// Sets `refresh_period`.
    pub fn refresh_period(mut self, period: Duration) -> Self {
        self.refresh_period = period;
        self
    }

    /// Sets `read_timeout` (`None`: the table's `table_operation_timeout`).
    pub fn read_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.read_timeout = timeout;
        self
    }

    /// Checks the options: a refresh period of at least 10 ms, a read timeout above zero.
    pub fn validate(&self) -> Result<()> {
        if self.refresh_period < Duration::from_millis(10) {
            return Err(MembershipError::config(
                "refresh_period",
                "must be at least 10ms (one read of the whole table per period)",
            ));
        }
        if self.read_timeout == Some(Duration::ZERO) {
            return Err(MembershipError::config(
                "read_timeout",
                "must be above zero (or unset: the table's table_operation_timeout)",
            ));
        }
        Ok(())
    }
}

/// Follows one cluster's membership without being a member: reads the whole table every
/// refresh period and publishes each read as a [`ClusterView`] — the type a silo's
/// [`Silo::view`](crate::Silo::view) publishes, with the same guarantees (one committed version
/// per view, versions never going backwards).
///
/// It only reads (`read_all`, nothing else: it does not even `initialize`). When reads fail it
/// keeps the last view, marked [stale](ClusterView::stale) with the first failure's time (its
/// age is [`ClusterView::age`]), and goes on reading: the next read that succeeds replaces it.
/// It stops when dropped or [stopped](ClusterWatcher::stop); the watches and streams it gave
/// out then end, keeping their last view.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use cassandra_membership::{ClusterWatcher, ClusterWatcherOptions, InMemoryMembershipTable, Silo};
/// use tokio_stream::StreamExt;
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let table = Arc::new(InMemoryMembershipTable::new("my-cluster"));
/// let watcher = ClusterWatcher::start(
///     table.clone(),
///     ClusterWatcherOptions::default().refresh_period(Duration::from_millis(50)),
/// )
/// .await?;
/// let mut views = watcher.views();
/// assert_eq!(views.next().await.unwrap().entries().len(), 0);
/// let silo = Silo::join(table.clone(), "10.0.0.1:11111@1".parse()?).await?;
/// // The next refresh shows the new member.
/// let view = views.next().await.unwrap();
/// assert!(view.is_member(&silo.address()));
/// silo.leave().await?;
/// # Ok::<(), cassandra_membership::MembershipError>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
pub struct ClusterWatcher {
    view: watch::Receiver<ClusterView>,
    /// The background refresh; none for [`ClusterWatcher::on_demand`].
    task: Option<JoinHandle<()>>,
    follower: Arc<Follower>,
}

/// What the refresh task and [`ClusterWatcher::refresh`] share.
#[derive(Debug)]
struct Follower {
    table: Arc<dyn MembershipTable>,
    clock: Arc<dyn Clock>,
    timeout: Duration,
    publisher: ViewPublisher,
    /// When the last read started. Held through each read: reads never overlap, so a slower
    /// older read cannot follow a newer one (which would look like the version going back).
    last_read: tokio::sync::Mutex<Instant>,
}

impl Follower {
    async fn read(&self, last: &mut Instant) -> Result<ClusterView> {
        *last = Instant::now();
        let read_at = self.clock.now();
        let table = &self.table;
        match bounded("read_all", false, self.timeout, table.read_all()).await {
            Ok(snapshot) => {
                debug!(
                    cluster = table.cluster_id(),
                    version = snapshot.version.version,
                    "cluster view refreshed"
                );
                // A version older than the kept view's: the cluster was deleted (or expired)
                // and created again. The kept view stays, stale, and the caller is told — not
                // handed the old membership as if it were current.
                self.publisher.read(&snapshot, read_at)?;
                Ok(self.publisher.current())
            }
            Err(e) => {
                warn!(cluster = table.cluster_id(), error = %e, "cluster view refresh failed; keeping the last view, marked stale");
                self.publisher.failed(&e, self.clock.now());
                Err(e)
            }
        }
    }
}

impl ClusterWatcher {
    /// Validates `options`, reads the table once (bounded by the read timeout) and starts
    /// refreshing in the background. Fails when the options are invalid or the first read
    /// fails: there is no view to keep yet. Must be called within a tokio runtime.
    pub async fn start(
        table: Arc<dyn MembershipTable>,
        options: ClusterWatcherOptions,
    ) -> Result<ClusterWatcher> {
        Self::start_on(table, options, Arc::new(SystemClock)).await
    }

    /// [`ClusterWatcher::start`] on another clock (the views' read times and staleness).
    pub async fn start_on(
        table: Arc<dyn MembershipTable>,
        options: ClusterWatcherOptions,
        clock: Arc<dyn Clock>,
    ) -> Result<ClusterWatcher> {
        options.validate()?;
        let period = options.refresh_period;
        Self::begin(table, options.read_timeout, clock, Some(period)).await
    }

    /// A watcher that reads the table once now and then only when its owner calls
    /// [`ClusterWatcher::refresh`]: for a process that already polls at its own pace (the rio
    /// adapter's `members()`), whose reads it turns into the same watch of views without one
    /// read more. `read_timeout` as in [`ClusterWatcherOptions`].
    pub async fn on_demand(
        table: Arc<dyn MembershipTable>,
        read_timeout: Option<Duration>,
    ) -> Result<ClusterWatcher> {
        ClusterWatcherOptions::default()
            .read_timeout(read_timeout)
            .validate()?;
        Self::begin(table, read_timeout, Arc::new(SystemClock), None).await
    }

    async fn begin(
        table: Arc<dyn MembershipTable>,
        read_timeout: Option<Duration>,
        clock: Arc<dyn Clock>,
        period: Option<Duration>,
    ) -> Result<ClusterWatcher> {
        let timeout = read_timeout.unwrap_or_else(|| {
            table
                .membership_options()
                .effective_table_operation_timeout()
        });
        let read_at = clock.now();
        let started = Instant::now();
        let first = bounded("read_all", false, timeout, table.read_all()).await?;
        let follower = Arc::new(Follower {
            publisher: ViewPublisher::new(ClusterView::of(&first, read_at)),
            table,
            clock,
            timeout,
            last_read: tokio::sync::Mutex::new(started),
        });
        let view = follower.publisher.subscribe();
        let task = period.map(|period| {
            let follower = Arc::clone(&follower);
            tokio::spawn(async move {
                loop {
                    let due = instant_after(*follower.last_read.lock().await, period);
                    tokio::time::sleep_until(due).await;
                    let mut last = follower.last_read.lock().await;
                    // A refresh asked for meanwhile moved the schedule on.
                    if instant_after(*last, period) <= Instant::now() {
                        let _ = follower.read(&mut last).await;
                    }
                }
            })
        });
        Ok(ClusterWatcher {
            view,
            task,
            follower,
        })
    }

    /// Reads the table now, publishes the view (as a scheduled refresh would: the watch's
    /// receivers are told when it changed) and returns it; the next scheduled refresh comes one
    /// period after this one. A process that already polls at its own pace (rio's `members()`)
    /// calls this instead of reading the table itself, and the background refresh then reads
    /// only when it stops polling. A failed read marks the kept view stale and is returned; a
    /// read of an older table version (the cluster deleted and created again) marks it stale and
    /// returns [`MembershipError::TableVersionWentBack`]: start a new watcher for the new cluster.
    /// Reads of one watcher never overlap: this waits for one in flight.
    pub async fn refresh(&self) -> Result<ClusterView> {
        let mut last = self.follower.last_read.lock().await;
        self.follower.read(&mut last).await
    }

    /// A watch of the latest view: `borrow()` for the current one, `changed()` to wait for a
    /// change of membership or staleness. It ends (`changed()` errs) once the watcher stops.
    pub fn view(&self) -> watch::Receiver<ClusterView> {
        self.view.clone()
    }

    /// The latest view.
    pub fn current(&self) -> ClusterView {
        self.view.borrow().clone()
    }

    /// The views as a stream: the current one first, then each change (a slow consumer skips
    /// to the latest, as on the watch). It ends once the watcher stops.
    pub fn views(&self) -> impl Stream<Item = ClusterView> + Send + Unpin + 'static {
        view::stream_of(self.view.clone())
    }

    /// Stops refreshing and waits until the background task has ended.
    pub async fn stop(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for ClusterWatcher {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

//! What a process sees of its cluster: [`ClusterView`], one committed table version as read, and
//! the publisher that keeps a watch of it monotonic ([`ViewPublisher`]), shared by
//! [`Silo::view`](crate::Silo::view) and [`ClusterWatcher`](crate::ClusterWatcher).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_stream::Stream;
use tokio_stream::wrappers::WatchStream;

use crate::error::MembershipError;
use crate::model::Timestamp;
use crate::model::{MembershipEntry, MembershipSnapshot, SiloAddress, SiloStatus, TableVersion};
use crate::runtime::health::FailureCause;

/// The cluster's membership as one read saw it: every entry at one committed table version.
///
/// Immutable and cheap to clone (one reference count). A view is never a mix of two versions:
/// it is the result of one [`read_all`](crate::MembershipTable::read_all). On a watch from
/// [`Silo::view`](crate::Silo::view) or [`ClusterWatcher::view`](crate::ClusterWatcher::view) the
/// versions never go backwards.
///
/// The I-am-alive times are as fresh as the read ([`ClusterView::read_at`]); heartbeats do not
/// move the table version, so two views of one version may differ in them (and in entries that
/// defunct cleanup removed, which does not move the version either).
///
/// ```
/// use std::sync::Arc;
/// use cassandra_membership::{InMemoryMembershipTable, Silo};
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let table = Arc::new(InMemoryMembershipTable::new("my-cluster"));
/// let me = "10.0.0.1:11111@1".parse()?;
/// let silo = Silo::builder(table.clone(), me).proxy_port(30000).join().await?;
/// let view = silo.view().borrow().clone();
/// assert!(view.is_member(&me));
/// assert_eq!(view.active().count(), 1);
/// assert_eq!(view.gateways().next(), Some("10.0.0.1:30000".parse().unwrap()));
/// assert!(!view.is_stale());
/// silo.leave().await?;
/// # Ok::<(), cassandra_membership::MembershipError>(())
/// # }).unwrap();
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterView(Arc<ViewData>);

#[derive(Debug, PartialEq, Eq)]
struct ViewData {
    version: TableVersion,
    /// Ordered by address.
    entries: Vec<MembershipEntry>,
    read_at: Timestamp,
    stale: Option<Staleness>,
}

/// Why a view is no longer being refreshed: the reads since it failed (or found the table
/// version gone back: the cluster's data was deleted and created again).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Staleness {
    /// When the first refresh after the view's read failed (the reader's clock).
    pub since: Timestamp,
    /// How many refreshes failed in a row.
    pub failed_refreshes: u32,
    /// What kind of failure the last one was: an outage heals by itself.
    pub cause: FailureCause,
    /// The last error, as text.
    pub last_error: String,
}

impl ClusterView {
    /// The view of `snapshot`, read at `read_at`.
    /// No read yet: an empty view (version 0) marked stale by `error`, which the first read
    /// replaces.
    pub(crate) fn unread(error: &MembershipError, now: Timestamp) -> Self {
        let empty = MembershipSnapshot {
            rows: Vec::new(),
            version: crate::TableVersion::absent(),
        };
        ViewPublisher::marked(&ClusterView::of(&empty, now), error, now).1
    }

    pub(crate) fn of(snapshot: &MembershipSnapshot, read_at: Timestamp) -> Self {
        let mut entries: Vec<_> = snapshot.rows.iter().map(|r| r.entry.clone()).collect();
        entries.sort_by_key(|e| e.address);
        ClusterView(Arc::new(ViewData {
            version: snapshot.version.clone(),
            entries,
            read_at,
            stale: None,
        }))
    }

    /// The committed table version (number and tag) the view was read at.
    pub fn version(&self) -> &TableVersion {
        &self.0.version
    }

    /// Every entry of the cluster, whatever its status, ordered by address.
    pub fn entries(&self) -> &[MembershipEntry] {
        &self.0.entries
    }

    /// The entry of `address`, if the view holds one.
    pub fn get(&self, address: &SiloAddress) -> Option<&MembershipEntry> {
        let i = self
            .0
            .entries
            .binary_search_by_key(address, |e| e.address)
            .ok()?;
        self.0.entries.get(i)
    }

    /// The Active entries: the members that serve, ordered by address.
    pub fn active(&self) -> impl Iterator<Item = &MembershipEntry> {
        self.0
            .entries
            .iter()
            .filter(|e| e.status == SiloStatus::Active)
    }

    /// True when `address` has an Active entry.
    pub fn is_member(&self, address: &SiloAddress) -> bool {
        self.get(address)
            .is_some_and(|e| e.status == SiloStatus::Active)
    }

    /// True when `address`'s entry is in the view and Dead: the point after which another member
    /// may take over its work, since the fence made it stop serving before it could be declared
    /// dead ([`docs::sharding`](crate::docs::sharding)).
    ///
    /// An address without an entry is **not** dead here: `read_all` skips a row it cannot decode
    /// (a damaged row, a newer release's status), and such a silo may still be serving. A Dead
    /// entry stays in the table until the defunct cleanup removes it (the newest
    /// `max_defunct_silo_entries` are kept), long after every running silo's view showed it.
    pub fn is_dead(&self, address: &SiloAddress) -> bool {
        self.get(address)
            .is_some_and(|e| e.status == SiloStatus::Dead)
    }

    /// The gateways clients connect to, as Orleans' gateway list has them: the endpoint's IP
    /// with the proxy port of every Active entry that has one, ordered by silo address.
    pub fn gateways(&self) -> impl Iterator<Item = SocketAddr> {
        self.active()
            .filter(|e| e.proxy_port != 0)
            .map(|e| SocketAddr::new(e.address.endpoint().ip(), e.proxy_port))
    }

    /// When the read behind this view was made (the reader's clock).
    pub fn read_at(&self) -> Timestamp {
        self.0.read_at
    }

    /// How old the view is at `now`: the time since its read.
    pub fn age(&self, now: Timestamp) -> Duration {
        now.duration_since(self.0.read_at)
    }

    /// Why the view is no longer refreshed, when the refreshes since its read failed; `None`
    /// while they succeed.
    pub fn stale(&self) -> Option<&Staleness> {
        self.0.stale.as_ref()
    }

    /// True when the refreshes since this view's read failed ([`ClusterView::stale`]).
    pub fn is_stale(&self) -> bool {
        self.0.stale.is_some()
    }

    /// Equal but for the I-am-alive times and the read time: what a watcher is not told about.
    fn same_membership(&self, other: &ClusterView) -> bool {
        let d = (&self.0, &other.0);
        d.0.version == d.1.version
            && d.0.stale.is_some() == d.1.stale.is_some()
            && d.0.entries.len() == d.1.entries.len()
            && d.0.entries.iter().zip(&d.1.entries).all(|(a, b)| {
                a.i_am_alive_time == b.i_am_alive_time || {
                    let mut a = a.clone();
                    a.i_am_alive_time = b.i_am_alive_time;
                    a == *b
                }
            })
    }

    fn with_stale(&self, stale: Option<Staleness>) -> ClusterView {
        ClusterView(Arc::new(ViewData {
            version: self.0.version.clone(),
            entries: self.0.entries.clone(),
            read_at: self.0.read_at,
            stale,
        }))
    }
}

/// A stream of the views a watch receives: the current one first, then each change (intermediate
/// views a slow reader missed are skipped, as on the watch); it ends when the publisher stops.
pub(crate) fn stream_of(
    rx: watch::Receiver<ClusterView>,
) -> impl Stream<Item = ClusterView> + Send + Unpin + 'static {
    WatchStream::new(rx)
}

/// The sending side of a view watch: keeps it monotonic in the table version, and tells the
/// receivers only of changes in membership or staleness (a read that moved only I-am-alive
/// times replaces the value silently).
#[derive(Debug)]
pub(crate) struct ViewPublisher {
    tx: watch::Sender<ClusterView>,
}

impl ViewPublisher {
    pub(crate) fn new(first: ClusterView) -> Self {
        ViewPublisher {
            tx: watch::Sender::new(first),
        }
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<ClusterView> {
        self.tx.subscribe()
    }

    /// The view published last.
    pub(crate) fn current(&self) -> ClusterView {
        self.tx.borrow().clone()
    }

    /// A read of the whole table at `read_at`. An older version than the current view's is not
    /// published: the table version went back only if the cluster's data was deleted (or
    /// expired) and created again, which the kept view says by being marked stale.
    ///
    /// Returns the error when the version went back (the kept view is then stale).
    pub(crate) fn read(
        &self,
        snapshot: &MembershipSnapshot,
        read_at: Timestamp,
    ) -> std::result::Result<(), MembershipError> {
        let mut went_back = None;
        self.tx.send_if_modified(|current| {
            if snapshot.version.version < current.version().version {
                let error = MembershipError::TableVersionWentBack {
                    from: current.version().version,
                    to: snapshot.version.version,
                };
                let (changed, view) = Self::marked(current, &error, read_at);
                *current = view;
                went_back = Some(error);
                return changed;
            }
            let view = ClusterView::of(snapshot, read_at);
            let changed = !view.same_membership(current);
            *current = view;
            changed
        });
        went_back.map_or(Ok(()), Err)
    }

    /// A refresh that failed with `error` at `now`: the current view stays, marked stale.
    pub(crate) fn failed(&self, error: &MembershipError, now: Timestamp) {
        self.tx.send_if_modified(|current| {
            let (changed, view) = Self::marked(current, error, now);
            *current = view;
            changed
        });
    }

    /// `current` marked stale by `error`; true when it was fresh before (the receivers are
    /// told when a view turns stale, not of every failure after).
    fn marked(
        current: &ClusterView,
        error: &MembershipError,
        now: Timestamp,
    ) -> (bool, ClusterView) {
        let stale = match current.stale() {
            Some(s) => Staleness {
                failed_refreshes: s.failed_refreshes.saturating_add(1),
                cause: FailureCause::of(error),
                last_error: error.to_string(),
                since: s.since,
            },
            None => Staleness {
                since: now,
                failed_refreshes: 1,
                cause: FailureCause::of(error),
                last_error: error.to_string(),
            },
        };
        (!current.is_stale(), current.with_stale(Some(stale)))
    }
}

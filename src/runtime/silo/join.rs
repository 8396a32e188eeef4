//! The join: [`SiloBuilder`] and the steps of [`SiloBuilder::join`] — initialize, insert as
//! Joining, Active, the first view — within `max_join_attempt_time`.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::warn;

use super::Silo;
use crate::clock::Clock;
use crate::error::{MembershipError, Result};
use crate::model::{MembershipEntry, SiloStatus};
use crate::runtime::cleanup::DefunctCleanup;
use crate::runtime::heartbeat::Joined;
use crate::runtime::protocol::{self, ProtocolLimits, bounded};
use crate::runtime::view::ClusterView;
use crate::table::MembershipTable;

/// What a silo's entry says about it besides its address, and the clock it runs on: built by
/// [`Silo::builder`], ended by [`SiloBuilder::join`].
///
/// ```
/// use std::sync::Arc;
/// use cassandra_membership::{InMemoryMembershipTable, MembershipTable, Silo};
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let table = Arc::new(InMemoryMembershipTable::new("my-cluster"));
/// let address = "10.0.0.1:11111@1".parse()?;
/// let silo = Silo::builder(table.clone(), address)
///     .silo_name("silo-1")
///     .host_name("host-a")
///     .proxy_port(30000)
///     .role_name("frontend")
///     .fault_zone(2)
///     .join()
///     .await?;
/// let entry = &table.read_row(&address).await?.rows[0].entry;
/// assert_eq!((entry.silo_name.as_str(), entry.proxy_port), ("silo-1", 30000));
/// silo.leave().await?;
/// # Ok::<(), cassandra_membership::MembershipError>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
#[must_use = "a builder does nothing until `join` is awaited"]
pub struct SiloBuilder {
    pub(super) table: Arc<dyn MembershipTable>,
    pub(super) entry: MembershipEntry,
    pub(super) clock: Arc<dyn Clock>,
}

impl SiloBuilder {
    /// The silo's name (default empty).
    pub fn silo_name(mut self, name: impl Into<String>) -> Self {
        self.entry.silo_name = name.into();
        self
    }

    /// The host's name (default empty).
    pub fn host_name(mut self, name: impl Into<String>) -> Self {
        self.entry.host_name = name.into();
        self
    }

    /// The gateway (proxy) port clients connect to (default 0: none).
    pub fn proxy_port(mut self, port: u16) -> Self {
        self.entry.proxy_port = port;
        self
    }

    /// The silo's role name (default empty).
    pub fn role_name(mut self, name: impl Into<String>) -> Self {
        self.entry.role_name = name.into();
        self
    }

    /// The update zone (default 0).
    pub fn update_zone(mut self, zone: i32) -> Self {
        self.entry.update_zone = zone;
        self
    }

    /// The fault zone (default 0).
    pub fn fault_zone(mut self, zone: i32) -> Self {
        self.entry.fault_zone = zone;
        self
    }

    /// The clock the silo reads its times from (default [`SystemClock`](crate::SystemClock)); tests pass a
    /// [`TokioClock`](crate::TokioClock) under paused time or a [`ManualClock`](crate::ManualClock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Validates the table's membership options and attaches to this process's defunct
    /// cleanup of the table (starting it for the first silo; [`DefunctCleanup`] — refused when
    /// its options differ) before anything is written; then initializes the table,
    /// inserts the entry as Joining (its start and I-am-alive times the clock's now), moves it
    /// to Active, reads the whole table once for the first [view](Silo::view), and starts the
    /// heartbeat and the failure detector (every publish period; it also watches this silo's
    /// own row and refreshes the view). Conflicts, reads that give up and calls that time
    /// out are retried with jittered backoff; the whole join, calls in flight included, ends
    /// by `max_join_attempt_time`. A join that fails after its insert may have applied marks
    /// the entry Dead in the background (best effort). Cancelling the returned future
    /// (dropping it) skips that: an entry it inserted stays Joining until defunct cleanup or
    /// storage expiry removes it.
    pub async fn join(self) -> Result<Silo> {
        let SiloBuilder {
            table,
            mut entry,
            clock,
        } = self;
        let options = table.membership_options().clone();
        options.validate()?;
        entry.start_time = clock.now();
        // Shared with this process's other silos on the table; none when disabled.
        let cleanup = DefunctCleanup::spawn_for(
            Arc::clone(&table),
            &options,
            Arc::clone(&clock),
            entry.address,
        )?
        .ok();
        let limits = ProtocolLimits::from_options(&options);
        match Silo::enter(&table, entry, &clock, &limits).await {
            Ok((joined, view)) => Ok(Silo::start(
                table, joined, view, options, clock, cleanup, limits,
            )),
            Err(e) => {
                if let Some(c) = cleanup {
                    c.stop().await;
                }
                Err(e)
            }
        }
    }
}

impl Silo {
    async fn enter(
        table: &Arc<dyn MembershipTable>,
        mut entry: MembershipEntry,
        clock: &Arc<dyn Clock>,
        limits: &ProtocolLimits,
    ) -> Result<(Joined, ClusterView)> {
        // One deadline for every step: initialize, insert, Active.
        let deadline = protocol::deadline_after(limits.step_deadline);
        let t = limits.call_timeout;
        Self::initialize(table.as_ref(), t, deadline).await?;
        entry.status = SiloStatus::Joining;
        entry.i_am_alive_time = clock.now();
        if let Err(e) = protocol::join_until(table.as_ref(), &entry, t, deadline).await {
            // An insert whose outcome is unknown, or that timed out or was retried until the
            // deadline, may have applied (best effort, as below).
            if e.is_transient() || e.is_outcome_unknown() {
                Self::mark_dead_in_background(table, &entry, clock, limits);
            }
            return Err(e);
        }
        // The Active write stores this I-am-alive time (or a later one already stored): the
        // others' detection horizon counts from it, however long the step then retries.
        let (published_at, published_wall) = (Instant::now(), clock.now());
        let active = protocol::set_status_until(
            table.as_ref(),
            &entry.address,
            Some(entry.start_time),
            SiloStatus::Active,
            published_wall,
            t,
            deadline,
        )
        .await
        .and_then(|active| {
            // The row is Dead or gone: someone declared this incarnation dead meanwhile.
            active.then_some(()).ok_or(MembershipError::NotAMember {
                silo: entry.address.to_string(),
                state: "dead or missing",
            })
        });
        if let Err(e) = active {
            Self::mark_dead_in_background(table, &entry, clock, limits);
            return Err(e);
        }
        // The first view: the whole table once, as the detector reads it every period (one
        // statement per join), one attempt of one call: the entry is Active now and its
        // heartbeats start only after this, and a join that wrote Active is not failed (and its
        // entry not marked Dead) for a read. Unread, the view starts empty and stale; the first
        // detection round, within one period, publishes the first read.
        let read_at = clock.now();
        let view = match bounded("read_all", false, t, table.read_all()).await {
            Ok(snapshot) => ClusterView::of(&snapshot, read_at),
            Err(e) => {
                warn!(cluster = table.cluster_id(), error = %e, "the first view could not be read; the first detection round publishes it");
                ClusterView::unread(&e, clock.now())
            }
        };
        let joined = Joined {
            address: entry.address,
            published_at,
            published_wall,
            start_time: entry.start_time,
        };
        Ok((joined, view))
    }

    /// `initialize`, retried like the other steps until `deadline`.
    async fn initialize(
        table: &dyn MembershipTable,
        call_timeout: Duration,
        deadline: Instant,
    ) -> Result<()> {
        let mut round = 0u32;
        loop {
            let limit = call_timeout.min(deadline.saturating_duration_since(Instant::now()));
            match bounded("initialize", true, limit, table.initialize(true)).await {
                Err(e) if protocol::retriable(&e) && Instant::now() < deadline => {
                    warn!(cluster = table.cluster_id(), error = %e, "initialize failed; retrying");
                }
                r => return r,
            }
            round = round.saturating_add(1);
            protocol::pause(round, deadline).await;
        }
    }

    /// Nobody will heartbeat an entry whose join failed: say so rather than leave it Joining
    /// (best effort, only this incarnation's row). In the background, so the join returns by
    /// its deadline; bounded by `max_join_attempt_time` of its own.
    fn mark_dead_in_background(
        table: &Arc<dyn MembershipTable>,
        entry: &MembershipEntry,
        clock: &Arc<dyn Clock>,
        limits: &ProtocolLimits,
    ) {
        let (table, address, start, now, limits) = (
            Arc::clone(table),
            entry.address,
            entry.start_time,
            clock.now(),
            *limits,
        );
        crate::runtime::task::spawn(async move {
            let marked = protocol::set_status_until(
                table.as_ref(),
                &address,
                Some(start),
                SiloStatus::Dead,
                now,
                limits.call_timeout,
                protocol::deadline_after(limits.step_deadline),
            )
            .await;
            if let Err(e) = marked {
                warn!(cluster = table.cluster_id(), silo = %address, error = %e, "could not mark a failed join's entry Dead; defunct cleanup or expiry removes it");
            }
        });
    }
}

//! The heartbeat task: publishes I-am-alive when [`HeartbeatPlanner`] says, reads the own row
//! when it asks, and tells the host on a watch of [`SiloHealth`] when it must fence itself. The
//! decisions are the planner's (`planner.rs`); this file only runs them on tokio.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::clock::Clock;
use crate::error::MembershipError;
use crate::model::{SiloAddress, SiloStatus, Timestamp};
use crate::options::MembershipOptions;
use crate::runtime::health::{FailureCause, Fence, SiloHealth};
use crate::runtime::observe::{HealthChange, SiloMetrics};
use crate::runtime::planner::HeartbeatPlanner;
use crate::runtime::protocol::{bounded, deadline_after, instant_after};
use crate::runtime::{jitter, task};
use crate::table::MembershipTable;

/// What a successful join published: the heartbeat's fence horizon counts from it.
pub(crate) struct Joined {
    pub(crate) address: SiloAddress,
    /// When the I-am-alive time the join stored last was read (monotonic).
    pub(crate) published_at: Instant,
    pub(crate) published_wall: Timestamp,
    /// The incarnation's start time: a row at the address with another is not this silo's.
    pub(crate) start_time: Timestamp,
}

/// The sender of a silo's health watch, with the series its changes are recorded in.
#[derive(Debug)]
struct HealthSender {
    tx: watch::Sender<SiloHealth>,
    /// Until when the host may serve ([`Fence`]); `None` while fenced or stopped.
    serve_until: watch::Sender<Option<Instant>>,
    metrics: SiloMetrics,
}

/// Sends `health` unless the current state is final (final states stick) or unchanged.
fn publish(sender: &HealthSender, health: SiloHealth) {
    let mut change = None;
    sender.tx.send_if_modified(|current| {
        if current.is_final() || *current == health {
            return false;
        }
        change = Some(HealthChange::between(current, &health));
        *current = health;
        true
    });
    if let Some(change) = change {
        sender.metrics.health_changed(change);
        if sender.tx.borrow().is_final() {
            sender.metrics.stopped();
        }
    }
}

/// Hands what the failure detector read of this silo's own row to the heartbeat.
#[derive(Clone, Debug)]
pub(crate) struct OwnEntryReport {
    health: Arc<HealthSender>,
    unknown: Arc<watch::Sender<Option<FailureCause>>>,
    /// Until when the host may serve on the own row's last successful read ([`Fence`]).
    own_row_until: Arc<watch::Sender<Instant>>,
    /// How long a read of the own row vouches for it: the detection horizon.
    own_row_horizon: Duration,
}

impl OwnEntryReport {
    /// `status` is the own row's status in the detector's snapshot, `None` when it has none;
    /// `sent`: when that read was sent. Dead or missing ends the heartbeat (the watch turns
    /// final); anything else says the own row is known again, and vouches for it for one
    /// detection horizon from `sent`.
    pub(crate) fn own_entry(&self, status: Option<SiloStatus>, sent: Instant) {
        match status {
            None => publish(&self.health, SiloHealth::EntryMissing),
            Some(SiloStatus::Dead) => publish(&self.health, SiloHealth::DeclaredDead),
            Some(_) => {
                let until = instant_after(sent, self.own_row_horizon);
                self.own_row_until.send_if_modified(|u| {
                    let later = until > *u;
                    if later {
                        *u = until;
                    }
                    later
                });
                // A read answered after its own deadline (a pause between send and answer)
                // vouches for nothing now: the row stays unknown.
                if Instant::now() < *self.own_row_until.borrow() {
                    self.unknown.send_if_modified(|u| u.take().is_some());
                }
            }
        }
    }

    /// Until when the own row's last successful read vouches for it.
    pub(crate) fn own_row_until(&self) -> Instant {
        *self.own_row_until.borrow()
    }

    /// A watch that changes whenever a read moves [`OwnEntryReport::own_row_until`] on.
    pub(crate) fn own_row_moves(&self) -> watch::Receiver<Instant> {
        self.own_row_until.subscribe()
    }

    /// The detector could not read the own row for too long: the others may have declared this
    /// silo dead unseen, so the host must fence until a read succeeds again.
    /// `cause`: the kind of the detector's last failure.
    pub(crate) fn own_entry_unknown(&self, cause: FailureCause) {
        self.unknown
            .send_if_modified(|u| u.replace(cause) != Some(cause));
    }
}

/// A running heartbeat task.
#[derive(Debug)]
pub(crate) struct Heartbeat {
    health: watch::Receiver<SiloHealth>,
    health_tx: Arc<HealthSender>,
    unknown_tx: Arc<watch::Sender<Option<FailureCause>>>,
    own_row_until: Arc<watch::Sender<Instant>>,
    own_row_horizon: Duration,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Heartbeat {
    /// Starts heartbeating `joined.address` on `table`; the first heartbeat is immediate. The
    /// fence horizon counts from the join's publish, however long the join took afterwards.
    pub(crate) fn spawn(
        table: Arc<dyn MembershipTable>,
        joined: &Joined,
        options: &MembershipOptions,
        clock: Arc<dyn Clock>,
    ) -> Heartbeat {
        let (tx, health) = watch::channel(SiloHealth::Starting);
        let metrics = SiloMetrics::new(table.as_ref(), &joined.address);
        let planner = HeartbeatPlanner::new(options, Duration::ZERO)
            .with_published_wall(joined.published_wall);
        let serve_until = planner
            .serve_until()
            .map(|at| instant_after(joined.published_at, at));
        let health_tx = Arc::new(HealthSender {
            tx,
            serve_until: watch::channel(serve_until).0,
            metrics: metrics.clone(),
        });
        let (unknown_tx, unknown) = watch::channel(None);
        let unknown_tx = Arc::new(unknown_tx);
        // The join's read of the own row is the first to vouch for it.
        let own_row_horizon = options.detection_horizon();
        let own_row_until = Arc::new(watch::Sender::new(instant_after(
            joined.published_at,
            own_row_horizon,
        )));
        let (stop, stop_rx) = watch::channel(false);
        let task = HeartbeatTask {
            cluster: table.cluster_id().to_owned(),
            table,
            address: joined.address,
            start_time: joined.start_time,
            clock,
            call_timeout: options.effective_table_operation_timeout(),
            origin: joined.published_at,
            planner,
            announced: None,
            health: Arc::clone(&health_tx),
            final_rx: health_tx.tx.subscribe(),
            metrics,
            unknown,
            _keep_unknown: Arc::clone(&unknown_tx),
            stop: stop_rx,
        };
        Heartbeat {
            health,
            health_tx,
            unknown_tx,
            own_row_until,
            own_row_horizon,
            stop,
            task: task::spawn(task.run()),
        }
    }

    /// What the failure detector uses to report this silo's own row.
    pub(crate) fn own_entry_report(&self) -> OwnEntryReport {
        OwnEntryReport {
            health: Arc::clone(&self.health_tx),
            unknown: Arc::clone(&self.unknown_tx),
            own_row_until: Arc::clone(&self.own_row_until),
            own_row_horizon: self.own_row_horizon,
        }
    }

    /// A receiver of health changes.
    pub(crate) fn health(&self) -> watch::Receiver<SiloHealth> {
        self.health.clone()
    }

    /// Whether the host may serve, asked when it is about to.
    pub(crate) fn fence(&self) -> Fence {
        Fence {
            health: self.health.clone(),
            serve_until: self.health_tx.serve_until.subscribe(),
            unknown: self.unknown_tx.subscribe(),
            own_row_until: self.own_row_until.subscribe(),
        }
    }

    /// Stops the heartbeat and waits for it to finish (a heartbeat in flight answers first),
    /// until `deadline`: then it is aborted.
    pub(crate) async fn stop(mut self, deadline: tokio::time::Instant) {
        let _ = self.stop.send(true);
        if tokio::time::timeout_at(deadline, &mut self.task)
            .await
            .is_err()
        {
            self.task.abort();
        }
        publish(&self.health_tx, SiloHealth::Stopped);
    }

    /// Ends the task at once, as if the process had crashed (the health watch is left as it
    /// is; the silo's gauges go to 0).
    pub(crate) fn abort(self) {
        self.task.abort();
        // A crashed silo serves no more, whatever its last health said.
        self.health_tx.serve_until.send_replace(None);
        self.health_tx.metrics.stopped();
    }
}

/// What [`HeartbeatTask::watch`] waits for, and so what else it watches and what wins a tie.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// The next heartbeat's time: a stop, a final state or news of the own row come first, so
    /// no heartbeat starts after a stop.
    Idle,
    /// A heartbeat's answer: it comes first (an answer that arrived is never dropped), and the
    /// call counts as in flight.
    Publish,
    /// The own row read after the fence: only a stop interrupts it.
    OwnRow,
}

/// The heartbeat task's state: what it publishes for, the planner, and its channels.
struct HeartbeatTask {
    table: Arc<dyn MembershipTable>,
    cluster: String,
    address: SiloAddress,
    start_time: Timestamp,
    clock: Arc<dyn Clock>,
    call_timeout: Duration,
    /// The monotonic origin of the planner's times: when the join's publish was read.
    origin: Instant,
    planner: HeartbeatPlanner,
    /// The fence horizon already announced, so it is announced once.
    announced: Option<Duration>,
    health: Arc<HealthSender>,
    final_rx: watch::Receiver<SiloHealth>,
    metrics: SiloMetrics,
    unknown: watch::Receiver<Option<FailureCause>>,
    /// Held so `unknown` never closes (a closed watch would wake the task in a loop).
    _keep_unknown: Arc<watch::Sender<Option<FailureCause>>>,
    stop: watch::Receiver<bool>,
}

impl HeartbeatTask {
    async fn run(mut self) {
        let mut delay = Duration::ZERO;
        loop {
            let due = tokio::time::sleep_until(deadline_after(delay));
            if self.watch(due, Wait::Idle).await.is_none() {
                return;
            }
            let Some(health) = self.beat().await else {
                return;
            };
            let done = health.is_final();
            publish(&self.health, health);
            if done {
                return;
            }
            delay = self.planner.next_delay(self.mono(), jitter::unit());
        }
    }

    /// Now on the planner's monotonic line.
    fn mono(&self) -> Duration {
        self.origin.elapsed()
    }

    /// Hands the planner's serving deadline to the host's [`Fence`] at once, after every change
    /// of the planner's state — before the health is published, and before any further await
    /// (an own-row read): a fence is never lifted ahead of the health saying so, and a final
    /// `health` (the outcome just seen) ends serving before it is published.
    fn deadline_moved(&self, health: &SiloHealth) {
        let until = (self.planner.serve_until())
            .filter(|_| health.should_serve())
            .map(|at| instant_after(self.origin, at));
        self.health.serve_until.send_replace(until);
    }

    /// One heartbeat: publishes, reads the own row when the planner asks, records and logs the
    /// outcome; returns the health to show (`None`: stopped or final meanwhile).
    async fn beat(&mut self) -> Option<SiloHealth> {
        let (table, address) = (Arc::clone(&self.table), self.address);
        let started = self.mono();
        let wall_started = self.clock.now();
        let call = bounded(
            "update_i_am_alive",
            false,
            self.call_timeout,
            table.update_i_am_alive(&address, wall_started),
        );
        let outcome = self.watch(call, Wait::Publish).await?;
        let mut health = self
            .planner
            .on_outcome(started, wall_started, self.mono(), &outcome);
        self.deadline_moved(&health);
        if self.planner.awaiting_own_row() {
            let read = self.read_own_row().await?;
            health = self.planner.on_own_row(self.mono(), &read);
            self.deadline_moved(&health);
        }
        if !health.is_final() {
            health = self
                .planner
                .shown(self.mono(), false, *self.unknown.borrow());
        }
        self.metrics.heartbeat(&health, self.clock.now());
        self.log(&health);
        Some(health)
    }

    /// Published again after the fence: the others may have declared this silo dead meanwhile,
    /// which the heartbeat need not have seen, so the row is read before the fence is lifted
    /// (only on this recovery path: no extra round trip per heartbeat). The order matters:
    /// votes are conditioned on the heartbeat element, so once this publish is acknowledged a
    /// vote decided earlier can only still land if Paxos accepted it already, and this
    /// (serial) read completes such a vote before it answers ([`crate::docs::fencing`]).
    /// `None`: stopped.
    async fn read_own_row(&mut self) -> Option<Result<Option<SiloStatus>, MembershipError>> {
        let (table, address, start_time) = (Arc::clone(&self.table), self.address, self.start_time);
        let call = bounded(
            "read_row",
            false,
            self.call_timeout,
            table.read_row(&address),
        );
        let read = self.watch(call, Wait::OwnRow).await?.map(|s| {
            s.get(&address)
                .filter(|row| row.entry.start_time == start_time)
                .map(|row| row.entry.status)
        });
        debug!(cluster = %self.cluster, silo = %address, ?read, "own row read after the fence");
        Some(read)
    }

    /// Awaits `work` while watching for a stop (publishes `Stopped`), a final state, news of
    /// the own row and the fence horizon, as `wait` says; `None` when the task must end.
    async fn watch<F: Future>(&mut self, work: F, wait: Wait) -> Option<F::Output> {
        let work = pin!(work);
        let (mut first, mut last) = match wait {
            Wait::Publish => (Some(work), None),
            Wait::Idle | Wait::OwnRow => (None, Some(work)),
        };
        let in_flight = wait == Wait::Publish;
        let watching = wait != Wait::OwnRow;
        // Not `self.mono()`: a branch's output (the final watch's borrow) lives through the arms.
        let origin = self.origin;
        loop {
            let fence = self.planner.fence_at();
            tokio::select! {
                biased;
                r = in_slot(&mut first) => return Some(r),
                _ = self.stop.changed() => {
                    publish(&self.health, SiloHealth::Stopped);
                    return None;
                }
                _ = self.final_rx.wait_for(SiloHealth::is_final), if watching => return None,
                _ = self.unknown.changed(), if watching => {
                    let unknown = *self.unknown.borrow_and_update();
                    publish(&self.health, self.planner.shown(origin.elapsed(), in_flight, unknown));
                }
                r = in_slot(&mut last) => return Some(r),
                _ = tokio::time::sleep_until(instant_after(origin, fence)),
                    if watching && self.announced != Some(fence) =>
                {
                    self.announced = Some(fence);
                    let unknown = *self.unknown.borrow();
                    let health = self.planner.shown(origin.elapsed(), in_flight, unknown);
                    let (cluster, address) = (&self.cluster, self.address);
                    if in_flight {
                        warn!(%cluster, silo = %address, ?health, "fence horizon passed during a heartbeat");
                    } else {
                        warn!(%cluster, silo = %address, ?health, "fence horizon passed without a successful heartbeat");
                    }
                    publish(&self.health, health);
                }
            }
        }
    }

    /// The event a heartbeat's outcome is logged with.
    fn log(&self, health: &SiloHealth) {
        let (cluster, address) = (&self.cluster, self.address);
        match health {
            SiloHealth::Healthy { lease } => {
                debug!(%cluster, silo = %address, expires_at = ?lease.expires_at, "lease refreshed")
            }
            SiloHealth::Failing {
                failures,
                last_error,
                ..
            } => {
                warn!(%cluster, silo = %address, failures, error = %last_error, "heartbeat failed; retrying")
            }
            SiloHealth::LeaseAtRisk {
                lease,
                failures,
                cause,
            } => {
                warn!(%cluster, silo = %address, failures, ?cause, expires_at = ?lease.and_then(|l| l.expires_at),
                    "past the fence horizon: the host must fence itself")
            }
            SiloHealth::EntryMissing => {
                warn!(%cluster, silo = %address, "entry missing; heartbeat stops")
            }
            SiloHealth::DeclaredDead => {
                info!(%cluster, silo = %address, "declared dead; heartbeat stops")
            }
            _ => {}
        }
    }
}

/// The work in `slot`, or a future that never finishes when the slot is empty: where the one
/// piece of work sits among [`HeartbeatTask::watch`]'s branches decides what wins a tie.
async fn in_slot<F: Future + Unpin>(slot: &mut Option<F>) -> F::Output {
    match slot {
        Some(work) => work.await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::Lease;

    #[test]
    fn final_states_stick() {
        let (tx, rx) = watch::channel(SiloHealth::Starting);
        let table = crate::InMemoryMembershipTable::new("c");
        let silo = "10.0.0.1:1@1".parse().unwrap();
        let report = OwnEntryReport {
            health: Arc::new(HealthSender {
                tx,
                serve_until: watch::channel(None).0,
                metrics: SiloMetrics::new(&table, &silo),
            }),
            unknown: Arc::new(watch::channel(None).0),
            own_row_until: Arc::new(watch::Sender::new(Instant::now())),
            own_row_horizon: Duration::from_secs(90),
        };
        report.own_entry(Some(SiloStatus::Active), Instant::now());
        assert_eq!(*rx.borrow(), SiloHealth::Starting);
        report.own_entry(Some(SiloStatus::Dead), Instant::now());
        publish(
            &report.health,
            SiloHealth::Healthy {
                lease: Lease::unbounded(Timestamp::from_millis(1_000_000)),
            },
        );
        report.own_entry(None, Instant::now());
        assert_eq!(*rx.borrow(), SiloHealth::DeclaredDead);
    }
}

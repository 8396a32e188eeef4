//! The periodic defunct-silo cleanup, as Orleans runs it: first at a random point of the first
//! period, then every period plus jitter; at most one per table identity per process; idle while storage
//! expiry covers it (unless forced), re-checked every period.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::clock::{Clock, scale};
use crate::error::{MembershipError, Result};
use crate::options::MembershipOptions;
use crate::runtime::protocol::bounded;
use crate::table::MembershipTable;

/// When the cleanup runs. Pure: the random draws are arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CleanupSchedule {
    period: Duration,
    jitter: Duration,
}

impl CleanupSchedule {
    /// The schedule of these options, `None` when cleanup is disabled.
    pub(crate) fn new(options: &MembershipOptions) -> Option<Self> {
        options
            .defunct_silo_cleanup_period
            .map(|period| CleanupSchedule {
                period,
                jitter: options.defunct_silo_cleanup_jitter,
            })
    }

    /// Delay before the first run: a random point of the first period, so silos started
    /// together do not clean together.
    pub(crate) fn first_delay(&self, unit_random: f64) -> Duration {
        scale(self.period, unit_random.clamp(0.0, 1.0))
    }

    /// Delay between runs: the period plus up to `jitter`. Never shorter than the period, which
    /// is also the cleanup's rate limit.
    pub(crate) fn next_delay(&self, unit_random: f64) -> Duration {
        self.period
            .saturating_add(scale(self.jitter, unit_random.clamp(0.0, 1.0)))
    }
}

static RUNNING: Mutex<Option<HashSet<String>>> = Mutex::new(None);

struct Registration(String);

impl Registration {
    fn take(key: String) -> Option<Registration> {
        let mut running = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
        // `then`, not `then_some`: a Registration built and dropped here would deregister the
        // running task (and deadlock on this lock).
        let fresh = running.get_or_insert_with(HashSet::new).insert(key.clone());
        fresh.then(|| Registration(key))
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(set) = RUNNING.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            set.remove(&self.0);
        }
    }
}

/// A running cleanup task.
#[derive(Debug)]
pub struct DefunctCleanup {
    /// The table, asked whether storage covers the cleanup.
    table: Arc<dyn MembershipTable>,
    force: bool,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    removed: watch::Receiver<u64>,
}

/// Why no cleanup task was started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CleanupNotStarted {
    /// `defunct_silo_cleanup_period` is `None`.
    Disabled,
    /// Storage-side expiry removes defunct entries already (`force_defunct_cleanup` overrides),
    /// and this process already runs a cleanup task for the table, which re-checks that every
    /// period. (The first task always starts: whether storage covers the cleanup can change
    /// while the silo runs, README "Expiry".)
    CoveredByStorageExpiry,
}

impl DefunctCleanup {
    /// Starts the cleanup for `table`'s cluster, or says why it is not needed. Errors when this
    /// process already runs one for the same table ([`MembershipTable::identity`]). Each period
    /// the task asks [`MembershipTable::storage_expiry`] again and skips the run while storage
    /// covers the cleanup (unless `force_defunct_cleanup`).
    pub fn spawn(
        table: Arc<dyn MembershipTable>,
        options: &MembershipOptions,
        clock: Arc<dyn Clock>,
    ) -> Result<std::result::Result<DefunctCleanup, CleanupNotStarted>> {
        let Some(schedule) = CleanupSchedule::new(options) else {
            return Ok(Err(CleanupNotStarted::Disabled));
        };
        let identity = table.identity();
        let force = options.force_defunct_cleanup;
        let Some(registration) = Registration::take(identity.clone()) else {
            if table.storage_expiry().covers_defunct_cleanup && !force {
                // Storage covers it, and the task already running in this process watches
                // whether that changes: nothing for a second one to do.
                return Ok(Err(CleanupNotStarted::CoveredByStorageExpiry));
            }
            return Err(MembershipError::config(
                "defunct_silo_cleanup_period",
                format!(
                    "a defunct cleanup already runs for {identity} in this process; one silo per process runs it, the others set defunct_silo_cleanup_period = \"off\""
                ),
            ));
        };
        let expiration = options.defunct_silo_expiration;
        let call_timeout = options.effective_table_operation_timeout();
        let initially_covered = table.storage_expiry().covers_defunct_cleanup && !force;
        let task_table = Arc::clone(&table);
        if initially_covered {
            info!(
                cluster = table.cluster_id(),
                "storage-side expiry removes defunct entries; periodic cleanup idle (re-checked every period)"
            );
        }
        let (stop, mut stop_rx) = watch::channel(false);
        let (removed_tx, removed) = watch::channel(0u64);
        let task = tokio::spawn(async move {
            let _registration = registration;
            let mut delay = schedule.first_delay(rand::random::<f64>());
            let mut total = 0u64;
            let mut was_covered = initially_covered;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = stop_rx.changed() => return,
                }
                // Read every period: a table can stop being covered while the silo runs (a
                // renewal finds rows without TTL), and must then be cleaned.
                let covered = table.storage_expiry().covers_defunct_cleanup && !force;
                if covered != was_covered {
                    info!(
                        cluster = table.cluster_id(),
                        covered,
                        "storage-side expiry covers the defunct cleanup: {covered}; periodic cleanup {}",
                        if covered { "idle" } else { "runs" }
                    );
                    was_covered = covered;
                }
                if covered {
                    delay = schedule.next_delay(rand::random::<f64>());
                    continue;
                }
                let before = clock.now().saturating_sub(expiration);
                // Bounded like every runtime call, and abandoned on stop: a hung cleanup must
                // not hold up `Silo::leave` (the next period, or another silo, runs it again).
                let run = bounded(
                    "cleanup_defunct",
                    true,
                    call_timeout,
                    table.cleanup_defunct(before),
                );
                let outcome = tokio::select! {
                    r = run => r,
                    _ = stop_rx.changed() => return,
                };
                match outcome {
                    Ok(n) => {
                        total += n as u64;
                        if n > 0 {
                            info!(
                                cluster = table.cluster_id(),
                                removed = n,
                                "cleaned defunct entries"
                            );
                        }
                        let _ = removed_tx.send(total);
                    }
                    Err(e) => {
                        warn!(cluster = table.cluster_id(), error = %e, "defunct cleanup failed; next period retries")
                    }
                }
                delay = schedule.next_delay(rand::random::<f64>());
            }
        });
        Ok(Ok(DefunctCleanup {
            table: task_table,
            force,
            stop,
            task,
            removed,
        }))
    }

    /// False while storage-side expiry covers the cleanup (asked now) and it is not forced: the
    /// task is idle.
    pub fn is_active(&self) -> bool {
        self.force || !self.table.storage_expiry().covers_defunct_cleanup
    }

    /// Total entries removed so far, updated after each run.
    pub fn removed(&self) -> watch::Receiver<u64> {
        self.removed.clone()
    }

    /// Stops the task and waits for it.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_run_falls_within_the_first_period_and_later_runs_never_faster_than_the_period() {
        let s = CleanupSchedule::new(&MembershipOptions::default()).unwrap();
        assert_eq!(s.first_delay(0.0), Duration::ZERO);
        assert_eq!(s.first_delay(0.5), Duration::from_secs(1800));
        assert_eq!(s.next_delay(0.0), Duration::from_secs(3600));
        assert_eq!(s.next_delay(1.0), Duration::from_secs(3900));
    }

    #[test]
    fn no_schedule_when_disabled() {
        let o = MembershipOptions {
            defunct_silo_cleanup_period: None,
            ..Default::default()
        };
        assert!(CleanupSchedule::new(&o).is_none());
    }
}

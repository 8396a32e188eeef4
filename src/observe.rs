//! Metrics through the `metrics` facade (feature `metrics`). Without the feature every function
//! here is empty and no label is built: the no-op build costs nothing.
//!
//! Two layers emit them: each table backend records every [`MembershipTable`] call it answers
//! ([`TableMetrics`], in the one wrapper every trait method of the backend goes through, so
//! direct table users and adapters get them too), and the host runtime records its silos'
//! heartbeats, health and protocol conflicts (`runtime/observe.rs`). Every series carries the
//! `service` and `cluster` labels; the runtime's per-silo series also `silo`, the silo's endpoint
//! (`ip:port`: every incarnation of an endpoint shares its series; `membership_silo_info` has
//! the `generation`).
//!
//! [`MembershipTable`]: crate::MembershipTable

use std::future::Future;

use crate::error::Result;
use crate::model::MembershipSnapshot;
use crate::table::HeartbeatOutcome;

/// Describes every series this crate emits (help text and unit) to the installed recorder.
///
/// The library calls it once per process by itself, when the first table or silo is built:
/// a host that installs its exporter before it builds a table needs nothing more. A host that
/// installs its recorder later, or swaps recorders (tests with
/// `metrics::with_local_recorder`), calls it after installing; describing again is harmless.
/// Without the `metrics` feature it does nothing.
pub fn describe_metrics() {
    imp::describe();
}

/// Calls [`describe_metrics`] the first time a table or silo is built in this process.
pub(crate) fn describe_once() {
    #[cfg(feature = "metrics")]
    {
        static DESCRIBED: std::sync::Once = std::sync::Once::new();
        DESCRIBED.call_once(describe_metrics);
    }
}

/// Whether a table call that answered changed what it was asked to: the `outcome` label's
/// `ok` or `conflict`.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) trait Applied {
    /// False for an answer that applied nothing (a conditional write that lost, a heartbeat that
    /// found no entry).
    fn applied(&self) -> bool {
        true
    }
}

impl Applied for () {}
impl Applied for usize {}
impl Applied for MembershipSnapshot {}
impl Applied for bool {
    fn applied(&self) -> bool {
        *self
    }
}
impl Applied for HeartbeatOutcome {
    fn applied(&self) -> bool {
        !matches!(self, HeartbeatOutcome::NotFound)
    }
}

/// The labels a table value's operations are recorded under; with the feature, records them.
#[derive(Clone, Debug)]
pub(crate) struct TableMetrics {
    #[cfg(feature = "metrics")]
    labels: imp::Labels,
}

impl TableMetrics {
    /// For the table value of `service` / `cluster` (an in-memory table has no service: `""`).
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn new(service: &str, cluster: &str) -> Self {
        describe_once();
        TableMetrics {
            #[cfg(feature = "metrics")]
            labels: imp::Labels::new(service, cluster),
        }
    }

    /// Runs `call`, one table operation, and records its outcome and latency. A call dropped
    /// before it answered (its caller's timeout: the runtime's `table_operation_timeout`, a
    /// host's own) is recorded too, as `outcome="cancelled"` with the time it ran.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) async fn measure<T: Applied>(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        #[cfg(feature = "metrics")]
        let pending = imp::Pending::new(&self.labels, operation);
        let answer = call.await;
        #[cfg(feature = "metrics")]
        pending.answered(&answer);
        answer
    }

    /// A read of this cluster's partition reported scanning `n` tombstones in one statement (0:
    /// a whole read reported none, below the node's warning threshold).
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn tombstones_scanned(&self, n: u64) {
        #[cfg(feature = "metrics")]
        metrics::gauge!(imp::TOMBSTONES_SCANNED, self.labels.all()).set(n as f64);
    }

    /// `n` entries were removed by a `cleanup_defunct`.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn removed(&self, n: usize) {
        #[cfg(feature = "metrics")]
        self.labels.removed(n);
    }
}

#[cfg(not(feature = "metrics"))]
mod imp {
    pub(super) fn describe() {}
}

#[cfg(feature = "metrics")]
pub(crate) mod imp {
    use std::sync::Arc;
    use std::time::Duration;

    use metrics::{Label, Unit, describe_counter, describe_gauge, describe_histogram};

    use super::*;
    use crate::error::MembershipError;

    /// Table operations answered or dropped by their caller, by `operation` and `outcome`
    /// (counter).
    pub(crate) const TABLE_OPERATIONS: &str = "membership_table_operations_total";
    /// Latency of table operations, by `operation` and `outcome` (histogram, seconds).
    pub(crate) const TABLE_OPERATION_DURATION: &str = "membership_table_operation_duration_seconds";
    /// Entries removed by `cleanup_defunct` (counter).
    pub(crate) const CLEANUP_REMOVED: &str = "membership_cleanup_removed_total";
    /// Heartbeats of a silo, by `outcome` (counter).
    pub(crate) const HEARTBEATS: &str = "membership_heartbeats_total";
    /// Time left until a silo's lease must be refreshed (gauge, seconds).
    pub(crate) const LEASE_HEADROOM: &str = "membership_lease_headroom_seconds";
    /// 1 while a silo should serve, 0 once it must fence or has stopped (gauge).
    pub(crate) const SILO_SERVING: &str = "membership_silo_serving";
    /// 1 for a silo's current incarnation, by `generation`; 0 once it stopped (gauge).
    pub(crate) const SILO_INFO: &str = "membership_silo_info";
    /// Times a silo reached `LeaseAtRisk` (counter).
    pub(crate) const FENCES: &str = "membership_fences_total";
    /// Tombstones one statement of the latest read of a cluster's partition reported scanning
    /// (gauge; 0 below the node's warning threshold).
    pub(crate) const TOMBSTONES_SCANNED: &str = "membership_table_tombstones_scanned";
    /// Conditional writes of the runtime's protocol that lost a race, by `step` (counter).
    pub(crate) const LWT_CONFLICTS: &str = "membership_lwt_conflicts_total";

    pub(super) fn describe() {
        describe_counter!(
            TABLE_OPERATIONS,
            Unit::Count,
            "Membership table operations answered, by operation and outcome (ok; conflict: answered, applied nothing; unknown: a conditional write whose outcome is unknown; tombstones: the node aborted a read for the tombstones of the cluster's partition; error: failed otherwise; cancelled: dropped by its caller before it answered, its outcome unknown)"
        );
        describe_histogram!(
            TABLE_OPERATION_DURATION,
            Unit::Seconds,
            "Latency of membership table operations, by operation and outcome"
        );
        describe_counter!(
            CLEANUP_REMOVED,
            Unit::Count,
            "Defunct entries removed by cleanup_defunct"
        );
        describe_counter!(
            HEARTBEATS,
            Unit::Count,
            "Heartbeats of a silo, by outcome (ok; failed; tombstones: failed because the cluster's partition holds more tombstones than one read may scan, which does not heal by itself; entry_missing; declared_dead)"
        );
        describe_gauge!(
            LEASE_HEADROOM,
            Unit::Seconds,
            "Time left, at the silo's last heartbeat, until its storage lease must be refreshed; 0 once the silo stopped"
        );
        describe_gauge!(
            SILO_SERVING,
            Unit::Count,
            "1 while the silo should serve (SiloHealth::should_serve), 0 once it must fence or has stopped (left, crashed, declared dead, entry missing)"
        );
        describe_gauge!(
            SILO_INFO,
            Unit::Count,
            "1 for the silo's (endpoint's) current incarnation, labelled by its generation; 0 once that incarnation stopped"
        );
        describe_counter!(
            FENCES,
            Unit::Count,
            "Times the silo reached LeaseAtRisk (it must stop serving until Healthy again)"
        );
        describe_gauge!(
            TOMBSTONES_SCANNED,
            Unit::Count,
            "Tombstones one statement of the latest read of the cluster's partition reported scanning, as Cassandra counts them against tombstone_failure_threshold (100,000 by default: past it the node aborts the read); 0 while the node reports none (below tombstone_warn_threshold, 1,000 by default)"
        );
        describe_counter!(
            LWT_CONFLICTS,
            Unit::Count,
            "Conditional writes of the runtime's protocol that lost a race and were retried, by step (join, status, vote)"
        );
    }

    /// A table call in flight: recorded when it answers ([`Pending::answered`]) or, dropped
    /// before that, as `cancelled`.
    pub(super) struct Pending<'a> {
        labels: &'a Labels,
        operation: &'static str,
        started: std::time::Instant,
        answered: bool,
    }

    impl<'a> Pending<'a> {
        pub(super) fn new(labels: &'a Labels, operation: &'static str) -> Self {
            Pending {
                labels,
                operation,
                started: std::time::Instant::now(),
                answered: false,
            }
        }

        pub(super) fn answered<T: Applied>(mut self, answer: &Result<T>) {
            self.answered = true;
            self.labels
                .operation(self.operation, answer, self.started.elapsed());
        }
    }

    impl Drop for Pending<'_> {
        fn drop(&mut self) {
            if !self.answered {
                self.labels
                    .record(self.operation, "cancelled", self.started.elapsed());
            }
        }
    }

    /// `service` and `cluster`, built once per table value or silo (the values are shared, not
    /// copied, per emission).
    #[derive(Clone, Debug)]
    pub(crate) struct Labels(Arc<[Label]>);

    impl Labels {
        pub(crate) fn new(service: &str, cluster: &str) -> Self {
            Labels(Arc::from([
                Label::new("service", Arc::<str>::from(service)),
                Label::new("cluster", Arc::<str>::from(cluster)),
            ]))
        }

        /// These labels and one more.
        pub(crate) fn with(&self, key: &'static str, value: impl Into<String>) -> Labels {
            let mut all = self.0.to_vec();
            all.push(Label::new(key, value.into()));
            Labels(Arc::from(all))
        }

        /// These labels and `extra`, as the macros take them.
        pub(crate) fn and(&self, extra: &[(&'static str, &'static str)]) -> Vec<Label> {
            let mut all = self.0.to_vec();
            all.extend(extra.iter().map(|&(k, v)| Label::new(k, v)));
            all
        }

        pub(crate) fn all(&self) -> Vec<Label> {
            self.0.to_vec()
        }

        pub(super) fn operation<T: Applied>(
            &self,
            operation: &'static str,
            answer: &Result<T>,
            took: Duration,
        ) {
            let outcome = match answer {
                Ok(a) if a.applied() => "ok",
                Ok(_) => "conflict",
                Err(MembershipError::OutcomeUnknown { .. }) => "unknown",
                Err(MembershipError::TooManyTombstones { .. }) => "tombstones",
                Err(_) => "error",
            };
            self.record(operation, outcome, took);
        }

        fn record(&self, operation: &'static str, outcome: &'static str, took: Duration) {
            let labels = self.and(&[("operation", operation), ("outcome", outcome)]);
            metrics::histogram!(TABLE_OPERATION_DURATION, labels.clone()).record(took);
            metrics::counter!(TABLE_OPERATIONS, labels).increment(1);
        }

        pub(super) fn removed(&self, n: usize) {
            metrics::counter!(CLEANUP_REMOVED, self.all()).increment(n as u64);
        }
    }
}

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    use super::*;
    use crate::error::MembershipError;

    /// The `outcome` of each kind of answer, and of a call dropped unanswered, as the recorder
    /// receives it.
    #[test]
    fn answers_are_counted_as_ok_conflict_unknown_or_error_and_drops_as_cancelled() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        metrics::with_local_recorder(&recorder, || {
            rt.block_on(async {
                let m = TableMetrics::new("s", "c");
                let _ = m.measure("update_row", async { Ok(true) }).await;
                let _ = m.measure("update_row", async { Ok(false) }).await;
                let _ = m
                    .measure("update_i_am_alive", async {
                        Ok(HeartbeatOutcome::NotFound)
                    })
                    .await;
                let unknown = MembershipError::OutcomeUnknown {
                    operation: "update_row",
                    detail: "test".into(),
                    source: "lost".into(),
                };
                let _ = m
                    .measure("update_row", async { Err::<bool, _>(unknown) })
                    .await;
                let timeout = MembershipError::Timeout {
                    operation: "read_all",
                    source: "slow".into(),
                };
                let _ = m
                    .measure("read_all", async { Err::<MembershipSnapshot, _>(timeout) })
                    .await;
                // Dropped before it answers (what a caller's timeout does).
                tokio::select! {
                    biased;
                    _ = m.measure("read_row", std::future::pending::<Result<MembershipSnapshot>>()) => unreachable!(),
                    _ = async {} => {}
                }
            })
        });
        let mut counted: Vec<(String, String, u64)> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(k, ..)| k.key().name() == "membership_table_operations_total")
            .map(|(k, _, _, v)| {
                let label = |name| {
                    k.key()
                        .labels()
                        .find(|l| l.key() == name)
                        .map(|l| l.value().to_owned())
                        .unwrap()
                };
                let DebugValue::Counter(n) = v else {
                    panic!("{v:?}")
                };
                (label("operation"), label("outcome"), n)
            })
            .collect();
        counted.sort();
        let expected = [
            ("read_all", "error", 1),
            ("read_row", "cancelled", 1),
            ("update_i_am_alive", "conflict", 1),
            ("update_row", "conflict", 1),
            ("update_row", "ok", 1),
            ("update_row", "unknown", 1),
        ]
        .map(|(o, r, n)| (o.to_owned(), r.to_owned(), n));
        assert_eq!(counted, expected);
    }
}

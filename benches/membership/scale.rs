//! Scale sections: read_all vs live silos, 1,000 silos heartbeating from one process (and the
//! heartbeat load driver the peers section shares), join storm.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, MembershipOptions, MembershipTable,
    Timestamp,
};
use scylla::client::session::Session;
use scylla::errors::{DbError, ExecutionError, RequestAttemptError};
use uuid::Uuid;

use crate::fixture::{KS, Res, entry, fill, provider};
use crate::report::{Report, Stats, ms, stats};

pub(crate) async fn run(s: &Arc<Session>, r: &mut Report) -> Res<Vec<(f64, f64)>> {
    r.section("Scale: read_all vs live silos", "read_all latency (ms) with N live entries in the cluster (50 samples each; page size 1000).");
    let t = provider(s, "scale", "membership", false).await?;
    let mut rows = Vec::new();
    let mut points = Vec::new();
    let mut have = 0;
    for n in [10u32, 100, 1000] {
        fill(&t, have, n).await?;
        have = n;
        let mut v = Vec::new();
        for _ in 0..50 {
            let start = Instant::now();
            let snap = t.read_all().await?;
            v.push(start.elapsed());
            assert_eq!(snap.rows.len(), n as usize);
        }
        let st = stats(v);
        points.push((f64::from(n), st.median.as_secs_f64() * 1000.0));
        rows.push(vec![n.to_string(), ms(st.median), ms(st.p99)]);
    }
    r.table(&["live silos", "p50", "p99"], &rows);

    r.section(
        "1,000 silos heartbeating from one process",
        "Every silo heartbeats once per second (period compressed from 30 s) for 15 s, with jitter; TTL on.",
    );
    let mut m = MembershipOptions::default();
    m.defunct_silo_expiration = Duration::from_secs(600);
    m.i_am_alive_table_publish_timeout = Duration::from_secs(1);
    let mut o = CassandraClusteringOptions::default()
        .keyspace(KS.as_str())
        .service_id("bench")
        .cluster_id("thousand")
        .table("membership_ttl")
        .ttl(true)
        .membership(m);
    o.ttl_mismatch = cassandra_membership::TtlMismatchPolicy::Allow;
    let t = CassandraMembershipTable::with_session(Arc::clone(s), o)?;
    t.initialize(true).await?;
    fill(&t, 0, 1000).await?;
    let t = Arc::new(t);
    let load = heartbeat_load(
        Schedule {
            silos: 1000,
            spread: Duration::from_secs(1),
            warm: Duration::ZERO,
            measure: Duration::from_secs(15),
        },
        move |i| {
            let t = Arc::clone(&t);
            async move {
                t.update_i_am_alive(&entry(i).address, Timestamp::now())
                    .await?;
                Ok(true)
            }
        },
    )
    .await?;
    let st = load.stats();
    r.table(
        &["heartbeats", "errors", "heartbeats/s", "p50 ms", "p99 ms"],
        &[vec![
            load.beats.to_string(),
            load.errors.to_string(),
            format!("{:.0}", load.per_second()),
            st.map_or("—".into(), |s| ms(s.median)),
            st.map_or("—".into(), |s| ms(s.p99)),
        ]],
    );

    r.section(
        "Join storm",
        "100 silos join at once: each reads the version and inserts, retrying on conflict.",
    );
    let t = Arc::new(provider(s, "storm", "membership", false).await?);
    let conflicts = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..100)
        .map(|i| {
            let (t, conflicts) = (Arc::clone(&t), Arc::clone(&conflicts));
            tokio::spawn(async move {
                loop {
                    let v = t.read_all().await.unwrap().version;
                    if t.insert_row(&entry(i), &v.next()).await.unwrap() {
                        return start.elapsed();
                    }
                    conflicts.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(rand_ms(20))).await;
                }
            })
        })
        .collect();
    let mut last = Duration::ZERO;
    for task in tasks {
        last = last.max(task.await?);
    }
    let snap = t.read_all().await?;
    r.table(
        &[
            "silos",
            "all joined after",
            "LWT conflicts",
            "final version",
        ],
        &[vec![
            snap.rows.len().to_string(),
            format!("{:.2} s", last.as_secs_f64()),
            conflicts.load(Ordering::Relaxed).to_string(),
            snap.version.version.to_string(),
        ]],
    );
    Ok(points)
}

/// When the silos of a heartbeat load beat: each about once a second (period compressed from 30 s),
/// jittered; the first beats spread evenly over `spread`. Beats that start in the first `warm` are
/// sent but not measured; the load ends `measure` after that.
#[derive(Clone, Copy)]
pub(crate) struct Schedule {
    pub(crate) silos: u32,
    pub(crate) spread: Duration,
    pub(crate) warm: Duration,
    pub(crate) measure: Duration,
}

/// What a heartbeat load measured (`beats` .. `latencies`: started within the measured window).
#[derive(Default)]
pub(crate) struct Load {
    /// Heartbeats that returned without an error, applied or not.
    pub(crate) beats: u64,
    /// Heartbeats that returned without an error but did not refresh the entry.
    pub(crate) not_applied: u64,
    pub(crate) errors: u64,
    /// Errors that are timeouts (client or server side); also counted in `errors`.
    pub(crate) timeouts: u64,
    /// Latency of each heartbeat in `beats`.
    pub(crate) latencies: Vec<Duration>,
    measured: Duration,
}

impl Load {
    fn merge(&mut self, o: Load) {
        self.beats += o.beats;
        self.not_applied += o.not_applied;
        self.errors += o.errors;
        self.timeouts += o.timeouts;
        self.latencies.extend(o.latencies);
    }

    /// Refreshes stored per second of the measured window.
    pub(crate) fn per_second(&self) -> f64 {
        (self.beats - self.not_applied) as f64 / self.measured.as_secs_f64()
    }

    /// None when no heartbeat returned.
    pub(crate) fn stats(&self) -> Option<Stats> {
        (!self.latencies.is_empty()).then(|| stats(self.latencies.clone()))
    }
}

/// Runs `beat(silo)` for every silo on `schedule`, each silo a task of its own, in this process.
/// `beat` returns whether the heartbeat refreshed the entry.
pub(crate) async fn heartbeat_load<F, Fut>(schedule: Schedule, beat: F) -> Res<Load>
where
    F: Fn(u32) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Res<bool>> + Send + 'static,
{
    let beat = Arc::new(beat);
    let start = Instant::now();
    let measured_from = start + schedule.warm;
    let deadline = measured_from + schedule.measure;
    let tasks: Vec<_> = (0..schedule.silos)
        .map(|i| {
            let beat = Arc::clone(&beat);
            let offset = schedule.spread * i / schedule.silos;
            tokio::spawn(async move {
                let mut load = Load::default();
                tokio::time::sleep(offset).await;
                while Instant::now() < deadline {
                    let sent = Instant::now();
                    let result = beat(i).await;
                    if sent >= measured_from {
                        match result {
                            Ok(applied) => {
                                load.beats += 1;
                                load.not_applied += u64::from(!applied);
                                load.latencies.push(sent.elapsed());
                            }
                            Err(e) => {
                                load.errors += 1;
                                load.timeouts += u64::from(is_timeout(&*e));
                            }
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(900 + rand_ms(200))).await;
                }
                load
            })
        })
        .collect();
    let mut total = Load {
        measured: schedule.measure,
        ..Load::default()
    };
    for task in tasks {
        total.merge(task.await?);
    }
    Ok(total)
}

/// A driver timeout anywhere in the error's chain: the client's request timeout, or a
/// coordinator's read/write timeout (a Paxos round that lost to contention ends as one).
fn is_timeout(e: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(e), |e| e.source()).any(|e| {
        matches!(
            e.downcast_ref::<ExecutionError>(),
            Some(
                ExecutionError::RequestTimeout(_)
                    | ExecutionError::LastAttemptError(RequestAttemptError::DbError(
                        DbError::ReadTimeout { .. } | DbError::WriteTimeout { .. },
                        _
                    ))
            )
        )
    })
}

fn rand_ms(max: u64) -> u64 {
    u64::from(Uuid::new_v4().as_bytes()[0]) * max / 256
}

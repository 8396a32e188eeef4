//! The `metrics` feature's series, as a recorder receives them: names, labels, units and values
//! of what a heartbeat, a fence and a defunct cleanup produce on the in-memory table, and the
//! table-level series of the Cassandra table on the real node.
//!
//! Each test runs its own current-thread runtime inside `metrics::with_local_recorder`, so every
//! task the silo spawns records into that test's recorder and tests never see each other's
//! series. Needs `--features metrics` (`required-features` in Cargo.toml).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use cassandra_membership::conformance::faults::{FaultyTable, Injection, Operation};
use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, Clock, InMemoryMembershipTable,
    MembershipEntry, MembershipError, MembershipOptions, MembershipTable, Silo, SiloAddress,
    SiloHealth, SiloStatus, Timestamp, TokioClock, describe_metrics,
};
use metrics::Unit;
use metrics_util::MetricKind;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// One recorded series: its kind, labels (sorted), unit and value.
#[derive(Debug)]
struct Series {
    kind: MetricKind,
    unit: Option<Unit>,
    value: DebugValue,
}

/// Everything recorded, by name and then by labels.
type Recorded = BTreeMap<String, BTreeMap<BTreeMap<String, String>, Series>>;

fn recorded(snapshotter: &Snapshotter) -> Recorded {
    let mut all = Recorded::new();
    for (key, unit, _description, value) in snapshotter.snapshot().into_vec() {
        let (kind, key) = key.into_parts();
        let labels = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        all.entry(key.name().to_owned())
            .or_default()
            .insert(labels, Series { kind, unit, value });
    }
    all
}

/// Runs `test` on a current-thread runtime (paused time when `paused`) with a recorder of its
/// own; returns what the recorder holds at the end.
fn with_recorder<F: Future<Output = ()>>(paused: bool, test: impl FnOnce() -> F) -> Recorded {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let mut runtime = tokio::runtime::Builder::new_current_thread();
    runtime.enable_all().start_paused(paused);
    let runtime = runtime.build().unwrap();
    metrics::with_local_recorder(&recorder, || {
        describe_metrics();
        runtime.block_on(test());
    });
    recorded(&snapshotter)
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|&(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// The series `name{labels}`; panics naming what was recorded under `name` when absent.
fn series<'a>(all: &'a Recorded, name: &str, pairs: &[(&str, &str)]) -> &'a Series {
    let by_labels = all
        .get(name)
        .unwrap_or_else(|| panic!("no {name}; recorded: {:?}", all.keys()));
    by_labels
        .get(&labels(pairs))
        .unwrap_or_else(|| panic!("no {name}{pairs:?}; recorded: {:?}", by_labels.keys()))
}

fn counter(all: &Recorded, name: &str, pairs: &[(&str, &str)]) -> u64 {
    let s = series(all, name, pairs);
    assert_eq!(s.kind, MetricKind::Counter, "{name}");
    assert_eq!(s.unit, Some(Unit::Count), "{name} is described as a count");
    match s.value {
        DebugValue::Counter(n) => n,
        ref other => panic!("{name}: {other:?}"),
    }
}

fn gauge(all: &Recorded, name: &str, pairs: &[(&str, &str)], unit: Unit) -> f64 {
    let s = series(all, name, pairs);
    assert_eq!(s.kind, MetricKind::Gauge, "{name}");
    assert_eq!(s.unit, Some(unit), "{name}'s unit");
    match s.value {
        DebugValue::Gauge(v) => v.into_inner(),
        ref other => panic!("{name}: {other:?}"),
    }
}

/// The latencies recorded in `name{labels}` (seconds).
fn histogram(all: &Recorded, name: &str, pairs: &[(&str, &str)]) -> Vec<f64> {
    let s = series(all, name, pairs);
    assert_eq!(s.kind, MetricKind::Histogram, "{name}");
    assert_eq!(
        s.unit,
        Some(Unit::Seconds),
        "{name} is described in seconds"
    );
    match &s.value {
        DebugValue::Histogram(v) => v.iter().map(|x| x.into_inner()).collect(),
        other => panic!("{name}: {other:?}"),
    }
}

const OPERATIONS: &str = "membership_table_operations_total";
const DURATION: &str = "membership_table_operation_duration_seconds";

/// A silo on the in-memory table (expiry on, so its lease is bounded) behind a fault-injecting
/// wrapper: it joins (its first insert loses a race), heartbeats, runs the defunct cleanup that
/// removes an old Dead entry, then its heartbeats fail until it must fence.
#[test]
fn a_heartbeat_a_fence_and_a_cleanup_are_recorded_with_their_labels() {
    let cluster = format!("metrics-{}", uuid::Uuid::new_v4());
    let me: SiloAddress = "10.0.0.1:11111@1".parse().unwrap();
    let gone: SiloAddress = "10.0.0.2:11111@1".parse().unwrap();
    let all = with_recorder(true, || async {
        let clock = Arc::new(TokioClock::new());
        let mut o = MembershipOptions::default()
            .i_am_alive_table_publish_timeout(Duration::from_secs(10))
            .defunct_silo_expiration(Duration::from_secs(60))
            .defunct_silo_cleanup_period(Some(Duration::from_secs(30)))
            .defunct_silo_cleanup_jitter(Duration::ZERO)
            .force_defunct_cleanup(true);
        o.num_missed_table_i_am_alive_limit = 100; // the lease is the first horizon here
        let inner = InMemoryMembershipTable::new(cluster.clone())
            .with_options(o)
            .with_clock(clock.clone())
            .with_expiry(Duration::from_secs(100));
        let table = Arc::new(FaultyTable::new(Arc::new(inner.clone())));
        // An old Dead entry for the cleanup to remove.
        inner.initialize(true).await.unwrap();
        let version = inner.read_all().await.unwrap().version;
        let old = clock.now().saturating_sub(Duration::from_secs(3600));
        let mut dead = MembershipEntry::new(gone, SiloStatus::Dead, old);
        dead.start_time = old;
        assert!(inner.insert_row(&dead, &version.next()).await.unwrap());
        assert!(
            !inner.insert_row(&dead, &version.next()).await.unwrap(),
            "a second insert of the address applies nothing: a conflict"
        );
        assert!(inner.delete_cluster("").await.is_err(), "an error");

        table.inject(Injection::not_applied(Operation::InsertRow).times(1));
        let silo = Silo::builder(table.clone(), me)
            .clock(clock.clone())
            .join()
            .await
            .unwrap();
        let mut health = silo.health();
        health
            .wait_for(|h| matches!(h, SiloHealth::Healthy { .. }))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(31)).await;
        assert_eq!(
            inner.read_all().await.unwrap().rows.len(),
            1,
            "the cleanup ran within its first period and removed the Dead entry"
        );
        table.inject(Injection::timeout(Operation::UpdateIAmAlive, "injected"));
        tokio::time::timeout(
            Duration::from_secs(300),
            health.wait_for(|h| matches!(h, SiloHealth::LeaseAtRisk { .. })),
        )
        .await
        .expect("fenced within the lease")
        .unwrap();
        silo.crash();
    });

    // `silo` is the endpoint: every incarnation of it shares the series.
    let me = me.endpoint().to_string();
    let silo = [
        ("service", ""),
        ("cluster", cluster.as_str()),
        ("silo", me.as_str()),
    ];
    let table = [("service", ""), ("cluster", cluster.as_str())];
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut l = table.to_vec();
        l.extend_from_slice(extra);
        l
    };

    // Heartbeats: at least the one after the join and two more in the 31 s before the faults.
    let ok = counter(
        &all,
        "membership_heartbeats_total",
        &[&silo[..], &[("outcome", "ok")]].concat(),
    );
    assert!(ok >= 3, "{ok} successful heartbeats");
    let failed = counter(
        &all,
        "membership_heartbeats_total",
        &[&silo[..], &[("outcome", "failed")]].concat(),
    );
    assert!(failed >= 1, "{failed} failed heartbeats");
    // The fence: once, and the silo no longer serves.
    assert_eq!(counter(&all, "membership_fences_total", &silo), 1);
    assert_eq!(
        gauge(&all, "membership_silo_serving", &silo, Unit::Count),
        0.0
    );
    // The headroom fell with the failing heartbeats: under the lease's 90 s refresh point.
    let headroom = gauge(
        &all,
        "membership_lease_headroom_seconds",
        &silo,
        Unit::Seconds,
    );
    assert!((0.0..90.0).contains(&headroom), "headroom {headroom}");
    // The crashed incarnation's gauges: 0 (the facade cannot remove a series).
    assert_eq!(
        gauge(
            &all,
            "membership_silo_info",
            &[&silo[..], &[("generation", "1")]].concat(),
            Unit::Count
        ),
        0.0
    );
    // The join's lost insert race, retried.
    assert_eq!(
        counter(
            &all,
            "membership_lwt_conflicts_total",
            &with(&[("step", "join")])
        ),
        1
    );

    // The table's own series (the wrapped in-memory table; the fault wrapper records nothing).
    assert_eq!(counter(&all, "membership_cleanup_removed_total", &table), 1);
    assert!(
        counter(
            &all,
            OPERATIONS,
            &with(&[("operation", "cleanup_defunct"), ("outcome", "ok")])
        ) >= 1
    );
    let beats = counter(
        &all,
        OPERATIONS,
        &with(&[("operation", "update_i_am_alive"), ("outcome", "ok")]),
    );
    assert_eq!(
        beats, ok,
        "every successful heartbeat is one answered table call (the failed ones never reached it)"
    );
    assert_eq!(
        histogram(
            &all,
            DURATION,
            &with(&[("operation", "update_i_am_alive"), ("outcome", "ok")])
        )
        .len() as u64,
        beats,
        "one latency per call"
    );
    assert_eq!(
        counter(
            &all,
            OPERATIONS,
            &with(&[("operation", "insert_row"), ("outcome", "conflict")])
        ),
        1,
        "the direct duplicate insert (the injected lost race never reached the table)"
    );
    assert_eq!(
        counter(
            &all,
            OPERATIONS,
            &with(&[("operation", "delete_cluster"), ("outcome", "error")])
        ),
        1
    );
    // Every series carries service and cluster; the per-silo ones their silo.
    for (name, by_labels) in &all {
        for labels in by_labels.keys() {
            assert_eq!(labels.get("cluster"), Some(&cluster), "{name}{labels:?}");
            assert_eq!(
                labels.get("service").map(String::as_str),
                Some(""),
                "{name}"
            );
            let per_silo = name.starts_with("membership_heartbeats")
                || name.starts_with("membership_lease")
                || name.starts_with("membership_silo")
                || name.starts_with("membership_fences");
            assert_eq!(labels.contains_key("silo"), per_silo, "{name}{labels:?}");
        }
    }
}

/// The contact point of the real node (`CASSANDRA_CONTACT_POINTS`, first of them).
fn contact_point() -> String {
    std::env::var("CASSANDRA_CONTACT_POINTS")
        .ok()
        .and_then(|p| p.split(',').next().map(|s| s.trim().to_owned()))
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "127.0.0.1:9042".into())
}

/// Every trait call of the Cassandra table records its operation, outcome and latency under the
/// table's service and cluster: what direct table users and adapters get without the runtime.
#[test]
fn the_cassandra_table_records_every_operation_by_outcome_with_its_latency() {
    let cluster = format!("metrics-{}", uuid::Uuid::new_v4());
    let service = "metrics-svc";
    let all = with_recorder(false, || async {
        let options = CassandraClusteringOptions::default()
            .keyspace("cm_metrics")
            .service_id(service)
            .cluster_id(cluster.clone())
            .contact_points([contact_point()])
            .create_keyspace_simple(1);
        let table = match CassandraMembershipTable::connect(options.clone()).await {
            Ok(t) => t,
            Err(e) => panic!(
                "no Cassandra node at {} ({e}): start one with scripts/cassandra.sh start",
                contact_point()
            ),
        };
        table.initialize(true).await.unwrap();
        let me: SiloAddress = "10.0.0.1:11111@1".parse().unwrap();
        let stranger: SiloAddress = "10.0.0.9:11111@1".parse().unwrap();
        let version = table.read_all().await.unwrap().version;
        let old = Timestamp::now().saturating_sub(Duration::from_secs(3600));
        let mut entry = MembershipEntry::new(me, SiloStatus::Dead, old);
        entry.start_time = old;
        assert!(table.insert_row(&entry, &version.next()).await.unwrap());
        assert!(!table.insert_row(&entry, &version.next()).await.unwrap());
        table.update_i_am_alive(&me, old).await.unwrap();
        table
            .update_i_am_alive(&stranger, Timestamp::now())
            .await
            .unwrap();
        let cutoff = Timestamp::now().saturating_sub(Duration::from_secs(60));
        assert_eq!(table.cleanup_defunct(cutoff).await.unwrap(), 1);
        table.delete_cluster(&cluster).await.unwrap();
        // A keyspace that does not exist, not created: initialize fails.
        let mut absent = options.keyspace(format!("cm_absent_{}", uuid::Uuid::new_v4().simple()));
        absent.create_keyspace_with_replication = None;
        let absent = CassandraMembershipTable::connect(absent).await.unwrap();
        let err = absent.initialize(true).await.unwrap_err();
        assert!(
            !matches!(err, MembershipError::OutcomeUnknown { .. }),
            "{err}"
        );
    });
    let at = |operation: &'static str, outcome: &'static str| {
        vec![
            ("service", service),
            ("cluster", cluster.as_str()),
            ("operation", operation),
            ("outcome", outcome),
        ]
    };
    for (operation, outcome, n) in [
        ("initialize", "ok", 1),
        ("read_all", "ok", 1),
        ("insert_row", "ok", 1),
        ("insert_row", "conflict", 1),
        ("update_i_am_alive", "ok", 1),
        ("update_i_am_alive", "conflict", 1),
        ("cleanup_defunct", "ok", 1),
        ("delete_cluster", "ok", 1),
        ("initialize", "error", 1),
    ] {
        let labels = at(operation, outcome);
        assert_eq!(
            counter(&all, OPERATIONS, &labels),
            n,
            "{operation} {outcome}"
        );
        let took = histogram(&all, DURATION, &labels);
        assert_eq!(
            took.len() as u64,
            n,
            "{operation} {outcome}: one latency per call"
        );
        // A round trip to the node: more than nothing, less than the request timeout.
        assert!(
            took.iter().all(|&s| s > 0.0 && s < 30.0),
            "{operation} {outcome}: {took:?}"
        );
    }
    assert_eq!(
        counter(
            &all,
            "membership_cleanup_removed_total",
            &[("service", service), ("cluster", cluster.as_str())]
        ),
        1
    );
    assert_eq!(
        all[OPERATIONS].len(),
        9,
        "no other operation or outcome: {:?}",
        all[OPERATIONS].keys()
    );
}

#[path = "common/tombstones.rs"]
mod buried;

/// Row tombstones written past the provider into `cluster`'s partition of `table`.
async fn bury(table: &CassandraMembershipTable, service: &str, cluster: &str, n: usize) {
    buried::bury(
        table.session(),
        table.qualified_table(),
        service,
        cluster,
        n,
    )
    .await;
}

/// The tombstones a read of the cluster's partition reports scanning are a gauge (the distance
/// to the cliff), and a read the node aborts for them is an outcome of its own, not `error`.
/// Real node (its default thresholds: warning past 1,000, failure past 100,000).
#[test]
fn the_tombstones_a_read_scans_are_a_gauge_and_the_cliff_an_outcome_of_its_own() {
    let cluster = format!("metrics-tombstones-{}", uuid::Uuid::new_v4());
    let service = "metrics-svc";
    let mut gauges = Vec::new();
    let all = with_recorder(false, || async {
        let options = CassandraClusteringOptions::default()
            .keyspace("cm_metrics")
            .service_id(service)
            .cluster_id(cluster.clone())
            .contact_points([contact_point()])
            .create_keyspace_simple(1);
        let table = CassandraMembershipTable::connect(options).await.unwrap();
        table.initialize(true).await.unwrap();
        table.read_all().await.unwrap();
        bury(&table, service, &cluster, 2_500).await;
        table.read_all().await.unwrap();
        gauges.push(table.tombstones_scanned());
        bury(&table, service, &cluster, 100_100).await;
        let err = table.read_all().await.unwrap_err();
        assert!(
            matches!(err, MembershipError::TooManyTombstones { .. }),
            "{err:?}"
        );
    });
    // Removed outside the recorder: its final read (below the warning) would zero the gauge.
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let options = CassandraClusteringOptions::default()
            .keyspace("cm_metrics")
            .service_id(service)
            .cluster_id(cluster.clone())
            .contact_points([contact_point()]);
        let table = CassandraMembershipTable::connect(options).await.unwrap();
        // Past the 10 s the partition deletion is stamped back (see docs::tombstones).
        tokio::time::sleep(Duration::from_secs(11)).await;
        table.delete_cluster(&cluster).await.unwrap();
        table.read_all().await.unwrap();
        assert_eq!(
            table.tombstones_scanned(),
            None,
            "none once it is deleted whole"
        );
    });
    let pairs = [("service", service), ("cluster", cluster.as_str())];
    assert_eq!(gauges, [Some(2_500)]);
    assert_eq!(
        gauge(
            &all,
            "membership_table_tombstones_scanned",
            &pairs,
            Unit::Count
        ),
        2_500.0
    );
    let at = |outcome| {
        vec![
            ("service", service),
            ("cluster", cluster.as_str()),
            ("operation", "read_all"),
            ("outcome", outcome),
        ]
    };
    assert_eq!(counter(&all, OPERATIONS, &at("ok")), 2);
    assert_eq!(counter(&all, OPERATIONS, &at("tombstones")), 1);
    assert!(
        !all[OPERATIONS].contains_key(&labels(&at("error"))),
        "no read_all counted as a plain error"
    );
}

/// A table call its caller stopped waiting for (the runtime's `table_operation_timeout` bound,
/// a host's own timeout) is counted, as `cancelled`, with the time it ran: those are the calls
/// that fence a silo. Real node.
#[test]
fn a_table_call_its_caller_stopped_waiting_for_is_counted_as_cancelled() {
    let cluster = format!("metrics-{}", uuid::Uuid::new_v4());
    let service = "metrics-svc";
    let all = with_recorder(false, || async {
        let options = CassandraClusteringOptions::default()
            .keyspace("cm_metrics")
            .service_id(service)
            .cluster_id(cluster.clone())
            .contact_points([contact_point()])
            .create_keyspace_simple(1);
        let table = CassandraMembershipTable::connect(options)
            .await
            .unwrap_or_else(|e| panic!("no Cassandra node at {} ({e})", contact_point()));
        table.initialize(true).await.unwrap();
        // Polled once (it sent its query; no answer can be there yet), then dropped.
        let mut read = table.read_all(); // a boxed future (async_trait)
        let first = std::future::poll_fn(|cx| {
            std::task::Poll::Ready(std::future::Future::poll(read.as_mut(), cx))
        })
        .await;
        assert!(first.is_pending(), "the read answered at its first poll");
        drop(read);
        table.delete_cluster(&cluster).await.unwrap();
    });
    let labels = [
        ("service", service),
        ("cluster", cluster.as_str()),
        ("operation", "read_all"),
        ("outcome", "cancelled"),
    ];
    assert_eq!(counter(&all, OPERATIONS, &labels), 1);
    let took = histogram(&all, DURATION, &labels);
    assert_eq!(took.len(), 1, "one latency: {took:?}");
    assert!(took[0] > 0.0 && took[0] < 1.0, "{took:?}");
}

/// A paused clock and an in-memory table with expiry (so leases have headroom) and no cleanup.
fn leased_table(cluster: &str, clock: &Arc<TokioClock>) -> Arc<InMemoryMembershipTable> {
    let o = MembershipOptions::default()
        .i_am_alive_table_publish_timeout(Duration::from_secs(10))
        .defunct_silo_cleanup_period(None);
    Arc::new(
        InMemoryMembershipTable::new(cluster)
            .with_options(o)
            .with_clock(clock.clone())
            .with_expiry(Duration::from_secs(3600)),
    )
}

/// Joins `address` on `table` and waits until it is Healthy.
async fn healthy(
    table: Arc<InMemoryMembershipTable>,
    address: &str,
    clock: &Arc<TokioClock>,
) -> Silo {
    let silo = Silo::builder(table, address.parse().unwrap())
        .clock(clock.clone())
        .join()
        .await
        .unwrap();
    silo.health()
        .wait_for(|h| matches!(h, SiloHealth::Healthy { .. }))
        .await
        .unwrap();
    silo
}

/// The per-silo gauges of `10.0.0.1:11111` on `cluster`: serving, headroom, and the info of
/// each generation.
fn silo_gauges(all: &Recorded, cluster: &str) -> (f64, f64, BTreeMap<String, f64>) {
    let silo = [
        ("service", ""),
        ("cluster", cluster),
        ("silo", "10.0.0.1:11111"),
    ];
    let serving = gauge(all, "membership_silo_serving", &silo, Unit::Count);
    let headroom = gauge(
        all,
        "membership_lease_headroom_seconds",
        &silo,
        Unit::Seconds,
    );
    let info = all["membership_silo_info"]
        .iter()
        .map(|(labels, s)| {
            let DebugValue::Gauge(v) = s.value else {
                panic!("{s:?}")
            };
            (labels["generation"].clone(), v.into_inner())
        })
        .collect();
    (serving, headroom, info)
}

/// After `leave()` the silo has no lease and does not serve: its gauges say 0, not the last
/// healthy values (not the last ones, for ever).
#[test]
fn a_silo_that_left_reports_neither_serving_nor_lease_headroom() {
    let cluster = format!("metrics-{}", uuid::Uuid::new_v4());
    let all = with_recorder(true, || async {
        let clock = Arc::new(TokioClock::new());
        let silo = healthy(leased_table(&cluster, &clock), "10.0.0.1:11111@1", &clock).await;
        silo.leave().await.unwrap();
        tokio::time::sleep(Duration::from_secs(60)).await;
    });
    let (serving, headroom, info) = silo_gauges(&all, &cluster);
    assert_eq!((serving, headroom), (0.0, 0.0));
    assert_eq!(info, BTreeMap::from([("1".to_owned(), 0.0)]));
}

/// `crash()` publishes no final state, but its gauges go to 0 too (serving
/// must not stay 1 for an incarnation that no longer exists).
#[test]
fn a_crashed_silo_reports_neither_serving_nor_lease_headroom() {
    let cluster = format!("metrics-{}", uuid::Uuid::new_v4());
    let all = with_recorder(true, || async {
        let clock = Arc::new(TokioClock::new());
        let silo = healthy(leased_table(&cluster, &clock), "10.0.0.1:11111@1", &clock).await;
        silo.crash();
        tokio::time::sleep(Duration::from_secs(60)).await;
    });
    let (serving, headroom, info) = silo_gauges(&all, &cluster);
    assert_eq!((serving, headroom), (0.0, 0.0));
    assert_eq!(info, BTreeMap::from([("1".to_owned(), 0.0)]));
}

/// A silo declared dead stops (its gauges 0), and its rejoin as a new incarnation of the same
/// endpoint reuses the endpoint's series instead of minting new ones: `silo` is `ip:port`,
/// and `membership_silo_info` says which generation is current.
#[test]
fn a_declared_dead_silo_stops_and_its_rejoin_reuses_the_endpoint_s_series() {
    let cluster = format!("metrics-{}", uuid::Uuid::new_v4());
    let (at_death, all) = {
        let mut at_death = None;
        let all = with_recorder(true, || async {
            let clock = Arc::new(TokioClock::new());
            let table = leased_table(&cluster, &clock);
            let first = healthy(table.clone(), "10.0.0.1:11111@1", &clock).await;
            let me = first.address();
            assert!(
                cassandra_membership::runtime::protocol::set_status(
                    table.as_ref(),
                    &me,
                    SiloStatus::Dead,
                    clock.now()
                )
                .await
                .unwrap()
            );
            assert_eq!(
                first.wait_final(Duration::from_secs(120)).await,
                SiloHealth::DeclaredDead
            );
            at_death = Some(first.health().borrow().clone());
            first.crash(); // what a host does with a dead incarnation: no effect on the gauges
            let second = healthy(table.clone(), "10.0.0.1:11111@2", &clock).await;
            tokio::time::sleep(Duration::from_secs(30)).await;
            assert!(second.health().borrow().should_serve());
            // `second` is still running when the recorder is read: not dropped, as a drop is a
            // crash and zeroes its gauges (the runtime's end stops its tasks).
            std::mem::forget(second);
        });
        (at_death, all)
    };
    assert_eq!(at_death, Some(SiloHealth::DeclaredDead));
    let (serving, headroom, info) = silo_gauges(&all, &cluster);
    assert_eq!(serving, 1.0, "the second incarnation serves");
    assert!(
        headroom > 3000.0,
        "the second incarnation's headroom: {headroom}"
    );
    assert_eq!(
        info,
        BTreeMap::from([("1".to_owned(), 0.0), ("2".to_owned(), 1.0)])
    );
    // One series per endpoint: no silo label carries a generation.
    for (name, by_labels) in &all {
        for labels in by_labels.keys() {
            if let Some(silo) = labels.get("silo") {
                assert_eq!(silo, "10.0.0.1:11111", "{name}{labels:?}");
            }
        }
    }
    let beats: u64 = all["membership_heartbeats_total"]
        .values()
        .map(|s| match s.value {
            DebugValue::Counter(n) => n,
            ref other => panic!("{other:?}"),
        })
        .sum();
    assert!(beats >= 4, "both incarnations count in one series: {beats}");
}

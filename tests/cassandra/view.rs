//! The cluster as silos and watchers see it, on the real node: one committed version per view,
//! versions that never go back, changes within one period plus one round, a watcher that writes
//! nothing (the table's statement counts) and rides out a node outage, and a crashed silo shown
//! Dead only after it stopped serving.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cassandra_membership::conformance::faults::{Calls, FaultyTable, Injection, Operation};
use cassandra_membership::runtime::protocol;
use cassandra_membership::{
    ClusterView, ClusterWatcher, ClusterWatcherOptions, MembershipEntry, MembershipOptions,
    MembershipTable, Silo, SiloAddress, SiloStatus, Timestamp,
};
use scylla_proxy::{Condition, Reaction, RequestOpcode, RequestReaction, RequestRule};
use tokio_stream::StreamExt;

use crate::outcomes::proxied;
use crate::utils::{options, session, session_with_keyspace, table_on, unique};

fn address(n: u16) -> SiloAddress {
    let generation = (Timestamp::now().as_millis() / 1000) as i32;
    SiloAddress::new(
        format!("127.0.0.1:{}", 14000 + n).parse().unwrap(),
        generation,
    )
    .unwrap()
}

/// A 1 s publish period (and so a 1 s call timeout), no cleanup.
fn fast() -> MembershipOptions {
    let mut m = MembershipOptions::default();
    m.i_am_alive_table_publish_timeout = Duration::from_secs(1);
    m.defunct_silo_cleanup_period = None;
    m
}

/// Every view `rx` is told of from now on (the current one first).
fn record_views(mut rx: tokio::sync::watch::Receiver<ClusterView>) -> Arc<Mutex<Vec<ClusterView>>> {
    let seen = Arc::new(Mutex::new(vec![rx.borrow_and_update().clone()]));
    let out = seen.clone();
    tokio::spawn(async move {
        while rx.changed().await.is_ok() {
            let v = rx.borrow_and_update().clone();
            out.lock().unwrap().push(v);
        }
    });
    seen
}

type Membership = BTreeSet<(SiloAddress, SiloStatus)>;

fn membership_of(entries: impl IntoIterator<Item = MembershipEntry>) -> Membership {
    entries.into_iter().map(|e| (e.address, e.status)).collect()
}

/// Records what the committed version `table` reads now holds.
async fn note(table: &dyn MembershipTable, ledger: &mut HashMap<u64, Membership>) -> u64 {
    let snap = table.read_all().await.unwrap();
    let m = membership_of(snap.rows.into_iter().map(|r| r.entry));
    ledger.insert(snap.version.version, m);
    snap.version.version
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_silo_view_is_one_committed_version_and_versions_never_go_back() {
    let s = session_with_keyspace().await;
    let o = options(&unique("view-versions")).membership(fast());
    let writer = table_on(&s, o.clone());
    let mut silos = Vec::new();
    for n in 1..=3 {
        // A table value per silo, as separate processes have.
        let t: Arc<dyn MembershipTable> = Arc::new(table_on(&s, o.clone()));
        silos.push(Silo::join(t, address(n)).await.unwrap());
    }
    let seen: Vec<_> = silos.iter().map(|s| record_views(s.view())).collect();
    let mut ledger: HashMap<u64, Membership> = HashMap::new();
    let start = note(&writer, &mut ledger).await;
    for n in 10..14u16 {
        let e = MembershipEntry::new(address(n), SiloStatus::Joining, Timestamp::now());
        protocol::join(&writer, &e).await.unwrap();
        note(&writer, &mut ledger).await;
        tokio::time::sleep(Duration::from_millis(u64::from(n % 3) * 400)).await;
        for status in [SiloStatus::Active, SiloStatus::Dead] {
            assert!(
                protocol::set_status(&writer, &e.address, status, Timestamp::now())
                    .await
                    .unwrap()
            );
            note(&writer, &mut ledger).await;
            tokio::time::sleep(Duration::from_millis(u64::from(n % 2) * 700)).await;
        }
    }
    let last = note(&writer, &mut ledger).await;
    for silo in &silos {
        // A round or two (1 s each), with room for a shared node's slow reads.
        tokio::time::timeout(
            Duration::from_secs(15),
            silo.view().wait_for(|v| v.version().version >= last),
        )
        .await
        .expect("every view reaches the last version")
        .unwrap();
    }
    // The recorders have taken the last change too.
    tokio::time::sleep(Duration::from_millis(100)).await;
    for (silo, seen) in silos.iter().zip(&seen) {
        let seen = seen.lock().unwrap();
        let versions: Vec<u64> = seen.iter().map(|v| v.version().version).collect();
        assert!(
            versions.windows(2).all(|w| w[0] <= w[1]),
            "{}: {versions:?}",
            silo.address()
        );
        for v in seen.iter().filter(|v| v.version().version >= start) {
            assert_eq!(
                Some(&membership_of(v.entries().iter().cloned())),
                ledger.get(&v.version().version),
                "{}: the view at version {} is not that version",
                silo.address(),
                v.version().version
            );
        }
        assert_eq!(versions.last(), Some(&last), "{}", silo.address());
        let distinct: BTreeSet<_> = versions.iter().filter(|v| **v > start).collect();
        assert!(distinct.len() >= 4, "{}: {versions:?}", silo.address());
    }
    for s in silos {
        s.leave().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_shows_in_every_silo_view_within_one_period_plus_one_round() {
    let s = session_with_keyspace().await;
    // Calls may take 3 s on a busy shared node before a round counts as failed (and a silo is
    // suspected after 10 silent periods, which that call timeout requires).
    let m = fast()
        .table_operation_timeout(Some(Duration::from_secs(3)))
        .num_missed_table_i_am_alive_limit(10);
    let o = options(&unique("view-fresh")).membership(m.clone());
    let writer = table_on(&s, o.clone());
    let mut silos = Vec::new();
    for n in 21..=23 {
        let t: Arc<dyn MembershipTable> = Arc::new(table_on(&s, o.clone()));
        silos.push(Silo::join(t, address(n)).await.unwrap());
    }
    // One period, plus one round: nobody is suspected, so one read_all within the call timeout.
    let bound = m.i_am_alive_table_publish_timeout + m.effective_table_operation_timeout();
    let mut worst = Duration::ZERO;
    for i in 0..3u16 {
        tokio::time::sleep(Duration::from_millis(300 + 350 * u64::from(i))).await;
        let mut views: Vec<_> = silos.iter().map(Silo::views).collect();
        let e = MembershipEntry::new(address(30 + i), SiloStatus::Joining, Timestamp::now());
        protocol::join(&writer, &e).await.unwrap();
        let committed = Instant::now();
        for v in &mut views {
            while tokio::time::timeout(bound * 3, v.next())
                .await
                .expect("a view within three times the bound")
                .unwrap()
                .get(&e.address)
                .is_none()
            {}
        }
        worst = worst.max(committed.elapsed());
    }
    eprintln!("the slowest of 3 changes reached all 3 views after {worst:?}");
    assert!(worst <= bound, "{worst:?} > {bound:?}");
    for s in silos {
        s.leave().await.unwrap();
    }
}

/// The next view `views` yields, within 30 s.
async fn next_view(
    views: &mut (impl tokio_stream::Stream<Item = ClusterView> + Unpin),
) -> ClusterView {
    tokio::time::timeout(Duration::from_secs(30), views.next())
        .await
        .expect("a view within 30 s")
        .expect("the watcher runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_follows_the_cluster_and_writes_nothing() {
    let s = session_with_keyspace().await;
    let o = options(&unique("watcher")).membership(fast());
    let host: Arc<dyn MembershipTable> = Arc::new(table_on(&s, o.clone()));
    host.initialize(true).await.unwrap();
    // The watcher's table on a session of its own: the counts are its statements only.
    let mine = Arc::new(table_on(&session().await, o.clone()));
    // The watcher's reads get a bound of their own: the host's 1 s bound is for its heartbeats,
    // and a serial read on a loaded machine can take longer (start fails when its read does).
    let watcher = ClusterWatcher::start(
        mine.clone(),
        ClusterWatcherOptions::default()
            .refresh_period(Duration::from_millis(200))
            .read_timeout(Some(Duration::from_secs(10))),
    )
    .await
    .unwrap();
    let mut views = watcher.views();
    assert!(views.next().await.unwrap().entries().is_empty());
    let silo = Silo::join(host.clone(), address(41)).await.unwrap();
    // Each change is waited for with a bound (a refresh that failed publishes a stale view too).
    while !next_view(&mut views).await.is_member(&silo.address()) {}
    let address = silo.address();
    silo.leave().await.unwrap();
    while !next_view(&mut views).await.is_dead(&address) {}
    // It keeps polling: ten serial reads more, at a 200 ms period (bounded, not timed).
    let before = mine.statement_counts().serial_reads;
    let polling = Instant::now();
    while mine.statement_counts().serial_reads < before + 10 {
        assert!(
            polling.elapsed() < Duration::from_secs(60),
            "the watcher stopped reading: {:?}",
            mine.statement_counts()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    watcher.stop().await;
    let counts = mine.statement_counts();
    eprintln!(
        "the watcher's statements (ten reads took {:?} at a 200 ms period): {counts:?}",
        polling.elapsed()
    );
    assert_eq!(counts.plain_writes, 0, "{counts:?}");
    assert_eq!(counts.conditional_writes, 0, "{counts:?}");
    assert!(counts.serial_reads >= before + 10, "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_keeps_its_view_marked_stale_while_the_node_is_unreachable_and_recovers() {
    let cluster = unique("watcher-outage");
    let (mut proxy, proxied) = proxied(&cluster).await;
    let s = session_with_keyspace().await;
    let host: Arc<dyn MembershipTable> =
        Arc::new(table_on(&s, options(&cluster).membership(fast())));
    let first = Silo::join(host.clone(), address(51)).await.unwrap();
    let watcher = ClusterWatcher::start(
        Arc::new(proxied),
        ClusterWatcherOptions::default()
            .refresh_period(Duration::from_millis(300))
            .read_timeout(Some(Duration::from_secs(1))),
    )
    .await
    .unwrap();
    let mut rx = watcher.view();
    let before = rx.borrow_and_update().clone();
    assert!(before.is_member(&first.address()));
    // The node goes silent for the watcher: every request is swallowed.
    proxy.running_nodes[0].change_request_rules(Some(vec![RequestRule(
        Condition::any([
            Condition::RequestOpcode(RequestOpcode::Query),
            Condition::RequestOpcode(RequestOpcode::Prepare),
            Condition::RequestOpcode(RequestOpcode::Execute),
            Condition::RequestOpcode(RequestOpcode::Batch),
        ]),
        RequestReaction::drop_frame(),
    )]));
    let down = Timestamp::now();
    tokio::time::timeout(Duration::from_secs(5), rx.changed())
        .await
        .unwrap()
        .unwrap();
    let second = Silo::join(host.clone(), address(52)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stale = watcher.current();
    let st = stale.stale().expect("marked stale");
    eprintln!("stale: {st:?}, age {:?}", stale.age(Timestamp::now()));
    assert_eq!(stale.version(), before.version());
    assert!(!stale.is_member(&second.address()));
    assert!(st.since >= down && st.failed_refreshes >= 2, "{st:?}");
    assert!(stale.age(Timestamp::now()) >= Duration::from_secs(3));
    proxy.running_nodes[0].change_request_rules(None);
    let back = loop {
        tokio::time::timeout(Duration::from_secs(10), rx.changed())
            .await
            .expect("recovers within 10 s")
            .unwrap();
        let v = rx.borrow_and_update().clone();
        if !v.is_stale() {
            break v;
        }
    };
    assert!(back.is_member(&second.address()) && back.is_member(&first.address()));
    assert!(back.version().version > before.version().version);
    drop(watcher);
    first.leave().await.unwrap();
    second.leave().await.unwrap();
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_silo_shows_dead_in_every_survivor_view_only_after_it_stopped_serving() {
    let s = session_with_keyspace().await;
    let o = options(&unique("view-crash")).membership(fast());
    let mut survivors = Vec::new();
    for n in 61..=62 {
        let t: Arc<dyn MembershipTable> = Arc::new(table_on(&s, o.clone()));
        survivors.push(Silo::join(t, address(n)).await.unwrap());
    }
    let cut = Arc::new(FaultyTable::new(Arc::new(table_on(&s, o))));
    let victim = Silo::join(cut.clone(), address(63)).await.unwrap();
    let fence = victim.fence();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for s in &survivors {
        assert!(s.view().borrow().is_member(&victim.address()));
    }
    // Still running, but storage is out of reach: every call fails.
    cut.inject(Injection::timeout(Calls::any_of(Operation::ALL), "cut off"));
    let crashed = Instant::now();
    let m = fast();
    // docs::sharding: horizon + two periods (+ the rounds' calls), from the last heartbeat.
    let bound = m.detection_horizon() + 2 * m.i_am_alive_table_publish_timeout;
    let (mut stopped_serving, mut dead_in) = (None, vec![None; survivors.len()]);
    // docs::sharding's bound in full: + one period per vote that lost a race, + the rounds'
    // calls — a vote's round is a read, a conditional write and a re-read, each within
    // table_operation_timeout (a loaded two-core run measured 9.1 s against the 5 s bound alone).
    let votes = m.num_votes_for_death_declaration;
    let documented = bound
        + votes * m.i_am_alive_table_publish_timeout
        + votes * 3 * m.effective_table_operation_timeout();
    while crashed.elapsed() <= documented * 2 && dead_in.iter().any(Option::is_none) {
        if stopped_serving.is_none() && !fence.should_serve() {
            stopped_serving = Some(crashed.elapsed());
        }
        for (s, dead) in survivors.iter().zip(&mut dead_in) {
            if dead.is_none() && s.view().borrow().is_dead(&victim.address()) {
                *dead = Some(crashed.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "cut off: stopped serving after {stopped_serving:?}, Dead in the views after {dead_in:?}"
    );
    let stopped_serving = stopped_serving.expect("the cut-off silo fenced itself");
    for (s, dead) in survivors.iter().zip(&dead_in) {
        let dead = dead.unwrap_or_else(|| panic!("{} never saw it Dead", s.address()));
        assert!(
            stopped_serving < dead,
            "{}: Dead after {dead:?}, served until {stopped_serving:?}",
            s.address()
        );
        assert!(dead <= documented, "{dead:?} > {documented:?}");
        let v = s.view().borrow().clone();
        assert_eq!(
            v.get(&victim.address()).map(|e| e.status),
            Some(SiloStatus::Dead)
        );
    }
    victim.crash();
    for s in survivors {
        s.leave().await.unwrap();
    }
}

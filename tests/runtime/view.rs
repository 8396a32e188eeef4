//! The cluster as a silo sees it (`Silo::view`): one committed version per view, versions that
//! never go backwards, changes within one period plus one read, no statement of its own, and a
//! crashed silo shown Dead only after it stopped serving.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cassandra_membership::conformance::faults::{Calls, Injection, Operation};
use cassandra_membership::runtime::protocol;
use cassandra_membership::{
    Clock, ClusterView, MembershipTable, Silo, SiloAddress, SiloStatus, TokioClock,
};
use tokio::time::Instant;
use tokio_stream::StreamExt;

use crate::utils::{address, entry_at, faulty, join, memory, options};

/// Every view `rx` is told of from now on (the current one first).
pub(crate) fn record_views(
    mut rx: tokio::sync::watch::Receiver<ClusterView>,
) -> Arc<Mutex<Vec<ClusterView>>> {
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

fn membership(v: &ClusterView) -> Membership {
    v.entries().iter().map(|e| (e.address, e.status)).collect()
}

#[tokio::test(start_paused = true)]
async fn a_silo_view_starts_at_its_join_and_lists_every_entry_with_its_fields() {
    let clock = Arc::new(TokioClock::new());
    let table = memory(&clock);
    let first = Silo::builder(Arc::new(table.clone()), address(1))
        .clock(clock.clone())
        .silo_name("silo-1")
        .proxy_port(30001)
        .role_name("frontend")
        .fault_zone(2)
        .join()
        .await
        .unwrap();
    // At once, from the join's read: no period to wait.
    let view = first.view().borrow().clone();
    assert!(view.is_member(&address(1)));
    assert_eq!(view.version(), &table.read_all().await.unwrap().version);
    let second = join(Arc::new(table.clone()), 2, &clock).await;
    let view = second.view().borrow().clone();
    assert_eq!(
        view.active().map(|e| e.address).collect::<Vec<_>>(),
        [address(1), address(2)]
    );
    let e = view.get(&address(1)).unwrap();
    assert_eq!(
        (e.silo_name.as_str(), e.role_name.as_str(), e.fault_zone),
        ("silo-1", "frontend", 2)
    );
    // Only the first has a proxy port: the one gateway, at its IP.
    assert_eq!(
        view.gateways().collect::<Vec<_>>(),
        ["10.0.0.1:30001".parse().unwrap()]
    );
    // Never joined: not a member, and not dead either (no entry is no proof).
    assert!(!view.is_dead(&address(9)) && !view.is_member(&address(9)));
    first.leave().await.unwrap();
    second.leave().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn each_view_is_one_committed_version_and_a_receiver_never_sees_one_go_back() {
    let clock = Arc::new(TokioClock::new());
    let table = memory(&clock);
    let mut silos = Vec::new();
    for n in 1..=3 {
        silos.push(join(Arc::new(table.clone()), n, &clock).await);
    }
    let seen: Vec<_> = silos.iter().map(|s| record_views(s.view())).collect();
    // What each committed version holds, from here on: every change below is ours.
    let mut ledger: HashMap<u64, Membership> = HashMap::new();
    let snapshot = table.read_all().await.unwrap();
    let start = snapshot.version.version;
    let ledger_of = |s: &cassandra_membership::MembershipSnapshot| {
        s.rows
            .iter()
            .map(|r| (r.entry.address, r.entry.status))
            .collect::<Membership>()
    };
    ledger.insert(start, ledger_of(&snapshot));
    for n in 10..16u8 {
        protocol::join(&table, &entry_at(n, clock.as_ref()))
            .await
            .unwrap();
        let s = table.read_all().await.unwrap();
        ledger.insert(s.version.version, ledger_of(&s));
        // Some changes land between two rounds, some several within one.
        tokio::time::sleep(Duration::from_secs(u64::from(n % 3) * 4)).await;
        for status in [SiloStatus::Active, SiloStatus::Dead] {
            protocol::set_status(&table, &address(n), status, clock.now())
                .await
                .unwrap();
            let s = table.read_all().await.unwrap();
            ledger.insert(s.version.version, ledger_of(&s));
            tokio::time::sleep(Duration::from_secs(u64::from(n % 2) * 7)).await;
        }
    }
    tokio::time::sleep(Duration::from_secs(11)).await;
    let last = table.read_all().await.unwrap().version.version;
    for (silo, seen) in silos.iter().zip(&seen) {
        let seen = seen.lock().unwrap();
        let versions: Vec<u64> = seen.iter().map(|v| v.version().version).collect();
        assert!(
            versions.windows(2).all(|w| w[0] <= w[1]),
            "{}: versions went back: {versions:?}",
            silo.address()
        );
        for v in seen.iter().filter(|v| v.version().version >= start) {
            assert_eq!(
                Some(&membership(v)),
                ledger.get(&v.version().version),
                "{}: the view at version {} is not that version",
                silo.address(),
                v.version().version
            );
        }
        assert_eq!(versions.last(), Some(&last), "{}", silo.address());
        // Not vacuous: the receiver saw many of the 18 versions.
        let distinct: BTreeSet<_> = versions.iter().filter(|v| **v > start).collect();
        assert!(distinct.len() >= 6, "{}: {versions:?}", silo.address());
    }
    for s in silos {
        s.leave().await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_change_shows_in_every_silo_view_within_one_period_plus_one_read_at_no_extra_read() {
    let clock = Arc::new(TokioClock::new());
    let inner = memory(&clock);
    // Each silo on a table value of its own that counts its calls.
    let tables: Vec<_> = (0..3).map(|_| faulty(inner.clone())).collect();
    let (mut silos, mut joined) = (Vec::new(), Vec::new());
    for (n, t) in (1..=3).zip(&tables) {
        silos.push(join(t.clone(), n, &clock).await);
        joined.push(Instant::now());
    }
    for round in 0..4u64 {
        // Anywhere within a period.
        tokio::time::sleep(Duration::from_millis(2_300 * round + 700)).await;
        let n = 20 + round as u8;
        protocol::join(&inner, &entry_at(n, clock.as_ref()))
            .await
            .unwrap();
        let committed = Instant::now();
        let mut views: Vec<_> = silos.iter().map(Silo::views).collect();
        for v in &mut views {
            loop {
                let view = tokio::time::timeout(Duration::from_secs(30), v.next())
                    .await
                    .unwrap()
                    .unwrap();
                if view.get(&address(n)).is_some() {
                    break;
                }
            }
        }
        // One publish period (10 s); a read on the in-memory table takes no paused time.
        assert!(
            committed.elapsed() <= options().i_am_alive_table_publish_timeout,
            "{:?}",
            committed.elapsed()
        );
    }
    // The view costs no statement: one read_all for the join, one per detection round (every
    // period, nobody suspected), as without it.
    let period = options().i_am_alive_table_publish_timeout;
    for ((t, s), joined) in tables.iter().zip(&silos).zip(&joined) {
        let rounds = (joined.elapsed().as_millis() / period.as_millis()) as u64;
        assert_eq!(t.calls(Operation::ReadAll), 1 + rounds, "{}", s.address());
    }
    for s in silos {
        s.leave().await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_crashed_silo_shows_dead_in_every_survivor_view_only_after_it_stopped_serving() {
    let clock = Arc::new(TokioClock::new());
    let inner = memory(&clock);
    let mut survivors = Vec::new();
    for n in 1..=2 {
        survivors.push(join(Arc::new(inner.clone()), n, &clock).await);
    }
    let cut = faulty(inner.clone());
    let victim = join(cut.clone(), 3, &clock).await;
    let fence = victim.fence();
    // Within a period, every survivor sees it join.
    tokio::time::sleep(Duration::from_millis(10_300)).await;
    for s in &survivors {
        assert!(s.view().borrow().is_member(&address(3)));
    }
    // The process hangs on to its work but reaches storage no more: every call fails.
    cut.inject(Injection::timeout(Calls::any_of(Operation::ALL), "cut off"));
    let crashed = Instant::now();
    let mut stopped_serving = None;
    let mut dead_in = vec![None; survivors.len()];
    let o = options();
    // The bound stated in docs::sharding: horizon + two periods, from the last heartbeat.
    let bound = o.detection_horizon() + 2 * o.i_am_alive_table_publish_timeout;
    while crashed.elapsed() <= bound + Duration::from_secs(1) {
        if stopped_serving.is_none() && !fence.should_serve() {
            stopped_serving = Some(crashed.elapsed());
        }
        for (s, dead) in survivors.iter().zip(&mut dead_in) {
            if dead.is_none()
                && s.view().borrow().get(&address(3)).map(|e| e.status) == Some(SiloStatus::Dead)
            {
                *dead = Some(crashed.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stopped_serving = stopped_serving.expect("the cut-off silo fenced itself");
    eprintln!(
        "cut off: stopped serving after {stopped_serving:?}, Dead in the views after {dead_in:?}"
    );
    for (s, dead) in survivors.iter().zip(&dead_in) {
        let dead = dead.unwrap_or_else(|| panic!("{} never saw it Dead", s.address()));
        assert!(dead <= bound, "{}: Dead after {dead:?}", s.address());
        assert!(
            stopped_serving < dead,
            "{}: Dead in the view after {dead:?}, but it served until {stopped_serving:?}",
            s.address()
        );
        assert!(s.view().borrow().is_dead(&address(3)));
    }
    drop(victim);
    for s in survivors {
        s.leave().await.unwrap();
    }
}

/// `read_all` skips a row it cannot decode, so the others' views lack a silo
/// whose row is damaged while that silo still serves. Such an address is not dead: rule 3
/// (take over only once `is_dead`) never hands its share over (before: "dead or gone" was true
/// for a missing address — two owners for 30 s here, for the whole run when only the others
/// failed to decode the row).
#[tokio::test(start_paused = true)]
async fn a_silo_whose_row_the_others_cannot_read_is_not_dead_in_their_views() {
    let clock = Arc::new(TokioClock::new());
    let inner = memory(&clock);
    let table = faulty(inner.clone());
    let s1 = join(table.clone(), 1, &clock).await;
    let _s2 = join(table.clone(), 2, &clock).await;
    let s3 = join(table.clone(), 3, &clock).await;
    table.damage_row(address(3));
    let started = tokio::time::Instant::now();
    let mut overlap = Duration::ZERO;
    while started.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if s1.view().borrow().is_dead(&address(3)) && s3.should_serve() {
            overlap += Duration::from_millis(100);
        }
    }
    assert_eq!(overlap, Duration::ZERO, "two owners for {overlap:?}");
}

/// The join's first view is one read of one call after the Active write; a
/// slow read there no longer fails a join that wrote Active (before: `Err(Timeout)` and the
/// entry marked Dead). The view then starts empty and stale, and the first round fills it.
#[tokio::test(start_paused = true)]
async fn a_join_whose_active_write_lands_near_its_deadline_still_joins() {
    use cassandra_membership::conformance::faults::Gate;
    let clock = Arc::new(TokioClock::new());
    let mut o = options();
    o.max_join_attempt_time = Duration::from_secs(10);
    let inner = memory(&clock).with_options(o);
    let table = faulty(inner.clone());
    let gate = Gate::new();
    table.inject(Injection::hold(Operation::UpdateRow, &gate).times(1));
    let started = tokio::time::Instant::now();
    let joining = tokio::spawn({
        let (table, clock) = (table.clone(), clock.clone());
        async move { crate::utils::try_join(table, 1, &clock).await }
    });
    while gate.arrived() == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The one read of the first view is slower than the call allows.
    let slow = table.inject(Injection::delay(Operation::ReadAll, Duration::from_secs(20)).times(1));
    tokio::time::sleep_until(started + Duration::from_millis(9_900)).await;
    gate.release();
    let silo = joining
        .await
        .unwrap()
        .expect("the Active write succeeded in time: the join succeeds");
    table.clear(slow);
    let first = silo.view().borrow().clone();
    assert!(first.is_stale() && first.entries().is_empty(), "{first:?}");
    let mut views = silo.view();
    tokio::time::timeout(
        Duration::from_secs(30),
        views.wait_for(|v| !v.is_stale() && v.is_member(&silo.address())),
    )
    .await
    .expect("the first detection round publishes a read")
    .unwrap();
    let row = inner.read_row(&address(1)).await.unwrap();
    assert_eq!(row.rows[0].entry.status, SiloStatus::Active);
    silo.leave().await.unwrap();
}

//! The runtime on the real node: a silo learns at once that it was declared dead, is told to fence
//! before the others can declare it dead, keeps publishing when a renewal fails, and 100 silos
//! joining at once all join.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cassandra_membership::conformance::faults::{
    Calls, FaultId, FaultyTable, Gate, Injection, Operation,
};
use cassandra_membership::runtime::protocol;
use cassandra_membership::{
    HeartbeatOutcome, MembershipEntry, MembershipError, MembershipOptions, MembershipTable, Silo,
    SiloAddress, SiloHealth, SiloStatus, Timestamp,
};

use crate::utils::{KEYSPACE, options, session_with_keyspace, table_on, unique};

fn address(n: u16) -> SiloAddress {
    let generation = (Timestamp::now().as_millis() / 1000) as i32;
    SiloAddress::new(
        format!("127.0.0.1:{}", 13000 + n).parse().unwrap(),
        generation,
    )
    .unwrap()
}

fn fast() -> MembershipOptions {
    let mut m = MembershipOptions::default();
    m.i_am_alive_table_publish_timeout = Duration::from_secs(1);
    m.defunct_silo_cleanup_period = None;
    m
}

/// Cuts the network to the node for `table`'s silo: its heartbeats time out, with `reads` its
/// reads too, until the returned fault is cleared.
fn cut_off(table: &FaultyTable, reads: bool) -> FaultId {
    let calls = if reads {
        Calls::any_of([
            Operation::UpdateIAmAlive,
            Operation::ReadAll,
            Operation::ReadRow,
        ])
    } else {
        Operation::UpdateIAmAlive.into()
    };
    table.inject(Injection::timeout(calls, "cut off"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silo_declared_dead_by_another_table_value_learns_it_within_one_period() {
    let s = session_with_keyspace().await;
    let o = options(&unique("zombie")).membership(fast());
    let mine: Arc<dyn MembershipTable> = Arc::new(table_on(&s, o.clone()));
    let silo = Silo::join(Arc::clone(&mine), address(1)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(matches!(
        *silo.health().borrow(),
        SiloHealth::Healthy { .. }
    ));
    // Another silo's table value writes this silo's row Dead through update_row (read, write;
    // again when a heartbeat of the silo landed in between).
    let other = table_on(&s, o);
    assert!(
        protocol::set_status(&other, &silo.address(), SiloStatus::Dead, Timestamp::now())
            .await
            .unwrap()
    );
    let declared = Instant::now();
    // One publish period (1 s) plus a generous margin for the shared node.
    let health = silo.wait_final(Duration::from_secs(4)).await;
    assert_eq!(
        health,
        SiloHealth::DeclaredDead,
        "{:?} after the row was stored Dead",
        declared.elapsed()
    );
    eprintln!("declared dead seen after {:?}", declared.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silo_that_cannot_publish_is_told_to_fence_before_the_others_declare_it_dead() {
    let s = session_with_keyspace().await;
    let o = options(&unique("fencing")).membership(fast());
    let shared: Arc<dyn MembershipTable> = Arc::new(table_on(&s, o.clone()));
    let cut = Arc::new(FaultyTable::new(Arc::new(table_on(&s, o))));
    let a = Silo::join(cut.clone(), address(11)).await.unwrap();
    let mut others = Vec::new();
    for n in 12..=13 {
        others.push(Silo::join(Arc::clone(&shared), address(n)).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    cut_off(&cut, false);
    let start = Instant::now();
    let (mut fenced, mut dead) = (None, None);
    let health = a.health();
    while start.elapsed() < Duration::from_secs(30) && dead.is_none() {
        if fenced.is_none() && matches!(*health.borrow(), SiloHealth::LeaseAtRisk { .. }) {
            fenced = Some(start.elapsed());
        }
        if shared.read_row(&a.address()).await.unwrap().rows[0]
            .entry
            .status
            == SiloStatus::Dead
        {
            dead = Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let dead = dead.expect("the others declare it dead within 30 s");
    let fenced = fenced.unwrap_or_else(|| panic!("never told to fence; declared dead at {dead:?}"));
    eprintln!("fenced at {fenced:?}, declared dead at {dead:?}");
    assert!(
        fenced + Duration::from_millis(500) <= dead,
        "fenced at {fenced:?}, declared dead at {dead:?}"
    );
    a.crash();
    for o in others {
        o.crash();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_lease_renewal_still_publishes_the_i_am_alive_time() {
    let s = session_with_keyspace().await;
    let cluster = unique("renewal");
    let mut m = MembershipOptions::default();
    m.i_am_alive_table_publish_timeout = Duration::from_millis(500);
    m.defunct_silo_expiration = Duration::from_secs(4);
    let mut o = options(&cluster)
        .table("membership_ttl4")
        .ttl(true)
        .membership(m);
    o.ttl_renewal_interval = Some(Duration::from_secs(1));
    let t = table_on(&s, o);
    t.initialize(true).await.unwrap();
    let a = address(21);
    protocol::join(
        &t,
        &MembershipEntry::new(a, SiloStatus::Active, Timestamp::now()),
    )
    .await
    .unwrap();
    assert!(matches!(
        t.update_i_am_alive(&a, Timestamp::now()).await.unwrap(),
        HeartbeatOutcome::Refreshed { .. }
    ));
    // The version cells disappear: the next renewal (a conditional rewrite of the entry and the
    // version) cannot be written.
    s.query_unpaged(
        format!(
            "DELETE version, version_etag FROM {KEYSPACE}.membership_ttl4 WHERE service_id = ? AND cluster_id = ? AND silo = ''"
        ),
        ("test-service", cluster.as_str()),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let published = Timestamp::now();
    let outcome = t.update_i_am_alive(&a, published).await;
    // Read past the provider: its reads refuse a partition that lost its version.
    let element: Option<(Option<scylla::value::CqlTimestamp>, Option<scylla::value::CqlTimestamp>)> = s
        .query_unpaged(
            format!(
                "SELECT heartbeat FROM {KEYSPACE}.membership_ttl4 WHERE service_id = ? AND cluster_id = ? AND silo = ?"
            ),
            ("test-service", cluster.as_str(), a.to_string()),
        )
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .first_row::<(Option<(Option<scylla::value::CqlTimestamp>, Option<scylla::value::CqlTimestamp>)>,)>()
        .unwrap()
        .0;
    let stored = element.and_then(|(_, alive)| alive).map(|t| t.0);
    assert_eq!(
        stored,
        Some(published.as_millis()),
        "the I-am-alive time was not published when the renewal failed ({outcome:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn for_cluster_validates_the_cluster_id_like_the_options() {
    let s = session_with_keyspace().await;
    let t = table_on(&s, options(&unique("ids")));
    for bad in ["".to_owned(), "  ".to_owned(), "x".repeat(1025)] {
        assert!(
            matches!(
                t.for_cluster(bad.clone()),
                Err(MembershipError::InvalidConfiguration { .. })
            ),
            "{} bytes accepted",
            bad.len()
        );
    }
    t.for_cluster("x".repeat(1024)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hundred_silos_joining_at_once_all_join() {
    let s = session_with_keyspace().await;
    let mut m = MembershipOptions::default();
    m.defunct_silo_cleanup_period = None;
    let table: Arc<dyn MembershipTable> = Arc::new(table_on(
        &s,
        options(&unique("storm")).membership(m.clone()),
    ));
    table.initialize(true).await.unwrap();
    let started = Instant::now();
    let joins: Vec<_> = (0..100u16)
        .map(|n| {
            let table = Arc::clone(&table);
            tokio::spawn(async move {
                let r = Silo::join(table, address(100 + n)).await;
                (r, started.elapsed())
            })
        })
        .collect();
    let mut silos = Vec::new();
    let mut failures = Vec::new();
    let mut times = Vec::new();
    for j in joins {
        let (r, at) = j.await.unwrap();
        times.push(at);
        match r {
            Ok(silo) => silos.push(silo),
            Err(e) => failures.push(e.to_string()),
        }
    }
    times.sort();
    eprintln!(
        "join storm: {} of 100 joined; first at {:?}, median {:?}, last at {:?}",
        silos.len(),
        times[0],
        times[49],
        times[99]
    );
    assert!(
        failures.is_empty(),
        "{} failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    let snapshot = table.read_all().await.unwrap();
    assert_eq!(
        snapshot
            .rows
            .iter()
            .filter(|r| r.entry.status == SiloStatus::Active)
            .count(),
        100
    );
    for silo in silos {
        silo.crash();
    }
    table.delete_cluster(table.cluster_id()).await.unwrap();
}

/// TTL off, defaults otherwise (between renewals the Cassandra heartbeat does not look at the
/// row). The silo loses the node, fences, is declared Dead meanwhile; when the node comes back its
/// heartbeat write succeeds — it must end DeclaredDead without ever being told Healthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_silo_declared_dead_meanwhile_never_turns_healthy_when_the_node_returns() {
    let s = session_with_keyspace().await;
    // Retries every 50 ms once fenced: the heartbeat, not the detector's next read (once a
    // second), is the first to reach the node when it returns.
    let mut m = fast();
    m.heartbeat_retry_backoff = Duration::from_millis(50);
    let o = options(&unique("zombie_return")).membership(m.clone());
    let cut = Arc::new(FaultyTable::new(Arc::new(table_on(&s, o.clone()))));
    let silo = Silo::join(cut.clone(), address(31)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let link = cut_off(&cut, true);
    let mut health = silo.health();
    tokio::time::timeout(
        Duration::from_secs(10),
        health.wait_for(|h| matches!(h, SiloHealth::LeaseAtRisk { .. })),
    )
    .await
    .expect("fenced within 10 s")
    .unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let recorder = {
        let (mut rx, seen) = (silo.health(), seen.clone());
        tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let h = rx.borrow_and_update().clone();
                seen.lock().unwrap().push(h);
            }
        })
    };
    // Another silo declares it dead meanwhile.
    assert!(
        protocol::set_status(
            &table_on(&s, o),
            &silo.address(),
            SiloStatus::Dead,
            Timestamp::now()
        )
        .await
        .unwrap()
    );
    cut.clear(link);
    let last = silo.wait_final(Duration::from_secs(10)).await;
    recorder.abort();
    let seen = seen.lock().unwrap().clone();
    assert!(
        !seen.iter().any(|h| matches!(h, SiloHealth::Healthy { .. })),
        "told Healthy while its row was Dead: {seen:?}"
    );
    assert_eq!(last, SiloHealth::DeclaredDead, "{seen:?}");
    silo.crash();
}

// A silo X loses the node and fences; a detector D decides, on a read showing X silent past the
// detection horizon, to vote it dead, and its write is delayed. X comes back: it publishes, reads
// its own row Active and is told Healthy. D's vote then reaches storage: it must not apply (X
// would serve as a member while stored Dead).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vote_decided_while_a_silo_was_silent_cannot_land_after_it_was_told_healthy() {
    let s = session_with_keyspace().await;
    let mut m = fast();
    m.heartbeat_retry_backoff = Duration::from_millis(50);
    let o = options(&unique("late_vote")).membership(m.clone());
    let cut = Arc::new(FaultyTable::new(Arc::new(table_on(&s, o.clone()))));
    let x = Silo::join(cut.clone(), address(41)).await.unwrap();
    // The detector: a silo of its own (Active, heartbeating, so X never suspects it).
    let d_table: Arc<dyn MembershipTable> = Arc::new(table_on(&s, o));
    let d = address(42);
    protocol::join(
        d_table.as_ref(),
        &MembershipEntry::new(d, SiloStatus::Active, Timestamp::now()),
    )
    .await
    .unwrap();
    let d_heartbeat = {
        let t = Arc::clone(&d_table);
        tokio::spawn(async move {
            loop {
                let _ = t.update_i_am_alive(&d, Timestamp::now()).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    let mut health = x.health();
    tokio::time::timeout(
        Duration::from_secs(10),
        health.wait_for(|h| matches!(h, SiloHealth::Healthy { .. })),
    )
    .await
    .expect("healthy within 10 s")
    .unwrap();
    let link = cut_off(&cut, true);
    tokio::time::timeout(
        Duration::from_secs(10),
        health.wait_for(|h| matches!(h, SiloHealth::LeaseAtRisk { .. })),
    )
    .await
    .expect("fenced within 10 s")
    .unwrap();
    // Silent past the detection horizon, as D's clock sees it.
    let horizon = m
        .i_am_alive_table_publish_timeout
        .saturating_mul(m.num_missed_table_i_am_alive_limit);
    let silent = Instant::now();
    while d_table.read_row(&x.address()).await.unwrap().rows[0]
        .entry
        .i_am_alive_time
        .saturating_add(horizon)
        > Timestamp::now()
    {
        assert!(
            silent.elapsed() < Duration::from_secs(10),
            "X never fell silent"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // D votes alone, and its write is held once decided (a slow coordinator, a GC pause).
    let gate = Gate::new();
    let held = Arc::new(FaultyTable::new(Arc::clone(&d_table)));
    held.inject(Injection::hold(
        Calls::from(Operation::UpdateRow).about(x.address()),
        &gate,
    ));
    let mut dm = m.clone();
    dm.num_votes_for_death_declaration = 1;
    dm.table_operation_timeout = Some(Duration::from_secs(30));
    let round = tokio::spawn(async move {
        protocol::detection_round(held.as_ref(), &d, &dm, Timestamp::now()).await
    });
    tokio::time::timeout(Duration::from_secs(10), gate.reached())
        .await
        .expect("D decides to vote X dead within 10 s");
    // X comes back and is told Healthy.
    cut.clear(link);
    tokio::time::timeout(
        Duration::from_secs(10),
        health.wait_for(|h| matches!(h, SiloHealth::Healthy { .. })),
    )
    .await
    .expect("X recovers within 10 s")
    .unwrap();
    let healthy_at = Instant::now();
    gate.release();
    let round = round.await.unwrap().unwrap();
    let stored = d_table.read_row(&x.address()).await.unwrap().rows[0]
        .entry
        .status;
    eprintln!(
        "D's vote landed {:?} after X was told Healthy: declared {:?}, X stored {stored:?}",
        healthy_at.elapsed(),
        round.declared
    );
    assert!(
        round.declared.is_empty() && stored != SiloStatus::Dead,
        "a vote decided while X was silent stored it {stored:?} after X was told Healthy \
         (declared {:?})",
        round.declared
    );
    assert!(
        matches!(*x.health().borrow(), SiloHealth::Healthy { .. }),
        "{:?}",
        *x.health().borrow()
    );
    d_heartbeat.abort();
    x.crash();
}

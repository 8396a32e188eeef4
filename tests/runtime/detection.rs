//! Failure detection and a silo's own status: the others declare a crashed silo dead, and a silo
//! learns within a period that its entry is Dead, gone or another incarnation's, even when its
//! heartbeats do not check; a damaged row is unknown, not missing.

use std::sync::Arc;
use std::time::Duration;

use cassandra_membership::conformance::faults::FaultyTable;
use cassandra_membership::conformance::faults::{Injection, Operation};
use cassandra_membership::runtime::protocol;
use cassandra_membership::{
    Clock, MembershipTable, SiloAddress, SiloHealth, SiloStatus, SuspectTime, TokioClock,
};

use crate::utils::{address, entry, entry_at, faulty_on_paused_clock, join, memory, options};

#[tokio::test(start_paused = true)]
async fn a_crashed_silo_is_declared_dead_by_the_others_through_the_protocol() {
    let clock = Arc::new(TokioClock::new());
    let table = memory(&clock);
    let mut silos = Vec::new();
    for n in 1..=3 {
        silos.push(join(Arc::new(table.clone()), n, &clock).await);
    }
    let crashed = silos.pop().unwrap();
    let address = crashed.address();
    crashed.crash();
    // Silent for 3 periods (30 s), then two votes are needed: dead within about 50 s.
    tokio::time::sleep(Duration::from_secs(60)).await;
    let row = table.read_row(&address).await.unwrap().rows[0].clone();
    assert_eq!(row.entry.status, SiloStatus::Dead);
    let voters: std::collections::BTreeSet<_> = row
        .entry
        .suspect_times
        .iter()
        .map(|s| s.suspecting_silo)
        .collect();
    assert_eq!(voters, silos.iter().map(|s| s.address()).collect());
    for s in silos {
        assert_eq!(
            s.entry_status().await.unwrap(),
            Some(SiloStatus::Active),
            "the living stay Active"
        );
        s.leave().await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_silo_declared_dead_is_told_and_stops_heartbeating() {
    let clock = Arc::new(TokioClock::new());
    let table = Arc::new(memory(&clock));
    let silo = join(table.clone(), 1, &clock).await;
    assert!(
        protocol::set_status(
            table.as_ref(),
            &silo.address(),
            SiloStatus::Dead,
            clock.now()
        )
        .await
        .unwrap()
    );
    assert_eq!(
        silo.wait_final(Duration::from_secs(30)).await,
        SiloHealth::DeclaredDead
    );
    // Dead never revives: asking for Active again changes nothing.
    assert!(
        !protocol::set_status(
            table.as_ref(),
            &silo.address(),
            SiloStatus::Active,
            clock.now()
        )
        .await
        .unwrap()
    );
}

#[tokio::test(start_paused = true)]
async fn a_missing_entry_stops_the_heartbeat_without_recreating_it() {
    let clock = Arc::new(TokioClock::new());
    let table = Arc::new(memory(&clock));
    let silo = join(table.clone(), 1, &clock).await;
    table.delete_cluster("c").await.unwrap();
    assert_eq!(
        silo.wait_final(Duration::from_secs(30)).await,
        SiloHealth::EntryMissing
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(
        table.read_all().await.unwrap().rows.is_empty(),
        "never re-created"
    );
}

/// A backend whose heartbeat does not look at the entry (the Cassandra table between
/// renewals) must not hide a Dead or missing entry: the failure detector's read shows it.
#[tokio::test(start_paused = true)]
async fn a_silo_declared_dead_learns_it_within_one_period_even_when_heartbeats_do_not_check() {
    let (clock, table) = faulty_on_paused_clock();
    table.set_blind_heartbeats(true);
    let silo = join(table.clone(), 1, &clock).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        protocol::set_status(
            table.inner().as_ref(),
            &silo.address(),
            SiloStatus::Dead,
            clock.now()
        )
        .await
        .unwrap()
    );
    // One publish period (10 s) plus a second of margin.
    assert_eq!(
        silo.wait_final(Duration::from_secs(11)).await,
        SiloHealth::DeclaredDead
    );
}

#[tokio::test(start_paused = true)]
async fn a_silo_whose_entry_vanished_learns_it_within_one_period_even_when_heartbeats_do_not_check()
{
    let (clock, table) = faulty_on_paused_clock();
    table.set_blind_heartbeats(true);
    let silo = join(table.clone(), 1, &clock).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    table.inner().delete_cluster("c").await.unwrap();
    assert_eq!(
        silo.wait_final(Duration::from_secs(11)).await,
        SiloHealth::EntryMissing
    );
}

/// Own status comes from the round's first read even when a suspect's re-read fails,
/// and a silo whose own row is Dead votes no one dead.
#[tokio::test(start_paused = true)]
async fn a_detection_round_reports_its_own_row_even_when_a_suspect_re_read_fails() {
    let (clock, table) = faulty_on_paused_clock();
    table.initialize(true).await.unwrap();
    let mut me = entry_at(1, clock.as_ref());
    me.status = SiloStatus::Active;
    let mut silent = entry_at(2, clock.as_ref());
    silent.status = SiloStatus::Active;
    protocol::join(table.as_ref(), &me).await.unwrap();
    protocol::join(table.as_ref(), &silent).await.unwrap();
    tokio::time::sleep(Duration::from_secs(60)).await;
    // The round's second read (the suspect's re-read) fails.
    table.inject(
        Injection::timeout(Operation::ReadAll, "injected")
            .after(1)
            .times(1),
    );
    let round = protocol::detection_round(table.as_ref(), &me.address, &options(), clock.now())
        .await
        .expect("a suspect's failure does not discard the round");
    assert_eq!(round.own_status, Some(SiloStatus::Active));
    assert!(round.declared.is_empty());
    // Declared dead itself: it votes no one.
    assert!(
        protocol::set_status(table.as_ref(), &me.address, SiloStatus::Dead, clock.now())
            .await
            .unwrap()
    );
    let before = table.read_row(&silent.address).await.unwrap().rows[0].clone();
    let round = protocol::detection_round(table.as_ref(), &me.address, &options(), clock.now())
        .await
        .unwrap();
    assert_eq!(round.own_status, Some(SiloStatus::Dead));
    let after = table.read_row(&silent.address).await.unwrap().rows[0].clone();
    assert_eq!(
        after.entry.suspect_times, before.entry.suspect_times,
        "a Dead silo voted"
    );
}

/// Another incarnation's row at the same address is not this silo's row.
#[tokio::test(start_paused = true)]
async fn a_silo_whose_row_was_replaced_by_another_incarnation_learns_its_entry_is_gone() {
    let (clock, table) = faulty_on_paused_clock();
    let silo = join(table.clone(), 1, &clock).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    table.inner().delete_cluster("c").await.unwrap();
    table.inner().initialize(true).await.unwrap();
    let mut other = entry_at(1, clock.as_ref());
    other.status = SiloStatus::Active;
    protocol::join(table.inner().as_ref(), &other)
        .await
        .unwrap();
    assert_eq!(
        silo.wait_final(Duration::from_secs(15)).await,
        SiloHealth::EntryMissing
    );
}

/// A damaged own row (skipped by read_all) is unknown, not missing.
#[tokio::test(start_paused = true)]
async fn a_damaged_own_row_is_not_taken_for_a_missing_one() {
    let (clock, table) = faulty_on_paused_clock();
    let silo = join(table.clone(), 1, &clock).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    table.damage_row(entry(1).address);
    tokio::time::sleep(Duration::from_secs(15)).await;
    let health = silo.health().borrow().clone();
    assert!(!health.is_final(), "{health:?} for a damaged row");
    silo.crash();
}

/// Inserts silo `n` with `status`, its I-am-alive time `silent_for` before the clock's now, and
/// a suspicion from each `(voter, age)` in `votes`.
async fn insert(
    table: &FaultyTable,
    clock: &TokioClock,
    n: u8,
    status: SiloStatus,
    silent_for: Duration,
    votes: &[(u8, Duration)],
) -> SiloAddress {
    let now = clock.now();
    let mut e = entry_at(n, clock);
    e.status = status;
    e.i_am_alive_time = now.saturating_sub(silent_for);
    e.suspect_times = votes
        .iter()
        .map(|&(voter, age)| SuspectTime {
            suspecting_silo: address(voter),
            time: now.saturating_sub(age),
        })
        .collect();
    protocol::join(table, &e).await.unwrap();
    e.address
}

fn voters(table_row: &cassandra_membership::MembershipRow) -> Vec<SiloAddress> {
    table_row
        .entry
        .suspect_times
        .iter()
        .map(|s| s.suspecting_silo)
        .collect()
}

/// A suspicion lasts no longer than the detection horizon (10 s × 3 here): a vote cast before
/// the suspect published again is about an earlier silence and is not counted with one about
/// the current silence.
#[tokio::test(start_paused = true)]
async fn a_vote_from_an_earlier_silence_does_not_count_towards_a_death() {
    let (clock, table) = faulty_on_paused_clock();
    table.initialize(true).await.unwrap();
    let zero = Duration::ZERO;
    let me = insert(&table, &clock, 1, SiloStatus::Active, zero, &[]).await;
    insert(&table, &clock, 3, SiloStatus::Active, zero, &[]).await;
    // Suspected by 3 60 s ago, published since, silent again for 40 s.
    let suspect = insert(
        &table,
        &clock,
        2,
        SiloStatus::Active,
        Duration::from_secs(40),
        &[(3, Duration::from_secs(60))],
    )
    .await;
    let round = protocol::detection_round(table.as_ref(), &me, &options(), clock.now())
        .await
        .unwrap();
    assert!(
        round.declared.is_empty(),
        "declared {:?} dead counting a 60 s old vote from an earlier silence",
        round.declared
    );
    let row = table.read_row(&suspect).await.unwrap().rows[0].clone();
    assert_eq!(row.entry.status, SiloStatus::Active);
    assert_eq!(
        voters(&row),
        vec![me],
        "the expired vote is dropped, ours added"
    );
}

/// A vote by a silo that is itself Dead, or has no entry any more, does not count; a fresh one
/// by a live silo does.
#[tokio::test(start_paused = true)]
async fn a_vote_by_a_silo_that_is_dead_or_gone_does_not_count() {
    let (clock, table) = faulty_on_paused_clock();
    table.initialize(true).await.unwrap();
    let (zero, silent, recent) = (
        Duration::ZERO,
        Duration::from_secs(40),
        Duration::from_secs(5),
    );
    let me = insert(&table, &clock, 1, SiloStatus::Active, zero, &[]).await;
    insert(&table, &clock, 3, SiloStatus::Dead, zero, &[]).await;
    insert(&table, &clock, 5, SiloStatus::Active, zero, &[]).await;
    // Voted by 3 (Dead) and 4 (no entry).
    let by_the_dead = insert(
        &table,
        &clock,
        2,
        SiloStatus::Active,
        silent,
        &[(3, recent), (4, recent)],
    )
    .await;
    // Voted by 5 (Active).
    let by_the_living = insert(
        &table,
        &clock,
        6,
        SiloStatus::Active,
        silent,
        &[(5, recent)],
    )
    .await;
    let round = protocol::detection_round(table.as_ref(), &me, &options(), clock.now())
        .await
        .unwrap();
    assert_eq!(
        round.declared,
        vec![by_the_living],
        "only the silo a live voter suspected is declared dead"
    );
    let row = table.read_row(&by_the_dead).await.unwrap().rows[0].clone();
    assert_eq!(row.entry.status, SiloStatus::Active);
}

/// Two silent silos that voted each other dead: the round declares the first with the second's
/// vote and its own, and then does not count the first's vote against the second — a voter this
/// same round declared Dead vouches for nothing, although the round's snapshot still shows it
/// Active.
#[tokio::test(start_paused = true)]
async fn a_voter_declared_dead_earlier_in_the_same_round_does_not_count() {
    let (clock, table) = faulty_on_paused_clock();
    table.initialize(true).await.unwrap();
    let (zero, silent, recent) = (
        Duration::ZERO,
        Duration::from_secs(40),
        Duration::from_secs(5),
    );
    let me = insert(&table, &clock, 1, SiloStatus::Active, zero, &[]).await;
    // A second silo still publishing.
    insert(&table, &clock, 4, SiloStatus::Active, zero, &[]).await;
    let first = insert(
        &table,
        &clock,
        2,
        SiloStatus::Active,
        silent,
        &[(3, recent)],
    )
    .await;
    let second = insert(
        &table,
        &clock,
        3,
        SiloStatus::Active,
        silent,
        &[(2, recent)],
    )
    .await;
    let round = protocol::detection_round(table.as_ref(), &me, &options(), clock.now())
        .await
        .unwrap();
    assert_eq!(
        round.declared,
        vec![first],
        "one death per live pair of votes"
    );
    let row = table.read_row(&second).await.unwrap().rows[0].clone();
    assert_eq!(row.entry.status, SiloStatus::Active);
}

/// Two live detectors' rounds overlap: silos 2 and 3 are silent, each holding a fresh
/// vote from the other. Silo 1's round reads the table, and while it re-reads before voting on 2,
/// silo 4's round declares 2 Dead. Silo 1 then skips 2 (its tag moved) and must not count 2's
/// vote against 3: the voters are judged on the re-read the vote is written on (which shows 2
/// Dead), not on the round's first read (which still shows it Active).
#[tokio::test(start_paused = true)]
async fn voters_are_judged_on_the_re_read_the_vote_is_written_on_not_the_round_s_first_read() {
    use cassandra_membership::conformance::faults::Gate;
    let (clock, table) = faulty_on_paused_clock();
    table.initialize(true).await.unwrap();
    let (zero, silent, recent) = (
        Duration::ZERO,
        Duration::from_secs(40),
        Duration::from_secs(5),
    );
    let one = insert(&table, &clock, 1, SiloStatus::Active, zero, &[]).await;
    let four = insert(&table, &clock, 4, SiloStatus::Active, zero, &[]).await;
    let two = insert(
        &table,
        &clock,
        2,
        SiloStatus::Active,
        silent,
        &[(3, recent)],
    )
    .await;
    let three = insert(
        &table,
        &clock,
        3,
        SiloStatus::Active,
        silent,
        &[(2, recent)],
    )
    .await;
    // Silo 1's re-read before its vote on 2 (its second read_all) waits at the gate.
    let gate = Gate::new();
    table.inject(Injection::hold(Operation::ReadAll, &gate).after(1).times(1));
    let now = clock.now();
    let first = tokio::spawn({
        let table = Arc::clone(&table);
        async move { protocol::detection_round(table.as_ref(), &one, &options(), now).await }
    });
    gate.reached().await;
    // Meanwhile silo 4's round declares 2 (3's vote and its own); its re-read before a vote on 3
    // fails, so it leaves 3's row as it was.
    let fours = FaultyTable::new(Arc::clone(table.inner()));
    fours.inject(Injection::contention(Operation::ReadAll).after(2));
    let other = protocol::detection_round(&fours, &four, &options(), now)
        .await
        .unwrap();
    assert_eq!(other.declared, vec![two], "silo 4 declares 2 dead");
    gate.release();
    let round = first.await.unwrap().unwrap();
    let row = table.read_row(&three).await.unwrap().rows[0].clone();
    assert_eq!(
        (round.declared.as_slice(), row.entry.status),
        (&[][..], SiloStatus::Active),
        "silo 1 declared {:?} dead on one live vote (2's vote counted, 2 already Dead); 3's voters: {:?}",
        round.declared,
        voters(&row)
    );
    assert_eq!(voters(&row), vec![one], "2's vote dropped, silo 1's added");
}

/// Two live detectors whose rounds coincide every period (as the simulation once ran them at
/// the default periods: a crashed silo stayed Active for 390 s with two live voters): each round
/// both read, the other's vote lands first, and ours loses the race on the moved version — one
/// attempt per round, so the second vote never landed. A vote that loses its race is retried
/// within the round on a fresh read, which then holds the other's vote: two votes, Dead.
#[tokio::test(start_paused = true)]
async fn a_vote_that_loses_its_race_to_another_detector_s_vote_is_retried_within_the_round() {
    use cassandra_membership::conformance::faults::Gate;
    let (clock, table) = faulty_on_paused_clock();
    table.initialize(true).await.unwrap();
    let silent = Duration::from_secs(40);
    let one = insert(&table, &clock, 1, SiloStatus::Active, Duration::ZERO, &[]).await;
    let four = insert(&table, &clock, 4, SiloStatus::Active, Duration::ZERO, &[]).await;
    let crashed = insert(&table, &clock, 2, SiloStatus::Active, silent, &[]).await;
    // Silo 1's vote waits at the gate, decided but not yet landed.
    let gate = Gate::new();
    table.inject(Injection::hold(Operation::UpdateRow, &gate).times(1));
    let now = clock.now();
    let first = tokio::spawn({
        let table = Arc::clone(&table);
        async move { protocol::detection_round(table.as_ref(), &one, &options(), now).await }
    });
    gate.reached().await;
    // Silo 4's vote lands first.
    let other = protocol::detection_round(table.inner().as_ref(), &four, &options(), now)
        .await
        .unwrap();
    assert!(other.declared.is_empty(), "one vote is not a death");
    gate.release();
    let round = first.await.unwrap().unwrap();
    let row = table.read_row(&crashed).await.unwrap().rows[0].clone();
    assert_eq!(
        (round.declared.as_slice(), row.entry.status),
        (&[crashed][..], SiloStatus::Dead),
        "silo 1's vote lost its race and was not tried again this round; voters {:?}",
        voters(&row)
    );
}

/// A vote is stamped when it is written, not when its round began: with slow storage a round
/// over several suspects outlasts a short vote lifetime (three periods at a 1 s period), and a
/// vote stamped at the start would arrive already stale for every other voter.
#[tokio::test(start_paused = true)]
async fn a_vote_is_stamped_when_it_is_written() {
    let (clock, table) = faulty_on_paused_clock();
    table.initialize(true).await.unwrap();
    let silent = Duration::from_secs(40);
    let me = insert(&table, &clock, 1, SiloStatus::Active, Duration::ZERO, &[]).await;
    insert(&table, &clock, 2, SiloStatus::Active, silent, &[]).await;
    let last = insert(&table, &clock, 3, SiloStatus::Active, silent, &[]).await;
    // A re-read before a suspicion takes 4 s (the round's first read does not).
    let slow = Duration::from_secs(4);
    table.inject(Injection::delay(Operation::ReadAll, slow).after(1));
    let began = clock.now();
    protocol::detection_round(table.as_ref(), &me, &options(), began)
        .await
        .unwrap();
    let row = table.read_row(&last).await.unwrap().rows[0].clone();
    let vote = row
        .entry
        .suspect_times
        .iter()
        .find(|s| s.suspecting_silo == me)
        .expect("the round suspected the last silent silo");
    assert!(
        vote.time >= began.saturating_add(slow),
        "the vote on the second suspect is stamped {:?} after the round began",
        vote.time.as_millis() - began.as_millis()
    );
}

/// No cap on the votes needed: a voter that was itself silent through a
/// storage outage longer than the detection horizon, back first, must not declare the others dead
/// on its own vote — with a cap by the silos it sees publishing (Orleans' `(n + 1) / 2`, or `n`),
/// it saw none and needed one vote.
#[tokio::test(start_paused = true)]
async fn a_voter_back_first_from_an_outage_declares_no_one_dead_alone() {
    let (clock, table) = faulty_on_paused_clock();
    table.initialize(true).await.unwrap();
    let silent = Duration::from_secs(40); // the horizon is 10 s × 3
    let me = insert(&table, &clock, 1, SiloStatus::Active, silent, &[]).await;
    for n in 2..=5 {
        insert(&table, &clock, n, SiloStatus::Active, silent, &[]).await;
    }
    let round = protocol::detection_round(table.as_ref(), &me, &options(), clock.now())
        .await
        .unwrap();
    assert!(
        round.declared.is_empty(),
        "declared {} of 4 silos dead on one vote",
        round.declared.len()
    );
}

/// A silo whose clock runs 40 s ahead sees every other silo silent: it may suspect them, never
/// declare a live silo dead on its own vote.
#[tokio::test(start_paused = true)]
async fn one_silo_with_a_clock_ahead_declares_no_live_silo_dead() {
    let (clock, table) = faulty_on_paused_clock();
    table.initialize(true).await.unwrap();
    let me = insert(&table, &clock, 1, SiloStatus::Active, Duration::ZERO, &[]).await;
    for n in 2..=5 {
        insert(&table, &clock, n, SiloStatus::Active, Duration::ZERO, &[]).await;
    }
    let skewed_now = clock.now().saturating_add(Duration::from_secs(40));
    let round = protocol::detection_round(table.as_ref(), &me, &options(), skewed_now)
        .await
        .unwrap();
    assert!(
        round.declared.is_empty(),
        "declared {} live silos dead on one vote",
        round.declared.len()
    );
}

/// With two Active silos still publishing, one vote is not enough (the default needs 2): the cap
/// counts only silos whose I-am-alive time is fresh, never lowering the votes below what the
/// live members can give.
#[tokio::test(start_paused = true)]
async fn one_vote_is_not_enough_while_two_silos_still_publish() {
    let (clock, table) = faulty_on_paused_clock();
    table.initialize(true).await.unwrap();
    let zero = Duration::ZERO;
    let me = insert(&table, &clock, 1, SiloStatus::Active, zero, &[]).await;
    insert(&table, &clock, 3, SiloStatus::Active, zero, &[]).await;
    let suspect = insert(
        &table,
        &clock,
        2,
        SiloStatus::Active,
        Duration::from_secs(40),
        &[],
    )
    .await;
    let round = protocol::detection_round(table.as_ref(), &me, &options(), clock.now())
        .await
        .unwrap();
    assert!(
        round.declared.is_empty(),
        "declared on one vote: {:?}",
        round.declared
    );
    let row = table.read_row(&suspect).await.unwrap().rows[0].clone();
    assert_eq!(row.entry.status, SiloStatus::Active);
    assert_eq!(voters(&row), vec![me]);
}

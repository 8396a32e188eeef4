//! The conformance cases on heartbeats: a heartbeat moves the I-am-alive time (only forward)
//! and the row tag but not the version, reports a missing or Dead entry, and makes a vote decided
//! before it fail.

use std::time::Duration;

use super::harness::{Harness, WithStatus, fresh, new_entry, one_row};
use crate::model::{SiloStatus, SuspectTime, Timestamp};
use crate::table::HeartbeatOutcome;

/// (Orleans case 7) A heartbeat stores the time and does not move the version. It gives the row
/// a new tag (this crate's rule, see [`a_vote_decided_before_a_heartbeat_does_not_apply`]): a
/// write decided on a read from before it must not apply.
pub async fn i_am_alive_does_not_move_version<H: Harness + ?Sized>(h: &H) {
    let t = fresh(h, "alive").await;
    let v = t.read_all().await.unwrap().version;
    let e = new_entry(Timestamp::now());
    assert!(t.insert_row(&e, &v.next()).await.unwrap());
    let before = t.read_row(&e.address).await.unwrap();
    let alive = e.i_am_alive_time.saturating_add(Duration::from_secs(5));
    let outcome = t.update_i_am_alive(&e.address, alive).await.unwrap();
    assert!(
        matches!(outcome, HeartbeatOutcome::Refreshed { .. }),
        "{outcome:?}"
    );
    let after = t.read_row(&e.address).await.unwrap();
    assert_eq!(one_row(&after).entry.i_am_alive_time, alive);
    assert_eq!(after.version, before.version);
    assert_ne!(
        one_row(&after).etag,
        one_row(&before).etag,
        "a heartbeat that moves the I-am-alive time must change the row tag"
    );
    let mut expected = e.clone();
    expected.i_am_alive_time = alive;
    assert_eq!(
        one_row(&after).entry,
        expected,
        "only the I-am-alive time may change"
    );
}

/// A death vote decided on a read is refused once the suspect's I-am-alive time moved after that
/// read, even though neither the version nor the entry changed: a silo that heartbeats again
/// must not be declared dead by a decision made while it was silent. A vote decided on a read
/// taken after the heartbeat applies.
pub async fn a_vote_decided_before_a_heartbeat_does_not_apply<H: Harness + ?Sized>(h: &H) {
    let t = fresh(h, "vote-heartbeat").await;
    let v = t.read_all().await.unwrap().version;
    let suspect = new_entry(Timestamp::now()).with_status(SiloStatus::Active);
    assert!(t.insert_row(&suspect, &v.next()).await.unwrap());
    let voter = new_entry(Timestamp::now()).address;
    for via_read_all in [true, false] {
        let read = if via_read_all {
            t.read_all().await.unwrap()
        } else {
            t.read_row(&suspect.address).await.unwrap()
        };
        let row = read
            .get(&suspect.address)
            .expect("the suspect's row")
            .clone();
        // The silo publishes a later I-am-alive time after the voter's read.
        let alive = row
            .entry
            .i_am_alive_time
            .saturating_add(Duration::from_secs(1));
        t.update_i_am_alive(&suspect.address, alive).await.unwrap();
        let before = t.read_all().await.unwrap();
        for dead in [true, false] {
            let mut vote = row.entry.clone();
            vote.suspect_times.push(SuspectTime {
                suspecting_silo: voter,
                time: alive,
            });
            if dead {
                vote.status = SiloStatus::Dead;
            }
            assert!(
                !t.update_row(&vote, &row.etag, &read.version.next())
                    .await
                    .unwrap(),
                "a vote (dead: {dead}, read via read_all: {via_read_all}) decided before the \
                 suspect's heartbeat applied"
            );
        }
        let after = t.read_all().await.unwrap();
        assert_eq!(after, before, "a refused vote must change nothing");
        assert_eq!(
            after.get(&suspect.address).unwrap().entry.status,
            SiloStatus::Active
        );
    }
    // A vote decided on a read that shows the heartbeat applies.
    let read = t.read_row(&suspect.address).await.unwrap();
    let row = one_row(&read).clone();
    let mut vote = row.entry.clone();
    vote.status = SiloStatus::Dead;
    assert!(
        t.update_row(&vote, &row.etag, &read.version.next())
            .await
            .unwrap(),
        "a vote decided after the heartbeat must apply"
    );
    let stored = t.read_row(&suspect.address).await.unwrap();
    assert_eq!(one_row(&stored).entry.status, SiloStatus::Dead);
}

/// A heartbeat for a silo without an entry reports it and writes nothing.
pub async fn heartbeat_on_missing_entry_reports_not_found<H: Harness + ?Sized>(h: &H) {
    let t = fresh(h, "alive-missing").await;
    let e = new_entry(Timestamp::now());
    let outcome = t
        .update_i_am_alive(&e.address, Timestamp::now())
        .await
        .unwrap();
    assert_eq!(outcome, HeartbeatOutcome::NotFound);
    let v = t.read_all().await.unwrap().version;
    assert!(t.read_all().await.unwrap().rows.is_empty());
    // Nothing was left behind that would block or pollute a later insert.
    assert!(t.insert_row(&e, &v.next()).await.unwrap());
    assert_eq!(one_row(&t.read_all().await.unwrap()).entry, e);
}

/// A heartbeat on an entry declared Dead says so.
pub async fn heartbeat_on_dead_entry_reports_declared_dead<H: Harness + ?Sized>(h: &H) {
    let t = fresh(h, "alive-dead").await;
    let v = t.read_all().await.unwrap().version;
    let e = new_entry(Timestamp::now()).with_status(SiloStatus::Dead);
    assert!(t.insert_row(&e, &v.next()).await.unwrap());
    let outcome = t
        .update_i_am_alive(&e.address, Timestamp::now())
        .await
        .unwrap();
    assert!(
        matches!(outcome, HeartbeatOutcome::DeclaredDead { .. }),
        "{outcome:?}"
    );
}

/// The I-am-alive time only moves forward, whichever call wrote it.
pub async fn i_am_alive_time_only_moves_forward<H: Harness + ?Sized>(h: &H) {
    let t = fresh(h, "alive-forward").await;
    let v = t.read_all().await.unwrap().version;
    let e = new_entry(Timestamp::now());
    assert!(t.insert_row(&e, &v.next()).await.unwrap());
    let later = e.i_am_alive_time.saturating_add(Duration::from_secs(10));
    t.update_i_am_alive(&e.address, later).await.unwrap();
    t.update_i_am_alive(&e.address, e.i_am_alive_time)
        .await
        .unwrap();
    let s = t.read_row(&e.address).await.unwrap();
    assert_eq!(one_row(&s).entry.i_am_alive_time, later);
    // An update carrying an older time does not move it back either.
    let row = one_row(&s).clone();
    let mut changed = e.clone().with_status(SiloStatus::Active);
    changed.i_am_alive_time = e.i_am_alive_time;
    assert!(
        t.update_row(&changed, &row.etag, &s.version.next())
            .await
            .unwrap()
    );
    let after = t.read_row(&e.address).await.unwrap();
    assert_eq!(one_row(&after).entry.status, SiloStatus::Active);
    assert_eq!(one_row(&after).entry.i_am_alive_time, later);
}

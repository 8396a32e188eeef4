//! Ending a silo: a leave has one overall bound (`leave_timeout`), both its status changes
//! included; a silo shared as `Arc<Silo>` leaves once and a second leave answers a typed error
//! (after the first finished);
//! dropping a silo that neither left nor crashed is a crash, and is logged naming the silo.

use std::sync::Arc;
use std::time::Duration;

use cassandra_membership::conformance::faults::{Injection, Operation};
use cassandra_membership::runtime::protocol::{self, ProtocolLimits};
use cassandra_membership::{Clock, MembershipError, SiloStatus};
use tokio::time::Instant;

use crate::logs::Captured;
use crate::utils::{address, faulty_on_paused_clock, faulty_on_paused_clock_with, join};
use crate::utils::{options, record};

/// Each status change used to get a deadline of its own, so a leave whose first write was slow
/// took up to twice the bound. Writes take 8 s here, the bound is 10 s: the first status change
/// applies at 8 s, the second is cut at 10 s.
#[tokio::test(start_paused = true)]
async fn a_leave_ends_by_one_deadline_for_both_its_status_changes() {
    let (clock, table) = faulty_on_paused_clock();
    let silo = join(table.clone(), 1, &clock).await;
    silo.crash();
    table.inject(Injection::delay(
        Operation::UpdateRow,
        Duration::from_secs(8),
    ));
    let limits = ProtocolLimits {
        call_timeout: Duration::from_secs(9),
        step_deadline: Duration::from_secs(10),
    };
    let started = Instant::now();
    let left = protocol::leave_within(table.as_ref(), &address(1), clock.now(), &limits).await;
    let took = started.elapsed();
    assert!(
        took <= Duration::from_secs(10),
        "the leave took {took:?}, its bound is 10 s ({left:?})"
    );
    assert!(left.is_err(), "the Dead write cannot finish by the bound");
    let stored = table.inner().read_row(&address(1)).await.unwrap().rows[0]
        .entry
        .status;
    assert_eq!(stored, SiloStatus::ShuttingDown, "as far as it got");
}

/// `Silo::leave` as a whole — stopping its tasks and both writes — ends by `leave_timeout`,
/// not by two `max_join_attempt_time`s (10 min by default) when every write hangs.
#[tokio::test(start_paused = true)]
async fn a_silo_s_leave_ends_by_leave_timeout_when_its_writes_hang() {
    let mut o = options();
    o.leave_timeout = Duration::from_secs(25);
    let (clock, table) = faulty_on_paused_clock_with(o);
    let silo = join(table.clone(), 1, &clock).await;
    table.inject(Injection::hang(Operation::UpdateRow));
    let started = Instant::now();
    let left = silo.leave().await;
    let took = started.elapsed();
    assert!(took <= Duration::from_secs(25), "the leave took {took:?}");
    assert!(
        matches!(
            left,
            Err(MembershipError::OutcomeUnknown { .. } | MembershipError::Timeout { .. })
        ),
        "{left:?}"
    );
    assert!(
        !silo.should_serve(),
        "a silo that tried to leave serves no more"
    );
}

/// A host keeps the silo in shared state (`Arc<Silo>`): a signal handler and a shutdown path
/// may both call `leave`. The first leaves; the other answers `NotAMember` ("left") and writes
/// nothing; `crash` afterwards does nothing; dropping it then logs nothing.
#[tokio::test(start_paused = true)]
async fn a_shared_silo_leaves_once_and_a_second_leave_answers_not_a_member() {
    let captured = Captured::default();
    let _logging = captured.warnings();
    let (clock, table) = faulty_on_paused_clock();
    let silo = Arc::new(join(table.clone(), 1, &clock).await);
    let (a, b) = (Arc::clone(&silo), Arc::clone(&silo));
    let (first, second) = tokio::join!(
        tokio::spawn(async move { a.leave().await }),
        tokio::spawn(async move { b.leave().await }),
    );
    let (first, second) = (first.unwrap(), second.unwrap());
    let (ok, refused) = if first.is_ok() {
        (first, second)
    } else {
        (second, first)
    };
    ok.unwrap();
    match refused {
        Err(MembershipError::NotAMember { silo: s, state }) => {
            assert_eq!((s.as_str(), state), ("10.0.0.1:11111@1", "left"))
        }
        other => panic!("a second leave answered {other:?}"),
    }
    let writes = table.calls(Operation::UpdateRow);
    assert!(silo.leave().await.is_err());
    silo.crash();
    assert_eq!(table.calls(Operation::UpdateRow), writes, "nothing written");
    assert_eq!(silo.entry_status().await.unwrap(), Some(SiloStatus::Dead));
    drop(silo);
    assert!(!captured.text().contains("dropped"), "{}", captured.text());
}

/// A leave called while another is still writing waits for it: it answers "left" only once the
/// entry is Dead, so a host whose other shutdown path got that answer and exited does not cut
/// the first leave short.
#[tokio::test(start_paused = true)]
async fn a_leave_called_while_another_writes_answers_once_that_one_finished() {
    let (clock, table) = faulty_on_paused_clock();
    let silo = Arc::new(join(table.clone(), 1, &clock).await);
    table.inject(Injection::delay(
        Operation::UpdateRow,
        Duration::from_secs(2),
    ));
    let first = tokio::spawn({
        let silo = Arc::clone(&silo);
        async move { silo.leave().await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = silo.leave().await;
    let stored = table.inner().read_row(&address(1)).await.unwrap().rows[0]
        .entry
        .status;
    assert_eq!(
        stored,
        SiloStatus::Dead,
        "the second leave answered {second:?} while the first was still writing"
    );
    assert!(matches!(
        second,
        Err(MembershipError::NotAMember { state: "left", .. })
    ));
    first.await.unwrap().unwrap();
}

/// After a leave that failed, `crash` ends the silo: a later leave answers "crashed" and
/// writes nothing.
#[tokio::test(start_paused = true)]
async fn a_crash_after_a_failed_leave_ends_the_silo() {
    let mut o = options();
    o.leave_timeout = Duration::from_secs(5);
    let (clock, table) = faulty_on_paused_clock_with(o);
    let silo = join(table.clone(), 1, &clock).await;
    let fault = table.inject(Injection::hang(Operation::UpdateRow));
    assert!(silo.leave().await.is_err());
    table.clear(fault);
    silo.crash();
    let writes = table.calls(Operation::UpdateRow);
    assert!(matches!(
        silo.leave().await,
        Err(MembershipError::NotAMember {
            state: "crashed",
            ..
        })
    ));
    assert_eq!(table.calls(Operation::UpdateRow), writes, "nothing written");
}

/// A leave after a crash is refused the same way, naming the crash.
#[tokio::test(start_paused = true)]
async fn a_leave_after_a_crash_answers_not_a_member_crashed() {
    let (clock, table) = faulty_on_paused_clock();
    let silo = join(table.clone(), 1, &clock).await;
    silo.crash();
    assert!(matches!(
        silo.leave().await,
        Err(MembershipError::NotAMember {
            state: "crashed",
            ..
        })
    ));
    assert_eq!(silo.entry_status().await.unwrap(), Some(SiloStatus::Active));
}

/// Dropping a silo that neither left nor crashed is a crash — heartbeats stop, the entry stays
/// Active — and a warning names the silo.
#[tokio::test(start_paused = true)]
async fn dropping_a_silo_that_did_not_leave_is_a_crash_and_a_warning_names_it() {
    let captured = Captured::default();
    let _logging = captured.warnings();
    let (clock, table) = faulty_on_paused_clock();
    let silo = join(table.clone(), 1, &clock).await;
    let seen = record(&silo);
    tokio::time::sleep(Duration::from_secs(1)).await;
    drop(silo);
    let logged = captured.text();
    let warning = logged
        .lines()
        .find(|l| l.contains("dropped without leave"))
        .unwrap_or_else(|| panic!("no warning in {logged:?}"));
    assert!(warning.contains("10.0.0.1:11111@1"), "{warning}");
    let heartbeats = table.calls(Operation::UpdateIAmAlive);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(table.calls(Operation::UpdateIAmAlive), heartbeats);
    let stored = table.inner().read_row(&address(1)).await.unwrap().rows[0]
        .entry
        .status;
    assert_eq!(stored, SiloStatus::Active);
    drop(seen);
}

//! The host runtime end to end on the real node, with expiry on: silos join, one crashes and is
//! declared dead by the others, one leaves, the rest stop, and the cluster disappears; a leave
//! ends by `leave_timeout`, returns its cause, and one that failed or was cancelled can be
//! retried (through `FaultyTable`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use cassandra_membership::conformance::faults::{FaultyTable, Injection, Operation};
use cassandra_membership::runtime::protocol;
use cassandra_membership::{
    MembershipEntry, MembershipError, MembershipOptions, MembershipTable, Silo, SiloAddress,
    SiloHealth, SiloStatus, Timestamp,
};

use crate::utils::{options, session_with_keyspace, table_on, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn silos_join_detect_a_crash_leave_and_the_cluster_expires() {
    let s = session_with_keyspace().await;
    let mut m = MembershipOptions::default();
    m.i_am_alive_table_publish_timeout = Duration::from_millis(500);
    m.defunct_silo_expiration = Duration::from_secs(4);
    // The age limit only: storage expiry covers it (the count limit would run regardless).
    m.max_defunct_silo_entries = None;
    let mut o = options(&unique("runtime"))
        .table("membership_ttl4")
        .ttl(true)
        .membership(m.clone());
    o.ttl_renewal_interval = Some(Duration::from_secs(1));
    let table: Arc<dyn MembershipTable> = Arc::new(table_on(&s, o));
    // The silos run with the table's options: no second set to disagree with them.
    assert_eq!(table.membership_options(), &m);
    let generation = (Timestamp::now().as_millis() / 1000) as i32;
    let mut silos = Vec::new();
    for n in 1..=3u16 {
        let a = SiloAddress::new(
            format!("127.0.0.1:{}", 12000 + n).parse().unwrap(),
            generation,
        )
        .unwrap();
        let silo = Silo::join(Arc::clone(&table), a).await.unwrap();
        assert!(
            !silo.runs_defunct_cleanup(),
            "storage expiry covers cleanup"
        );
        silos.push(silo);
    }
    for silo in &silos {
        // Healthy with a storage lease, within a few periods: with a 500 ms period and each call
        // bounded by it, one heartbeat slowed by a busy machine is honestly `LeaseAtRisk` for a
        // moment, and the next one heals it.
        let mut health = silo.health();
        let healthy = tokio::time::timeout(
            Duration::from_secs(5),
            health.wait_for(
                |h| matches!(h, SiloHealth::Healthy { lease } if lease.expires_at.is_some()),
            ),
        )
        .await;
        let now = silo.health().borrow().clone();
        assert!(
            matches!(healthy, Ok(Ok(_))),
            "{} not Healthy with a storage lease within 5 s of joining: {now:?}",
            silo.address()
        );
        assert_eq!(silo.entry_status().await.unwrap(), Some(SiloStatus::Active));
    }
    // A crash: the two others declare it dead through the protocol.
    let crashed = silos.pop().unwrap();
    let crashed_address = crashed.address();
    crashed.crash();
    let started = Instant::now();
    loop {
        let row = table.read_row(&crashed_address).await.unwrap();
        if row.rows.first().map(|r| r.entry.status) == Some(SiloStatus::Dead) {
            assert_eq!(row.rows[0].entry.suspect_times.len(), 2);
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "never declared dead"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A graceful leave.
    let leaving = silos.pop().unwrap();
    let left = leaving.address();
    leaving.leave().await.unwrap();
    assert_eq!(
        table.read_row(&left).await.unwrap().rows[0].entry.status,
        SiloStatus::Dead
    );
    // The last silo stops too: with no silo running, the cluster disappears.
    silos.pop().unwrap().crash();
    let stopped = Instant::now();
    loop {
        let snap = table.read_all().await.unwrap();
        if snap.rows.is_empty() && snap.version.etag.is_absent() {
            break;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(12),
            "the cluster never disappeared: {snap:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The Dead entries of `table`.
async fn dead(table: &dyn MembershipTable) -> Vec<SiloAddress> {
    let mut dead: Vec<_> = table
        .read_all()
        .await
        .unwrap()
        .rows
        .iter()
        .filter(|r| r.entry.status == SiloStatus::Dead)
        .map(|r| r.entry.address)
        .collect();
    dead.sort();
    dead
}

/// Polls `table`'s Dead entries for up to `limit` until they are `want`.
async fn wait_dead(table: &dyn MembershipTable, want: &[SiloAddress], limit: Duration) {
    let started = Instant::now();
    loop {
        let now = dead(table).await;
        if now == want {
            return;
        }
        assert!(
            started.elapsed() < limit,
            "Dead entries {now:?}, expected {want:?} within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Issues 24 and 25 on the real node: two silos of one process join one table with one cleanup
/// between them, which keeps `max_defunct_silo_entries` Dead entries — the newest — and goes on
/// after the silo that started it left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_silos_share_one_cleanup_which_keeps_the_newest_dead_entries() {
    let s = session_with_keyspace().await;
    let m = MembershipOptions::default()
        .defunct_silo_cleanup_period(Some(Duration::from_secs(1)))
        .defunct_silo_cleanup_jitter(Duration::ZERO)
        .max_defunct_silo_entries(Some(1));
    let table: Arc<dyn MembershipTable> = Arc::new(table_on(
        &s,
        options(&unique("shared-cleanup")).membership(m.clone()),
    ));
    table.initialize(true).await.unwrap();
    let now = Timestamp::now();
    let mut old = Vec::new();
    for (n, minutes) in [(1u8, 3u64), (2, 2), (3, 1)] {
        let a: SiloAddress = format!("10.0.0.{n}:11111@1").parse().unwrap();
        let mut e = MembershipEntry::new(a, SiloStatus::Dead, now);
        e.start_time = now.saturating_sub(Duration::from_secs(60 * minutes));
        e.i_am_alive_time = e.start_time;
        protocol::join(table.as_ref(), &e).await.unwrap();
        old.push(a);
    }
    let generation = SiloAddress::generation_at(Timestamp::now());
    let mut silos = Vec::new();
    for port in [13001u16, 13002] {
        let a = SiloAddress::new(format!("127.0.0.1:{port}").parse().unwrap(), generation).unwrap();
        let silo = Silo::join(Arc::clone(&table), a)
            .await
            .unwrap_or_else(|e| panic!("{a} could not join: {e}"));
        assert!(silo.runs_defunct_cleanup());
        silos.push(silo);
    }
    // 127.0.0.1:13001 is the first Active silo: the shared cleanup prunes to the newest one.
    wait_dead(table.as_ref(), &[old[2]], Duration::from_secs(10)).await;
    // The silo that started the cleanup leaves and is the newest Dead entry: the cleanup,
    // now on behalf of the other silo alone, prunes the rest.
    let first = silos.remove(0);
    let first_address = first.address();
    first.leave().await.unwrap();
    wait_dead(table.as_ref(), &[first_address], Duration::from_secs(10)).await;
    silos.pop().unwrap().leave().await.unwrap();
    table.delete_cluster(table.cluster_id()).await.unwrap();
}

fn leave_address(n: u16) -> SiloAddress {
    let generation = (Timestamp::now().as_millis() / 1000) as i32;
    SiloAddress::new(
        format!("127.0.0.1:{}", 14000 + n).parse().unwrap(),
        generation,
    )
    .unwrap()
}

/// A 10 s publish period (so the call timeout, one period, is longer than the leave's bound),
/// no cleanup, and `leave_timeout` as given.
fn with_leave_timeout(leave: Duration) -> MembershipOptions {
    let mut m = MembershipOptions::default();
    m.i_am_alive_table_publish_timeout = Duration::from_secs(10);
    m.defunct_silo_cleanup_period = None;
    m.leave_timeout = leave;
    m
}

/// `set_status_until` computes one call bound per round, `t = min(call_timeout, deadline -
/// now)`, at the round's start, and gives it to the read AND to the conditional write that
/// follows: a round that starts with 4 s left and whose read takes 3.5 s still gives the write
/// 4 s. `leave_timeout` (docs: "the one bound on `Silo::leave` as a whole … past it, the last
/// error is returned") is then exceeded by up to one call timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leave_whose_read_is_slow_still_ends_by_leave_timeout() {
    let s = session_with_keyspace().await;
    let o = options(&unique("leave-bound")).membership(with_leave_timeout(Duration::from_secs(4)));
    let table = Arc::new(FaultyTable::new(Arc::new(table_on(&s, o))));
    let silo = Silo::join(table.clone(), leave_address(1)).await.unwrap();
    // A slow (3.5 s) but successful read, then a write that never answers (an overloaded
    // coordinator): each alone within the per-call timeout (10 s).
    table.inject(Injection::delay(
        Operation::ReadRow,
        Duration::from_millis(3500),
    ));
    table.inject(Injection::hang(Operation::UpdateRow));
    let started = Instant::now();
    let left = silo.leave().await;
    let took = started.elapsed();
    eprintln!("leave answered {left:?} after {took:?}");
    assert!(left.is_err(), "the write hangs: {left:?}");
    assert!(
        took <= Duration::from_millis(4500),
        "leave_timeout is 4 s, the leave took {took:?}"
    );
}

/// A leave that returned an error (here: every conditional write timed out for the whole
/// `leave_timeout`, then storage recovered) ends the silo as "left": the host's retry answers
/// `NotAMember { state: "left" }` at once and writes nothing, while the stored entry is still
/// Active. The host has no way through `Silo` to finish the leave, and the error it gets says
/// the opposite of what is stored; the others wait out the detection horizon instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leave_that_failed_can_be_retried_once_storage_recovers() {
    let s = session_with_keyspace().await;
    let o = options(&unique("leave-retry")).membership(with_leave_timeout(Duration::from_secs(2)));
    let plain: Arc<dyn MembershipTable> = Arc::new(table_on(&s, o.clone()));
    let table = Arc::new(FaultyTable::new(Arc::new(table_on(&s, o))));
    let silo = Silo::join(table.clone(), leave_address(2)).await.unwrap();
    let fault = table.inject(Injection::timeout(Operation::UpdateRow, "write timeout"));
    let first = silo.leave().await;
    eprintln!("first leave: {first:?}");
    assert!(first.is_err(), "every write times out: {first:?}");
    table.clear(fault);
    let stored = plain.read_row(&silo.address()).await.unwrap().rows[0]
        .entry
        .status;
    eprintln!("stored after the failed leave: {stored:?}");
    let second = silo.leave().await;
    eprintln!("second leave: {second:?}");
    let stored = plain.read_row(&silo.address()).await.unwrap().rows[0]
        .entry
        .status;
    assert!(
        !matches!(
            second,
            Err(MembershipError::NotAMember { state: "left", .. })
        ) || stored == SiloStatus::Dead,
        "the retry answered {second:?} (\"left\") but the stored entry is {stored:?}"
    );
    assert_eq!(
        stored,
        SiloStatus::Dead,
        "a host that retries a failed leave once storage is back should leave (answered {second:?})"
    );
}

/// When the leave's deadline is (nearly) reached during the backoff pause between rounds,
/// `set_status_until` starts one more round whose call bound is what is left (0 ns to a few
/// ms), and that round's `read_row` timeout — "no answer within 0ns" / "within 15ms" — is the
/// error the leave returns: the cause (every conditional write timed out) is replaced by a read
/// that could not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_leave_returns_its_cause_not_a_zero_length_read() {
    let s = session_with_keyspace().await;
    let o = options(&unique("leave-cause")).membership(with_leave_timeout(Duration::from_secs(2)));
    let table = Arc::new(FaultyTable::new(Arc::new(table_on(&s, o))));
    let silo = Silo::join(table.clone(), leave_address(3)).await.unwrap();
    table.inject(Injection::timeout(Operation::UpdateRow, "write timeout"));
    let left = silo.leave().await;
    eprintln!("leave answered {left:?}");
    let text = format!("{left:?}");
    assert!(
        text.contains("update_row"),
        "the failing write is not the error returned: {text}"
    );
}

/// A host that gives the leave a budget of its own (`tokio::time::timeout(…, silo.leave())`, a
/// second SIGTERM in a `select!`) cancels it midway. The silo is then "left" — a later `leave`
/// answers `NotAMember { state: "left" }` — while the entry is still Active and nothing will
/// finish the leave: the others wait out the detection horizon, as for a crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leave_cancelled_midway_can_be_finished_by_a_later_leave() {
    let s = session_with_keyspace().await;
    let o =
        options(&unique("leave-cancel")).membership(with_leave_timeout(Duration::from_secs(30)));
    let plain: Arc<dyn MembershipTable> = Arc::new(table_on(&s, o.clone()));
    let table = Arc::new(FaultyTable::new(Arc::new(table_on(&s, o))));
    let silo = Silo::join(table.clone(), leave_address(4)).await.unwrap();
    let fault = table.inject(Injection::hang(Operation::UpdateRow));
    let cancelled = tokio::time::timeout(Duration::from_secs(1), silo.leave()).await;
    assert!(cancelled.is_err(), "the host's own budget ran out first");
    table.clear(fault);
    assert!(
        !silo.should_serve(),
        "a silo whose leave began serves no more"
    );
    let again = silo.leave().await;
    let stored = plain.read_row(&silo.address()).await.unwrap().rows[0]
        .entry
        .status;
    eprintln!("after the cancelled leave: leave again answered {again:?}, stored {stored:?}");
    assert_eq!(
        stored,
        SiloStatus::Dead,
        "the cancelled leave cannot be finished: a later leave answered {again:?}"
    );
}

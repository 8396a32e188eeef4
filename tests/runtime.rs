//! The host runtime on the in-memory table, under tokio's paused time: deterministic and fast.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use cassandra_membership::runtime::{DefunctCleanup, protocol};
use cassandra_membership::{
    Clock, ETag, HeartbeatOutcome, InMemoryMembershipTable, MembershipEntry, MembershipError,
    MembershipOptions, MembershipSnapshot, MembershipTable, Result, SiloAddress, SiloHealth,
    SiloStatus, TableVersion, Timestamp, TokioClock,
};

fn options() -> MembershipOptions {
    let mut o = MembershipOptions::default();
    o.i_am_alive_table_publish_timeout = Duration::from_secs(10);
    o.defunct_silo_cleanup_period = None;
    o
}

async fn join(
    table: Arc<impl MembershipTable + 'static>,
    n: u8,
    clock: &Arc<TokioClock>,
) -> cassandra_membership::Silo {
    cassandra_membership::Silo::join_with_clock(table, entry(n), options(), clock.clone())
        .await
        .unwrap()
}

fn entry(n: u8) -> MembershipEntry {
    let a: SiloAddress = format!("10.0.0.{n}:11111@1").parse().unwrap();
    MembershipEntry::new(a, SiloStatus::Joining, Timestamp::now())
}

/// Counts heartbeats, and fails them on demand.
#[derive(Debug)]
struct Flaky {
    inner: InMemoryMembershipTable,
    heartbeats: AtomicU64,
    failing: AtomicBool,
    /// Like the Cassandra table between renewals: heartbeats do not look at the entry's state.
    blind: AtomicBool,
    /// Heartbeats never answer.
    hang: AtomicBool,
    /// Inserts never answer.
    hang_inserts: AtomicBool,
    /// This many `read_all` calls fail with `Contention` first.
    failing_reads: AtomicU64,
}

impl Flaky {
    fn new(inner: InMemoryMembershipTable) -> Arc<Self> {
        Arc::new(Flaky {
            inner,
            heartbeats: AtomicU64::new(0),
            failing: AtomicBool::new(false),
            blind: AtomicBool::new(false),
            hang: AtomicBool::new(false),
            hang_inserts: AtomicBool::new(false),
            failing_reads: AtomicU64::new(0),
        })
    }
}

#[async_trait]
impl MembershipTable for Flaky {
    fn cluster_id(&self) -> &str {
        self.inner.cluster_id()
    }
    fn storage_expiry(&self) -> cassandra_membership::StorageExpiry {
        self.inner.storage_expiry()
    }
    async fn initialize(&self, v: bool) -> Result<()> {
        self.inner.initialize(v).await
    }
    async fn read_all(&self) -> Result<MembershipSnapshot> {
        let left = self.failing_reads.load(Ordering::SeqCst);
        if left > 0 {
            self.failing_reads.store(left - 1, Ordering::SeqCst);
            return Err(MembershipError::Contention {
                operation: "read_all",
                attempts: 8,
                elapsed: Duration::ZERO,
            });
        }
        self.inner.read_all().await
    }
    async fn read_row(&self, a: &SiloAddress) -> Result<MembershipSnapshot> {
        self.inner.read_row(a).await
    }
    async fn insert_row(&self, e: &MembershipEntry, v: &TableVersion) -> Result<bool> {
        if self.hang_inserts.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        self.inner.insert_row(e, v).await
    }
    async fn update_row(&self, e: &MembershipEntry, t: &ETag, v: &TableVersion) -> Result<bool> {
        self.inner.update_row(e, t, v).await
    }
    async fn update_i_am_alive(&self, a: &SiloAddress, t: Timestamp) -> Result<HeartbeatOutcome> {
        self.heartbeats.fetch_add(1, Ordering::SeqCst);
        if self.failing.load(Ordering::SeqCst) {
            return Err(MembershipError::Timeout {
                operation: "update_i_am_alive",
                source: "injected".into(),
            });
        }
        if self.hang.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        let outcome = self.inner.update_i_am_alive(a, t).await;
        if self.blind.load(Ordering::SeqCst) {
            // Pretend the write went through and the entry was not checked.
            return match outcome? {
                HeartbeatOutcome::DeclaredDead { lease } => {
                    Ok(HeartbeatOutcome::Refreshed { lease })
                }
                HeartbeatOutcome::NotFound => Ok(HeartbeatOutcome::Refreshed {
                    lease: cassandra_membership::Lease::unbounded(t),
                }),
                refreshed => Ok(refreshed),
            };
        }
        outcome
    }
    async fn cleanup_defunct(&self, b: Timestamp) -> Result<usize> {
        self.inner.cleanup_defunct(b).await
    }
    async fn delete_cluster(&self, c: &str) -> Result<()> {
        self.inner.delete_cluster(c).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_silo_joins_active_and_heartbeats_every_period_within_jitter() {
    let clock = Arc::new(TokioClock::new());
    let table = Flaky::new(InMemoryMembershipTable::new("c").with_clock(clock.clone()));
    let silo = join(table.clone(), 1, &clock).await;
    assert_eq!(silo.entry_status().await.unwrap(), Some(SiloStatus::Active));
    tokio::time::sleep(Duration::from_secs(100)).await;
    // First heartbeat at once, then one per 10 s ± 1 s: 10 or 11 in 100 s.
    let n = table.heartbeats.load(Ordering::SeqCst);
    assert!((10..=11).contains(&n), "{n} heartbeats");
    let alive = table.read_row(&silo.address()).await.unwrap().rows[0]
        .entry
        .i_am_alive_time;
    assert!(clock.now().duration_since(alive) <= Duration::from_secs(11));
    assert!(matches!(
        *silo.health().borrow(),
        SiloHealth::Healthy { .. }
    ));
    silo.leave().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_crashed_silo_is_declared_dead_by_the_others_through_the_protocol() {
    let clock = Arc::new(TokioClock::new());
    let table = InMemoryMembershipTable::new("c").with_clock(clock.clone());
    let mut silos = Vec::new();
    for n in 1..=3 {
        let t: Arc<dyn MembershipTable> = Arc::new(table.clone());
        silos.push(
            cassandra_membership::Silo::join_with_clock(t, entry(n), options(), clock.clone())
                .await
                .unwrap(),
        );
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
    let table = Arc::new(InMemoryMembershipTable::new("c").with_clock(clock.clone()));
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
    let table = Arc::new(InMemoryMembershipTable::new("c").with_clock(clock.clone()));
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

#[tokio::test(start_paused = true)]
async fn failing_heartbeats_retry_with_backoff_and_warn_before_the_lease_lapses() {
    let clock = Arc::new(TokioClock::new());
    let inner = InMemoryMembershipTable::new("c")
        .with_clock(clock.clone())
        .with_expiry(Duration::from_secs(100));
    let table = Flaky::new(inner);
    // Failure detection far away (100 missed periods): the lease is the first horizon here.
    let mut o = options();
    o.num_missed_table_i_am_alive_limit = 100;
    let silo =
        cassandra_membership::Silo::join_with_clock(table.clone(), entry(1), o, clock.clone())
            .await
            .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let lease = match silo.health().borrow().clone() {
        SiloHealth::Healthy { lease } => lease,
        other => panic!("{other:?}"),
    };
    let (refresh_by, expires_at) = (lease.refresh_by.unwrap(), lease.expires_at.unwrap());
    table.failing.store(true, Ordering::SeqCst);
    let before = table.heartbeats.load(Ordering::SeqCst);
    let mut health = silo.health();
    health
        .wait_for(|h| matches!(h, SiloHealth::Failing { .. }))
        .await
        .unwrap();
    health
        .wait_for(|h| matches!(h, SiloHealth::LeaseAtRisk { .. }))
        .await
        .unwrap();
    let at_risk = clock.now();
    assert!(
        at_risk >= refresh_by && at_risk < expires_at,
        "warned in time: {at_risk} vs {refresh_by}..{expires_at}"
    );
    // Backoff: 1, 2, 4, 8, then every period (10 s); not a storm.
    let tries = table.heartbeats.load(Ordering::SeqCst) - before;
    assert!(
        (8..=14).contains(&tries),
        "{tries} retries in {:?}",
        at_risk.duration_since(lease.granted_at)
    );
    table.failing.store(false, Ordering::SeqCst);
    health
        .wait_for(|h| matches!(h, SiloHealth::Healthy { .. }))
        .await
        .unwrap();
    silo.leave().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn defunct_cleanup_runs_once_per_period_and_only_once_per_process() {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::new());
    let table = Arc::new(InMemoryMembershipTable::new("cleanup").with_clock(clock.clone()));
    table.initialize(true).await.unwrap();
    let mut old = entry(9);
    old.status = SiloStatus::Dead;
    old.start_time = Timestamp::now().saturating_sub(Duration::from_secs(30 * 24 * 3600));
    old.i_am_alive_time = old.start_time;
    protocol::join(table.as_ref(), &old).await.unwrap();
    let o = MembershipOptions::default();
    let cleanup = DefunctCleanup::spawn(table.clone(), &o, clock.clone())
        .unwrap()
        .unwrap();
    let second = DefunctCleanup::spawn(table.clone(), &o, clock.clone());
    assert!(
        matches!(second, Err(MembershipError::InvalidConfiguration { .. })),
        "one per process"
    );
    let mut removed = cleanup.removed();
    tokio::time::timeout(Duration::from_secs(3600), removed.wait_for(|n| *n == 1))
        .await
        .expect("the first run falls within the first period")
        .unwrap();
    assert!(table.read_all().await.unwrap().rows.is_empty());
    cleanup.stop().await;
    // Once stopped, another may start.
    let again = DefunctCleanup::spawn(table.clone(), &o, clock.clone())
        .unwrap()
        .unwrap();
    again.stop().await;
}

/// A table whose storage covers the defunct cleanup until told otherwise (like the Cassandra
/// table, whose renewal finds rows without TTL), counting cleanups.
#[derive(Debug)]
struct CoverFlips {
    inner: InMemoryMembershipTable,
    covered: AtomicBool,
    cleanups: AtomicU64,
}

#[async_trait]
impl MembershipTable for CoverFlips {
    fn cluster_id(&self) -> &str {
        self.inner.cluster_id()
    }
    fn storage_expiry(&self) -> cassandra_membership::StorageExpiry {
        let mut e = self.inner.storage_expiry();
        e.covers_defunct_cleanup = self.covered.load(Ordering::SeqCst);
        e
    }
    async fn initialize(&self, v: bool) -> Result<()> {
        self.inner.initialize(v).await
    }
    async fn read_all(&self) -> Result<MembershipSnapshot> {
        self.inner.read_all().await
    }
    async fn read_row(&self, a: &SiloAddress) -> Result<MembershipSnapshot> {
        self.inner.read_row(a).await
    }
    async fn insert_row(&self, e: &MembershipEntry, v: &TableVersion) -> Result<bool> {
        self.inner.insert_row(e, v).await
    }
    async fn update_row(&self, e: &MembershipEntry, t: &ETag, v: &TableVersion) -> Result<bool> {
        self.inner.update_row(e, t, v).await
    }
    async fn update_i_am_alive(&self, a: &SiloAddress, t: Timestamp) -> Result<HeartbeatOutcome> {
        self.inner.update_i_am_alive(a, t).await
    }
    async fn cleanup_defunct(&self, b: Timestamp) -> Result<usize> {
        self.cleanups.fetch_add(1, Ordering::SeqCst);
        self.inner.cleanup_defunct(b).await
    }
    async fn delete_cluster(&self, c: &str) -> Result<()> {
        self.inner.delete_cluster(c).await
    }
}

/// The cleanup task re-reads `storage_expiry()` every period: it sleeps while storage covers
/// the cleanup, and cleans once it no longer does (review of issue 10, finding 3: the flag was
/// read once, at start, and a table that stopped being covered was never cleaned).
#[tokio::test(start_paused = true)]
async fn cleanup_sleeps_while_storage_expiry_covers_it_and_runs_once_it_does_not() {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::new());
    let table = Arc::new(CoverFlips {
        inner: InMemoryMembershipTable::new("expiring").with_expiry(Duration::from_secs(3600)),
        covered: AtomicBool::new(true),
        cleanups: AtomicU64::new(0),
    });
    let o = MembershipOptions::default();
    let hour = Duration::from_secs(3600);
    let cleanup = DefunctCleanup::spawn(table.clone(), &o, clock.clone())
        .unwrap()
        .expect("the task starts, and watches whether storage still covers the cleanup");
    tokio::time::sleep(3 * hour).await;
    assert_eq!(
        table.cleanups.load(Ordering::SeqCst),
        0,
        "covered: no cleanup"
    );
    table.covered.store(false, Ordering::SeqCst);
    tokio::time::sleep(2 * hour + o.defunct_silo_cleanup_jitter).await;
    let ran = table.cleanups.load(Ordering::SeqCst);
    assert!(ran >= 1, "no longer covered: the cleanup runs");
    assert!(cleanup.is_active());
    table.covered.store(true, Ordering::SeqCst);
    tokio::time::sleep(2 * hour).await;
    let settled = table.cleanups.load(Ordering::SeqCst);
    assert!(
        settled <= ran + 1,
        "at most a run already due when covered again"
    );
    tokio::time::sleep(3 * hour).await;
    assert_eq!(
        table.cleanups.load(Ordering::SeqCst),
        settled,
        "covered again: none"
    );
    cleanup.stop().await;
    // Forced, it cleans even while covered.
    let mut forced = o;
    forced.force_defunct_cleanup = true;
    let cleanup = DefunctCleanup::spawn(table.clone(), &forced, clock)
        .unwrap()
        .unwrap();
    tokio::time::sleep(2 * hour).await;
    assert!(table.cleanups.load(Ordering::SeqCst) > settled);
    cleanup.stop().await;
}

#[tokio::test(start_paused = true)]
async fn graceful_leave_retries_version_conflicts_and_ends_dead() {
    let clock = Arc::new(TokioClock::new());
    let table = Arc::new(InMemoryMembershipTable::new("c").with_clock(clock.clone()));
    let silo = join(table.clone(), 1, &clock).await;
    let address = silo.address();
    // Another silo keeps moving the version while this one leaves.
    let busy = {
        let table = table.clone();
        tokio::spawn(async move {
            let other = entry(2);
            protocol::join(table.as_ref(), &other).await.unwrap();
            for i in 0..200 {
                let status = if i % 2 == 0 {
                    SiloStatus::Active
                } else {
                    SiloStatus::Joining
                };
                protocol::set_status(table.as_ref(), &other.address, status, Timestamp::now())
                    .await
                    .unwrap();
                tokio::task::yield_now().await;
            }
        })
    };
    tokio::task::yield_now().await;
    silo.leave().await.unwrap();
    busy.await.unwrap();
    assert_eq!(
        table.read_row(&address).await.unwrap().rows[0].entry.status,
        SiloStatus::Dead
    );
}

fn entry_at(n: u8, clock: &dyn Clock) -> MembershipEntry {
    let mut e = entry(n);
    e.start_time = clock.now();
    e
}

/// Polls every 100 ms of (paused) time until `done` or `limit` passes.
async fn poll_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let started = tokio::time::Instant::now();
    while started.elapsed() < limit {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    done()
}

// Defect 1: a backend whose heartbeat does not look at the entry (the Cassandra table between
// renewals) must not hide a Dead or missing entry: the failure detector's read shows it.
#[tokio::test(start_paused = true)]
async fn a_silo_declared_dead_learns_it_within_one_period_even_when_heartbeats_do_not_check() {
    let clock = Arc::new(TokioClock::new());
    let table = Flaky::new(InMemoryMembershipTable::new("c").with_clock(clock.clone()));
    table.blind.store(true, Ordering::SeqCst);
    let silo = join(table.clone(), 1, &clock).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        protocol::set_status(&table.inner, &silo.address(), SiloStatus::Dead, clock.now())
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
    let clock = Arc::new(TokioClock::new());
    let table = Flaky::new(InMemoryMembershipTable::new("c").with_clock(clock.clone()));
    table.blind.store(true, Ordering::SeqCst);
    let silo = join(table.clone(), 1, &clock).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    table.inner.delete_cluster("c").await.unwrap();
    assert_eq!(
        silo.wait_final(Duration::from_secs(11)).await,
        SiloHealth::EntryMissing
    );
}

/// Three silos; A's heartbeats fail. Returns (A told to fence, A declared dead), as offsets from
/// the moment A's heartbeats started failing.
async fn fence_and_death(ttl: Option<Duration>) -> (Option<Duration>, Option<Duration>) {
    let clock = Arc::new(TokioClock::new());
    let mut inner = InMemoryMembershipTable::new("c").with_clock(clock.clone());
    if let Some(ttl) = ttl {
        inner = inner.with_expiry(ttl);
    }
    let a_table = Flaky::new(inner.clone());
    let a = join(a_table.clone(), 1, &clock).await;
    let b = join(Arc::new(inner.clone()), 2, &clock).await;
    let c = join(Arc::new(inner.clone()), 3, &clock).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    a_table.failing.store(true, Ordering::SeqCst);
    let start = tokio::time::Instant::now();
    let (mut fenced, mut dead) = (None, None);
    let health = a.health();
    let address = a.address();
    while start.elapsed() < Duration::from_secs(600) && dead.is_none() {
        if fenced.is_none() && matches!(*health.borrow(), SiloHealth::LeaseAtRisk { .. }) {
            fenced = Some(start.elapsed());
        }
        if inner.read_row(&address).await.unwrap().rows[0].entry.status == SiloStatus::Dead {
            dead = Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    a.crash();
    b.leave().await.unwrap();
    c.leave().await.unwrap();
    (fenced, dead)
}

// Defect 2: the host is told to fence before the others can declare it dead, TTL on or off.
#[tokio::test(start_paused = true)]
async fn a_silo_that_cannot_publish_is_told_to_fence_before_the_others_declare_it_dead_ttl_off() {
    let (fenced, dead) = fence_and_death(None).await;
    let dead = dead.expect("the others declare it dead");
    let fenced = fenced.unwrap_or_else(|| panic!("never told to fence; declared dead at {dead:?}"));
    assert!(
        fenced + Duration::from_secs(5) <= dead,
        "fenced at {fenced:?}, declared dead at {dead:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_silo_that_cannot_publish_is_told_to_fence_before_the_others_declare_it_dead_ttl_on() {
    let (fenced, dead) = fence_and_death(Some(Duration::from_secs(3600))).await;
    let dead = dead.expect("the others declare it dead");
    let fenced = fenced.unwrap_or_else(|| panic!("never told to fence; declared dead at {dead:?}"));
    assert!(
        fenced + Duration::from_secs(5) <= dead,
        "fenced at {fenced:?}, declared dead at {dead:?}"
    );
}

// Defect 4: a hung heartbeat is a failed heartbeat, and the fence signal comes on time.
#[tokio::test(start_paused = true)]
async fn a_hung_heartbeat_counts_as_failed_and_the_host_is_told_to_fence_on_time() {
    let clock = Arc::new(TokioClock::new());
    let table = Flaky::new(InMemoryMembershipTable::new("c").with_clock(clock.clone()));
    let silo = join(table.clone(), 1, &clock).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    table.hang.store(true, Ordering::SeqCst);
    let health = silo.health();
    let failed = poll_until(Duration::from_secs(30), || {
        matches!(
            *health.borrow(),
            SiloHealth::Failing { .. } | SiloHealth::LeaseAtRisk { .. }
        )
    })
    .await;
    assert!(
        failed,
        "still {:?} 30 s into a hung heartbeat",
        *health.borrow()
    );
    // Publish period 10 s × 3 missed: the others may decide 30 s after the last publish;
    // the host hears it at least one period earlier.
    let at_risk = poll_until(Duration::from_secs(30), || {
        matches!(*health.borrow(), SiloHealth::LeaseAtRisk { .. })
    })
    .await;
    assert!(at_risk, "{:?}", *health.borrow());
    silo.crash();
}

#[tokio::test(start_paused = true)]
async fn a_join_whose_table_call_hangs_returns_an_error_by_the_join_deadline() {
    let clock = Arc::new(TokioClock::new());
    let table = Flaky::new(InMemoryMembershipTable::new("c").with_clock(clock.clone()));
    table.hang_inserts.store(true, Ordering::SeqCst);
    let joined = tokio::time::timeout(
        Duration::from_secs(3600),
        cassandra_membership::Silo::join_with_clock(table, entry(1), options(), clock.clone()),
    )
    .await;
    match joined {
        Ok(Err(_)) => {}
        Ok(Ok(_)) => panic!("joined through a hung insert"),
        Err(_) => panic!("join still hangs after an hour"),
    }
}

// Defect 5: a read that gives up under contention is retried, within the join deadline.
#[tokio::test(start_paused = true)]
async fn join_retries_reads_that_give_up_under_contention() {
    let clock = Arc::new(TokioClock::new());
    let table = Flaky::new(InMemoryMembershipTable::new("c").with_clock(clock.clone()));
    table.failing_reads.store(20, Ordering::SeqCst);
    let silo =
        cassandra_membership::Silo::join_with_clock(table, entry(1), options(), clock.clone())
            .await
            .expect("joins once the reads succeed");
    silo.leave().await.unwrap();
}

// Defect 6: unrelated tables do not share a cleanup registration, and a refused second cleanup
// on the same table leaves nothing written.
#[tokio::test(start_paused = true)]
async fn silos_on_unrelated_tables_with_the_same_cluster_id_both_join() {
    let clock = Arc::new(TokioClock::new());
    let mut o = options();
    o.defunct_silo_cleanup_period = Some(Duration::from_secs(3600));
    let first = Arc::new(InMemoryMembershipTable::new("default").with_clock(clock.clone()));
    let second = Arc::new(InMemoryMembershipTable::new("default").with_clock(clock.clone()));
    let a = cassandra_membership::Silo::join_with_clock(
        first.clone(),
        entry(1),
        o.clone(),
        clock.clone(),
    )
    .await
    .unwrap();
    let b = cassandra_membership::Silo::join_with_clock(second, entry(2), o.clone(), clock.clone())
        .await
        .expect("an unrelated table has its own cleanup");
    assert!(a.runs_defunct_cleanup() && b.runs_defunct_cleanup());
    // The same table twice: refused, and before anything was written.
    let refused =
        cassandra_membership::Silo::join_with_clock(first.clone(), entry(3), o, clock.clone())
            .await;
    assert!(
        matches!(refused, Err(MembershipError::InvalidConfiguration { .. })),
        "{refused:?}"
    );
    let third: SiloAddress = "10.0.0.3:11111@1".parse().unwrap();
    assert!(
        first.read_row(&third).await.unwrap().rows.is_empty(),
        "the refused silo left an entry nobody heartbeats"
    );
    a.leave().await.unwrap();
    b.leave().await.unwrap();
}

// Defect 7: a backward wall-clock step does not delay the fence signal.
#[tokio::test(start_paused = true)]
async fn a_backward_wall_clock_step_does_not_delay_the_fence_signal() {
    let clock = Arc::new(cassandra_membership::ManualClock::new(Timestamp::now()));
    let inner = InMemoryMembershipTable::new("c")
        .with_clock(clock.clone())
        .with_expiry(Duration::from_secs(100));
    let table = Flaky::new(inner);
    let mut o = options();
    // Detection far away: only the lease (refresh by 90 s) bounds the fence.
    o.num_missed_table_i_am_alive_limit = 100;
    let silo = cassandra_membership::Silo::join_with_clock(
        table.clone(),
        entry_at(1, clock.as_ref()),
        o,
        clock.clone(),
    )
    .await
    .unwrap();
    let health = silo.health();
    // Wall time moves with tokio's until the first heartbeat.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        clock.advance(Duration::from_millis(100));
    }
    assert!(
        matches!(*health.borrow(), SiloHealth::Healthy { .. }),
        "{:?}",
        *health.borrow()
    );
    table.failing.store(true, Ordering::SeqCst);
    clock.set(clock.now().saturating_sub(Duration::from_secs(3600)));
    let mut fenced = false;
    for _ in 0..1000 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        clock.advance(Duration::from_millis(100));
        if matches!(*health.borrow(), SiloHealth::LeaseAtRisk { .. }) {
            fenced = true;
            break;
        }
    }
    assert!(
        fenced,
        "not told to fence 100 s after the last renewal: {:?}",
        *health.borrow()
    );
    silo.crash();
}

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
    /// `read_all` calls so far.
    reads: AtomicU64,
    /// This many `read_row` calls fail with `Timeout` first (a join reads its own row).
    failing_row_reads: AtomicU64,
    /// This many `update_row` calls never answer.
    hang_updates: AtomicU64,
    /// The next insert that applies has its row declared Dead right after.
    kill_after_insert: AtomicBool,
    /// `initialize` takes this many seconds.
    slow_initialize: AtomicU64,
    /// The row of 10.0.0.1:11111@1 is damaged: `read_all` skips it, `read_row` fails.
    damaged_first: AtomicBool,
    /// Each heartbeat takes this many milliseconds.
    slow_heartbeat_ms: AtomicU64,
    /// `cleanup_defunct` calls so far; with `hang_cleanup` they never answer.
    cleanups: AtomicU64,
    hang_cleanup: AtomicBool,
    /// The `read_all` call with this number (1-based; 0: none) fails with `Timeout`.
    fail_read_number: AtomicU64,
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
            reads: AtomicU64::new(0),
            failing_row_reads: AtomicU64::new(0),
            hang_updates: AtomicU64::new(0),
            kill_after_insert: AtomicBool::new(false),
            slow_initialize: AtomicU64::new(0),
            slow_heartbeat_ms: AtomicU64::new(0),
            damaged_first: AtomicBool::new(false),
            cleanups: AtomicU64::new(0),
            hang_cleanup: AtomicBool::new(false),
            fail_read_number: AtomicU64::new(0),
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
        let slow = self.slow_initialize.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(slow)).await;
        self.inner.initialize(v).await
    }
    async fn read_all(&self) -> Result<MembershipSnapshot> {
        let n = self.reads.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.fail_read_number.load(Ordering::SeqCst) {
            return Err(MembershipError::Timeout {
                operation: "read_all",
                source: "injected".into(),
            });
        }
        let left = self.failing_reads.load(Ordering::SeqCst);
        if left > 0 {
            self.failing_reads.store(left - 1, Ordering::SeqCst);
            return Err(MembershipError::Contention {
                operation: "read_all",
                attempts: 8,
                elapsed: Duration::ZERO,
            });
        }
        let mut snapshot = self.inner.read_all().await?;
        if self.damaged_first.load(Ordering::SeqCst) {
            snapshot
                .rows
                .retain(|r| r.entry.address != entry(1).address);
        }
        Ok(snapshot)
    }
    async fn read_row(&self, a: &SiloAddress) -> Result<MembershipSnapshot> {
        if self.damaged_first.load(Ordering::SeqCst) && *a == entry(1).address {
            return Err(MembershipError::CorruptData {
                silo: Some(a.to_string()),
                reason: "injected".into(),
            });
        }
        let left = self.failing_row_reads.load(Ordering::SeqCst);
        if left > 0 {
            self.failing_row_reads.store(left - 1, Ordering::SeqCst);
            return Err(MembershipError::Timeout {
                operation: "read_row",
                source: "injected".into(),
            });
        }
        self.inner.read_row(a).await
    }
    async fn insert_row(&self, e: &MembershipEntry, v: &TableVersion) -> Result<bool> {
        if self.hang_inserts.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        let applied = self.inner.insert_row(e, v).await?;
        if applied && self.kill_after_insert.swap(false, Ordering::SeqCst) {
            protocol::set_status(&self.inner, &e.address, SiloStatus::Dead, e.i_am_alive_time)
                .await?;
        }
        Ok(applied)
    }
    async fn update_row(&self, e: &MembershipEntry, t: &ETag, v: &TableVersion) -> Result<bool> {
        let left = self.hang_updates.load(Ordering::SeqCst);
        if left > 0 {
            self.hang_updates.store(left - 1, Ordering::SeqCst);
            std::future::pending::<()>().await;
        }
        self.inner.update_row(e, t, v).await
    }
    async fn update_i_am_alive(&self, a: &SiloAddress, t: Timestamp) -> Result<HeartbeatOutcome> {
        self.heartbeats.fetch_add(1, Ordering::SeqCst);
        let slow = self.slow_heartbeat_ms.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(slow)).await;
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
        self.cleanups.fetch_add(1, Ordering::SeqCst);
        if self.hang_cleanup.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
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
    table.failing_row_reads.store(20, Ordering::SeqCst);
    let silo = cassandra_membership::Silo::join_with_clock(
        table.clone(),
        entry(1),
        options(),
        clock.clone(),
    )
    .await
    .expect("joins once the reads succeed");
    assert_eq!(table.failing_row_reads.load(Ordering::SeqCst), 0);
    silo.leave().await.unwrap();
}

// Issue 15: a join reads its own row; one that cannot be read fails the join at once (read_all
// would skip it, and the insert would conflict with it until max_join_attempt_time).
#[tokio::test(start_paused = true)]
async fn a_join_whose_own_row_cannot_be_read_fails_at_once() {
    let clock = Arc::new(TokioClock::new());
    let table = Flaky::new(InMemoryMembershipTable::new("c").with_clock(clock.clone()));
    table.damaged_first.store(true, Ordering::SeqCst);
    let started = tokio::time::Instant::now();
    let joined = cassandra_membership::Silo::join_with_clock(
        table.clone(),
        entry(1),
        options(),
        clock.clone(),
    )
    .await;
    assert!(
        matches!(joined, Err(MembershipError::CorruptData { .. })),
        "{joined:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(table.inner.read_all().await.unwrap().rows.is_empty());
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

/// Records every health change of `silo` from now on.
fn record(silo: &cassandra_membership::Silo) -> Arc<std::sync::Mutex<Vec<SiloHealth>>> {
    let seen = Arc::new(std::sync::Mutex::new(vec![silo.health().borrow().clone()]));
    let mut rx = silo.health();
    let out = seen.clone();
    tokio::spawn(async move {
        while rx.changed().await.is_ok() {
            let h = rx.borrow_and_update().clone();
            out.lock().unwrap().push(h);
        }
    });
    seen
}

// Review 1: a fenced silo whose row was declared Dead meanwhile must not turn Healthy when its
// (unchecked) heartbeat gets through again — the Cassandra table between renewals.
#[tokio::test(start_paused = true)]
async fn a_fenced_silo_declared_dead_meanwhile_never_turns_healthy_when_publishing_recovers() {
    let clock = Arc::new(TokioClock::new());
    let table = Flaky::new(InMemoryMembershipTable::new("c").with_clock(clock.clone()));
    table.blind.store(true, Ordering::SeqCst);
    let silo = join(table.clone(), 1, &clock).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Storage is cut for this silo: heartbeats and the detector's reads fail.
    table.failing.store(true, Ordering::SeqCst);
    table.failing_reads.store(u64::MAX, Ordering::SeqCst);
    let mut health = silo.health();
    health
        .wait_for(|h| matches!(h, SiloHealth::LeaseAtRisk { .. }))
        .await
        .unwrap();
    let seen = record(&silo);
    // The others declare it dead while it is fenced.
    assert!(
        protocol::set_status(&table.inner, &silo.address(), SiloStatus::Dead, clock.now())
            .await
            .unwrap()
    );
    // The heartbeat gets through again; the detector still cannot read.
    table.failing.store(false, Ordering::SeqCst);
    let last = silo.wait_final(Duration::from_secs(30)).await;
    let seen = seen.lock().unwrap().clone();
    assert!(
        !seen.iter().any(|h| matches!(h, SiloHealth::Healthy { .. })),
        "told Healthy while its row was Dead: {seen:?}"
    );
    assert_eq!(last, SiloHealth::DeclaredDead, "{seen:?}");
    silo.crash();
}

// Review 2: a detector that cannot read must not leave a zombie Healthy: after
// `num_missed_table_i_am_alive_limit` failed rounds the silo's own status is unknown: fence.
#[tokio::test(start_paused = true)]
async fn a_silo_whose_detector_cannot_read_is_fenced_after_the_missed_limit_of_rounds() {
    let clock = Arc::new(TokioClock::new());
    let table = Flaky::new(InMemoryMembershipTable::new("c").with_clock(clock.clone()));
    table.blind.store(true, Ordering::SeqCst);
    let silo = join(table.clone(), 1, &clock).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    table.failing_reads.store(u64::MAX, Ordering::SeqCst);
    assert!(
        protocol::set_status(&table.inner, &silo.address(), SiloStatus::Dead, clock.now())
            .await
            .unwrap()
    );
    let health = silo.health();
    // Three failed rounds, one per 10 s period (each bounded by one period).
    let fenced = poll_until(Duration::from_secs(70), || {
        matches!(*health.borrow(), SiloHealth::LeaseAtRisk { .. })
    })
    .await;
    assert!(
        fenced,
        "still {:?} with its own row unread for 70 s",
        *health.borrow()
    );
    // Reads come back: the row says Dead.
    table.failing_reads.store(0, Ordering::SeqCst);
    assert_eq!(
        silo.wait_final(Duration::from_secs(15)).await,
        SiloHealth::DeclaredDead
    );
}

// Review 2: own status comes from the round's first read even when a suspect's re-read fails,
// and a silo whose own row is Dead votes no one dead.
#[tokio::test(start_paused = true)]
async fn a_detection_round_reports_its_own_row_even_when_a_suspect_re_read_fails() {
    let clock = Arc::new(TokioClock::new());
    let table = Flaky::new(InMemoryMembershipTable::new("c").with_clock(clock.clone()));
    table.initialize(true).await.unwrap();
    let mut me = entry_at(1, clock.as_ref());
    me.status = SiloStatus::Active;
    let mut silent = entry_at(2, clock.as_ref());
    silent.status = SiloStatus::Active;
    protocol::join(table.as_ref(), &me).await.unwrap();
    protocol::join(table.as_ref(), &silent).await.unwrap();
    tokio::time::sleep(Duration::from_secs(60)).await;
    // The round's second read (the suspect's re-read) fails.
    let first = table.reads.load(Ordering::SeqCst) + 1;
    table.fail_read_number.store(first + 1, Ordering::SeqCst);
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

// Review 3: after a backward wall-clock step the backend keeps the larger stored I-am-alive time,
// so heartbeats that "succeed" publish nothing new: the others see a silent silo. The fence must
// come from what was stored, not from when the writes succeeded.
#[tokio::test(start_paused = true)]
async fn after_a_backward_wall_clock_step_the_fence_follows_the_stored_i_am_alive_time() {
    let clock = Arc::new(cassandra_membership::ManualClock::new(Timestamp::now()));
    let table = Flaky::new(InMemoryMembershipTable::new("c").with_clock(clock.clone()));
    let silo = cassandra_membership::Silo::join_with_clock(
        table.clone(),
        entry_at(1, clock.as_ref()),
        options(),
        clock.clone(),
    )
    .await
    .unwrap();
    let health = silo.health();
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        clock.advance(Duration::from_millis(100));
    }
    assert!(matches!(*health.borrow(), SiloHealth::Healthy { .. }));
    let stored = table.inner.read_row(&silo.address()).await.unwrap().rows[0]
        .entry
        .i_am_alive_time;
    clock.set(clock.now().saturating_sub(Duration::from_secs(3600)));
    let step = tokio::time::Instant::now();
    let mut fenced = None;
    for _ in 0..400 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        clock.advance(Duration::from_millis(100));
        if matches!(*health.borrow(), SiloHealth::LeaseAtRisk { .. }) {
            fenced = Some(step.elapsed());
            break;
        }
    }
    let now_stored = table.inner.read_row(&silo.address()).await.unwrap().rows[0]
        .entry
        .i_am_alive_time;
    assert_eq!(
        now_stored, stored,
        "the stored I-am-alive time did not move"
    );
    // The others may vote 30 s after the stored time (3 × 10 s): fence before that.
    let fenced = fenced.unwrap_or_else(|| {
        panic!(
            "still {:?} 40 s after the step; the others see it silent",
            *health.borrow()
        )
    });
    assert!(
        fenced < Duration::from_secs(30),
        "fenced {fenced:?} after the step"
    );
    silo.crash();
}

// Review 4: the fence horizon counts from the I-am-alive time the join stored, not from when the
// heartbeat task started (the Active step may have retried for a long time in between).
#[tokio::test(start_paused = true)]
async fn the_fence_counts_from_the_i_am_alive_time_the_join_stored() {
    let clock = Arc::new(TokioClock::new());
    let table = Flaky::new(InMemoryMembershipTable::new("c").with_clock(clock.clone()));
    table.failing.store(true, Ordering::SeqCst);
    // The Active step's first three writes hang (10 s each, the call timeout).
    table.hang_updates.store(3, Ordering::SeqCst);
    let start = tokio::time::Instant::now();
    let silo = join(table.clone(), 1, &clock).await;
    let joined = start.elapsed();
    assert!(joined >= Duration::from_secs(30), "joined after {joined:?}");
    let health = silo.health();
    // Stored at about 0 s: the others may vote from 30 s on; the fence is 20 s after the store.
    let fenced = poll_until(Duration::from_secs(30), || {
        matches!(*health.borrow(), SiloHealth::LeaseAtRisk { .. })
    })
    .await;
    let at = start.elapsed();
    assert!(fenced, "{:?}", *health.borrow());
    assert!(
        at <= joined + Duration::from_secs(1),
        "fenced {at:?} after the store (joined at {joined:?})"
    );
    silo.crash();
}

// Review 4: an Active step that finds the row Dead (or gone) fails the join.
#[tokio::test(start_paused = true)]
async fn a_join_whose_row_was_declared_dead_before_it_turned_active_fails() {
    let clock = Arc::new(TokioClock::new());
    let table = Flaky::new(InMemoryMembershipTable::new("c").with_clock(clock.clone()));
    table.kill_after_insert.store(true, Ordering::SeqCst);
    let joined = cassandra_membership::Silo::join_with_clock(
        table.clone(),
        entry(1),
        options(),
        clock.clone(),
    )
    .await;
    assert!(joined.is_err(), "joined as a Dead entry: {joined:?}");
}

// Review 5: one deadline for the whole join — a slow initialize, an Active step that never gets
// through and the Dead marking after it must not add up to several `max_join_attempt_time`s.
#[tokio::test(start_paused = true)]
async fn a_join_returns_within_max_join_attempt_time_however_its_steps_fail() {
    let clock = Arc::new(TokioClock::new());
    let table = Flaky::new(InMemoryMembershipTable::new("c").with_clock(clock.clone()));
    table.slow_initialize.store(240, Ordering::SeqCst);
    table.hang_updates.store(u64::MAX, Ordering::SeqCst);
    let o = options();
    let limit = o.max_join_attempt_time;
    let start = tokio::time::Instant::now();
    let joined =
        cassandra_membership::Silo::join_with_clock(table.clone(), entry(1), o, clock.clone())
            .await;
    let took = start.elapsed();
    assert!(joined.is_err(), "{joined:?}");
    assert!(
        took <= limit,
        "join returned after {took:?} (max_join_attempt_time {limit:?})"
    );
}

// Review 8: an unbounded join deadline does not overflow.
#[tokio::test(start_paused = true)]
async fn a_join_with_an_unbounded_attempt_time_joins() {
    let clock = Arc::new(TokioClock::new());
    let table = Arc::new(InMemoryMembershipTable::new("c").with_clock(clock.clone()));
    let mut o = options();
    o.max_join_attempt_time = Duration::MAX;
    let silo = cassandra_membership::Silo::join_with_clock(table, entry(1), o, clock.clone())
        .await
        .unwrap();
    silo.leave().await.unwrap();
}

// Review 6: a hung defunct cleanup is bounded (the next period runs again) and does not block
// `leave` before its ShuttingDown and Dead writes.
#[tokio::test(start_paused = true)]
async fn a_hung_defunct_cleanup_is_bounded_and_does_not_block_leave() {
    let clock = Arc::new(TokioClock::new());
    let table = Flaky::new(InMemoryMembershipTable::new("c").with_clock(clock.clone()));
    table.hang_cleanup.store(true, Ordering::SeqCst);
    let mut o = options();
    o.defunct_silo_cleanup_period = Some(Duration::from_secs(60));
    o.defunct_silo_cleanup_jitter = Duration::ZERO;
    let silo =
        cassandra_membership::Silo::join_with_clock(table.clone(), entry(1), o, clock.clone())
            .await
            .unwrap();
    assert!(silo.runs_defunct_cleanup());
    tokio::time::sleep(Duration::from_secs(200)).await;
    let runs = table.cleanups.load(Ordering::SeqCst);
    assert!(runs >= 2, "{runs} cleanup runs in 200 s at a 60 s period");
    let address = silo.address();
    tokio::time::timeout(Duration::from_secs(60), silo.leave())
        .await
        .expect("leave blocked by a hung cleanup")
        .unwrap();
    assert_eq!(
        table.inner.read_row(&address).await.unwrap().rows[0]
            .entry
            .status,
        SiloStatus::Dead
    );
}

// Review 7: a healthy silo is never told to fence, even with the longest heartbeat delay
// (period + jitter) and slow (but successful) calls; settings that leave no margin are refused.
#[tokio::test(start_paused = true)]
async fn a_healthy_silo_with_slow_calls_and_wide_jitter_is_never_fenced() {
    let clock = Arc::new(TokioClock::new());
    let table = Flaky::new(InMemoryMembershipTable::new("c").with_clock(clock.clone()));
    table.slow_heartbeat_ms.store(900, Ordering::SeqCst);
    let mut o = options();
    o.num_missed_table_i_am_alive_limit = 2;
    o.i_am_alive_jitter_percent = 50;
    o.table_operation_timeout = Some(Duration::from_secs(1));
    let silo =
        cassandra_membership::Silo::join_with_clock(table.clone(), entry(1), o, clock.clone())
            .await
            .unwrap();
    let seen = record(&silo);
    tokio::time::sleep(Duration::from_secs(1200)).await;
    let seen = seen.lock().unwrap().clone();
    assert!(
        !seen.iter().any(|h| matches!(
            h,
            SiloHealth::LeaseAtRisk { .. } | SiloHealth::Failing { .. }
        )),
        "a healthy silo was told to fence: {:?}",
        seen.iter()
            .filter(|h| !matches!(h, SiloHealth::Healthy { .. }))
            .collect::<Vec<_>>()
    );
    silo.leave().await.unwrap();
}

#[test]
fn settings_that_leave_no_fencing_margin_are_refused_naming_the_options() {
    let mut o = options();
    o.num_missed_table_i_am_alive_limit = 1;
    match o.validate() {
        Err(MembershipError::InvalidConfiguration { option, reason }) => {
            assert_eq!(option, "num_missed_table_i_am_alive_limit");
            for named in ["i_am_alive_jitter_percent", "table_operation_timeout"] {
                assert!(reason.contains(named), "{reason}");
            }
        }
        other => panic!("{other:?}"),
    }
    // Two missed periods and the default call timeout (one period): no room.
    o.num_missed_table_i_am_alive_limit = 2;
    assert!(o.validate().is_err());
    // With short calls there is.
    o.table_operation_timeout = Some(Duration::from_secs(1));
    o.validate().unwrap();
    assert!(MembershipOptions::default().validate().is_ok());
}

// Review 9: another incarnation's row at the same address is not this silo's row.
#[tokio::test(start_paused = true)]
async fn a_silo_whose_row_was_replaced_by_another_incarnation_learns_its_entry_is_gone() {
    let clock = Arc::new(TokioClock::new());
    let table = Flaky::new(InMemoryMembershipTable::new("c").with_clock(clock.clone()));
    let silo = cassandra_membership::Silo::join_with_clock(
        table.clone(),
        entry_at(1, clock.as_ref()),
        options(),
        clock.clone(),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    table.inner.delete_cluster("c").await.unwrap();
    table.inner.initialize(true).await.unwrap();
    let mut other = entry_at(1, clock.as_ref());
    other.status = SiloStatus::Active;
    protocol::join(&table.inner, &other).await.unwrap();
    assert_eq!(
        silo.wait_final(Duration::from_secs(15)).await,
        SiloHealth::EntryMissing
    );
}

// Review 9: a damaged own row (skipped by read_all) is unknown, not missing.
#[tokio::test(start_paused = true)]
async fn a_damaged_own_row_is_not_taken_for_a_missing_one() {
    let clock = Arc::new(TokioClock::new());
    let table = Flaky::new(InMemoryMembershipTable::new("c").with_clock(clock.clone()));
    let silo = join(table.clone(), 1, &clock).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    table.damaged_first.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(15)).await;
    let health = silo.health().borrow().clone();
    assert!(!health.is_final(), "{health:?} for a damaged row");
    silo.crash();
}

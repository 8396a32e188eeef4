//! The host runtime on the in-memory table, under tokio's paused time: deterministic and fast.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use cassandra_membership::runtime::{CleanupNotStarted, DefunctCleanup, protocol};
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
}

impl Flaky {
    fn new(inner: InMemoryMembershipTable) -> Arc<Self> {
        Arc::new(Flaky {
            inner,
            heartbeats: AtomicU64::new(0),
            failing: AtomicBool::new(false),
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
        self.heartbeats.fetch_add(1, Ordering::SeqCst);
        if self.failing.load(Ordering::SeqCst) {
            return Err(MembershipError::Timeout {
                operation: "update_i_am_alive",
                source: "injected".into(),
            });
        }
        self.inner.update_i_am_alive(a, t).await
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
    let silo = join(table.clone(), 1, &clock).await;
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

#[tokio::test(start_paused = true)]
async fn cleanup_stays_off_when_storage_expiry_covers_it_unless_forced() {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::new());
    let table =
        Arc::new(InMemoryMembershipTable::new("expiring").with_expiry(Duration::from_secs(3600)));
    let o = MembershipOptions::default();
    let r = DefunctCleanup::spawn(table.clone(), &o, clock.clone()).unwrap();
    assert_eq!(r.unwrap_err(), CleanupNotStarted::CoveredByStorageExpiry);
    let mut forced = o;
    forced.force_defunct_cleanup = true;
    DefunctCleanup::spawn(table, &forced, clock)
        .unwrap()
        .unwrap()
        .stop()
        .await;
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

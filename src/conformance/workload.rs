//! A membership workload for fault runs: several clients (table values) reading and writing one
//! cluster concurrently, every versioned operation recorded in a [`History`], plus heartbeats.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;

use super::history::{History, HistoryOp, HistoryRet};
use crate::error::MembershipError;
use crate::model::{MembershipEntry, SiloAddress, SiloStatus, Timestamp};
use crate::table::MembershipTable;

/// How a workload runs.
#[derive(Clone, Debug)]
pub struct WorkloadOptions {
    /// Entries each client inserts before it only updates.
    pub silos_per_client: u16,
    /// Pause between a client's operations.
    pub pause: Duration,
    /// Heartbeat period of each inserted entry (heartbeats are not part of the history).
    pub heartbeat_every: Duration,
    /// Time between a client's read and the write it bases on it (a silo deciding): other
    /// clients' writes land in between, so stale tags get presented.
    pub think: Duration,
    /// A call that has not returned after this long is recorded as a `Hung` failure (and its
    /// outcome stays unknown): the provider promises every call returns within its timeouts.
    pub hung_after: Duration,
}

impl Default for WorkloadOptions {
    fn default() -> Self {
        WorkloadOptions {
            silos_per_client: 3,
            pause: Duration::from_millis(20),
            heartbeat_every: Duration::from_millis(500),
            hung_after: Duration::from_secs(60),
            think: Duration::ZERO,
        }
    }
}

/// One failed call: when (since the workload started), which operation, the error's kind.
#[derive(Clone, Debug)]
pub struct Failure {
    /// Time since the start of the workload.
    pub at: Duration,
    /// `read_all`, `insert_row`, `update_row` or `update_i_am_alive`.
    pub operation: &'static str,
    /// The error's variant name.
    pub kind: String,
    /// How long the call took.
    pub took: Duration,
    /// The error, with its sources.
    pub detail: String,
}

/// What a workload did.
#[derive(Clone, Debug, Default)]
pub struct WorkloadReport {
    /// Calls that returned `Ok` (reads, writes whatever `applied` said, heartbeats).
    pub ok: u64,
    /// Writes that returned `Ok(true)`.
    pub applied: u64,
    /// When each of them was sent (since the start).
    pub applied_at: Vec<Duration>,
    /// Every failed call.
    pub failures: Vec<Failure>,
    /// The longest any call took.
    pub slowest: Duration,
}

impl WorkloadReport {
    /// Failures after `t` (since the start).
    pub fn failures_after(&self, t: Duration) -> Vec<&Failure> {
        self.failures.iter().filter(|f| f.at >= t).collect()
    }

    /// Failures by error kind.
    pub fn by_kind(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for f in &self.failures {
            *m.entry(f.kind.clone()).or_default() += 1;
        }
        m
    }
}

/// `call`, or a `Hung` failure (reported as `MembershipError::Timeout` with operation `"hung"`)
/// when it has not returned after `limit`.
async fn bounded<T>(
    limit: Duration,
    call: impl std::future::Future<Output = Result<T, MembershipError>>,
) -> Result<T, MembershipError> {
    match tokio::time::timeout(limit, call).await {
        Ok(r) => r,
        Err(elapsed) => Err(MembershipError::Timeout {
            operation: "hung",
            source: Box::new(elapsed),
        }),
    }
}

/// The variant name of an error, for reports.
pub fn kind(e: &MembershipError) -> String {
    if let MembershipError::Timeout {
        operation: "hung", ..
    } = e
    {
        return "Hung".into();
    }
    let text = format!("{e:?}");
    text.split([' ', '{', '(']).next().unwrap_or("").to_owned()
}

#[derive(Default)]
struct Shared {
    report: WorkloadReport,
}

impl Shared {
    fn record<T>(
        &mut self,
        started: Instant,
        operation: &'static str,
        call_started: Instant,
        r: &Result<T, MembershipError>,
    ) {
        let took = call_started.elapsed();
        self.report.slowest = self.report.slowest.max(took);
        match r {
            Ok(_) => self.report.ok += 1,
            Err(e) => self.report.failures.push(Failure {
                at: call_started.duration_since(started),
                operation,
                kind: kind(e),
                took,
                detail: format!("{e:?}"),
            }),
        }
    }
}

fn address(client: usize, k: u16) -> SiloAddress {
    let port = 20_000 + (client as u16) * 100 + k;
    SiloAddress::from_v4(SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), port), 1)
}

/// Runs one client per table until `until`, recording into `history`. Every client's table
/// value must be for the same cluster, initialized and empty.
pub async fn run(
    tables: Vec<Arc<dyn MembershipTable>>,
    history: Arc<History>,
    options: WorkloadOptions,
    until: Instant,
) -> WorkloadReport {
    run_until(
        tables,
        history,
        options,
        tokio::sync::watch::channel(until).1,
    )
    .await
}

/// [`run`] until the instant `until` holds when a client next looks: a fault test moves it on
/// once the fault is over (a node restarted on a loaded machine), so what it asserts of the
/// time after the fault does not depend on how long the fault took.
pub async fn run_until(
    tables: Vec<Arc<dyn MembershipTable>>,
    history: Arc<History>,
    options: WorkloadOptions,
    until: tokio::sync::watch::Receiver<Instant>,
) -> WorkloadReport {
    let started = Instant::now();
    let shared = Arc::new(Mutex::new(Shared::default()));
    let mut tasks = Vec::new();
    for (client, table) in tables.into_iter().enumerate() {
        let (history, shared, options, until) = (
            history.clone(),
            shared.clone(),
            options.clone(),
            until.clone(),
        );
        tasks.push(tokio::spawn(async move {
            client_loop(client, table, history, shared, options, started, until).await
        }));
    }
    for t in tasks {
        // A client that panicked would silently shrink the workload: let it show.
        if let Err(e) = t.await {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    let shared = shared.lock().unwrap_or_else(|p| p.into_inner());
    shared.report.clone()
}

async fn client_loop(
    client: usize,
    table: Arc<dyn MembershipTable>,
    history: Arc<History>,
    shared: Arc<Mutex<Shared>>,
    options: WorkloadOptions,
    started: Instant,
    until: tokio::sync::watch::Receiver<Instant>,
) {
    let mut thread = history.thread();
    let mut inserted = 0u16;
    // Each write stores a marker of its own (in `update_zone`), unique across clients.
    let mut writes = 0i32;
    let mut last_heartbeat = Instant::now();
    while Instant::now() < *until.borrow() {
        tokio::time::sleep(options.pause).await;
        // Heartbeats of this client's entries: plain writes that must never disturb the rest.
        if last_heartbeat.elapsed() >= options.heartbeat_every {
            last_heartbeat = Instant::now();
            for k in 0..inserted {
                let t0 = Instant::now();
                let r = table
                    .update_i_am_alive(&address(client, k), Timestamp::now())
                    .await;
                lock(&shared).record(started, "update_i_am_alive", t0, &r);
            }
        }
        history.invoke(thread, HistoryOp::ReadAll);
        let t0 = Instant::now();
        let read = bounded(options.hung_after, table.read_all()).await;
        lock(&shared).record(started, "read_all", t0, &read);
        let snapshot = match read {
            Ok(s) => {
                history.respond(thread, HistoryRet::snapshot(&s));
                s
            }
            Err(_) => {
                thread = history.thread(); // the read stays in flight: it changed nothing
                continue;
            }
        };
        let next = snapshot.version.next();
        let version = i64::try_from(next.version).unwrap_or(i64::MAX);
        let expected_version_etag = snapshot.version.etag.as_str().to_owned();
        let own = address(client, inserted);
        writes += 1;
        let marker = i32::try_from(client).unwrap_or(0).saturating_mul(1_000_000) + writes;
        let (op, call): (HistoryOp, _) = if inserted < options.silos_per_client
            && !snapshot.rows.iter().any(|r| r.entry.address == own)
        {
            let mut entry = MembershipEntry::new(own, SiloStatus::Joining, Timestamp::now());
            entry.update_zone = marker;
            let op = HistoryOp::Insert {
                silo: own.to_string(),
                status: entry.status.code(),
                marker,
                expected_version_etag,
                version,
            };
            (op, Call::Insert(entry))
        } else if snapshot.rows.is_empty() {
            continue;
        } else {
            let pick = rand::rng().random_range(0..snapshot.rows.len());
            let row = &snapshot.rows[pick];
            let mut entry = row.entry.clone();
            entry.update_zone = marker;
            entry.status = match entry.status {
                SiloStatus::Joining => SiloStatus::Active,
                SiloStatus::Active => SiloStatus::ShuttingDown,
                _ => SiloStatus::Active,
            };
            let op = HistoryOp::Update {
                silo: entry.address.to_string(),
                status: entry.status.code(),
                marker,
                expected_row_etag: super::history::row_identity(&row.etag),
                expected_version_etag,
                version,
            };
            (op, Call::Update(entry, row.etag.clone()))
        };
        if !options.think.is_zero() {
            tokio::time::sleep(options.think).await;
        }
        history.invoke(thread, op);
        let t0 = Instant::now();
        let (name, r) = match &call {
            Call::Insert(e) => (
                "insert_row",
                bounded(options.hung_after, table.insert_row(e, &next)).await,
            ),
            Call::Update(e, etag) => (
                "update_row",
                bounded(options.hung_after, table.update_row(e, etag, &next)).await,
            ),
        };
        lock(&shared).record(started, name, t0, &r);
        match r {
            Ok(applied) => {
                history.respond(thread, HistoryRet::Applied(applied));
                if applied {
                    let mut s = lock(&shared);
                    s.report.applied += 1;
                    s.report.applied_at.push(t0.duration_since(started));
                    drop(s);
                    if matches!(call, Call::Insert(_)) {
                        inserted += 1;
                    }
                }
            }
            // Whatever the error says, the history keeps the write in flight: the checker
            // then allows it to have applied at any later point, or never.
            Err(_) => thread = history.thread(),
        }
    }
}

enum Call {
    Insert(MembershipEntry),
    Update(MembershipEntry, crate::model::ETag),
}

fn lock(shared: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(|p| p.into_inner())
}

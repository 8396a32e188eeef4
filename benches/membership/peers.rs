//! Section "peers": our heartbeat beside Orleans' (TTL and no TTL) and Temporal's, each emulated with its own statements.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cassandra_membership::{
    CassandraMembershipTable, HeartbeatOutcome, MembershipTable, SiloAddress, Timestamp,
};
use scylla::client::session::Session;
use scylla::response::query_result::QueryResult;
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::{Consistency, SerialConsistency};
use scylla::value::{CqlTimestamp, CqlValue, Row};
use uuid::Uuid;

use crate::fixture::{KS, Res, address, fill, opts};
use crate::report::{Report, ms};
use crate::scale::{Load, Schedule, heartbeat_load};

/// The heartbeat period is compressed 30×: Orleans' default 30 s becomes the driver's 1 s.
const COMPRESSION: u32 = 30;
/// Measured window of each run.
const MEASURE: Duration = Duration::from_secs(12);
/// Idle time before each run.
const SETTLE: Duration = Duration::from_secs(3);
/// The peers' warm-up: their heartbeats have no state to spread, only a load to reach.
const PEER_WARM: Duration = Duration::from_secs(2);
/// How many times each design runs at each size.
const PASSES: usize = 2;

// Orleans' Cassandra clustering provider (dotnet/orleans, src/Cassandra/Orleans.Clustering.Cassandra,
// OrleansQueries.EnsureTableExists / EnsureIndexExists): a partition per service and cluster, the
// table version a static column; its TTL option is the table's default_time_to_live (0: off).
const ORLEANS_TABLE: &str = "CREATE TABLE IF NOT EXISTS {table} (
    partition_key ascii, version int static, address ascii, port int, generation int,
    silo_name text, host_name text, status int, proxy_port int, suspect_times ascii,
    metadata_json text, start_time timestamp, i_am_alive_time timestamp,
    PRIMARY KEY (partition_key, address, port, generation)
) WITH compression = {'class': 'LZ4Compressor', 'enabled': true} AND default_time_to_live = {ttl}";
// Orleans' index on status (EnsureIndexExists): every write of status maintains it.
const ORLEANS_INDEX: &str = "CREATE INDEX IF NOT EXISTS {index} ON {table} (status)";
// Setup only, not measured: the cells Orleans' InsertMembership writes (it is an LWT there).
const ORLEANS_INSERT: &str =
    "INSERT INTO {table} (partition_key, version, address, port, generation,
    silo_name, host_name, status, proxy_port, start_time, i_am_alive_time)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
// Orleans with TTL, UpdateIAmAlive step 1: MembershipReadRow at QUORUM.
const ORLEANS_READ_ROW: &str = "SELECT version, silo_name, host_name, status, proxy_port,
    suspect_times, metadata_json, start_time
    FROM {table} WHERE partition_key = ? AND address = ? AND port = ? AND generation = ?";
// Orleans with TTL, UpdateIAmAlive step 2: UpdateIAmAliveTimeWithTtL, every cell rewritten (the
// static version too) so each gets the table's default TTL again, conditionally on the version
// just read. As in Orleans there is no USING TTL: the table default applies to every cell.
const ORLEANS_TTL_HEARTBEAT: &str = "UPDATE {table} SET version = ?, silo_name = ?, host_name = ?,
    status = ?, proxy_port = ?, suspect_times = ?, metadata_json = ?, start_time = ?,
    i_am_alive_time = ?
    WHERE partition_key = ? AND address = ? AND port = ? AND generation = ? IF version = ?";
// Orleans without TTL: UpdateIAmAliveTime, one blind write of the time at consistency ANY.
const ORLEANS_HEARTBEAT: &str = "UPDATE {table} SET i_am_alive_time = ?
    WHERE partition_key = ? AND address = ? AND port = ? AND generation = ?";
// Temporal's cluster_membership (temporalio/temporal, schema/cassandra/temporal/schema.cql): one
// partition, a row per role and host, indexed on both timestamps.
const TEMPORAL_TABLE: &str = "CREATE TABLE IF NOT EXISTS {table} (
    membership_partition tinyint, host_id uuid, rpc_address inet, rpc_port smallint,
    role tinyint, session_start timestamp, last_heartbeat timestamp,
    PRIMARY KEY (membership_partition, role, host_id)
) WITH compaction = {'class': 'org.apache.cassandra.db.compaction.LeveledCompactionStrategy'}";
const TEMPORAL_INDEX_HEARTBEAT: &str =
    "CREATE INDEX IF NOT EXISTS {index}_hb ON {table} (last_heartbeat)";
const TEMPORAL_INDEX_SESSION: &str =
    "CREATE INDEX IF NOT EXISTS {index}_ss ON {table} (session_start)";
// Temporal's templateUpsertActiveClusterMembership (common/persistence/cassandra/
// cluster_metadata_store.go): each heartbeat re-inserts the whole row with a fresh TTL.
// Also the setup's insert.
const TEMPORAL_HEARTBEAT: &str = "INSERT INTO {table} (membership_partition, host_id,
    rpc_address, rpc_port, role, session_start, last_heartbeat) VALUES (?, ?, ?, ?, ?, ?, ?)
    USING TTL ?";

/// Orleans' partition key: "{service id}-{cluster id}".
const ORLEANS_PARTITION: &str = "bench-peers";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Design {
    Ours,
    OrleansTtl,
    Orleans,
    Temporal,
}

impl Design {
    const ALL: [Design; 4] = [
        Design::Ours,
        Design::OrleansTtl,
        Design::Orleans,
        Design::Temporal,
    ];

    fn label(self) -> &'static str {
        match self {
            Design::Ours => "ours (TTL)",
            Design::OrleansTtl => "Orleans TTL",
            Design::Orleans => "Orleans, no TTL",
            Design::Temporal => "Temporal",
        }
    }
}

/// One of the peers' designs on a table of its own in the bench keyspace, counting its LWTs.
struct Peer {
    session: Arc<Session>,
    design: Design,
    insert: PreparedStatement,
    /// Orleans TTL's read before its LWT.
    read_row: Option<PreparedStatement>,
    heartbeat: PreparedStatement,
    ttl: i32,
    lwts: AtomicU64,
}

impl Peer {
    async fn create(s: &Arc<Session>, design: Design, ttl: i32, timeout: Duration) -> Res<Peer> {
        let name = match design {
            Design::OrleansTtl => "peers_orleans_ttl",
            Design::Orleans => "peers_orleans",
            _ => "peers_temporal",
        };
        let table = format!("{}.{name}", *KS);
        // Orleans without TTL makes its table with default_time_to_live = 0.
        let table_ttl = if design == Design::Orleans { 0 } else { ttl };
        let cql = |text: &str| {
            text.replace("{table}", &table)
                .replace("{index}", name)
                .replace("{ttl}", &table_ttl.to_string())
        };
        let (ddl, insert, read_row, heartbeat): (&[&str], _, _, _) = match design {
            Design::Temporal => (
                &[
                    TEMPORAL_TABLE,
                    TEMPORAL_INDEX_HEARTBEAT,
                    TEMPORAL_INDEX_SESSION,
                ],
                TEMPORAL_HEARTBEAT,
                None,
                TEMPORAL_HEARTBEAT,
            ),
            Design::Orleans => (
                &[ORLEANS_TABLE, ORLEANS_INDEX],
                ORLEANS_INSERT,
                None,
                ORLEANS_HEARTBEAT,
            ),
            _ => (
                &[ORLEANS_TABLE, ORLEANS_INDEX],
                ORLEANS_INSERT,
                Some(ORLEANS_READ_ROW),
                ORLEANS_TTL_HEARTBEAT,
            ),
        };
        for text in ddl {
            s.query_unpaged(cql(text), ()).await?;
        }
        let prepare = |text: String, level: Consistency| async move {
            let mut p = s.prepare(text).await?;
            p.set_consistency(level);
            // Orleans' #9371 moved its TTL heartbeat to LOCAL_SERIAL; one data centre here.
            p.set_serial_consistency(Some(SerialConsistency::Serial));
            p.set_request_timeout(Some(timeout));
            Res::Ok(p)
        };
        let heartbeat_level = match design {
            // Orleans' UpdateIAmAliveTime is prepared with ConsistencyLevel.Any.
            Design::Orleans => Consistency::Any,
            _ => Consistency::Quorum,
        };
        Ok(Peer {
            session: Arc::clone(s),
            design,
            insert: prepare(cql(insert), Consistency::Quorum).await?,
            read_row: match read_row {
                Some(text) => Some(prepare(cql(text), Consistency::Quorum).await?),
                None => None,
            },
            heartbeat: prepare(cql(heartbeat), heartbeat_level).await?,
            ttl,
            lwts: AtomicU64::new(0),
        })
    }

    /// Setup: entries for silos `from..to`, written plainly (not measured).
    async fn add(&self, from: u32, to: u32) -> Res<()> {
        let now = CqlTimestamp(Timestamp::now().as_millis());
        let version = i32::try_from(to)?;
        for i in from..to {
            let a = address(i, 1);
            if self.design == Design::Temporal {
                self.temporal_upsert(&self.insert, i, now).await?;
                continue;
            }
            let (ip, port, generation) = orleans_key(&a);
            self.session
                .execute_unpaged(
                    &self.insert,
                    (
                        ORLEANS_PARTITION,
                        version,
                        &ip,
                        port,
                        generation,
                        format!("silo-{i}"),
                        format!("host-{i}"),
                        3i32, // Active
                        30000i32,
                        now,
                        now,
                    ),
                )
                .await?;
        }
        Ok(())
    }

    /// One heartbeat of silo `i`; false when it was sent but did not refresh the entry.
    async fn beat(&self, i: u32) -> Res<bool> {
        let now = CqlTimestamp(Timestamp::now().as_millis());
        let a = address(i, 1);
        match self.design {
            Design::Temporal => {
                self.temporal_upsert(&self.heartbeat, i, now).await?;
                Ok(true)
            }
            Design::Orleans => {
                let (ip, port, generation) = orleans_key(&a);
                self.session
                    .execute_unpaged(
                        &self.heartbeat,
                        (now, ORLEANS_PARTITION, &ip, port, generation),
                    )
                    .await?;
                Ok(true)
            }
            _ => {
                let Some(read_row) = &self.read_row else {
                    return Err("Orleans TTL without its read statement".into());
                };
                let (ip, port, generation) = orleans_key(&a);
                let key = (ORLEANS_PARTITION, &ip, port, generation);
                type OrleansRow = (
                    Option<i32>,
                    Option<String>,
                    Option<String>,
                    Option<i32>,
                    Option<i32>,
                    Option<String>,
                    Option<String>,
                    Option<CqlTimestamp>,
                );
                let rows = self
                    .session
                    .execute_unpaged(read_row, key)
                    .await?
                    .into_rows_result()?;
                let Some(row) = rows.maybe_first_row::<OrleansRow>()? else {
                    return Err(format!("no Orleans row for silo {a}").into());
                };
                let (version, silo_name, host_name, status, proxy_port, suspects, metadata, start) =
                    row;
                // Nulls (no suspects, no metadata) are written back as nulls, as Orleans binds them.
                self.lwts.fetch_add(1, Ordering::Relaxed);
                let r = self
                    .session
                    .execute_unpaged(
                        &self.heartbeat,
                        (
                            version,
                            silo_name,
                            host_name,
                            status,
                            proxy_port,
                            suspects,
                            metadata,
                            start,
                            now,
                            ORLEANS_PARTITION,
                            &ip,
                            port,
                            generation,
                            version,
                        ),
                    )
                    .await?;
                // Orleans ignores [applied]: a refresh that did not apply is lost silently.
                applied(r)
            }
        }
    }

    async fn temporal_upsert(&self, st: &PreparedStatement, i: u32, now: CqlTimestamp) -> Res<()> {
        let a = address(i, 1);
        self.session
            .execute_unpaged(
                st,
                (
                    0i8,
                    Uuid::from_u128(u128::from(i) + 1),
                    a.endpoint().ip(),
                    i16::try_from(a.endpoint().port())?,
                    i8::try_from(i % 4 + 1)?, // Temporal's four service roles
                    now,
                    now,
                    self.ttl,
                ),
            )
            .await?;
        Ok(())
    }
}

/// Orleans' clustering key of a silo: address text, port, generation.
fn orleans_key(a: &SiloAddress) -> (String, i32, i32) {
    (
        a.endpoint().ip().to_string(),
        i32::from(a.endpoint().port()),
        a.generation(),
    )
}

/// The `[applied]` column of an LWT's answer.
fn applied(r: QueryResult) -> Res<bool> {
    let rows = r.into_rows_result()?;
    match rows.first_row::<Row>()?.columns.first() {
        Some(Some(CqlValue::Boolean(b))) => Ok(*b),
        other => Err(format!("unexpected [applied] column: {other:?}").into()),
    }
}

/// Runs the section; returns the plot's series (p99 heartbeat latency, ms, by silos).
pub(crate) async fn run(s: &Arc<Session>, r: &mut Report) -> Res<Vec<(String, Vec<(f64, f64)>)>> {
    let mut o = opts("peers", "peers_ttl", true);
    // Renewals compressed with the period, so they keep their share of the heartbeats.
    let renewal = Duration::from_secs(o.renewal_seconds()) / COMPRESSION;
    o.ttl_renewal_interval = Some(renewal);
    let ttl = i32::try_from(o.ttl_seconds().unwrap_or(0))?;
    let timeout = o.request_timeout;
    r.section(
        "The peers, side by side",
        &format!(
            "Each design's heartbeat with its own statements, on its own table in the same keyspace, one design \
             after another in the same run. For 100 and 1,000 silos in one process every silo heartbeats about once \
             a second (Orleans' 30 s period compressed {COMPRESSION}×, ±10 % jitter) and {} s are measured, after a \
             warm-up that brings each design to its steady state: ours {} s (first beats spread over it, so lease \
             renewals are spread as in a long-running cluster), the peers {} s. TTL {ttl} s wherever there is one. \
             **Ours**: one plain write of the silo's heartbeat cell, plus a check-and-renew of the entry (a read and \
             an LWT batch) once per renewal interval ({} s here: 360 s compressed {COMPRESSION}×, so 1 in {} \
             heartbeats; with the default 7-day expiry it is 1 in 2,016). **Orleans TTL** (its Cassandra provider \
             with a TTL): reads the row at QUORUM, then rewrites every cell of it and the static version in an LWT \
             `IF version = ?` (SERIAL): a Paxos round per heartbeat, and the Paxos rounds of all silos serialize on \
             the cluster's one partition; `[applied] = false` is ignored by Orleans (counted here as a lost \
             refresh, not retried); null cells are rewritten as nulls, i.e. tombstones. **Orleans, no TTL**: one \
             blind `UPDATE … SET i_am_alive_time` at consistency ANY (the driver sends `Consistency::Any`): \
             cheapest, but nothing ever expires. **Temporal**: one full-row `INSERT … USING TTL` at QUORUM, \
             re-writing every cell (and its two secondary indexes on the timestamps) per heartbeat; no Paxos. \
             Heartbeats/s counts refreshes stored; p50/p99 is one heartbeat (Orleans TTL: read + LWT) of those \
             without error; Paxos rounds per heartbeat: ours from the provider's statement counts (conditional \
             writes and serial reads), the peers' by the LWTs they sent, both over the measured window; timeouts \
             are also errors. The node is shared with other users' jobs, which at times slow everything on it \
             for tens of seconds: every design runs {PASSES} times (the second pass in reverse order), the row \
             shows the pass with the lower p50 and the last column the other.",
            MEASURE.as_secs(),
            renewal.as_secs(),
            PEER_WARM.as_secs(),
            renewal.as_secs(),
            renewal.as_secs(),
        ),
    );
    let ours = CassandraMembershipTable::with_session(Arc::clone(s), o)?;
    ours.initialize(true).await?;
    let mut peers = Vec::new();
    for d in &Design::ALL[1..] {
        peers.push(Arc::new(Peer::create(s, *d, ttl, timeout).await?));
    }
    let mut rows = Vec::new();
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Design::ALL
        .iter()
        .map(|d| (d.label().to_owned(), Vec::new()))
        .collect();
    let mut have = 0;
    for n in [100u32, 1000] {
        fill(&ours, have, n).await?;
        for p in &peers {
            p.add(have, n).await?;
        }
        have = n;
        let mut passes: Vec<Vec<Measured>> = Design::ALL.iter().map(|_| Vec::new()).collect();
        for pass in 0..PASSES {
            let mut order: Vec<usize> = (0..Design::ALL.len()).collect();
            // Reversed every other pass, so no design always runs right after the same one.
            if pass % 2 == 1 {
                order.reverse();
            }
            for k in order {
                // A pause first, so that one design's backlog (flushes, compactions, Paxos
                // state) is not measured on the next.
                tokio::time::sleep(SETTLE).await;
                let m = match k.checked_sub(1).and_then(|p| peers.get(p)) {
                    None => measure_ours(&ours, n, renewal).await?,
                    Some(p) => measure_peer(p, n).await?,
                };
                passes[k].push(m);
            }
        }
        for (k, d) in Design::ALL.iter().enumerate() {
            let mut runs = std::mem::take(&mut passes[k]);
            runs.sort_by_key(Measured::p50);
            let Some((best, others)) = runs.split_first() else {
                continue;
            };
            rows.push(row(*d, n, best, others));
            let p99 = best
                .load
                .stats()
                .map_or(f64::NAN, |st| st.p99.as_secs_f64() * 1000.0);
            series[k].1.push((f64::from(n), p99));
        }
    }
    r.table(
        &[
            "design",
            "silos",
            "heartbeats sent",
            "heartbeats/s",
            "p50 ms",
            "p99 ms",
            "Paxos rounds / heartbeat",
            "lost refreshes",
            "errors",
            "timeouts",
            "other pass: p50 / p99 ms, errors",
        ],
        &rows,
    );
    r.line("Plot: p99 latency of one heartbeat by silos, per design (`bench-results/peers_heartbeats.svg`).");
    Ok(series)
}

/// One design's measured window, and the Paxos rounds it ran.
struct Measured {
    load: Load,
    paxos: u64,
}

impl Measured {
    /// The median heartbeat latency; a window without one sorts last.
    fn p50(&self) -> Duration {
        self.load.stats().map_or(Duration::MAX, |s| s.median)
    }
}

async fn measure_ours(ours: &CassandraMembershipTable, n: u32, renewal: Duration) -> Res<Measured> {
    // A table value that knows no lease: each silo renews on its first beat, and the first beats
    // are spread over a renewal interval, so the renewals are spread as in a long-running cluster.
    let schedule = Schedule {
        silos: n,
        spread: renewal,
        warm: renewal,
        measure: MEASURE,
    };
    let t = Arc::new(ours.for_cluster("peers")?);
    let counted = Arc::clone(&t);
    let paxos = move || {
        let c = counted.statement_counts();
        c.conditional_writes + c.serial_reads
    };
    measured_load(schedule, paxos, move |i| {
        let t = Arc::clone(&t);
        async move {
            let outcome = t
                .update_i_am_alive(&address(i, 1), Timestamp::now())
                .await?;
            Ok(matches!(outcome, HeartbeatOutcome::Refreshed { .. }))
        }
    })
    .await
}

async fn measure_peer(p: &Arc<Peer>, n: u32) -> Res<Measured> {
    let schedule = Schedule {
        silos: n,
        spread: Duration::from_secs(1),
        warm: PEER_WARM,
        measure: MEASURE,
    };
    let counted = Arc::clone(p);
    let paxos = move || counted.lwts.load(Ordering::Relaxed);
    let p = Arc::clone(p);
    measured_load(schedule, paxos, move |i| {
        let p = Arc::clone(&p);
        async move { p.beat(i).await }
    })
    .await
}

/// Runs `beat` on `schedule` and counts the Paxos rounds (`paxos()`, a running total) of its
/// measured window: the warm-up's first renewals are not the steady state.
async fn measured_load<F, Fut>(
    schedule: Schedule,
    paxos: impl Fn() -> u64 + Send + Sync + 'static,
    beat: F,
) -> Res<Measured>
where
    F: Fn(u32) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Res<bool>> + Send + 'static,
{
    let paxos = Arc::new(paxos);
    let at_window = tokio::spawn({
        let paxos = Arc::clone(&paxos);
        async move {
            tokio::time::sleep(schedule.warm).await;
            paxos()
        }
    });
    let load = heartbeat_load(schedule, beat).await?;
    let paxos = paxos().saturating_sub(at_window.await?);
    Ok(Measured { load, paxos })
}

fn row(d: Design, n: u32, m: &Measured, others: &[Measured]) -> Vec<String> {
    let (load, st) = (&m.load, m.load.stats());
    let lost = match d {
        // Blind writes have no outcome to lose.
        Design::Orleans | Design::Temporal => "n/a".into(),
        _ => load.not_applied.to_string(),
    };
    let other = others
        .iter()
        .map(|o| match o.load.stats() {
            Some(s) => format!("{} / {}, {}", ms(s.median), ms(s.p99), o.load.errors),
            None => format!("— / —, {}", o.load.errors),
        })
        .collect::<Vec<_>>()
        .join("; ");
    vec![
        d.label().into(),
        n.to_string(),
        (load.beats + load.errors).to_string(),
        format!("{:.0}", load.per_second()),
        st.map_or("—".into(), |s| ms(s.median)),
        st.map_or("—".into(), |s| ms(s.p99)),
        format!(
            "{:.2}",
            m.paxos as f64 / (load.beats + load.errors).max(1) as f64
        ),
        lost,
        load.errors.to_string(),
        load.timeouts.to_string(),
        other,
    ]
}

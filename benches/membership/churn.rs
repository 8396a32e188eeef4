//! Section "Churn: every operation after many expired generations": latency and the tombstone
//! cells each statement scans (Cassandra's tracing), with 0 to 45,000 expired generations.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cassandra_membership::{
    CassandraMembershipTable, MembershipEntry, MembershipTable, TableVersion, Timestamp,
};
use scylla::SerializeRow;
use scylla::client::session::Session;
use scylla::statement::batch::{Batch, BatchType};
use scylla::value::CqlTimestamp;
use tokio::task::JoinSet;
use uuid::Uuid;

use crate::fixture::{KS, Res, address, entry, fill, opts};
use crate::floor::{
    EntryValues, Floor, HeartbeatValues, RowKey, UpdateValues, entry_values, floor, next_version,
    qualified, row_tags,
};
use crate::report::{Report, ms, stats};
use crate::trace::{Trace, traced, traced_batch};

/// An expired generation as the provider leaves it: the entry (as `insert_entry.cql` writes it)
/// and its heartbeat cell (as `heartbeat.cql` writes it), in one plain write with a short TTL
/// instead of the provider's conditional insert, so that 45,000 of them take seconds.
const GENERATION: &str = "UPDATE {table} USING TTL :ttl
   SET entry = {etag: :new_etag, status: :status, suspect_times: :suspect_times, proxy_port: :proxy_port,
                host_name: :host_name, silo_name: :silo_name, role_name: :role_name,
                update_zone: :update_zone, fault_zone: :fault_zone, start_time: :start_time,
                i_am_alive: :i_am_alive},
       heartbeat = :heartbeat
 WHERE service_id = :service_id AND cluster_id = :cluster_id AND silo = :silo";

/// `GENERATION`'s markers.
#[derive(SerializeRow)]
struct GenerationValues {
    #[scylla(flatten)]
    entry: EntryValues,
    heartbeat: (CqlTimestamp, CqlTimestamp),
}

/// Generations per unlogged batch (one partition), and batches in flight.
const BATCH: u32 = 100;
const IN_FLIGHT: usize = 4;
/// The generations' TTL (seconds): they expire while the bench waits.
const GENERATION_TTL: i32 = 2;
/// Rounds per point; each round runs every operation once, so drift hits them alike.
const ROUNDS: usize = 40;

/// The operations measured, in the order of the report's rows, and the statements traced for each.
const OPS: [(&str, &str); 7] = [
    ("read_all", "read_rows (1 serial page)"),
    ("read_row", "read_row (serial names read)"),
    ("update_i_am_alive", "heartbeat (plain write)"),
    ("update_row", "read_ttls + update batch (LWT)"),
    ("insert_row", "read_version_ttl + insert batch (LWT)"),
    ("version TTL read", "read_version_ttl (names read)"),
    ("version read (serial)", "read_statics (serial names read)"),
];

async fn nodetool(args: &[&str]) -> Res<()> {
    let status = tokio::process::Command::new("scripts/cassandra.sh")
        .arg("nodetool")
        .arg("1")
        .args(args)
        .status()
        .await?;
    if !status.success() {
        return Err(format!("nodetool {args:?} failed").into());
    }
    Ok(())
}

/// Writes `n` generations of silo 1 to `cluster`, each expiring after [`GENERATION_TTL`].
async fn write_generations(s: &Arc<Session>, table: &str, cluster: &str, n: u32) -> Res<()> {
    let st = s
        .prepare(GENERATION.replace("{table}", &qualified(table)))
        .await?;
    let mut tasks = JoinSet::new();
    for from in (0..n).step_by(BATCH as usize) {
        if tasks.len() >= IN_FLIGHT {
            tasks.join_next().await.transpose()?.transpose()?;
        }
        let (s, st, cluster) = (Arc::clone(s), st.clone(), cluster.to_owned());
        tasks.spawn(async move {
            let mut b = Batch::new(BatchType::Unlogged);
            let mut values = Vec::new();
            for g in from..(from + BATCH).min(n) {
                b.append_statement(st.clone());
                let mut e = entry(1);
                e.address = address(1, g as i32 + 2);
                let alive = CqlTimestamp(e.i_am_alive_time.as_millis());
                values.push(GenerationValues {
                    heartbeat: (CqlTimestamp(e.start_time.as_millis()), alive),
                    entry: entry_values(&cluster, &e, Uuid::new_v4(), GENERATION_TTL),
                });
            }
            s.batch(&b, values).await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(())
}

/// One point: a table, a number of expired generations, and per operation its latencies (or its
/// first error) and what its statements scanned.
struct Point {
    table: &'static str,
    generations: u32,
    ops: Vec<OpResult>,
}

struct OpResult {
    samples: Vec<Duration>,
    error: Option<String>,
    trace: Option<Trace>,
}

impl OpResult {
    /// A sample, or the first error.
    fn record(&mut self, r: Res<Duration>) {
        match r {
            Ok(d) => self.samples.push(d),
            Err(e) if self.error.is_none() => self.error = Some(error_text(e.as_ref())),
            Err(_) => {}
        }
    }
}

fn error_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    if let Some(cause) = e.source() {
        text = format!("{text}: {cause}");
    }
    text.chars().take(120).collect()
}

async fn timed<F: std::future::Future<Output = Res<()>>>(f: F) -> Res<Duration> {
    let start = Instant::now();
    f.await?;
    Ok(start.elapsed())
}

/// The silos of a point: `live` heartbeats and is read, `updated` is rewritten by update_row.
struct Silos {
    live: MembershipEntry,
    updated: MembershipEntry,
}

async fn measure(
    s: &Arc<Session>,
    t: &CassandraMembershipTable,
    f: &Floor,
    cluster: &str,
    silos: &Silos,
) -> Vec<OpResult> {
    let mut ops: Vec<OpResult> = OPS
        .iter()
        .map(|_| OpResult {
            samples: Vec::new(),
            error: None,
            trace: None,
        })
        .collect();
    let pk = ("bench", cluster);
    let live = silos.live.address;
    let mut next = 10_000u32;
    // The operations that need only the version or one row first, in rounds of their own: a
    // read_all scanning 90,000 tombstones between them would charge its garbage (and its logged
    // warning) to whatever runs next, even to a plain write.
    for round in 0..ROUNDS {
        let mut results: Vec<Res<Duration>> = Vec::with_capacity(OPS.len());
        results.push(timed(async { Ok(t.read_row(&live).await.map(|_| ())?) }).await);
        results.push(
            timed(async {
                t.update_i_am_alive(&live, Timestamp::now()).await?;
                Ok(())
            })
            .await,
        );
        let mut e = silos.updated.clone();
        e.role_name = format!("r{round}");
        results.push(
            async {
                let snap = t.read_row(&e.address).await?;
                let etag = snap
                    .rows
                    .first()
                    .ok_or("the updated silo is gone")?
                    .etag
                    .clone();
                timed(async {
                    if t.update_row(&e, &etag, &snap.version.next()).await? {
                        Ok(())
                    } else {
                        Err("update_row lost a race it had no one to lose to".into())
                    }
                })
                .await
            }
            .await,
        );
        let fresh = entry(next);
        next += 1;
        results.push(
            async {
                let v = t.read_row(&fresh.address).await?.version;
                timed(async {
                    if t.insert_row(&fresh, &v.next()).await? {
                        Ok(())
                    } else {
                        Err("insert_row lost a race it had no one to lose to".into())
                    }
                })
                .await
            }
            .await,
        );
        results.push(
            timed(async {
                s.execute_unpaged(&f.read_version_ttl, pk).await?;
                Ok(())
            })
            .await,
        );
        results.push(
            timed(async {
                s.execute_unpaged(&f.read_statics, pk).await?;
                Ok(())
            })
            .await,
        );
        for (op, r) in ops.iter_mut().skip(1).zip(results) {
            op.record(r);
        }
    }
    for _ in 0..ROUNDS {
        let r = timed(async { Ok(t.read_all().await.map(|_| ())?) }).await;
        ops[0].record(r);
    }
    let traces = trace_all(s, t, f, cluster, silos, next).await;
    for (op, trace) in ops.iter_mut().zip(traces) {
        op.trace = trace.ok();
    }
    ops
}

/// Each operation's statements, traced once with the values the provider would bind.
async fn trace_all(
    s: &Arc<Session>,
    t: &CassandraMembershipTable,
    f: &Floor,
    cluster: &str,
    silos: &Silos,
    next: u32,
) -> Vec<Res<Trace>> {
    let pk = ("bench", cluster);
    let live_key = silos.live.address.to_string();
    let updated_key = silos.updated.address.to_string();
    fn key<'a>(cluster: &'a str, silo: &'a str) -> RowKey<'a> {
        RowKey {
            service_id: "bench",
            cluster_id: cluster,
            silo,
        }
    }
    let ttl = t.options().write_ttl_seconds() as i32;
    let now = Timestamp::now();
    let start = CqlTimestamp(silos.live.start_time.as_millis());
    let mut out = vec![
        traced(s, &f.read_rows, pk).await,
        traced(s, &f.read_row, key(cluster, &live_key)).await,
        traced(
            s,
            &f.heartbeat,
            HeartbeatValues {
                ttl,
                write_time_micros: now.as_millis() * 1000,
                heartbeat: (start, CqlTimestamp(now.as_millis())),
                service_id: "bench",
                cluster_id: cluster,
                silo: &live_key,
            },
        )
        .await,
    ];
    let update = async {
        let snap = t.read_row(&silos.updated.address).await?;
        let etag = snap
            .rows
            .first()
            .ok_or("the updated silo is gone")?
            .etag
            .clone();
        let (row, heartbeat) = row_tags(&etag);
        let values = UpdateValues {
            entry: entry_values(cluster, &silos.updated, Uuid::new_v4(), ttl),
            expected_etag: Some(row),
            expected_heartbeat: heartbeat,
        };
        let read = traced(s, &f.read_ttls, key(cluster, &updated_key)).await?;
        let write = traced_batch(
            s,
            &f.update,
            (values, next_version(cluster, &snap.version, ttl)),
        )
        .await?;
        Ok(read + write)
    };
    out.push(update.await);
    let insert = async {
        let fresh = entry(next);
        let v: TableVersion = t.read_row(&fresh.address).await?.version;
        let read = traced(s, &f.read_version_ttl, pk).await?;
        let values = entry_values(cluster, &fresh, Uuid::new_v4(), ttl);
        let write = traced_batch(s, &f.insert, (values, next_version(cluster, &v, ttl))).await?;
        Ok(read + write)
    };
    out.push(insert.await);
    out.push(traced(s, &f.read_version_ttl, pk).await);
    out.push(traced(s, &f.read_statics, pk).await);
    out
}

pub(crate) async fn run(s: &Arc<Session>, r: &mut Report) -> Res<Vec<(String, f64, f64)>> {
    r.section(
        "Churn: every operation after many expired generations",
        &format!(
            "Two live silos plus N expired generations in one cluster (TTL on): each generation an entry and its \
             heartbeat cell written plainly with a {GENERATION_TTL} s TTL (unlogged batches of {BATCH}, \
             {IN_FLIGHT} in flight), left to expire, then `nodetool flush` + `compact`. Then {ROUNDS} rounds, \
             each running every operation but read_all once (update_row and insert_row read first, untimed), \
             then {ROUNDS} read_all; p50 / p99 ms. \
             Tombstone cells: what Cassandra's tracing reports for the statements each operation sends (traced \
             once, the raw statements of `cql/` with the provider's values; a conditional write's condition read \
             included); \"warned\" = the node sent a tombstone warning (tombstone_warn_threshold 1,000). Tables: \
             the shipped gc_grace (3 h: the tombstones stay), and gc_grace 0 (purged: what any table looks like \
             once gc_grace has passed and compaction ran).",
        ),
    );
    let mut points = Vec::new();
    for (label, gc, counts) in [
        ("shipped (3 h)", 10800u64, &[0u32, 1000, 10_000, 45_000][..]),
        ("purged (gc_grace 0)", 0, &[10_000, 45_000][..]),
    ] {
        let table = format!("churn_gc{gc}");
        for &n in counts {
            let cluster = format!("churn-{n}");
            let mut o = opts(&cluster, &table, true);
            o.gc_grace = Duration::from_secs(gc);
            let t = CassandraMembershipTable::with_session(Arc::clone(s), o)?;
            t.initialize(true).await?;
            fill(&t, 0, 2).await?;
            let silos = Silos {
                live: entry(0),
                updated: entry(1),
            };
            let written = Instant::now();
            write_generations(s, &table, &cluster, n).await?;
            println!(
                "churn: {n} generations written to {table} in {:.1} s",
                written.elapsed().as_secs_f64()
            );
            tokio::time::sleep(Duration::from_secs(GENERATION_TTL as u64 + 2)).await;
            nodetool(&["flush", KS.as_str(), &table]).await?;
            nodetool(&["compact", KS.as_str(), &table]).await?;
            let f = floor(s, &table).await?;
            // The first heartbeat checks the entry (and scans the partition's TTLs): not measured.
            t.update_i_am_alive(&silos.live.address, Timestamp::now())
                .await?;
            let ops = measure(s, &t, &f, &cluster, &silos).await;
            points.push(Point {
                table: label,
                generations: n,
                ops,
            });
        }
    }
    report(r, &points);
    Ok(points
        .iter()
        .map(|p| {
            let y = match p.ops[0].error {
                None if !p.ops[0].samples.is_empty() => {
                    stats(p.ops[0].samples.clone()).median.as_secs_f64() * 1000.0
                }
                _ => f64::NAN,
            };
            (p.table.to_owned(), f64::from(p.generations), y)
        })
        .collect())
}

fn report(r: &mut Report, points: &[Point]) {
    let mut rows = Vec::new();
    for (i, (op, statements)) in OPS.iter().enumerate() {
        for p in points {
            let o = &p.ops[i];
            let (p50, p99) = if o.samples.is_empty() {
                ("**fails**".to_owned(), "**fails**".to_owned())
            } else {
                let st = stats(o.samples.clone());
                (ms(st.median), ms(st.p99))
            };
            let (tombstones, warned) = match o.trace {
                Some(tr) => (
                    tr.tombstones.to_string(),
                    if tr.warned { "yes" } else { "no" }.to_owned(),
                ),
                None => ("?".into(), "?".into()),
            };
            rows.push(vec![
                (*op).to_owned(),
                p.table.to_owned(),
                p.generations.to_string(),
                p50,
                p99,
                (*statements).to_owned(),
                tombstones,
                warned,
                o.error.clone().unwrap_or_default(),
            ]);
        }
    }
    r.table(
        &[
            "operation",
            "table",
            "expired generations",
            "p50 ms",
            "p99 ms",
            "statements traced",
            "tombstone cells scanned",
            "warned",
            "first error",
        ],
        &rows,
    );
}

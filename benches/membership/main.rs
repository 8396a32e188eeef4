//! Benchmarks against a real Cassandra node: each operation against the raw-driver floor (same
//! CQL, same consistency, same conditions, interleaved in the same run), heartbeat cost, scale,
//! and churn (tombstones). Writes `bench-results/results.md` and SVG plots.
//!
//!     scripts/cassandra.sh start && cargo bench --bench membership            # everything (~6 min)
//!     cargo bench --bench membership -- ops heartbeat                         # some sections
//!
//! The node is `CASSANDRA_CONTACT_POINTS` (default 127.0.0.1:9042); the keyspace `cm_bench` is
//! dropped and re-created at the start.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, ETag, MembershipEntry, MembershipOptions,
    MembershipTable, SiloAddress, SiloStatus, TableVersion, Timestamp,
};
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::{Consistency, SerialConsistency};
use scylla::value::CqlTimestamp;
use uuid::Uuid;

const KS: &str = "cm_bench";

type Res<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

struct Report {
    md: String,
}

impl Report {
    fn section(&mut self, title: &str, intro: &str) {
        println!("\n## {title}\n{intro}");
        let _ = write!(self.md, "\n## {title}\n\n{intro}\n\n");
    }
    fn table(&mut self, header: &[&str], rows: &[Vec<String>]) {
        let mut t = format!(
            "| {} |\n|{}|\n",
            header.join(" | "),
            header.iter().map(|_| "---").collect::<Vec<_>>().join("|")
        );
        for r in rows {
            let _ = writeln!(t, "| {} |", r.join(" | "));
        }
        println!("{t}");
        self.md.push_str(&t);
        self.md.push('\n');
    }
    fn line(&mut self, s: &str) {
        println!("{s}");
        let _ = writeln!(self.md, "{s}\n");
    }
}

#[derive(Clone, Copy)]
struct Stats {
    median: Duration,
    p99: Duration,
}

fn stats(mut v: Vec<Duration>) -> Stats {
    v.sort();
    let at = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];
    Stats {
        median: at(0.5),
        p99: at(0.99),
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

fn address(n: u32, generation: i32) -> SiloAddress {
    SiloAddress::new(
        std::net::SocketAddr::new(
            std::net::IpAddr::V4(std::net::Ipv4Addr::new(
                10,
                (n >> 16) as u8,
                (n >> 8) as u8,
                n as u8,
            )),
            11111,
        ),
        generation,
    )
}

fn entry(n: u32) -> MembershipEntry {
    let mut e = MembershipEntry::new(address(n, 1), SiloStatus::Active, Timestamp::now());
    e.host_name = format!("host-{n}");
    e.silo_name = format!("silo-{n}");
    e.proxy_port = 30000;
    e
}

async fn session() -> Res<Arc<Session>> {
    let points =
        std::env::var("CASSANDRA_CONTACT_POINTS").unwrap_or_else(|_| "127.0.0.1:9042".into());
    let s = SessionBuilder::new()
        .known_nodes(points.split(','))
        .build()
        .await?;
    Ok(Arc::new(s))
}

fn opts(cluster: &str, table: &str, ttl: bool) -> CassandraClusteringOptions {
    let mut m = MembershipOptions::default();
    m.defunct_silo_expiration = Duration::from_secs(3600);
    CassandraClusteringOptions::new(KS, "bench", cluster)
        .table(table)
        .ttl(ttl)
        .membership(m)
}

async fn provider(
    s: &Arc<Session>,
    cluster: &str,
    table: &str,
    ttl: bool,
) -> Res<CassandraMembershipTable> {
    let t = CassandraMembershipTable::with_session(Arc::clone(s), opts(cluster, table, ttl))?;
    t.initialize(true).await?;
    Ok(t)
}

async fn fill(t: &CassandraMembershipTable, from: u32, to: u32) -> Res<()> {
    for n in from..to {
        let v = t.read_all().await?.version;
        if !t.insert_row(&entry(n), &v.next()).await? {
            return Err("insert failed".into());
        }
    }
    Ok(())
}

/// The provider's own CQL, prepared directly: the floor.
struct Floor {
    read_statics: PreparedStatement,
    read_rows: PreparedStatement,
    read_row: PreparedStatement,
    heartbeat: PreparedStatement,
    insert: Batch,
    update: Batch,
    local: PreparedStatement,
}

async fn floor(s: &Session, table: &str) -> Res<Floor> {
    let q = format!("\"{KS}\".\"{table}\"");
    let prep = |cql: &str, c: Consistency| {
        let text = cql.replace("{table}", &q);
        async move {
            let mut p = s.prepare(text).await?;
            p.set_consistency(c);
            p.set_serial_consistency(Some(SerialConsistency::Serial));
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(p)
        }
    };
    let batch = |stmts: Vec<PreparedStatement>| {
        let mut b = Batch::new(BatchType::Logged);
        for st in stmts {
            b.append_statement(st);
        }
        b.set_consistency(Consistency::Quorum);
        b.set_serial_consistency(Some(SerialConsistency::Serial));
        b
    };
    let update_entry = prep(
        include_str!("../../cql/update_entry.cql"),
        Consistency::Quorum,
    )
    .await?;
    let write_version = prep(
        include_str!("../../cql/write_version.cql"),
        Consistency::Quorum,
    )
    .await?;
    Ok(Floor {
        read_statics: prep(
            include_str!("../../cql/read_statics.cql"),
            Consistency::Serial,
        )
        .await?,
        read_rows: prep(include_str!("../../cql/read_rows.cql"), Consistency::Serial).await?,
        read_row: prep(include_str!("../../cql/read_row.cql"), Consistency::Serial).await?,
        heartbeat: prep(include_str!("../../cql/heartbeat.cql"), Consistency::Quorum).await?,
        insert: batch(vec![update_entry.clone(), write_version.clone()]),
        update: batch(vec![update_entry, write_version]),
        local: s
            .prepare("SELECT release_version FROM system.local")
            .await?,
    })
}

type EntryTuple = (
    String,
    String,
    String,
    Uuid,
    i32,
    Vec<(String, CqlTimestamp)>,
    i32,
    String,
    String,
    String,
    i32,
    i32,
    CqlTimestamp,
    CqlTimestamp,
    i32,
);

fn entry_values(cluster: &str, e: &MembershipEntry, etag: Uuid, ttl: i32) -> EntryTuple {
    (
        "bench".into(),
        cluster.into(),
        e.address.to_string(),
        etag,
        e.status.code(),
        vec![],
        i32::from(e.proxy_port),
        e.host_name.clone(),
        e.silo_name.clone(),
        e.role_name.clone(),
        e.update_zone,
        e.fault_zone,
        CqlTimestamp(e.start_time.as_millis()),
        CqlTimestamp(e.i_am_alive_time.as_millis()),
        ttl,
    )
}

type UpdateTuple = (
    i32,
    Uuid,
    i32,
    Vec<(String, CqlTimestamp)>,
    i32,
    String,
    String,
    String,
    i32,
    i32,
    CqlTimestamp,
    CqlTimestamp,
    String,
    String,
    String,
    Option<Uuid>,
);

/// `update_entry.cql`'s markers in order (insert_row passes no expected etag).
fn update_values(v: EntryTuple, expected: Option<Uuid>) -> UpdateTuple {
    (
        v.14, v.3, v.4, v.5, v.6, v.7, v.8, v.9, v.10, v.11, v.12, v.13, v.0, v.1, v.2, expected,
    )
}

fn uuid_of(e: &ETag) -> Uuid {
    Uuid::parse_str(e.as_str()).unwrap_or_default()
}

/// Times `a` and `b` alternately `n` times (so drift hits both alike).
async fn ab<FA, FB, A, B>(n: usize, mut a: FA, mut b: FB) -> Res<(Stats, Stats)>
where
    FA: FnMut(usize) -> A,
    FB: FnMut(usize) -> B,
    A: std::future::Future<Output = Res<Duration>>,
    B: std::future::Future<Output = Res<Duration>>,
{
    let (mut va, mut vb) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n + 20 {
        let (x, y) = if i % 2 == 0 {
            (a(i).await?, b(i).await?)
        } else {
            let y = b(i).await?;
            (a(i).await?, y)
        };
        if i >= 20 {
            va.push(x);
            vb.push(y);
        }
    }
    Ok((stats(va), stats(vb)))
}

async fn timed<F: std::future::Future<Output = Res<()>>>(f: F) -> Res<Duration> {
    let t = Instant::now();
    f.await?;
    Ok(t.elapsed())
}

/// Ten seconds of mixed traffic first, so the node's JIT has compiled the paths measured.
async fn warm_up(s: &Arc<Session>) -> Res<()> {
    let t = provider(s, "warm-up", "membership", false).await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut n = 0;
    while Instant::now() < deadline {
        let v = t.read_all().await?.version;
        t.insert_row(&entry(50_000 + n), &v.next()).await?;
        t.update_i_am_alive(&entry(50_000 + n).address, Timestamp::now())
            .await?;
        t.read_row(&entry(50_000 + n).address).await?;
        n += 1;
    }
    t.delete_cluster("warm-up").await?;
    Ok(())
}

async fn ops(s: &Arc<Session>, r: &mut Report) -> Res<()> {
    r.section(
        "Per operation: provider vs raw-driver floor",
        "Median and p99 latency (ms) of each operation, and of the same statements executed directly through the \
         scylla driver (same CQL from `cql/`, same consistency, same conditions), alternated in one run (200 samples \
         each after 20 warm-up). Cluster of 10 entries. Ratio = provider median ÷ floor median.",
    );
    let mut rows = Vec::new();
    for ttl in [false, true] {
        let table = if ttl { "membership_ttl" } else { "membership" };
        let cluster = format!("ops-{ttl}");
        let t = provider(s, &cluster, table, ttl).await?;
        fill(&t, 0, 10).await?;
        let f = floor(s, table).await?;
        let wttl = t.options().write_ttl_seconds() as i32;
        let tag = if ttl { "on" } else { "off" };
        let mut push = |op: &str, (p, fl): (Stats, Stats)| {
            rows.push(vec![
                op.to_owned(),
                tag.to_owned(),
                ms(p.median),
                ms(p.p99),
                ms(fl.median),
                ms(fl.p99),
                format!("{:.2}", p.median.as_secs_f64() / fl.median.as_secs_f64()),
            ]);
        };
        let pk = ("bench", cluster.as_str());
        push(
            "read_all",
            ab(
                200,
                |_| timed(async { t.read_all().await.map(|_| ()).map_err(Into::into) }),
                |_| {
                    timed(async {
                        s.execute_unpaged(&f.read_statics, pk).await?;
                        s.execute_unpaged(&f.read_rows, pk).await?;
                        Ok(())
                    })
                },
            )
            .await?,
        );
        let a = entry(3).address;
        let key = a.to_string();
        push(
            "read_row",
            ab(
                200,
                |_| timed(async { t.read_row(&a).await.map(|_| ()).map_err(Into::into) }),
                |_| {
                    timed(async {
                        s.execute_unpaged(&f.read_row, (&key, "bench", cluster.as_str(), &key))
                            .await?;
                        Ok(())
                    })
                },
            )
            .await?,
        );
        t.update_i_am_alive(&a, Timestamp::now()).await?; // the lease is known from here on
        let start = CqlTimestamp(t.read_row(&a).await?.rows[0].entry.start_time.as_millis());
        push(
            "update_i_am_alive",
            ab(
                200,
                |_| {
                    timed(async {
                        t.update_i_am_alive(&a, Timestamp::now())
                            .await
                            .map(|_| ())
                            .map_err(Into::into)
                    })
                },
                |_| {
                    timed(async {
                        let now = Timestamp::now();
                        s.execute_unpaged(
                            &f.heartbeat,
                            (
                                wttl,
                                now.as_millis() * 1000,
                                &key,
                                (start, CqlTimestamp(now.as_millis())),
                                "bench",
                                cluster.as_str(),
                            ),
                        )
                        .await?;
                        Ok(())
                    })
                },
            )
            .await?,
        );
        // update_row: both sides read the current tags first (not timed), then write.
        let mut e = entry(4);
        push(
            "update_row",
            ab(
                200,
                |i| {
                    let t = &t;
                    e.role_name = format!("p{i}");
                    let e = e.clone();
                    async move {
                        let snap = t.read_row(&e.address).await?;
                        let etag = snap.rows[0].etag.clone();
                        timed(async {
                            if t.update_row(&e, &etag, &snap.version.next()).await? {
                                Ok(())
                            } else {
                                Err("conflict".into())
                            }
                        })
                        .await
                    }
                },
                |i| {
                    let (t, f, s, cluster) = (&t, &f, s, cluster.clone());
                    let mut e = entry(4);
                    e.role_name = format!("f{i}");
                    async move {
                        let snap = t.read_row(&e.address).await?;
                        let (row, ver) = (uuid_of(&snap.rows[0].etag), uuid_of(&snap.version.etag));
                        timed(async {
                            let mut vals = entry_values(&cluster, &e, Uuid::new_v4(), wttl);
                            vals.3 = Uuid::new_v4();
                            let upd = update_values(vals, Some(row));
                            let ver_vals = (
                                wttl,
                                snap.version.version as i64 + 1,
                                Uuid::new_v4(),
                                "bench",
                                cluster.as_str(),
                                ver,
                            );
                            s.batch(&f.update, (upd, ver_vals)).await?;
                            Ok(())
                        })
                        .await
                    }
                },
            )
            .await?,
        );
        // insert_row: a new silo each time; both sides read the version first (not timed).
        let next = AtomicU64::new(1000);
        push(
            "insert_row",
            ab(
                200,
                |_| {
                    let e = entry(next.fetch_add(1, Ordering::Relaxed) as u32);
                    let t = &t;
                    async move {
                        let v = t.read_all().await?.version;
                        timed(async {
                            if t.insert_row(&e, &v.next()).await? {
                                Ok(())
                            } else {
                                Err("conflict".into())
                            }
                        })
                        .await
                    }
                },
                |_| {
                    let e = entry(next.fetch_add(1, Ordering::Relaxed) as u32);
                    let (t, f, s, cluster) = (&t, &f, s, cluster.clone());
                    async move {
                        let v = t.read_all().await?.version;
                        timed(async {
                            let vals = update_values(
                                entry_values(&cluster, &e, Uuid::new_v4(), wttl),
                                None,
                            );
                            let ver_vals = (
                                wttl,
                                v.version as i64 + 1,
                                Uuid::new_v4(),
                                "bench",
                                cluster.as_str(),
                                Some(uuid_of(&v.etag)),
                            );
                            s.batch(&f.insert, (vals, ver_vals)).await?;
                            Ok(())
                        })
                        .await
                    }
                },
            )
            .await?,
        );
        let t2 = provider(s, &format!("cleanup-{ttl}"), table, ttl).await?;
        fill(&t2, 0, 10).await?;
        let pk2 = ("bench", t2.cluster_id().to_owned());
        push(
            "cleanup_defunct (none due)",
            ab(
                200,
                |_| {
                    timed(async {
                        t2.cleanup_defunct(Timestamp::EPOCH)
                            .await
                            .map(|_| ())
                            .map_err(Into::into)
                    })
                },
                |_| {
                    timed(async {
                        s.execute_unpaged(&f.read_statics, (pk2.0, pk2.1.as_str()))
                            .await?;
                        s.execute_unpaged(&f.read_rows, (pk2.0, pk2.1.as_str()))
                            .await?;
                        Ok(())
                    })
                },
            )
            .await?,
        );
        let (rt, _) = ab(
            200,
            |_| {
                timed(async {
                    s.execute_unpaged(&f.local, ())
                        .await
                        .map(|_| ())
                        .map_err(Into::into)
                })
            },
            |_| async { Ok(Duration::ZERO) },
        )
        .await?;
        rows.push(vec![
            "(trivial round trip: system.local)".into(),
            tag.into(),
            "".into(),
            "".into(),
            ms(rt.median),
            ms(rt.p99),
            "".into(),
        ]);
        let _ = TableVersion::absent();
    }
    r.table(
        &[
            "operation",
            "TTL",
            "provider p50",
            "provider p99",
            "floor p50",
            "floor p99",
            "ratio",
        ],
        &rows,
    );

    r.section("Throughput at concurrency", "Operations per second over 3 s with N concurrent callers (TTL off, 10 entries; heartbeats of N different silos).");
    let t = Arc::new(provider(s, "throughput", "membership", false).await?);
    fill(&t, 0, 16).await?;
    let mut rows = Vec::new();
    for n in [1usize, 4, 16] {
        for op in ["update_i_am_alive", "read_all"] {
            let count = Arc::new(AtomicU64::new(0));
            let deadline = Instant::now() + Duration::from_secs(3);
            let tasks: Vec<_> = (0..n)
                .map(|i| {
                    let (t, count) = (Arc::clone(&t), Arc::clone(&count));
                    tokio::spawn(async move {
                        let a = entry(i as u32).address;
                        while Instant::now() < deadline {
                            let ok = if op == "read_all" {
                                t.read_all().await.is_ok()
                            } else {
                                t.update_i_am_alive(&a, Timestamp::now()).await.is_ok()
                            };
                            if ok {
                                count.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await?;
            }
            rows.push(vec![
                op.into(),
                n.to_string(),
                format!("{:.0}", count.load(Ordering::Relaxed) as f64 / 3.0),
            ]);
        }
    }
    r.table(&["operation", "concurrency", "ops/s"], &rows);
    Ok(())
}

async fn heartbeat_cost(s: &Arc<Session>, r: &mut Report) -> Res<()> {
    r.section(
        "Heartbeat cost with TTL on",
        "20 silos heartbeat every 10 ms for 30 s (time compressed 3,000×: a 30 s period becomes 10 ms); the renewal \
         interval is 20 s, in the same ratio to the period as the default (TTL 7 d / 10 = 16.8 h vs 30 s ≈ 2,016). \
         Statements counted by the provider.",
    );
    let mut m = MembershipOptions::default();
    m.defunct_silo_expiration = Duration::from_secs(600);
    m.i_am_alive_table_publish_timeout = Duration::from_millis(10);
    let mut o = CassandraClusteringOptions::new(KS, "bench", "hb-cost")
        .table("membership_ttl")
        .ttl(true)
        .membership(m);
    o.ttl_renewal_interval = Some(Duration::from_secs(20));
    o.ttl_mismatch = cassandra_membership::TtlMismatchPolicy::Allow;
    let t = Arc::new(CassandraMembershipTable::with_session(Arc::clone(s), o)?);
    t.initialize(true).await?;
    fill(&t, 0, 20).await?;
    let fresh = Arc::new(t.for_cluster("hb-cost")?); // a table value that has not seen the entries
    let before = fresh.statement_counts();
    let beats = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(30);
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let (t, beats, errors) = (Arc::clone(&fresh), Arc::clone(&beats), Arc::clone(&errors));
            tokio::spawn(async move {
                let a = entry(i).address;
                let mut tick = tokio::time::interval(Duration::from_millis(10));
                while Instant::now() < deadline {
                    tick.tick().await;
                    match t.update_i_am_alive(&a, Timestamp::now()).await {
                        Ok(_) => beats.fetch_add(1, Ordering::Relaxed),
                        Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    for task in tasks {
        task.await?;
    }
    let c = fresh.statement_counts();
    let n = beats.load(Ordering::Relaxed) as f64;
    let (plain, reads, paxos) = (
        c.plain_writes - before.plain_writes,
        c.reads + c.serial_reads - before.reads - before.serial_reads,
        c.conditional_writes - before.conditional_writes,
    );
    r.table(
        &[
            "heartbeats",
            "errors",
            "plain writes",
            "reads",
            "Paxos rounds",
            "round trips / heartbeat",
            "Paxos rounds / heartbeat",
        ],
        &[vec![
            format!("{n:.0}"),
            errors.load(Ordering::Relaxed).to_string(),
            plain.to_string(),
            reads.to_string(),
            paxos.to_string(),
            format!("{:.4}", (plain + reads + paxos) as f64 / n),
            format!("{:.5}", paxos as f64 / n),
        ]],
    );
    r.line("Each silo checks its entry on its first heartbeat (1 read + 1 Paxos round) and renews once per interval; everything else is one plain write.");
    Ok(())
}

async fn scale(s: &Arc<Session>, r: &mut Report) -> Res<Vec<(f64, f64)>> {
    r.section("Scale: read_all vs live silos", "read_all latency (ms) with N live entries in the cluster (50 samples each; page size 1000).");
    let t = provider(s, "scale", "membership", false).await?;
    let mut rows = Vec::new();
    let mut points = Vec::new();
    let mut have = 0;
    for n in [10u32, 100, 1000] {
        fill(&t, have, n).await?;
        have = n;
        let mut v = Vec::new();
        for _ in 0..50 {
            let start = Instant::now();
            let snap = t.read_all().await?;
            v.push(start.elapsed());
            assert_eq!(snap.rows.len(), n as usize);
        }
        let st = stats(v);
        points.push((f64::from(n), st.median.as_secs_f64() * 1000.0));
        rows.push(vec![n.to_string(), ms(st.median), ms(st.p99)]);
    }
    r.table(&["live silos", "p50", "p99"], &rows);

    r.section(
        "1,000 silos heartbeating from one process",
        "Every silo heartbeats once per second (period compressed from 30 s) for 15 s, with jitter; TTL on.",
    );
    let mut m = MembershipOptions::default();
    m.defunct_silo_expiration = Duration::from_secs(600);
    m.i_am_alive_table_publish_timeout = Duration::from_secs(1);
    let mut o = CassandraClusteringOptions::new(KS, "bench", "thousand")
        .table("membership_ttl")
        .ttl(true)
        .membership(m);
    o.ttl_mismatch = cassandra_membership::TtlMismatchPolicy::Allow;
    let t = Arc::new(CassandraMembershipTable::with_session(Arc::clone(s), o)?);
    t.initialize(true).await?;
    fill(&t, 0, 1000).await?;
    let beats = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let lat = Arc::new(std::sync::Mutex::new(Vec::new()));
    let deadline = Instant::now() + Duration::from_secs(15);
    let tasks: Vec<_> = (0..1000)
        .map(|i| {
            let (t, beats, errors, lat) = (
                Arc::clone(&t),
                Arc::clone(&beats),
                Arc::clone(&errors),
                Arc::clone(&lat),
            );
            tokio::spawn(async move {
                let a = entry(i).address;
                tokio::time::sleep(Duration::from_millis(u64::from(i))).await;
                while Instant::now() < deadline {
                    let start = Instant::now();
                    match t.update_i_am_alive(&a, Timestamp::now()).await {
                        Ok(_) => {
                            beats.fetch_add(1, Ordering::Relaxed);
                            lat.lock().unwrap().push(start.elapsed());
                        }
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(900 + rand_ms(200))).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await?;
    }
    let st = stats(std::mem::take(&mut *lat.lock().unwrap()));
    r.table(
        &["heartbeats", "errors", "heartbeats/s", "p50 ms", "p99 ms"],
        &[vec![
            beats.load(Ordering::Relaxed).to_string(),
            errors.load(Ordering::Relaxed).to_string(),
            format!("{:.0}", beats.load(Ordering::Relaxed) as f64 / 15.0),
            ms(st.median),
            ms(st.p99),
        ]],
    );

    r.section(
        "Join storm",
        "100 silos join at once: each reads the version and inserts, retrying on conflict.",
    );
    let t = Arc::new(provider(s, "storm", "membership", false).await?);
    let conflicts = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..100)
        .map(|i| {
            let (t, conflicts) = (Arc::clone(&t), Arc::clone(&conflicts));
            tokio::spawn(async move {
                loop {
                    let v = t.read_all().await.unwrap().version;
                    if t.insert_row(&entry(i), &v.next()).await.unwrap() {
                        return start.elapsed();
                    }
                    conflicts.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(rand_ms(20))).await;
                }
            })
        })
        .collect();
    let mut last = Duration::ZERO;
    for task in tasks {
        last = last.max(task.await?);
    }
    let snap = t.read_all().await?;
    r.table(
        &[
            "silos",
            "all joined after",
            "LWT conflicts",
            "final version",
        ],
        &[vec![
            snap.rows.len().to_string(),
            format!("{:.2} s", last.as_secs_f64()),
            conflicts.load(Ordering::Relaxed).to_string(),
            snap.version.version.to_string(),
        ]],
    );
    Ok(points)
}

fn rand_ms(max: u64) -> u64 {
    u64::from(Uuid::new_v4().as_bytes()[0]) * max / 256
}

/// Tombstones a traced query scanned, from Cassandra's trace events.
async fn tombstones(s: &Session, cql: &str, cluster: &str) -> Res<(u64, Duration)> {
    let mut st = s.prepare(cql.to_owned()).await?;
    st.set_tracing(true);
    st.set_consistency(Consistency::Serial);
    let start = Instant::now();
    let res = s.execute_unpaged(&st, ("bench", cluster)).await?;
    let took = start.elapsed();
    let mut n = 0;
    if let Some(id) = res.tracing_id() {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let info = s.get_tracing_info(&id).await?;
        for ev in info.events {
            if let Some(a) = ev.activity {
                // "Read 1 live rows and 12000 tombstone cells"
                if let Some(i) = a.find(" tombstone cells") {
                    let head = &a[..i];
                    n += head
                        .rsplit(' ')
                        .next()
                        .and_then(|x| x.parse::<u64>().ok())
                        .unwrap_or(0);
                }
            }
        }
    }
    Ok((n, took))
}

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

async fn churn(s: &Arc<Session>, r: &mut Report) -> Res<Vec<(String, f64, f64)>> {
    r.section(
        "Churn: read_all after many expired generations",
        "One live silo plus N expired generations (rows written with the provider's CQL and a 1 s TTL, then left to \
         expire) in one cluster. After `nodetool flush` + `compact`: read_all latency (median of 30) and tombstone \
         cells the rows query scanned (from Cassandra's tracing). Tables: the shipped gc_grace (3 h), Cassandra's \
         default (10 days), and gc_grace 0 (what any table looks like once gc_grace has passed: purged).",
    );
    let mut rows = Vec::new();
    let mut points = Vec::new();
    for (label, gc) in [
        ("shipped (3 h)", 10800u64),
        ("Cassandra default (10 d)", 864000),
        ("purged (gc_grace 0)", 0),
    ] {
        let table = format!("churn_gc{gc}");
        for n in [0u32, 1000, 10000] {
            let cluster = format!("churn-{n}");
            let mut o = opts(&cluster, &table, false);
            o.gc_grace = Duration::from_secs(gc);
            let t = CassandraMembershipTable::with_session(Arc::clone(s), o)?;
            t.initialize(true).await?;
            fill(&t, 0, 1).await?;
            // Expired generations: the provider's insert statement, plain and batched, TTL 1 s.
            let q = format!("\"{KS}\".\"{table}\"");
            let ins = s
                .prepare(include_str!("../../cql/rewrite_entry.cql").replace("{table}", &q))
                .await?;
            let mut written = 0;
            while written < n {
                let mut b = Batch::new(BatchType::Unlogged);
                let mut vals = Vec::new();
                for g in written..(written + 200).min(n) {
                    b.append_statement(ins.clone());
                    let mut e = entry(1);
                    e.address = address(1, g as i32 + 2);
                    let v = entry_values(&cluster, &e, Uuid::new_v4(), 1);
                    vals.push((
                        v.0, v.1, v.2, v.3, v.4, v.5, v.6, v.7, v.8, v.9, v.10, v.11, v.12, v.13,
                        v.14,
                    ));
                }
                s.batch(&b, vals).await?;
                written = (written + 200).min(n);
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
            nodetool(&["flush", KS, &table]).await?;
            nodetool(&["compact", KS, &table]).await?;
            let mut v = Vec::new();
            let mut failed = None;
            for _ in 0..30 {
                let start = Instant::now();
                match t.read_all().await {
                    Ok(snap) => {
                        v.push(start.elapsed());
                        assert_eq!(snap.rows.len(), 1);
                    }
                    Err(e) => {
                        let cause = std::error::Error::source(&e)
                            .map(|c| c.to_string())
                            .unwrap_or_default();
                        failed = Some(cause.chars().take(90).collect::<String>());
                        break;
                    }
                }
            }
            let (tomb, _) = tombstones(
                s,
                &include_str!("../../cql/read_rows.cql").replace("{table}", &q),
                &cluster,
            )
            .await
            .unwrap_or((0, Duration::ZERO));
            match failed {
                None => {
                    let st = stats(v);
                    points.push((
                        label.to_owned(),
                        f64::from(n),
                        st.median.as_secs_f64() * 1000.0,
                    ));
                    rows.push(vec![
                        label.into(),
                        n.to_string(),
                        ms(st.median),
                        ms(st.p99),
                        tomb.to_string(),
                    ]);
                }
                Some(e) => {
                    points.push((label.to_owned(), f64::from(n), f64::NAN));
                    rows.push(vec![
                        label.into(),
                        n.to_string(),
                        "**fails**".into(),
                        "**fails**".into(),
                        format!("over 100,000 (tombstone_failure_threshold): {e}"),
                    ]);
                }
            }
        }
    }
    r.table(
        &[
            "table",
            "expired generations",
            "read_all p50 ms",
            "p99 ms",
            "tombstone cells scanned",
        ],
        &rows,
    );
    Ok(points)
}

fn svg(title: &str, xlabel: &str, series: &[(String, Vec<(f64, f64)>)], log_x: bool) -> String {
    let (w, h, m) = (640.0, 360.0, 60.0);
    // NaN marks a failed measurement: drawn as a cross at the top of the plot.
    let all: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.1.iter().copied())
        .filter(|p| p.1.is_finite())
        .collect();
    let ticks: std::collections::BTreeSet<u64> = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.0 as u64))
        .collect();
    let fx = |x: f64| if log_x { (x.max(1.0)).log10() } else { x };
    let (x0, x1) = all.iter().fold((f64::MAX, f64::MIN), |(a, b), p| {
        (a.min(fx(p.0)), b.max(fx(p.0)))
    });
    let y1 = all.iter().fold(0.0f64, |a, p| a.max(p.1)) * 1.15 + 0.01;
    let px = |x: f64| m + (fx(x) - x0) / (x1 - x0).max(1e-9) * (w - 2.0 * m);
    let py = |y: f64| h - m - y / y1 * (h - 2.0 * m);
    let colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/><text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{title}</text>\
         <line x1=\"{m}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/><line x1=\"{m}\" y1=\"{m}\" x2=\"{m}\" y2=\"{}\" stroke=\"black\"/>\
         <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{xlabel}</text><text x=\"16\" y=\"{}\" transform=\"rotate(-90 16 {})\" text-anchor=\"middle\">read_all p50 (ms)</text>",
        w / 2.0,
        h - m,
        w - m,
        h - m,
        h - m,
        w / 2.0,
        h - 16.0,
        h / 2.0,
        h / 2.0
    );
    for k in 0..=4 {
        let y = y1 * f64::from(k) / 4.0;
        let _ = write!(
            out,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.1}</text>",
            m - 6.0,
            py(y) + 4.0,
            y
        );
    }
    for t in ticks {
        let _ = write!(
            out,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{t}</text>",
            px(t as f64),
            h - m + 16.0
        );
    }
    for (i, (name, pts)) in series.iter().enumerate() {
        let c = colors[i % colors.len()];
        let path: Vec<String> = pts
            .iter()
            .filter(|p| p.1.is_finite())
            .map(|p| format!("{:.1},{:.1}", px(p.0), py(p.1)))
            .collect();
        let _ = write!(
            out,
            "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" points=\"{}\"/>",
            path.join(" ")
        );
        for p in pts {
            if p.1.is_finite() {
                let _ = write!(
                    out,
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{c}\"/>",
                    px(p.0),
                    py(p.1)
                );
            } else {
                // A failed measurement: a cross at the top, with the series' colour.
                let y = m + 14.0 + 16.0 * i as f64;
                let _ = write!(
                    out,
                    "<text x=\"{:.1}\" y=\"{y:.1}\" fill=\"{c}\" text-anchor=\"end\">read fails ✕</text>",
                    px(p.0) - 4.0
                );
            }
        }
        let _ = write!(
            out,
            "<text x=\"{}\" y=\"{}\" fill=\"{c}\">{name}</text>",
            m + 10.0,
            m + 14.0 + 16.0 * i as f64
        );
    }
    out.push_str("</svg>\n");
    out
}

#[tokio::main]
async fn main() -> Res<()> {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let want = |s: &str| args.is_empty() || args.iter().any(|a| a == s);
    let s = session().await?;
    s.query_unpaged(format!("DROP KEYSPACE IF EXISTS {KS}"), ())
        .await?;
    s.query_unpaged(format!("CREATE KEYSPACE {KS} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': 1}}"), ()).await?;
    let mut r = Report { md: String::new() };
    let version: (String,) = s
        .query_unpaged("SELECT release_version FROM system.local", ())
        .await?
        .into_rows_result()?
        .single_row()?;
    r.line(&format!(
        "Run {} on Apache Cassandra {} (one node on 127.0.0.1, RF 1) and the same 2-core machine as the client.",
        Timestamp::now(),
        version.0
    ));
    std::fs::create_dir_all("bench-results")?;
    warm_up(&s).await?;
    if want("ops") {
        ops(&s, &mut r).await?;
    }
    if want("heartbeat") {
        heartbeat_cost(&s, &mut r).await?;
    }
    if want("scale") {
        let pts = scale(&s, &mut r).await?;
        std::fs::write(
            "bench-results/read_all_vs_live_silos.svg",
            svg(
                "read_all latency vs live silos",
                "live silos (log scale)",
                &[("read_all".into(), pts)],
                true,
            ),
        )?;
    }
    if want("churn") {
        let pts = churn(&s, &mut r).await?;
        let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
        for (label, x, y) in pts {
            match series.iter_mut().find(|s| s.0 == label) {
                Some(s) => s.1.push((x, y)),
                None => series.push((label, vec![(x, y)])),
            }
        }
        std::fs::write(
            "bench-results/read_all_vs_expired_generations.svg",
            svg(
                "read_all latency vs expired generations",
                "expired generations",
                &series,
                false,
            ),
        )?;
    }
    std::fs::write("bench-results/results.md", &r.md)?;
    println!("\nwrote bench-results/results.md");
    Ok(())
}

//! Sections "Per operation: provider vs raw-driver floor" and "Throughput at concurrency".

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cassandra_membership::{MembershipTable, TableVersion, Timestamp};
use scylla::client::session::Session;
use scylla::value::CqlTimestamp;

use crate::fixture::{Res, address, entry, fill, provider};
use crate::floor::{HeartbeatValues, RowKey, floor, read_all_floor, read_all_floor_decoded};
use crate::report::{Report, Stats, ms, stats};

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

pub(crate) async fn run(s: &Arc<Session>, r: &mut Report) -> Res<()> {
    r.section(
        "Per operation: provider vs raw-driver floor",
        "Median and p99 latency (ms) of each operation, and of the same statements executed directly through the \
         scylla driver (same CQL from `cql/`, same consistency, same conditions), alternated in one run (200 samples \
         each after 20 warm-up). Cluster of 10 entries. Ratio = provider median ÷ floor median. The floor of \
         read_all (and of cleanup_defunct with none due) is one serial page of the partition, of read_row (present \
         or absent) one serial names read of two rows, of update_i_am_alive one plain write; with TTL on, \
         update_row and insert_row first read the TTLs they must not shorten (by name).",
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
                |_| timed(read_all_floor(s, &f, pk)),
            )
            .await?,
        );
        // Not a target: how much of read_all's overhead is decoding the page's rows.
        push(
            "read_all vs floor + decoding its rows",
            ab(
                200,
                |_| timed(async { t.read_all().await.map(|_| ()).map_err(Into::into) }),
                |_| timed(read_all_floor_decoded(s, &f, pk)),
            )
            .await?,
        );
        // A missing silo: the same names read as a present one, whatever keys sort around it.
        for (label, missing) in [
            ("read_row (absent, a row after the key)", address(0, 0)),
            (
                "read_row (absent, key after every row)",
                address(0x00ff_ffff, 0),
            ),
        ] {
            let missing_key = missing.to_string();
            push(
                label,
                ab(
                    200,
                    |_| timed(async { t.read_row(&missing).await.map(|_| ()).map_err(Into::into) }),
                    |_| {
                        timed(async {
                            s.execute_unpaged(
                                &f.read_row,
                                RowKey {
                                    service_id: "bench",
                                    cluster_id: &cluster,
                                    silo: &missing_key,
                                },
                            )
                            .await?;
                            Ok(())
                        })
                    },
                )
                .await?,
            );
        }
        let a = entry(3).address;
        let key = a.to_string();
        push(
            "read_row",
            ab(
                200,
                |_| timed(async { t.read_row(&a).await.map(|_| ()).map_err(Into::into) }),
                |_| {
                    timed(async {
                        s.execute_unpaged(
                            &f.read_row,
                            RowKey {
                                service_id: "bench",
                                cluster_id: &cluster,
                                silo: &key,
                            },
                        )
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
                            HeartbeatValues {
                                ttl: wttl,
                                write_time_micros: now.as_millis() * 1000,
                                heartbeat: (start, CqlTimestamp(now.as_millis())),
                                service_id: "bench",
                                cluster_id: &cluster,
                                silo: &key,
                            },
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
                        let tags = (&snap.rows[0].etag, &snap.version);
                        timed(f.update_row(s, &cluster, &e, tags, (ttl, wttl))).await
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
                        timed(f.insert_row(s, &cluster, &e, &v, (ttl, wttl))).await
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
                |_| timed(read_all_floor(s, &f, (pk2.0, pk2.1.as_str()))),
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

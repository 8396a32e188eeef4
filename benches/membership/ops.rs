//! Sections "Per operation: provider vs raw-driver floor" and "Throughput at concurrency".

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cassandra_membership::{MembershipTable, TableVersion, Timestamp};
use scylla::client::session::Session;
use scylla::value::CqlTimestamp;
use uuid::Uuid;

use crate::fixture::{Res, address, entry, fill, provider};
use crate::floor::{entry_values, floor, read_all_floor, update_values, uuid_of};
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
                |_| timed(read_all_floor(s, &f, pk)),
            )
            .await?,
        );
        // The target: read_all costs about one serial read of the partition's rows alone.
        push(
            "read_all vs 1 serial read of the rows",
            ab(
                200,
                |_| timed(async { t.read_all().await.map(|_| ()).map_err(Into::into) }),
                |_| {
                    timed(async {
                        s.execute_unpaged(&f.read_rows, pk).await?;
                        Ok(())
                    })
                },
            )
            .await?,
        );
        // A missing silo whose key sorts before the stored ones: one statement.
        let missing = address(0, 0);
        let missing_key = missing.to_string();
        push(
            "read_row (absent, a row after the key)",
            ab(
                200,
                |_| timed(async { t.read_row(&missing).await.map(|_| ()).map_err(Into::into) }),
                |_| {
                    timed(async {
                        s.execute_unpaged(
                            &f.read_row_from,
                            (&missing_key, "bench", cluster.as_str(), &missing_key),
                        )
                        .await?;
                        Ok(())
                    })
                },
            )
            .await?,
        );
        // A missing silo whose key sorts after every stored one: the next row (none), then the last.
        let last = address(0x00ff_ffff, 0);
        let last_key = last.to_string();
        push(
            "read_row (absent, key after every row)",
            ab(
                200,
                |_| timed(async { t.read_row(&last).await.map(|_| ()).map_err(Into::into) }),
                |_| {
                    timed(async {
                        s.execute_unpaged(
                            &f.read_row_from,
                            (&last_key, "bench", cluster.as_str(), &last_key),
                        )
                        .await?;
                        s.execute_unpaged(&f.read_last_row, (&last_key, "bench", cluster.as_str()))
                            .await?;
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
                        let key = e.address.to_string();
                        timed(async {
                            if ttl {
                                s.execute_unpaged(&f.read_ttls, ("bench", cluster.as_str(), &key))
                                    .await?;
                            }
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
                            if ttl {
                                s.execute_unpaged(&f.read_version_ttl, ("bench", cluster.as_str()))
                                    .await?;
                            }
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

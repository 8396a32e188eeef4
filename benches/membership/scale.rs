//! Scale sections: read_all vs live silos, 1,000 silos heartbeating from one process, join storm.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, MembershipOptions, MembershipTable,
    Timestamp,
};
use scylla::client::session::Session;
use uuid::Uuid;

use crate::fixture::{KS, Res, entry, fill, provider};
use crate::report::{Report, ms, stats};

pub(crate) async fn run(s: &Arc<Session>, r: &mut Report) -> Res<Vec<(f64, f64)>> {
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
    let mut o = CassandraClusteringOptions::new(KS.as_str(), "bench", "thousand")
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

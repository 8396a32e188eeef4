//! Section "Churn: read_all after many expired generations": latency and tombstones scanned.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cassandra_membership::{CassandraMembershipTable, MembershipTable};
use scylla::client::session::Session;
use scylla::statement::Consistency;
use scylla::statement::batch::{Batch, BatchType};
use uuid::Uuid;

use crate::fixture::{KS, Res, address, entry, fill, opts};
use crate::floor::entry_values;
use crate::report::{Report, ms, stats};

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

pub(crate) async fn run(s: &Arc<Session>, r: &mut Report) -> Res<Vec<(String, f64, f64)>> {
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
            let q = format!("\"{}\".\"{table}\"", *KS);
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
            nodetool(&["flush", KS.as_str(), &table]).await?;
            nodetool(&["compact", KS.as_str(), &table]).await?;
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

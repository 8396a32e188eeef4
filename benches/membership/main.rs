//! Entry point: picks the sections, re-creates the keyspace, writes the report and the plots.
//!
//! Benchmarks against a real Cassandra node: each operation against the raw-driver floor (same
//! CQL, same consistency, same conditions, interleaved in the same run), heartbeat cost, scale,
//! and churn (tombstones). Writes `bench-results/results.md` and SVG plots.
//!
//!     scripts/cassandra.sh start && cargo bench --bench membership            # everything (~6 min)
//!     cargo bench --bench membership -- ops heartbeat                         # some sections
//!     cargo bench --bench membership -- contention                            # joins at once
//!     cargo bench --bench membership -- view                                  # the cluster view's cost
//!
//! The node is `CASSANDRA_CONTACT_POINTS` (default 127.0.0.1:9042); the keyspace `cm_bench` is
//! dropped and re-created at the start.

mod churn;
mod contention;
mod dcs;
mod fixture;
mod floor;
mod heartbeat_cost;
mod ops;
mod peers;
mod plot;
mod report;
mod scale;
mod trace;
mod view;

use cassandra_membership::Timestamp;

use crate::fixture::{KS, Res, replication, session, warm_up};
use crate::plot::svg;
use crate::report::Report;

#[tokio::main]
async fn main() -> Res<()> {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let want = |s: &str| args.is_empty() || args.iter().any(|a| a == s);
    let s = session().await?;
    s.query_unpaged(format!("DROP KEYSPACE IF EXISTS {}", *KS), ())
        .await?;
    s.query_unpaged(
        format!(
            "CREATE KEYSPACE {} WITH replication = {{{}}}",
            *KS,
            replication()
        ),
        (),
    )
    .await?;
    let mut r = Report::new();
    let version: (String,) = s
        .query_unpaged("SELECT release_version FROM system.local", ())
        .await?
        .into_rows_result()?
        .single_row()?;
    let peers = s
        .query_unpaged("SELECT peer FROM system.peers_v2", ())
        .await?
        .into_rows_result()?
        .rows_num();
    // As the node answering says (system_views.settings), not as the environment claims.
    let paxos = s
        .query_unpaged(
            "SELECT value FROM system_views.settings WHERE name = 'paxos_variant'",
            (),
        )
        .await?
        .into_rows_result()?
        .maybe_first_row::<(Option<String>,)>()?
        .and_then(|(v,)| v)
        .unwrap_or_else(|| "unknown".into());
    let commit = std::process::Command::new("git")
        .args(["describe", "--always", "--dirty"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|c| c.trim().to_owned())
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "unknown".into());
    r.line(&format!(
        "Run {} of commit {commit} on Apache Cassandra {} ({} node(s), replication {{{}}}, paxos_variant {paxos}) and the same 2-core machine as the client.",
        Timestamp::now(),
        version.0,
        peers + 1,
        replication()
    ));
    std::fs::create_dir_all("bench-results")?;
    warm_up(&s).await?;
    if want("ops") {
        ops::run(&s, &mut r).await?;
    }
    if want("heartbeat") {
        heartbeat_cost::run(&s, &mut r).await?;
    }
    if want("scale") {
        let pts = scale::run(&s, &mut r).await?;
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
    if want("contention") {
        contention::run(&s, &mut r).await?;
    }
    if want("churn") {
        let pts = churn::run(&s, &mut r).await?;
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
    if want("view") {
        view::run(&mut r).await?;
    }
    // Needs the two-DC ring (scripts/bench-dcs.sh): only when named.
    if args.iter().any(|a| a == "dcs") {
        dcs::run(&mut r).await?;
    }
    if want("peers") {
        let series = peers::run(&s, &mut r).await?;
        std::fs::write(
            "bench-results/peers_heartbeats.svg",
            plot::svg_y(
                "p99 heartbeat latency by design",
                "silos (log scale)",
                "heartbeat p99 (ms)",
                "no heartbeat",
                &series,
                true,
            ),
        )?;
    }
    std::fs::write("bench-results/results.md", r.markdown())?;
    println!("\nwrote bench-results/results.md");
    Ok(())
}

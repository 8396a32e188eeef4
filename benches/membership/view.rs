//! The cluster view's cost: a silo's view adds no statement per period (its statements per
//! period are one heartbeat and the detector's one `read_all`, as without the view), and a
//! `ClusterWatcher`'s cost per refresh at 10, 100 and 1,000 members.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cassandra_membership::cassandra::StatementCounts;
use cassandra_membership::conformance::faults::{FaultyTable, Operation};
use cassandra_membership::{
    CassandraMembershipTable, ClusterWatcher, ClusterWatcherOptions, MembershipOptions,
    MembershipTable, Silo,
};

use crate::fixture::{Res, address, fill, opts, session};
use crate::report::{Report, ms, stats};

fn minus(a: StatementCounts, b: StatementCounts) -> StatementCounts {
    StatementCounts {
        reads: a.reads - b.reads,
        serial_reads: a.serial_reads - b.serial_reads,
        plain_writes: a.plain_writes - b.plain_writes,
        conditional_writes: a.conditional_writes - b.conditional_writes,
    }
}

fn per(n: u64, of: u64) -> String {
    format!("{:.2}", n as f64 / of.max(1) as f64)
}

pub(crate) async fn run(r: &mut Report) -> Res<()> {
    silo(r).await?;
    watcher(r).await
}

/// One silo on a table value of its own (its own session: the counts are its statements only),
/// with a 200 ms publish period, for 10 s after its join.
async fn silo(r: &mut Report) -> Res<()> {
    r.section(
        "The view: statements per silo per period",
        "One silo (a session of its own, so the provider's counts are its statements only) runs 10 s with a 200 ms publish period (compressed from 30 s), TTL off, after its join; `read_all` calls counted by a wrapper. The view is published from the detector's `read_all`: the reads per period are the detector's one, as before the view.",
    );
    let mut m = MembershipOptions::default();
    m.i_am_alive_table_publish_timeout = Duration::from_millis(200);
    m.defunct_silo_cleanup_period = None;
    let t = CassandraMembershipTable::with_session(
        session().await?,
        opts("view-silo", "membership", false).membership(m),
    )?;
    t.initialize(true).await?;
    let t = Arc::new(t);
    let counted = Arc::new(FaultyTable::new(t.clone()));
    let silo = Silo::join(counted.clone(), address(1, 1)).await?;
    let (before, reads_before) = (t.statement_counts(), counted.calls(Operation::ReadAll));
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let c = minus(t.statement_counts(), before);
    let read_alls = counted.calls(Operation::ReadAll) - reads_before;
    let periods = (started.elapsed().as_millis() / 200) as u64;
    let versions = silo.view().borrow().version().version;
    silo.leave().await?;
    r.table(
        &[
            "periods",
            "read_all calls",
            "serial reads / period",
            "plain writes / period",
            "plain reads / period",
            "conditional writes",
            "view's own statements",
        ],
        &[vec![
            periods.to_string(),
            read_alls.to_string(),
            per(c.serial_reads, periods),
            per(c.plain_writes, periods),
            per(c.reads, periods),
            c.conditional_writes.to_string(),
            // Every read_all is a detection round's (one per period); the view reads nothing.
            (read_alls.saturating_sub(periods + 1)).to_string(),
        ]],
    );
    r.line(&format!(
        "The view ended at table version {versions}. A join adds one `read_all` (its first view)."
    ));
    Ok(())
}

/// A watcher on a session of its own over a cluster of N members, refreshing every 100 ms for
/// 5 s; its refreshes counted by a wrapper, their latency by timing `read_all` alone.
async fn watcher(r: &mut Report) -> Res<()> {
    r.section(
        "The watcher: cost per refresh",
        "A `ClusterWatcher` (a session of its own) follows a cluster of N Active members, refreshing every 100 ms for 5 s; statements per refresh from the provider's counts, refreshes from a wrapper's. Latency: 50 `read_all`s of the same table value (a refresh is one).",
    );
    let fill_t = CassandraMembershipTable::with_session(
        session().await?,
        opts("view-watcher", "membership", false),
    )?;
    fill_t.initialize(true).await?;
    let mut rows = Vec::new();
    let mut have = 0;
    for n in [10u32, 100, 1000] {
        fill(&fill_t, have, n).await?;
        have = n;
        let t = Arc::new(CassandraMembershipTable::with_session(
            session().await?,
            opts("view-watcher", "membership", false),
        )?);
        let counted = Arc::new(FaultyTable::new(t.clone()));
        let w = ClusterWatcher::start(
            counted.clone(),
            ClusterWatcherOptions::default().refresh_period(Duration::from_millis(100)),
        )
        .await?;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let members = w.current().active().count();
        w.stop().await;
        assert_eq!(members, n as usize);
        let c = t.statement_counts();
        let refreshes = counted.calls(Operation::ReadAll);
        let mut v = Vec::new();
        for _ in 0..50 {
            let start = Instant::now();
            t.read_all().await?;
            v.push(start.elapsed());
        }
        let st = stats(v);
        rows.push(vec![
            n.to_string(),
            refreshes.to_string(),
            per(c.serial_reads, refreshes),
            per(c.reads, refreshes),
            (c.plain_writes + c.conditional_writes).to_string(),
            ms(st.median),
            ms(st.p99),
        ]);
    }
    r.table(
        &[
            "members",
            "refreshes",
            "serial reads / refresh",
            "plain reads / refresh",
            "writes",
            "p50 ms",
            "p99 ms",
        ],
        &rows,
    );
    Ok(())
}

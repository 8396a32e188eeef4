//! Section "Heartbeat cost with TTL on": statements per heartbeat, counted by the provider.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, MembershipOptions, MembershipTable,
    Timestamp,
};
use scylla::client::session::Session;

use crate::fixture::{KS, Res, entry, fill};
use crate::report::Report;

pub(crate) async fn run(s: &Arc<Session>, r: &mut Report) -> Res<()> {
    r.section(
        "Heartbeat cost with TTL on",
        "20 silos heartbeat every 10 ms for 30 s (time compressed 3,000×: a 30 s period becomes 10 ms); the renewal \
         interval is 20 s, in the same ratio to the period as the default (TTL 7 d / 10 = 16.8 h vs 30 s ≈ 2,016). \
         Statements counted by the provider.",
    );
    let mut m = MembershipOptions::default();
    m.defunct_silo_expiration = Duration::from_secs(600);
    m.i_am_alive_table_publish_timeout = Duration::from_millis(10);
    let mut o = CassandraClusteringOptions::default()
        .keyspace(KS.as_str())
        .service_id("bench")
        .cluster_id("hb-cost")
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

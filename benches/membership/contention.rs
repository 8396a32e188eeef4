//! Section "contention": many silos joining one cluster at once, against the same number of
//! inserts one after another, side by side in one run (the ratio is what the target is about).

use std::sync::Arc;
use std::time::{Duration, Instant};

use cassandra_membership::cassandra::StatementCounts;
use cassandra_membership::runtime::protocol::{self, ProtocolLimits};
use cassandra_membership::{
    CassandraMembershipTable, MembershipOptions, MembershipTable, Silo, SiloStatus,
};
use scylla::client::session::Session;

use crate::fixture::{Res, entry, provider};
use crate::report::{Report, stats};

/// What one variant did: wall time until the last silo joined, per-silo times, statements.
struct Outcome {
    label: String,
    silos: u32,
    all_joined: Duration,
    per_silo: Vec<Duration>,
    counts: StatementCounts,
    /// Conditional writes a join needs when it wins every race.
    needed_lwts: u64,
    errors: u64,
    first_error: Option<String>,
}

pub(crate) async fn run(s: &Arc<Session>, r: &mut Report) -> Res<()> {
    r.section(
        "Contention: silos joining at once",
        "N silos join one cluster at the same moment, each from its own table value (shared session and \
         statements); the baseline inserts the same number of silos one after another (read the version, \
         insert_row). All variants run side by side in this run; each uses a fresh cluster partition. \
         `lost races` = conditional writes beyond the ones a join needs when it wins at once.",
    );
    let mut out = Vec::new();
    out.push(
        sequential(
            s,
            "baseline: 100 sequential read_row + insert_row",
            100,
            false,
        )
        .await?,
    );
    out.push(sequential(s, "100 sequential read_all + insert_row", 100, true).await?);
    out.push(step_storm(s, "100 × protocol::join_within at once", 100).await?);
    out.push(initialize_storm(s, "100 × initialize at once (Silo::join's first step)", 100).await?);
    out.push(silo_storm(s, "100 × Silo::join at once", 100, false).await?);
    out.push(silo_storm(s, "100 × Silo::join one after another", 100, true).await?);
    out.push(step_storm(s, "1,000 × protocol::join_within at once", 1000).await?);
    out.push(silo_storm(s, "1,000 × Silo::join at once", 1000, false).await?);
    let base = out[0].all_joined.as_secs_f64();
    let rows: Vec<Vec<String>> = out
        .iter()
        .map(|o| {
            let st = stats(o.per_silo.clone());
            let lwts = o.counts.conditional_writes;
            vec![
                o.label.clone(),
                o.silos.to_string(),
                format!("{:.2} s", o.all_joined.as_secs_f64()),
                format!("{:.1}×", o.all_joined.as_secs_f64() / base),
                format!("{:.0} ms", st.median.as_secs_f64() * 1000.0),
                lwts.to_string(),
                lwts.saturating_sub(o.needed_lwts).to_string(),
                o.counts.serial_reads.to_string(),
                match &o.first_error {
                    Some(e) => format!("{} ({e})", o.errors),
                    None => o.errors.to_string(),
                },
            ]
        })
        .collect();
    r.table(
        &[
            "variant",
            "silos",
            "all joined after",
            "÷ baseline",
            "p50 per silo",
            "conditional writes",
            "lost races",
            "serial reads",
            "errors",
        ],
        &rows,
    );
    Ok(())
}

/// A fresh cluster partition of the bench table, initialized and its statements prepared, so the
/// timings below hold no schema work.
async fn fresh(s: &Arc<Session>, cluster: &str) -> Res<Arc<CassandraMembershipTable>> {
    Ok(Arc::new(provider(s, cluster, "contention", false).await?))
}

fn counts_since(t: &CassandraMembershipTable, before: StatementCounts) -> StatementCounts {
    let now = t.statement_counts();
    StatementCounts {
        reads: now.reads - before.reads,
        serial_reads: now.serial_reads - before.serial_reads,
        plain_writes: now.plain_writes - before.plain_writes,
        conditional_writes: now.conditional_writes - before.conditional_writes,
    }
}

async fn sequential(s: &Arc<Session>, label: &str, n: u32, read_all: bool) -> Res<Outcome> {
    let t = fresh(s, if read_all { "seq-all" } else { "seq-row" }).await?;
    let before = t.statement_counts();
    let mut per_silo = Vec::new();
    let start = Instant::now();
    for i in 0..n {
        let e = entry(i);
        let one = Instant::now();
        let v = if read_all {
            t.read_all().await?.version
        } else {
            t.read_row(&e.address).await?.version
        };
        if !t.insert_row(&e, &v.next()).await? {
            return Err("a sequential insert lost a race it had no one to lose to".into());
        }
        per_silo.push(one.elapsed());
    }
    Ok(Outcome {
        label: label.into(),
        silos: n,
        all_joined: start.elapsed(),
        per_silo,
        counts: counts_since(&t, before),
        needed_lwts: u64::from(n),
        errors: 0,
        first_error: None,
    })
}

/// Collects the joins' results: per-silo times and errors.
async fn gather(
    tasks: Vec<tokio::task::JoinHandle<(Duration, Result<(), String>)>>,
) -> Res<(Vec<Duration>, u64, Option<String>)> {
    let (mut per_silo, mut errors, mut first_error) = (Vec::new(), 0, None);
    for task in tasks {
        let (took, result) = task.await?;
        per_silo.push(took);
        if let Err(e) = result {
            errors += 1;
            first_error.get_or_insert(e);
        }
    }
    Ok((per_silo, errors, first_error))
}

/// The join step alone (read, insert_row, retry lost races with the protocol's backoff).
async fn step_storm(s: &Arc<Session>, label: &str, n: u32) -> Res<Outcome> {
    let cluster = format!("step-{n}");
    let t = fresh(s, &cluster).await?;
    let before = t.statement_counts();
    let limits = ProtocolLimits::from_options(&MembershipOptions::default());
    let start = Instant::now();
    let tasks = (0..n)
        .map(|i| {
            let t = Arc::new(t.for_cluster(&cluster).expect("a valid cluster id"));
            tokio::spawn(async move {
                let mut e = entry(i);
                e.status = SiloStatus::Joining;
                let r = protocol::join_within(t.as_ref(), &e, &limits).await;
                (start.elapsed(), r.map_err(|e| e.to_string()))
            })
        })
        .collect();
    let (per_silo, errors, first_error) = gather(tasks).await?;
    let all_joined = start.elapsed();
    println!(
        "{label}: {:.2} s, {errors} failed",
        all_joined.as_secs_f64()
    );
    check_joined(&t, n - errors as u32).await?;
    Ok(Outcome {
        label: label.into(),
        silos: n,
        all_joined,
        per_silo,
        counts: counts_since(&t, before),
        needed_lwts: u64::from(n),
        errors,
        first_error,
    })
}

/// `initialize(true)` on a cluster that has its version: what every `Silo::join` starts with.
async fn initialize_storm(s: &Arc<Session>, label: &str, n: u32) -> Res<Outcome> {
    let cluster = format!("init-{n}");
    let t = fresh(s, &cluster).await?;
    let before = t.statement_counts();
    let start = Instant::now();
    let tasks = (0..n)
        .map(|_| {
            let t = t.for_cluster(&cluster).expect("a valid cluster id");
            tokio::spawn(async move {
                let r = t.initialize(true).await;
                (start.elapsed(), r.map_err(|e| e.to_string()))
            })
        })
        .collect();
    let (per_silo, errors, first_error) = gather(tasks).await?;
    Ok(Outcome {
        label: label.into(),
        silos: n,
        all_joined: start.elapsed(),
        per_silo,
        counts: counts_since(&t, before),
        needed_lwts: u64::from(n),
        errors,
        first_error,
    })
}

/// The whole `Silo::join`: initialize, insert as Joining, move to Active, start the tasks; all
/// at once, or (`sequential`) one after another — the same work without a race to lose, which
/// splits the storm's ratio into what a join costs and what racing adds.
async fn silo_storm(s: &Arc<Session>, label: &str, n: u32, sequential: bool) -> Res<Outcome> {
    let cluster = format!("silo-{n}{}", if sequential { "-seq" } else { "" });
    let t = fresh(s, &cluster).await?;
    let mut options = t.options().membership.clone();
    // One silo per process may run the defunct cleanup; here all of them share one.
    options.defunct_silo_cleanup_period = None;
    // The silos' table: `t`'s session and options, with the cleanup off (the counts are its).
    let silos = CassandraMembershipTable::with_session(
        Arc::clone(t.session()),
        t.options().clone().membership(options),
    )?;
    let before = silos.statement_counts();
    // One join from its own table value; `since` is when its time counts from.
    let join = |i: u32, since: Instant| {
        let table: Arc<dyn MembershipTable> =
            Arc::new(silos.for_cluster(&cluster).expect("a valid cluster id"));
        async move {
            let e = entry(i);
            let r = Silo::builder(table, e.address)
                .host_name(e.host_name)
                .silo_name(e.silo_name)
                .proxy_port(e.proxy_port)
                .join()
                .await;
            // The heartbeat (every 30 s) and detector never run before this section ends.
            (
                since.elapsed(),
                r.map(|silo| silo.crash()).map_err(|e| e.to_string()),
            )
        }
    };
    let start = Instant::now();
    let (per_silo, errors, first_error) = if sequential {
        let (mut per_silo, mut errors, mut first_error) = (Vec::new(), 0, None);
        for i in 0..n {
            let (took, result) = join(i, Instant::now()).await;
            per_silo.push(took);
            if let Err(e) = result {
                errors += 1;
                first_error.get_or_insert(e);
            }
        }
        (per_silo, errors, first_error)
    } else {
        gather((0..n).map(|i| tokio::spawn(join(i, start))).collect()).await?
    };
    let all_joined = start.elapsed();
    println!(
        "{label}: {:.2} s, {errors} failed",
        all_joined.as_secs_f64()
    );
    check_joined(&t, n - errors as u32).await?;
    Ok(Outcome {
        label: label.into(),
        silos: n,
        all_joined,
        per_silo,
        counts: counts_since(&silos, before),
        // Per silo: initialize's version insert (it finds the version there), the insert, Active.
        needed_lwts: 3 * u64::from(n),
        errors,
        first_error,
    })
}

/// The table holds a row for every join that succeeded, and the version counts them.
async fn check_joined(t: &CassandraMembershipTable, n: u32) -> Res<()> {
    let snap = t.read_all().await?;
    if snap.rows.len() != n as usize || snap.version.version < u64::from(n) {
        return Err(format!(
            "{} rows at version {} after {n} joins",
            snap.rows.len(),
            snap.version.version
        )
        .into());
    }
    Ok(())
}

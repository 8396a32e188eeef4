//! Section "Two data centres": each operation's latency per consistency profile on the two-DC ring
//! (`scripts/bench-dcs.sh`: dc1 and dc2, one node each, a keyspace replicated once to each).

use std::time::{Duration, Instant};

use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, ConsistencyProfile, MembershipTable,
    Timestamp,
};

use crate::fixture::{Res, entry, fill, opts};
use crate::report::{Report, Stats, ms, stats};

const SAMPLES: usize = 100;
const WARM_UP: usize = 10;

async fn sample<F, Fut>(mut f: F) -> Res<Stats>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Res<()>>,
{
    let mut v = Vec::with_capacity(SAMPLES);
    for i in 0..SAMPLES + WARM_UP {
        let t = Instant::now();
        f(i).await?;
        if i >= WARM_UP {
            v.push(t.elapsed());
        }
    }
    Ok(stats(v))
}

/// Median and p99 of read_all, read_row, heartbeat, update_row and insert_row on `t`.
async fn operations(t: &CassandraMembershipTable, base: u32) -> Res<Vec<Stats>> {
    t.initialize(true).await?;
    fill(t, base, base + 10).await?;
    let one = entry(base).address;
    let read_all = sample(|_| async { t.read_all().await.map(drop).map_err(Into::into) }).await?;
    let read_row =
        sample(|_| async { t.read_row(&one).await.map(drop).map_err(Into::into) }).await?;
    let heartbeat = sample(|_| async {
        t.update_i_am_alive(&one, Timestamp::now())
            .await
            .map(drop)
            .map_err(Into::into)
    })
    .await?;
    let update = sample(|_| async {
        let s = t.read_row(&one).await?;
        let row = s.rows.first().ok_or("the row is gone")?;
        let applied = t
            .update_row(&row.entry, &row.etag, &s.version.next())
            .await?;
        if applied {
            Ok(())
        } else {
            Err("update_row lost without contention".into())
        }
    })
    .await?;
    let insert = sample(|i| async move {
        let v = t.read_all().await?.version;
        let applied = t
            .insert_row(&entry(base + 1000 + i as u32), &v.next())
            .await?;
        if applied {
            Ok(())
        } else {
            Err("insert_row lost without contention".into())
        }
    })
    .await?;
    Ok(vec![read_all, read_row, heartbeat, update, insert])
}

fn points() -> Vec<String> {
    std::env::var("CASSANDRA_CONTACT_POINTS")
        .unwrap_or_else(|_| "127.0.0.6:9042,127.0.0.7:9042".into())
        .split(',')
        .map(str::to_owned)
        .collect()
}

pub(crate) async fn run(r: &mut Report) -> Res<()> {
    let dc = std::env::var("CASSANDRA_LOCAL_DC").unwrap_or_else(|_| "dc1".into());
    r.section(
        "Two data centres: latency per consistency profile",
        &format!(
            "Median / p99 (ms) of each operation, {SAMPLES} samples after {WARM_UP} warm-up, cluster of 10 entries, \
             on the two-DC ring (dc1 and dc2, one node each, keyspace {{dc1: 1, dc2: 1}}), `serial_datacenter = {dc}`. \
             Loopback: no WAN between the DCs, so a real deployment adds the inter-DC round trip to each phase \
             `quorum` makes. `quorum` needs dc2's replica for every read, commit and Paxos phase; `local_quorum` \
             only dc1's. \"from dc2\": a silo whose only contact point \
             is dc2's node, naming dc1 (its statements still go to dc1's node). An update is its read and its write."
        ),
    );
    let cases: [(&str, ConsistencyProfile, Option<usize>); 3] = [
        ("quorum", ConsistencyProfile::Quorum, None),
        ("local_quorum", ConsistencyProfile::LocalQuorum, None),
        (
            "local_quorum, from dc2",
            ConsistencyProfile::LocalQuorum,
            Some(1),
        ),
    ];
    let mut columns = Vec::new();
    for (k, (label, profile, only)) in cases.iter().enumerate() {
        let all = points();
        let contact = match only {
            Some(i) => vec![
                all.get(*i)
                    .cloned()
                    .ok_or("CASSANDRA_CONTACT_POINTS names one node")?,
            ],
            None => all,
        };
        let o: CassandraClusteringOptions = opts(&format!("dcs-{k}"), "membership_dcs", false)
            .contact_points(contact)
            .consistency(*profile)
            .serial_datacenter(dc.clone())
            .request_timeout(Duration::from_secs(10));
        let t = CassandraMembershipTable::connect(o).await?;
        columns.push((*label, operations(&t, 10_000 * k as u32).await?));
    }
    let names = [
        "read_all",
        "read_row",
        "update_i_am_alive",
        "update_row (read + write)",
        "insert_row (read + write)",
    ];
    let mut rows = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let mut row = vec![(*name).to_owned()];
        for (_, s) in &columns {
            row.push(format!("{} / {}", ms(s[i].median), ms(s[i].p99)));
        }
        rows.push(row);
    }
    let mut header = vec!["operation"];
    header.extend(columns.iter().map(|(l, _)| *l));
    r.table(&header, &rows);
    Ok(())
}

//! Honest outcomes on the ring with a node down: a conditional write that provably lost a race
//! answers `false`, not `OutcomeUnknown`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cassandra_membership::conformance::new_entry;
use cassandra_membership::{SiloStatus, Timestamp};

use super::{
    CONVICTION, SERIAL, clients, convicted_by_the_others, heal, keyspace, node, nodes, session,
    unique,
};

/// The ring's Paxos variant as the node answering says (`system_views.settings`), not as the
/// environment claims: the stage runs this on each (an independent suite saw v2 answer
/// `OutcomeUnknown` for such a loss).
async fn paxos_variant() -> String {
    let answer = session()
        .await
        .query_unpaged(
            "SELECT value FROM system_views.settings WHERE name = 'paxos_variant'",
            (),
        )
        .await;
    answer
        .ok()
        .and_then(|r| r.into_rows_result().ok())
        .and_then(|r| r.maybe_first_row::<(Option<String>,)>().ok().flatten())
        .and_then(|(v,)| v)
        .unwrap_or_else(|| "unknown".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_a_node_down_two_updates_racing_at_one_version_have_one_winner_and_a_definite_loser() {
    let _serial = SERIAL.lock().await;
    keyspace().await;
    heal().await;
    let cluster = unique("race-down");
    let tables = clients(&cluster, 2).await;
    let (a, b) = (new_entry(Timestamp::now()), new_entry(Timestamp::now()));
    for e in [&a, &b] {
        let v = tables[0].read_all().await.expect("read").version;
        assert!(tables[0].insert_row(e, &v.next()).await.expect("insert"));
    }
    let variant = paxos_variant().await;
    let victim = nodes()[2];
    node("kill", victim);
    let killed = Instant::now();
    // Under Paxos v1, until the others' gossip convicts the dead node, a Paxos round another
    // round races may time out (docs::guarantees, "One node of three down"); a loser's settling
    // steps (its serial re-read, its fence) are such rounds: an honest `OutcomeUnknown` there
    // (a fence timed out so when the race began 10 s after the kill under a full run's load).
    // So on v1 the race starts after the conviction; v2 keeps the earlier start.
    if variant != "v2" {
        let took =
            convicted_by_the_others(victim, killed, CONVICTION + Duration::from_secs(60)).await;
        println!("both live nodes marked the killed one down after {took:?}");
    }
    // And once reads answer again through the driver.
    loop {
        let fast = tokio::time::timeout(Duration::from_secs(2), tables[1].read_all()).await;
        if matches!(fast, Ok(Ok(_))) && killed.elapsed() > Duration::from_secs(10) {
            break;
        }
        assert!(
            killed.elapsed() < CONVICTION + Duration::from_secs(60),
            "reads do not answer with a node down"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (mut unknown, mut rounds) = (Vec::new(), 0);
    for round in 0..20 {
        let s = tables[0].read_all().await.expect("read");
        let writes = [&a, &b].map(|e| {
            let row = s
                .rows
                .iter()
                .find(|r| r.entry.address == e.address)
                .expect("both rows")
                .clone();
            let mut changed = row.entry.clone();
            changed.status = if round % 2 == 0 {
                SiloStatus::Active
            } else {
                SiloStatus::Joining
            };
            (changed, row.etag, s.version.next())
        });
        let [wa, wb] = writes;
        let (ta, tb) = (Arc::clone(&tables[0]), Arc::clone(&tables[1]));
        let (ra, rb) = tokio::join!(
            async move { ta.update_row(&wa.0, &wa.1, &wa.2).await },
            async move { tb.update_row(&wb.0, &wb.1, &wb.2).await },
        );
        rounds += 1;
        let answers = [ra, rb];
        let won = answers.iter().filter(|r| matches!(r, Ok(true))).count();
        let lost = answers.iter().filter(|r| matches!(r, Ok(false))).count();
        // With the driver's error under it: which settling step failed (the re-read, the fence)
        // and what Cassandra said tells a provider defect from a server that did not answer.
        unknown.extend(answers.iter().filter_map(|r| match r {
            Err(e) if e.is_outcome_unknown() => Some(format!(
                "round {round}: {e} ({:?})",
                std::error::Error::source(e)
            )),
            _ => None,
        }));
        for r in &answers {
            if let Err(e) = r {
                assert!(
                    e.is_outcome_unknown() || e.is_transient(),
                    "round {round}: {e}"
                );
            }
        }
        assert!(won <= 1, "round {round}: two writes won one version step");
        let after = tables[1].read_all().await.expect("read");
        assert!(after.version.version <= s.version.version + 1);
        if won == 1 {
            assert_eq!(lost, 1, "round {round}: the loser's answer: {answers:?}");
        }
    }
    println!(
        "{rounds} racing rounds with a node down (Paxos {variant}), {} unknown outcomes",
        unknown.len()
    );
    // Both writes were conditioned on the same version tag and only one step was taken; the
    // loser's row still carried the tag it expected: a loss the re-read proves.
    assert!(
        unknown.is_empty(),
        "a provable loss answered OutcomeUnknown (Paxos {variant}): {unknown:#?}"
    );
    heal().await;
}

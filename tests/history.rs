//! The history checker on the in-memory table: a workload of concurrent clients is linearizable
//! on the real implementation, and a deliberately broken one (it drops the version condition)
//! is caught. The same checker judges the three-node fault runs (`tests/three_nodes`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use cassandra_membership::conformance::faults::FaultyTable;
use cassandra_membership::conformance::history::History;
use cassandra_membership::conformance::workload::{self, WorkloadOptions};
use cassandra_membership::{InMemoryMembershipTable, MembershipTable};

fn options() -> WorkloadOptions {
    WorkloadOptions {
        silos_per_client: 3,
        pause: Duration::from_millis(2),
        heartbeat_every: Duration::from_millis(50),
        hung_after: Duration::from_secs(10),
        think: Duration::from_millis(3),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_memory_table_gives_linearizable_histories() {
    let table = InMemoryMembershipTable::new("history");
    table.initialize(true).await.unwrap();
    let clients: Vec<Arc<dyn MembershipTable>> = (0..3)
        .map(|_| Arc::new(table.for_cluster("history")) as Arc<dyn MembershipTable>)
        .collect();
    let history = Arc::new(History::new());
    let report = workload::run(
        clients,
        history.clone(),
        options(),
        Instant::now() + Duration::from_millis(600),
    )
    .await;
    let verdict = history.check().unwrap();
    assert!(
        report.applied > 10,
        "the workload made progress: {report:?}"
    );
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert!(verdict.operations > 100, "{verdict:?}");
    assert!(verdict.linearizable, "{verdict:?}");
}

// The checker proves a history non-linearizable only by exhausting its orderings (a
// depth-first search without memory): exponential in the history's length. So the broken
// backend runs short rounds — each cheap to refute — until one loses an update.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_drops_the_version_condition_is_caught() {
    let mut verdicts = Vec::new();
    for round in 0..20 {
        let inner = InMemoryMembershipTable::new("broken");
        inner.initialize(true).await.unwrap();
        let clients: Vec<Arc<dyn MembershipTable>> = (0..3)
            .map(|_| {
                // Presents the *current* version tag instead of the caller's: a lost-update bug.
                let broken = FaultyTable::new(Arc::new(inner.for_cluster("broken")));
                broken.set_drops_the_version_condition(true);
                Arc::new(broken) as Arc<dyn MembershipTable>
            })
            .collect();
        let history = Arc::new(History::new());
        workload::run(
            clients,
            history.clone(),
            options(),
            Instant::now() + Duration::from_millis(15),
        )
        .await;
        let verdict = history.check().unwrap();
        if !verdict.linearizable {
            // A lost update shows in a handful of operations (two inserts against one version and
            // a read): a slow round may hold no more, and is still proof.
            assert!(verdict.operations >= 2, "round {round}: {verdict:?}");
            eprintln!("caught in round {round}: {verdict:?}");
            return;
        }
        verdicts.push(verdict);
    }
    panic!("lost updates must make some history non-linearizable: {verdicts:?}");
}

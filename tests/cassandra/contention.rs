//! Joins on the real node: a join reads only its own row (with the version), so its cost does
//! not grow with the cluster, it still recognises its own earlier insert, and a damaged row at
//! its address fails it at once instead of conflicting until the deadline.

use std::time::{Duration, Instant};

use cassandra_membership::conformance::new_entry;
use cassandra_membership::runtime::protocol::{self, ProtocolLimits};
use cassandra_membership::{MembershipEntry, MembershipError, MembershipTable, SiloStatus};
use cassandra_membership::{SiloAddress, Timestamp};

use crate::utils::{KEYSPACE, options, session_with_keyspace, table_on, unique};

fn address(n: u16) -> SiloAddress {
    SiloAddress::new(format!("10.15.0.1:{}", 20000 + n).parse().unwrap(), 1).unwrap()
}

fn joining(n: u16) -> MembershipEntry {
    MembershipEntry::new(address(n), SiloStatus::Joining, Timestamp::now())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_reads_its_own_row_not_the_whole_cluster() {
    let s = session_with_keyspace().await;
    // Ten rows a page: reading 40 members whole takes five pages after the version.
    let t = table_on(&s, options(&unique("join-cost")).page_size(10));
    t.initialize(true).await.unwrap();
    for n in 0..40 {
        protocol::join(&t, &joining(n)).await.unwrap();
    }
    let before = t.statement_counts();
    t.read_all().await.unwrap();
    let whole = t.statement_counts().serial_reads - before.serial_reads;
    assert!(whole >= 5, "a whole read took {whole} serial reads");
    let before = t.statement_counts();
    protocol::join(&t, &joining(40)).await.unwrap();
    let after = t.statement_counts();
    assert_eq!(after.conditional_writes - before.conditional_writes, 1);
    let reads = after.serial_reads - before.serial_reads;
    assert!(
        reads <= 3,
        "an uncontended join took {reads} serial reads (a whole read takes {whole})"
    );
    assert_eq!(t.read_all().await.unwrap().rows.len(), 41);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_repeated_by_the_same_incarnation_writes_nothing_and_another_is_refused() {
    let s = session_with_keyspace().await;
    let t = table_on(&s, options(&unique("join-again")));
    t.initialize(true).await.unwrap();
    let e = joining(1);
    protocol::join(&t, &e).await.unwrap();
    let version = t.read_all().await.unwrap().version;
    // As after an insert whose answer was lost: the row read back is this incarnation's.
    protocol::join(&t, &e)
        .await
        .expect("the same incarnation's row is recognised");
    assert_eq!(
        t.read_all().await.unwrap().version,
        version,
        "nothing written"
    );
    let mut other = e.clone();
    other.start_time = e.start_time.saturating_add(Duration::from_secs(1));
    let refused = protocol::join(&t, &other).await;
    assert!(
        matches!(refused, Err(MembershipError::EntryExists { .. })),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_at_an_address_whose_row_is_damaged_fails_at_once() {
    let s = session_with_keyspace().await;
    let cluster = unique("join-damaged");
    let t = table_on(&s, options(&cluster));
    t.initialize(true).await.unwrap();
    let e = new_entry(Timestamp::now());
    // A row the provider cannot decode (an unknown status): an insert there can only conflict.
    s.query_unpaged(
        format!(
            "UPDATE {KEYSPACE}.membership SET entry = {{etag: uuid(), status: 42, suspect_times: [], \
             proxy_port: 1, host_name: 'h', silo_name: 's', role_name: 'r', update_zone: 0, \
             fault_zone: 0, start_time: toTimestamp(now()), i_am_alive: toTimestamp(now())}} \
             WHERE service_id = 'test-service' AND cluster_id = ? AND silo = ?"
        ),
        (cluster.as_str(), e.address.to_string()),
    )
    .await
    .unwrap();
    let limits = ProtocolLimits {
        call_timeout: Duration::from_secs(10),
        step_deadline: Duration::from_secs(30),
    };
    let started = Instant::now();
    let outcome = protocol::join_within(&t, &e, &limits).await;
    assert!(
        matches!(&outcome, Err(MembershipError::CorruptData { silo: Some(s), .. }) if *s == e.address.to_string()),
        "{outcome:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
}

//! The host runtime end to end on the real node, with expiry on: silos join, one crashes and is
//! declared dead by the others, one leaves, the rest stop, and the cluster disappears.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cassandra_membership::{
    MembershipOptions, MembershipTable, Silo, SiloAddress, SiloHealth, SiloStatus, Timestamp,
};

use crate::utils::{options, session_with_keyspace, table_on, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn silos_join_detect_a_crash_leave_and_the_cluster_expires() {
    let s = session_with_keyspace().await;
    let mut m = MembershipOptions::default();
    m.i_am_alive_table_publish_timeout = Duration::from_millis(500);
    m.defunct_silo_expiration = Duration::from_secs(4);
    let mut o = options(&unique("runtime"))
        .table("membership_ttl4")
        .ttl(true)
        .membership(m.clone());
    o.ttl_renewal_interval = Some(Duration::from_secs(1));
    let table: Arc<dyn MembershipTable> = Arc::new(table_on(&s, o));
    // The silos run with the table's options: no second set to disagree with them.
    assert_eq!(table.membership_options(), &m);
    let generation = (Timestamp::now().as_millis() / 1000) as i32;
    let mut silos = Vec::new();
    for n in 1..=3u16 {
        let a = SiloAddress::new(
            format!("127.0.0.1:{}", 12000 + n).parse().unwrap(),
            generation,
        )
        .unwrap();
        let silo = Silo::join(Arc::clone(&table), a).await.unwrap();
        assert!(
            !silo.runs_defunct_cleanup(),
            "storage expiry covers cleanup"
        );
        silos.push(silo);
    }
    for silo in &silos {
        // Healthy with a storage lease, within a few periods: with a 500 ms period and each call
        // bounded by it, one heartbeat slowed by a busy machine is honestly `LeaseAtRisk` for a
        // moment, and the next one heals it.
        let mut health = silo.health();
        let healthy = tokio::time::timeout(
            Duration::from_secs(5),
            health.wait_for(
                |h| matches!(h, SiloHealth::Healthy { lease } if lease.expires_at.is_some()),
            ),
        )
        .await;
        let now = silo.health().borrow().clone();
        assert!(
            matches!(healthy, Ok(Ok(_))),
            "{} not Healthy with a storage lease within 5 s of joining: {now:?}",
            silo.address()
        );
        assert_eq!(silo.entry_status().await.unwrap(), Some(SiloStatus::Active));
    }
    // A crash: the two others declare it dead through the protocol.
    let crashed = silos.pop().unwrap();
    let crashed_address = crashed.address();
    crashed.crash();
    let started = Instant::now();
    loop {
        let row = table.read_row(&crashed_address).await.unwrap();
        if row.rows.first().map(|r| r.entry.status) == Some(SiloStatus::Dead) {
            assert_eq!(row.rows[0].entry.suspect_times.len(), 2);
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "never declared dead"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A graceful leave.
    let leaving = silos.pop().unwrap();
    let left = leaving.address();
    leaving.leave().await.unwrap();
    assert_eq!(
        table.read_row(&left).await.unwrap().rows[0].entry.status,
        SiloStatus::Dead
    );
    // The last silo stops too: with no silo running, the cluster disappears.
    silos.pop().unwrap().crash();
    let stopped = Instant::now();
    loop {
        let snap = table.read_all().await.unwrap();
        if snap.rows.is_empty() && snap.version.etag.is_absent() {
            break;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(12),
            "the cluster never disappeared: {snap:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

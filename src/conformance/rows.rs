//! The conformance cases on versioned writes: inserts and updates move the version and the row
//! tag exactly when they apply, stale or duplicate ones change nothing, concurrent ones have one
//! winner, and every field reads back as written.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;

use super::harness::{
    Harness, WithStatus, definite, fresh, fresh_cluster_id, futures_join, new_entry, one_row,
};
use crate::model::{
    ETag, MembershipEntry, SiloAddress, SiloStatus, SuspectTime, TableVersion, Timestamp,
};

/// (Orleans case 1) Reading an empty table: no members, version 0, a version tag present.
pub async fn read_all_on_empty_table<H: Harness + ?Sized>(h: &H) {
    let t = fresh(h, "empty").await;
    let s = t.read_all().await.unwrap();
    assert!(s.rows.is_empty());
    assert_eq!(s.version.version, 0);
    assert!(
        !s.version.etag.is_absent(),
        "initialize(true) must store a version tag"
    );
}

/// (Orleans case 2) Insert with `next()` succeeds; the version becomes 1; one member.
pub async fn insert_row_moves_version<H: Harness + ?Sized>(h: &H) {
    let t = fresh(h, "insert").await;
    let v = t.read_all().await.unwrap().version;
    let e = new_entry(Timestamp::now());
    assert!(t.insert_row(&e, &v.next()).await.unwrap());
    let s = t.read_all().await.unwrap();
    assert_eq!(s.version.version, 1);
    assert_ne!(s.version.etag, v.etag);
    assert_eq!(one_row(&s).entry, e);
}

async fn duplicate_and_stale_inserts<H: Harness + ?Sized>(h: &H, via_read_all: bool) {
    let t = fresh(h, "dup").await;
    let v0 = t.read_all().await.unwrap().version;
    let e = new_entry(Timestamp::now());
    let next = v0.next();
    assert!(t.insert_row(&e, &next).await.unwrap());
    assert!(
        !t.insert_row(&e, &next).await.unwrap(),
        "the same insert twice must fail"
    );
    let other = new_entry(Timestamp::now());
    assert!(
        !t.insert_row(&other, &next).await.unwrap(),
        "an insert with a stale version must fail"
    );
    let v1 = t.read_all().await.unwrap().version;
    assert!(
        !t.insert_row(&e, &v1.next()).await.unwrap(),
        "a duplicate row with the current version must fail"
    );
    let s = if via_read_all {
        t.read_all().await.unwrap()
    } else {
        t.read_row(&e.address).await.unwrap()
    };
    assert_eq!(s.version.version, 1);
    assert_ne!(
        s.version.etag, next.etag,
        "the table tag must change on insert"
    );
    let row = one_row(&s);
    assert!(!row.etag.is_absent());
    assert_eq!(row.entry, e);
    assert!(t.read_row(&other.address).await.unwrap().rows.is_empty());
}

/// (Orleans case 3) Duplicate and stale inserts fail, read back through `read_row`.
pub async fn duplicate_and_stale_inserts_fail_read_row<H: Harness + ?Sized>(h: &H) {
    duplicate_and_stale_inserts(h, false).await
}

/// (Orleans case 4) Duplicate and stale inserts fail, read back through `read_all`.
pub async fn duplicate_and_stale_inserts_fail_read_all<H: Harness + ?Sized>(h: &H) {
    duplicate_and_stale_inserts(h, true).await
}

/// (Orleans case 5) Nine rounds of insert and update with suspect times; stale updates fail with no effect.
pub async fn update_row_rounds<H: Harness + ?Sized>(h: &H) {
    let t = fresh(h, "update").await;
    let now = Timestamp::now();
    for round in 1..=9usize {
        let v = t.read_all().await.unwrap().version;
        let mut e = new_entry(now);
        assert!(t.insert_row(&e, &v.next()).await.unwrap());
        let s = t.read_row(&e.address).await.unwrap();
        let row_etag = one_row(&s).etag.clone();
        // A stale version (the one the insert consumed).
        e.status = SiloStatus::Active;
        e.suspect_times = vec![
            SuspectTime {
                suspecting_silo: new_entry(now).address,
                time: now.saturating_sub(Duration::from_millis(1234)),
            },
            SuspectTime {
                suspecting_silo: new_entry(now).address,
                time: now.saturating_add(Duration::from_millis(77)),
            },
        ];
        assert!(!t.update_row(&e, &row_etag, &v.next()).await.unwrap());
        let current = s.version.next();
        assert!(t.update_row(&e, &row_etag, &current).await.unwrap());
        assert!(
            !t.update_row(&e, &row_etag, &current).await.unwrap(),
            "the same update twice must fail"
        );
        let after = t.read_row(&e.address).await.unwrap();
        let stored = one_row(&after);
        assert_eq!(stored.entry, e, "every field must read back as written");
        assert_ne!(stored.etag, row_etag);
        assert!(
            !t.update_row(&e, &row_etag, &after.version.next())
                .await
                .unwrap()
        );
        assert_eq!(
            one_row(&t.read_row(&e.address).await.unwrap()).etag,
            stored.etag,
            "a failed update must leave the row tag unchanged"
        );
        assert_eq!(t.read_all().await.unwrap().rows.len(), round);
    }
}

/// (Orleans case 6) 20 parallel inserts of one entry: exactly one wins. Then 19 workers loop read → update
/// until each succeeded once: version 20, one member.
///
/// Under contention a conditional write may answer `OutcomeUnknown` (the contract allows it: on a
/// replicated cluster Paxos rounds that duel can time out); such an answer counts as neither a win
/// nor a loss, and the state read afterwards must be explained by the definite answers plus some
/// of the unknown ones. A backend that never answers unknown is held to the exact numbers.
pub async fn parallel_inserts_and_update_loops<H: Harness + ?Sized>(h: &H) {
    let t = fresh(h, "parallel").await;
    let v = t.read_all().await.unwrap().version.next();
    let e = new_entry(Timestamp::now());
    let inserts = (0..20).map(|_| {
        let (t, e, v) = (Arc::clone(&t), e.clone(), v.clone());
        tokio::spawn(async move { definite(t.insert_row(&e, &v).await) })
    });
    let answers = futures_join(inserts).await;
    let wins = answers.iter().filter(|a| **a == Some(true)).count();
    let unknown = answers.iter().filter(|a| a.is_none()).count();
    assert!(
        wins <= 1,
        "at most one of 20 concurrent inserts wins: {wins}"
    );
    let s = t.read_all().await.unwrap();
    assert_eq!(s.rows.len(), 1, "the entry was inserted exactly once");
    assert_eq!(s.version.version, 1, "one insert applied");
    assert!(
        wins == 1 || unknown > 0,
        "the insert that applied answered true, or its answer was unknown"
    );

    let workers = (0..19).map(|_| {
        let t = Arc::clone(&t);
        let address = e.address;
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            let mut unknown = 0u64;
            loop {
                let s = t.read_row(&address).await.unwrap();
                let row = one_row(&s).clone();
                let mut entry = row.entry.clone();
                entry.status = SiloStatus::Active;
                match definite(t.update_row(&entry, &row.etag, &s.version.next()).await) {
                    Some(true) => return unknown,
                    Some(false) => {}
                    None => unknown += 1,
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "update loop did not finish in 60 s"
                );
                tokio::time::sleep(Duration::from_millis(rand::random_range(1..20))).await;
            }
        })
    });
    let unknown: u64 = futures_join(workers).await.into_iter().sum();
    let s = t.read_all().await.unwrap();
    // 1 insert + 19 updates that answered true, plus any update whose answer was unknown.
    assert!(
        (20..=20 + unknown).contains(&s.version.version),
        "version {} after 19 definite updates and {unknown} unknown ones",
        s.version.version
    );
    assert_eq!(s.rows.len(), 1);
}

/// `update_row` on a missing row returns false and creates nothing.
pub async fn update_on_missing_row_returns_false_and_creates_nothing<H: Harness + ?Sized>(h: &H) {
    let t = fresh(h, "update-missing").await;
    let v = t.read_all().await.unwrap().version;
    let e = new_entry(Timestamp::now());
    assert!(!t.update_row(&e, &ETag::random(), &v.next()).await.unwrap());
    assert!(!t.update_row(&e, &ETag::absent(), &v.next()).await.unwrap());
    let s = t.read_all().await.unwrap();
    assert!(s.rows.is_empty());
    assert_eq!(s.version, v, "a failed update must not move the version");
}

/// `update_row` checks the row tag, not only the version.
pub async fn update_with_wrong_row_etag_fails<H: Harness + ?Sized>(h: &H) {
    let t = fresh(h, "update-etag").await;
    let v = t.read_all().await.unwrap().version;
    let e = new_entry(Timestamp::now());
    assert!(t.insert_row(&e, &v.next()).await.unwrap());
    let s = t.read_all().await.unwrap();
    let changed = e.clone().with_status(SiloStatus::Active);
    assert!(
        !t.update_row(&changed, &ETag::random(), &s.version.next())
            .await
            .unwrap()
    );
    let after = t.read_all().await.unwrap();
    assert_eq!(after, s, "a rejected update must change nothing");
}

/// Every field survives a round trip, including IPv6 addresses, long Unicode names and
/// extreme numbers.
pub async fn full_field_round_trip<H: Harness + ?Sized>(h: &H) {
    let t = fresh(h, "fields").await;
    let v = t.read_all().await.unwrap().version;
    let now = Timestamp::now();
    let address = SiloAddress::new(
        SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 65535),
        i32::MIN,
    )
    .unwrap();
    let e = MembershipEntry {
        address,
        status: SiloStatus::ShuttingDown,
        suspect_times: (0..5)
            .map(|i| SuspectTime {
                suspecting_silo: SiloAddress::from_v4(
                    SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, i), 1),
                    i32::from(i),
                ),
                time: Timestamp::from_millis(now.as_millis() + i64::from(i) * 7),
            })
            .collect(),
        proxy_port: u16::MAX,
        host_name: "hôte-ünïcødé-🚀".repeat(20),
        silo_name: String::new(),
        role_name: "r\"o'l;e --".into(),
        update_zone: i32::MIN,
        fault_zone: i32::MAX,
        start_time: Timestamp::from_millis(1),
        i_am_alive_time: now,
    };
    assert!(t.insert_row(&e, &v.next()).await.unwrap());
    assert_eq!(one_row(&t.read_row(&address).await.unwrap()).entry, e);
    assert_eq!(one_row(&t.read_all().await.unwrap()).entry, e);
}

/// A reader that only initializes without a version sees the absent version, and an insert
/// conditioned on it still works (the first writer creates the version).
pub async fn absent_version_reads_as_zero<H: Harness + ?Sized>(h: &H) {
    let t = h.table(&fresh_cluster_id("absent")).await;
    t.initialize(false).await.unwrap();
    let s = t.read_all().await.unwrap();
    assert_eq!(s.version, TableVersion::absent());
    let e = new_entry(Timestamp::now());
    assert!(
        !t.insert_row(
            &e,
            &TableVersion {
                version: 1,
                etag: ETag::random()
            }
        )
        .await
        .unwrap()
    );
    assert!(t.insert_row(&e, &s.version.next()).await.unwrap());
    assert_eq!(t.read_all().await.unwrap().version.version, 1);
}

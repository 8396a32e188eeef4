//! The conformance cases on a cluster's life: defunct cleanup removes exactly the old entries
//! nobody heartbeats or suspects, deleting a cluster touches no other, and `initialize` is
//! idempotent under concurrency.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use super::harness::{
    Harness, WithStatus, fresh, fresh_cluster_id, futures_join, new_entry, one_row,
};
use crate::model::{SiloStatus, SuspectTime, Timestamp};

/// (Orleans case 8) Cleanup of defunct entries leaves exactly the fresh Joining and the old Active one.
pub async fn cleanup_defunct_leaves_fresh_and_active<H: Harness + ?Sized>(h: &H) {
    let t = fresh(h, "cleanup").await;
    let now = Timestamp::now();
    let old = now.saturating_sub(Duration::from_secs(10 * 24 * 3600));
    let mut keep = BTreeSet::new();
    let mut entries = Vec::new();
    for status in SiloStatus::ALL {
        entries.push(new_entry(old).with_status(status));
    }
    entries.push(new_entry(old).with_status(SiloStatus::Dead));
    entries.push(new_entry(old).with_status(SiloStatus::Joining));
    let fresh_joining = new_entry(now).with_status(SiloStatus::Joining);
    entries.push(fresh_joining.clone());
    for e in &entries {
        let v = t.read_all().await.unwrap().version;
        assert!(t.insert_row(e, &v.next()).await.unwrap());
        if e.status == SiloStatus::Active || e.address == fresh_joining.address {
            keep.insert(e.address);
        }
    }
    let version = t.read_all().await.unwrap().version;
    let removed = t
        .cleanup_defunct(old.saturating_add(Duration::from_secs(3 * 24 * 3600)))
        .await
        .unwrap();
    assert_eq!(removed, entries.len() - 2);
    let s = t.read_all().await.unwrap();
    let left: BTreeSet<_> = s.rows.iter().map(|r| r.entry.address).collect();
    assert_eq!(left, keep);
    assert_eq!(s.version, version, "cleanup does not move the version");
}

/// A recent suspicion or heartbeat keeps an old, non-Active entry from cleanup.
pub async fn cleanup_counts_suspicions_and_heartbeats<H: Harness + ?Sized>(h: &H) {
    let t = fresh(h, "cleanup-recent").await;
    let now = Timestamp::now();
    let old = now.saturating_sub(Duration::from_secs(10 * 24 * 3600));
    let mut suspected = new_entry(old).with_status(SiloStatus::Dead);
    suspected.suspect_times.push(SuspectTime {
        suspecting_silo: new_entry(now).address,
        time: now,
    });
    let heartbeating = new_entry(old).with_status(SiloStatus::Joining);
    let stale = new_entry(old).with_status(SiloStatus::Dead);
    for e in [&suspected, &heartbeating, &stale] {
        let v = t.read_all().await.unwrap().version;
        assert!(t.insert_row(e, &v.next()).await.unwrap());
    }
    t.update_i_am_alive(&heartbeating.address, now)
        .await
        .unwrap();
    let removed = t
        .cleanup_defunct(now.saturating_sub(Duration::from_secs(3600)))
        .await
        .unwrap();
    assert_eq!(removed, 1);
    let left: BTreeSet<_> = t
        .read_all()
        .await
        .unwrap()
        .rows
        .iter()
        .map(|r| r.entry.address)
        .collect();
    assert_eq!(
        left,
        BTreeSet::from([suspected.address, heartbeating.address])
    );
}

/// Deleting one cluster removes its rows and version, leaves another cluster with the same silo
/// addresses alone, and the deleted cluster is usable again after `initialize`.
pub async fn delete_cluster_isolated_and_reusable<H: Harness + ?Sized>(h: &H) {
    let (id_a, id_b) = (fresh_cluster_id("del-a"), fresh_cluster_id("del-b"));
    let a = h.table(&id_a).await;
    let b = h.table(&id_b).await;
    a.initialize(true).await.unwrap();
    b.initialize(true).await.unwrap();
    let e = new_entry(Timestamp::now());
    for t in [&a, &b] {
        let v = t.read_all().await.unwrap().version;
        assert!(t.insert_row(&e, &v.next()).await.unwrap());
        t.update_i_am_alive(&e.address, Timestamp::now())
            .await
            .unwrap();
    }
    let b_before = b.read_all().await.unwrap();
    b.delete_cluster(&id_a).await.unwrap();
    let a_after = a.read_all().await.unwrap();
    assert!(a_after.rows.is_empty());
    assert_eq!(a_after.version.version, 0);
    assert_eq!(
        b.read_all().await.unwrap(),
        b_before,
        "another cluster must be untouched"
    );
    a.initialize(true).await.unwrap();
    let v = a.read_all().await.unwrap().version;
    assert_eq!(v.version, 0);
    assert!(a.insert_row(&e, &v.next()).await.unwrap());
    let s = a.read_all().await.unwrap();
    assert_eq!(
        one_row(&s).entry,
        e,
        "a re-inserted entry must not inherit old heartbeats"
    );
    assert_eq!(s.version.version, 1);
}

/// `initialize` is idempotent and safe when many silos call it at once.
pub async fn concurrent_initialize_is_idempotent<H: Harness + ?Sized>(h: &H) {
    let id = fresh_cluster_id("init");
    let t = h.table(&id).await;
    let calls = (0..10).map(|_| {
        let t = Arc::clone(&t);
        tokio::spawn(async move { t.initialize(true).await.unwrap() })
    });
    futures_join(calls).await;
    let v = t.read_all().await.unwrap().version;
    assert_eq!(v.version, 0);
    let e = new_entry(Timestamp::now());
    assert!(t.insert_row(&e, &v.next()).await.unwrap());
    t.initialize(true).await.unwrap();
    let s = t.read_all().await.unwrap();
    assert_eq!(
        s.version.version, 1,
        "initialize must not reset an existing version"
    );
    assert_eq!(s.rows.len(), 1);
}

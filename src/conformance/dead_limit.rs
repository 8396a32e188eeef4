//! The conformance cases on `max_defunct_silo_entries` (Orleans' `MaxDefunctSiloEntries`): the
//! runtime's rule, [`remove_excess_dead_entries`], applied through the contract's `read_all`
//! and `cleanup_dead_entries`, gives the same table on every backend.

use std::collections::BTreeSet;
use std::time::Duration;

use super::harness::{Harness, WithStatus, fresh, new_entry};
use crate::model::{MembershipEntry, SiloAddress, SiloStatus, SuspectTime, Timestamp};
use crate::runtime::remove_excess_dead_entries;
use crate::table::MembershipTable;

const HOUR: Duration = Duration::from_secs(3600);

async fn insert(t: &dyn MembershipTable, e: &MembershipEntry) {
    let v = t.read_all().await.unwrap().version;
    assert!(
        t.insert_row(e, &v.next()).await.unwrap(),
        "insert {}",
        e.address
    );
}

async fn addresses(t: &dyn MembershipTable) -> BTreeSet<SiloAddress> {
    t.read_all()
        .await
        .unwrap()
        .rows
        .iter()
        .map(|r| r.entry.address)
        .collect()
}

/// Beyond the limit, the oldest Dead entries go and only they: a Joining, ShuttingDown or Active
/// entry stays however old it is (Orleans' rule is a `CleanupDefunctSiloEntries` cutoff that
/// also takes every non-Active entry older than it; a burst of recent deaths puts that cutoff a
/// moment ago, where silos that are starting or stopping right now are — the age limit, not
/// this one, removes old non-Dead entries). The version does not move. Within the limit nothing
/// is removed; a limit of 0 removes every Dead entry.
pub async fn excess_dead_entries_go_oldest_first<H: Harness + ?Sized>(h: &H) {
    let t = fresh(h, "dead-limit").await;
    let now = Timestamp::now();
    let old = now.saturating_sub(10 * 24 * HOUR);
    let dead: Vec<_> = (1..=5u32)
        .map(|n| new_entry(old.saturating_add(n * HOUR)).with_status(SiloStatus::Dead))
        .collect();
    let old_joining = new_entry(old).with_status(SiloStatus::Joining);
    let new_joining = new_entry(now).with_status(SiloStatus::Joining);
    let old_active = new_entry(old).with_status(SiloStatus::Active);
    let old_stopping = new_entry(old).with_status(SiloStatus::ShuttingDown);
    for e in dead
        .iter()
        .chain([&old_joining, &new_joining, &old_active, &old_stopping])
    {
        insert(t.as_ref(), e).await;
    }
    let version = t.read_all().await.unwrap().version;
    let removed = remove_excess_dead_entries(t.as_ref(), 2).await.unwrap();
    assert_eq!(removed, 3, "the 3 oldest Dead entries");
    let live = [
        old_joining.address,
        new_joining.address,
        old_active.address,
        old_stopping.address,
    ];
    let expected: BTreeSet<_> = [dead[3].address, dead[4].address]
        .into_iter()
        .chain(live)
        .collect();
    assert_eq!(addresses(t.as_ref()).await, expected);
    assert_eq!(t.read_all().await.unwrap().version, version);
    assert_eq!(
        remove_excess_dead_entries(t.as_ref(), 2).await.unwrap(),
        0,
        "within the limit"
    );
    assert_eq!(remove_excess_dead_entries(t.as_ref(), 0).await.unwrap(), 2);
    let expected: BTreeSet<_> = live.into_iter().collect();
    assert_eq!(
        addresses(t.as_ref()).await,
        expected,
        "a limit of 0 removes every Dead entry and nothing else"
    );
}

/// Dead entries rank by their effective update time — the latest of start, I-am-alive (a
/// heartbeat written with `update_i_am_alive` included) and suspicion votes — so a silo just
/// declared dead, or one that heartbeated late, is not pruned first.
pub async fn dead_entries_rank_by_their_latest_sign_of_life<H: Harness + ?Sized>(h: &H) {
    let t = fresh(h, "dead-limit-rank").await;
    let now = Timestamp::now();
    let newer_alive = new_entry(now.saturating_sub(2 * HOUR)).with_status(SiloStatus::Dead);
    let mut voted = new_entry(now.saturating_sub(10 * HOUR)).with_status(SiloStatus::Dead);
    voted.suspect_times.push(SuspectTime {
        suspecting_silo: newer_alive.address,
        time: now.saturating_sub(HOUR),
    });
    let heartbeated = new_entry(now.saturating_sub(12 * HOUR)).with_status(SiloStatus::Dead);
    for e in [&newer_alive, &voted, &heartbeated] {
        insert(t.as_ref(), e).await;
    }
    t.update_i_am_alive(&heartbeated.address, now.saturating_sub(HOUR / 2))
        .await
        .unwrap();
    assert_eq!(remove_excess_dead_entries(t.as_ref(), 2).await.unwrap(), 1);
    let expected: BTreeSet<_> = [voted.address, heartbeated.address].into();
    assert_eq!(
        addresses(t.as_ref()).await,
        expected,
        "the entry with the oldest sign of life goes, whatever its I-am-alive time alone says"
    );
}

/// The cutoff is a time (the newest removed entry's, plus one millisecond): Dead entries at the
/// same millisecond as the newest one removed go with it, so fewer than the limit may remain —
/// exactly what Orleans' rule does at its tick resolution.
pub async fn dead_entries_tied_at_the_limit_go_together<H: Harness + ?Sized>(h: &H) {
    let t = fresh(h, "dead-limit-tie").await;
    let now = Timestamp::now();
    let newest = new_entry(now.saturating_sub(HOUR)).with_status(SiloStatus::Dead);
    let tied = now.saturating_sub(2 * HOUR);
    let a = new_entry(tied).with_status(SiloStatus::Dead);
    let mut b = new_entry(tied).with_status(SiloStatus::Dead);
    b.start_time = a.start_time;
    b.i_am_alive_time = a.i_am_alive_time;
    for e in [&newest, &a, &b] {
        insert(t.as_ref(), e).await;
    }
    assert_eq!(remove_excess_dead_entries(t.as_ref(), 2).await.unwrap(), 2);
    assert_eq!(addresses(t.as_ref()).await, [newest.address].into());
}

//! Nothing is left behind and no stored value breaks anything: `delete_cluster` removes every
//! row and the statics, cleanup removes orphaned heartbeat elements whoever wrote them, and times
//! far out of range neither panic nor give TTLs Cassandra rejects.

use std::time::Duration;

use cassandra_membership::conformance::new_entry;
use cassandra_membership::{
    MembershipError, MembershipTable, SiloStatus, Timestamp, TtlMismatchPolicy,
};
use scylla::value::CqlTimestamp;

use super::{
    WRITE_TTL, heartbeat_keys, insert, opts, plant_row, raw_partition, table_name, ttl_on, ttls,
};
use crate::utils::{KEYSPACE, session_with_keyspace, table_on, unique};

/// `delete_cluster` removes damaged, marker-only and non-canonical rows too, and a damaged
/// version does not make it fail.
#[tokio::test]
async fn delete_cluster_removes_every_row_and_the_statics_even_with_a_damaged_version() {
    let s = session_with_keyspace().await;
    let table = table_name();
    let cluster = unique("delete");
    let t = table_on(&s, opts(&table, "svc", &cluster));
    t.initialize(true).await.unwrap();
    let e = new_entry(Timestamp::now());
    insert(&t, &e).await;
    t.update_i_am_alive(&e.address, Timestamp::now())
        .await
        .unwrap();
    let now = Timestamp::now().as_millis();
    plant_row(&s, &table, "svc", &cluster, "127.0.0.1:1@1", 42, now, 0).await;
    plant_row(&s, &table, "svc", &cluster, "127.0.0.1:2@0002", 3, now, 0).await;
    s.query_unpaged(
        format!("INSERT INTO {KEYSPACE}.{table} (service_id, cluster_id, silo) VALUES ('svc', ?, '127.0.0.1:3@3')"),
        (&cluster,),
    )
    .await
    .unwrap();
    // The version's row, the entry inserted above and the three planted ones.
    assert_eq!(raw_partition(&s, &table, "svc", &cluster).await, 5);
    t.delete_cluster(&cluster).await.unwrap();
    assert_eq!(
        raw_partition(&s, &table, "svc", &cluster).await,
        0,
        "nothing of the cluster is left"
    );
    t.initialize(true).await.unwrap();
    assert!(t.read_all().await.unwrap().rows.is_empty());
    // A damaged version: negative, then without its tag.
    for damage in [
        "UPDATE {t} SET version = -5 WHERE service_id = 'svc' AND cluster_id = ? AND silo = ''",
        "UPDATE {t} SET version_etag = null WHERE service_id = 'svc' AND cluster_id = ? AND silo = ''",
    ] {
        insert(&t, &new_entry(Timestamp::now())).await;
        s.query_unpaged(
            damage.replace("{t}", &format!("{KEYSPACE}.{table}")),
            (&cluster,),
        )
        .await
        .unwrap();
        assert!(matches!(
            t.read_all().await,
            Err(MembershipError::CorruptData { .. })
        ));
        t.delete_cluster(&cluster)
            .await
            .expect("a damaged version can be deleted");
        assert_eq!(raw_partition(&s, &table, "svc", &cluster).await, 0);
        t.initialize(true).await.unwrap();
        assert_eq!(t.read_all().await.unwrap().version.version, 0);
    }
}

/// Cleanup removes heartbeat elements written by another program, or stamped `i64::MIN`, and
/// they do not make it fail.
#[tokio::test]
async fn cleanup_removes_any_orphaned_heartbeat_element_whoever_wrote_it() {
    let s = session_with_keyspace().await;
    let table = table_name();
    let cluster = unique("elements");
    let t = table_on(&s, opts(&table, "svc", &cluster));
    t.initialize(true).await.unwrap();
    let old = Timestamp::now().as_millis() - 60_000;
    for (key, time) in [("127.0.0.1:9@9", old), ("127.0.0.1:8@8", i64::MIN)] {
        // Written "now" (the coordinator's timestamp), with an old I-am-alive time in it.
        s.query_unpaged(
            format!("UPDATE {KEYSPACE}.{table} SET heartbeat = (?, ?) WHERE service_id = 'svc' AND cluster_id = ? AND silo = ?"),
            (CqlTimestamp(old), CqlTimestamp(time), &cluster, key),
        )
        .await
        .unwrap();
    }
    t.cleanup_defunct(Timestamp::now())
        .await
        .expect("one damaged element must not make cleanup fail");
    let left = heartbeat_keys(&s, &table, &cluster).await;
    assert!(left.is_empty(), "orphaned elements left: {left:?}");
}

/// After a patch re-stamped a Dead entry's heartbeat element, cleanup can remove it.
#[tokio::test]
async fn cleanup_removes_elements_a_patch_restamped() {
    let s = session_with_keyspace().await;
    let table = table_name();
    let cluster = unique("restamp");
    let legacy = table_on(&s, opts(&table, "svc", &cluster));
    legacy.initialize(true).await.unwrap();
    let mut e = new_entry(Timestamp::now());
    insert(&legacy, &e).await;
    legacy
        .update_i_am_alive(&e.address, Timestamp::now())
        .await
        .unwrap();
    let snap = legacy.read_row(&e.address).await.unwrap();
    e = snap.rows[0].entry.clone();
    e.status = SiloStatus::Dead;
    assert!(
        legacy
            .update_row(&e, &snap.rows[0].etag, &snap.version.next())
            .await
            .unwrap()
    );
    // A TTL the test cannot outlive: with the suite's 4 s, a busy machine let the patched row
    // expire by itself before the cleanup ran (which then had nothing to remove).
    let mut patching = ttl_on(opts(&table, "svc", &cluster)).ttl_mismatch(TtlMismatchPolicy::Patch);
    patching.membership.defunct_silo_expiration = Duration::from_secs(120);
    let patched = table_on(&s, patching);
    patched.initialize(true).await.unwrap();
    // Back to expiry off: the cleanup deletes the Dead entry and its element.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(legacy.cleanup_defunct(Timestamp::now()).await.unwrap(), 1);
    let elements = heartbeat_keys(&s, &table, &cluster).await;
    assert!(
        elements.is_empty(),
        "the re-stamped element was removed: {elements:?}"
    );
}

/// Stored times far out of range neither panic nor produce a TTL Cassandra rejects.
#[tokio::test]
async fn stored_times_out_of_range_never_panic_or_give_invalid_ttls() {
    let s = session_with_keyspace().await;
    let table = table_name();
    let year_2100 = 4_102_444_800_000;
    for policy in [
        TtlMismatchPolicy::Throw,
        TtlMismatchPolicy::Allow,
        TtlMismatchPolicy::Patch,
    ] {
        let cluster = unique("times");
        let legacy = table_on(
            &s,
            opts(&table, "svc", &cluster).ttl_mismatch(TtlMismatchPolicy::Allow),
        );
        legacy.initialize(true).await.unwrap();
        plant_row(&s, &table, "svc", &cluster, "127.0.0.1:1@1", 3, i64::MAX, 0).await;
        plant_row(&s, &table, "svc", &cluster, "127.0.0.1:2@2", 3, i64::MIN, 0).await;
        plant_row(
            &s,
            &table,
            "svc",
            &cluster,
            "127.0.0.1:3@3",
            6,
            year_2100,
            0,
        )
        .await;
        let t = table_on(
            &s,
            ttl_on(opts(&table, "svc", &cluster)).ttl_mismatch(policy),
        );
        let result = t.initialize(true).await;
        match policy {
            TtlMismatchPolicy::Throw => {
                assert!(
                    matches!(result, Err(MembershipError::TtlMismatch { .. })),
                    "{result:?}"
                )
            }
            _ => result.unwrap_or_else(|e| panic!("{policy:?}: {e:?}")),
        }
        let (rows, _) = ttls(&s, &table, "svc", &cluster).await;
        for (silo, ttl) in rows {
            assert!(
                ttl.is_none_or(|t| (1..=WRITE_TTL).contains(&t)),
                "{silo}: {ttl:?}"
            );
        }
    }
}

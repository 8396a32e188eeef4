//! Silos of one cluster on different settings: rolling changes of `ttl` (off → on, on → off)
//! lose no entry and keep the version, a write never shortens a TTL another silo relies on, and
//! a silo with expiry off takes back a TTL an older release gave its row or the version.

use std::sync::Arc;
use std::time::Duration;

use cassandra_membership::conformance::new_entry;
use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, HeartbeatOutcome, MembershipEntry,
    MembershipOptions, MembershipTable, SiloStatus, SuspectTime, Timestamp, TtlMismatchPolicy,
};
use scylla::client::session::Session;

use super::{
    TTL, WRITE_TTL, heartbeater, insert, opts, plant_row, table_name, ttl_on, ttls, watch_entries,
};
use crate::utils::{KEYSPACE, session_with_keyspace, table_on, unique};

/// A rolling change off → on (and the version half of the contract): the new silo stops while
/// the old ones keep running for longer than the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rolling_change_off_to_on_loses_no_entry_and_keeps_the_version() {
    let s = session_with_keyspace().await;
    let table = table_name();
    let cluster = unique("off-on");
    let old = Arc::new(table_on(&s, opts(&table, "svc", &cluster)));
    old.initialize(true).await.unwrap();
    let (o1, o2) = (new_entry(Timestamp::now()), new_entry(Timestamp::now()));
    insert(old.as_ref(), &o1).await;
    insert(old.as_ref(), &o2).await;
    let beats = [
        heartbeater(Arc::clone(&old), o1.clone()),
        heartbeater(Arc::clone(&old), o2.clone()),
    ];
    // A new silo of the same cluster starts with expiry on and patch.
    let new = Arc::new(table_on(
        &s,
        ttl_on(opts(&table, "svc", &cluster)).ttl_mismatch(TtlMismatchPolicy::Patch),
    ));
    new.initialize(true).await.unwrap();
    let n1 = new_entry(Timestamp::now());
    insert(new.as_ref(), &n1).await;
    let new_beat = heartbeater(Arc::clone(&new), n1.clone());
    // The new silo votes against an old one: a membership write on a row it does not renew.
    // (o1 heartbeats: a vote decided on a read before one of its heartbeats loses; read again.)
    let mut voted_once = false;
    for _ in 0..20 {
        let snap = new.read_row(&o1.address).await.unwrap();
        let mut voted = snap.rows[0].entry.clone();
        voted.suspect_times.push(cassandra_membership::SuspectTime {
            suspecting_silo: n1.address,
            time: Timestamp::now(),
        });
        if new
            .update_row(&voted, &snap.rows[0].etag, &snap.version.next())
            .await
            .unwrap()
        {
            voted_once = true;
            break;
        }
    }
    assert!(voted_once, "the vote never applied in 20 rounds");
    let v = watch_entries(&new, &[&o1, &o2, &n1], Duration::from_secs(3 * TTL + 1), 0).await;
    // The new silo stops; the old ones keep running for longer than the TTL.
    new_beat.abort();
    let v2 = watch_entries(
        &old,
        &[&o1, &o2],
        Duration::from_secs(2 * WRITE_TTL as u64),
        v,
    )
    .await;
    assert!(v2 >= v);
    // The version is intact: the next insert continues it instead of restarting at 1.
    let before = old.read_all().await.unwrap().version.version;
    assert!(before >= 4, "the version restarted: {before}");
    insert(old.as_ref(), &new_entry(Timestamp::now())).await;
    assert_eq!(old.read_all().await.unwrap().version.version, before + 1);
    for b in beats {
        b.abort();
    }
}

/// The contract's other direction: on → off; a silo with expiry off joins a cluster of silos
/// with expiry on, which vote on its row; then they stop and it keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rolling_change_on_to_off_loses_no_entry_and_keeps_the_version() {
    let s = session_with_keyspace().await;
    let table = table_name();
    let cluster = unique("on-off");
    let on = Arc::new(table_on(&s, ttl_on(opts(&table, "svc", &cluster))));
    on.initialize(true).await.unwrap();
    let n1 = new_entry(Timestamp::now());
    insert(on.as_ref(), &n1).await;
    let on_beat = heartbeater(Arc::clone(&on), n1.clone());
    let off = Arc::new(table_on(
        &s,
        opts(&table, "svc", &cluster).ttl_mismatch(TtlMismatchPolicy::Allow),
    ));
    off.initialize(true).await.unwrap();
    let o1 = new_entry(Timestamp::now());
    insert(off.as_ref(), &o1).await;
    let off_beat = heartbeater(Arc::clone(&off), o1.clone());
    // Let the silo with expiry on renew at least once, then vote on the new silo's row.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // A write decided on a read loses to a heartbeat of that row in between: read again.
    let mut voted_once = false;
    for _ in 0..20 {
        let snap = on.read_row(&o1.address).await.unwrap();
        let mut voted = snap.rows[0].entry.clone();
        voted.status = SiloStatus::Active;
        if on
            .update_row(&voted, &snap.rows[0].etag, &snap.version.next())
            .await
            .unwrap()
        {
            voted_once = true;
            break;
        }
    }
    assert!(voted_once, "the vote never applied in 20 rounds");
    let v = watch_entries(&off, &[&o1, &n1], Duration::from_secs(3 * TTL + 1), 0).await;
    on_beat.abort();
    watch_entries(&off, &[&o1], Duration::from_secs(2 * WRITE_TTL as u64), v).await;
    let before = off.read_all().await.unwrap().version.version;
    assert!(before >= 3, "the version restarted: {before}");
    insert(off.as_ref(), &new_entry(Timestamp::now())).await;
    assert_eq!(off.read_all().await.unwrap().version.version, before + 1);
    off_beat.abort();
}

/// Expiry on with a TTL of `secs` (renewal every `secs / 10`).
fn ttl_of(o: CassandraClusteringOptions, secs: u64) -> CassandraClusteringOptions {
    let mut m = MembershipOptions::default();
    m.defunct_silo_expiration = Duration::from_secs(secs);
    m.i_am_alive_table_publish_timeout = Duration::from_millis(500);
    o.ttl(true).membership(m)
}

/// A suspicion vote of `voter` on `target`'s row: a membership write on a row it does not renew.
async fn vote(t: &CassandraMembershipTable, target: &MembershipEntry, voter: &MembershipEntry) {
    for _ in 0..20 {
        let snap = t.read_row(&target.address).await.unwrap();
        let mut voted = snap.rows[0].entry.clone();
        voted.suspect_times.push(SuspectTime {
            suspecting_silo: voter.address,
            time: Timestamp::now(),
        });
        if t.update_row(&voted, &snap.rows[0].etag, &snap.version.next())
            .await
            .unwrap()
        {
            return;
        }
    }
    panic!("the vote kept losing races");
}

/// The version's TTL is at least every row's (read in one query: same clock, same instant).
async fn assert_version_outlives_rows(s: &Session, table: &str, cluster: &str, when: &str) {
    let (rows, version) = ttls(s, table, "svc", cluster).await;
    let longest = rows.iter().filter_map(|(_, t)| *t).max().unwrap_or(0);
    assert!(
        rows.iter().all(|(_, t)| t.is_some()),
        "{when}: rows {rows:?}"
    );
    assert!(
        version.is_none_or(|v| v >= longest),
        "{when}: the version (TTL {version:?}) would expire before a row: {rows:?}"
    );
}

/// A silo with a shorter TTL (a rolling change of DefunctSiloExpiration to a shorter one) that
/// votes on the row of a silo with a longer TTL does not give it its own, shorter TTL (the row
/// would expire before its silo's next renewal); and no row, not even one with a TTL within the
/// tolerance above the write TTL, outlives the version.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_never_shortens_a_row_or_the_version_ttl() {
    let s = session_with_keyspace().await;
    let table = table_name();
    let cluster = unique("shorter");
    // Y: TTL 100 s, renews every 10 s with TTL 111 s.
    let y = Arc::new(table_on(&s, ttl_of(opts(&table, "svc", &cluster), 100)));
    y.initialize(true).await.unwrap();
    let ey = new_entry(Timestamp::now());
    insert(y.as_ref(), &ey).await;
    let y_beat = heartbeater(Arc::clone(&y), ey.clone());
    // X: TTL 4 s (writes 6 s); `allow`, since Y's row carries a longer TTL.
    let x = Arc::new(table_on(
        &s,
        ttl_on(opts(&table, "svc", &cluster)).ttl_mismatch(TtlMismatchPolicy::Allow),
    ));
    x.initialize(true).await.unwrap();
    let ex = new_entry(Timestamp::now());
    insert(x.as_ref(), &ex).await;
    let x_beat = heartbeater(Arc::clone(&x), ex.clone());
    vote(&x, &ey, &ex).await;
    let (rows, _) = ttls(&s, &table, "svc", &cluster).await;
    let y_ttl = rows
        .iter()
        .find(|(silo, _)| *silo == ey.address.to_string())
        .and_then(|(_, t)| *t);
    assert!(
        y_ttl.is_some_and(|t| t > 90),
        "X's vote cut Y's row TTL to {y_ttl:?}"
    );
    assert_version_outlives_rows(&s, &table, &cluster, "after the vote").await;
    // Y renews only every 10 s: its entry must not expire in between.
    watch_entries(&x, &[&ey, &ex], Duration::from_secs(3 * TTL + 1), 0).await;
    y_beat.abort();
    x_beat.abort();

    // A row whose TTL reads one second above the write TTL (written through a node ahead, within
    // the tolerance): the version must outlive it all the same. A table value learns the longest
    // row TTL from its audit at `initialize` and from its renewals' scans.
    let cluster = unique("tolerance");
    // `allow`: the table default is Y's.
    let first = table_on(
        &s,
        ttl_on(opts(&table, "svc", &cluster)).ttl_mismatch(TtlMismatchPolicy::Allow),
    );
    first.initialize(true).await.unwrap();
    let e = new_entry(Timestamp::now());
    insert(&first, &e).await;
    let planted = |silo: &'static str| {
        let (s, table, cluster) = (Arc::clone(&s), table.clone(), cluster.clone());
        async move {
            let now = Timestamp::now().as_millis();
            plant_row(&s, &table, "svc", &cluster, silo, 3, now, WRITE_TTL + 1).await;
        }
    };
    planted("127.0.0.1:1@1").await;
    let t = table_on(
        &s,
        ttl_on(opts(&table, "svc", &cluster)).ttl_mismatch(TtlMismatchPolicy::Allow),
    );
    t.initialize(true).await.unwrap();
    let snap = t.read_row(&e.address).await.unwrap();
    let mut updated = snap.rows[0].entry.clone();
    updated.i_am_alive_time = Timestamp::now();
    assert!(
        t.update_row(&updated, &snap.rows[0].etag, &snap.version.next())
            .await
            .unwrap()
    );
    assert_version_outlives_rows(&s, &table, &cluster, "after an update").await;
    // A renewal's scan sees a row planted since.
    planted("127.0.0.1:2@2").await;
    let renewing = table_on(
        &s,
        ttl_on(opts(&table, "svc", &cluster)).ttl_mismatch(TtlMismatchPolicy::Allow),
    );
    renewing.initialize(true).await.unwrap();
    planted("127.0.0.1:3@3").await;
    assert!(matches!(
        renewing
            .update_i_am_alive(&e.address, Timestamp::now())
            .await
            .unwrap(),
        HeartbeatOutcome::Refreshed { .. }
    ));
    assert_version_outlives_rows(&s, &table, &cluster, "after a renewal").await;
}

/// What a previous release with expiry on did to another silo's row when it voted on it, and to
/// the version when it left: rewrote them unchanged, with its TTL.
async fn old_release_stamps_row_and_version(
    s: &Session,
    table: &str,
    cluster: &str,
    silo: &str,
    ttl: i32,
) {
    // The entry's row and the version's row ('').
    for (columns, key) in [("entry", silo), ("version, version_etag", "")] {
        let json: (String,) = s
            .query_unpaged(
                format!(
                    "SELECT JSON service_id, cluster_id, silo, {columns} \
                     FROM {KEYSPACE}.{table} WHERE service_id = 'svc' AND cluster_id = ? AND silo = ?"
                ),
                (cluster, key),
            )
            .await
            .unwrap()
            .into_rows_result()
            .unwrap()
            .single_row()
            .unwrap();
        s.query_unpaged(
            format!("INSERT INTO {KEYSPACE}.{table} JSON ? DEFAULT UNSET USING TTL ?"),
            (json.0, ttl),
        )
        .await
        .unwrap();
    }
}

/// A silo with expiry off looks at its own row's and the version's TTL: a previous-release silo
/// with expiry on (which writes its TTL on every row it votes on, and on the version) must not
/// make a live entry or the version expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_expiry_off_silo_takes_back_a_ttl_an_older_release_gave_its_row_and_the_version() {
    let s = session_with_keyspace().await;
    let table = table_name();
    let cluster = unique("off-old");
    let on = Arc::new(table_on(&s, ttl_on(opts(&table, "svc", &cluster))));
    on.initialize(true).await.unwrap();
    let n1 = new_entry(Timestamp::now());
    insert(on.as_ref(), &n1).await;
    let on_beat = heartbeater(Arc::clone(&on), n1.clone());
    // The rolling change flips `ttl` only: the same DefunctSiloExpiration, so the silo with
    // expiry off checks its row every renewal interval (TTL / 10) as well.
    let off = Arc::new(table_on(
        &s,
        ttl_on(opts(&table, "svc", &cluster))
            .ttl(false)
            .ttl_mismatch(TtlMismatchPolicy::Allow),
    ));
    off.initialize(true).await.unwrap();
    let o1 = new_entry(Timestamp::now());
    insert(off.as_ref(), &o1).await;
    let off_beat = heartbeater(Arc::clone(&off), o1.clone());
    old_release_stamps_row_and_version(&s, &table, &cluster, &o1.address.to_string(), WRITE_TTL)
        .await;
    let v = watch_entries(&off, &[&o1, &n1], Duration::from_secs(3 * TTL + 1), 0).await;
    on_beat.abort();
    // The old release leaves: its last write stamps the version (and the row) once more.
    old_release_stamps_row_and_version(&s, &table, &cluster, &o1.address.to_string(), WRITE_TTL)
        .await;
    watch_entries(&off, &[&o1], Duration::from_secs(2 * WRITE_TTL as u64), v).await;
    let (rows, version) = ttls(&s, &table, "svc", &cluster).await;
    let o1_ttl = rows
        .iter()
        .find(|(silo, _)| *silo == o1.address.to_string())
        .and_then(|(_, t)| *t);
    assert_eq!(o1_ttl, None, "the expiry-off silo's row keeps no TTL");
    assert_eq!(version, None, "the version keeps no TTL");
    let before = off.read_all().await.unwrap().version.version;
    assert!(before >= 2, "the version restarted: {before}");
    insert(off.as_ref(), &new_entry(Timestamp::now())).await;
    assert_eq!(off.read_all().await.unwrap().version.version, before + 1);
    off_beat.abort();
}

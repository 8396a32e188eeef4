//! rio's storage contract on the real node, as rio's own backend tests exercise it (our own
//! tests), plus what the table adds: incarnations, isolation of clusters, expiry.
//!
//! The node is at `CASSANDRA_CONTACT_POINTS` (default 127.0.0.1:9042); these tests never skip.
//! Keyspace `cm_rio_test` (`CM_RIO_TEST_KEYSPACE` at build time), a unique cluster per test.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, MembershipOptions, MembershipTable,
    SiloStatus,
};
use cassandra_membership_rio::{CassandraMembershipStorage, RioStorageOptions};
use chrono::Utc;
use rio_rs::cluster::storage::{Member, MembershipStorage};

const KEYSPACE: &str = match option_env!("CM_RIO_TEST_KEYSPACE") {
    Some(k) => k,
    None => "cm_rio_test",
};
const SERVICE: &str = "rio-test";
const TTL: Duration = Duration::from_secs(5);
const HEARTBEAT: Duration = Duration::from_secs(1);

fn contact_points() -> Vec<String> {
    std::env::var("CASSANDRA_CONTACT_POINTS")
        .unwrap_or_else(|_| "127.0.0.1:9042".into())
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

fn options(table: &str, cluster: &str) -> CassandraClusteringOptions {
    CassandraClusteringOptions::default()
        .keyspace(KEYSPACE)
        .service_id(SERVICE)
        .cluster_id(cluster)
        .contact_points(contact_points())
        .table(table)
        .create_keyspace_simple(1)
        .request_timeout(Duration::from_secs(30))
}

/// TTL 5 s, heartbeats every second: a member is gone (hidden) 3 s after its last heartbeat.
fn ttl_options(cluster: &str) -> CassandraClusteringOptions {
    let mut m = MembershipOptions::default();
    m.defunct_silo_expiration = TTL;
    m.i_am_alive_table_publish_timeout = HEARTBEAT;
    options("rio_members_ttl5", cluster).ttl(true).membership(m)
}

async fn storage(cluster: &str) -> CassandraMembershipStorage {
    connect(options("rio_members", cluster)).await
}

async fn connect(o: CassandraClusteringOptions) -> CassandraMembershipStorage {
    let points = o.contact_points.clone();
    CassandraMembershipStorage::connect(o).await.unwrap_or_else(|e| {
        panic!(
            "cannot use Cassandra at {points:?}: {e}. Start a node with `scripts/cassandra.sh start` \
             or run `scripts/test.sh`; set CASSANDRA_CONTACT_POINTS for another node."
        )
    })
}

fn member(port: u16, active: bool) -> Member {
    let mut m = Member::new("127.0.0.1".into(), port.to_string());
    m.set_active(active);
    m
}

fn table(s: &CassandraMembershipStorage) -> &Arc<dyn MembershipTable> {
    s.table()
}

/// Rows of the cluster's partition as stored, bypassing the adapter and the table.
async fn raw_rows(table: &str, cluster: &str) -> usize {
    let t = CassandraMembershipTable::connect(options(table, cluster))
        .await
        .unwrap();
    t.session()
        .query_unpaged(
            format!("SELECT silo, version FROM {KEYSPACE}.{table} WHERE service_id = ? AND cluster_id = ?"),
            (SERVICE, cluster),
        )
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .rows_num()
}

async fn raw_rows_of(table: &str, cluster: &str, silo: &str) -> usize {
    let t = CassandraMembershipTable::connect(options(table, cluster))
        .await
        .unwrap();
    t.session()
        .query_unpaged(
            format!("SELECT silo FROM {KEYSPACE}.{table} WHERE service_id = ? AND cluster_id = ? AND silo = ?"),
            (SERVICE, cluster, silo),
        )
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .rows_num()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_cluster_is_empty_and_a_pushed_member_is_listed() {
    let s = storage(&unique("empty")).await;
    assert!(s.members().await.unwrap().is_empty());
    s.push(member(9090, false)).await.unwrap();
    let members = s.members().await.unwrap();
    assert_eq!(members.len(), 1);
    assert_eq!(
        (members[0].ip(), members[0].port(), members[0].active()),
        ("127.0.0.1", "9090", false)
    );
    assert!(s.active_members().await.unwrap().is_empty());
    let address = s
        .incarnation("127.0.0.1", "9090")
        .expect("kept alive by this value");
    let row = table(&s).read_row(&address).await.unwrap();
    assert_eq!(row.rows[0].entry.status, SiloStatus::Joining);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_is_read_through_the_storage_cluster_view_which_a_host_can_follow() {
    let cluster = unique("view");
    let s = storage(&cluster).await;
    let other = storage(&cluster).await;
    let mut view = s.view();
    let before = view.borrow_and_update().clone();
    assert!(before.entries().is_empty());
    // Another server's push, seen by the next members() of this value: fresh, as rio expects.
    other.push(member(9190, true)).await.unwrap();
    let listed = s.members().await.unwrap();
    assert_eq!(listed.len(), 1);
    // The same read is the view: told, one committed version, later than before.
    assert!(view.has_changed().unwrap());
    let after = view.borrow_and_update().clone();
    let address = other.incarnation("127.0.0.1", "9190").unwrap();
    assert!(after.is_member(&address));
    assert!(after.version().version > before.version().version);
    assert_eq!(
        after.version(),
        &table(&s).read_all().await.unwrap().version,
        "the view is the table's current version"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_active_and_set_inactive_filter_active_members() {
    let s = storage(&unique("active")).await;
    s.push(member(9090, false)).await.unwrap();
    s.push(member(9091, true)).await.unwrap();
    assert_eq!(s.active_members().await.unwrap().len(), 1);
    s.set_active("127.0.0.1", "9090").await.unwrap();
    assert_eq!(s.active_members().await.unwrap().len(), 2);
    assert!(s.is_active("127.0.0.1", "9090").await.unwrap());
    let version = table(&s).read_all().await.unwrap().version.version;
    s.set_active("127.0.0.1", "9090").await.unwrap();
    assert_eq!(
        table(&s).read_all().await.unwrap().version.version,
        version,
        "no write when nothing changes"
    );
    s.set_inactive("127.0.0.1", "9090").await.unwrap();
    s.set_inactive("127.0.0.1", "9091").await.unwrap();
    assert!(s.active_members().await.unwrap().is_empty());
    assert_eq!(
        s.members().await.unwrap().len(),
        2,
        "inactive members stay listed"
    );
    assert!(!s.is_active("127.0.0.1", "9090").await.unwrap());
    // An address without an entry: nothing to change, nothing created.
    s.set_active("127.0.0.1", "9999").await.unwrap();
    assert_eq!(s.members().await.unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_recorded_and_listed_per_member() {
    let s = storage(&unique("failures")).await;
    s.push(member(9090, true)).await.unwrap();
    s.push(member(9091, true)).await.unwrap();
    assert!(
        s.member_failures("127.0.0.1", "9090")
            .await
            .unwrap()
            .is_empty()
    );
    let t0 = Utc::now() - chrono::Duration::milliseconds(1);
    s.notify_failure("127.0.0.1", "9090").await.unwrap();
    s.notify_failure("127.0.0.1", "9090").await.unwrap();
    s.notify_failure("127.0.0.1", "9091").await.unwrap();
    let t1 = Utc::now();
    let a = s.member_failures("127.0.0.1", "9090").await.unwrap();
    let b = s.member_failures("127.0.0.1", "9091").await.unwrap();
    assert_eq!((a.len(), b.len()), (2, 1));
    assert!(
        a.iter().chain(&b).all(|t| *t >= t0 && *t <= t1),
        "{a:?} {b:?} not in [{t0}, {t1}]"
    );
    assert!(a[0] <= a[1], "oldest first");
    // A failure notice does not change activity (rio's contract).
    assert_eq!(s.active_members().await.unwrap().len(), 2);
    // They are the entry's suspicions, naming the observer (the first member this value pushed).
    let address = s.incarnation("127.0.0.1", "9090").unwrap();
    let row = table(&s).read_row(&address).await.unwrap();
    let suspicions = &row.rows[0].entry.suspect_times;
    assert_eq!(suspicions.len(), 2);
    assert!(suspicions.iter().all(|st| st.suspecting_silo == address));
    // An address without an entry has nobody to suspect: nothing is recorded or created.
    s.notify_failure("127.0.0.1", "9999").await.unwrap();
    assert!(
        s.member_failures("127.0.0.1", "9999")
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(s.members().await.unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_kept_per_member_are_bounded_newest_last() {
    let cluster = unique("bounded");
    let o = options("rio_members", &cluster);
    let mut rio = RioStorageOptions::from_membership(&o.membership);
    rio.failures_kept = 3;
    let t = CassandraMembershipTable::connect(o).await.unwrap();
    let s = CassandraMembershipStorage::with_table(Arc::new(t), rio)
        .await
        .unwrap();
    s.push(member(9090, true)).await.unwrap();
    let mut all = Vec::new();
    for _ in 0..5 {
        s.notify_failure("127.0.0.1", "9090").await.unwrap();
        all.push(
            s.member_failures("127.0.0.1", "9090")
                .await
                .unwrap()
                .last()
                .copied()
                .unwrap(),
        );
    }
    assert_eq!(
        s.member_failures("127.0.0.1", "9090").await.unwrap(),
        all[2..].to_vec()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_of_an_address_with_an_entry_starts_a_new_incarnation_and_retires_the_old() {
    let s = storage(&unique("repush")).await;
    s.push(member(9090, true)).await.unwrap();
    s.notify_failure("127.0.0.1", "9090").await.unwrap();
    let first = s.incarnation("127.0.0.1", "9090").unwrap();
    s.push(member(9090, false)).await.unwrap();
    let second = s.incarnation("127.0.0.1", "9090").unwrap();
    assert!(
        second.generation() > first.generation(),
        "{first} then {second}"
    );
    let members = s.members().await.unwrap();
    assert_eq!(members.len(), 1, "one member per address");
    assert!(!members[0].active(), "the new incarnation's flag");
    assert!(
        s.member_failures("127.0.0.1", "9090")
            .await
            .unwrap()
            .is_empty(),
        "failures were the old incarnation's"
    );
    let all = table(&s).read_all().await.unwrap();
    assert_eq!(all.get(&first).unwrap().entry.status, SiloStatus::Dead);
    assert_eq!(all.get(&second).unwrap().entry.status, SiloStatus::Joining);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remove_declares_every_incarnation_of_the_address_dead() {
    let cluster = unique("remove");
    let s = storage(&cluster).await;
    s.push(member(9090, true)).await.unwrap();
    s.push(member(9091, true)).await.unwrap();
    let address = s.incarnation("127.0.0.1", "9090").unwrap();
    s.remove("127.0.0.1", "9090").await.unwrap();
    let members = s.members().await.unwrap();
    assert_eq!(members.len(), 1);
    assert_eq!(members[0].port(), "9091");
    assert_eq!(
        s.incarnation("127.0.0.1", "9090"),
        None,
        "its lease is no longer renewed"
    );
    let all = table(&s).read_all().await.unwrap();
    assert_eq!(all.get(&address).unwrap().entry.status, SiloStatus::Dead);
    // Removing again, or an address never pushed, is a no-op.
    let version = all.version.version;
    s.remove("127.0.0.1", "9090").await.unwrap();
    s.remove("127.0.0.1", "9999").await.unwrap();
    assert_eq!(table(&s).read_all().await.unwrap().version.version, version);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_rio_clusters_in_one_table_do_not_see_each_other() {
    let (a, b) = (
        storage(&unique("iso-a")).await,
        storage(&unique("iso-b")).await,
    );
    a.push(member(9090, true)).await.unwrap();
    b.push(member(9090, false)).await.unwrap();
    b.push(member(9091, true)).await.unwrap();
    a.notify_failure("127.0.0.1", "9090").await.unwrap();
    b.set_inactive("127.0.0.1", "9091").await.unwrap();
    let (ma, mb) = (a.members().await.unwrap(), b.members().await.unwrap());
    assert_eq!(ma.len(), 1);
    assert!(ma[0].active());
    assert_eq!(mb.len(), 2);
    assert!(mb.iter().all(|m| !m.active()));
    assert_eq!(
        a.member_failures("127.0.0.1", "9090").await.unwrap().len(),
        1
    );
    assert!(
        b.member_failures("127.0.0.1", "9090")
            .await
            .unwrap()
            .is_empty()
    );
    b.remove("127.0.0.1", "9090").await.unwrap();
    assert_eq!(
        a.members().await.unwrap().len(),
        1,
        "a remove in b leaves a alone"
    );
}

/// A server's lease is renewed by its own process only: while its storage lives it stays
/// listed (never early, for two TTLs); once every clone is dropped (the server stopped), the
/// whole cluster's partition is gone within TTL + slack with nothing running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_rio_cluster_expires_within_ttl_and_slack() {
    let cluster = unique("expiry");
    let servers = connect(ttl_options(&cluster)).await;
    let observer = connect(ttl_options(&cluster)).await;
    let expiry = servers.table().storage_expiry();
    assert_eq!(expiry.ttl, Some(TTL));
    servers.push(member(9090, true)).await.unwrap();
    servers.push(member(9091, true)).await.unwrap();
    let until = Instant::now() + 2 * TTL;
    while Instant::now() < until {
        assert_eq!(
            observer.members().await.unwrap().len(),
            2,
            "a live server's entry never expires"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    drop(servers); // every clone: the servers are gone
    let stopped = Instant::now();
    drop(observer); // a client reads, it never writes: it keeps nothing alive either
    let bound = TTL + expiry.slack + Duration::from_secs(1);
    let gone_after = loop {
        if raw_rows("rio_members_ttl5", &cluster).await == 0 {
            break stopped.elapsed();
        }
        assert!(
            stopped.elapsed() < bound + Duration::from_secs(3),
            "the cluster never disappeared"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!(
        "stopped rio cluster gone from Cassandra {gone_after:?} after its servers stopped (bound {bound:?})"
    );
    assert!(
        gone_after <= bound + Duration::from_secs(1),
        "{gone_after:?} > {bound:?}"
    );
    assert!(
        gone_after >= TTL - HEARTBEAT - Duration::from_millis(500),
        "expired early: {gone_after:?}"
    );
}

/// The killed server's peers keep failing it (as rio's peer-to-peer provider does every round);
/// those writes stop once it is gone, so storage removes exactly its row while the others run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_expires_while_its_peers_keep_failing_it() {
    let cluster = unique("killed");
    let killed = connect(ttl_options(&cluster)).await;
    let peer = connect(ttl_options(&cluster)).await;
    killed.push(member(9090, true)).await.unwrap();
    peer.push(member(9091, true)).await.unwrap();
    let killed_silo = killed.incarnation("127.0.0.1", "9090").unwrap().to_string();
    let peer_silo = peer.incarnation("127.0.0.1", "9091").unwrap().to_string();
    tokio::time::sleep(HEARTBEAT * 2).await;
    drop(killed);
    let t0 = Instant::now();
    let mut hidden_after = None;
    let gone_after = loop {
        // rio's round: list the others, fail the unreachable one, decide, mark it inactive.
        for m in peer.members().await.unwrap() {
            if m.port() == "9090" {
                peer.notify_failure(m.ip(), m.port()).await.unwrap();
                if peer.member_failures(m.ip(), m.port()).await.unwrap().len() >= 3 {
                    peer.set_inactive(m.ip(), m.port()).await.unwrap();
                }
            }
        }
        if hidden_after.is_none() && peer.members().await.unwrap().len() == 1 {
            hidden_after = Some(t0.elapsed());
        }
        if raw_rows_of("rio_members_ttl5", &cluster, &killed_silo).await == 0 {
            break t0.elapsed();
        }
        let bound =
            3 * HEARTBEAT + TTL + peer.table().storage_expiry().slack + Duration::from_secs(3);
        assert!(
            t0.elapsed() < bound,
            "the killed server's row never expired"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let hidden_after = hidden_after.expect("hidden before its row expired");
    eprintln!(
        "killed server hidden from rio after {hidden_after:?}, its row gone after {gone_after:?}"
    );
    assert!(
        hidden_after <= 3 * HEARTBEAT + Duration::from_secs(2),
        "{hidden_after:?}"
    );
    assert_eq!(
        raw_rows_of("rio_members_ttl5", &cluster, &peer_silo).await,
        1,
        "the live peer stays"
    );
    assert_eq!(peer.members().await.unwrap().len(), 1);
}

//! `migrate_to` run again: after a refusal forged by the proxy at each batch boundary, after the
//! source changed since an earlier copy, with expiry turned on by the new options, and over a
//! target its silos have written. Tables of the 0.2 shape are created and filled by hand, the way
//! the 0.2 provider wrote them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use cassandra_membership::cassandra::{MigrationPlan, MigrationReport, Verification};
use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, MembershipError, MembershipTable,
    SiloStatus, Timestamp, TtlMismatchPolicy,
};
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::errors::DbError;
use scylla::value::CqlTimestamp;
use scylla_proxy::{
    Condition, Reaction, RequestOpcode, RequestReaction, RequestRule, ResponseReaction,
    ResponseRule, RunningProxy,
};
use uuid::Uuid;

use crate::outcomes::start_proxy;
use crate::utils::{KEYSPACE, options, session_with_keyspace};

/// `git show v0.2:cql/create_table.cql`, as cassandra-membership 0.2 created its tables (the
/// fixture the CLI's migrate tests read too).
const OLD_CREATE_TABLE: &str = include_str!("../fixtures/create_table_0_2.cql");

const SERVICE: &str = "test-service";

/// A table name nobody else uses in this run.
fn table_name(prefix: &str) -> String {
    format!("{prefix}_{}", Uuid::new_v4().simple())
}

fn ago(seconds: u64) -> Timestamp {
    Timestamp::now().saturating_sub(Duration::from_secs(seconds))
}

fn micros(t: Timestamp) -> i64 {
    t.as_millis() * 1000
}

/// The address of the `i`-th entry: every address has as many characters, so the rows sort (and
/// are copied) in the order of `i`, and no address is part of another.
fn address(i: u16) -> String {
    format!("10.0.0.1:{}@1", 10000 + i)
}

/// A table of the 0.2 shape, written as the 0.2 provider wrote it.
struct OldTable {
    session: Arc<Session>,
    table: String,
}

impl OldTable {
    async fn create(session: &Arc<Session>) -> Self {
        let table = table_name("old");
        session
            .query_unpaged(
                OLD_CREATE_TABLE.replace("{table}", &format!("{KEYSPACE}.{table}")),
                (),
            )
            .await
            .expect("create the old-shape table");
        session.await_schema_agreement().await.unwrap();
        OldTable {
            session: Arc::clone(session),
            table,
        }
    }

    /// The cluster's version, its tag returned.
    async fn version(&self, cluster: &str, version: i64, ttl: i32, at: Timestamp) -> Uuid {
        let etag = Uuid::new_v4();
        self.session
            .query_unpaged(
                format!(
                    "UPDATE {KEYSPACE}.{} USING TTL ? AND TIMESTAMP ? \
                     SET version = ?, version_etag = ? WHERE service_id = ? AND cluster_id = ?",
                    self.table
                ),
                (ttl, micros(at), version, etag, SERVICE, cluster),
            )
            .await
            .unwrap();
        etag
    }

    /// Entry `i` (see [`address`]), every column in one statement as the 0.2 provider wrote it.
    async fn entry(&self, cluster: &str, i: u16, ttl: i32, at: Timestamp) {
        self.session
            .query_unpaged(
                format!(
                    "UPDATE {KEYSPACE}.{} USING TTL ? AND TIMESTAMP ? SET etag = ?, status = ?, \
                     suspect_times = [], proxy_port = 30000, host_name = 'host', \
                     silo_name = 'silo', role_name = 'role', update_zone = 0, fault_zone = 0, \
                     start_time = ?, i_am_alive = ? \
                     WHERE service_id = ? AND cluster_id = ? AND silo = ?",
                    self.table
                ),
                (
                    ttl,
                    micros(at),
                    Uuid::new_v4(),
                    SiloStatus::Active.code(),
                    CqlTimestamp(at.as_millis()),
                    CqlTimestamp(at.as_millis()),
                    SERVICE,
                    cluster,
                    address(i),
                ),
            )
            .await
            .unwrap();
    }

    /// Entries `range`, all written at `at`.
    async fn entries(&self, cluster: &str, range: std::ops::Range<u16>, ttl: i32, at: Timestamp) {
        for i in range {
            self.entry(cluster, i, ttl, at).await;
        }
    }

    /// The source table value for `cluster` (the options' cluster: the one `initialize` would
    /// audit), with expiry `ttl`.
    fn source(&self, session: &Arc<Session>, cluster: &str, ttl: bool) -> CassandraMembershipTable {
        CassandraMembershipTable::with_session(Arc::clone(session), self.options(cluster).ttl(ttl))
            .expect("valid options")
    }

    fn options(&self, cluster: &str) -> CassandraClusteringOptions {
        options(cluster).table(self.table.clone())
    }
}

/// A session through a new proxy in front of the node.
async fn through_proxy() -> (RunningProxy, Arc<Session>) {
    session_with_keyspace().await;
    let (proxy, proxy_addr, real) = start_proxy().await;
    let session = SessionBuilder::new()
        .known_node_addr(proxy_addr)
        .address_translator(Arc::new(HashMap::from([(real, proxy_addr)])))
        .build()
        .await
        .expect("session through the proxy");
    (proxy, Arc::new(session))
}

/// Every batch whose body holds `marker` (and not `unless`) is refused as an overloaded node
/// would refuse it: it never reaches the node.
fn refuse_batches(proxy: &mut RunningProxy, marker: &[u8], unless: Option<&[u8]>) {
    let mut condition = Condition::RequestOpcode(RequestOpcode::Batch)
        .and(Condition::BodyContainsCaseSensitive(marker.into()));
    if let Some(other) = unless {
        condition = condition.and(Condition::Not(Box::new(
            Condition::BodyContainsCaseSensitive(other.into()),
        )));
    }
    proxy.running_nodes[0].change_request_rules(Some(vec![RequestRule(
        condition,
        RequestReaction::forge_with_error(DbError::Overloaded),
    )]));
}

fn let_everything_through(proxy: &mut RunningProxy) {
    proxy.running_nodes[0].change_request_rules(None);
}

/// The target as a silo of `cluster` reads it: (version, entries).
async fn target_holds(session: &Arc<Session>, table: &str, cluster: &str) -> (u64, usize) {
    let t = CassandraMembershipTable::with_session(
        Arc::clone(session),
        options(cluster).table(table.to_owned()),
    )
    .unwrap();
    let s = t.read_all().await.expect("read the target");
    (s.version.version, s.rows.len())
}

fn verification(report: &MigrationReport, cluster: &str) -> Verification {
    report
        .clusters
        .iter()
        .find(|c| c.cluster_id == cluster)
        .unwrap_or_else(|| panic!("{cluster} not in {report:?}"))
        .verification
        .clone()
}

/// What the report says it wrote of `cluster`: (entries, heartbeats).
fn copied(report: &MigrationReport, cluster: &str) -> (usize, usize) {
    let c = report
        .clusters
        .iter()
        .find(|c| c.cluster_id == cluster)
        .unwrap_or_else(|| panic!("{cluster} not in {report:?}"));
    (c.entries_copied, c.heartbeats_copied)
}

/// The source's version moved on between an interrupted run and the next: the next run copies
/// nothing over the stale copy and does not report it verified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_interrupted_then_resumed_after_the_source_changed_is_not_verified() {
    let (mut proxy, session) = through_proxy().await;
    let old = OldTable::create(&session).await;
    let cluster = table_name("c1");
    old.version(&cluster, 5, 0, ago(600)).await;
    old.entries(&cluster, 0..70, 0, ago(600)).await;
    let source = old.source(&session, &cluster, false);
    let target = table_name("new");
    let plan = MigrationPlan::new(target.clone()).quiet_for(Duration::from_secs(1));

    // The second batch (the version and 59 entries are in the first) is refused.
    refuse_batches(&mut proxy, address(59).as_bytes(), None);
    let first = source.migrate_to(&plan).await;
    println!("first run (interrupted): {first:?}");
    assert!(
        matches!(first, Err(MembershipError::Unavailable { .. })),
        "{first:?}"
    );
    let_everything_through(&mut proxy);
    assert_eq!(target_holds(&session, &target, &cluster).await, (5, 59));

    // The silos went back to the old table and wrote: version 6 and one more entry.
    old.version(&cluster, 6, 0, ago(30)).await;
    old.entry(&cluster, 70, 0, ago(30)).await;
    let second = source.migrate_to(&plan).await.expect("the second run");
    println!("second run: {second:?}");
    assert!(
        !second.all_verified(),
        "a stale copy is not verified: {second:?}"
    );
    let Verification::SourceChanged(why) = verification(&second, &cluster) else {
        panic!("{second:?}");
    };
    assert!(
        why.contains("version 5") && why.contains("version 6"),
        "{why}"
    );
    assert_eq!(
        target_holds(&session, &target, &cluster).await,
        (5, 59),
        "the stale copy is left as it was"
    );
    drop(proxy);
}

/// A complete copy, one more write on the source, then a run again: not verified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_again_after_the_source_changed_is_not_verified() {
    let session = session_with_keyspace().await;
    let old = OldTable::create(&session).await;
    let cluster = table_name("c");
    old.version(&cluster, 3, 0, ago(600)).await;
    old.entries(&cluster, 0..3, 0, ago(600)).await;
    let source = old.source(&session, &cluster, false);
    let target = table_name("new");
    let plan = MigrationPlan::new(target.clone()).quiet_for(Duration::from_secs(1));
    let first = source.migrate_to(&plan).await.unwrap();
    assert!(first.all_verified(), "{first:?}");

    old.version(&cluster, 4, 0, ago(20)).await;
    old.entry(&cluster, 3, 0, ago(20)).await;
    for run in ["second", "third"] {
        let again = source.migrate_to(&plan).await.unwrap();
        println!("{run} run: {again:?}");
        assert!(!again.all_verified(), "{run} run: {again:?}");
        assert!(
            matches!(
                verification(&again, &cluster),
                Verification::SourceChanged(_)
            ),
            "{run} run: {again:?}"
        );
        assert_eq!(target_holds(&session, &target, &cluster).await, (3, 3));
        // Nothing was written: the report counts nothing as copied.
        assert_eq!(copied(&again, &cluster), (0, 0), "{run} run: {again:?}");
    }
}

/// 0.2 rows without TTL, the new options with expiry on: the first run copies the options'
/// cluster alone, the second the whole table. The target's set-up applies no TTL policy to a
/// copy (its TTLs are the source's by design).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_turning_expiry_on_can_be_resumed() {
    let session = session_with_keyspace().await;
    let old = OldTable::create(&session).await;
    let clusters: Vec<String> = (1..=3).map(|i| table_name(&format!("c{i}"))).collect();
    for c in &clusters {
        old.version(c, 2, 0, ago(600)).await;
        old.entries(c, 0..4, 0, ago(600)).await;
    }
    let c3 = &clusters[2];
    let source = old.source(&session, c3, true);
    let target = table_name("new");
    let plan = MigrationPlan::new(target.clone()).quiet_for(Duration::from_secs(1));
    let first = source
        .migrate_to(&plan.clone().only(None, Some(c3.clone())))
        .await;
    println!("first run ({c3} only): {first:?}");
    assert!(first.unwrap().all_verified());
    for run in ["second", "third"] {
        let whole = source.migrate_to(&plan).await;
        println!("{run} run (whole table): {whole:?}");
        let whole = whole.expect("the copy is resumed");
        assert!(whole.all_verified(), "{whole:?}");
        for c in &clusters {
            assert_eq!(target_holds(&session, &target, c).await, (2, 4), "{c}");
        }
    }
    // Under `patch` too, the copy keeps the source's TTLs (none): the run rewrites nothing.
    let patching = CassandraMembershipTable::with_session(
        Arc::clone(&session),
        old.options(c3)
            .ttl(true)
            .ttl_mismatch(TtlMismatchPolicy::Patch),
    )
    .unwrap();
    let again = patching.migrate_to(&plan).await.expect("under patch");
    assert!(again.all_verified(), "{again:?}");
    let ttls = session
        .query_unpaged(
            format!(
                "SELECT TTL(entry) FROM {KEYSPACE}.{target} \
                 WHERE service_id = ? AND cluster_id = ? AND silo = ?"
            ),
            (SERVICE, c3, address(0)),
        )
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .single_row::<(Option<i32>,)>()
        .unwrap();
    assert_eq!(ttls, (None,), "the copied entry still has no TTL");
}

/// A run that stops at any batch boundary (the node refuses that batch) is completed by the next
/// one, with expiry on in the new options and TTLs on the old cells (so the version is written
/// again after the entries: a fourth batch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_stopped_at_any_batch_boundary_is_completed_by_the_next_run_with_expiry_on() {
    let (mut proxy, session) = through_proxy().await;
    let old = OldTable::create(&session).await;
    let cluster = table_name("c");
    let version_etag = old.version(&cluster, 9, 7200, ago(600)).await;
    old.entries(&cluster, 0..130, 7200, ago(600)).await;
    let source = old.source(&session, &cluster, true);
    let first_entry = address(0).into_bytes();
    // (what the refused batch holds, what it does not, entries the target holds before it):
    // batches of 60 statements, the version first, then the version again alone.
    let boundaries = [
        (first_entry.clone(), None, 0),
        (address(59).into_bytes(), None, 59),
        (address(119).into_bytes(), None, 119),
        (version_etag.as_bytes().to_vec(), Some(first_entry), 130),
    ];
    for (batch, (marker, unless, present)) in boundaries.into_iter().enumerate() {
        let target = table_name("new");
        let plan = MigrationPlan::new(target.clone()).quiet_for(Duration::from_secs(1));
        refuse_batches(&mut proxy, &marker, unless.as_deref());
        let stopped = source.migrate_to(&plan).await;
        println!("batch {batch} refused: {stopped:?}");
        assert!(
            matches!(stopped, Err(MembershipError::Unavailable { .. })),
            "batch {batch}: {stopped:?}"
        );
        let_everything_through(&mut proxy);
        let resumed = source.migrate_to(&plan).await;
        println!("batch {batch}, run again: {resumed:?}");
        let resumed = resumed.expect("the run again");
        assert!(resumed.all_verified(), "batch {batch}: {resumed:?}");
        assert_eq!(
            resumed.clusters[0].already_present, present,
            "batch {batch}"
        );
        assert_eq!(target_holds(&session, &target, &cluster).await, (9, 130));
    }
    drop(proxy);
}

/// A silo of the new table wrote on the copy: a conditional write, stamped later than every
/// cell of the source.
async fn a_silo_writes_on(session: &Arc<Session>, table: &str, cluster: &str) {
    let silo = CassandraMembershipTable::with_session(
        Arc::clone(session),
        options(cluster).table(table.to_owned()),
    )
    .unwrap();
    let snapshot = silo.read_all().await.unwrap();
    let mut row = snapshot.rows[0].clone();
    row.entry.status = SiloStatus::Dead;
    assert!(
        silo.update_row(&row.entry, &row.etag, &snapshot.version.next())
            .await
            .unwrap()
    );
}

/// Silos wrote on the copy, then its version was lost (a `delete-cluster` stopped after its first
/// step): a run again must not copy over it. Every batch is refused, so a run that writes fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_again_over_a_target_whose_silos_wrote_and_whose_version_is_lost_copies_nothing() {
    let (mut proxy, session) = through_proxy().await;
    let old = OldTable::create(&session).await;
    let cluster = table_name("c");
    old.version(&cluster, 3, 0, ago(600)).await;
    old.entries(&cluster, 0..3, 0, ago(600)).await;
    let source = old.source(&session, &cluster, false);
    let target = table_name("new");
    let plan = MigrationPlan::new(target.clone()).quiet_for(Duration::from_secs(1));
    assert!(source.migrate_to(&plan).await.unwrap().all_verified());
    a_silo_writes_on(&session, &target, &cluster).await;
    session
        .query_unpaged(
            format!(
                "DELETE FROM {KEYSPACE}.{target} WHERE service_id = ? AND cluster_id = ? AND silo = ''"
            ),
            (SERVICE, &cluster),
        )
        .await
        .unwrap();

    refuse_batches(&mut proxy, SERVICE.as_bytes(), None);
    let again = source.migrate_to(&plan).await;
    println!("run again: {again:?}");
    let again = again.expect("nothing is written, so nothing is refused");
    assert_eq!(
        verification(&again, &cluster),
        Verification::TargetMovedOn,
        "{again:?}"
    );
    assert_eq!(copied(&again, &cluster), (0, 0), "{again:?}");
    drop(proxy);
}

/// The read of what the target holds fails (here: it times out): the run stops with that error
/// before writing anything, rather than copy as if the target were empty (over the silos'
/// writes: after gc_grace, that could bring back what they removed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_again_whose_read_of_the_target_fails_stops_before_writing() {
    let (mut proxy, session) = through_proxy().await;
    let old = OldTable::create(&session).await;
    let cluster = table_name("c");
    old.version(&cluster, 3, 0, ago(600)).await;
    old.entries(&cluster, 0..3, 0, ago(600)).await;
    // The options name another cluster, as the CLI's do when no --cluster is given.
    let source = CassandraMembershipTable::with_session(
        Arc::clone(&session),
        old.options(&table_name("placeholder"))
            .ttl(false)
            .request_timeout(Duration::from_secs(1)),
    )
    .unwrap();
    let target = table_name("new");
    let plan = MigrationPlan::new(target.clone()).quiet_for(Duration::from_secs(1));
    assert!(source.migrate_to(&plan).await.unwrap().all_verified());
    a_silo_writes_on(&session, &target, &cluster).await;

    // Every answer carrying rows of the new table comes too late: rows (an entry's address, never
    // in a prepared statement's answer) of the new shape (named in the answer's metadata; the old
    // shape's carry write times), or with the write times of its cells. Every batch is refused,
    // so a run that writes fails.
    let holds = |n: &[u8]| Condition::BodyContainsCaseSensitive(n.to_vec().into());
    proxy.running_nodes[0].change_response_rules(Some(vec![ResponseRule(
        holds(address(0).as_bytes()).and(
            holds(b"entry_written")
                .or(holds(b"suspect_times").and(Condition::not(holds(b"etag_written")))),
        ),
        ResponseReaction::delay(Duration::from_secs(3)),
    )]));
    refuse_batches(&mut proxy, SERVICE.as_bytes(), None);
    let again = source.migrate_to(&plan).await;
    println!("run again: {again:?}");
    assert!(
        matches!(again, Err(MembershipError::Timeout { .. })),
        "the run stops on the failed read, before any write: {again:?}"
    );
    proxy.running_nodes[0].change_response_rules(None);
    drop(proxy);
}

/// A 0.2 cluster whose version was lost (entries without a version): the copy holds the same,
/// which the provider reads as a lost version, on every run. Reported as a mismatch naming it,
/// never as verified; the first silo to start on the new table (`initialize`) re-creates the
/// version, as on any lost version (`docs::expiry`), after which the copy reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_whose_version_was_lost_in_the_old_table_is_never_verified() {
    let session = session_with_keyspace().await;
    let old = OldTable::create(&session).await;
    let cluster = table_name("c");
    old.entries(&cluster, 0..3, 0, ago(600)).await;
    let source = old.source(&session, &cluster, false);
    let target = table_name("new");
    let plan = MigrationPlan::new(target.clone()).quiet_for(Duration::from_secs(1));
    for run in ["first", "second"] {
        let report = source.migrate_to(&plan).await.unwrap();
        println!("{run} run: {report:?}");
        let Verification::Mismatch(why) = verification(&report, &cluster) else {
            panic!("{run} run: {report:?}");
        };
        assert!(why.contains("version"), "{why}");
    }
    let silo = CassandraMembershipTable::with_session(
        Arc::clone(&session),
        options(&cluster).table(target.clone()),
    )
    .unwrap();
    silo.initialize(true).await.unwrap();
    let (version, entries) = target_holds(&session, &target, &cluster).await;
    assert_eq!(entries, 3);
    assert!(
        version > 1_000_000_000_000_000,
        "re-created above any number the partition had: {version}"
    );
}

/// A silo of 0.2 that heartbeated 75 s ago may still be serving (others vote it dead only after
/// the detection horizon, 90 s with the defaults): the default window refuses its cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_quiet_window_covers_the_detection_horizon() {
    let session = session_with_keyspace().await;
    let old = OldTable::create(&session).await;
    let cluster = table_name("c");
    old.version(&cluster, 1, 0, ago(600)).await;
    old.entry(&cluster, 0, 0, ago(75)).await;
    let source = old.source(&session, &cluster, false);
    let report = source
        .migrate_to(&MigrationPlan::new(table_name("new")))
        .await
        .unwrap();
    println!("{report:?}");
    assert!(report.refused, "{report:?}");
    assert!(report.clusters[0].recent_activity);
    // A refused run wrote nothing: it counts nothing as copied.
    assert_eq!(copied(&report, &cluster), (0, 0), "{report:?}");
}

//! `cassandra-membership migrate` against the real node at `CASSANDRA_CONTACT_POINTS` (default
//! 127.0.0.1:9042): a table of the 0.2 shape is created and filled by hand, the way the 0.2
//! provider wrote it, then copied. These tests never skip: no node, no pass.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use assert_cmd::Command;
use cassandra_membership::{
    CassandraMembershipTable, ETag, MembershipEntry, MembershipError, MembershipTable, SiloStatus,
    SuspectTime, Timestamp, TtlMismatchPolicy,
};
use serde_json::Value;

mod common;
use common::{SERVICE, addr, connected, keyspace, options};

#[path = "migrate/old_table.rs"]
mod old_table;
use old_table::{OldTable, cell, drop_tables, micros, open, unique, within};

const COMMAND_TIMEOUT: Duration = Duration::from_secs(180);

/// The binary with the connection flags of `table`, expiry off (see [`common::connected`]).
fn cli(table: &str) -> Command {
    let mut c = connected(COMMAND_TIMEOUT, table);
    c.args(["--ttl", "false"]);
    c
}

/// Runs, expects exit `code`, parses stdout as JSON.
fn run_json(c: &mut Command, code: i32) -> Value {
    let out = c.output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

fn cluster_json<'a>(doc: &'a Value, cluster: &str) -> &'a Value {
    doc["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["cluster_id"] == cluster)
        .unwrap_or_else(|| panic!("{cluster} not in {doc}"))
}

/// A cluster as the provider must read it: version, version tag, entries (heartbeat merged)
/// with their row tags.
struct ExpectedCluster {
    version: u64,
    version_etag: uuid::Uuid,
    entries: Vec<(MembershipEntry, uuid::Uuid)>,
}

/// What a cluster of the fixture holds: its entries as the provider must read them, with the
/// TTL and write time of each entry cell.
struct Fixture {
    cluster_a: String,
    cluster_b: String,
    /// cluster -> (version, version etag) and entries as read (heartbeat merged).
    expected: BTreeMap<String, ExpectedCluster>,
    /// (cluster, silo, column, old TTL at creation, write time µs)
    cells: Vec<(String, String, &'static str, Option<i32>, i64)>,
}

/// Two quiet clusters: A with three entries (one with a heartbeat newer than its entry, one
/// Dead with suspicions and no TTL, one with a short TTL) and a version with a TTL; B with one
/// entry whose heartbeat belongs to an earlier incarnation at the address, and a version without
/// TTL.
async fn fill(old: &OldTable) -> Fixture {
    let now = Timestamp::now();
    let ago = |s: u64| now.saturating_sub(Duration::from_secs(s));
    let cluster_a = unique("a");
    let cluster_b = unique("b");
    let mut expected = BTreeMap::new();
    let mut cells = Vec::new();

    let va = uuid::Uuid::new_v4();
    old.version(&cluster_a, 7, va, 7200, ago(600)).await;
    cells.push((
        cluster_a.clone(),
        String::new(),
        "version_etag",
        Some(7200),
        micros(ago(600)),
    ));
    let mut a1 = MembershipEntry::new(addr("10.0.0.1:11111@100"), SiloStatus::Active, ago(3600));
    a1.silo_name = "silo-a".into();
    a1.host_name = "host-a".into();
    a1.role_name = "frontend".into();
    a1.proxy_port = 30000;
    a1.update_zone = 1;
    a1.fault_zone = 2;
    a1.i_am_alive_time = ago(900);
    let e1 = uuid::Uuid::new_v4();
    old.entry(&cluster_a, &a1, e1, 7200, ago(900)).await;
    // A heartbeat after the entry's last write: the copy must read back with it.
    old.heartbeat(&cluster_a, &a1, ago(300), 7100).await;
    cells.push((
        cluster_a.clone(),
        a1.address.to_string(),
        "entry",
        Some(7200),
        micros(ago(900)),
    ));
    cells.push((
        cluster_a.clone(),
        a1.address.to_string(),
        "heartbeat",
        Some(7100),
        micros(ago(300)),
    ));
    let mut a1_read = a1.clone();
    a1_read.i_am_alive_time = ago(300);

    let mut a2 = MembershipEntry::new(addr("10.0.0.2:11111@100"), SiloStatus::Dead, ago(3000));
    a2.silo_name = "silo-b".into();
    a2.i_am_alive_time = ago(2000);
    a2.suspect_times = vec![
        SuspectTime {
            suspecting_silo: addr("10.0.0.1:11111@100"),
            time: ago(1900),
        },
        SuspectTime {
            suspecting_silo: addr("10.0.0.3:11111@100"),
            time: ago(1800),
        },
    ];
    let e2 = uuid::Uuid::new_v4();
    old.entry(&cluster_a, &a2, e2, 0, ago(1800)).await;
    cells.push((
        cluster_a.clone(),
        a2.address.to_string(),
        "entry",
        None,
        micros(ago(1800)),
    ));

    let mut a3 = MembershipEntry::new(addr("10.0.0.3:11111@100"), SiloStatus::Joining, ago(700));
    a3.silo_name = "silo-c".into();
    a3.i_am_alive_time = ago(700);
    let e3 = uuid::Uuid::new_v4();
    old.entry(&cluster_a, &a3, e3, 3000, ago(700)).await;
    cells.push((
        cluster_a.clone(),
        a3.address.to_string(),
        "entry",
        Some(3000),
        micros(ago(700)),
    ));
    expected.insert(
        cluster_a.clone(),
        ExpectedCluster {
            version: 7,
            version_etag: va,
            entries: vec![(a1_read, e1), (a2, e2), (a3, e3)],
        },
    );

    let vb = uuid::Uuid::new_v4();
    old.version(&cluster_b, 2, vb, 0, ago(500)).await;
    cells.push((
        cluster_b.clone(),
        String::new(),
        "version_etag",
        None,
        micros(ago(500)),
    ));
    let mut b1 = MembershipEntry::new(addr("10.0.1.1:11111@200"), SiloStatus::Active, ago(1000));
    b1.i_am_alive_time = ago(400);
    let eb = uuid::Uuid::new_v4();
    old.entry(&cluster_b, &b1, eb, 0, ago(400)).await;
    cells.push((
        cluster_b.clone(),
        b1.address.to_string(),
        "entry",
        None,
        micros(ago(400)),
    ));
    // An element of an earlier incarnation at the same address (another start time): copied as
    // it is, and ignored by reads.
    let mut earlier = b1.clone();
    earlier.start_time = ago(5000);
    old.heartbeat(&cluster_b, &earlier, ago(200), 0).await;
    cells.push((
        cluster_b.clone(),
        b1.address.to_string(),
        "heartbeat",
        None,
        micros(ago(200)),
    ));
    expected.insert(
        cluster_b.clone(),
        ExpectedCluster {
            version: 2,
            version_etag: vb,
            entries: vec![(b1, eb)],
        },
    );
    Fixture {
        cluster_a,
        cluster_b,
        expected,
        cells,
    }
}

/// The provider's read of every fixture cluster on `table` equals what the old table held.
async fn assert_copied(table: &str, f: &Fixture) {
    for (
        cluster,
        ExpectedCluster {
            version,
            version_etag,
            entries,
        },
    ) in &f.expected
    {
        let t = open(table, cluster).await;
        let snapshot = t.read_all().await.expect("read the copy");
        assert_eq!(snapshot.version.version, *version, "{cluster}");
        assert_eq!(snapshot.version.etag, ETag::new(version_etag.to_string()));
        let read: Vec<_> = snapshot.rows.iter().map(|r| r.entry.clone()).collect();
        let want: Vec<_> = entries.iter().map(|(e, _)| e.clone()).collect();
        assert_eq!(read, want, "{cluster}");
        for (row, (_, etag)) in snapshot.rows.iter().zip(entries) {
            assert!(
                row.etag.as_str().starts_with(&etag.to_string()),
                "the row tag is the old one: {:?} vs {etag}",
                row.etag
            );
        }
    }
}

/// Write times equal the old ones; remaining TTLs are the old ones less the time since.
async fn assert_cells(conn: &CassandraMembershipTable, table: &str, f: &Fixture, since: Instant) {
    let slack = i32::try_from(since.elapsed().as_secs()).unwrap() + 3;
    for (cluster, silo, column, ttl, written) in &f.cells {
        let (actual_ttl, actual_written) = cell(conn, table, column, cluster, silo).await;
        assert_eq!(actual_written, Some(*written), "{cluster} {silo} {column}");
        assert!(
            within(actual_ttl, *ttl, slack),
            "{cluster} {silo} {column}: TTL {actual_ttl:?}, the old one was {ttl:?} ({slack} s ago)"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn migrate_copies_an_old_table_keeping_write_times_and_ttls_and_resumes() {
    let old = OldTable::create().await;
    let filled = Instant::now();
    let f = fill(&old).await;
    let before = old.dump().await;
    let new_table = unique("new");

    // (a) This release refuses the old shape loudly, naming the way out.
    let err = open(&old.table, &f.cluster_a)
        .await
        .initialize(true)
        .await
        .unwrap_err();
    assert!(
        matches!(err, MembershipError::TableNeedsMigration { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("migrate --to-table"), "{err}");

    // A first run interrupted after one cluster: copy cluster A alone.
    let doc = run_json(
        cli(&old.table).args([
            "--json",
            "--service",
            SERVICE,
            "--cluster",
            &f.cluster_a,
            "migrate",
            "--to-table",
            &new_table,
        ]),
        0,
    );
    assert_eq!(doc["clusters"].as_array().unwrap().len(), 1, "{doc}");
    let a = cluster_json(&doc, &f.cluster_a);
    assert_eq!(a["entries_copied"], 3, "{doc}");
    assert_eq!(a["heartbeats_copied"], 1, "{doc}");
    assert_eq!(a["version"], 7, "{doc}");
    assert_eq!(a["verification"], "verified", "{doc}");
    assert_eq!(a["resumed"], false, "{doc}");
    let b_before = open(&new_table, &f.cluster_b)
        .await
        .read_all()
        .await
        .unwrap();
    assert!(b_before.rows.is_empty(), "cluster B is not copied yet");

    // (c) The whole table, resumed: A is already there, B is copied.
    let doc = run_json(
        cli(&old.table).args(["--json", "migrate", "--to-table", &new_table]),
        0,
    );
    let a = cluster_json(&doc, &f.cluster_a);
    assert_eq!(a["already_present"], 3, "{doc}");
    assert_eq!(a["resumed"], true, "{doc}");
    assert_eq!(a["verification"], "verified", "{doc}");
    let b = cluster_json(&doc, &f.cluster_b);
    assert_eq!(b["entries_copied"], 1, "{doc}");
    assert_eq!(b["heartbeats_copied"], 1, "{doc}");
    assert_eq!(b["already_present"], 0, "{doc}");
    assert_eq!(b["verification"], "verified", "{doc}");

    // (b) Everything copied, heartbeats merged, tags, write times and TTLs kept.
    assert_copied(&new_table, &f).await;
    assert_cells(&old.conn, &new_table, &f, filled).await;

    // (c) Once more: a no-op, the same cells at the same write times.
    let out = cli(&old.table)
        .args(["migrate", "--to-table", &new_table])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("resumed: 3 already there"), "{text}");
    assert!(text.contains("resumed: 1 already there"), "{text}");
    assert_copied(&new_table, &f).await;
    assert_cells(&old.conn, &new_table, &f, filled).await;

    // The library opens the new table as any silo would (the fixture mixes cells with and
    // without TTL, which the TTL audit would report: allowed here).
    let silo = CassandraMembershipTable::connect(
        options(&new_table, &f.cluster_a).ttl_mismatch(TtlMismatchPolicy::Allow),
    )
    .await
    .unwrap();
    silo.initialize(true)
        .await
        .expect("the copy is of the current shape");
    let mut next = silo.read_all().await.unwrap();
    let row = next.rows.remove(0);
    assert!(
        silo.update_row(&row.entry, &row.etag, &next.version.next())
            .await
            .unwrap(),
        "a conditional write on the copied row and version applies"
    );
    let moved_on = silo.read_all().await.unwrap();

    // (c) A run after the silos wrote on the copy copies nothing of that cluster again: it
    // could bring back what they removed, once their tombstones are purged.
    let doc = run_json(
        cli(&old.table).args(["--json", "migrate", "--to-table", &new_table]),
        0,
    );
    let a = cluster_json(&doc, &f.cluster_a);
    assert_eq!(a["verification"], "target_moved_on", "{doc}");
    assert_eq!(
        silo.read_all().await.unwrap(),
        moved_on,
        "the silos' writes stay"
    );

    // (e) The old table is exactly as it was.
    assert_eq!(old.dump().await, before);
    drop_tables(&old.conn, &[&old.table, &new_table]).await;
}

/// A complete copy, then the silos went back to the old table and wrote (a new version, one
/// more entry): a run again leaves the stale copy as it is, says why, and exits non-zero.
#[tokio::test(flavor = "multi_thread")]
async fn migrate_again_after_the_source_changed_leaves_the_copy_and_fails() {
    let old = OldTable::create().await;
    let cluster = unique("moved");
    let long_ago = Timestamp::now().saturating_sub(Duration::from_secs(3600));
    let first = MembershipEntry::new(addr("10.0.4.1:11111@1"), SiloStatus::Active, long_ago);
    old.version(&cluster, 3, uuid::Uuid::new_v4(), 0, long_ago)
        .await;
    old.entry(&cluster, &first, uuid::Uuid::new_v4(), 0, long_ago)
        .await;
    let new_table = unique("new");
    let doc = run_json(
        cli(&old.table).args(["--json", "migrate", "--to-table", &new_table]),
        0,
    );
    assert_eq!(cluster_json(&doc, &cluster)["verification"], "verified");

    let later = Timestamp::now().saturating_sub(Duration::from_secs(600));
    let second = MembershipEntry::new(addr("10.0.4.2:11111@1"), SiloStatus::Active, later);
    old.version(&cluster, 4, uuid::Uuid::new_v4(), 0, later)
        .await;
    old.entry(&cluster, &second, uuid::Uuid::new_v4(), 0, later)
        .await;
    let doc = run_json(
        cli(&old.table).args(["--json", "migrate", "--to-table", &new_table]),
        1,
    );
    let c = cluster_json(&doc, &cluster);
    assert_eq!(c["verification"], "source_changed", "{doc}");
    assert!(c["reason"].as_str().unwrap().contains("version 3"), "{doc}");
    let copy = open(&new_table, &cluster).await.read_all().await.unwrap();
    assert_eq!(copy.version.version, 3, "the stale copy is left as it was");
    assert_eq!(copy.rows.len(), 1);
    let out = cli(&old.table)
        .args(["migrate", "--to-table", &new_table])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("since an earlier copy"), "{stderr}");
    drop_tables(&old.conn, &[&old.table, &new_table]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn migrate_refuses_a_cluster_whose_silos_still_heartbeat_unless_forced() {
    let old = OldTable::create().await;
    let quiet = unique("quiet");
    let busy = unique("busy");
    let now = Timestamp::now();
    let long_ago = now.saturating_sub(Duration::from_secs(3600));
    let mut q1 = MembershipEntry::new(addr("10.0.2.1:11111@1"), SiloStatus::Dead, long_ago);
    q1.silo_name = "quiet".into();
    old.version(&quiet, 1, uuid::Uuid::new_v4(), 0, long_ago)
        .await;
    old.entry(&quiet, &q1, uuid::Uuid::new_v4(), 0, long_ago)
        .await;
    let b1 = MembershipEntry::new(addr("10.0.2.2:11111@1"), SiloStatus::Active, long_ago);
    old.version(&busy, 1, uuid::Uuid::new_v4(), 0, long_ago)
        .await;
    old.entry(&busy, &b1, uuid::Uuid::new_v4(), 0, long_ago)
        .await;
    // Its silo heartbeats right now.
    old.heartbeat(&busy, &b1, Timestamp::now(), 0).await;
    let before = old.dump().await;
    let new_table = unique("new");

    let doc = run_json(
        cli(&old.table).args(["--json", "migrate", "--to-table", &new_table]),
        3,
    );
    assert_eq!(doc["refused"], true, "{doc}");
    assert_eq!(cluster_json(&doc, &busy)["recent_activity"], true, "{doc}");
    assert_eq!(
        cluster_json(&doc, &quiet)["recent_activity"],
        false,
        "{doc}"
    );
    // Nothing written: not even the new table.
    let tables = old
        .conn
        .session()
        .query_unpaged(
            "SELECT table_name FROM system_schema.tables WHERE keyspace_name = ? AND table_name = ?",
            (keyspace(), &new_table),
        )
        .await
        .unwrap()
        .into_rows_result()
        .unwrap();
    assert_eq!(tables.rows_num(), 0, "a refused migration creates nothing");

    // A shorter window lets it through; so does --force. A dry run writes nothing either way.
    run_json(
        cli(&old.table).args([
            "--json",
            "migrate",
            "--to-table",
            &new_table,
            "--force",
            "--dry-run",
        ]),
        0,
    );
    let doc = run_json(
        cli(&old.table).args(["--json", "migrate", "--to-table", &new_table, "--force"]),
        0,
    );
    assert_eq!(
        cluster_json(&doc, &busy)["verification"],
        "verified",
        "{doc}"
    );
    assert_eq!(
        cluster_json(&doc, &quiet)["verification"],
        "verified",
        "{doc}"
    );
    let copy = open(&new_table, &busy).await.read_all().await.unwrap();
    assert_eq!(copy.rows.len(), 1);
    assert!(
        copy.rows[0].entry.i_am_alive_time > long_ago,
        "the fresh heartbeat is copied"
    );
    assert_eq!(old.dump().await, before, "the old table is unchanged");
    drop_tables(&old.conn, &[&old.table, &new_table]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn migrate_refuses_a_source_that_is_not_of_the_old_shape() {
    let current = unique("cur");
    let t = open(&current, "c").await;
    t.initialize(true)
        .await
        .expect("a table of the current shape");
    let (_, stderr) = {
        let out = cli(&current)
            .args(["migrate", "--to-table", &unique("new")])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(4), "{out:?}");
        (
            out.stdout,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert!(stderr.contains("nothing to migrate"), "{stderr}");
    drop_tables(&t, &[&current]).await;
}

#[test]
fn migrate_needs_ttl_set_explicitly() {
    let out = common::bare(COMMAND_TIMEOUT)
        .args([
            "--contact-points",
            "127.0.0.1:1",
            "--table",
            "t",
            "migrate",
            "--to-table",
            "u",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("ttl"));
}

/// A cell stamped in the future (a coordinator's clock ran ahead) would outvote the new table's
/// Paxos ballots: every conditional write on it would answer applied and lose. Such a cluster is
/// never copied, not even with `--force`.
#[tokio::test(flavor = "multi_thread")]
async fn migrate_never_copies_a_cell_stamped_in_the_future_even_forced() {
    let old = OldTable::create().await;
    let ahead = unique("ahead");
    let now = Timestamp::now();
    let long_ago = now.saturating_sub(Duration::from_secs(3600));
    let e = MembershipEntry::new(addr("10.0.3.1:11111@1"), SiloStatus::Dead, long_ago);
    old.version(
        &ahead,
        4,
        uuid::Uuid::new_v4(),
        0,
        now.saturating_add(Duration::from_secs(3600)),
    )
    .await;
    old.entry(&ahead, &e, uuid::Uuid::new_v4(), 0, long_ago)
        .await;
    let new_table = unique("new");
    let doc = run_json(
        cli(&old.table).args(["--json", "migrate", "--to-table", &new_table, "--force"]),
        3,
    );
    assert_eq!(doc["refused"], true, "{doc}");
    assert_eq!(cluster_json(&doc, &ahead)["recent_activity"], true, "{doc}");
    drop_tables(&old.conn, &[&old.table]).await;
}

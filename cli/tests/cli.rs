//! The built `cassandra-membership` binary against the real node at `CASSANDRA_CONTACT_POINTS`
//! (default 127.0.0.1:9042). Each test prepares its own table through the library (keyspace
//! `CM_CLI_TEST_KEYSPACE`, default `cm_cli_test`, created if missing), runs the binary and
//! checks its exit code and its `--json` output. These tests never skip: no node, no pass.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use assert_cmd::Command;
use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, MembershipEntry, MembershipTable,
    SiloStatus, SuspectTime, Timestamp,
};
use serde_json::Value;

mod common;
use common::{SERVICE, addr, connect, connected, contact_points, exits, keyspace};

/// Generous: the node is shared and conditional writes can be slow under load.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// A table of its own for each test: the TTL audit and patch look at a whole table.
fn unique_table() -> String {
    format!("t_{}", uuid::Uuid::new_v4().simple())
}

fn options(table: &str, cluster: &str, ttl: bool) -> CassandraClusteringOptions {
    let mut o = common::options(table, cluster).ttl(ttl);
    o.membership.defunct_silo_expiration = Duration::from_secs(3600);
    o
}

/// Connects and initializes a cluster of a test table. Panics with instructions when no node
/// answers: these tests never skip.
async fn cluster(table: &str, cluster: &str, ttl: bool) -> CassandraMembershipTable {
    let t = connect(options(table, cluster, ttl)).await;
    t.initialize(true)
        .await
        .expect("initialize the test cluster");
    t
}

async fn insert(t: &CassandraMembershipTable, entry: MembershipEntry) {
    let version = t.read_all().await.unwrap().version;
    assert!(
        t.insert_row(&entry, &version.next()).await.unwrap(),
        "insert {}",
        entry.address
    );
}

/// Three entries: an Active one that heartbeats, a Dead one, a Joining one with a suspicion.
async fn three_entries(t: &CassandraMembershipTable) {
    let now = Timestamp::now();
    let mut active = MembershipEntry::new(addr("10.0.0.1:11111@1"), SiloStatus::Active, now);
    active.silo_name = "silo-a".into();
    active.role_name = "frontend".into();
    active.update_zone = 1;
    active.fault_zone = 2;
    insert(t, active).await;
    let mut dead = MembershipEntry::new(addr("10.0.0.2:11111@1"), SiloStatus::Dead, now);
    dead.silo_name = "silo-b".into();
    insert(t, dead).await;
    let mut joining = MembershipEntry::new(addr("10.0.0.3:11111@1"), SiloStatus::Joining, now);
    joining.silo_name = "silo-c".into();
    joining.suspect_times.push(SuspectTime {
        suspecting_silo: addr("10.0.0.1:11111@1"),
        time: now,
    });
    insert(t, joining).await;
    t.update_i_am_alive(&addr("10.0.0.1:11111@1"), Timestamp::now())
        .await
        .unwrap();
}

async fn drop_table(t: &CassandraMembershipTable) {
    // Best effort: a leftover table in the test keyspace harms nothing.
    let _ = t
        .session()
        .query_unpaged(format!("DROP TABLE IF EXISTS {}", t.qualified_table()), ())
        .await;
}

/// The binary without the caller's environment (see [`common::bare`]).
fn bare() -> Command {
    common::bare(COMMAND_TIMEOUT)
}

/// The binary with the connection flags of `table` and the test service.
fn cli(table: &str) -> Command {
    let mut c = connected(COMMAND_TIMEOUT, table);
    c.args(["--service", SERVICE]);
    c
}

/// Runs, expects exit 0, parses stdout as JSON.
fn json(c: &mut Command) -> Value {
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(
        doc["schema"], 1,
        "every document is an object with its schema: {doc}"
    );
    doc
}

fn text(c: &mut Command) -> String {
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "exit {:?}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn config_file(body: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("cm-cli-{}.toml", uuid::Uuid::new_v4().simple()));
    std::fs::write(&path, body).unwrap();
    path
}

/// `n` row tombstones in `t`'s partition, written past the provider.
async fn bury(t: &CassandraMembershipTable, n: usize) {
    use futures::StreamExt as _;
    let s = t.session();
    let delete = s
        .prepare(format!(
            "DELETE FROM {} WHERE service_id = ? AND cluster_id = ? AND silo = ?",
            t.qualified_table()
        ))
        .await
        .unwrap();
    let (delete, cluster) = (&delete, t.options().cluster_id.clone());
    let cluster = &cluster;
    futures::stream::iter(0..n)
        .map(|i| async move {
            s.execute_unpaged(delete, (SERVICE, cluster, format!("0.0.0.0:0@{i:09}")))
                .await
                .expect("a plain delete")
        })
        .buffer_unordered(128)
        .for_each(|_| async {})
        .await;
}

/// `clusters` shows the tombstones a read of each cluster scanned (the distance to the cliff),
/// names a cluster past the cliff in its line (exit 1), and `delete-cluster` removes it.
#[tokio::test(flavor = "multi_thread")]
async fn clusters_shows_the_tombstones_each_read_scans_and_delete_cluster_clears_a_buried_one() {
    let table = unique_table();
    let worn = cluster(&table, "worn", false).await;
    three_entries(&worn).await;
    bury(&worn, 2_500).await;
    let report = json(cli(&table).args(["clusters", "--json"]));
    let list = report["clusters"].as_array().unwrap();
    assert_eq!(list.len(), 1, "{report}");
    assert_eq!(list[0]["tombstones_scanned"], 2_500, "{report}");
    let human = text(cli(&table).arg("clusters"));
    assert!(
        human.contains("TOMBSTONES") && human.contains("2500"),
        "{human}"
    );

    // Past the cliff: the cluster's own reads fail naming what to do, and delete-cluster
    // removes it (the listing itself scans each partition to its first live row, so it fails
    // as a whole while one is buried: docs::tombstones says to name the cluster).
    let buried = cluster(&table, "buried", false).await;
    bury(&buried, 100_100).await;
    let (_, stderr) = exits(cli(&table).args(["--cluster", "buried", "members"]), 1);
    assert!(
        stderr.contains("tombstone") && stderr.contains("gc_grace_seconds"),
        "{stderr}"
    );
    // The partition deletion is stamped 10 s in the past (clock skew between coordinators):
    // tombstones younger than that are not shadowed by it.
    tokio::time::sleep(std::time::Duration::from_secs(11)).await;
    json(cli(&table).args(["delete-cluster", "buried", "--yes", "--json"]));
    let report = json(cli(&table).args(["clusters", "--json"]));
    let list = report["clusters"].as_array().unwrap();
    assert_eq!(list.len(), 1, "only the worn cluster is left: {report}");
    drop_table(&worn).await;
}

fn member<'a>(report: &'a Value, address: &str) -> &'a Value {
    report["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["address"] == address)
        .unwrap_or_else(|| panic!("{address} not in {report}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn clusters_lists_every_cluster_with_counts_version_newest_heartbeat_and_version_ttl() {
    let table = unique_table();
    let blue = cluster(&table, "blue", true).await;
    three_entries(&blue).await;
    let green = cluster(&table, "green", true).await; // a version and no entries
    let newest = blue
        .read_all()
        .await
        .unwrap()
        .rows
        .iter()
        .map(|r| r.entry.i_am_alive_time)
        .max();
    let blue_version = blue.read_all().await.unwrap().version.version;

    let report = json(cli(&table).args(["clusters", "--json"]));
    let list = report["clusters"].as_array().unwrap();
    assert_eq!(list.len(), 2, "{report}");
    let find = |id: &str| list.iter().find(|c| c["cluster_id"] == id).unwrap();
    let b = find("blue");
    assert_eq!(b["service_id"], SERVICE);
    assert_eq!(b["version"], blue_version);
    assert_eq!(b["entries"], 3);
    assert_eq!(b["entries_by_status"]["active"], 1);
    assert_eq!(b["entries_by_status"]["dead"], 1);
    assert_eq!(b["entries_by_status"]["joining"], 1);
    assert_eq!(b["entries_by_status"]["shutting_down"], 0);
    assert_eq!(b["newest_i_am_alive"], newest.unwrap().to_string());
    // Written with TTL 3600 s (+ renewal slack): some of it is left, none beyond what is written.
    let ttl = b["version_ttl_seconds"].as_u64().unwrap();
    let written = blue.options().write_ttl_seconds();
    assert!(
        ttl > 3000 && ttl <= written,
        "version TTL {ttl}, written {written}"
    );
    assert!(b["version_expires_at"].is_string());
    assert!(b["error"].is_null());
    let g = find("green");
    assert_eq!(g["entries"], 0);
    assert!(g["newest_i_am_alive"].is_null());
    assert!(g["version"].is_u64());

    let human = text(cli(&table).arg("clusters"));
    assert!(human.contains("blue") && human.contains("green"), "{human}");
    assert!(human.contains("1 active"), "{human}");
    drop_table(&blue).await;
    drop(green);
}

#[tokio::test(flavor = "multi_thread")]
async fn members_shows_each_entry_with_status_zones_suspicions_ttl_and_marks() {
    let table = unique_table();
    let t = cluster(&table, "blue", true).await;
    three_entries(&t).await;
    // A row written by another program, with a status no silo writes: listed, not hidden.
    t.session()
        .query_unpaged(
            format!(
                "UPDATE {} SET entry = {{status: 99}} WHERE service_id = ? AND cluster_id = ? AND silo = ?",
                t.qualified_table()
            ),
            (SERVICE, "blue", "by-hand"),
        )
        .await
        .unwrap();

    let report = json(cli(&table).args(["members", "--cluster", "blue", "--json"]));
    assert_eq!(
        report["unreadable"],
        serde_json::json!(["by-hand"]),
        "{report}"
    );
    assert_eq!(report["cluster_id"], "blue");
    assert_eq!(report["members"].as_array().unwrap().len(), 3, "{report}");
    let a = member(&report, "10.0.0.1:11111@1");
    assert_eq!(a["status"], "active");
    assert_eq!(a["silo_name"], "silo-a");
    assert_eq!(a["role"], "frontend");
    assert_eq!(a["update_zone"], 1);
    assert_eq!(a["fault_zone"], 2);
    assert_eq!(a["dead"], false);
    assert_eq!(a["stale"], false);
    assert_eq!(a["expiring"], false);
    assert!(a["i_am_alive_age_seconds"].as_i64().unwrap() < 60, "{a}");
    assert!(a["ttl_seconds"].as_u64().unwrap() > 3000, "{a}");
    assert!(a["expires_at"].is_string());
    let b = member(&report, "10.0.0.2:11111@1");
    assert_eq!(b["status"], "dead");
    assert_eq!(b["dead"], true);
    assert_eq!(
        b["expiring"], true,
        "a Dead entry with a TTL is nobody's to renew"
    );
    let c = member(&report, "10.0.0.3:11111@1");
    assert_eq!(c["status"], "joining");
    assert_eq!(c["suspicions"][0]["suspecting_silo"], "10.0.0.1:11111@1");

    let human = text(cli(&table).args(["members", "--cluster", "blue"]));
    let dead_line = human
        .lines()
        .find(|l| l.contains("10.0.0.2:11111@1"))
        .unwrap();
    assert!(dead_line.contains("DEAD"), "{human}");
    let active_line = human
        .lines()
        .find(|l| l.contains("10.0.0.1:11111@1"))
        .unwrap();
    assert!(
        !active_line.contains("DEAD") && active_line.contains("u1 f2"),
        "{human}"
    );
    drop_table(&t).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn audit_reports_what_patch_would_do_and_patch_does_it() {
    let table = unique_table();
    // Written without expiry; then audited and patched by an operator whose config turns it on.
    let t = cluster(&table, "blue", false).await;
    three_entries(&t).await;
    let config = config_file(
        "cluster_id = \"blue\"\nttl = true\nttl_mismatch = \"throw\"\n[membership]\ndefunct_silo_expiration = \"1h\"\n",
    );
    let config = config.to_str().unwrap();

    let audit = json(cli(&table).args(["--config", config, "audit", "--json"]));
    assert_eq!(audit["agrees"], false, "{audit}");
    assert_eq!(audit["table_default_ttl_seconds"], 0);
    assert_eq!(audit["configured_ttl_seconds"], 3600);
    // The audit is of the cluster's partition. The Dead entry is rewritten with a TTL; the
    // Active and the Joining entry may belong to running silos (possibly with expiry off), so
    // they keep no TTL while they may live; the version keeps none with them.
    assert_eq!(audit["rows_disagreeing"], 3, "{audit}");
    let action_of = |a: &Value, silo: &str| {
        a["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["silo"] == silo)
            .unwrap_or_else(|| panic!("{silo} not in {a}"))
            .clone()
    };
    let dead = action_of(&audit, "10.0.0.2:11111@1");
    assert_eq!(dead["action"], "rewrite", "{dead}");
    assert!(dead["current_ttl_seconds"].is_null());
    assert!(dead["new_ttl_seconds"].as_u64().unwrap() > 3000, "{dead}");
    for live in ["10.0.0.1:11111@1", "10.0.0.3:11111@1"] {
        let row = action_of(&audit, live);
        assert_eq!(row["action"], "keep_while_live", "{row}");
        assert!(row["new_ttl_seconds"].is_null(), "{row}");
    }
    // Read-only: a second audit finds the same.
    let again = json(cli(&table).args(["--config", config, "audit", "--json"]));
    assert_eq!(again["rows_disagreeing"], 3);
    assert!(text(cli(&table).args(["--config", config, "audit"])).contains("rewrite, expire in"));

    let patch = json(cli(&table).args(["--config", config, "patch", "--yes", "--json"]));
    assert_eq!(patch["patched"], true, "{patch}");
    assert_eq!(patch["before"]["rows_disagreeing"], 3, "{patch}");
    assert_eq!(patch["after"]["table_default_ttl_seconds"], 3600);
    // What is left are the rows kept while their silos may live.
    let after = patch["after"]["rows"].as_array().unwrap();
    assert_eq!(after.len(), 2, "{patch}");
    assert!(
        after.iter().all(|r| r["action"] == "keep_while_live"),
        "{patch}"
    );
    let members = json(cli(&table).args(["--config", config, "members", "--json"]));
    let dead = member(&members, "10.0.0.2:11111@1");
    assert!(dead["ttl_seconds"].as_u64().unwrap() > 3000, "{dead}");
    assert!(member(&members, "10.0.0.1:11111@1")["ttl_seconds"].is_null());
    // Nothing left to change: no confirmation needed, nothing patched.
    let patch = json(cli(&table).args(["--config", config, "patch", "--json"]));
    assert_eq!(patch["patched"], false, "{patch}");
    assert_eq!(patch["before"], patch["after"], "{patch}");
    drop_table(&t).await;
}

/// The table default TTL and the TTL audit of `t`'s cluster, to show nothing changed.
async fn expiry_state(t: &CassandraMembershipTable) -> (u64, u64, bool) {
    let a = t.audit_ttl().await.unwrap();
    (a.table_default_ttl, a.disagreeing(), a.agrees())
}

#[tokio::test(flavor = "multi_thread")]
async fn patch_refuses_without_an_explicit_ttl_and_without_yes_changing_nothing() {
    let table = unique_table();
    // A table with expiry on: a patch run with the defaults (ttl = false) would turn it off for
    // every cluster of the table and rewrite the rows without TTL.
    let t = cluster(&table, "blue", true).await;
    three_entries(&t).await;
    let before = expiry_state(&t).await;
    assert!(before.0 > 0 && before.2, "{before:?}");

    for args in [&["patch"][..], &["patch", "--yes"][..]] {
        let out = cli(&table)
            .args(["--cluster", "blue"])
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("--ttl"), "names what is missing: {stderr}");
        assert_eq!(expiry_state(&t).await, before, "{args:?} changed nothing");
    }

    // Explicit, but without --yes: shows what it would do and refuses (exit 3).
    let out = cli(&table)
        .args(["--cluster", "blue", "--ttl", "false", "patch"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--yes"), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("rewrite"), "shows the audit: {stdout}");
    assert_eq!(expiry_state(&t).await, before, "nothing changed");
    let members = t.read_all().await.unwrap();
    assert_eq!(members.rows.len(), 3);
    drop_table(&t).await;
}

#[test]
fn a_config_parse_error_never_prints_the_password() {
    for body in [
        // Unquoted: toml quotes the offending line in its error text.
        "keyspace = \"orleans\"\n[credentials]\nusername = \"ops\"\npassword = hunter2-unquoted\n",
        // An invalid escape inside the string.
        "[credentials]\nusername = \"ops\"\npassword = \"hunter2\\q-escape\"\n",
        // A valid TOML value of the wrong type: serde quotes the value in its message.
        "[credentials]\nusername = \"ops\"\npassword = 73571234\n",
        // The same as an inline table, on the line of another key.
        "keyspace = \"orleans\"\n\ncredentials = { username = \"ops\", password = 73571234 }\n",
        "keyspace = \"orleans\"\n\n\ncredentials = { username = \"ops\", password = 73571234.5 }\n",
    ] {
        let path = config_file(body);
        let out = cli("membership")
            .args(["--config", path.to_str().unwrap(), "clusters"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        for secret in ["hunter2", "73571234"] {
            assert!(
                !all.contains(secret),
                "{secret} printed for {body:?}: {all}"
            );
        }
        assert!(
            all.contains("line 4") || all.contains("line 3"),
            "says where: {all}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn cleanup_removes_old_defunct_entries_and_reports_how_many() {
    let table = unique_table();
    let t = cluster(&table, "blue", false).await;
    let long_ago = Timestamp::now().saturating_sub(Duration::from_secs(10 * 24 * 3600));
    insert(
        &t,
        MembershipEntry::new(addr("10.0.0.9:1@1"), SiloStatus::Dead, long_ago),
    )
    .await;
    insert(
        &t,
        MembershipEntry::new(addr("10.0.0.8:1@1"), SiloStatus::Dead, Timestamp::now()),
    )
    .await;
    insert(
        &t,
        MembershipEntry::new(addr("10.0.0.7:1@1"), SiloStatus::Active, long_ago),
    )
    .await;

    let report = json(cli(&table).args([
        "--cluster",
        "blue",
        "cleanup",
        "--older-than",
        "7d",
        "--yes",
        "--json",
    ]));
    assert_eq!(report["removed"], 1, "{report}");
    assert_eq!(report["dry_run"], false, "{report}");
    assert_eq!(
        report["candidates"][0]["address"], "10.0.0.9:1@1",
        "{report}"
    );
    assert_eq!(report["older_than_seconds"], 7 * 24 * 3600);
    let left: Vec<String> = t
        .read_all()
        .await
        .unwrap()
        .rows
        .iter()
        .map(|r| r.entry.address.to_string())
        .collect();
    assert_eq!(left, ["10.0.0.7:1@1", "10.0.0.8:1@1"]);
    let human = text(cli(&table).args([
        "--cluster",
        "blue",
        "cleanup",
        "--older-than",
        "7d",
        "--yes",
    ]));
    assert!(human.starts_with("removed 0 defunct entries"), "{human}");
    drop_table(&t).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_cluster_says_what_it_deletes_refuses_without_yes_and_deletes_with_it() {
    let table = unique_table();
    let t = cluster(&table, "doomed", false).await;
    three_entries(&t).await;
    let keep = cluster(&table, "kept", false).await;
    insert(
        &keep,
        MembershipEntry::new(addr("10.0.1.1:1@1"), SiloStatus::Active, Timestamp::now()),
    )
    .await;

    let out = cli(&table)
        .args(["delete-cluster", "doomed"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("3 entries") && stderr.contains("--yes"),
        "{stderr}"
    );
    assert_eq!(
        t.read_all().await.unwrap().rows.len(),
        3,
        "nothing deleted without --yes"
    );

    let report = json(cli(&table).args(["delete-cluster", "doomed", "--yes", "--json"]));
    assert_eq!(report["deleted"], true);
    assert_eq!(report["entries"], 3);
    assert!(t.read_all().await.unwrap().rows.is_empty());
    assert_eq!(
        keep.read_all().await.unwrap().rows.len(),
        1,
        "only that cluster"
    );
    let clusters = json(cli(&table).args(["clusters", "--json"]));
    let ids: Vec<&str> = clusters["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["cluster_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["kept"]);
    drop_table(&t).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_prints_members_at_every_refresh() {
    let table = unique_table();
    let t = cluster(&table, "blue", false).await;
    three_entries(&t).await;
    let out = text(cli(&table).args([
        "--cluster",
        "blue",
        "watch",
        "--interval",
        "300ms",
        "--iterations",
        "2",
        "--json",
    ]));
    let docs: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(docs.len(), 2, "{out}");
    for d in docs {
        assert_eq!(d["schema"], 1, "{d}");
        assert_eq!(d["members"].as_array().unwrap().len(), 3);
    }
    drop_table(&t).await;
}

#[test]
fn a_bad_config_file_is_exit_2_naming_the_option() {
    let unknown = config_file("keyspace = \"orleans\"\nrequest_timout = \"5s\"\n");
    let out = cli("membership")
        .args(["--config", unknown.to_str().unwrap(), "clusters"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("request_timout"),
        "{out:?}"
    );

    let invalid = config_file("service_id = \"shop\"\ncluster_id = \"blue\"\npage_size = 0\n");
    let out = bare()
        .args(["--config", invalid.to_str().unwrap(), "members"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("page_size"),
        "{out:?}"
    );

    let out = cli("membership").arg("no-such-command").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

#[test]
fn an_unreachable_node_is_exit_1_within_the_timeout_and_credentials_are_never_echoed() {
    let started = Instant::now();
    let out = bare()
        .env("CASSANDRA_MEMBERSHIP_USERNAME", "operator")
        .env("CASSANDRA_MEMBERSHIP_PASSWORD", "pa55-never-printed")
        .args([
            "--contact-points",
            "127.0.0.1:1",
            "--request-timeout",
            "30s",
            "--connect-timeout",
            "2s",
            "clusters",
        ])
        .output()
        .unwrap();
    let elapsed = started.elapsed();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    // The whole attempt is bounded by the connect timeout, not the request timeout.
    assert!(elapsed < Duration::from_secs(2 + 3), "{elapsed:?}");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(all.contains("unavailable during connect"), "{all}");
    assert!(!all.contains("pa55-never-printed"), "{all}");
}

/// The error line carries the driver's reason once: the library's message already holds its
/// causes.
#[test]
fn an_unreachable_node_s_error_names_each_cause_once() {
    let out = bare()
        .args([
            "--contact-points",
            "127.0.0.1:1",
            "--connect-timeout",
            "2s",
            "clusters",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The driver's own warnings (above it) name the cause too: the error line is the CLI's.
    let line = stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line: {stderr}"));
    let refused = std::io::Error::from_raw_os_error(111).to_string();
    assert_eq!(line.matches(&refused).count(), 1, "{line}");
    assert!(line.contains("unavailable during connect"), "{line}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_keyspace_or_table_is_a_schema_error_exit_4() {
    // The test keyspace exists (on a fresh node no other test may have created it yet), so the
    // first case is about the table alone.
    let t = cluster(&unique_table(), "blue", false).await;
    drop_table(&t).await;
    for (keyspace, table, says) in [
        (
            keyspace(),
            "no_such_table_f14".to_owned(),
            "schema mismatch".to_owned(),
        ),
        (
            "no_such_keyspace_f14".to_owned(),
            "membership".to_owned(),
            "keyspace \"no_such_keyspace_f14\" does not exist".to_owned(),
        ),
    ] {
        let out = bare()
            .args(["--contact-points", &contact_points()])
            .args(["--keyspace", &keyspace, "--table", &table])
            .args(["--service", SERVICE, "--cluster", "blue", "members"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(4), "{keyspace}.{table}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(&says),
            "{out:?}"
        );
    }
}

/// A forgotten `--cluster` (or `--service`) is refused naming it, before connecting: there is
/// no default cluster an operator would read or clean by mistake. Table-wide commands need
/// neither.
#[test]
fn a_command_on_a_cluster_without_its_ids_is_exit_2_naming_them() {
    for (args, missing) in [
        (vec!["--service", SERVICE, "members"], "cluster_id: not set"),
        (vec!["--cluster", "blue", "members"], "service_id: not set"),
        (
            vec!["--service", SERVICE, "cleanup", "--older-than", "7d"],
            "cluster_id: not set",
        ),
        (vec!["delete-cluster", "blue"], "service_id: not set"),
        (
            vec![
                "--service",
                SERVICE,
                "declare-dead",
                "10.0.0.1:1@1",
                "--yes",
            ],
            "cluster_id: not set",
        ),
    ] {
        let out = bare()
            .args(["--contact-points", "127.0.0.1:1"])
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(missing), "{args:?}: {stderr}");
        let flag = if missing.starts_with("service") {
            "--service"
        } else {
            "--cluster"
        };
        assert!(stderr.contains(flag), "{args:?} names the flag: {stderr}");
        assert!(
            !stderr.contains("unavailable"),
            "refused before connecting: {stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn serial_datacenter_pins_the_commands_to_a_dc_and_an_unknown_one_is_exit_2() {
    let table = unique_table();
    let t = cluster(&table, "dc-pinned", false).await;
    three_entries(&t).await;
    // One node under SimpleSnitch: its DC is `datacenter1`.
    let report = json(
        cli(&table)
            .args(["--cluster", "dc-pinned", "--consistency", "local_quorum"])
            .args(["--serial-datacenter", "datacenter1", "--json", "members"]),
    );
    assert_eq!(
        report["members"].as_array().map(Vec::len),
        Some(3),
        "{report}"
    );
    // The spelling of 0.1 (`local-quorum`) and the flag's name up to 0.2 are still accepted.
    let report = json(
        cli(&table)
            .args(["--cluster", "dc-pinned", "--consistency", "local-quorum"])
            .args(["--local-datacenter", "datacenter1", "--json", "members"]),
    );
    assert_eq!(
        report["members"].as_array().map(Vec::len),
        Some(3),
        "{report}"
    );
    let out = cli(&table)
        .args(["--cluster", "dc-pinned", "--consistency", "local_quorum"])
        .env("CASSANDRA_MEMBERSHIP_SERIAL_DATACENTER", "dc9")
        .arg("members")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        stderr.contains("serial_datacenter")
            && stderr.contains("dc9")
            && stderr.contains("datacenter1"),
        "{stderr}"
    );
    // 0.2's variable still sets it (with a warning): a job that sets only it kept working.
    let out = cli(&table)
        .args(["--cluster", "dc-pinned", "--consistency", "local_quorum"])
        .env("CASSANDRA_MEMBERSHIP_LOCAL_DATACENTER", "datacenter1")
        .args(["--json", "members"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("deprecated"),
        "{out:?}"
    );
    // Without one, local-quorum is refused before connecting.
    let out = cli(&table)
        .args([
            "--cluster",
            "dc-pinned",
            "--consistency",
            "local_quorum",
            "members",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    drop_table(&t).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn clusters_exits_1_when_a_cluster_cannot_be_read_and_still_prints_the_others() {
    let table = unique_table();
    let blue = cluster(&table, "blue", false).await;
    three_entries(&blue).await;
    let green = cluster(&table, "green", false).await;
    // A version written by another program: no silo writes a negative version.
    blue.session()
        .query_unpaged(
            format!(
                "UPDATE {} SET version = -1 WHERE service_id = ? AND cluster_id = ? AND silo = ''",
                blue.qualified_table()
            ),
            (SERVICE, "blue"),
        )
        .await
        .unwrap();
    let out = cli(&table).args(["clusters", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["schema"], 1, "{report}");
    let list = report["clusters"].as_array().unwrap();
    assert_eq!(list.len(), 2, "{report}");
    let find = |id: &str| list.iter().find(|c| c["cluster_id"] == id).unwrap();
    assert!(find("blue")["error"].is_string(), "{report}");
    assert!(find("green")["error"].is_null(), "{report}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("blue"), "names the cluster: {stderr}");
    drop_table(&blue).await;
    drop(green);
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_cluster_removes_a_cluster_whose_version_is_damaged_and_names_a_missing_one() {
    let table = unique_table();
    let blue = cluster(&table, "blue", false).await;
    three_entries(&blue).await;
    // A version written by another program: the cluster cannot be inspected, yet it can go.
    blue.session()
        .query_unpaged(
            format!(
                "UPDATE {} SET version = -1 WHERE service_id = ? AND cluster_id = ? AND silo = ''",
                blue.qualified_table()
            ),
            (SERVICE, "blue"),
        )
        .await
        .unwrap();
    let report = json(cli(&table).args(["delete-cluster", "blue", "--yes", "--json"]));
    assert_eq!(report["deleted"], true, "{report}");
    assert!(report["damaged"].is_string(), "{report}");
    let left = blue
        .session()
        .query_unpaged(
            format!(
                "SELECT silo FROM {} WHERE service_id = ? AND cluster_id = ?",
                blue.qualified_table()
            ),
            (SERVICE, "blue"),
        )
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .rows_num();
    assert_eq!(left, 0, "the partition is empty");

    let out = cli(&table)
        .args(["delete-cluster", "no-such-cluster", "--yes"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no such cluster"), "{stderr}");
    drop_table(&blue).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cleanup_below_an_hour_needs_force_and_removes_nothing_without_it() {
    let table = unique_table();
    let t = cluster(&table, "blue", false).await;
    // A silo that is starting right now: a cutoff of "now" would remove it.
    insert(
        &t,
        MembershipEntry::new(addr("10.0.2.1:1@1"), SiloStatus::Joining, Timestamp::now()),
    )
    .await;
    let out = cli(&table)
        .args(["--cluster", "blue", "cleanup", "--older-than", "0s"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--force"));
    assert_eq!(t.read_all().await.unwrap().rows.len(), 1, "nothing removed");
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let report = json(cli(&table).args([
        "--cluster",
        "blue",
        "cleanup",
        "--older-than",
        "1s",
        "--force",
        "--yes",
        "--json",
    ]));
    assert_eq!(report["removed"], 1, "{report}");
    drop_table(&t).await;
}

#[test]
fn help_lists_the_exit_codes_and_completions_need_no_node() {
    let (help, _) = exits(bare().arg("--help"), 0);
    for line in [
        "Exit codes:",
        "0  ok",
        "1  the operation failed",
        "2  usage or configuration error",
        "3  refused: a change that needs --yes was not confirmed",
        "4  access denied",
    ] {
        assert!(help.contains(line), "{line:?} not in --help:\n{help}");
    }
    for cmd in [
        "declare-dead",
        "completions",
        "--tls-ca",
        "--config-key",
        "--verbose",
    ] {
        assert!(help.contains(cmd), "{cmd} not in --help:\n{help}");
    }
    // No node at all: completions connect to nothing.
    let (bash, _) = exits(
        bare().args(["--contact-points", "127.0.0.1:1", "completions", "bash"]),
        0,
    );
    assert!(
        bash.contains("complete -F _cassandra__membership"),
        "{bash}"
    );
    assert!(
        bash.contains("declare-dead") && bash.contains("--tls-server-name"),
        "{bash}"
    );
    let (zsh, _) = exits(bare().args(["completions", "zsh"]), 0);
    assert!(zsh.starts_with("#compdef cassandra-membership"), "{zsh}");
    let (_, stderr) = exits(bare().args(["completions", "cmd.exe"]), 2);
    assert!(stderr.contains("cmd.exe"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn members_of_an_unknown_cluster_fails_like_delete_cluster() {
    let table = unique_table();
    let t = cluster(&table, "blue", false).await;
    for args in [
        &["--cluster", "bleu", "members"][..],
        &["--cluster", "bleu", "members", "--json"][..],
        &["delete-cluster", "bleu", "--yes"][..],
    ] {
        let (stdout, stderr) = exits(cli(&table).args(args), 1);
        assert!(
            stderr.contains("no such cluster: service shop has no cluster bleu"),
            "{args:?}: {stderr}"
        );
        assert!(stdout.is_empty(), "{args:?}: {stdout}");
    }
    // A cluster with a version and no entries is a cluster.
    let m = json(cli(&table).args(["--cluster", "blue", "members", "--json"]));
    assert_eq!(m["members"], serde_json::json!([]), "{m}");
    drop_table(&t).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn declare_dead_refuses_without_yes_then_writes_dead_at_the_next_version() {
    let table = unique_table();
    let t = cluster(&table, "blue", false).await;
    three_entries(&t).await;
    let before = t.read_all().await.unwrap();
    let silo = "10.0.0.1:11111@1";

    let (stdout, stderr) = exits(
        cli(&table).args(["--cluster", "blue", "declare-dead", silo, "--json"]),
        3,
    );
    assert!(
        stderr.contains("refusing to declare 10.0.0.1:11111@1 dead without --yes"),
        "{stderr}"
    );
    // Under --json what it found is the stdout document (previous_status), not text on stderr.
    assert!(!stderr.contains("is active"), "{stderr}");
    let (_, preview) = exits(
        cli(&table).args(["--cluster", "blue", "declare-dead", silo]),
        3,
    );
    assert!(
        preview.contains("is active"),
        "says what it found: {preview}"
    );
    let refused: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(refused["schema"], 1);
    assert_eq!(refused["declared"], false, "{refused}");
    assert_eq!(refused["previous_status"], "active", "{refused}");
    assert_eq!(t.read_all().await.unwrap(), before, "nothing written");

    let r = json(cli(&table).args(["--cluster", "blue", "declare-dead", silo, "--yes", "--json"]));
    assert_eq!(r["declared"], true, "{r}");
    assert_eq!(r["previous_status"], "active");
    assert_eq!(r["version_read"], before.version.version);
    assert_eq!(r["version_written"], before.version.version + 1);
    assert_eq!(r["attempts"], 1);
    let after = t.read_all().await.unwrap();
    assert_eq!(after.version.version, before.version.version + 1);
    let row = after
        .rows
        .iter()
        .find(|r| r.entry.address == addr(silo))
        .unwrap();
    assert_eq!(row.entry.status, SiloStatus::Dead);
    assert_eq!(
        row.entry.silo_name, "silo-a",
        "the rest of the entry is kept"
    );
    assert_eq!(after.rows.len(), 3);

    // Again: already dead, nothing written, exit 0.
    let human = text(cli(&table).args(["--cluster", "blue", "declare-dead", silo, "--yes"]));
    assert!(human.contains("is already dead"), "{human}");
    assert_eq!(t.read_all().await.unwrap().version, after.version);
    drop_table(&t).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn declare_dead_refuses_an_address_not_in_the_table_and_a_malformed_one() {
    let table = unique_table();
    let t = cluster(&table, "blue", false).await;
    three_entries(&t).await;
    let before = t.read_all().await.unwrap();
    let (_, stderr) = exits(
        cli(&table).args([
            "--cluster",
            "blue",
            "declare-dead",
            "10.9.9.9:11111@1",
            "--yes",
        ]),
        1,
    );
    assert!(
        stderr.contains(
            "no such silo: 10.9.9.9:11111@1 is not in service shop cluster blue (3 entries"
        ),
        "{stderr}"
    );
    let (_, stderr) = exits(
        cli(&table).args([
            "--cluster",
            "blue",
            "declare-dead",
            "not-an-address",
            "--yes",
        ]),
        2,
    );
    assert!(stderr.contains("invalid silo address"), "{stderr}");
    let (_, stderr) = exits(
        cli(&table).args([
            "--cluster",
            "nope",
            "declare-dead",
            "10.0.0.1:11111@1",
            "--yes",
        ]),
        1,
    );
    assert!(stderr.contains("no such cluster"), "{stderr}");
    assert_eq!(t.read_all().await.unwrap(), before, "nothing written");
    drop_table(&t).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_declare_deads_each_land_as_their_own_version() {
    let table = unique_table();
    let t = cluster(&table, "blue", false).await;
    three_entries(&t).await;
    let before = t.read_all().await.unwrap().version.version;
    // Three writers of one partition at once: each conditional write that loses re-reads and
    // tries again at the newer version.
    let runs: Vec<_> = ["10.0.0.1:11111@1", "10.0.0.2:11111@1", "10.0.0.3:11111@1"]
        .into_iter()
        .map(|silo| {
            let table = table.clone();
            std::thread::spawn(move || {
                json(cli(&table).args([
                    "--cluster",
                    "blue",
                    "declare-dead",
                    silo,
                    "--yes",
                    "--json",
                ]))
            })
        })
        .collect();
    let reports: Vec<Value> = runs.into_iter().map(|h| h.join().unwrap()).collect();
    let after = t.read_all().await.unwrap();
    assert!(
        after
            .rows
            .iter()
            .all(|r| r.entry.status == SiloStatus::Dead),
        "{after:?}"
    );
    // 10.0.0.2 was Dead already: it writes nothing; the two others one version each.
    let written = reports.iter().filter(|r| r["declared"] == true).count() as u64;
    assert_eq!(written, 2, "{reports:?}");
    assert_eq!(after.version.version, before + 2, "{reports:?}");
    drop_table(&t).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cleanup_dry_run_lists_what_yes_removes_and_refuses_without_either() {
    let table = unique_table();
    let t = cluster(&table, "blue", false).await;
    let long_ago = Timestamp::now().saturating_sub(Duration::from_secs(10 * 24 * 3600));
    let mut old_dead = MembershipEntry::new(addr("10.0.3.1:1@1"), SiloStatus::Dead, long_ago);
    old_dead.silo_name = "gone".into();
    insert(&t, old_dead).await;
    // Old, but suspected recently: a suspicion vote is activity.
    let mut voted = MembershipEntry::new(addr("10.0.3.2:1@1"), SiloStatus::Dead, long_ago);
    voted.suspect_times.push(SuspectTime {
        suspecting_silo: addr("10.0.3.9:1@1"),
        time: Timestamp::now(),
    });
    insert(&t, voted).await;
    insert(
        &t,
        MembershipEntry::new(addr("10.0.3.3:1@1"), SiloStatus::Active, long_ago),
    )
    .await;
    let args = ["--cluster", "blue", "cleanup", "--older-than", "7d"];

    let dry = json(cli(&table).args(args).args(["--dry-run", "--json"]));
    assert_eq!(dry["dry_run"], true, "{dry}");
    assert!(dry["removed"].is_null(), "{dry}");
    let listed: Vec<&str> = dry["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["address"].as_str().unwrap())
        .collect();
    assert_eq!(listed, ["10.0.3.1:1@1"], "{dry}");
    assert_eq!(dry["candidates"][0]["status"], "dead");
    assert_eq!(dry["candidates"][0]["silo_name"], "gone");
    let human = text(cli(&table).args(args).arg("--dry-run"));
    assert!(
        human.starts_with("would remove 1 entry of service shop cluster blue"),
        "{human}"
    );
    assert!(
        human.contains("10.0.3.1:1@1") && !human.contains("10.0.3.2:1@1"),
        "{human}"
    );
    assert_eq!(
        t.read_all().await.unwrap().rows.len(),
        3,
        "a dry run removes nothing"
    );

    let (stdout, stderr) = exits(cli(&table).args(args), 3);
    assert!(
        stderr.contains("refusing to remove 1 entry without --yes"),
        "{stderr}"
    );
    assert!(
        stdout.contains("10.0.3.1:1@1"),
        "shows what it would remove: {stdout}"
    );
    assert_eq!(
        t.read_all().await.unwrap().rows.len(),
        3,
        "refused: nothing removed"
    );
    let (_, stderr) = exits(cli(&table).args(args).args(["--dry-run", "--yes"]), 2);
    assert!(stderr.contains("--dry-run"), "{stderr}");

    let done = json(cli(&table).args(args).args(["--yes", "--json"]));
    assert_eq!(done["removed"], 1, "{done}");
    assert_eq!(
        done["candidates"], dry["candidates"],
        "removes what the dry run listed"
    );
    let left: Vec<String> = t
        .read_all()
        .await
        .unwrap()
        .rows
        .iter()
        .map(|r| r.entry.address.to_string())
        .collect();
    assert_eq!(left, ["10.0.3.2:1@1", "10.0.3.3:1@1"]);
    drop_table(&t).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn verbose_and_rust_log_put_the_logs_on_stderr_and_never_on_stdout() {
    let table = unique_table();
    let t = cluster(&table, "blue", false).await;
    let members = ["--cluster", "blue", "members", "--json"];
    let quiet = cli(&table).args(members).output().unwrap();
    assert!(quiet.status.success(), "{quiet:?}");
    let stderr = String::from_utf8_lossy(&quiet.stderr);
    assert!(
        !stderr.contains("connecting"),
        "no info by default: {stderr}"
    );

    let out = cli(&table).args(members).arg("-v").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("INFO") && stderr.contains("connecting"),
        "{stderr}"
    );
    assert!(!stderr.contains("DEBUG"), "-v is info: {stderr}");
    let doc: Value = serde_json::from_slice(&out.stdout).expect("stdout stays JSON");
    assert_eq!(doc["schema"], 1);

    let out = cli(&table).args(members).arg("-vv").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("DEBUG"), "-vv is debug: {stderr}");
    serde_json::from_slice::<Value>(&out.stdout).expect("stdout stays JSON");

    // RUST_LOG wins over -v: only the driver's target at debug.
    let out = cli(&table)
        .args(members)
        .arg("-v")
        .env("RUST_LOG", "scylla=debug")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("scylla"), "{stderr}");
    assert!(
        !stderr.contains("connecting"),
        "RUST_LOG wins over -v: {stderr}"
    );
    let (_, stderr) = exits(cli(&table).args(members).env("RUST_LOG", "a=b=c"), 2);
    assert!(stderr.contains("RUST_LOG"), "{stderr}");
    drop_table(&t).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn clusters_shows_progress_on_stderr_once_the_scan_takes_long_but_not_under_json() {
    let table = unique_table();
    let blue = cluster(&table, "blue", false).await;
    let green = cluster(&table, "green", false).await;
    let out = cli(&table)
        .args(["clusters", "--progress-after", "0s"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("clusters: 0/2 read, reading shop/"),
        "{stderr}"
    );
    assert!(stderr.contains("clusters: 2/2 read in"), "{stderr}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("read"),
        "{out:?}"
    );
    // Under --json stderr holds JSON lines only: no progress text, and none in the document.
    let out = cli(&table)
        .args(["clusters", "--json", "--progress-after", "0s"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("read"),
        "{out:?}"
    );
    let doc: Value = serde_json::from_slice(&out.stdout).expect("no progress in the JSON");
    assert_eq!(doc["clusters"].as_array().unwrap().len(), 2);
    // A quick scan (the default: after one second) shows none.
    let out = cli(&table).args(["clusters", "--json"]).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("read"),
        "{out:?}"
    );
    drop_table(&blue).await;
    drop(green);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_default_config_path_and_config_key_supply_the_options() {
    let table = unique_table();
    let t = cluster(&table, "from-default", false).await;
    insert(
        &t,
        MembershipEntry::new(addr("10.0.4.1:1@1"), SiloStatus::Active, Timestamp::now()),
    )
    .await;
    let dir = std::env::temp_dir().join(format!("cm-cli-xdg-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(dir.join("cassandra-membership")).unwrap();
    std::fs::write(
        dir.join("cassandra-membership/config.toml"),
        "cluster_id = \"from-default\"\n",
    )
    .unwrap();
    let m = json(
        cli(&table)
            .env("XDG_CONFIG_HOME", &dir)
            .args(["members", "--json"]),
    );
    assert_eq!(m["cluster_id"], "from-default", "{m}");
    assert_eq!(m["members"][0]["address"], "10.0.4.1:1@1");
    // Without XDG_CONFIG_HOME: ~/.config.
    let home = std::env::temp_dir().join(format!("cm-cli-home-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(home.join(".config")).unwrap();
    std::fs::rename(&dir, home.join(".config").join("x")).unwrap();
    std::fs::rename(
        home.join(".config/x/cassandra-membership"),
        home.join(".config/cassandra-membership"),
    )
    .unwrap();
    let m = json(
        cli(&table)
            .env_remove("XDG_CONFIG_HOME")
            .env("HOME", &home)
            .args(["members", "--json"]),
    );
    assert_eq!(m["cluster_id"], "from-default", "{m}");
    // --config wins over the default path.
    let other = config_file("cluster_id = \"not-there\"\n");
    let (_, stderr) = exits(
        cli(&table)
            .env("HOME", &home)
            .env_remove("XDG_CONFIG_HOME")
            .args(["--config", other.to_str().unwrap(), "members"]),
        1,
    );
    assert!(stderr.contains("no cluster not-there"), "{stderr}");

    // An application's file with the options nested in it.
    let app = config_file(
        "[server]\nport = 8080\n[server.membership]\ncluster_id = \"from-default\"\n[server.membership.membership]\ndefunct_silo_expiration = \"1h\"\n",
    );
    let app = app.to_str().unwrap();
    let m = json(cli(&table).args([
        "--config",
        app,
        "--config-key",
        "server.membership",
        "members",
        "--json",
    ]));
    assert_eq!(m["cluster_id"], "from-default", "{m}");
    let (_, stderr) = exits(
        cli(&table).args(["--config", app, "--config-key", "server.nope", "members"]),
        2,
    );
    assert!(stderr.contains("has no table [server.nope]"), "{stderr}");
    let (_, stderr) = exits(
        cli(&table).args(["--config", app, "--config-key", "server.port", "members"]),
        2,
    );
    assert!(
        stderr.contains("server.port") && stderr.contains("is not a table"),
        "{stderr}"
    );
    // The whole file is not the options: its unknown keys are named.
    let (_, stderr) = exits(cli(&table).args(["--config", app, "members"]), 2);
    assert!(stderr.contains("server"), "{stderr}");
    let bad = config_file("[app]\nkeyspaec = \"x\"\n");
    let (_, stderr) = exits(
        cli(&table).args([
            "--config",
            bad.to_str().unwrap(),
            "--config-key",
            "app",
            "members",
        ]),
        2,
    );
    assert!(
        stderr.contains("keyspaec") && stderr.contains("[app]"),
        "{stderr}"
    );
    let (_, stderr) = exits(cli(&table).args(["--config-key", "app", "members"]), 2);
    assert!(stderr.contains("needs a config file"), "{stderr}");
    let _ = std::fs::remove_dir_all(home);
    drop_table(&t).await;
}

#[test]
fn one_spelling_of_each_value_and_tls_flags_are_validated_before_connecting() {
    let (_, stderr) = exits(
        bare()
            .args(["--service", "shop", "--cluster", "blue"])
            .args(["--consistency", "local", "members"]),
        2,
    );
    assert!(
        stderr.contains("local_quorum"),
        "names the spelling: {stderr}"
    );
    // A certificate without its key, and a key without its certificate.
    let (_, stderr) = exits(
        bare()
            .args(["--service", "shop", "--cluster", "blue"])
            .args(["--tls-ca", "/ca.pem", "--tls-cert", "/c.pem", "members"]),
        2,
    );
    assert!(stderr.contains("tls.key_file"), "{stderr}");
    let (_, stderr) = exits(
        bare()
            .args(["--service", "shop", "--cluster", "blue"])
            .args(["--tls-ca", "/ca.pem", "--tls-key", "/k.pem", "members"]),
        2,
    );
    assert!(stderr.contains("tls.cert_file"), "{stderr}");
    let (_, stderr) = exits(
        bare()
            .args(["--service", "shop", "--cluster", "blue"])
            .args(["--tls-server-name", "db.internal", "members"]),
        2,
    );
    assert!(stderr.contains("tls.ca_file"), "{stderr}");
    let (_, stderr) = exits(
        bare()
            .args(["--service", "shop", "--cluster", "blue"])
            .args([
                "--tls-ca",
                "/no/such/ca.pem",
                "--contact-points",
                "127.0.0.1:1",
                "members",
            ]),
        2,
    );
    assert!(
        stderr.contains("tls.ca_file") && stderr.contains("/no/such/ca.pem"),
        "{stderr}"
    );
    // `verify = false` in the file would silently ignore the CA and the name given on the
    // command line (any certificate accepted): refused, naming each.
    let file = config_file("[tls]\nverify = false\n");
    let file = file.to_str().unwrap();
    for (flag, value, option) in [
        ("--tls-ca", "/ca.pem", "tls.ca_file"),
        ("--tls-server-name", "db.internal", "tls.server_name"),
    ] {
        let (_, stderr) = exits(
            bare()
                .args(["--config", file, "--service", "shop", "--cluster", "blue"])
                .args([flag, value, "members"]),
            2,
        );
        assert!(
            stderr.contains(option) && stderr.contains("tls.verify is off"),
            "{flag}: {stderr}"
        );
    }
}

/// On a cluster with storage-side expiry, `declare-dead` without `--ttl` (the library's default
/// is off) must not write the entry and the version `USING TTL 0` — they would never expire, and
/// a silo starting with the cluster's options would fail `TtlMismatch`. It writes with the table's TTL;
/// a `--ttl` that disagrees with the cluster (off, or on with another expiration) is refused
/// (exit 2) before anything is written.
#[tokio::test(flavor = "multi_thread")]
async fn declare_dead_writes_with_the_clusters_ttl_and_refuses_one_that_disagrees() {
    let table = unique_table();
    let t = cluster(&table, "blue", true).await;
    assert!(t.storage_expiry().covers_defunct_cleanup);
    let stuck = MembershipEntry::new(
        addr("10.0.0.7:11111@1"),
        SiloStatus::Active,
        Timestamp::now(),
    );
    insert(&t, stuck).await;
    let before = t.inspect().await.unwrap();
    let entry_ttl = before.entries[0].ttl_seconds.expect("the entry expires");
    assert!(before.version_ttl_seconds.is_some_and(|s| s > 0));

    // --ttl false, and --ttl true with the CLI's default expiration (7 days, the table's 1 h).
    for ttl in ["false", "true"] {
        let (_, stderr) = exits(
            cli(&table).args(["--ttl", ttl, "--cluster", "blue"]).args([
                "declare-dead",
                "10.0.0.7:11111@1",
                "--yes",
            ]),
            2,
        );
        assert!(
            stderr.contains("default_time_to_live") && stderr.contains("no --ttl"),
            "--ttl {ttl}: says why and what to do: {stderr}"
        );
    }
    let refused = t.inspect().await.unwrap();
    assert_eq!(
        refused.entries[0].entry.status,
        SiloStatus::Active,
        "nothing written"
    );

    let r = json(cli(&table).args([
        "--cluster",
        "blue",
        "declare-dead",
        "10.0.0.7:11111@1",
        "--yes",
        "--json",
    ]));
    assert_eq!(r["declared"], true, "{r}");
    let after = t.inspect().await.unwrap();
    assert_eq!(after.entries[0].entry.status, SiloStatus::Dead);
    // A silo of the cluster starting now (same options, default ttl_mismatch policy: throw).
    let restart = CassandraMembershipTable::connect(options(&table, "blue", true))
        .await
        .unwrap();
    let started = restart.initialize(true).await;
    let found = format!(
        "entry ttl_seconds {:?} (before {entry_ttl}), version_ttl_seconds {:?}, a starting silo's initialize: {:?}",
        after.entries[0].ttl_seconds, after.version_ttl_seconds, started
    );
    assert!(
        after.entries[0]
            .ttl_seconds
            .is_some_and(|s| s > 0 && s <= entry_ttl + 5),
        "{found}"
    );
    assert!(after.version_ttl_seconds.is_some_and(|s| s > 0), "{found}");
    assert!(started.is_ok(), "{found}");
    drop_table(&t).await;
}

/// The mirror case on a table without expiry: `--ttl true` is refused (exit 2), the default
/// writes without TTL.
#[tokio::test(flavor = "multi_thread")]
async fn declare_dead_with_ttl_on_a_cluster_without_expiry_is_refused() {
    let table = unique_table();
    let t = cluster(&table, "blue", false).await;
    let stuck = MembershipEntry::new(
        addr("10.0.0.8:11111@1"),
        SiloStatus::Active,
        Timestamp::now(),
    );
    insert(&t, stuck).await;
    let (_, stderr) = exits(
        cli(&table).args([
            "--ttl",
            "true",
            "--cluster",
            "blue",
            "declare-dead",
            "10.0.0.8:11111@1",
            "--yes",
        ]),
        2,
    );
    assert!(stderr.contains("no expiry"), "{stderr}");
    assert_eq!(
        t.inspect().await.unwrap().entries[0].entry.status,
        SiloStatus::Active
    );
    let r = json(cli(&table).args([
        "--cluster",
        "blue",
        "declare-dead",
        "10.0.0.8:11111@1",
        "--yes",
        "--json",
    ]));
    assert_eq!(r["declared"], true, "{r}");
    let after = t.inspect().await.unwrap();
    assert_eq!(after.entries[0].entry.status, SiloStatus::Dead);
    assert_eq!(after.entries[0].ttl_seconds, None);
    drop_table(&t).await;
}

/// A cluster with a short TTL (60 s, a 10 s heartbeat) and a short renewal
/// (5 s): `declare-dead` without `--ttl` adopts the table's TTL and succeeds (it used to fail
/// validation with the CLI's own 30 s heartbeat period), and the entry it writes stays within
/// what the cluster's silos accept (a silo starting afterwards finds no disagreeing row).
#[tokio::test(flavor = "multi_thread")]
async fn declare_dead_on_a_short_ttl_cluster_with_a_custom_renewal_keeps_the_silos_start() {
    let table = unique_table();
    let short = |o: CassandraClusteringOptions| {
        let mut o = o.ttl_renewal_interval(Some(Duration::from_secs(5)));
        o.membership.defunct_silo_expiration = Duration::from_secs(60);
        o.membership.i_am_alive_table_publish_timeout = Duration::from_secs(10);
        o
    };
    let t = CassandraMembershipTable::connect(short(options(&table, "blue", true)))
        .await
        .unwrap();
    t.initialize(true).await.unwrap();
    let stuck = MembershipEntry::new(
        addr("10.0.0.6:11111@1"),
        SiloStatus::Active,
        Timestamp::now(),
    );
    insert(&t, stuck).await;
    let r = json(cli(&table).args([
        "--cluster",
        "blue",
        "declare-dead",
        "10.0.0.6:11111@1",
        "--yes",
        "--json",
    ]));
    assert_eq!(r["declared"], true, "{r}");
    let after = t.inspect().await.unwrap();
    assert_eq!(after.entries[0].entry.status, SiloStatus::Dead);
    let restart = CassandraMembershipTable::connect(short(options(&table, "blue", true)))
        .await
        .unwrap();
    let started = restart.initialize(true).await;
    assert!(
        started.is_ok(),
        "entry ttl {:?}, version ttl {:?}: {started:?}",
        after.entries[0].ttl_seconds,
        after.version_ttl_seconds
    );
    drop_table(&t).await;
}

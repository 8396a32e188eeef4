//! The command line's own surface: how a command names its cluster, how failures read under
//! `--json`, what is checked before connecting, and how long the help is. Most tests need no
//! node (they point at a port nothing listens on); the one that deletes a cluster runs against
//! the real node at `CASSANDRA_CONTACT_POINTS` and fails loudly without one.

use std::time::{Duration, Instant};

use assert_cmd::Command;
use cassandra_membership::MembershipTable;
use serde_json::Value;

mod common;
use common::{SERVICE, cluster_with_one_active_silo, connected, exits};

const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// The binary without the caller's environment, pointed at a port nothing listens on.
fn unreachable() -> Command {
    let mut c = common::bare(COMMAND_TIMEOUT);
    c.args(["--contact-points", "127.0.0.1:1", "--connect-timeout", "2s"]);
    c
}

/// The failure object a `--json` run ends stderr with.
fn failure(stderr: &str) -> Value {
    let last = stderr
        .lines()
        .last()
        .unwrap_or_else(|| panic!("nothing on stderr"));
    let doc: Value = serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("the last stderr line is not JSON ({e}): {stderr}"));
    assert_eq!(doc["schema"], 1, "{doc}");
    assert!(doc["error"].is_object(), "{doc}");
    doc
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_cluster_takes_its_cluster_from_the_command_line_only() {
    let (table, t) = cluster_with_one_active_silo("blue").await;
    let cli = || {
        let mut c = connected(COMMAND_TIMEOUT, &table);
        c.args(["--service", SERVICE]);
        c
    };

    // `--cluster blue` names the cluster to delete: shown, refused without --yes (clap used to
    // stop at a usage line naming `<CLUSTER>` twice, exit 2).
    let (_, stderr) = exits(cli().args(["delete-cluster", "--cluster", "blue"]), 3);
    assert!(
        stderr.contains("1 entr") && stderr.contains("--yes"),
        "{stderr}"
    );
    // The argument and the flag must agree.
    let (_, stderr) = exits(
        cli().args(["--cluster", "blue", "delete-cluster", "green", "--yes"]),
        2,
    );
    assert!(
        stderr.contains("green") && stderr.contains("blue"),
        "{stderr}"
    );
    // The variable, a default for the commands on one cluster, gives way to the argument.
    let (_, stderr) = exits(
        cli()
            .env("CASSANDRA_MEMBERSHIP_CLUSTER", "green")
            .args(["delete-cluster", "blue"]),
        3,
    );
    assert!(stderr.contains("1 entr"), "{stderr}");
    // Neither: a usage error naming both ways.
    let (_, stderr) = exits(cli().args(["delete-cluster", "--yes"]), 2);
    assert!(
        stderr.contains("delete-cluster <CLUSTER_ID>") && stderr.contains("--cluster"),
        "{stderr}"
    );
    // The variable alone does not name the cluster to delete, even with --yes: a destructive
    // command names its target on the command line (a stale export must not pick it).
    let (_, stderr) = exits(
        cli()
            .env("CASSANDRA_MEMBERSHIP_CLUSTER", "blue")
            .args(["delete-cluster", "--yes"]),
        2,
    );
    assert!(
        stderr.contains("CASSANDRA_MEMBERSHIP_CLUSTER") && stderr.contains("command line"),
        "{stderr}"
    );
    assert_eq!(t.read_all().await.unwrap().rows.len(), 1, "nothing deleted");
    let (stdout, _) = exits(
        cli().args(["--cluster", "blue", "--json", "delete-cluster", "--yes"]),
        0,
    );
    assert!(stdout.contains("\"deleted\": true"), "{stdout}");
    assert!(t.read_all().await.unwrap().rows.is_empty());
    let (help, _) = exits(
        common::bare(COMMAND_TIMEOUT).args(["delete-cluster", "-h"]),
        0,
    );
    let usage = help.lines().find(|l| l.starts_with("Usage:")).unwrap();
    assert_eq!(usage.matches("CLUSTER").count(), 1, "{usage}");
    let _ = t
        .session()
        .query_unpaged(format!("DROP TABLE IF EXISTS {}", t.qualified_table()), ())
        .await;
}

#[test]
fn under_json_a_failure_is_one_json_object_with_its_kind_exit_code_and_causes() {
    // The library failed: no node answers.
    let (stdout, stderr) = exits(
        unreachable().args([
            "--json",
            "--service",
            "shop",
            "--cluster",
            "blue",
            "members",
        ]),
        1,
    );
    assert!(stdout.is_empty(), "stdout keeps only documents: {stdout}");
    let doc = failure(&stderr);
    let error = &doc["error"];
    assert_eq!(error["kind"], "failed", "{doc}");
    assert_eq!(error["exit_code"], 1, "{doc}");
    assert_eq!(error["variant"], "Unavailable", "{doc}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("unavailable during connect"), "{doc}");
    let causes: Vec<&str> = error["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    let refused = std::io::Error::from_raw_os_error(111).to_string();
    assert_eq!(
        causes.iter().filter(|c| c.contains(&refused)).count(),
        1,
        "the OS's reason once among the causes: {causes:?}"
    );
    // The CLI's own usage error (no --cluster for a command on one cluster).
    let (_, stderr) = exits(
        unreachable().args(["--json", "--service", "shop", "members"]),
        2,
    );
    let doc = failure(&stderr);
    assert_eq!(doc["error"]["kind"], "usage", "{doc}");
    assert_eq!(doc["error"]["exit_code"], 2, "{doc}");
    assert!(
        doc["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--cluster"),
        "{doc}"
    );
    // clap's usage error, found before anything else.
    let (_, stderr) = exits(
        unreachable().args(["--json", "--no-such-flag", "clusters"]),
        2,
    );
    let doc = failure(&stderr);
    assert_eq!(doc["error"]["kind"], "usage", "{doc}");
    assert!(
        doc["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--no-such-flag"),
        "{doc}"
    );
    // Without --json, the one text line stays.
    let (_, stderr) = exits(unreachable().args(["--no-such-flag", "clusters"]), 2);
    assert!(stderr.starts_with("error: "), "{stderr}");
}

#[test]
fn declare_dead_rejects_a_malformed_address_before_connecting() {
    let started = Instant::now();
    let (_, stderr) = exits(
        unreachable().args([
            "--service",
            "shop",
            "--cluster",
            "blue",
            "declare-dead",
            "10.0.0.7:11111",
            "--yes",
        ]),
        2,
    );
    assert!(stderr.contains("invalid silo address"), "{stderr}");
    assert!(
        !stderr.contains("unavailable"),
        "it never tried to connect: {stderr}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

/// Before: `-h` was 70 lines, the longest 606 characters (113 rows on a 100-column terminal),
/// `--help` 126 lines. `-h` is now one-line summaries (62 lines, 70 rows); `--help` keeps every
/// detail.
#[test]
fn short_help_fits_a_screen_and_long_help_keeps_the_details() {
    let (short, _) = exits(common::bare(COMMAND_TIMEOUT).arg("-h"), 0);
    let lines = short.lines().count();
    let widest = short.lines().map(|l| l.chars().count()).max().unwrap();
    assert!(lines <= 65, "-h is {lines} lines:\n{short}");
    assert!(
        widest <= 140,
        "-h has a line of {widest} characters:\n{short}"
    );
    assert!(
        short.contains("--help"),
        "-h says where the rest is:\n{short}"
    );
    let (long, _) = exits(common::bare(COMMAND_TIMEOUT).arg("--help"), 0);
    for detail in [
        "4  access denied",
        "CASSANDRA_MEMBERSHIP_PASSWORD",
        "relative to the file's directory",
        "--local-datacenter",
        "stderr is JSON Lines, the last line is the failure",
        "on the command line only (not from the variable alone)",
    ] {
        assert!(long.contains(detail), "{detail:?} not in --help:\n{long}");
    }
    // Each subcommand's own -h is short too.
    for cmd in ["declare-dead", "migrate", "cleanup"] {
        let (help, _) = exits(common::bare(COMMAND_TIMEOUT).args([cmd, "-h"]), 0);
        let widest = help.lines().map(|l| l.chars().count()).max().unwrap();
        assert!(widest <= 140, "{cmd} -h has a line of {widest}:\n{help}");
    }
}

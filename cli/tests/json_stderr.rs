//! Under `--json`, stderr is JSON Lines: every line a script reads from stderr is a JSON object,
//! the failure the last one. These parse the WHOLE of stderr, as such a script would, not only
//! its last line.

use std::time::Duration;

use serde_json::Value;

mod common;
use common::{SERVICE, cluster_with_one_active_silo, connected};

const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// Every non-empty stderr line is a JSON object, and the last one is the failure (an
/// `error` object); returns the failure.
fn assert_stderr_is_json_lines_ending_in_the_failure(stderr: &str) -> Value {
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    let not_json: Vec<&&str> = lines
        .iter()
        .filter(|l| !serde_json::from_str::<Value>(l).is_ok_and(|v| v.is_object()))
        .collect();
    assert!(
        not_json.is_empty(),
        "under --json stderr holds {} line(s) that are not JSON objects: {not_json:#?}\nwhole stderr:\n{stderr}",
        not_json.len()
    );
    let last: Value = serde_json::from_str(lines.last().expect("a failure on stderr")).unwrap();
    assert!(
        last["error"].is_object(),
        "the last line is the failure: {stderr}"
    );
    last
}

/// A contact point that refuses connections: the driver logs WARN/ERROR events (the CLI's
/// default level is "warnings") before the failure; each must be a JSON line. No node needed.
#[test]
fn json_driver_log_events_before_the_failure_are_json_lines() {
    let out = common::bare(COMMAND_TIMEOUT)
        .args(["--contact-points", "127.0.0.1:1", "--connect-timeout", "2s"])
        .args([
            "--json",
            "--service",
            "shop",
            "--cluster",
            "blue",
            "members",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let doc = assert_stderr_is_json_lines_ending_in_the_failure(&stderr);
    assert_eq!(doc["error"]["variant"], "Unavailable", "{doc}");
}

/// A refused destructive command (no --yes, exit 3) under --json: the "say what will go"
/// preview is in the stdout document, not a text line on stderr before the failure. Needs the
/// node at CASSANDRA_CONTACT_POINTS.
#[tokio::test(flavor = "multi_thread")]
async fn json_refusal_of_delete_cluster_prints_no_text_preview_on_stderr() {
    let (table, t) = cluster_with_one_active_silo("blue").await;

    let out = connected(COMMAND_TIMEOUT, &table)
        .args(["--service", SERVICE, "--json", "delete-cluster", "blue"])
        .output()
        .unwrap();
    let _ = t
        .session()
        .query_unpaged(format!("DROP TABLE IF EXISTS {}", t.qualified_table()), ())
        .await;
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let doc = assert_stderr_is_json_lines_ending_in_the_failure(&stderr);
    assert_eq!(doc["error"]["kind"], "refused", "{doc}");
}

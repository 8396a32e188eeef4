//! The built binary against the node that speaks only TLS and asks for a password
//! (`scripts/cassandra.sh start-secure`: 127.0.0.9, certificate in the cache's `secure/node.pem`;
//! or `CASSANDRA_SECURE_CONTACT_POINT` and `CASSANDRA_SECURE_CERT`). Not run by a plain
//! `cargo test` (the node is started for the secure stage of `scripts/test.sh`, which runs
//! `cargo test -p cassandra-membership-cli --test secure`). Never skips: no node, no pass.
//! `grants`: the printed grants, enough for a role on that node (it runs CassandraAuthorizer).

use std::path::PathBuf;
use std::time::Duration;

use assert_cmd::Command;
use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, MembershipEntry, MembershipTable,
    SiloStatus, Timestamp, TlsOptions,
};
use serde_json::Value;

const KEYSPACE: &str = "cm_secure";
const SERVICE: &str = "cli-secure";

#[path = "secure/grants.rs"]
mod grants;

fn contact_point() -> String {
    std::env::var("CASSANDRA_SECURE_CONTACT_POINT").unwrap_or_else(|_| "127.0.0.9:9042".into())
}

fn certificate() -> PathBuf {
    if let Ok(p) = std::env::var("CASSANDRA_SECURE_CERT") {
        return p.into();
    }
    let home = std::env::var("CASSANDRA_MEMBERSHIP_HOME").unwrap_or_else(|_| {
        format!(
            "{}/.cache/cassandra-membership",
            std::env::var("HOME").unwrap_or_default()
        )
    });
    PathBuf::from(home).join("secure/node.pem")
}

/// A cluster with one Active entry on the secure node, made through the library's `tls`
/// options; returns its id.
async fn secure_cluster() -> (String, CassandraMembershipTable) {
    let cert = certificate();
    assert!(
        cert.is_file(),
        "no certificate at {}: start the secure node with `scripts/cassandra.sh start-secure`",
        cert.display()
    );
    let cluster = format!("c-{}", uuid::Uuid::new_v4().simple());
    let options = CassandraClusteringOptions::default()
        .keyspace(KEYSPACE)
        .service_id(SERVICE)
        .cluster_id(cluster.clone())
        .contact_points([contact_point()])
        .credentials("cassandra", "cassandra")
        .create_keyspace_simple(1)
        .request_timeout(Duration::from_secs(30))
        .tls(TlsOptions::with_ca_file(&cert));
    let t = CassandraMembershipTable::connect(options)
        .await
        .unwrap_or_else(|e| panic!("the secure node at {} ({e:?})", contact_point()));
    t.initialize(true).await.expect("initialize");
    let v = t.read_all().await.unwrap().version;
    let e = MembershipEntry::new(
        "10.1.0.1:11111@1".parse().unwrap(),
        SiloStatus::Active,
        Timestamp::now(),
    );
    assert!(t.insert_row(&e, &v.next()).await.unwrap());
    (cluster, t)
}

/// The binary for the secure node: no inherited CASSANDRA_MEMBERSHIP_* variables, no default
/// config file, credentials from the environment as an operator passes them.
fn cli(password: &str) -> Command {
    let mut c = Command::cargo_bin("cassandra-membership").unwrap();
    for (k, _) in std::env::vars() {
        if k.starts_with("CASSANDRA_MEMBERSHIP_") {
            c.env_remove(k);
        }
    }
    c.env_remove("RUST_LOG")
        .env(
            "XDG_CONFIG_HOME",
            std::env::temp_dir().join("cm-cli-no-config-here"),
        )
        .env("CASSANDRA_MEMBERSHIP_USERNAME", "cassandra")
        .env("CASSANDRA_MEMBERSHIP_PASSWORD", password)
        .timeout(Duration::from_secs(120))
        .args(["--contact-points", &contact_point(), "--keyspace", KEYSPACE])
        .args(["--service", SERVICE, "--request-timeout", "30s"]);
    c
}

fn run(c: &mut Command, code: i32) -> (String, String) {
    let out = c.output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    (stdout, stderr)
}

#[tokio::test(flavor = "multi_thread")]
async fn members_over_tls_with_the_ca_flag_and_the_server_name() {
    let (cluster, _t) = secure_cluster().await;
    let cert = certificate();
    let cert = cert.to_str().unwrap();
    let (stdout, _) = run(
        cli("cassandra").args([
            "--tls-ca",
            cert,
            "--tls-server-name",
            "127.0.0.9",
            "members",
            "--cluster",
            &cluster,
            "--json",
        ]),
        0,
    );
    let m: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(m["schema"], 1);
    assert_eq!(m["members"][0]["address"], "10.1.0.1:11111@1", "{m}");
    // The same from the config file's [tls] section (and the default server name), its
    // relative path taken from the file's directory, not the working directory.
    let dir = std::env::temp_dir().join(format!("cm-cli-tls-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(cert, dir.join("node.pem")).unwrap();
    let path = dir.join("config.toml");
    std::fs::write(&path, "[tls]\nca_file = \"node.pem\"\n").unwrap();
    let (stdout, _) = run(
        cli("cassandra").current_dir(std::env::temp_dir()).args([
            "--config",
            path.to_str().unwrap(),
            "--cluster",
            &cluster,
            "members",
        ]),
        0,
    );
    assert!(
        stdout.contains("10.1.0.1:11111@1") && stdout.contains("active"),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_untrusted_certificate_and_a_missing_ca_file_are_exit_2() {
    let (cluster, _t) = secure_cluster().await;
    let (_, stderr) = run(
        cli("cassandra").args([
            "--tls-ca",
            "/etc/ssl/certs/ca-certificates.crt",
            "--connect-timeout",
            "10s",
            "members",
            "--cluster",
            &cluster,
        ]),
        2,
    );
    assert!(stderr.contains("UnknownIssuer"), "{stderr}");
    let cert = certificate();
    let (_, stderr) = run(
        cli("cassandra").args([
            "--tls-ca",
            cert.to_str().unwrap(),
            "--tls-server-name",
            "db.example.com",
            "members",
            "--cluster",
            &cluster,
        ]),
        2,
    );
    // A name mismatch is configuration too (`TlsHandshake`): exit 2, in rustls' words.
    assert!(stderr.contains("not valid for name"), "{stderr}");
    let (_, stderr) = run(
        cli("cassandra").args([
            "--tls-ca",
            "/no/such/node.pem",
            "members",
            "--cluster",
            &cluster,
        ]),
        2,
    );
    assert!(
        stderr.contains("tls.ca_file: /no/such/node.pem: cannot read it"),
        "{stderr}"
    );
    // Plain TCP to a TLS-only node: no session.
    let (_, stderr) = run(
        cli("cassandra").args(["--connect-timeout", "5s", "members", "--cluster", &cluster]),
        1,
    );
    assert!(stderr.contains("unavailable during connect"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_password_is_access_denied_exit_4_and_never_printed() {
    let (cluster, _t) = secure_cluster().await;
    let cert = certificate();
    let (stdout, stderr) = run(
        cli("wrong-pa55word").args([
            "--tls-ca",
            cert.to_str().unwrap(),
            "members",
            "--cluster",
            &cluster,
        ]),
        4,
    );
    assert!(
        stderr.contains("access denied to user \"cassandra\""),
        "{stderr}"
    );
    assert!(
        !format!("{stdout}{stderr}").contains("wrong-pa55word"),
        "{stderr}"
    );
}

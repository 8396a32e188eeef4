//! TLS and authentication against a real node that speaks only TLS and asks for a password
//! (`scripts/cassandra.sh start-secure`: 127.0.0.9, certificate in the cache's `secure/node.pem`).
//! Built with `--features rustls`; `scripts/test.sh` runs this module on its own.

use std::sync::Arc;
use std::time::Duration;

use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, MembershipEntry, MembershipError,
    MembershipTable, SiloStatus, Timestamp, TlsOptions,
};
use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::logs::Captured;
use crate::utils::unique;

/// The keyspace the secure node's tests use (created by the superuser).
const SECURE_KEYSPACE: &str = "cm_secure";

fn secure_contact_point() -> String {
    std::env::var("CASSANDRA_SECURE_CONTACT_POINT").unwrap_or_else(|_| "127.0.0.9:9042".into())
}

fn certificate_path() -> std::path::PathBuf {
    if let Ok(p) = std::env::var("CASSANDRA_SECURE_CERT") {
        return p.into();
    }
    let home = std::env::var("CASSANDRA_MEMBERSHIP_HOME").unwrap_or_else(|_| {
        format!(
            "{}/.cache/cassandra-membership",
            std::env::var("HOME").unwrap_or_default()
        )
    });
    std::path::Path::new(&home).join("secure/node.pem")
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// A rustls configuration that trusts exactly the secure node's self-signed certificate.
fn trusting_config() -> Arc<rustls::ClientConfig> {
    let path = certificate_path();
    let cert = CertificateDer::from_pem_file(&path).unwrap_or_else(|e| {
        panic!(
            "no certificate at {} ({e}): start the secure node with `scripts/cassandra.sh start-secure` \
             or run `scripts/test.sh`",
            path.display()
        )
    });
    let mut roots = RootCertStore::empty();
    roots.add(cert).expect("a valid certificate");
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// A rustls configuration that trusts nothing.
fn distrusting_config() -> Arc<rustls::ClientConfig> {
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(RootCertStore::empty())
            .with_no_client_auth(),
    )
}

/// Options for a fresh cluster on the secure node. The keyspace and table are made by the
/// superuser (`fresh_role`); a role granted only that keyspace needs no CREATE on all keyspaces.
fn secure_options(user: &str, password: &str) -> CassandraClusteringOptions {
    CassandraClusteringOptions::default()
        .keyspace(SECURE_KEYSPACE)
        .service_id("secure-service")
        .cluster_id(unique("c"))
        .contact_points([secure_contact_point()])
        .credentials(user, password)
        .request_timeout(Duration::from_secs(10))
}

async fn connect(
    options: CassandraClusteringOptions,
    tls: Arc<rustls::ClientConfig>,
) -> cassandra_membership::Result<CassandraMembershipTable> {
    // Bounded here too: a hang is a failure of its own, not a slow test.
    tokio::time::timeout(
        Duration::from_secs(60),
        CassandraMembershipTable::connect_tls(options, tls),
    )
    .await
    .expect("connect_tls returned within 60 s")
}

fn entry() -> MembershipEntry {
    let address = format!("127.0.0.1:{}@1", 20_000 + rand_port())
        .parse()
        .unwrap();
    MembershipEntry::new(address, SiloStatus::Active, Timestamp::now())
}

fn rand_port() -> u16 {
    (uuid::Uuid::new_v4().as_u128() % 10_000) as u16
}

/// Connects as the superuser and creates a login role with a fresh random password that may use
/// the test keyspace; returns (role, password).
async fn fresh_role() -> (String, String) {
    let admin = connect(
        secure_options("cassandra", "cassandra").create_keyspace_simple(1),
        trusting_config(),
    )
    .await
    .expect("the superuser connects over TLS");
    admin
        .initialize(true)
        .await
        .expect("initialize as superuser");
    let role = format!("cm_{}", uuid::Uuid::new_v4().simple());
    let password = format!("pw-{}", uuid::Uuid::new_v4().simple());
    let session = admin.session();
    // DDL takes no bind markers; both names are hex made here, nothing a user typed.
    session
        .query_unpaged(
            format!("CREATE ROLE {role} WITH PASSWORD = '{password}' AND LOGIN = true"),
            (),
        )
        .await
        .expect("create a role");
    session
        .query_unpaged(
            format!("GRANT ALL PERMISSIONS ON KEYSPACE {SECURE_KEYSPACE} TO {role}"),
            (),
        )
        .await
        .expect("grant the role the test keyspace");
    (role, password)
}

#[tokio::test]
async fn tls_with_a_trusted_certificate_and_right_credentials_works() {
    let (role, password) = fresh_role().await;
    let table = connect(secure_options(&role, &password), trusting_config())
        .await
        .expect("connect_tls with a trusted certificate and right credentials");
    table.initialize(true).await.expect("initialize");
    let snapshot = table.read_all().await.expect("read_all");
    let e = entry();
    assert!(
        table
            .insert_row(&e, &snapshot.version.next())
            .await
            .expect("insert")
    );
    let snapshot = table.read_all().await.expect("read_all");
    assert_eq!(snapshot.rows.len(), 1);
    assert_eq!(snapshot.rows[0].entry.address, e.address);
    assert_eq!(snapshot.version.version, 1);
}

#[tokio::test]
async fn a_client_that_does_not_trust_the_certificate_fails_clearly() {
    let started = std::time::Instant::now();
    let err = connect(
        secure_options("cassandra", "cassandra"),
        distrusting_config(),
    )
    .await
    .expect_err("a client that trusts nothing must not connect");
    let text = format!("{err} {err:?}");
    assert!(
        text.contains("UnknownIssuer") || text.to_lowercase().contains("certificate"),
        "the error says the certificate is not trusted: {text}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "failed in {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn wrong_credentials_are_an_authentication_error_that_names_the_user_not_the_password() {
    let (role, password) = fresh_role().await;
    let wrong = format!("{password}-wrong");
    let err = connect(secure_options(&role, &wrong), trusting_config())
        .await
        .expect_err("a wrong password must not connect");
    // A transient `Unavailable` would make hosts retry forever with the same wrong password.
    assert!(
        matches!(err, MembershipError::AccessDenied { .. }),
        "wrong credentials are an access error, not a transient outage: {err:?}"
    );
    let text = format!("{err} {err:?}");
    assert!(text.contains(&role), "the error names the user: {text}");
    assert!(
        !text.contains(&wrong),
        "the error never shows the password: {text}"
    );
}

/// Set in the process [`the_password_appears_in_no_log_line_at_trace_level`] runs itself in.
const LOG_CAPTURE_PROCESS: &str = "CM_TEST_LOG_CAPTURE_PROCESS";

/// The test runs in a process of its own (this test binary again, this test alone), where its
/// subscriber is the global one: tracing caches each callsite's interest process-wide, and a
/// thread-scoped subscriber misses events whose callsites other tests' threads registered at
/// the same moment (it passed only with one test thread).
#[tokio::test]
async fn the_password_appears_in_no_log_line_at_trace_level() {
    if std::env::var_os(LOG_CAPTURE_PROCESS).is_none() {
        let name = module_path!()
            .split_once("::")
            .map_or("", |(_, m)| m)
            .to_owned()
            + "::the_password_appears_in_no_log_line_at_trace_level";
        let out = std::process::Command::new(std::env::current_exe().expect("the test binary"))
            .args(["--exact", &name, "--test-threads", "1", "--nocapture"])
            .env(LOG_CAPTURE_PROCESS, "1")
            .output()
            .expect("run the test binary again");
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        eprintln!("{stderr}");
        assert!(
            out.status.success() && stdout.contains("test result: ok. 1 passed"),
            "the log capture in its own process ran and passed ({name}):\n{stdout}"
        );
        return;
    }
    let (role, password) = fresh_role().await;
    let wrong = format!("{password}-wrong");
    let captured = Captured::default();
    let sink = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::set_global_default(subscriber).expect("the process's only subscriber");
    let options = secure_options(&role, &password);
    let debug_text = format!("{options:?}");
    let table = connect(options, trusting_config()).await.expect("connect");
    table.initialize(true).await.expect("initialize");
    let snapshot = table.read_all().await.expect("read_all");
    table
        .insert_row(&entry(), &snapshot.version.next())
        .await
        .expect("insert");
    let _ = connect(secure_options(&role, &wrong), trusting_config()).await;
    drop(table);
    let logs = captured.text();
    // Proof that the capture saw the driver at its most verbose level: TRACE lines from the
    // driver's own targets (how many depends on whether the table already existed).
    let driver_trace = logs
        .lines()
        .filter(|l| l.contains("TRACE") && l.contains("scylla"))
        .count();
    eprintln!(
        "captured {} lines, {driver_trace} driver TRACE lines",
        logs.lines().count()
    );
    assert!(
        driver_trace > 0,
        "TRACE logging of the driver was captured ({} lines in all)",
        logs.lines().count()
    );
    assert!(
        logs.contains(&role) || logs.contains("initialize"),
        "the run is in the logs"
    );
    for secret in [&password, &wrong] {
        assert!(
            !logs.contains(secret.as_str()),
            "a password appears in the logs: {}",
            logs.lines()
                .find(|l| l.contains(secret.as_str()))
                .unwrap_or_default()
        );
    }
    assert!(
        !debug_text.contains(&password),
        "Debug of the options hides the password"
    );
}

/// TLS from options (`tls` section): the library reads the PEM files and builds the rustls
/// configuration itself.
fn tls_options(tls: TlsOptions) -> CassandraClusteringOptions {
    secure_options("cassandra", "cassandra")
        .tls(tls)
        .create_keyspace_simple(1)
}

async fn connect_with_options(
    options: CassandraClusteringOptions,
) -> cassandra_membership::Result<CassandraMembershipTable> {
    tokio::time::timeout(
        Duration::from_secs(60),
        CassandraMembershipTable::connect(options),
    )
    .await
    .expect("connect returned within 60 s")
}

#[tokio::test]
async fn connect_through_options_with_the_node_s_ca_file_works() {
    for tls in [
        TlsOptions::with_ca_file(certificate_path()),
        // The certificate names 127.0.0.9: naming it explicitly works too.
        TlsOptions::with_ca_file(certificate_path()).server_name("127.0.0.9"),
    ] {
        let table = connect_with_options(tls_options(tls.clone()))
            .await
            .unwrap_or_else(|e| panic!("connect with {tls:?}: {e:?}"));
        table.initialize(true).await.expect("initialize");
        let snapshot = table.read_all().await.expect("read_all");
        assert!(
            table
                .insert_row(&entry(), &snapshot.version.next())
                .await
                .expect("insert")
        );
        assert_eq!(table.read_all().await.unwrap().rows.len(), 1);
    }
}

#[tokio::test]
async fn a_wrong_ca_or_server_name_fails_with_a_typed_error_about_the_certificate() {
    // A bundle of public CAs, none of which signed the node's certificate.
    let public = std::path::Path::new("/etc/ssl/certs/ca-certificates.crt");
    assert!(
        public.exists(),
        "the system CA bundle is needed for this test"
    );
    for (tls, expected) in [
        (TlsOptions::with_ca_file(public), "UnknownIssuer"),
        (
            TlsOptions::with_ca_file(certificate_path()).server_name("db.example.com"),
            "not valid for name",
        ),
    ] {
        let err = connect_with_options(tls_options(tls.clone()))
            .await
            .expect_err("an untrusted certificate must not connect");
        // A configuration error: a retry loop must not spin on it.
        assert!(
            matches!(
                err,
                MembershipError::TlsHandshake {
                    operation: "connect",
                    ..
                }
            ),
            "{tls:?}: {err:?}"
        );
        assert!(!err.is_transient(), "{err:?}");
        // The cause is in the message itself, once.
        let text = err.to_string();
        assert_eq!(text.matches(expected).count(), 1, "{tls:?}: {text}");
    }
}

#[tokio::test]
async fn a_missing_or_mismatched_tls_file_is_a_configuration_error_naming_it() {
    let missing = std::env::temp_dir().join("cm-no-such-ca.pem");
    let err = connect_with_options(tls_options(TlsOptions::with_ca_file(&missing)))
        .await
        .expect_err("no CA file");
    match &err {
        MembershipError::InvalidConfiguration { option, reason } => {
            assert_eq!(option, "tls.ca_file");
            assert!(reason.contains(&missing.display().to_string()), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    // The node's certificate with a key that is not its own.
    let dir = std::env::temp_dir().join(format!("cm-tls-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = self_signed(&dir, "a");
    let (_, other_key) = self_signed(&dir, "b");
    let ok = TlsOptions::with_ca_file(certificate_path()).client_certificate(&cert, &key);
    // The node asks for no client certificate: presenting one is accepted.
    connect_with_options(tls_options(ok))
        .await
        .expect("connect with a client certificate and its key");
    let mismatched =
        TlsOptions::with_ca_file(certificate_path()).client_certificate(&cert, &other_key);
    let err = connect_with_options(tls_options(mismatched))
        .await
        .expect_err("a key of another certificate");
    match &err {
        MembershipError::InvalidConfiguration { option, reason } => {
            assert_eq!(option, "tls.key_file");
            assert!(
                reason.contains("is not the key of the certificate"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A fresh EC key and self-signed certificate made by the `openssl` command: (cert, key).
fn self_signed(dir: &std::path::Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let cert = dir.join(format!("{name}.pem"));
    let key = dir.join(format!("{name}.key"));
    let status = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "1", "-subj", "/CN=cm-client"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("the openssl command makes the test's client certificates");
    assert!(status.success(), "openssl req");
    (cert, key)
}

#[tokio::test]
async fn verify_off_connects_to_any_certificate_and_says_so_in_a_warning() {
    let captured = Captured::default();
    let guard = captured.warnings();
    // No CA at all: with verification off, the node's certificate is not checked.
    let table = connect_with_options(tls_options(TlsOptions::default().verify(false)))
        .await
        .expect("verify = false connects without a CA");
    drop(guard);
    table.initialize(true).await.expect("initialize");
    let logs = captured.text();
    assert!(
        logs.contains("WARN") && logs.contains("tls.verify = false"),
        "a warning names the setting: {logs}"
    );
}

//! The grants `cassandra-membership schema` / `SchemaScript::for_options` prints, against the
//! secure node (PasswordAuthenticator + CassandraAuthorizer, superuser cassandra / cassandra):
//! a DBA runs the printed DDL and grants as the superuser, then a login role holding only those
//! grants runs every statement a silo (and the runtime's cleanup) makes, on the schema the DBA
//! created. Run with the rest of `secure.rs` in the secure stage of `scripts/test.sh`.

use std::time::Duration;

use assert_cmd::Command;
use cassandra_membership::cassandra::SchemaScript;
use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, MembershipEntry, MembershipTable,
    SiloAddress, SiloStatus, Timestamp, TlsOptions, TtlMismatchPolicy,
};

use super::{SERVICE, certificate, contact_point};

fn addr(text: &str) -> SiloAddress {
    text.parse().unwrap()
}

fn tls() -> TlsOptions {
    let cert = certificate();
    assert!(
        cert.is_file(),
        "no certificate at {}: start the secure node with `scripts/cassandra.sh start-secure`",
        cert.display()
    );
    TlsOptions::with_ca_file(&cert)
}

fn admin_options() -> CassandraClusteringOptions {
    CassandraClusteringOptions::default()
        .keyspace("system")
        .table("unused")
        .service_id(SERVICE)
        .cluster_id("unused")
        .contact_points([contact_point()])
        .credentials("cassandra", "cassandra")
        .request_timeout(Duration::from_secs(30))
        .tls(tls())
}

async fn admin() -> CassandraMembershipTable {
    CassandraMembershipTable::connect(admin_options())
        .await
        .unwrap_or_else(|e| {
            panic!(
                "the secure node at {} as the superuser ({e}): start it with \
                 `scripts/cassandra.sh start-secure`",
                contact_point()
            )
        })
}

async fn run(admin: &CassandraMembershipTable, cql: &str) {
    admin
        .session()
        .query_unpaged(cql, ())
        .await
        .unwrap_or_else(|e| panic!("{cql}: {e}"));
}

/// A fresh keyspace (created by the DBA) and a login role with no permission yet.
async fn keyspace_and_role(admin: &CassandraMembershipTable) -> (String, String) {
    keyspace_and_role_named(admin, "cm_grants_").await
}

async fn keyspace_and_role_named(
    admin: &CassandraMembershipTable,
    prefix: &str,
) -> (String, String) {
    let id = &uuid::Uuid::new_v4().simple().to_string()[..10];
    let (keyspace, role) = (format!("{prefix}{id}"), format!("Silo_{id}"));
    run(
        admin,
        &format!(
            "CREATE KEYSPACE \"{keyspace}\" WITH replication = \
             {{'class': 'SimpleStrategy', 'replication_factor': 1}}"
        ),
    )
    .await;
    run(
        admin,
        &format!("CREATE ROLE '{role}' WITH LOGIN = true AND PASSWORD = 'pw-{role}'"),
    )
    .await;
    admin.session().await_schema_agreement().await.unwrap();
    (keyspace, role)
}

fn silo_options(keyspace: &str, role: &str) -> CassandraClusteringOptions {
    CassandraClusteringOptions::default()
        .keyspace(keyspace)
        .table("members")
        .service_id(SERVICE)
        .cluster_id("blue")
        .contact_points([contact_point()])
        .credentials(role, format!("pw-{role}"))
        .ttl(true)
        .request_timeout(Duration::from_secs(30))
        .tls(tls())
}

/// The DBA runs `script`'s DDL and its `grants` (not `grants_to_create`: the role creates
/// nothing), as docs::schema "Creating the schema ahead of the silos" says.
async fn dba_runs(admin: &CassandraMembershipTable, script: &SchemaScript) {
    for statement in script.statements() {
        run(admin, statement).await;
    }
    admin.session().await_schema_agreement().await.unwrap();
    for grant in &script.grants {
        run(admin, grant).await;
    }
}

/// Every call a silo (and the runtime's cleanup) makes, as the role holding only the grants.
async fn every_silo_statement(t: &CassandraMembershipTable) {
    t.initialize(true).await.expect("initialize");
    let version = t.read_all().await.expect("read_all").version;
    let a = addr("10.0.0.1:11111@1");
    let entry = MembershipEntry::new(a.clone(), SiloStatus::Active, Timestamp::now());
    assert!(
        t.insert_row(&entry, &version.next())
            .await
            .expect("insert_row")
    );
    t.update_i_am_alive(&a, Timestamp::now())
        .await
        .expect("update_i_am_alive");
    let snapshot = t.read_row(&a).await.expect("read_row");
    let row = snapshot.get(&a).expect("the row").clone();
    let mut dead = row.entry.clone();
    dead.status = SiloStatus::Dead;
    assert!(
        t.update_row(&dead, &row.etag, &snapshot.version.next())
            .await
            .expect("update_row")
    );
    t.audit_ttl().await.expect("audit_ttl");
    let later = Timestamp::from_millis(Timestamp::now().as_millis() + 3_600_000);
    t.cleanup_dead_entries(later)
        .await
        .expect("cleanup_dead_entries");
    t.cleanup_defunct(later).await.expect("cleanup_defunct");
    t.delete_cluster("blue").await.expect("delete_cluster");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_printed_grants_suffice_for_every_silo_statement_under_throw() {
    let admin = admin().await;
    let (keyspace, role) = keyspace_and_role(&admin).await;
    let options = silo_options(&keyspace, &role);
    dba_runs(&admin, &SchemaScript::for_options(&options, &role).unwrap()).await;
    let t = CassandraMembershipTable::connect(options)
        .await
        .expect("connect");
    every_silo_statement(&t).await;
}

/// Names that need quotes: a mixed-case keyspace, table and role.
#[tokio::test(flavor = "multi_thread")]
async fn the_printed_ddl_and_grants_work_for_names_that_need_quotes() {
    let admin = admin().await;
    let (keyspace, role) = keyspace_and_role_named(&admin, "CM_Grants_").await;
    let options = silo_options(&keyspace, &role).table("Members");
    dba_runs(&admin, &SchemaScript::for_options(&options, &role).unwrap()).await;
    let t = CassandraMembershipTable::connect(options)
        .await
        .expect("connect");
    every_silo_statement(&t).await;
}

/// `ttl_mismatch = "patch"`: the table was created with another TTL (expiry off, say, before
/// the operator turned it on); the grants printed for the new options add ALTER.
#[tokio::test(flavor = "multi_thread")]
async fn the_printed_grants_suffice_for_a_patch() {
    let admin = admin().await;
    let (keyspace, role) = keyspace_and_role(&admin).await;
    let off = silo_options(&keyspace, &role).ttl(false);
    for statement in SchemaScript::for_options(&off, &role).unwrap().statements() {
        run(&admin, statement).await;
    }
    let t = CassandraMembershipTable::connect(off.clone())
        .await
        .unwrap();
    let before = SchemaScript::for_options(&off, &role).unwrap();
    for grant in &before.grants {
        run(&admin, grant).await;
    }
    // Some rows written with expiry off, for the patch to rewrite.
    t.initialize(true)
        .await
        .expect("initialize with expiry off");
    let version = t.read_all().await.unwrap().version;
    let entry = MembershipEntry::new(
        addr("10.0.0.2:11111@1"),
        SiloStatus::Active,
        Timestamp::now(),
    );
    assert!(t.insert_row(&entry, &version.next()).await.unwrap());

    let on = silo_options(&keyspace, &role).ttl_mismatch(TtlMismatchPolicy::Patch);
    for grant in &SchemaScript::for_options(&on, &role).unwrap().grants {
        run(&admin, grant).await;
    }
    // The role's permissions are cached by the node (permissions_validity, 2 s by default).
    tokio::time::sleep(Duration::from_secs(4)).await;
    let t = CassandraMembershipTable::connect(on)
        .await
        .expect("connect");
    t.initialize(true).await.expect("initialize under patch");
    let audit = t.audit_ttl().await.unwrap();
    assert_eq!(audit.table_default_ttl, audit.configured_ttl);
}

/// With `create_keyspace_with_replication` the DDL starts with `CREATE KEYSPACE IF NOT EXISTS`;
/// the DBA runs it and the printed `grants` (not `grants_to_create`, for a role that creates the
/// schema itself). `initialize` must then create nothing: Cassandra checks the CREATE permission
/// before it looks at IF NOT EXISTS, so a `CREATE KEYSPACE IF NOT EXISTS` on every start was
/// refused (AccessDenied) and the silo never joined.
#[tokio::test(flavor = "multi_thread")]
async fn with_create_keyspace_initialize_issues_no_create_on_a_keyspace_that_exists() {
    let admin = admin().await;
    let id = &uuid::Uuid::new_v4().simple().to_string()[..10];
    let (keyspace, role) = (format!("cm_grants_{id}"), format!("silo_{id}"));
    run(
        &admin,
        &format!("CREATE ROLE '{role}' WITH LOGIN = true AND PASSWORD = 'pw-{role}'"),
    )
    .await;
    let options = silo_options(&keyspace, &role).create_keyspace_simple(1);
    let script = SchemaScript::for_options(&options, &role).unwrap();
    assert!(script.create_keyspace.is_some());
    dba_runs(&admin, &script).await;
    let t = CassandraMembershipTable::connect(options)
        .await
        .expect("connect");
    t.initialize(true)
        .await
        .expect("initialize on the schema the DBA created, with the printed grants");
}

/// docs::schema: "an operator's `cassandra-membership migrate` creates its new table, so its
/// role needs `CREATE` on the keyspace" besides the silos' grants (on the source table). A role
/// holding exactly that migrates a 0.2-shape table with one cluster.
#[tokio::test(flavor = "multi_thread")]
async fn migrate_with_the_documented_grants() {
    let admin = admin().await;
    let (keyspace, role) = keyspace_and_role(&admin).await;
    let old = format!("\"{keyspace}\".\"old\"");
    run(
        &admin,
        &format!(
            "CREATE TABLE {old} (service_id text, cluster_id text, silo text, \
             version bigint static, version_etag uuid static, \
             heartbeats map<text, frozen<tuple<timestamp, timestamp>>> static, etag uuid, \
             status int, suspect_times frozen<list<frozen<tuple<text, timestamp>>>>, \
             proxy_port int, host_name text, silo_name text, role_name text, update_zone int, \
             fault_zone int, start_time timestamp, i_am_alive timestamp, \
             PRIMARY KEY ((service_id, cluster_id), silo)) \
             WITH default_time_to_live = 0 AND gc_grace_seconds = 3600"
        ),
    )
    .await;
    admin.session().await_schema_agreement().await.unwrap();
    let now = Timestamp::now().as_millis() - 600_000;
    run(
        &admin,
        &format!(
            "UPDATE {old} USING TIMESTAMP {t} SET version = 2, version_etag = uuid() \
             WHERE service_id = '{SERVICE}' AND cluster_id = 'blue'",
            t = now * 1000
        ),
    )
    .await;
    run(
        &admin,
        &format!(
            "UPDATE {old} USING TIMESTAMP {t} SET etag = uuid(), status = 6, suspect_times = [], \
             proxy_port = 0, host_name = 'h', silo_name = 's', role_name = 'r', update_zone = 0, \
             fault_zone = 0, start_time = {now}, i_am_alive = {now} \
             WHERE service_id = '{SERVICE}' AND cluster_id = 'blue' AND silo = '10.0.0.1:11111@1'",
            t = now * 1000
        ),
    )
    .await;
    for grant in [
        format!("GRANT SELECT ON TABLE {old} TO '{role}'"),
        format!("GRANT MODIFY ON TABLE {old} TO '{role}'"),
        format!("GRANT CREATE ON KEYSPACE \"{keyspace}\" TO '{role}'"),
    ] {
        run(&admin, &grant).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut cli = Command::cargo_bin("cassandra-membership").unwrap();
    for (k, _) in std::env::vars() {
        if k.starts_with("CASSANDRA_MEMBERSHIP_") {
            cli.env_remove(k);
        }
    }
    let out = cli
        .env_remove("RUST_LOG")
        .env(
            "XDG_CONFIG_HOME",
            std::env::temp_dir().join("cm-cli-no-config-here"),
        )
        .timeout(Duration::from_secs(180))
        .env("CASSANDRA_MEMBERSHIP_USERNAME", &role)
        .env("CASSANDRA_MEMBERSHIP_PASSWORD", format!("pw-{role}"))
        .args([
            "--contact-points",
            &contact_point(),
            "--keyspace",
            &keyspace,
        ])
        .args(["--tls-ca", certificate().to_str().unwrap()])
        .args([
            "--table",
            "old",
            "--ttl",
            "false",
            "--request-timeout",
            "30s",
        ])
        .args(["migrate", "--to-table", "new", "--force"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "migrate as a role with the documented grants: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

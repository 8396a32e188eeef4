//! Validation of the Cassandra options: every option a host gives is checked before anything runs.

use super::*;

fn option_of(r: Result<()>) -> String {
    match r {
        Err(MembershipError::InvalidConfiguration { option, .. }) => option,
        other => panic!("expected InvalidConfiguration, got {other:?}"),
    }
}

/// Defaults for everything but the two identities, which have none.
fn named() -> CassandraClusteringOptions {
    CassandraClusteringOptions::default()
        .service_id("s")
        .cluster_id("c")
}

#[test]
fn defaults_validate_once_the_identities_are_named() {
    named().validate().unwrap();
    assert_eq!(named().write_ttl_seconds(), 0);
}

#[test]
fn identifiers_are_validated_before_anything_runs() {
    for bad in [
        "",
        "1abc",
        "a-b",
        "a\"b",
        "a;drop",
        &"x".repeat(49),
        "ks.tbl",
    ] {
        let o = CassandraClusteringOptions::default()
            .keyspace(bad)
            .service_id("s")
            .cluster_id("c");
        assert_eq!(option_of(o.validate()), "keyspace");
        let o = CassandraClusteringOptions::default()
            .keyspace("ks")
            .service_id("s")
            .cluster_id("c")
            .table(bad);
        assert_eq!(option_of(o.validate()), "table");
    }
}

#[test]
fn empty_ids_are_rejected() {
    assert_eq!(
        option_of(
            CassandraClusteringOptions::default()
                .keyspace("ks")
                .service_id("")
                .cluster_id("c")
                .validate()
        ),
        "service_id"
    );
    assert_eq!(
        option_of(
            CassandraClusteringOptions::default()
                .keyspace("ks")
                .service_id("s")
                .cluster_id("")
                .validate()
        ),
        "cluster_id"
    );
}

#[test]
fn ttl_is_defunct_expiration_rounded_up_plus_renewal() {
    let mut o = CassandraClusteringOptions::default()
        .keyspace("ks")
        .service_id("s")
        .cluster_id("c")
        .ttl(true);
    o.membership.defunct_silo_expiration = Duration::from_millis(100_001);
    o.membership.i_am_alive_table_publish_timeout = Duration::from_secs(1);
    o.validate().unwrap();
    assert_eq!(o.ttl_seconds(), Some(101));
    assert_eq!(o.renewal_seconds(), 11);
    assert_eq!(o.write_ttl_seconds(), 101 + 11 + 1);
}

#[test]
fn ttl_must_span_several_heartbeats() {
    let mut o = CassandraClusteringOptions::default()
        .keyspace("ks")
        .service_id("s")
        .cluster_id("c")
        .ttl(true);
    o.membership.defunct_silo_expiration = Duration::from_secs(60);
    assert_eq!(
        option_of(o.validate()),
        "membership.defunct_silo_expiration"
    );
    // The same expiration is fine when expiry is off.
    o.ttl = false;
    o.validate().unwrap();
}

#[test]
fn ttl_beyond_cassandra_limits_is_rejected() {
    let mut o = CassandraClusteringOptions::default()
        .keyspace("ks")
        .service_id("s")
        .cluster_id("c")
        .ttl(true);
    o.membership.defunct_silo_expiration = Duration::from_secs(MAX_TTL_SECONDS);
    assert_eq!(
        option_of(o.validate()),
        "membership.defunct_silo_expiration"
    );
    o.membership.defunct_silo_expiration = Duration::from_secs(15 * 365 * 24 * 3600);
    assert_eq!(
        option_of(o.validate()),
        "membership.defunct_silo_expiration"
    );
}

#[test]
fn renewal_interval_must_be_under_half_the_ttl() {
    let mut o = CassandraClusteringOptions::default()
        .keyspace("ks")
        .service_id("s")
        .cluster_id("c")
        .ttl(true);
    o.ttl_renewal_interval = Some(Duration::from_secs(5 * 24 * 3600));
    assert_eq!(option_of(o.validate()), "ttl_renewal_interval");
}

#[test]
fn extreme_options_are_errors_not_panics() {
    let mut o = CassandraClusteringOptions::default()
        .keyspace("ks")
        .service_id("s")
        .cluster_id("c")
        .ttl(true);
    o.membership.i_am_alive_table_publish_timeout = Duration::MAX;
    o.membership.defunct_silo_expiration = Duration::MAX;
    o.ttl_renewal_interval = Some(Duration::MAX);
    o.gc_grace = Duration::MAX;
    o.request_timeout = Duration::MAX;
    assert!(o.validate().is_err());
    let _ = (o.ttl_seconds(), o.renewal_seconds(), o.write_ttl_seconds());
    o.ttl = false;
    assert!(o.validate().is_err(), "gc_grace is still too large");
}

#[test]
fn password_never_in_debug() {
    let o = CassandraClusteringOptions::default().credentials("app", "s3cr3t-pw");
    assert!(!format!("{o:?}").contains("s3cr3t-pw"));
    assert!(format!("{o:?}").contains("app"));
}

#[test]
fn replication_map_is_validated() {
    let mut o = named().create_keyspace_simple(1);
    o.validate().unwrap();
    o.create_keyspace_with_replication
        .as_mut()
        .unwrap()
        .insert("x'}".into(), "1".into());
    assert_eq!(option_of(o.validate()), "create_keyspace_with_replication");
}

#[test]
fn human_readable_durations_deserialize() {
    let o: CassandraClusteringOptions = toml::from_str(
        "request_timeout = \"2s 500ms\"\nttl_mismatch = \"patch\"\nconsistency = \"local_quorum\"",
    )
    .unwrap();
    assert_eq!(o.request_timeout, Duration::from_millis(2500));
    assert_eq!(o.ttl_mismatch, TtlMismatchPolicy::Patch);
    assert_eq!(o.consistency, ConsistencyProfile::LocalQuorum);
}

#[test]
fn blank_ids_huge_renewals_and_membership_errors_are_named() {
    let o = CassandraClusteringOptions::default()
        .keyspace("ks")
        .service_id("svc")
        .cluster_id(" \t ");
    assert_eq!(option_of(o.validate()), "cluster_id");
    let o = CassandraClusteringOptions::default()
        .keyspace("ks")
        .service_id("  ")
        .cluster_id("c");
    assert_eq!(option_of(o.validate()), "service_id");
    let mut o = CassandraClusteringOptions::default()
        .keyspace("ks")
        .service_id("svc")
        .cluster_id("c")
        .ttl(true);
    o.ttl_renewal_interval = Some(Duration::MAX);
    assert_eq!(option_of(o.validate()), "ttl_renewal_interval");
    let mut o = CassandraClusteringOptions::default()
        .keyspace("ks")
        .service_id("svc")
        .cluster_id("c");
    o.membership.defunct_silo_expiration = Duration::ZERO;
    assert_eq!(
        option_of(o.validate()),
        "membership.defunct_silo_expiration"
    );
    o.membership.defunct_silo_expiration = Duration::from_secs(3600);
    o.membership.num_votes_for_death_declaration = 0;
    assert_eq!(
        option_of(o.validate()),
        "membership.num_votes_for_death_declaration"
    );
}

#[test]
fn credentials_reject_unknown_fields() {
    let typo = toml::from_str::<Credentials>("username = \"u\"\npassword = \"\"\npasword = \"p\"");
    assert!(typo.is_err(), "a misspelt password must not be ignored");
    toml::from_str::<Credentials>("username = \"u\"\npassword = \"p\"").unwrap();
}

#[test]
fn local_quorum_needs_a_serial_datacenter_and_names_it() {
    let o = CassandraClusteringOptions::default()
        .keyspace("ks")
        .service_id("svc")
        .cluster_id("c")
        .consistency(ConsistencyProfile::LocalQuorum);
    assert_eq!(option_of(o.clone().validate()), "serial_datacenter");
    o.clone().serial_datacenter("dc1").validate().unwrap();
    for bad in ["", " dc1", "dc\n1"] {
        assert_eq!(
            option_of(o.clone().serial_datacenter(bad).validate()),
            "serial_datacenter",
            "{bad:?}"
        );
    }
    // `quorum` takes one as the DC tried first; without one it is as before.
    CassandraClusteringOptions::default()
        .keyspace("ks")
        .service_id("svc")
        .cluster_id("c")
        .serial_datacenter("dc2")
        .validate()
        .unwrap();
    let o: CassandraClusteringOptions = toml::from_str(
        "service_id = \"s\"\ncluster_id = \"c\"\nconsistency = \"local_quorum\"\nserial_datacenter = \"eu-west\"",
    )
    .unwrap();
    assert_eq!(o.serial_datacenter.as_deref(), Some("eu-west"));
    o.validate().unwrap();
}

/// The option's 0.2 name, `local_datacenter`, still sets it — in a file and through the
/// deprecated builder — and options are written back under the new name.
#[test]
#[allow(deprecated)]
fn the_old_name_local_datacenter_sets_the_serial_datacenter() {
    let o: CassandraClusteringOptions = toml::from_str(
        "service_id = \"s\"\ncluster_id = \"c\"\nconsistency = \"local_quorum\"\nlocal_datacenter = \"dc1\"",
    )
    .unwrap();
    assert_eq!(o.serial_datacenter.as_deref(), Some("dc1"));
    o.validate().unwrap();
    let written = toml::to_string(&o).unwrap();
    assert!(written.contains("serial_datacenter = \"dc1\""), "{written}");
    assert!(!written.contains("local_datacenter"), "{written}");
    let built = CassandraClusteringOptions::default().local_datacenter("dc2");
    assert_eq!(built.serial_datacenter.as_deref(), Some("dc2"));
    let both = toml::from_str::<CassandraClusteringOptions>(
        "local_datacenter = \"dc1\"\nserial_datacenter = \"dc2\"",
    );
    assert!(both.is_err(), "two names for one option: {both:?}");
}

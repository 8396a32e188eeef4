//! Options and silo addresses a host gets wrong are refused with an error naming what is wrong,
//! through the public API only.

use std::time::Duration;

use cassandra_membership::{
    CassandraClusteringOptions, Clock, Credentials, ManualClock, MembershipError,
    MembershipOptions, SiloAddress, Timestamp,
};

fn option_of(r: cassandra_membership::Result<()>) -> String {
    match r {
        Err(MembershipError::InvalidConfiguration { option, .. }) => option,
        other => panic!("expected InvalidConfiguration, got {other:?}"),
    }
}

#[test]
fn membership_options_that_cannot_work_are_refused() {
    let d = MembershipOptions::default;
    assert_eq!(
        option_of(d().heartbeat_retry_backoff(Duration::ZERO).validate()),
        "heartbeat_retry_backoff"
    );
    assert_eq!(
        option_of(d().num_votes_for_death_declaration(0).validate()),
        "num_votes_for_death_declaration"
    );
    assert_eq!(
        option_of(d().death_vote_expiration_timeout(Duration::ZERO).validate()),
        "death_vote_expiration_timeout"
    );
}

#[test]
fn cassandra_options_name_the_full_path_and_never_overflow() {
    let blank = CassandraClusteringOptions::default()
        .keyspace("ks")
        .service_id("svc")
        .cluster_id("   ");
    assert_eq!(option_of(blank.validate()), "cluster_id");
    let mut o = CassandraClusteringOptions::default()
        .keyspace("ks")
        .service_id("svc")
        .cluster_id("c")
        .ttl(true);
    o.ttl_renewal_interval = Some(Duration::MAX);
    let r = std::panic::catch_unwind(|| o.validate());
    assert_eq!(
        option_of(r.expect("validate() must not panic")),
        "ttl_renewal_interval"
    );
    let mut o = CassandraClusteringOptions::default()
        .keyspace("ks")
        .service_id("svc")
        .cluster_id("c");
    o.membership.defunct_silo_expiration = Duration::ZERO;
    assert_eq!(
        option_of(o.validate()),
        "membership.defunct_silo_expiration"
    );
}

#[test]
fn a_misspelt_credentials_field_is_an_error() {
    assert!(
        toml::from_str::<Credentials>("username = \"u\"\npassword = \"\"\npasword = \"p\"")
            .is_err()
    );
}

#[test]
fn a_manual_clock_never_wraps() {
    let c = ManualClock::new(Timestamp::from_millis(i64::MAX - 5));
    let r = std::panic::catch_unwind(|| c.advance(Duration::from_secs(1)));
    assert!(r.is_ok());
    assert_eq!(c.now(), Timestamp::from_millis(i64::MAX));
}

#[test]
fn only_canonical_silo_addresses_parse() {
    for bad in [
        "10.0.0.7:11111@+7",
        "10.0.0.7:11111@007",
        "10.0.0.7:05@1",
        "[0:0:0:0:0:0:0:1]:11111@1",
        "[::1%0]:11111@1",
    ] {
        assert!(
            matches!(
                bad.parse::<SiloAddress>(),
                Err(MembershipError::InvalidSiloAddress { .. })
            ),
            "{bad:?} parsed as {:?}",
            bad.parse::<SiloAddress>().map(|a| a.to_string())
        );
    }
    let a: SiloAddress = "[::1]:11111@7".parse().unwrap();
    assert_eq!(a.to_string(), "[::1]:11111@7");
}

/// Orleans' `MaxDefunctSiloEntries`: a count (default 25), `"off"` to keep every Dead entry; a
/// negative count reaches `validate`, which names the option (as Orleans' validator does).
#[test]
fn max_defunct_silo_entries_is_a_count_or_off_and_a_negative_one_is_refused_by_name() {
    assert_eq!(
        MembershipOptions::default().max_defunct_silo_entries,
        Some(25)
    );
    let o: MembershipOptions = toml::from_str("max_defunct_silo_entries = 0").unwrap();
    assert_eq!(o.max_defunct_silo_entries, Some(0));
    o.validate().unwrap();
    let o: MembershipOptions = toml::from_str("max_defunct_silo_entries = \"off\"").unwrap();
    assert_eq!(o.max_defunct_silo_entries, None);
    o.validate().unwrap();
    let negative: MembershipOptions = toml::from_str("max_defunct_silo_entries = -1")
        .expect("a negative count parses, so that validate can name it");
    assert_eq!(option_of(negative.validate()), "max_defunct_silo_entries");
    assert_eq!(
        option_of(
            MembershipOptions::default()
                .max_defunct_silo_entries(Some(-3))
                .validate()
        ),
        "max_defunct_silo_entries"
    );
    let mut o = CassandraClusteringOptions::default()
        .keyspace("ks")
        .service_id("svc")
        .cluster_id("c");
    o.membership.max_defunct_silo_entries = Some(-1);
    assert_eq!(
        option_of(o.validate()),
        "membership.max_defunct_silo_entries"
    );
    for wrong in ["\"soon\"", "2.5", "true"] {
        assert!(
            toml::from_str::<MembershipOptions>(&format!("max_defunct_silo_entries = {wrong}"))
                .is_err(),
            "{wrong} is no count"
        );
    }
    let back =
        toml::to_string(&MembershipOptions::default().max_defunct_silo_entries(None)).unwrap();
    assert!(
        back.contains("max_defunct_silo_entries = \"off\""),
        "{back}"
    );
    let back = toml::to_string(&MembershipOptions::default()).unwrap();
    assert!(back.contains("max_defunct_silo_entries = 25"), "{back}");
}

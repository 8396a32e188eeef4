//! Unit and property tests of the model's types.

use std::net::{SocketAddr, SocketAddrV6};
use std::time::{Duration, UNIX_EPOCH};

use super::*;
use crate::error::MembershipError;

#[test]
fn only_the_canonical_text_form_parses() {
    for good in [
        "10.0.0.7:11111@385939200",
        "[::1]:11111@1",
        "[fe80::1]:1@-5",
        "0.0.0.0:0@0",
    ] {
        let a: SiloAddress = good.parse().unwrap();
        assert_eq!(a.to_string(), good);
    }
    for bad in [
        "10.0.0.7:11111@+7",
        "10.0.0.7:11111@007",
        "10.0.0.7:11111@-0",
        "10.0.0.7:05@1",
        "[0:0:0:0:0:0:0:1]:11111@1",
        "[::1%0]:11111@1",
        "[fe80::1%2]:11111@1",
        "[::FFFF:1.2.3.4]:1@1",
        " 10.0.0.7:11111@1",
    ] {
        match bad.parse::<SiloAddress>() {
            Err(MembershipError::InvalidSiloAddress { text, reason }) => {
                assert_eq!(text, bad);
                assert!(!reason.is_empty());
            }
            other => panic!("{bad:?} gave {other:?}"),
        }
    }
}

#[test]
fn silo_address_text_round_trips() {
    for text in [
        "127.0.0.1:11111@0",
        "[::1]:1@-5",
        "10.1.2.3:65535@2147483647",
    ] {
        let a: SiloAddress = text.parse().unwrap();
        assert_eq!(a.to_string(), text);
    }
}

#[test]
fn silo_address_rejects_malformed_text() {
    for text in [
        "",
        "127.0.0.1:1",
        "127.0.0.1@1",
        "x:1@1",
        "127.0.0.1:1@x",
        "1.2.3.4:99999@1",
    ] {
        assert!(matches!(
            text.parse::<SiloAddress>(),
            Err(MembershipError::InvalidSiloAddress { .. })
        ));
    }
}

#[test]
fn construction_refuses_a_scope_id_drops_the_flow_label_and_keeps_mapped_addresses_v6() {
    use std::net::{Ipv4Addr, Ipv6Addr};
    let scoped = SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, 0, 0, 1));
    match SiloAddress::new(scoped, 0) {
        Err(MembershipError::InvalidSiloAddress { text, reason }) => {
            assert_eq!(text, "[::%1]:0@0");
            assert!(reason.contains("scope"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let labelled = SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::LOCALHOST, 1, 0xfffff, 0));
    let a = SiloAddress::new(labelled, 1).unwrap();
    assert_eq!(a, "[::1]:1@1".parse().unwrap());
    assert_eq!(a.endpoint(), "[::1]:1".parse::<SocketAddr>().unwrap());
    let mapped = SocketAddr::new(Ipv4Addr::new(1, 2, 3, 4).to_ipv6_mapped().into(), 7);
    let m = SiloAddress::new(mapped, 2).unwrap();
    assert_eq!(m.to_string(), "[::ffff:1.2.3.4]:7@2");
    assert_eq!(m.to_string().parse::<SiloAddress>().unwrap(), m);
    assert_ne!(m, "1.2.3.4:7@2".parse().unwrap());
}

#[test]
fn status_codes_match_orleans() {
    assert_eq!(SiloStatus::from_code(3), Some(SiloStatus::Active));
    assert_eq!(SiloStatus::from_code(6), Some(SiloStatus::Dead));
    assert_eq!(SiloStatus::from_code(7), None);
    assert_eq!(SiloStatus::from_code(-1), None);
}

#[test]
fn last_activity_takes_latest_suspicion() {
    let a: SiloAddress = "127.0.0.1:1@1".parse().unwrap();
    let mut e = MembershipEntry::new(a, SiloStatus::Joining, Timestamp::from_millis(10));
    assert_eq!(e.last_activity(), Timestamp::from_millis(10));
    e.suspect_times.push(SuspectTime {
        suspecting_silo: a,
        time: Timestamp::from_millis(50),
    });
    assert_eq!(e.last_activity(), Timestamp::from_millis(50));
}

#[test]
fn timestamps_before_epoch_truncate_towards_the_past() {
    let t = UNIX_EPOCH - Duration::from_micros(1500);
    assert_eq!(Timestamp::from_system_time(t).as_millis(), -2);
}

mod extreme_tests {
    use super::*;

    #[test]
    fn extreme_timestamps_display_and_convert_without_panicking() {
        for ms in [
            i64::MIN,
            -1,
            0,
            253_402_300_799_999,
            253_402_300_800_000,
            i64::MAX,
        ] {
            let t = Timestamp::from_millis(ms);
            assert!(!t.to_string().is_empty());
            let _ = t.to_system_time();
            let _ = t
                .saturating_add(Duration::MAX)
                .saturating_sub(Duration::MAX);
        }
    }
}

mod address_properties {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};

    use proptest::prelude::*;

    use super::*;

    /// Any socket address: IPv4, IPv6 with arbitrary flow label and scope id, and the IPv6 forms
    /// that print specially (IPv4-mapped, IPv4-compatible, unspecified, loopback).
    fn any_endpoint() -> impl Strategy<Value = SocketAddr> {
        let v4 = (any::<u32>(), any::<u16>())
            .prop_map(|(ip, port)| SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(ip), port)));
        let ip6 = prop_oneof![
            any::<u128>().prop_map(Ipv6Addr::from),
            any::<u32>().prop_map(|v4| Ipv4Addr::from(v4).to_ipv6_mapped()),
            any::<u32>().prop_map(|v4| Ipv4Addr::from(v4).to_ipv6_compatible()),
            Just(Ipv6Addr::UNSPECIFIED),
            Just(Ipv6Addr::LOCALHOST),
            any::<u64>().prop_map(|low| Ipv6Addr::from((0xfe80_u128 << 112) | u128::from(low))),
        ];
        let flow = prop_oneof![Just(0_u32), any::<u32>()];
        let scope = prop_oneof![Just(0_u32), any::<u32>()];
        let v6 = (ip6, any::<u16>(), flow, scope).prop_map(|(ip, port, flow, scope)| {
            SocketAddr::V6(SocketAddrV6::new(ip, port, flow, scope))
        });
        prop_oneof![v4, v6]
    }

    /// What `SocketAddr`'s `Debug` leaves out, for failure messages.
    fn parts(endpoint: SocketAddr) -> String {
        match endpoint {
            SocketAddr::V4(v4) => format!("{v4}"),
            SocketAddr::V6(v6) => format!(
                "ip {} port {} flowinfo {} scope {}",
                v6.ip(),
                v6.port(),
                v6.flowinfo(),
                v6.scope_id()
            ),
        }
    }

    fn any_generation() -> impl Strategy<Value = i32> {
        prop_oneof![
            Just(0),
            Just(-1),
            Just(i32::MIN),
            Just(i32::MAX),
            any::<i32>()
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

        #[test]
        fn every_constructible_address_round_trips_through_its_text(
            endpoint in any_endpoint(),
            generation in any_generation(),
        ) {
            let address = match SiloAddress::new(endpoint, generation) {
                Err(MembershipError::InvalidSiloAddress { text, reason }) => {
                    // Refused exactly what the text cannot carry, and said so.
                    prop_assert!(
                        matches!(endpoint, SocketAddr::V6(v6) if v6.scope_id() != 0),
                        "refused {} ({:?}: {})", parts(endpoint), text, reason
                    );
                    return Ok(());
                }
                Err(other) => return Err(TestCaseError::fail(format!("{other:?}"))),
                Ok(address) => address,
            };
            prop_assert!(
                !matches!(endpoint, SocketAddr::V6(v6) if v6.scope_id() != 0),
                "accepted {} whose text cannot carry its scope", parts(endpoint)
            );
            prop_assert_eq!(address.endpoint().ip(), endpoint.ip());
            prop_assert_eq!(address.endpoint().port(), endpoint.port());
            prop_assert_eq!(address.generation(), generation);
            let text = address.to_string();
            prop_assert_eq!(
                text.parse::<SiloAddress>().ok(),
                Some(address),
                "text {:?} of {}",
                text,
                parts(endpoint)
            );
        }
    }
}

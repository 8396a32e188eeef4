//! The membership model: silo addresses, statuses, entries, table versions and read snapshots,
//! faithful to the Orleans membership protocol.

use std::fmt;
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6};
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::error::MembershipError;

/// A point in time, UTC, with millisecond precision (what Cassandra's `timestamp` stores).
///
/// ```
/// use cassandra_membership::Timestamp;
/// let t = Timestamp::from_millis(1_700_000_000_123);
/// assert_eq!(t.to_string(), "2023-11-14T22:13:20.123Z");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(i64);

impl Timestamp {
    /// The Unix epoch.
    pub const EPOCH: Timestamp = Timestamp(0);

    /// Milliseconds since the Unix epoch.
    pub const fn from_millis(millis: i64) -> Self {
        Timestamp(millis)
    }

    /// Milliseconds since the Unix epoch.
    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// The current wall-clock time, truncated to milliseconds.
    pub fn now() -> Self {
        Self::from_system_time(SystemTime::now())
    }

    /// Converts a `SystemTime`, truncating to milliseconds (saturating far outside ±292 million years).
    pub fn from_system_time(t: SystemTime) -> Self {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Timestamp(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            Err(e) => {
                // Round towards the past so that truncation never moves a time forward.
                let d = e.duration();
                let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
                let extra = i64::from(d.subsec_nanos() % 1_000_000 != 0);
                Timestamp(ms.saturating_neg().saturating_sub(extra))
            }
        }
    }

    /// Converts to a `SystemTime` (the epoch where the platform cannot represent the time).
    pub fn to_system_time(self) -> SystemTime {
        let d = Duration::from_millis(self.0.unsigned_abs());
        let t = if self.0 >= 0 {
            UNIX_EPOCH.checked_add(d)
        } else {
            UNIX_EPOCH.checked_sub(d)
        };
        t.unwrap_or(UNIX_EPOCH)
    }

    /// This time plus `d` (saturating), truncated to milliseconds.
    pub fn saturating_add(self, d: Duration) -> Self {
        Timestamp(
            self.0
                .saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        )
    }

    /// This time minus `d` (saturating), truncated to milliseconds.
    pub fn saturating_sub(self, d: Duration) -> Self {
        Timestamp(
            self.0
                .saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        )
    }

    /// How long from `earlier` to `self`; zero if `earlier` is later.
    pub fn duration_since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0))
    }
}

/// 9999-12-31T23:59:59.999Z, the last time RFC 3339 can write.
const LAST_RFC3339_MILLIS: i64 = 253_402_300_799_999;

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 > LAST_RFC3339_MILLIS {
            write!(f, "{}ms after the epoch", self.0)
        } else if self.0 >= 0 {
            write!(
                f,
                "{}",
                humantime::format_rfc3339_millis(self.to_system_time())
            )
        } else {
            write!(f, "{}ms before the epoch", self.0.unsigned_abs())
        }
    }
}

/// The identity of one silo incarnation: its socket address and its generation.
///
/// The text form is stable and parseable: `ip:port@generation`, IPv6 addresses in brackets.
/// Only the canonical text form — exactly what `Display` prints — is accepted: no sign or
/// leading zeros in the port or generation (`@+7`, `@007`, `:05`), IPv6 in its shortest
/// RFC 5952 form (`[::1]`, not `[0:0:0:0:0:0:0:1]`), and no zone ids (`%0`). One address thus
/// has one text, so the row key stored for it is always the same; a stored key in another form
/// is a damaged row.
///
/// Construction and the text form agree: every address [`SiloAddress::new`] accepts prints a
/// text that parses back to an equal address. An IPv6 scope (zone) id names a network interface
/// of one host, so it means nothing to the other silos that read the row key: `new` refuses an
/// endpoint with a scope id. The IPv6 flow label is a per-connection field, not part of the
/// address: `new` drops it. An IPv4-mapped IPv6 endpoint (`[::ffff:10.0.0.7]`) stays IPv6 — it is
/// a different key from the IPv4 endpoint `10.0.0.7`.
///
/// ```
/// use cassandra_membership::SiloAddress;
/// let a: SiloAddress = "10.0.0.7:11111@385939200".parse()?;
/// assert_eq!(a.generation(), 385939200);
/// assert_eq!(a.to_string(), "10.0.0.7:11111@385939200");
/// let v6: SiloAddress = "[::1]:11111@1".parse()?;
/// assert_eq!(v6.to_string(), "[::1]:11111@1");
/// # Ok::<(), cassandra_membership::MembershipError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SiloAddress {
    endpoint: SocketAddr,
    generation: i32,
}

impl SiloAddress {
    /// A silo address from its endpoint and generation.
    ///
    /// Fails with [`MembershipError::InvalidSiloAddress`] for an IPv6 endpoint with a scope
    /// (zone) id, which the text form — the row key every other silo reads — cannot carry: a
    /// scope id is only meaningful on the host that chose it. Drops an IPv6 flow label.
    ///
    /// ```
    /// use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};
    /// use cassandra_membership::{MembershipError, SiloAddress};
    /// let scoped = SocketAddrV6::new(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1), 11111, 0, 2);
    /// assert!(matches!(
    ///     SiloAddress::new(SocketAddr::V6(scoped), 1),
    ///     Err(MembershipError::InvalidSiloAddress { .. })
    /// ));
    /// let labelled = SocketAddrV6::new(Ipv6Addr::LOCALHOST, 11111, 7, 0);
    /// let a = SiloAddress::new(SocketAddr::V6(labelled), 1)?;
    /// assert_eq!(a, "[::1]:11111@1".parse()?);
    /// # Ok::<(), MembershipError>(())
    /// ```
    pub fn new(endpoint: SocketAddr, generation: i32) -> Result<Self, MembershipError> {
        let endpoint = match endpoint {
            SocketAddr::V4(_) => endpoint,
            SocketAddr::V6(v6) if v6.scope_id() != 0 => {
                return Err(MembershipError::InvalidSiloAddress {
                    text: format!("{endpoint}@{generation}"),
                    reason: "an IPv6 scope (zone) id names an interface of one host only; a \
                             silo address is read by every host and cannot carry it"
                        .to_owned(),
                });
            }
            // The flow label is not part of the address: the text form does not carry it.
            SocketAddr::V6(v6) => SocketAddr::V6(SocketAddrV6::new(*v6.ip(), v6.port(), 0, 0)),
        };
        Ok(SiloAddress {
            endpoint,
            generation,
        })
    }

    /// A silo address from an IPv4 endpoint, which the text form always carries.
    ///
    /// ```
    /// use std::net::{Ipv4Addr, SocketAddrV4};
    /// use cassandra_membership::SiloAddress;
    /// const ANY: SiloAddress = SiloAddress::from_v4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0), 0);
    /// assert_eq!(ANY.to_string(), "0.0.0.0:0@0");
    /// ```
    pub const fn from_v4(endpoint: SocketAddrV4, generation: i32) -> Self {
        SiloAddress {
            endpoint: SocketAddr::V4(endpoint),
            generation,
        }
    }

    /// The silo's socket address (an IPv6 one has flow label and scope id 0).
    pub const fn endpoint(&self) -> SocketAddr {
        self.endpoint
    }

    /// The generation that tells incarnations at the same endpoint apart.
    pub const fn generation(&self) -> i32 {
        self.generation
    }
}

impl fmt::Display for SiloAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.endpoint, self.generation)
    }
}

impl FromStr for SiloAddress {
    type Err = MembershipError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = |reason: &str| MembershipError::InvalidSiloAddress {
            text: s.chars().take(128).collect(),
            reason: reason.to_owned(),
        };
        let (endpoint, generation) = s
            .rsplit_once('@')
            .ok_or_else(|| invalid("expected ip:port@generation"))?;
        let endpoint: SocketAddr = endpoint
            .parse()
            .map_err(|_| invalid("the endpoint is not ip:port"))?;
        let generation: i32 = generation
            .parse()
            .map_err(|_| invalid("the generation is not a 32-bit integer"))?;
        if s.contains('%') {
            return Err(invalid("zone ids (%…) are not part of a silo address"));
        }
        let address = SiloAddress::new(endpoint, generation).map_err(|e| match e {
            MembershipError::InvalidSiloAddress { reason, .. } => invalid(&reason),
            other => other,
        })?;
        let canonical = address.to_string();
        if canonical != s {
            return Err(invalid(&format!(
                "not in canonical form; write it as {canonical:?}"
            )));
        }
        Ok(address)
    }
}

impl Serialize for SiloAddress {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SiloAddress {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A silo's status in the membership protocol. The numbers are Orleans' own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum SiloStatus {
    /// No status (never stored by the protocol itself).
    None = 0,
    /// Created, not yet joining.
    Created = 1,
    /// Joining the cluster.
    Joining = 2,
    /// A full member.
    Active = 3,
    /// Leaving gracefully.
    ShuttingDown = 4,
    /// Stopping.
    Stopping = 5,
    /// Dead: declared by others or after a graceful leave. Never revives.
    Dead = 6,
}

impl SiloStatus {
    /// Every status, in protocol order.
    pub const ALL: [SiloStatus; 7] = [
        SiloStatus::None,
        SiloStatus::Created,
        SiloStatus::Joining,
        SiloStatus::Active,
        SiloStatus::ShuttingDown,
        SiloStatus::Stopping,
        SiloStatus::Dead,
    ];

    /// The stored number.
    pub const fn code(self) -> i32 {
        self as i32
    }

    /// The status a stored number means, if any.
    pub fn from_code(code: i32) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.code() == code)
    }
}

/// One suspicion: which silo suspected this one, and when.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SuspectTime {
    /// The silo that voted.
    pub suspecting_silo: SiloAddress,
    /// When it voted.
    pub time: Timestamp,
}

/// One row of the membership table: everything the protocol knows about a silo incarnation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MembershipEntry {
    /// The silo incarnation this row describes (the row's key).
    pub address: SiloAddress,
    /// Its status.
    pub status: SiloStatus,
    /// Suspicions raised against it, oldest first.
    pub suspect_times: Vec<SuspectTime>,
    /// The gateway (proxy) port; 0 when the silo has none.
    pub proxy_port: u16,
    /// The host's name.
    pub host_name: String,
    /// The silo's name.
    pub silo_name: String,
    /// The silo's role name.
    pub role_name: String,
    /// Update zone.
    pub update_zone: i32,
    /// Fault zone.
    pub fault_zone: i32,
    /// When the silo started.
    pub start_time: Timestamp,
    /// The last "I am alive" time the silo published.
    pub i_am_alive_time: Timestamp,
}

impl MembershipEntry {
    /// A new entry with the given status; names empty, zones 0, both times `now`.
    pub fn new(address: SiloAddress, status: SiloStatus, now: Timestamp) -> Self {
        MembershipEntry {
            address,
            status,
            suspect_times: Vec::new(),
            proxy_port: 0,
            host_name: String::new(),
            silo_name: String::new(),
            role_name: String::new(),
            update_zone: 0,
            fault_zone: 0,
            start_time: now,
            i_am_alive_time: now,
        }
    }

    /// The latest sign of life the table holds for this entry: the latest of its start time,
    /// its I-am-alive time and its latest suspicion. Defunct cleanup compares this with its cutoff.
    pub fn last_activity(&self) -> Timestamp {
        self.suspect_times
            .iter()
            .map(|s| s.time)
            .fold(self.start_time.max(self.i_am_alive_time), Timestamp::max)
    }
}

/// An opaque version tag. Each write of a row or of the table version gets a new one,
/// so that a writer can say "only if nothing changed since I read".
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ETag(String);

impl ETag {
    /// The tag of a table version that was never written (before `initialize`, or after the
    /// cluster's data was deleted or expired).
    pub fn absent() -> Self {
        ETag(String::new())
    }

    /// A fresh, random tag.
    pub fn random() -> Self {
        ETag(uuid::Uuid::new_v4().to_string())
    }

    /// Wraps a stored tag.
    pub fn new(tag: impl Into<String>) -> Self {
        ETag(tag.into())
    }

    /// True for [`ETag::absent`].
    pub fn is_absent(&self) -> bool {
        self.0.is_empty()
    }

    /// The tag's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ETag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() {
            "<absent>"
        } else {
            &self.0
        })
    }
}

/// The table version: a number the protocol increments on every membership change, and the
/// tag of the write that set it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TableVersion {
    /// The version number.
    pub version: u64,
    /// The tag of the write that produced this version.
    pub etag: ETag,
}

impl TableVersion {
    /// The version a cluster without any stored version reads as.
    pub fn absent() -> Self {
        TableVersion {
            version: 0,
            etag: ETag::absent(),
        }
    }

    /// What a writer passes to move the table on from this version: the next number, and this
    /// version's tag as the condition.
    pub fn next(&self) -> TableVersion {
        TableVersion {
            version: self.version.saturating_add(1),
            etag: self.etag.clone(),
        }
    }
}

/// One entry as read, with its row tag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MembershipRow {
    /// The entry.
    pub entry: MembershipEntry,
    /// Its row tag, for [`crate::MembershipTable::update_row`].
    pub etag: ETag,
}

/// What a read returns: entries and the table version, read as one consistent view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MembershipSnapshot {
    /// The entries, ordered by silo address.
    pub rows: Vec<MembershipRow>,
    /// The table version the entries belong to.
    pub version: TableVersion,
}

impl MembershipSnapshot {
    /// The row for `address`, if the snapshot holds it.
    pub fn get(&self, address: &SiloAddress) -> Option<&MembershipRow> {
        self.rows.iter().find(|r| &r.entry.address == address)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

#[cfg(test)]
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

#[cfg(test)]
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

//! `SiloAddress`: one silo incarnation's identity and its canonical text form (the row key).

use std::fmt;
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::MembershipError;
use crate::model::Timestamp;

/// 2022-01-01T00:00:00Z in Unix milliseconds: Orleans' generation epoch.
const GENERATION_EPOCH_MILLIS: i64 = 1_640_995_200_000;

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

    /// A new incarnation at `endpoint`, its generation taken from the system clock: see
    /// [`SiloAddress::generation_at`]. What a host calls once per process start.
    ///
    /// ```
    /// use cassandra_membership::SiloAddress;
    /// let me = SiloAddress::new_incarnation("10.0.0.7:11111".parse().unwrap())?;
    /// assert!(me.generation() > 0);
    /// # Ok::<(), cassandra_membership::MembershipError>(())
    /// ```
    pub fn new_incarnation(endpoint: SocketAddr) -> Result<Self, MembershipError> {
        SiloAddress::new(endpoint, SiloAddress::generation_at(Timestamp::now()))
    }

    /// The generation of an incarnation started at `now`: whole seconds since
    /// 2022-01-01T00:00:00Z (Orleans' generation epoch), so a restart a second or more later
    /// gets a larger one. 0 before the epoch; `i32::MAX` from 2090 on. Two starts within one
    /// second at one endpoint get the same generation: a host that restarts that fast picks one
    /// above the generations the table holds for its endpoint.
    ///
    /// ```
    /// use cassandra_membership::{SiloAddress, Timestamp};
    /// assert_eq!(SiloAddress::generation_at(Timestamp::from_millis(1_640_995_210_500)), 10);
    /// assert_eq!(SiloAddress::generation_at(Timestamp::from_millis(i64::MIN)), 0);
    /// assert_eq!(SiloAddress::generation_at(Timestamp::from_millis(i64::MAX)), i32::MAX);
    /// ```
    pub fn generation_at(now: Timestamp) -> i32 {
        let secs = now
            .as_millis()
            .saturating_sub(GENERATION_EPOCH_MILLIS)
            .div_euclid(1000);
        i32::try_from(secs.max(0)).unwrap_or(i32::MAX)
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

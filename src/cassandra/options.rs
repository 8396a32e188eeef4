//! Provider options for the Cassandra membership table.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{MembershipError, Result};
use crate::options::MembershipOptions;

use super::tls::TlsOptions;

mod credentials;
mod names;

pub use credentials::Credentials;
use names::{valid_datacenter, validate_identity};
pub(crate) use names::{validate_identifier, validate_value};

/// Cassandra's largest TTL (20 years).
pub const MAX_TTL_SECONDS: u64 = 630_720_000;

/// The last second a cell may expire at under Cassandra 4.x and 5.0's default
/// `storage_compatibility_mode: CASSANDRA_4` (2038-01-19T03:14:06Z); writes past it are rejected.
pub const EXPIRY_HORIZON_UNIX_SECONDS: i64 = 2_147_483_646;

/// Which consistency levels the provider uses. Serial levels are never mixed on one partition.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConsistencyProfile {
    /// `QUORUM` for reads and commits, `SERIAL` for conditional writes and linearizable reads:
    /// linearizable across all data centres. The default.
    #[default]
    Quorum,
    /// `LOCAL_QUORUM` and `LOCAL_SERIAL`: linearizable only among clients of one data centre
    /// (use when every silo of a cluster lives in one DC, or to trade that guarantee for latency).
    LocalQuorum,
}

/// How a conditional write names the entry it expects. An entry is one frozen user-type value
/// holding its tag; Cassandra 4.0+ compares a field of it (`IF entry.etag = ?`), ScyllaDB does
/// not (scylladb/scylladb#13624) and compares only the whole value, which costs an update one
/// more serial read (the stored entry, to expect it whole).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryConditions {
    /// The field condition where the server prepares it, else the whole value. The default.
    #[default]
    Auto,
    /// Always the field condition (`IF entry.etag = ?`); a server that refuses it fails
    /// `initialize` with `SchemaMismatch`.
    Field,
    /// Always the whole value (`IF entry = ?`), also where the field condition works.
    WholeValue,
}

/// What to do when the existing table's TTL settings or rows disagree with the configuration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TtlMismatchPolicy {
    /// Fail `initialize` with [`MembershipError::TtlMismatch`]. The default.
    #[default]
    Throw,
    /// Leave the table and its rows as they are; new writes use the configured TTL; warn once.
    Allow,
    /// Alter the table default and rewrite every row to expire as if the configured TTL had
    /// always applied.
    Patch,
}

/// Options of [`crate::CassandraMembershipTable`].
///
/// Every field but `service_id` and `cluster_id` has a documented default; those two have
/// none, and [`validate`](Self::validate) (run by `connect`) names the one that is missing.
/// Durations are human-readable (`"10s"`, `"7d"`). In code, start from `default()` and name
/// each identity:
///
/// ```
/// use cassandra_membership::CassandraClusteringOptions;
/// let o = CassandraClusteringOptions::default()
///     .keyspace("orleans")
///     .service_id("shop")
///     .cluster_id("blue")
///     .contact_points(["10.0.0.5:9042"]);
/// o.validate().unwrap();
/// let unset = CassandraClusteringOptions::default().keyspace("orleans").service_id("shop");
/// assert!(unset.validate().unwrap_err().to_string().contains("cluster_id: not set"));
/// ```
///
/// From a config file:
///
/// ```
/// use cassandra_membership::CassandraClusteringOptions;
/// let o: CassandraClusteringOptions = toml::from_str(r#"
///     contact_points = ["10.0.0.5:9042"]
///     keyspace = "orleans"
///     service_id = "shop"
///     cluster_id = "blue"
///     ttl = true
///     [membership]
///     defunct_silo_expiration = "2d"
/// "#).unwrap();
/// o.validate().unwrap();
/// assert_eq!(o.ttl_seconds(), Some(2 * 24 * 3600));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct CassandraClusteringOptions {
    /// `host:port` of one or more nodes. Default `["127.0.0.1:9042"]`. Ignored when the host
    /// supplies its own session.
    pub contact_points: Vec<String>,
    /// The keyspace. Default `"orleans"`. Letters, digits and `_`, starting with a letter, at most 48.
    pub keyspace: String,
    /// Development only: create the keyspace if missing with this replication map, e.g.
    /// `{ class = "SimpleStrategy", replication_factor = "1" }`. Default: none (the keyspace must exist).
    pub create_keyspace_with_replication: Option<BTreeMap<String, String>>,
    /// The table. Default `"membership"`. Same rules as `keyspace`.
    pub table: String,
    /// The Orleans ServiceId. **No default**: [`validate`](Self::validate) fails until it is
    /// set (a process that forgot it must not join another's cluster). Any non-empty text.
    pub service_id: String,
    /// The Orleans ClusterId. **No default**: [`validate`](Self::validate) fails until it is
    /// set. Any non-empty text.
    pub cluster_id: String,
    /// Consistency levels. Default [`ConsistencyProfile::Quorum`].
    pub consistency: ConsistencyProfile,
    /// The cluster's serial data centre: the DC whose nodes coordinate every statement. With
    /// [`ConsistencyProfile::LocalQuorum`] (where it is required) the DC whose replicas decide
    /// every Paxos round and commit, with no failover to another DC, and the only DC `connect`
    /// keeps connection pools to; with `quorum` the DC tried first, others after it. It is
    /// **not** "the DC this process runs in" (what the drivers call the local DC): **every silo
    /// of one cluster names the same DC**, wherever it runs, or two silos can both win one
    /// compare-and-set ([`docs::consistency`](crate::docs::consistency)). The name as the
    /// cluster reports it (`nodetool status`, e.g. `dc1`). Default: none (the session's own load
    /// balancing; `quorum` only).
    ///
    /// Called `local_datacenter` up to 0.2: that name is still read from a config file
    /// (deprecated; a file that names both is refused as a duplicate field).
    #[serde(alias = "local_datacenter")]
    pub serial_datacenter: Option<String>,
    /// Client-side timeout of each statement. Default 10 s.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// How long [`crate::CassandraMembershipTable::connect`] may take in all: TCP, the CQL
    /// handshake, authentication and the driver's first metadata fetch. Default 5 s.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How long `initialize` waits for one schema change (`CREATE KEYSPACE` / `CREATE TABLE` /
    /// `ALTER TABLE`, which the driver follows with a schema-agreement wait) and for each
    /// explicit schema-agreement wait. Default 30 s.
    #[serde(with = "humantime_serde")]
    pub schema_timeout: Duration,
    /// Rows per page when reading a cluster. Default 1000.
    pub page_size: u32,
    /// Credentials: a role and its password, given inline or read by `connect` from an
    /// environment variable (`password_env`) or a file (`password_file`); see [`Credentials`].
    /// Default none.
    pub credentials: Option<Credentials>,
    /// TLS to the nodes, built by `connect` into a rustls configuration (crate feature
    /// `rustls`); see [`TlsOptions`]. Default: none (plain TCP). Ignored by `connect_tls`
    /// (its configuration wins) and `with_session`.
    pub tls: Option<TlsOptions>,
    /// Storage-side expiry: entries and whole clusters expire after
    /// `membership.defunct_silo_expiration` without heartbeats. Default false.
    pub ttl: bool,
    /// What `initialize` does when the table disagrees with `ttl`. Default `throw`.
    pub ttl_mismatch: TtlMismatchPolicy,
    /// How often a heartbeating silo renews its entry's TTL with a conditional write; also how
    /// much later than the TTL an entry may outlive its last heartbeat, and the clock skew
    /// between Cassandra nodes (the one that writes a cell and the one that reads it) that
    /// leases tolerate: a silo fences before its entry can look expired while that skew is below
    /// this interval; beyond it a join may be refused with `TtlMismatch` (see `docs::expiry`,
    /// "Whose clock decides"). Default: a tenth of the TTL, rounded up to whole seconds.
    #[serde(with = "humantime_serde")]
    pub ttl_renewal_interval: Option<Duration>,
    /// The table's `gc_grace_seconds`, set when the provider creates the table. Default 3 h
    /// (Cassandra's `max_hint_window`): see [`docs::tombstones`](crate::docs::tombstones).
    #[serde(with = "humantime_serde")]
    pub gc_grace: Duration,
    /// How conditional writes name the entry they expect. Default [`EntryConditions::Auto`].
    pub entry_conditions: EntryConditions,
    /// Membership options the provider needs (DefunctSiloExpiration, publish period).
    pub membership: MembershipOptions,
}

impl Default for CassandraClusteringOptions {
    fn default() -> Self {
        CassandraClusteringOptions {
            contact_points: vec!["127.0.0.1:9042".into()],
            keyspace: "orleans".into(),
            create_keyspace_with_replication: None,
            table: "membership".into(),
            // Unset: `validate` names the missing field.
            service_id: String::new(),
            cluster_id: String::new(),
            consistency: ConsistencyProfile::Quorum,
            serial_datacenter: None,
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            schema_timeout: Duration::from_secs(30),
            page_size: 1000,
            credentials: None,
            tls: None,
            ttl: false,
            ttl_mismatch: TtlMismatchPolicy::Throw,
            ttl_renewal_interval: None,
            gc_grace: Duration::from_secs(3 * 3600),
            entry_conditions: EntryConditions::Auto,
            membership: MembershipOptions::default(),
        }
    }
}

/// How many heartbeat periods the TTL must at least span.
const MIN_TTL_HEARTBEAT_PERIODS: u32 = 4;

impl CassandraClusteringOptions {
    /// Sets the contact points.
    pub fn contact_points<S: Into<String>>(mut self, points: impl IntoIterator<Item = S>) -> Self {
        self.contact_points = points.into_iter().map(Into::into).collect();
        self
    }

    /// Sets the table name.
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// Sets the cluster id.
    pub fn cluster_id(mut self, cluster_id: impl Into<String>) -> Self {
        self.cluster_id = cluster_id.into();
        self
    }

    /// Development only: creates the keyspace if missing with `SimpleStrategy` and this factor.
    pub fn create_keyspace_simple(mut self, replication_factor: u32) -> Self {
        self.create_keyspace_with_replication = Some(BTreeMap::from([
            ("class".to_owned(), "SimpleStrategy".to_owned()),
            (
                "replication_factor".to_owned(),
                replication_factor.to_string(),
            ),
        ]));
        self
    }

    /// Sets the consistency profile.
    pub fn consistency(mut self, profile: ConsistencyProfile) -> Self {
        self.consistency = profile;
        self
    }

    /// Sets the cluster's serial data centre ([`serial_datacenter`](Self::serial_datacenter)):
    /// the same on every silo of the cluster.
    pub fn serial_datacenter(mut self, datacenter: impl Into<String>) -> Self {
        self.serial_datacenter = Some(datacenter.into());
        self
    }

    /// The old name of [`serial_datacenter`](Self::serial_datacenter).
    #[deprecated(
        since = "0.3.0",
        note = "it names the cluster's serial DC, not this process's DC: use `serial_datacenter`"
    )]
    pub fn local_datacenter(self, datacenter: impl Into<String>) -> Self {
        self.serial_datacenter(datacenter)
    }

    /// Sets the request timeout.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets the connect timeout.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets the schema-change timeout.
    pub fn schema_timeout(mut self, timeout: Duration) -> Self {
        self.schema_timeout = timeout;
        self
    }

    /// Sets the credentials.
    pub fn credentials(mut self, username: impl Into<String>, password: impl Into<String>) -> Self {
        self.credentials = Some(Credentials::new(username, password));
        self
    }

    /// Sets the TLS section (see [`TlsOptions`]).
    pub fn tls(mut self, tls: TlsOptions) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Turns storage-side expiry on or off.
    pub fn ttl(mut self, enabled: bool) -> Self {
        self.ttl = enabled;
        self
    }

    /// Sets the TTL mismatch policy.
    pub fn ttl_mismatch(mut self, policy: TtlMismatchPolicy) -> Self {
        self.ttl_mismatch = policy;
        self
    }

    /// Sets the membership options.
    pub fn membership(mut self, membership: MembershipOptions) -> Self {
        self.membership = membership;
        self
    }

    /// Sets the keyspace.
    pub fn keyspace(mut self, keyspace: impl Into<String>) -> Self {
        self.keyspace = keyspace.into();
        self
    }

    /// Sets the service id.
    pub fn service_id(mut self, service_id: impl Into<String>) -> Self {
        self.service_id = service_id.into();
        self
    }

    /// Sets the lease renewal interval (`None`: a tenth of the TTL).
    pub fn ttl_renewal_interval(mut self, interval: Option<Duration>) -> Self {
        self.ttl_renewal_interval = interval;
        self
    }

    /// Sets the `gc_grace_seconds` a created table gets.
    pub fn gc_grace(mut self, gc_grace: Duration) -> Self {
        self.gc_grace = gc_grace;
        self
    }

    /// Sets how conditional writes name the entry they expect.
    pub fn entry_conditions(mut self, conditions: EntryConditions) -> Self {
        self.entry_conditions = conditions;
        self
    }

    /// Sets the page size.
    pub fn page_size(mut self, rows: u32) -> Self {
        self.page_size = rows;
        self
    }

    /// The configured TTL in whole seconds (DefunctSiloExpiration rounded up), `None` when off.
    pub fn ttl_seconds(&self) -> Option<u64> {
        self.ttl
            .then(|| ceil_seconds(self.membership.defunct_silo_expiration))
    }

    /// The lease renewal interval in whole seconds (when expiry is on).
    pub fn renewal_seconds(&self) -> u64 {
        let ttl = ceil_seconds(self.membership.defunct_silo_expiration);
        match self.ttl_renewal_interval {
            Some(d) => ceil_seconds(d),
            None => ttl.div_ceil(10).max(1),
        }
    }

    /// The TTL every write carries: 0 when expiry is off; otherwise TTL + renewal interval + 1 s,
    /// so that an entry never expires earlier than TTL after its last heartbeat (the extra second
    /// covers Cassandra's whole-second expiry clock).
    pub fn write_ttl_seconds(&self) -> u64 {
        match self.ttl_seconds() {
            Some(ttl) => ttl.saturating_add(self.renewal_seconds()).saturating_add(1),
            None => 0,
        }
    }

    /// Checks every option; the error names the first one that is wrong. Runs before any
    /// statement is sent.
    pub fn validate(&self) -> Result<()> {
        // Named by their full path in these options: `membership.defunct_silo_expiration`.
        self.membership.validate().map_err(|e| match e {
            MembershipError::InvalidConfiguration { option, reason } => {
                MembershipError::InvalidConfiguration {
                    option: format!("membership.{option}"),
                    reason,
                }
            }
            other => other,
        })?;
        validate_identifier("keyspace", &self.keyspace)?;
        validate_identifier("table", &self.table)?;
        validate_identity("service_id", &self.service_id)?;
        validate_identity("cluster_id", &self.cluster_id)?;
        if let Some(c) = &self.credentials {
            c.validate()?;
        }
        if self.contact_points.is_empty() {
            return Err(MembershipError::config(
                "contact_points",
                "at least one node is needed",
            ));
        }
        if let Some(p) = self.contact_points.iter().find(|p| p.trim().is_empty()) {
            return Err(MembershipError::config(
                "contact_points",
                format!("empty contact point {p:?}"),
            ));
        }
        match (&self.serial_datacenter, self.consistency) {
            (None, ConsistencyProfile::LocalQuorum) => {
                return Err(MembershipError::config(
                    "serial_datacenter",
                    "consistency = \"local_quorum\" needs the data centre whose replicas decide the \
                     cluster's rounds: without it, statements go to nodes of any DC and two silos can \
                     both win one compare-and-set in different DCs",
                ));
            }
            (Some(dc), _) if !valid_datacenter(dc) => {
                return Err(MembershipError::config(
                    "serial_datacenter",
                    format!(
                        "{dc:?}: a data centre name is 1 to 128 printable characters, without \
                         surrounding spaces"
                    ),
                ));
            }
            _ => {}
        }
        if let Some(map) = &self.create_keyspace_with_replication {
            if !map.contains_key("class") {
                return Err(MembershipError::config(
                    "create_keyspace_with_replication",
                    "the map needs a \"class\"",
                ));
            }
            for (k, v) in map {
                let ok = |s: &str| {
                    !s.is_empty()
                        && s.len() <= 128
                        && s.chars()
                            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
                };
                if !ok(k) || !ok(v) {
                    return Err(MembershipError::config(
                        "create_keyspace_with_replication",
                        format!(
                            "{k:?} = {v:?}: keys and values may hold letters, digits, '.', '_' and '-' only"
                        ),
                    ));
                }
            }
        }
        if self.request_timeout < Duration::from_millis(100) {
            return Err(MembershipError::config(
                "request_timeout",
                "must be at least 100ms",
            ));
        }
        if self.connect_timeout < Duration::from_millis(100)
            || self.connect_timeout > Duration::from_secs(3600)
        {
            return Err(MembershipError::config(
                "connect_timeout",
                "must be between 100ms and 1h",
            ));
        }
        if self.schema_timeout < Duration::from_millis(100)
            || self.schema_timeout > Duration::from_secs(3600)
        {
            return Err(MembershipError::config(
                "schema_timeout",
                "must be between 100ms and 1h",
            ));
        }
        if self.page_size < 10 || self.page_size > 100_000 {
            return Err(MembershipError::config(
                "page_size",
                "must be between 10 and 100000",
            ));
        }
        if let Some(c) = &self.credentials
            && c.username.is_empty()
        {
            return Err(MembershipError::config(
                "credentials.username",
                "must not be empty",
            ));
        }
        if let Some(tls) = &self.tls {
            tls.validate()?;
        }
        let gc = self.gc_grace.as_secs();
        if gc > i32::MAX as u64 {
            return Err(MembershipError::config(
                "gc_grace",
                "must fit Cassandra's gc_grace_seconds (int)",
            ));
        }
        if let Some(ttl) = self.ttl_seconds() {
            let period = self.membership.i_am_alive_table_publish_timeout;
            if self.membership.defunct_silo_expiration
                < period.saturating_mul(MIN_TTL_HEARTBEAT_PERIODS)
            {
                return Err(MembershipError::config(
                    "membership.defunct_silo_expiration",
                    format!(
                        "with ttl on it is the TTL and must span at least {MIN_TTL_HEARTBEAT_PERIODS} heartbeat periods ({:?}); it is {:?}",
                        period.saturating_mul(MIN_TTL_HEARTBEAT_PERIODS),
                        self.membership.defunct_silo_expiration
                    ),
                ));
            }
            let renewal = self.renewal_seconds();
            if renewal == 0 || renewal.saturating_mul(2) > ttl.max(2) {
                return Err(MembershipError::config(
                    "ttl_renewal_interval",
                    format!("must be between 1s and half the TTL ({ttl} s); it is {renewal} s"),
                ));
            }
            let write_ttl = self.write_ttl_seconds();
            if write_ttl > MAX_TTL_SECONDS {
                return Err(MembershipError::config(
                    "membership.defunct_silo_expiration",
                    format!(
                        "TTL plus renewal interval is {write_ttl} s; Cassandra allows at most {MAX_TTL_SECONDS} s"
                    ),
                ));
            }
            let now = crate::model::Timestamp::now().as_millis() / 1000;
            if now.saturating_add(write_ttl as i64) > EXPIRY_HORIZON_UNIX_SECONDS {
                return Err(MembershipError::config(
                    "membership.defunct_silo_expiration",
                    format!(
                        "cells written now with a {write_ttl} s TTL would expire after 2038-01-19T03:14:06Z, which Cassandra rejects under its default storage_compatibility_mode"
                    ),
                ));
            }
        }
        Ok(())
    }
}

pub(crate) fn ceil_seconds(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

#[cfg(test)]
mod tests;

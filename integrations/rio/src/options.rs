//! The adapter's options.

use std::time::Duration;

use cassandra_membership::{MembershipError, MembershipOptions, Result};
use serde::{Deserialize, Serialize};

/// How the adapter keeps rio's members in the membership table.
///
/// ```
/// use std::time::Duration;
/// use cassandra_membership_rio::RioStorageOptions;
/// let mut o = RioStorageOptions::default();
/// o.heartbeat_period = Duration::from_secs(1);
/// assert_eq!(o.missed_heartbeats_limit, 3);
/// assert_eq!(o.gone_after(), Duration::from_secs(3));
/// o.validate().unwrap();
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct RioStorageOptions {
    /// How often the process that pushed a member publishes that member's I-am-alive time,
    /// which renews its lease. Default 30 s (Orleans' `IAmAliveTablePublishTimeout`).
    #[serde(with = "humantime_serde")]
    pub heartbeat_period: Duration,
    /// After this many heartbeat periods without an I-am-alive, a member is gone: rio no longer
    /// sees it and the adapter writes nothing more to it, so storage-side expiry can remove it.
    /// The server fences itself one period earlier. Default 3 (Orleans'
    /// `NumMissedTableIAmAliveLimit`), the least allowed.
    pub missed_heartbeats_limit: u32,
    /// How many failure notices are kept per member, newest last. Default 100 (what rio's SQL
    /// backends return).
    pub failures_kept: usize,
    /// How often a conditional write is retried when another writer changed the table first.
    /// Default 20.
    pub write_attempts: u32,
    /// How long a rio call keeps retrying transient failures (timeouts, unavailability, unknown
    /// outcomes, lost races beyond `write_attempts`) with jittered backoff before it reports
    /// one. rio's peer-to-peer provider stops a server's membership loop on the first error it
    /// sees, so only unavailability that lasts this long should reach it. Default 30 s.
    #[serde(with = "humantime_serde")]
    pub retry_for: Duration,
}

impl Default for RioStorageOptions {
    fn default() -> Self {
        Self::from_membership(&MembershipOptions::default())
    }
}

impl RioStorageOptions {
    /// Heartbeat period and missed-heartbeat limit from the library's membership options (the
    /// ones a `CassandraClusteringOptions` carries); the rest at defaults.
    pub fn from_membership(m: &MembershipOptions) -> Self {
        RioStorageOptions {
            heartbeat_period: m.i_am_alive_table_publish_timeout,
            missed_heartbeats_limit: m.num_missed_table_i_am_alive_limit,
            failures_kept: 100,
            write_attempts: 20,
            retry_for: Duration::from_secs(30),
        }
    }

    /// How long after its last I-am-alive a member counts as gone.
    pub fn gone_after(&self) -> Duration {
        self.heartbeat_period
            .saturating_mul(self.missed_heartbeats_limit)
    }

    /// Checks every option; the error names the one at fault.
    pub fn validate(&self) -> Result<()> {
        let bad = |option: &str, reason: &str| {
            Err(MembershipError::InvalidConfiguration {
                option: option.to_owned(),
                reason: reason.to_owned(),
            })
        };
        if self.heartbeat_period.is_zero() {
            return bad("heartbeat_period", "must be greater than zero");
        }
        // The fence comes one period before a member is gone, and a healthy heartbeat may land
        // up to 1.5 periods after the previous one: 3 periods leave room for both.
        if self.missed_heartbeats_limit < 3 {
            return bad(
                "missed_heartbeats_limit",
                "must be at least 3 (the server fences itself one heartbeat period before it is gone)",
            );
        }
        if self.failures_kept == 0 {
            return bad("failures_kept", "must be at least 1");
        }
        if self.write_attempts == 0 {
            return bad("write_attempts", "must be at least 1");
        }
        Ok(())
    }

    /// With storage-side expiry, the TTL must span at least four heartbeat periods (the
    /// library's own rule), or live members would expire between heartbeats.
    pub(crate) fn validate_against_ttl(&self, ttl: Option<Duration>) -> Result<()> {
        match ttl {
            Some(ttl) if self.heartbeat_period.saturating_mul(4) > ttl => {
                Err(MembershipError::InvalidConfiguration {
                    option: "heartbeat_period".to_owned(),
                    reason: format!(
                        "{:?} is more than a quarter of the table's TTL {ttl:?}",
                        self.heartbeat_period
                    ),
                })
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_orleans_and_validate() {
        let o = RioStorageOptions::default();
        assert_eq!(o.heartbeat_period, Duration::from_secs(30));
        assert_eq!(o.gone_after(), Duration::from_secs(90));
        o.validate().unwrap();
    }

    #[test]
    fn each_bad_option_is_named() {
        type Spoil = fn(&mut RioStorageOptions);
        let cases: [(Spoil, &str); 4] = [
            (|o| o.heartbeat_period = Duration::ZERO, "heartbeat_period"),
            (|o| o.missed_heartbeats_limit = 2, "missed_heartbeats_limit"),
            (|o| o.failures_kept = 0, "failures_kept"),
            (|o| o.write_attempts = 0, "write_attempts"),
        ];
        for (spoil, name) in cases {
            let mut o = RioStorageOptions::default();
            spoil(&mut o);
            match o.validate() {
                Err(MembershipError::InvalidConfiguration { option, .. }) => {
                    assert_eq!(option, name)
                }
                other => panic!("{name}: {other:?}"),
            }
        }
    }

    #[test]
    fn heartbeat_must_fit_four_times_in_the_ttl() {
        let o = RioStorageOptions {
            heartbeat_period: Duration::from_secs(2),
            ..Default::default()
        };
        o.validate_against_ttl(Some(Duration::from_secs(8)))
            .unwrap();
        assert!(
            o.validate_against_ttl(Some(Duration::from_secs(7)))
                .is_err()
        );
        o.validate_against_ttl(None).unwrap();
    }
}

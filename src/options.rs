//! Membership options shared by every backend and by the host runtime, with Orleans' names
//! and defaults (`ClusterMembershipOptions`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{MembershipError, Result};

/// Orleans' cluster membership options that this crate uses.
///
/// Durations are human-readable in serialized form (`"30s"`, `"7d"`, `"1h 30m"`).
///
/// ```
/// use cassandra_membership::MembershipOptions;
/// let o: MembershipOptions = toml::from_str(r#"
///     i_am_alive_table_publish_timeout = "10s"
///     defunct_silo_expiration = "2d"
/// "#).unwrap();
/// assert_eq!(o.num_missed_table_i_am_alive_limit, 3);
/// assert_eq!(o.defunct_silo_expiration.as_secs(), 2 * 24 * 3600);
/// o.validate().unwrap();
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct MembershipOptions {
    /// How often a silo publishes its I-am-alive time. Default 30 s.
    #[serde(with = "humantime_serde")]
    pub i_am_alive_table_publish_timeout: Duration,
    /// How many missed I-am-alive periods make other silos suspect a silo. Default 3.
    pub num_missed_table_i_am_alive_limit: u32,
    /// How long after its last sign of life a non-Active entry is defunct; also the TTL when
    /// storage-side expiry is on. Default 7 days.
    #[serde(with = "humantime_serde")]
    pub defunct_silo_expiration: Duration,
    /// How often a live silo removes defunct entries; `None` (`"off"` in a config file) disables
    /// it. Default 1 h.
    #[serde(with = "duration_or_off")]
    pub defunct_silo_cleanup_period: Option<Duration>,
    /// The largest random delay added to each cleanup period. Default 5 min.
    #[serde(with = "humantime_serde")]
    pub defunct_silo_cleanup_jitter: Duration,
    /// The largest random fraction of the publish period added to or taken from each heartbeat
    /// interval, in percent. Default 10.
    pub i_am_alive_jitter_percent: u8,
    /// How many silos must suspect a silent silo before it is declared dead. Default 2 — so a
    /// crashed member of a two-silo cluster is never declared dead by the survivor alone (it
    /// stays Active until storage-side expiry removes it); set 1 for a cluster of two
    /// (`docs::fencing`, "Which votes count").
    pub num_votes_for_death_declaration: u32,
    /// How long a suspicion counts as a vote. `None` (the default) means the detection horizon,
    /// `num_missed_table_i_am_alive_limit` × `i_am_alive_table_publish_timeout` (90 s with the
    /// defaults; Orleans' fixed default is 2 min): a vote that old was cast on an earlier silence
    /// of its suspect, so it must not be counted with one on the current silence. A value set
    /// must lie between one publish period and that horizon.
    #[serde(with = "humantime_serde")]
    pub death_vote_expiration_timeout: Option<Duration>,
    /// First retry delay after a failed heartbeat (doubling up to the publish period). Default 1 s.
    #[serde(with = "humantime_serde")]
    pub heartbeat_retry_backoff: Duration,
    /// Run the periodic defunct cleanup even when storage-side expiry already removes defunct
    /// entries. Default false.
    pub force_defunct_cleanup: bool,
    /// The longest the host runtime waits for one table call (heartbeat, read, conditional
    /// write); a call that takes longer counts as failed. `None` (the default) means one publish
    /// period (`i_am_alive_table_publish_timeout`, 30 s by default): a heartbeat slower than that
    /// has missed its period anyway.
    #[serde(with = "humantime_serde")]
    pub table_operation_timeout: Option<Duration>,
    /// How long [`Silo::join`](crate::Silo::join) keeps trying (conflicts, timeouts, reads that
    /// give up) before it returns an error. Default 5 min (Orleans' `MaxJoinAttemptTime`).
    #[serde(with = "humantime_serde")]
    pub max_join_attempt_time: Duration,
    /// The one bound on [`Silo::leave`](crate::Silo::leave) as a whole: stopping the silo's
    /// tasks, then its two status changes (ShuttingDown, Dead) with their retries; a leave that
    /// has not finished by then returns its last error (the entry then stays as far as it got,
    /// and the others declare it dead like a crashed silo's; a later `leave` tries again, with
    /// a bound of its own). Each call is cut at it, whatever `table_operation_timeout`. Default 60 s: two table calls at
    /// the default `table_operation_timeout`. A host's shutdown grace (Kubernetes'
    /// `terminationGracePeriodSeconds`) must exceed it.
    #[serde(with = "humantime_serde")]
    pub leave_timeout: Duration,
    /// How many Dead entries the table keeps (Orleans' `MaxDefunctSiloEntries`): in each cleanup
    /// round, the first Active silo by address order removes the oldest Dead entries beyond
    /// this many, ranked by [`MembershipEntry::last_activity`](crate::MembershipEntry::last_activity)
    /// (see [`DefunctCleanup`](crate::runtime::DefunctCleanup)). `None` (`"off"` or `null` in a
    /// config file) keeps every Dead entry. Default 25. Signed so that a negative number
    /// reaches [`validate`](MembershipOptions::validate), which names it, as Orleans' validator
    /// does.
    #[serde(with = "count_or_off")]
    pub max_defunct_silo_entries: Option<i64>,
}

impl Default for MembershipOptions {
    fn default() -> Self {
        MembershipOptions {
            i_am_alive_table_publish_timeout: Duration::from_secs(30),
            num_missed_table_i_am_alive_limit: 3,
            defunct_silo_expiration: Duration::from_secs(7 * 24 * 3600),
            defunct_silo_cleanup_period: Some(Duration::from_secs(3600)),
            defunct_silo_cleanup_jitter: Duration::from_secs(300),
            i_am_alive_jitter_percent: 10,
            num_votes_for_death_declaration: 2,
            death_vote_expiration_timeout: None,
            heartbeat_retry_backoff: Duration::from_secs(1),
            force_defunct_cleanup: false,
            table_operation_timeout: None,
            max_join_attempt_time: Duration::from_secs(300),
            leave_timeout: Duration::from_secs(60),
            max_defunct_silo_entries: Some(25),
        }
    }
}

/// An optional duration that config files can switch off: `"off"`, `"none"`, `"disabled"` or
/// `null` mean `None`; anything else is a human-readable duration.
mod duration_or_off {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer, de::Error as _};

    pub(super) fn serialize<S: Serializer>(
        value: &Option<Duration>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(d) => s.collect_str(&humantime::format_duration(*d)),
            None => s.serialize_str("off"),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        match Option::<String>::deserialize(d)?.as_deref() {
            None | Some("off" | "none" | "disabled") => Ok(None),
            Some(text) => humantime::parse_duration(text)
                .map(Some)
                .map_err(D::Error::custom),
        }
    }
}

/// An optional count that config files can switch off: `"off"`, `"none"`, `"disabled"` or
/// `null` mean `None`; otherwise an integer (negative ones are left to `validate`).
mod count_or_off {
    use std::fmt;

    use serde::Serializer;
    use serde::de::{self, Deserializer, Visitor};

    pub(super) fn serialize<S: Serializer>(value: &Option<i64>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(n) => s.serialize_i64(*n),
            None => s.serialize_str("off"),
        }
    }

    struct CountOrOff;

    impl<'de> Visitor<'de> for CountOrOff {
        type Value = Option<i64>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a number of entries, or \"off\"")
        }

        fn visit_i64<E: de::Error>(self, n: i64) -> Result<Self::Value, E> {
            Ok(Some(n))
        }

        fn visit_u64<E: de::Error>(self, n: u64) -> Result<Self::Value, E> {
            i64::try_from(n)
                .map(Some)
                .map_err(|_| E::custom(format!("{n} entries is too many")))
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
            match text {
                "off" | "none" | "disabled" => Ok(None),
                other => Err(E::invalid_value(de::Unexpected::Str(other), &self)),
            }
        }

        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(CountOrOff)
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
        d.deserialize_any(CountOrOff)
    }
}

macro_rules! setters {
    ($( $(#[$doc:meta])* $name:ident: $ty:ty ),* $(,)?) => {
        $(
            $(#[$doc])*
            pub fn $name(mut self, value: $ty) -> Self {
                self.$name = value;
                self
            }
        )*
    };
}

impl MembershipOptions {
    setters! {
        /// Sets `i_am_alive_table_publish_timeout`.
        i_am_alive_table_publish_timeout: Duration,
        /// Sets `num_missed_table_i_am_alive_limit`.
        num_missed_table_i_am_alive_limit: u32,
        /// Sets `defunct_silo_expiration`.
        defunct_silo_expiration: Duration,
        /// Sets `defunct_silo_cleanup_period` (`None` disables the cleanup).
        defunct_silo_cleanup_period: Option<Duration>,
        /// Sets `defunct_silo_cleanup_jitter`.
        defunct_silo_cleanup_jitter: Duration,
        /// Sets `i_am_alive_jitter_percent`.
        i_am_alive_jitter_percent: u8,
        /// Sets `num_votes_for_death_declaration`.
        num_votes_for_death_declaration: u32,
        /// Sets `death_vote_expiration_timeout` (`None`: the detection horizon).
        death_vote_expiration_timeout: Option<Duration>,
        /// Sets `heartbeat_retry_backoff`.
        heartbeat_retry_backoff: Duration,
        /// Sets `force_defunct_cleanup`.
        force_defunct_cleanup: bool,
        /// Sets `table_operation_timeout` (`None`: one publish period).
        table_operation_timeout: Option<Duration>,
        /// Sets `max_join_attempt_time`.
        max_join_attempt_time: Duration,
        /// Sets `leave_timeout`.
        leave_timeout: Duration,
        /// Sets `max_defunct_silo_entries` (`None` keeps every Dead entry).
        max_defunct_silo_entries: Option<i64>,
    }

    /// The bound on one runtime table call: `table_operation_timeout`, or one publish period.
    pub fn effective_table_operation_timeout(&self) -> Duration {
        self.table_operation_timeout
            .unwrap_or(self.i_am_alive_table_publish_timeout)
    }

    /// How long after the others may vote a silent silo dead:
    /// `num_missed_table_i_am_alive_limit` × `i_am_alive_table_publish_timeout` (90 s with the
    /// defaults).
    pub fn detection_horizon(&self) -> Duration {
        self.i_am_alive_table_publish_timeout
            .saturating_mul(self.num_missed_table_i_am_alive_limit)
    }

    /// How long a suspicion counts as a vote: `death_vote_expiration_timeout`, or the detection
    /// horizon ([`MembershipOptions::detection_horizon`]).
    pub fn effective_death_vote_expiration_timeout(&self) -> Duration {
        self.death_vote_expiration_timeout
            .unwrap_or_else(|| self.detection_horizon())
    }

    /// The longest a healthy heartbeat takes to follow the previous one's start: the longest
    /// delay (`i_am_alive_table_publish_timeout` × (1 + `i_am_alive_jitter_percent`), or the
    /// previous call when it took longer) plus one call (`table_operation_timeout`). A fence
    /// horizon earlier than this would fence a healthy silo.
    pub fn longest_heartbeat_gap(&self) -> Duration {
        let period = self.i_am_alive_table_publish_timeout;
        let delay = period.saturating_add(crate::clock::scale(
            period,
            f64::from(self.i_am_alive_jitter_percent) / 100.0,
        ));
        let call = self.effective_table_operation_timeout();
        delay.max(call).saturating_add(call)
    }

    /// Checks every option; the error names the first one that is wrong.
    pub fn validate(&self) -> Result<()> {
        if self.i_am_alive_table_publish_timeout < Duration::from_millis(10) {
            return Err(MembershipError::config(
                "i_am_alive_table_publish_timeout",
                "must be at least 10ms",
            ));
        }
        if self.num_missed_table_i_am_alive_limit == 0 {
            return Err(MembershipError::config(
                "num_missed_table_i_am_alive_limit",
                "must be at least 1",
            ));
        }
        if self.defunct_silo_expiration < Duration::from_secs(1) {
            return Err(MembershipError::config(
                "defunct_silo_expiration",
                "must be at least 1s",
            ));
        }
        if self
            .defunct_silo_cleanup_period
            .is_some_and(|p| p < Duration::from_secs(1))
        {
            return Err(MembershipError::config(
                "defunct_silo_cleanup_period",
                "must be at least 1s or absent",
            ));
        }
        if self.i_am_alive_jitter_percent > 50 {
            return Err(MembershipError::config(
                "i_am_alive_jitter_percent",
                "must be at most 50",
            ));
        }
        if self.num_votes_for_death_declaration == 0 {
            return Err(MembershipError::config(
                "num_votes_for_death_declaration",
                "must be at least 1",
            ));
        }
        // A vote that expires before the next detection round can never be counted with another;
        // one that outlives the detection horizon can be counted with a vote on a later silence.
        let (votes, period) = (
            self.effective_death_vote_expiration_timeout(),
            self.i_am_alive_table_publish_timeout,
        );
        if votes < period || votes > self.detection_horizon() {
            return Err(MembershipError::config(
                "death_vote_expiration_timeout",
                format!(
                    "{votes:?} must lie between one i_am_alive_table_publish_timeout ({period:?}) and the detection horizon, {} × that period ({:?}): a vote older than the horizon was cast on an earlier silence; leave it unset to use the horizon",
                    self.num_missed_table_i_am_alive_limit,
                    self.detection_horizon()
                ),
            ));
        }
        // A zero backoff retries a failing heartbeat hundreds of times a second.
        if self.heartbeat_retry_backoff < Duration::from_millis(10) {
            return Err(MembershipError::config(
                "heartbeat_retry_backoff",
                "must be at least 10ms",
            ));
        }
        if self
            .table_operation_timeout
            .is_some_and(|t| t < Duration::from_millis(10))
        {
            return Err(MembershipError::config(
                "table_operation_timeout",
                "must be at least 10ms or absent",
            ));
        }
        // The fence must come after the longest healthy heartbeat gap and before the others may
        // vote: with no room in between, a healthy silo would be told to fence.
        let detection = self.detection_horizon();
        if detection <= self.longest_heartbeat_gap() {
            return Err(MembershipError::config(
                "num_missed_table_i_am_alive_limit",
                format!(
                    "{} × i_am_alive_table_publish_timeout ({detection:?}, when the others may vote a silent silo dead) leaves no fencing margin after the longest healthy heartbeat gap ({:?}: the publish period plus i_am_alive_jitter_percent, plus one table_operation_timeout); raise the limit or shorten table_operation_timeout",
                    self.num_missed_table_i_am_alive_limit,
                    self.longest_heartbeat_gap()
                ),
            ));
        }
        if self.max_defunct_silo_entries.is_some_and(|n| n < 0) {
            return Err(MembershipError::config(
                "max_defunct_silo_entries",
                format!(
                    "must be at least 0, or off (got {})",
                    self.max_defunct_silo_entries.unwrap_or_default()
                ),
            ));
        }
        if self.max_join_attempt_time < self.effective_table_operation_timeout() {
            return Err(MembershipError::config(
                "max_join_attempt_time",
                "must be at least one table operation timeout",
            ));
        }
        if self.leave_timeout < Duration::from_millis(10) {
            return Err(MembershipError::config(
                "leave_timeout",
                "must be at least 10ms",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_orleans_defaults_and_valid() {
        let o = MembershipOptions::default();
        assert_eq!(o.i_am_alive_table_publish_timeout, Duration::from_secs(30));
        assert_eq!(o.defunct_silo_expiration, Duration::from_secs(604_800));
        assert_eq!(
            o.defunct_silo_cleanup_period,
            Some(Duration::from_secs(3600))
        );
        o.validate().unwrap();
    }

    #[test]
    fn validation_names_the_option() {
        let o = MembershipOptions {
            num_missed_table_i_am_alive_limit: 0,
            ..Default::default()
        };
        match o.validate() {
            Err(MembershipError::InvalidConfiguration { option, .. }) => {
                assert_eq!(option, "num_missed_table_i_am_alive_limit")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn setters_chain() {
        let o = MembershipOptions::default()
            .i_am_alive_table_publish_timeout(Duration::from_secs(1))
            .defunct_silo_expiration(Duration::from_secs(10))
            .defunct_silo_cleanup_period(None);
        assert_eq!(o.i_am_alive_table_publish_timeout, Duration::from_secs(1));
        assert_eq!(o.defunct_silo_expiration, Duration::from_secs(10));
        assert_eq!(o.defunct_silo_cleanup_period, None);
        o.validate().unwrap();
    }

    #[test]
    fn cleanup_can_be_switched_off_in_a_config_file() {
        let o: MembershipOptions = toml::from_str("defunct_silo_cleanup_period = \"off\"").unwrap();
        assert_eq!(o.defunct_silo_cleanup_period, None);
        let o: MembershipOptions = toml::from_str("defunct_silo_cleanup_period = \"90m\"").unwrap();
        assert_eq!(
            o.defunct_silo_cleanup_period,
            Some(Duration::from_secs(5400))
        );
        let back = toml::to_string(&MembershipOptions::default().defunct_silo_cleanup_period(None))
            .unwrap();
        assert!(
            back.contains("defunct_silo_cleanup_period = \"off\""),
            "{back}"
        );
        assert!(
            toml::from_str::<MembershipOptions>("defunct_silo_cleanup_period = \"soon\"").is_err()
        );
    }

    fn rejected(o: MembershipOptions) -> String {
        match o.validate() {
            Err(MembershipError::InvalidConfiguration { option, .. }) => option,
            other => panic!("expected an option error, got {other:?}"),
        }
    }

    #[test]
    fn zero_votes_vote_timeouts_and_backoffs_are_rejected() {
        let d = MembershipOptions::default;
        assert_eq!(
            rejected(d().num_votes_for_death_declaration(0)),
            "num_votes_for_death_declaration"
        );
        assert_eq!(
            rejected(d().death_vote_expiration_timeout(Some(Duration::ZERO))),
            "death_vote_expiration_timeout"
        );
        assert_eq!(
            rejected(d().heartbeat_retry_backoff(Duration::ZERO)),
            "heartbeat_retry_backoff"
        );
        assert_eq!(
            rejected(d().table_operation_timeout(Some(Duration::ZERO))),
            "table_operation_timeout"
        );
        assert_eq!(
            rejected(d().max_join_attempt_time(Duration::from_secs(1))),
            "max_join_attempt_time"
        );
        // A call that may take forever leaves no fencing margin.
        assert_eq!(
            rejected(d().table_operation_timeout(Some(Duration::MAX))),
            "num_missed_table_i_am_alive_limit"
        );
        assert_eq!(rejected(d().leave_timeout(Duration::ZERO)), "leave_timeout");
        let o = d().max_join_attempt_time(Duration::MAX);
        o.validate().unwrap();
    }

    #[test]
    fn a_leave_is_bounded_by_one_minute_unless_a_config_file_says_otherwise() {
        assert_eq!(
            MembershipOptions::default().leave_timeout,
            Duration::from_secs(60)
        );
        let o: MembershipOptions = toml::from_str("leave_timeout = \"20s\"").unwrap();
        assert_eq!(o.leave_timeout, Duration::from_secs(20));
    }

    /// The soak's settings (1 s period, 3 missed, the rest default) kept votes for 120 s: a vote
    /// 90 s old was counted with a fresh one on a later silence.
    #[test]
    fn a_vote_lasts_the_detection_horizon_and_a_longer_lifetime_is_refused_naming_both() {
        let fast =
            MembershipOptions::default().i_am_alive_table_publish_timeout(Duration::from_secs(1));
        fast.validate().unwrap();
        assert_eq!(
            fast.effective_death_vote_expiration_timeout(),
            Duration::from_secs(3)
        );
        let d = MembershipOptions::default();
        assert_eq!(
            d.effective_death_vote_expiration_timeout(),
            Duration::from_secs(90)
        );
        let orleans = d.death_vote_expiration_timeout(Some(Duration::from_secs(120)));
        match orleans.validate() {
            Err(MembershipError::InvalidConfiguration { option, reason }) => {
                assert_eq!(option, "death_vote_expiration_timeout");
                assert!(
                    reason.contains("120s") && reason.contains("90s"),
                    "{reason}"
                );
            }
            other => panic!("{other:?}"),
        }
        let o: MembershipOptions =
            toml::from_str("death_vote_expiration_timeout = \"1m\"").unwrap();
        assert_eq!(
            o.effective_death_vote_expiration_timeout(),
            Duration::from_secs(60)
        );
        o.validate().unwrap();
    }

    #[test]
    fn the_table_operation_timeout_defaults_to_one_publish_period() {
        let o = MembershipOptions::default();
        assert_eq!(
            o.effective_table_operation_timeout(),
            Duration::from_secs(30)
        );
        let o: MembershipOptions =
            toml::from_str("table_operation_timeout = \"5s\"\nmax_join_attempt_time = \"1m\"")
                .unwrap();
        assert_eq!(
            o.effective_table_operation_timeout(),
            Duration::from_secs(5)
        );
        assert_eq!(o.max_join_attempt_time, Duration::from_secs(60));
    }

    #[test]
    fn max_defunct_silo_entries_null_means_off() {
        use serde::de::value::{Error, UnitDeserializer};
        assert_eq!(
            count_or_off::deserialize(UnitDeserializer::<Error>::new()).unwrap(),
            None
        );
    }

    #[test]
    fn unknown_fields_are_rejected() {
        assert!(toml::from_str::<MembershipOptions>("defunct_silo_expiry = \"1d\"").is_err());
    }
}

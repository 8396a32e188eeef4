//! `Timestamp`: the millisecond UTC time every stored time is (what Cassandra's `timestamp` holds).

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

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

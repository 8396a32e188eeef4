//! Where "now" comes from. The host runtime and the in-memory table read time only through a
//! [`Clock`], so their timing decisions can be tested with a manual clock or tokio's paused time.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use crate::model::Timestamp;

/// `d × factor`, saturating instead of panicking on huge or invalid products.
pub(crate) fn scale(d: Duration, factor: f64) -> Duration {
    Duration::try_from_secs_f64(d.as_secs_f64() * factor).unwrap_or(if factor > 0.0 {
        Duration::MAX
    } else {
        Duration::ZERO
    })
}

/// A source of the current (wall-clock) time: what is written to and compared with stored
/// times. The runtime schedules its intervals and deadlines on tokio's monotonic clock instead,
/// so a wall-clock step moves no deadline.
pub trait Clock: Send + Sync + Debug {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// The system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// Wall-clock time as of its creation, advanced by tokio's clock: under
/// `tokio::time::pause()` it moves only when tokio's time does, so timer-driven tests are
/// deterministic and instant.
#[derive(Clone, Copy, Debug)]
pub struct TokioClock {
    base: Timestamp,
    start: tokio::time::Instant,
}

impl TokioClock {
    /// A clock starting at the current wall-clock time.
    pub fn new() -> Self {
        TokioClock {
            base: Timestamp::now(),
            start: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        self.base.saturating_add(self.start.elapsed())
    }
}

/// A clock that moves only when told to.
///
/// ```
/// use cassandra_membership::{Clock, ManualClock, Timestamp};
/// use std::time::Duration;
/// let clock = ManualClock::new(Timestamp::from_millis(1_000));
/// clock.advance(Duration::from_secs(2));
/// assert_eq!(clock.now(), Timestamp::from_millis(3_000));
/// ```
#[derive(Clone, Debug)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    /// A clock showing `start`.
    pub fn new(start: Timestamp) -> Self {
        ManualClock(Arc::new(AtomicI64::new(start.as_millis())))
    }

    /// Moves the clock forward (saturating at the largest time rather than wrapping).
    pub fn advance(&self, by: std::time::Duration) {
        let ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        let _ = self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_add(ms))
            });
    }

    /// Sets the clock.
    pub fn set(&self, to: Timestamp) {
        self.0.store(to.as_millis(), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_millis(self.0.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_saturates_instead_of_wrapping() {
        let c = ManualClock::new(Timestamp::from_millis(i64::MAX - 5));
        c.advance(Duration::from_millis(10));
        assert_eq!(c.now(), Timestamp::from_millis(i64::MAX));
        c.advance(Duration::MAX);
        assert_eq!(c.now(), Timestamp::from_millis(i64::MAX));
    }
}

//! Defects this runtime once had, put back on one thread by a test-only switch so that the
//! simulation (`conformance::sim`) can show it catches each (CONTRIBUTING, "The simulation").
//! Without the `conformance` feature every switch is off and compiles away.

/// A defect that was fixed, re-introduced while its switch is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Regression {
    /// Issue 47: a vote's voters judged on the round's first read, not on the re-read the vote
    /// is written on (nor this silo's own status).
    VotersFromTheFirstRead,
    /// Issue 47: the own-row fence counted in failed detector rounds (3 rounds of a period plus a
    /// call each) instead of the time since the last successful read.
    FenceCountsRounds,
    /// Turn 4: votes older than the detection horizon counted.
    StaleVotesCount,
    /// Turn 4: votes by Dead or removed voters counted.
    DeadVotersCount,
    /// Turn 4: `should_serve` answered from the last published health, not the deadline.
    ServeFromCachedHealth,
    /// Issue 47 (found by the simulation): one vote write a round, so two detectors whose rounds
    /// coincide starve each other's second vote.
    OneVoteAttemptARound,
}

impl Regression {
    /// Every switch.
    pub const ALL: [Regression; 6] = [
        Regression::VotersFromTheFirstRead,
        Regression::FenceCountsRounds,
        Regression::StaleVotesCount,
        Regression::DeadVotersCount,
        Regression::ServeFromCachedHealth,
        Regression::OneVoteAttemptARound,
    ];

    fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

#[cfg(feature = "conformance")]
thread_local! {
    static ON: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Switches `defect` on or off for this thread.
#[cfg(feature = "conformance")]
pub(crate) fn set(defect: Regression, on: bool) {
    ON.with(|b| {
        let bits = b.get();
        b.set(if on {
            bits | defect.bit()
        } else {
            bits & !defect.bit()
        });
    });
}

/// True while `defect` is switched on for this thread.
#[inline]
pub(crate) fn on(defect: Regression) -> bool {
    #[cfg(feature = "conformance")]
    {
        ON.with(|b| b.get() & defect.bit() != 0)
    }
    #[cfg(not(feature = "conformance"))]
    {
        let _ = defect;
        false
    }
}

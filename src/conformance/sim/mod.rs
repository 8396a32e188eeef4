//! A deterministic simulation of the runtime: N silos of the real [`Silo`](crate::Silo) code over
//! a storage that behaves as the Cassandra backend may (latency, timeouts, writes that applied but
//! answered `OutcomeUnknown`, lost conditional races, reads that fail or hang, silos cut off from
//! storage), under process faults (crash, pause, restart as a new generation, graceful leave) and
//! wall-clock skew, with every documented guarantee the runtime gives checked on the history
//! ([`Invariant`]).
//!
//! **Deterministic.** Everything runs on one thread, in a current-thread tokio runtime with paused
//! time: time moves only when every task waits, so an hour of cluster life takes a fraction of a
//! second, and the order of events depends on nothing but the seed — the storage's and the
//! driver's random choices come from it, and so does the runtime's own jitter (its generator
//! seeded for the thread). The same seed gives the same [`SimReport::log`], byte for byte.
//!
//! **A pause is a pause.** Every task of a silo (the host's, its heartbeat, its detector) runs
//! inside the silo's pause scope: while paused none of its code is polled, its timers fire late at
//! the resume, and the monotonic clock has moved on. Requests it had already sent still reach
//! storage (they are on the wire), and whatever a host asks of its [`Fence`](crate::Fence) is
//! asked at any instant, as a host resumed at that instant would.
//!
//! ```
//! use cassandra_membership::conformance::sim::{SimConfig, run};
//! let report = run(7, &SimConfig::demo(5));
//! assert!(report.violations.is_empty(), "{}", report.explain());
//! assert_eq!(report.log, run(7, &SimConfig::demo(5)).log);
//! ```
//!
//! Available with the `conformance` feature (which turns on tokio's `test-util` for paused time).

mod check;
mod driver;
mod storage;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use crate::options::MembershipOptions;
pub use crate::runtime::regress::Regression;

/// What one simulated history runs: how many silos, for how long, on which options, and which
/// faults.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Silos at the start (3 to 50); crashed and departed ones come back as new generations.
    pub silos: usize,
    /// Simulated time, the quiet tail included.
    pub duration: Duration,
    /// The membership options every silo and the table use (no defunct cleanup: each silo is a
    /// process of its own, and the cleanup a process shares is outside the runtime under test).
    pub options: MembershipOptions,
    /// Each incarnation's wall clock is off by up to this much, either way.
    pub skew: Duration,
    /// Mean simulated time between two process or storage faults across the cluster.
    pub fault_every: Duration,
    /// A defect put back for the history (the simulation's teeth), or none.
    pub regression: Option<Regression>,
}

impl SimConfig {
    /// The defaults a host runs with (a 30 s publish period, 90 s detection horizon), for an hour.
    pub fn default_periods(silos: usize) -> Self {
        let options = MembershipOptions {
            defunct_silo_cleanup_period: None,
            ..MembershipOptions::default()
        };
        SimConfig {
            silos,
            duration: Duration::from_secs(3_600),
            skew: Duration::from_secs(3),
            fault_every: Duration::from_secs(40),
            options,
            regression: None,
        }
    }

    /// The demo's short periods (1 s publish period, 3 s horizon), for ten minutes.
    pub fn demo(silos: usize) -> Self {
        let options = MembershipOptions {
            defunct_silo_cleanup_period: None,
            i_am_alive_table_publish_timeout: Duration::from_secs(1),
            table_operation_timeout: Some(Duration::from_millis(500)),
            leave_timeout: Duration::from_secs(5),
            max_join_attempt_time: Duration::from_secs(20),
            ..MembershipOptions::default()
        };
        SimConfig {
            silos,
            duration: Duration::from_secs(600),
            skew: Duration::from_millis(100),
            fault_every: Duration::from_secs(2),
            options,
            regression: None,
        }
    }

    /// The same history with `defect` put back.
    pub fn with_regression(mut self, defect: Regression) -> Self {
        self.regression = Some(defect);
        self
    }

    /// The fault-free tail at the end of a history, long enough for every silo that crashed to
    /// be declared dead: [`SimConfig::detection_bound`] and two more periods.
    pub fn quiet_tail(&self) -> Duration {
        self.detection_bound()
            .saturating_add(self.options.i_am_alive_table_publish_timeout * 2)
    }

    /// How soon a crashed silo is declared Dead once enough live voters remain, counted from the
    /// I-am-alive time it last stored: the detection horizon, plus one period
    /// for each of the `num_votes_for_death_declaration` voters' rounds to come round, plus one
    /// for a round that lost a race and the calls of a round (two `table_operation_timeout`s),
    /// plus the skew both ways.
    pub fn detection_bound(&self) -> Duration {
        let o = &self.options;
        let period = o.i_am_alive_table_publish_timeout;
        o.detection_horizon()
            .saturating_add(period * (o.num_votes_for_death_declaration + 1))
            .saturating_add(o.effective_table_operation_timeout() * 2)
            .saturating_add(self.skew * 2)
    }
}

/// A documented guarantee the simulation checks on every history.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Invariant {
    /// docs::guarantees: a silo is declared dead only after the detection horizon of silence: no
    /// death applies less than a horizon (less twice the skew) after the I-am-alive time the
    /// silo last stored.
    NoLiveSiloDeclaredDead,
    /// docs::fencing: a host never serves after the others declared its silo dead — no
    /// `should_serve() == true` at any instant after its death applied, pauses included. (A
    /// death an operator writes is seen only by the silo's next read: `FenceBound` bounds it.)
    NoServingAfterDeath,
    /// docs::fencing, "The horizons" and "The silo's own row": `should_serve()` is false from the
    /// fence horizon after the start of the last publish that succeeded, and from one detection
    /// horizon after the last read of the own row that answered.
    FenceBound,
    /// docs::guarantees, "Which votes count": a death is written on
    /// `num_votes_for_death_declaration` votes by distinct voters that have a row, not Dead, at
    /// the version the death is written on, each younger than the vote lifetime.
    DeathOnCountedVotes,
    /// docs::fencing: every crashed member, and every member cut off from storage for longer, is
    /// declared Dead within [`SimConfig::detection_bound`] when enough steady voters remain
    /// (serving, with no failed, hung or slow call, pause, cut or storm since its last
    /// I-am-alive time); checked at each one's due time, and for crashes again at the end.
    DeadWithinBound,
    /// `Silo::view`: views never go back, and each shows one committed version as committed.
    ViewsMonotonic,
    /// `Silo::leave`: a leave ends within `leave_timeout`.
    LeaveWithinTimeout,
    /// docs::fencing, "The horizons": a healthy silo is never fenced — one whose every call
    /// answered promptly for a detection horizon and two periods, not declared dead, serves.
    HealthySiloServes,
}

/// A guarantee broken at one instant of a history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Which guarantee.
    pub invariant: Invariant,
    /// Simulated time since the start.
    pub at: Duration,
    /// What happened, naming the silos.
    pub detail: String,
}

/// One history: what happened, what it broke, and the worst figures it measured.
#[derive(Clone, Debug)]
pub struct SimReport {
    /// The seed that fixes the history.
    pub seed: u64,
    /// Every event, one line each, in order: the same seed gives the same lines.
    pub log: Vec<String>,
    /// The guarantees broken, in order (empty on a good history).
    pub violations: Vec<Violation>,
    /// Simulated silo-hours (each incarnation's time as a member).
    pub silo_hours: f64,
    /// The worst of each measured bound, by name (`"fence after the last publish"`,
    /// `"fence after the last own-row read"`, `"dead after the last heartbeat"`, `"leave"`).
    pub worst: BTreeMap<&'static str, Duration>,
}

impl SimReport {
    /// The seed, the violations and the history's lines that matter: each violation's, and the
    /// events of the silos it names in the detection horizon before it.
    pub fn explain(&self) -> String {
        let mut out = format!(
            "seed {}: {} violation(s), {} events\n",
            self.seed,
            self.violations.len(),
            self.log.len()
        );
        for v in &self.violations {
            let _ = writeln!(
                out,
                "  {:>10.3}s {:?}: {}",
                v.at.as_secs_f64(),
                v.invariant,
                v.detail
            );
        }
        if let Some(first) = self.violations.first() {
            let names: Vec<&str> = first
                .detail
                .split_whitespace()
                .filter(|w| w.starts_with('s') && w.contains('#'))
                .map(|w| w.trim_matches(|c: char| !c.is_alphanumeric() && c != '#'))
                .collect();
            let _ = writeln!(
                out,
                "the events of {} up to the first violation:",
                names.join(", ")
            );
            let upto = format!("{:>10.3}", first.at.as_secs_f64());
            for line in self
                .log
                .iter()
                .filter(|l| names.iter().any(|n| mentions(l, n)))
            {
                if line.get(..10).is_some_and(|at| at > upto.as_str()) {
                    break;
                }
                let _ = writeln!(out, "  {line}");
            }
        }
        out
    }
}

fn mentions(line: &str, name: &str) -> bool {
    line.split(|c: char| !c.is_alphanumeric() && c != '#')
        .any(|w| w == name)
}

/// Runs one history. Deterministic: the same `seed` and `config` give the same report.
pub fn run(seed: u64, config: &SimConfig) -> SimReport {
    crate::runtime::jitter::seed_thread(Some(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
    if let Some(defect) = config.regression {
        crate::runtime::regress::set(defect, true);
    }
    let report = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map(|rt| rt.block_on(driver::simulate(seed, config.clone())));
    if let Some(defect) = config.regression {
        crate::runtime::regress::set(defect, false);
    }
    crate::runtime::jitter::seed_thread(None);
    match report {
        Ok(report) => report,
        Err(e) => panic!("a current-thread runtime could not be built: {e}"),
    }
}

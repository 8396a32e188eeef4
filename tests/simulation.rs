//! The deterministic simulation of the runtime (`conformance::sim`): many silos of the real
//! `Silo` code under storage and process faults, every documented guarantee checked on every
//! history — the CI seed budget, determinism, and the simulation's teeth (each fixed defect put
//! back is caught). CONTRIBUTING, "The simulation", says how to run more seeds or one seed's log
//! (`examples/simulate.rs`).

use std::time::Duration;

use cassandra_membership::conformance::sim::{Invariant, Regression, SimConfig, run};

/// Runs `seeds` of `config` and fails with the first failing seed's explanation; prints the
/// simulated silo-hours and the worst of each measured bound.
fn green(what: &str, config: &SimConfig, seeds: std::ops::Range<u64>) {
    let started = std::time::Instant::now();
    let (mut hours, mut worst) = (0.0, std::collections::BTreeMap::new());
    for seed in seeds.clone() {
        let report = run(seed, config);
        assert!(
            report.violations.is_empty(),
            "{what}: {}\nrerun: cargo run --features conformance --example simulate -- --seed {seed} --log (with the profile and silos of {what})",
            report.explain()
        );
        hours += report.silo_hours;
        for (k, v) in report.worst {
            let w: &mut Duration = worst.entry(k).or_default();
            *w = (*w).max(v);
        }
    }
    println!(
        "{what}: {} seeds, {hours:.0} silo-hours, {:.1} s; worst: {worst:?}",
        seeds.end - seeds.start,
        started.elapsed().as_secs_f64()
    );
    assert!(hours > 0.0, "{what}: no silo ever joined");
}

/// The demo's periods, `minutes` of simulated time a history.
fn demo(silos: usize, minutes: u64) -> SimConfig {
    let mut c = SimConfig::demo(silos);
    c.duration = Duration::from_secs(60 * minutes);
    c
}

// The CI seed budget: about 1,000 histories, two CPU-minutes in a debug build (the long run is
// `examples/simulate.rs` in release: CONTRIBUTING, "The simulation").

#[test]
fn three_silos_at_the_demo_periods_break_no_guarantee() {
    green("demo, 3 silos, 2 min", &demo(3, 2), 0..400);
}

#[test]
fn five_silos_at_the_demo_periods_break_no_guarantee() {
    green("demo, 5 silos, 3 min", &demo(5, 3), 10_000..10_400);
}

#[test]
fn twelve_silos_at_the_demo_periods_break_no_guarantee() {
    green("demo, 12 silos, 3 min", &demo(12, 3), 20_000..20_100);
}

#[test]
fn ten_silos_at_the_default_periods_break_no_guarantee() {
    green(
        "defaults, 10 silos, 1 h",
        &SimConfig::default_periods(10),
        30_000..30_100,
    );
}

#[test]
fn fifty_silos_at_the_default_periods_break_no_guarantee() {
    green(
        "defaults, 50 silos, 1 h",
        &SimConfig::default_periods(50),
        40_000..40_004,
    );
}

/// One seed fixes the whole history: the same seed gives the same event log, byte for byte;
/// another seed another one.
#[test]
fn the_same_seed_gives_the_same_history_byte_for_byte() {
    let config = SimConfig::demo(8);
    let (a, b, c) = (run(5, &config), run(5, &config), run(6, &config));
    assert!(a.log.len() > 100, "a history of {} events", a.log.len());
    assert_eq!(a.log.join("\n"), b.log.join("\n"));
    assert_ne!(a.log, c.log);
}

/// Each defect fixed in the runtime, put back behind its test-only switch, is caught within the
/// seed budget, by the invariant named for the guarantee it broke (CONTRIBUTING's teeth table).
#[test]
fn every_defect_put_back_is_caught() {
    let cases = [
        (
            Regression::VotersFromTheFirstRead,
            Invariant::DeathOnCountedVotes,
        ),
        (Regression::FenceCountsRounds, Invariant::FenceBound),
        (Regression::StaleVotesCount, Invariant::DeathOnCountedVotes),
        (Regression::DeadVotersCount, Invariant::DeathOnCountedVotes),
        (Regression::ServeFromCachedHealth, Invariant::FenceBound),
    ];
    for (defect, invariant) in cases {
        let config = SimConfig::demo(5).with_regression(defect);
        let caught = (0..60).find(|&seed| {
            run(seed, &config)
                .violations
                .iter()
                .any(|v| v.invariant == invariant)
        });
        let Some(seed) = caught else {
            panic!("{defect:?} put back: no {invariant:?} violation in 60 seeds");
        };
        println!(
            "{defect:?}: caught by {invariant:?} at seed {seed} ({} seeds)",
            seed + 1
        );
    }
}

//! The deterministic simulation of the runtime (`conformance::sim`): many silos of the real
//! `Silo` code under storage and process faults, every documented guarantee checked on every
//! history. CONTRIBUTING, "The simulation", says how to run more seeds or one seed's log.

use cassandra_membership::conformance::sim::{Regression, SimConfig, SimReport, run};

/// Runs `seeds` of `config`; fails with the first failing seed's explanation.
fn seeds(config: &SimConfig, seeds: std::ops::Range<u64>) -> f64 {
    let mut hours = 0.0;
    for seed in seeds {
        let report = run(seed, config);
        hours += report.silo_hours;
        assert!(report.violations.is_empty(), "{}", report.explain());
    }
    hours
}

#[test]
fn demo_periods_five_silos() {
    let h = seeds(&SimConfig::demo(5), 0..20);
    println!("{h:.1} silo-hours");
}

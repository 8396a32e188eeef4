//! Runs the deterministic simulation of the runtime (`conformance::sim`) for any number of seeds,
//! or one seed with its whole event log (CONTRIBUTING, "The simulation"):
//!
//! ```text
//! cargo run --release --features conformance --example simulate -- --seeds 1000
//! cargo run --release --features conformance --example simulate -- --seed 42 --log
//! cargo run --release --features conformance --example simulate -- --profile default --silos 50 --seeds 10
//! cargo run --release --features conformance --example simulate -- --regression voters-from-the-first-read --seeds 200
//! ```
//!
//! Exits 1 at the first seed that breaks a guarantee, printing the seed and the events that matter.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use cassandra_membership::conformance::sim::{Regression, SimConfig, run};
use clap::{Parser, ValueEnum};

#[derive(Parser, Debug)]
#[command(about = "The deterministic simulation of many silos under faults")]
struct Args {
    /// One seed; with --log its whole event log.
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// How many seeds, from --from.
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// The first seed of --seeds.
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Print the whole event log of --seed.
    #[arg(long, requires = "seed")]
    log: bool,
    /// The options: `demo` (1 s period, 10 min a history) or `default` (30 s period, an hour).
    #[arg(long, value_enum, default_value_t = Profile::Demo)]
    profile: Profile,
    /// Silos at the start (3 to 50).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(3..=50))]
    silos: u64,
    /// Simulated time of each history (e.g. `2h`); the profile's by default.
    #[arg(long, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    /// Put a fixed defect back (the simulation's teeth).
    #[arg(long, value_enum)]
    regression: Option<Defect>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Profile {
    Demo,
    Default,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Defect {
    VotersFromTheFirstRead,
    FenceCountsRounds,
    StaleVotesCount,
    DeadVotersCount,
    ServeFromCachedHealth,
    OneVoteAttemptARound,
}

impl From<Defect> for Regression {
    fn from(d: Defect) -> Regression {
        match d {
            Defect::VotersFromTheFirstRead => Regression::VotersFromTheFirstRead,
            Defect::FenceCountsRounds => Regression::FenceCountsRounds,
            Defect::StaleVotesCount => Regression::StaleVotesCount,
            Defect::DeadVotersCount => Regression::DeadVotersCount,
            Defect::ServeFromCachedHealth => Regression::ServeFromCachedHealth,
            Defect::OneVoteAttemptARound => Regression::OneVoteAttemptARound,
        }
    }
}

/// The flags besides the seed that fix a history (for the rerun hint).
fn same_history(args: &Args) -> String {
    let mut flags = format!("--profile {:?} --silos {}", args.profile, args.silos).to_lowercase();
    if let Some(d) = args.duration {
        flags.push_str(&format!(" --duration {}", humantime::format_duration(d)));
    }
    if let Some(r) = args.regression {
        let name = format!("{r:?}");
        let kebab: String = name
            .chars()
            .enumerate()
            .flat_map(|(i, c)| {
                let dash = (i > 0 && c.is_uppercase()).then_some('-');
                dash.into_iter().chain(c.to_lowercase())
            })
            .collect();
        flags.push_str(&format!(" --regression {kebab}"));
    }
    flags
}

fn main() -> ExitCode {
    let args = Args::parse();
    let silos = args.silos as usize;
    let mut config = match args.profile {
        Profile::Demo => SimConfig::demo(silos),
        Profile::Default => SimConfig::default_periods(silos),
    };
    if let Some(d) = args.duration {
        config.duration = d;
    }
    config.regression = args.regression.map(Regression::from);
    let seeds = match args.seed {
        Some(s) => s..s + 1,
        None => args.from..args.from + args.seeds,
    };
    let started = Instant::now();
    let (mut hours, mut worst) = (0.0, std::collections::BTreeMap::new());
    for seed in seeds.clone() {
        let report = run(seed, &config);
        if args.log {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            // A closed pipe (`| head`) ends the printing, not with a panic.
            if report.log.iter().any(|l| writeln!(out, "{l}").is_err()) {
                return ExitCode::SUCCESS;
            }
        }
        hours += report.silo_hours;
        for (k, v) in &report.worst {
            let w: &mut Duration = worst.entry(*k).or_default();
            *w = (*w).max(*v);
        }
        if !report.violations.is_empty() {
            eprint!("{}", report.explain());
            eprintln!(
                "first failing seed: {seed} (after {} seed(s)); rerun: cargo run --release --features conformance --example simulate -- {} --seed {seed} --log",
                seed - seeds.start + 1,
                same_history(&args)
            );
            return ExitCode::FAILURE;
        }
    }
    println!(
        "{} seed(s) green: {hours:.1} simulated silo-hours in {:.1} s",
        seeds.end - seeds.start,
        started.elapsed().as_secs_f64()
    );
    for (k, v) in worst {
        println!("  worst {k}: {:.3} s", v.as_secs_f64());
    }
    ExitCode::SUCCESS
}

//! `cassandra-membership`: see, audit, patch and clean Orleans-style membership tables in
//! Cassandra. A thin layer over the library's public API: every read and write is the
//! provider's own, configured from the same options file a silo host loads.
//!
//! Exit codes: see `config::AFTER_HELP` (shown by `--help`).

mod args;
mod config;
mod failure;
mod logging;
mod migrate;
mod remove;
mod report;
mod schema;

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use cassandra_membership::cassandra::{MigrationPlan, PatchAction};
use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, ConsistencyProfile, MembershipTable,
    Timestamp, TtlMismatchPolicy,
};
use clap::{CommandFactory, FromArgMatches};
use serde::Serialize;

use args::{Cli, Command, Consistency};
use config::{CliError, Overrides, Scope, Source};
use report::{AuditReport, ClusterReport, ClustersReport, Document, MembersReport};

fn main() -> ExitCode {
    let json = failure::json_requested(std::env::args_os());
    let parsed = Cli::command().try_get_matches().and_then(|matches| {
        let cluster_flag = on_command_line(&matches, "cluster");
        Cli::from_arg_matches(&matches).map(|cli| (cli, cluster_flag))
    });
    let (cli, cluster_flag) = match parsed {
        Ok(parsed) => parsed,
        // --help, --version, and usage errors without --json: clap prints them (exit 0 / 2).
        Err(e) if !json || !e.use_stderr() => e.exit(),
        Err(e) => {
            let rendered = e.render().to_string();
            let message = rendered.trim().trim_start_matches("error: ");
            failure::print_json(&failure::Failure::usage(message));
            return ExitCode::from(config::EXIT_USAGE);
        }
    };
    if let Command::Completions { shell } = cli.command {
        clap_complete::generate(
            shell,
            &mut Cli::command(),
            "cassandra-membership",
            &mut std::io::stdout(),
        );
        return ExitCode::SUCCESS;
    }
    let json = cli.json;
    if let Err(e) = logging::init(cli.verbose, std::env::var("RUST_LOG").ok(), json) {
        failure::report(&e, json);
        return ExitCode::from(e.exit_code());
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            let e = CliError::Failed(format!("cannot start the async runtime: {e}"));
            failure::report(&e, json);
            return ExitCode::from(e.exit_code());
        }
    };
    match runtime.block_on(run(cli, cluster_flag)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            failure::report(&e, json);
            ExitCode::from(e.exit_code())
        }
    }
}

/// `cluster_flag`: `--cluster` was given on the command line (not only its variable).
async fn run(cli: Cli, cluster_flag: bool) -> Result<(), CliError> {
    // `delete-cluster blue` and `delete-cluster --cluster blue` name the same cluster.
    let delete_target = match &cli.command {
        Command::DeleteCluster { target, .. } => delete_target(target, &cli.cluster, cluster_flag)?,
        _ => String::new(),
    };
    let config::Resolved {
        options,
        ttl_explicit,
    } = config::resolve(
        Source {
            file: cli.config.as_deref(),
            key: cli.config_key.as_deref(),
        },
        Overrides {
            scope: match cli.command {
                Command::Clusters
                | Command::Audit
                | Command::Patch { .. }
                | Command::Migrate { .. }
                | Command::Schema { .. } => Scope::Table,
                Command::DeleteCluster { .. } => Scope::Service,
                Command::Members
                | Command::DeclareDead { .. }
                | Command::Cleanup { .. }
                | Command::Watch { .. }
                | Command::Completions { .. } => Scope::Cluster,
            },
            contact_points: cli.contact_points,
            keyspace: cli.keyspace,
            table: cli.table,
            // `migrate` also copies only the clusters they name (below).
            service: cli.service.clone(),
            cluster: cli.cluster.clone(),
            consistency: cli.consistency.map(|c| match c {
                Consistency::Quorum => ConsistencyProfile::Quorum,
                Consistency::LocalQuorum => ConsistencyProfile::LocalQuorum,
            }),
            serial_datacenter: cli
                .serial_datacenter
                .or_else(old_serial_datacenter_variable),
            request_timeout: cli.request_timeout,
            connect_timeout: cli.connect_timeout,
            ttl: cli.ttl,
            tls_ca: cli.tls_ca,
            tls_cert: cli.tls_cert,
            tls_key: cli.tls_key,
            tls_server_name: cli.tls_server_name,
        },
        |name| std::env::var(name).ok(),
    )?;
    if matches!(cli.command, Command::Migrate { .. }) && !ttl_explicit {
        // The new table is created with the configured TTL: the library's default (off) would
        // give it none while the silos' options may say otherwise.
        return Err(CliError::Usage(
            "migrate creates the new table with the configured TTL: set `ttl` in the --config \
             file or pass --ttl true|false (as the silos will run with)"
                .into(),
        ));
    }
    if matches!(cli.command, Command::Patch { .. }) && !ttl_explicit {
        // The library's default is ttl = false: patching with it would turn expiry off for every
        // cluster of the table and rewrite rows without TTL. Refused before connecting.
        return Err(CliError::Usage(
            "patch enforces the configured TTL on the whole table: set `ttl` in the --config file \
             or pass --ttl true|false (refusing to use the default, which turns expiry off)"
                .into(),
        ));
    }
    if let Command::Cleanup {
        older_than, force, ..
    } = cli.command
        && older_than < remove::CLEANUP_FLOOR
        && !force
    {
        return Err(CliError::Usage(format!(
            "cleanup --older-than {} would remove entries of silos that are starting or \
             stopping right now; use at least {} (or add --force)",
            humantime::format_duration(older_than),
            humantime::format_duration(remove::CLEANUP_FLOOR)
        )));
    }
    if let Command::Schema { role } = &cli.command {
        return schema::print(&options, role.as_deref(), cli.json);
    }
    if let Command::DeclareDead { silo, .. } = &cli.command {
        // Before connecting: a malformed address is a usage error (exit 2) even when no node
        // answers.
        silo.parse::<cassandra_membership::SiloAddress>()?;
    }
    let table = connect(options).await?;
    let json = cli.json;
    match cli.command {
        // Under --json stderr is JSON Lines: no progress text.
        Command::Clusters => {
            let after = if json {
                Duration::MAX
            } else {
                cli.progress_after
            };
            clusters(&table, json, after).await
        }
        Command::Members => {
            let m = members(&table).await?;
            if m.version.is_none() && m.members.is_empty() && m.unreadable.is_empty() {
                return Err(remove::no_such_cluster(&table, table.cluster_id()));
            }
            print(json, &m, || report::members_table(&m))
        }
        Command::Audit => {
            let a = AuditReport::from_audit(&table.audit_ttl().await?);
            print(json, &a, || report::audit_text(&a))
        }
        Command::Patch { yes } => patch(&table, yes, json).await,
        Command::DeclareDead { silo, yes } => {
            let table = match remove::expiry_of_the_cluster(&table, ttl_explicit).await? {
                Some(adopted) => connect(adopted).await?,
                None => table,
            };
            remove::declare_dead(&table, &silo, yes, json).await
        }
        Command::Cleanup {
            older_than,
            dry_run,
            yes,
            ..
        } => remove::cleanup(&table, older_than, dry_run, yes, json).await,
        Command::DeleteCluster { yes, .. } => {
            remove::delete_cluster(&table, &delete_target, yes, json).await
        }
        Command::Migrate {
            to_table,
            quiet_for,
            force,
            dry_run,
        } => {
            let plan = MigrationPlan::new(to_table)
                .quiet_for(quiet_for)
                .force(force)
                .dry_run(dry_run)
                .only(cli.service, cli.cluster);
            migrate::migrate(&table, plan, json).await
        }
        Command::Watch {
            interval,
            iterations,
        } => watch(&table, interval, iterations, json).await,
        // Answered before connecting.
        Command::Completions { .. } | Command::Schema { .. } => Ok(()),
    }
}

async fn connect(
    options: CassandraClusteringOptions,
) -> Result<CassandraMembershipTable, CliError> {
    // The library bounds its connect by connect_timeout; this outer bound (with a second of
    // room for the library to report its own, more precise error) holds if it ever did not.
    let limit = options.connect_timeout + Duration::from_secs(1);
    let points = options.contact_points.join(",");
    tracing::info!(
        contact_points = %points,
        keyspace = %options.keyspace,
        table = %options.table,
        tls = options.tls.is_some(),
        "connecting"
    );
    match tokio::time::timeout(limit, CassandraMembershipTable::connect(options)).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(CliError::Failed(format!(
            "no node at {points} answered within {}",
            humantime::format_duration(limit)
        ))),
    }
}

/// Prints `value` as a JSON document (with its `schema` field), or `text()` for people.
fn print<T: Serialize>(
    json: bool,
    value: &T,
    text: impl FnOnce() -> String,
) -> Result<(), CliError> {
    let out = if json {
        serde_json::to_string_pretty(&Document::new(value))
            .map_err(|e| CliError::Failed(format!("cannot write JSON: {e}")))?
    } else {
        text()
    };
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{}", out.trim_end())
        .and_then(|()| stdout.flush())
        .map_err(|e| CliError::Failed(format!("cannot write the output: {e}")))
}

async fn clusters(
    table: &CassandraMembershipTable,
    json: bool,
    progress_after: Duration,
) -> Result<(), CliError> {
    let mut reports = Vec::new();
    let mut failed = Vec::new();
    let started = Instant::now();
    let list = table.list_clusters().await?;
    let mut progress = Progress::new("clusters", list.len(), started, progress_after);
    for (i, (service, cluster)) in list.into_iter().enumerate() {
        progress.at(i, &format!("{service}/{cluster}"));
        // One damaged cluster must not hide the others: report it in its line.
        match table.inspect_cluster(&service, &cluster).await {
            Ok(c) => reports.push(ClusterReport::from_inspection(&c)),
            Err(e) => {
                failed.push(format!("{service}/{cluster}"));
                reports.push(ClusterReport::failed(
                    service,
                    cluster,
                    CliError::from(e).to_string(),
                ))
            }
        }
    }
    progress.done();
    let r = ClustersReport { clusters: reports };
    print(json, &r, || report::clusters_table(&r.clusters))?;
    // What was read is printed; a script must still learn that the listing is incomplete.
    if failed.is_empty() {
        Ok(())
    } else {
        Err(CliError::Failed(format!(
            "{} cluster(s) could not be read (see their error): {}",
            failed.len(),
            failed.join(", ")
        )))
    }
}

/// Progress of a scan on stderr (never stdout, which may be JSON), once it has taken longer
/// than `after`: a line rewritten in place on a terminal, a line per second otherwise.
struct Progress {
    what: &'static str,
    total: usize,
    started: Instant,
    after: Duration,
    last: Option<Instant>,
    terminal: bool,
}

impl Progress {
    fn new(what: &'static str, total: usize, started: Instant, after: Duration) -> Self {
        Progress {
            what,
            total,
            started,
            after,
            last: None,
            terminal: std::io::stderr().is_terminal(),
        }
    }

    /// `done` items are finished; `next` is being read.
    fn at(&mut self, done: usize, next: &str) {
        if self.started.elapsed() < self.after
            || self
                .last
                .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        self.last = Some(Instant::now());
        let line = format!(
            "{}: {done}/{} read, reading {next} ({:.1}s)",
            self.what,
            self.total,
            self.started.elapsed().as_secs_f64()
        );
        if self.terminal {
            eprint!("\r\x1b[K{line}");
        } else {
            eprintln!("{line}");
        }
    }

    fn done(&self) {
        if self.last.is_some() {
            let line = format!(
                "{}: {}/{} read in {:.1}s",
                self.what,
                self.total,
                self.total,
                self.started.elapsed().as_secs_f64()
            );
            if self.terminal {
                eprintln!("\r\x1b[K{line}");
            } else {
                eprintln!("{line}");
            }
        }
    }
}

async fn members(table: &CassandraMembershipTable) -> Result<MembersReport, CliError> {
    let c = table.inspect().await?;
    Ok(MembersReport::from_inspection(
        &c,
        &table.options().membership,
    ))
}

#[derive(Serialize)]
struct PatchReport {
    /// What the audit found before: every row listed here was rewritten or removed.
    before: AuditReport,
    /// The audit after patching (agrees, unless rows changed meanwhile, are unreadable or are
    /// kept while their silo may live).
    after: AuditReport,
    /// Whether patch changed anything (false: the table default agreed and every disagreeing
    /// row is kept as it is).
    patched: bool,
}

async fn patch(table: &CassandraMembershipTable, yes: bool, json: bool) -> Result<(), CliError> {
    // The audit first: it also fails (writing nothing) when the table does not exist, so
    // patching never creates one.
    let before = table.audit_ttl().await?;
    // Rows of silos that may still run are kept as they are (keep_while_live): only a table
    // default to alter or rows to rewrite or remove are changes to confirm.
    let changes = before.table_default_ttl != before.configured_ttl
        || before
            .rows
            .iter()
            .any(|r| matches!(r.action, PatchAction::Rewrite { .. } | PatchAction::Remove));
    if changes && !yes {
        // Say what would change before anything changes, like delete-cluster.
        let a = AuditReport::from_audit(&before);
        print(json, &a, || report::audit_text(&a))?;
        return Err(CliError::Refused(format!(
            "refusing to patch {} without --yes (the audit above is what it would do)",
            table.qualified_table()
        )));
    }
    if changes {
        let options = table
            .options()
            .clone()
            .ttl_mismatch(TtlMismatchPolicy::Patch);
        let patcher = CassandraMembershipTable::with_session(table.session().clone(), options)?;
        // What a silo with ttl_mismatch = "patch" does at start; no version is created.
        patcher.initialize(false).await?;
    }
    let after = table.audit_ttl().await?;
    let r = PatchReport {
        before: AuditReport::from_audit(&before),
        after: AuditReport::from_audit(&after),
        patched: changes,
    };
    print(json, &r, || {
        if !changes {
            return format!("nothing to patch\n{}", report::audit_text(&r.after));
        }
        let count = |a: &str| r.before.rows.iter().filter(|x| x.action == a).count();
        let mut s = String::from("patched:\n");
        if r.before.table_default_ttl_seconds != r.after.table_default_ttl_seconds {
            s.push_str(&format!(
                "  table default_time_to_live {} s -> {} s\n",
                r.before.table_default_ttl_seconds, r.after.table_default_ttl_seconds
            ));
        }
        s.push_str(&format!(
            "  {} row(s) rewritten, {} removed, {} unreadable left alone\n",
            count("rewrite"),
            count("remove"),
            count("unreadable")
        ));
        s.push_str("what it changed (the audit before):\n");
        s.push_str(&report::audit_text(&r.before));
        s.push_str("now:\n");
        s.push_str(&report::audit_text(&r.after));
        s
    })
}

async fn watch(
    table: &CassandraMembershipTable,
    interval: Duration,
    iterations: Option<u64>,
    json: bool,
) -> Result<(), CliError> {
    let clear = !json && std::io::stdout().is_terminal();
    let mut done = 0u64;
    // One listener for the whole watch, created before the first read: a listener created per
    // wait would miss a Ctrl-C that arrives while a read is in flight (tokio keeps the signal
    // handler installed, so the default "terminate" no longer applies either).
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let read = tokio::select! {
            m = members(table) => m,
            _ = &mut ctrl_c => return Ok(()),
        };
        match read {
            Ok(m) => {
                if clear {
                    print!("\x1b[2J\x1b[H"); // clear the screen, cursor home
                }
                if json {
                    // One document per line, so a consumer can read the stream line by line.
                    let line = serde_json::to_string(&Document::new(&m))
                        .map_err(|e| CliError::Failed(format!("cannot write JSON: {e}")))?;
                    print(false, &(), || line)?;
                } else {
                    print(false, &(), || {
                        format!(
                            "{}  (every {})\n{}",
                            Timestamp::now(),
                            humantime::format_duration(interval),
                            report::members_table(&m)
                        )
                    })?;
                }
            }
            // A watch outlives a node restart: show the error and keep going.
            Err(e) if json => failure::report(&e, true),
            Err(e) => eprintln!("{}: error: {e}", Timestamp::now()),
        }
        done += 1;
        if iterations.is_some_and(|n| done >= n) {
            return Ok(());
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = &mut ctrl_c => return Ok(()),
        }
    }
}

/// `CASSANDRA_MEMBERSHIP_LOCAL_DATACENTER`, the variable 0.2 read for the serial DC (renamed
/// `CASSANDRA_MEMBERSHIP_SERIAL_DATACENTER`): still honoured, with a warning, when neither the
/// flag nor the new variable is set.
fn old_serial_datacenter_variable() -> Option<String> {
    let dc = std::env::var("CASSANDRA_MEMBERSHIP_LOCAL_DATACENTER")
        .ok()
        .filter(|dc| !dc.is_empty())?;
    tracing::warn!(
        "CASSANDRA_MEMBERSHIP_LOCAL_DATACENTER is deprecated: set CASSANDRA_MEMBERSHIP_SERIAL_DATACENTER"
    );
    Some(dc)
}

/// Whether the global argument `id` came from the command line (in the matches of the
/// subcommand it followed, or of the top level), not from its environment variable.
fn on_command_line(matches: &clap::ArgMatches, id: &str) -> bool {
    let here = matches!(
        matches
            .try_get_raw(id)
            .ok()
            .flatten()
            .and(matches.value_source(id)),
        Some(clap::parser::ValueSource::CommandLine)
    );
    here || matches
        .subcommand()
        .is_some_and(|(_, sub)| on_command_line(sub, id))
}

/// The cluster `delete-cluster` deletes: its argument, else `--cluster` (or its variable). An
/// argument and a `--cluster` flag must agree; the variable (a default for the commands on one
/// cluster) gives way to the argument.
fn delete_target(
    argument: &Option<String>,
    cluster: &Option<String>,
    cluster_flag: bool,
) -> Result<String, CliError> {
    // A destructive command names its target on the command line: the variable (a default for
    // the commands on one cluster, maybe exported long ago) never picks the cluster to delete.
    let flag = if cluster_flag { cluster } else { &None };
    match (argument, flag) {
        (Some(a), Some(f)) if a != f => Err(CliError::Usage(format!(
            "delete-cluster {a} and --cluster {f} name different clusters: name it once"
        ))),
        (Some(c), _) | (None, Some(c)) => Ok(c.clone()),
        (None, None) if cluster.is_some() => Err(CliError::Usage(
            "delete-cluster does not take its cluster from CASSANDRA_MEMBERSHIP_CLUSTER: name \
             it on the command line: delete-cluster <CLUSTER_ID> (or --cluster)"
                .into(),
        )),
        (None, None) => Err(CliError::Usage(
            "delete-cluster needs the cluster to delete on the command line: \
             delete-cluster <CLUSTER_ID> (or --cluster)"
                .into(),
        )),
    }
}

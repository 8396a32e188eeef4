//! `cassandra-membership`: see, audit, patch and clean Orleans-style membership tables in
//! Cassandra. A thin layer over the library's public API: every read and write is the
//! provider's own, configured from the same options file a silo host loads.
//!
//! Exit codes: 0 ok, 1 the operation failed, 2 usage or configuration error.

mod config;
mod report;

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, ConsistencyProfile, MembershipTable,
    PatchAction, Timestamp, TtlMismatchPolicy,
};
use clap::{Parser, Subcommand, ValueEnum};
use serde::Serialize;

use config::{CliError, Overrides, Scope};
use report::{AuditReport, ClusterReport, MembersReport};

#[derive(Debug, Parser)]
#[command(
    name = "cassandra-membership",
    version,
    about = "See, audit, patch and clean Orleans-style membership tables in Cassandra",
    after_help = "Credentials come from the config file's [credentials] or from \
                  CASSANDRA_MEMBERSHIP_USERNAME and CASSANDRA_MEMBERSHIP_PASSWORD; they are never printed.\n\
                  Exit codes: 0 ok, 1 operation failed, 2 usage or configuration error (also access denied, \
                  a missing service or cluster id, and a keyspace or table that does not exist or has another shape)."
)]
struct Cli {
    /// The provider's TOML options file (the same one a silo host loads); flags override it.
    #[arg(
        long,
        global = true,
        env = "CASSANDRA_MEMBERSHIP_CONFIG",
        value_name = "FILE"
    )]
    config: Option<PathBuf>,
    /// Nodes to contact, `host:port`, comma-separated.
    #[arg(
        long,
        global = true,
        env = "CASSANDRA_MEMBERSHIP_CONTACT_POINTS",
        value_delimiter = ',',
        value_name = "HOST:PORT"
    )]
    contact_points: Option<Vec<String>>,
    /// The keyspace.
    #[arg(long, global = true, env = "CASSANDRA_MEMBERSHIP_KEYSPACE")]
    keyspace: Option<String>,
    /// The table.
    #[arg(long, global = true, env = "CASSANDRA_MEMBERSHIP_TABLE")]
    table: Option<String>,
    /// The Orleans ServiceId; no default (members, watch, cleanup, delete-cluster need it).
    #[arg(long, global = true, env = "CASSANDRA_MEMBERSHIP_SERVICE")]
    service: Option<String>,
    /// The Orleans ClusterId the command works on; no default (members, watch, cleanup need it).
    #[arg(long, global = true, env = "CASSANDRA_MEMBERSHIP_CLUSTER")]
    cluster: Option<String>,
    /// Consistency levels: quorum (QUORUM + SERIAL) or local-quorum (LOCAL_QUORUM + LOCAL_SERIAL).
    #[arg(
        long,
        global = true,
        env = "CASSANDRA_MEMBERSHIP_CONSISTENCY",
        value_enum
    )]
    consistency: Option<Consistency>,
    /// The data centre that coordinates every statement (required with local-quorum; with
    /// quorum, tried first): the name `nodetool status` prints, e.g. dc1.
    #[arg(long, global = true, env = "CASSANDRA_MEMBERSHIP_LOCAL_DATACENTER")]
    local_datacenter: Option<String>,
    /// Per-statement timeout ("10s").
    #[arg(long, global = true, env = "CASSANDRA_MEMBERSHIP_REQUEST_TIMEOUT", value_parser = humantime::parse_duration)]
    request_timeout: Option<Duration>,
    /// How long connecting may take before the command fails with exit 1 ("5s").
    #[arg(long, global = true, env = "CASSANDRA_MEMBERSHIP_CONNECT_TIMEOUT", value_parser = humantime::parse_duration)]
    connect_timeout: Option<Duration>,
    /// Storage-side expiry on or off (the options file's `ttl`). `patch` needs it set here or in
    /// the file: it enforces it on the whole table.
    #[arg(
        long,
        global = true,
        env = "CASSANDRA_MEMBERSHIP_TTL",
        value_name = "BOOL"
    )]
    ttl: Option<bool>,
    /// Print JSON (stable field names) instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Consistency {
    Quorum,
    LocalQuorum,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Every (service, cluster) in the table: entries by status, version, newest I-am-alive,
    /// remaining TTL of the version.
    Clusters,
    /// One line per entry of the cluster: status, names, zones, last I-am-alive, suspicions, TTL.
    Members,
    /// The TTL audit: table default vs configuration, rows that disagree, what patch would do.
    /// Writes nothing.
    Audit,
    /// Applies the `patch` TTL policy (as a silo's initialize would) and shows what it changed.
    /// Needs `ttl` set explicitly (config file or --ttl): the table default it alters is shared
    /// by every cluster of the table. Shows the audit and refuses without --yes.
    Patch {
        /// Really patch.
        #[arg(long)]
        yes: bool,
    },
    /// Removes entries that are not Active and show no activity for this long (cleanup_defunct).
    Cleanup {
        /// e.g. "7d", "12h". At least 1h unless --force: a shorter cutoff would remove silos that
        /// are starting (Joining) or shutting down right now.
        #[arg(long, value_parser = humantime::parse_duration)]
        older_than: Duration,
        /// Allow --older-than below 1h.
        #[arg(long)]
        force: bool,
    },
    /// Deletes a whole cluster (its entries and version). Shows what it deletes; needs --yes.
    DeleteCluster {
        /// The cluster id to delete.
        #[arg(value_name = "CLUSTER")]
        target: String,
        /// Really delete.
        #[arg(long)]
        yes: bool,
    },
    /// Shows `members` again every few seconds until interrupted.
    Watch {
        /// Time between refreshes.
        #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
        interval: Duration,
        /// Stop after this many refreshes (default: until Ctrl-C).
        #[arg(long)]
        iterations: Option<u64>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse(); // exits 2 on usage errors, 0 for --help / --version
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(config::EXIT_FAILED);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

async fn run(cli: Cli) -> Result<(), CliError> {
    let config::Resolved {
        options,
        ttl_explicit,
    } = config::resolve(
        cli.config.as_deref(),
        Overrides {
            scope: match cli.command {
                Command::Clusters | Command::Audit | Command::Patch { .. } => Scope::Table,
                Command::DeleteCluster { .. } => Scope::Service,
                Command::Members | Command::Cleanup { .. } | Command::Watch { .. } => {
                    Scope::Cluster
                }
            },
            contact_points: cli.contact_points,
            keyspace: cli.keyspace,
            table: cli.table,
            service: cli.service,
            cluster: cli.cluster,
            consistency: cli.consistency.map(|c| match c {
                Consistency::Quorum => ConsistencyProfile::Quorum,
                Consistency::LocalQuorum => ConsistencyProfile::LocalQuorum,
            }),
            local_datacenter: cli.local_datacenter,
            request_timeout: cli.request_timeout,
            connect_timeout: cli.connect_timeout,
            ttl: cli.ttl,
        },
        |name| std::env::var(name).ok(),
    )?;
    if matches!(cli.command, Command::Patch { .. }) && !ttl_explicit {
        // The library's default is ttl = false: patching with it would turn expiry off for every
        // cluster of the table and rewrite rows without TTL. Refused before connecting.
        return Err(CliError::Usage(
            "patch enforces the configured TTL on the whole table: set `ttl` in the --config file \
             or pass --ttl true|false (refusing to use the default, which turns expiry off)"
                .into(),
        ));
    }
    let table = connect(options).await?;
    let json = cli.json;
    match cli.command {
        Command::Clusters => clusters(&table, json).await,
        Command::Members => {
            let m = members(&table).await?;
            print(json, &m, || report::members_table(&m))
        }
        Command::Audit => {
            let a = AuditReport::from_audit(&table.audit_ttl().await?);
            print(json, &a, || report::audit_text(&a))
        }
        Command::Patch { yes } => patch(&table, yes, json).await,
        Command::Cleanup { older_than, force } => {
            if older_than < CLEANUP_FLOOR && !force {
                return Err(CliError::Usage(format!(
                    "cleanup --older-than {} would remove entries of silos that are starting or \
                     stopping right now; use at least {} (or add --force)",
                    humantime::format_duration(older_than),
                    humantime::format_duration(CLEANUP_FLOOR)
                )));
            }
            cleanup(&table, older_than, json).await
        }
        Command::DeleteCluster { target, yes } => delete_cluster(&table, &target, yes, json).await,
        Command::Watch {
            interval,
            iterations,
        } => watch(&table, interval, iterations, json).await,
    }
}

async fn connect(
    options: CassandraClusteringOptions,
) -> Result<CassandraMembershipTable, CliError> {
    // The library bounds its connect by connect_timeout; this outer bound (with a second of
    // room for the library to report its own, more precise error) holds if it ever did not.
    let limit = options.connect_timeout + Duration::from_secs(1);
    let points = options.contact_points.join(",");
    match tokio::time::timeout(limit, CassandraMembershipTable::connect(options)).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(CliError::Failed(format!(
            "no node at {points} answered within {}",
            humantime::format_duration(limit)
        ))),
    }
}

/// Prints `value` as JSON, or `text()` for people.
fn print<T: Serialize>(
    json: bool,
    value: &T,
    text: impl FnOnce() -> String,
) -> Result<(), CliError> {
    let out = if json {
        serde_json::to_string_pretty(value)
            .map_err(|e| CliError::Failed(format!("cannot write JSON: {e}")))?
    } else {
        text()
    };
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{}", out.trim_end())
        .and_then(|()| stdout.flush())
        .map_err(|e| CliError::Failed(format!("cannot write the output: {e}")))
}

async fn clusters(table: &CassandraMembershipTable, json: bool) -> Result<(), CliError> {
    let mut reports = Vec::new();
    let mut failed = Vec::new();
    for (service, cluster) in table.list_clusters().await? {
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
    print(json, &reports, || report::clusters_table(&reports))?;
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
        return Err(CliError::Usage(format!(
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

#[derive(Serialize)]
struct CleanupReport {
    service_id: String,
    cluster_id: String,
    older_than_seconds: u64,
    cutoff: String,
    removed: usize,
}

/// The shortest `cleanup --older-than` without `--force`.
const CLEANUP_FLOOR: Duration = Duration::from_secs(3600);

async fn cleanup(
    table: &CassandraMembershipTable,
    older_than: Duration,
    json: bool,
) -> Result<(), CliError> {
    let cutoff = Timestamp::now().saturating_sub(older_than);
    let removed = table.cleanup_defunct(cutoff).await?;
    let r = CleanupReport {
        service_id: table.options().service_id.clone(),
        cluster_id: table.cluster_id().to_owned(),
        older_than_seconds: older_than.as_secs(),
        cutoff: cutoff.to_string(),
        removed,
    };
    print(json, &r, || {
        format!(
            "removed {} defunct entr{} of service {} cluster {} (not Active, no activity since {})",
            r.removed,
            if r.removed == 1 { "y" } else { "ies" },
            r.service_id,
            r.cluster_id,
            r.cutoff
        )
    })
}

#[derive(Serialize)]
struct DeleteReport {
    service_id: String,
    cluster_id: String,
    version: Option<u64>,
    entries: usize,
    /// Why the cluster could not be inspected before deleting (a damaged version), if so.
    damaged: Option<String>,
    deleted: bool,
}

async fn delete_cluster(
    table: &CassandraMembershipTable,
    target: &str,
    yes: bool,
    json: bool,
) -> Result<(), CliError> {
    let service = table.options().service_id.clone();
    let (version, entries, damaged) = match table.inspect_cluster(&service, target).await {
        Ok(c) => (
            (!c.version.etag.is_absent()).then_some(c.version.version),
            c.entries.len() + c.unreadable.len(),
            None,
        ),
        // A damaged version cannot be inspected, yet delete_cluster removes it: say so, go on.
        Err(e @ cassandra_membership::MembershipError::CorruptData { .. }) => {
            (None, 0, Some(e.to_string()))
        }
        Err(e) => return Err(e.into()),
    };
    if version.is_none() && entries == 0 && damaged.is_none() {
        return Err(CliError::Failed(format!(
            "no such cluster: service {service} has no cluster {target} in {}",
            table.qualified_table()
        )));
    }
    let mut r = DeleteReport {
        service_id: service.clone(),
        cluster_id: target.to_owned(),
        version,
        entries,
        damaged,
        deleted: false,
    };
    // Say what will go before anything goes.
    eprintln!(
        "delete-cluster: service {service} cluster {target}: {} entr{} and the table version ({}) of {}",
        r.entries,
        if r.entries == 1 { "y" } else { "ies" },
        match (&r.damaged, r.version) {
            (Some(why), _) => format!("damaged: {why}"),
            (None, Some(v)) => format!("version {v}"),
            (None, None) => "none".into(),
        },
        table.qualified_table(),
    );
    if !yes {
        print(json, &r, || "nothing deleted".into())?;
        return Err(CliError::Usage(format!(
            "refusing to delete cluster {target} without --yes"
        )));
    }
    table.delete_cluster(target).await?;
    r.deleted = true;
    print(json, &r, || {
        format!("deleted service {service} cluster {target}")
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
                    let line = serde_json::to_string(&m)
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

//! `cassandra-membership`: see, audit, patch and clean Orleans-style membership tables in
//! Cassandra. A thin layer over the library's public API: every read and write is the
//! provider's own, configured from the same options file a silo host loads.
//!
//! Exit codes: see `config::AFTER_HELP` (shown by `--help`).

mod config;
mod logging;
mod migrate;
mod remove;
mod report;

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, ConsistencyProfile, MembershipTable,
    MigrationPlan, PatchAction, Timestamp, TtlMismatchPolicy,
};
use clap::{ArgAction, CommandFactory, Parser, Subcommand, ValueEnum};
use serde::Serialize;

use config::{CliError, Overrides, Scope, Source};
use report::{AuditReport, ClusterReport, ClustersReport, Document, MembersReport};

#[derive(Debug, Parser)]
#[command(
    name = "cassandra-membership",
    version,
    about = "See, audit, patch and clean Orleans-style membership tables in Cassandra",
    after_help = config::AFTER_HELP
)]
struct Cli {
    /// The provider's TOML options file (the same one a silo host loads); flags override it.
    /// Default: $XDG_CONFIG_HOME/cassandra-membership/config.toml (or
    /// ~/.config/cassandra-membership/config.toml) when that file exists.
    #[arg(
        long,
        global = true,
        env = "CASSANDRA_MEMBERSHIP_CONFIG",
        value_name = "FILE"
    )]
    config: Option<PathBuf>,
    /// Read the options from this table of the file, `a.b` for `[a.b]` (an application's own
    /// config file, with the provider's options nested in it).
    #[arg(
        long,
        global = true,
        env = "CASSANDRA_MEMBERSHIP_CONFIG_KEY",
        value_name = "A.B"
    )]
    config_key: Option<String>,
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
    /// The Orleans ClusterId the command works on; no default (members, watch, cleanup,
    /// declare-dead need it).
    #[arg(long, global = true, env = "CASSANDRA_MEMBERSHIP_CLUSTER")]
    cluster: Option<String>,
    /// Consistency levels: quorum (QUORUM + SERIAL) or local_quorum (LOCAL_QUORUM +
    /// LOCAL_SERIAL), spelt as in the config file (`local-quorum` is accepted too).
    #[arg(
        long,
        global = true,
        env = "CASSANDRA_MEMBERSHIP_CONSISTENCY",
        value_enum
    )]
    consistency: Option<Consistency>,
    /// The data centre that coordinates every statement (required with local_quorum; with
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
    /// the file: it enforces it on the whole table. `declare-dead` adopts the table's expiry
    /// when it is not set, and refuses (exit 2) a value that disagrees with the cluster.
    #[arg(
        long,
        global = true,
        env = "CASSANDRA_MEMBERSHIP_TTL",
        value_name = "BOOL"
    )]
    ttl: Option<bool>,
    /// TLS: PEM file of the CA (or the nodes' certificates) to trust; turns TLS on. The config
    /// file's `[tls]` section (ca_file, cert_file, key_file, server_name, verify) does the same;
    /// its relative paths are relative to the file's directory.
    #[arg(
        long,
        global = true,
        env = "CASSANDRA_MEMBERSHIP_TLS_CA",
        value_name = "PEM"
    )]
    tls_ca: Option<PathBuf>,
    /// TLS: PEM file of the client certificate, for clusters that require one (with --tls-key).
    #[arg(
        long,
        global = true,
        env = "CASSANDRA_MEMBERSHIP_TLS_CERT",
        value_name = "PEM"
    )]
    tls_cert: Option<PathBuf>,
    /// TLS: PEM file of the client certificate's private key (with --tls-cert).
    #[arg(
        long,
        global = true,
        env = "CASSANDRA_MEMBERSHIP_TLS_KEY",
        value_name = "PEM"
    )]
    tls_key: Option<PathBuf>,
    /// TLS: the name every node's certificate must carry (default: the contact points' host
    /// when they all name one DNS host, else each node's IP address).
    #[arg(
        long,
        global = true,
        env = "CASSANDRA_MEMBERSHIP_TLS_SERVER_NAME",
        value_name = "NAME"
    )]
    tls_server_name: Option<String>,
    /// Print JSON (stable field names) instead of tables: one object per document, with a
    /// "schema" version field.
    #[arg(long, global = true)]
    json: bool,
    /// More log on stderr: -v info, -vv debug, -vvv trace (the driver's and the provider's).
    /// RUST_LOG, when set, takes precedence (e.g. RUST_LOG=scylla=debug). Default: warnings.
    #[arg(short, long, global = true, action = ArgAction::Count)]
    verbose: u8,
    /// Show progress on stderr once a scan has taken this long.
    #[arg(long, global = true, default_value = "1s", value_parser = humantime::parse_duration, hide = true)]
    progress_after: Duration,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Consistency {
    Quorum,
    /// LOCAL_QUORUM + LOCAL_SERIAL.
    #[value(name = "local_quorum", alias = "local-quorum")]
    LocalQuorum,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Every (service, cluster) in the table: entries by status, version, newest I-am-alive,
    /// remaining TTL of the version.
    Clusters,
    /// One line per entry of the cluster: status, names, zones, last I-am-alive, suspicions, TTL.
    /// A cluster with no version and no entries is "no such cluster" (exit 1).
    Members,
    /// The TTL audit: table default vs configuration, rows that disagree, what patch would do.
    /// Writes nothing.
    Audit,
    /// Applies the `patch` TTL policy (as a silo's initialize would) and shows what it changed.
    /// Needs `ttl` set explicitly (config file or --ttl): the table default it alters is shared
    /// by every cluster of the table. Shows the audit and refuses without --yes (exit 3).
    Patch {
        /// Really patch.
        #[arg(long)]
        yes: bool,
    },
    /// Declares one silo of the cluster Dead, as the silos' own failure detector would: a
    /// versioned write of its entry (status Dead) at the table version read, retried a few
    /// times when a silo writes in between. Shows the entry and refuses without --yes (exit 3).
    /// The silo itself stops when it reads its entry (it is fenced); the entry stays until
    /// cleanup or expiry removes it. Without --ttl (or `ttl` in the config file) it writes with
    /// the table's expiry (its default_time_to_live); a `ttl` that is set must agree with the
    /// cluster as its silos' own check does, or the command is refused (exit 2).
    DeclareDead {
        /// The silo's address as `members` prints it, e.g. 10.0.0.7:11111@120000000.
        #[arg(value_name = "SILO")]
        silo: String,
        /// Really declare it dead.
        #[arg(long)]
        yes: bool,
    },
    /// Removes entries that are not Active and show no activity for this long (the library's
    /// cleanup_defunct rule: no I-am-alive, start or suspicion since the cutoff). Lists what it
    /// would remove and refuses without --yes (exit 3); --dry-run only lists.
    Cleanup {
        /// e.g. "7d", "12h". At least 1h unless --force: a shorter cutoff would remove silos that
        /// are starting (Joining) or shutting down right now.
        #[arg(long, value_parser = humantime::parse_duration)]
        older_than: Duration,
        /// Allow --older-than below 1h.
        #[arg(long)]
        force: bool,
        /// List what would be removed; remove nothing.
        #[arg(long, conflicts_with = "yes")]
        dry_run: bool,
        /// Really remove.
        #[arg(long)]
        yes: bool,
    },
    /// Deletes a whole cluster (its entries and version). Shows what it deletes; refuses
    /// without --yes (exit 3).
    DeleteCluster {
        /// The cluster id to delete.
        #[arg(value_name = "CLUSTER")]
        target: String,
        /// Really delete.
        #[arg(long)]
        yes: bool,
    },
    /// Copies the configured table, of the cassandra-membership 0.2 shape, into a new table of
    /// the current shape (created with the configured TTL and gc_grace), cluster by cluster, and
    /// reads each copy back to verify it. Offline: stop the silos first; a cluster active
    /// within --quiet-for is refused (exit 3, nothing written) unless --force. Every cell keeps
    /// its write time and remaining TTL, so running it again (or after an interruption) is
    /// safe. The old table is never changed. With --service / --cluster, only those clusters.
    /// Needs `ttl` set explicitly (config file or --ttl), like patch.
    Migrate {
        /// The new table (same keyspace).
        #[arg(long, value_name = "TABLE")]
        to_table: String,
        /// How long every entry of a cluster must have been silent (no heartbeat, no write).
        #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
        quiet_for: Duration,
        /// Copy clusters that were active within --quiet-for too.
        #[arg(long)]
        force: bool,
        /// Read and check; write and create nothing.
        #[arg(long)]
        dry_run: bool,
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
    /// Prints the shell completion script, e.g. `cassandra-membership completions bash >
    /// /etc/bash_completion.d/cassandra-membership`. Connects to nothing.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse(); // exits 2 on usage errors, 0 for --help / --version
    if let Command::Completions { shell } = cli.command {
        clap_complete::generate(
            shell,
            &mut Cli::command(),
            "cassandra-membership",
            &mut std::io::stdout(),
        );
        return ExitCode::SUCCESS;
    }
    if let Err(e) = logging::init(cli.verbose, std::env::var("RUST_LOG").ok()) {
        eprintln!("error: {e}");
        return ExitCode::from(e.exit_code());
    }
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
        Source {
            file: cli.config.as_deref(),
            key: cli.config_key.as_deref(),
        },
        Overrides {
            scope: match cli.command {
                Command::Clusters
                | Command::Audit
                | Command::Patch { .. }
                | Command::Migrate { .. } => Scope::Table,
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
            local_datacenter: cli.local_datacenter,
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
    let table = connect(options).await?;
    let json = cli.json;
    match cli.command {
        Command::Clusters => clusters(&table, json, cli.progress_after).await,
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
            // Parsed before anything is read, so a malformed address is a usage error at once.
            silo.parse::<cassandra_membership::SiloAddress>()?;
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
        Command::DeleteCluster { target, yes } => {
            remove::delete_cluster(&table, &target, yes, json).await
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
        Command::Completions { .. } => Ok(()), // answered before connecting
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

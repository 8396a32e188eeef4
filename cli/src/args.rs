//! The command line: global flags (each with its environment variable) and the subcommands.
//! `-h` prints each item's first paragraph, `--help` the whole text.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Parser, Subcommand, ValueEnum};

use crate::config;

#[derive(Debug, Parser)]
#[command(
    name = "cassandra-membership",
    version,
    about = "See, audit, patch and clean Orleans-style membership tables in Cassandra",
    after_help = config::AFTER_SHORT_HELP,
    after_long_help = config::AFTER_HELP
)]
pub(crate) struct Cli {
    /// The provider's TOML options file (flags override it).
    ///
    /// The same file a silo host loads. Default: $XDG_CONFIG_HOME/cassandra-membership/config.toml (or
    /// ~/.config/cassandra-membership/config.toml) when that file exists.
    #[arg(
        long,
        global = true,
        env = "CASSANDRA_MEMBERSHIP_CONFIG",
        value_name = "FILE"
    )]
    pub(crate) config: Option<PathBuf>,
    /// Read the options from this table of the file (`a.b` for `[a.b]`).
    ///
    /// For an application's own config file, with the provider's options nested in it.
    #[arg(
        long,
        global = true,
        env = "CASSANDRA_MEMBERSHIP_CONFIG_KEY",
        value_name = "A.B"
    )]
    pub(crate) config_key: Option<String>,
    /// Nodes to contact, `host:port`, comma-separated.
    #[arg(
        long,
        global = true,
        env = "CASSANDRA_MEMBERSHIP_CONTACT_POINTS",
        value_delimiter = ',',
        value_name = "HOST:PORT"
    )]
    pub(crate) contact_points: Option<Vec<String>>,
    /// The keyspace.
    #[arg(long, global = true, env = "CASSANDRA_MEMBERSHIP_KEYSPACE")]
    pub(crate) keyspace: Option<String>,
    /// The table.
    #[arg(long, global = true, env = "CASSANDRA_MEMBERSHIP_TABLE")]
    pub(crate) table: Option<String>,
    /// The Orleans ServiceId.
    ///
    /// No default: members, watch, cleanup, declare-dead and delete-cluster need it.
    #[arg(long, global = true, env = "CASSANDRA_MEMBERSHIP_SERVICE")]
    pub(crate) service: Option<String>,
    /// The Orleans ClusterId the command works on.
    ///
    /// No default: members, watch, cleanup and declare-dead need it; delete-cluster takes it
    /// here or as its argument, on the command line only (not from the variable alone).
    #[arg(long, global = true, env = "CASSANDRA_MEMBERSHIP_CLUSTER")]
    pub(crate) cluster: Option<String>,
    /// Consistency levels: quorum or local_quorum.
    ///
    /// quorum: QUORUM + SERIAL; local_quorum: LOCAL_QUORUM + LOCAL_SERIAL. Spelt as in the config file (`local-quorum` is accepted too).
    #[arg(
        long,
        global = true,
        env = "CASSANDRA_MEMBERSHIP_CONSISTENCY",
        value_enum
    )]
    pub(crate) consistency: Option<Consistency>,
    /// The cluster's serial data centre, e.g. dc1.
    ///
    /// It coordinates every statement (required with local_quorum, the same for every silo of the cluster; with quorum, tried first): the
    /// name `nodetool status` prints, e.g. dc1.
    /// (`--local-datacenter`, its name up to 0.2, still works.)
    #[arg(
        long,
        global = true,
        alias = "local-datacenter",
        env = "CASSANDRA_MEMBERSHIP_SERIAL_DATACENTER"
    )]
    pub(crate) serial_datacenter: Option<String>,
    /// Per-statement timeout ("10s").
    #[arg(long, global = true, env = "CASSANDRA_MEMBERSHIP_REQUEST_TIMEOUT", value_parser = humantime::parse_duration)]
    pub(crate) request_timeout: Option<Duration>,
    /// How long connecting may take ("5s").
    ///
    /// Past it the command fails with exit 1.
    #[arg(long, global = true, env = "CASSANDRA_MEMBERSHIP_CONNECT_TIMEOUT", value_parser = humantime::parse_duration)]
    pub(crate) connect_timeout: Option<Duration>,
    /// Storage-side expiry on or off (the options file's `ttl`).
    ///
    /// `patch` and `migrate` need it set here or in the file: they enforce it on the whole
    /// table (migrate: on the new one). `declare-dead` adopts the table's expiry
    /// when it is not set, and refuses (exit 2) a value that disagrees with the cluster.
    #[arg(
        long,
        global = true,
        env = "CASSANDRA_MEMBERSHIP_TTL",
        value_name = "BOOL"
    )]
    pub(crate) ttl: Option<bool>,
    /// TLS: PEM file of the CA to trust; turns TLS on.
    ///
    /// Or of the nodes' certificates. The config file's `[tls]` section (ca_file, cert_file, key_file, server_name, verify) does the same;
    /// its relative paths are relative to the file's directory.
    #[arg(
        long,
        global = true,
        env = "CASSANDRA_MEMBERSHIP_TLS_CA",
        value_name = "PEM"
    )]
    pub(crate) tls_ca: Option<PathBuf>,
    /// TLS: PEM file of the client certificate (with --tls-key).
    ///
    /// For clusters that require one.
    #[arg(
        long,
        global = true,
        env = "CASSANDRA_MEMBERSHIP_TLS_CERT",
        value_name = "PEM"
    )]
    pub(crate) tls_cert: Option<PathBuf>,
    /// TLS: PEM file of the client certificate's private key (with --tls-cert).
    #[arg(
        long,
        global = true,
        env = "CASSANDRA_MEMBERSHIP_TLS_KEY",
        value_name = "PEM"
    )]
    pub(crate) tls_key: Option<PathBuf>,
    /// TLS: the name every node's certificate must carry.
    ///
    /// Default: the contact points' host when they all name one DNS host, else each node's IP
    /// address.
    #[arg(
        long,
        global = true,
        env = "CASSANDRA_MEMBERSHIP_TLS_SERVER_NAME",
        value_name = "NAME"
    )]
    pub(crate) tls_server_name: Option<String>,
    /// Print JSON instead of tables; stderr is JSON Lines, the last line is the failure.
    ///
    /// One object per document on stdout, stable field names and a "schema" version field.
    /// Every stderr line is a JSON object: log events (`timestamp`, `level`, `fields`,
    /// `target`) and, on the last line, a failure `{"schema": 1, "error": {"message", "kind",
    /// "exit_code", "variant", "causes"}}`; no progress or preview text.
    #[arg(long, global = true)]
    pub(crate) json: bool,
    /// More log on stderr: -v info, -vv debug, -vvv trace.
    ///
    /// The driver's and the provider's. RUST_LOG, when set, takes precedence (e.g. RUST_LOG=scylla=debug). Default: warnings.
    #[arg(short, long, global = true, action = ArgAction::Count)]
    pub(crate) verbose: u8,
    /// Show progress on stderr once a scan has taken this long.
    #[arg(long, global = true, default_value = "1s", value_parser = humantime::parse_duration, hide = true)]
    pub(crate) progress_after: Duration,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum Consistency {
    Quorum,
    /// LOCAL_QUORUM + LOCAL_SERIAL.
    #[value(name = "local_quorum", alias = "local-quorum")]
    LocalQuorum,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Every (service, cluster) in the table.
    ///
    /// Entries by status, version, newest I-am-alive, remaining TTL of the version.
    Clusters,
    /// One line per entry of the cluster.
    ///
    /// Status, names, zones, last I-am-alive, suspicions, TTL. A cluster with no version and no entries is "no such cluster" (exit 1).
    Members,
    /// The TTL audit; writes nothing.
    ///
    /// Table default vs configuration, rows that disagree, what patch would do.
    Audit,
    /// Applies the `patch` TTL policy and shows what it changed.
    ///
    /// As a silo's initialize would. Needs `ttl` set explicitly (config file or --ttl): the table default it alters is shared
    /// by every cluster of the table. Shows the audit and refuses without --yes (exit 3).
    Patch {
        /// Really patch.
        #[arg(long)]
        yes: bool,
    },
    /// Declares one silo of the cluster Dead.
    ///
    /// As the silos' own failure detector would: a versioned write of its entry (status Dead) at the table version read, retried a few
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
    /// Removes entries that are not Active and show no activity for this long.
    ///
    /// The library's cleanup_defunct rule: no I-am-alive, start or suspicion since the cutoff). Lists what it
    /// would remove and refuses without --yes (exit 3); --dry-run only lists.
    Cleanup {
        /// e.g. "7d", "12h"; at least 1h unless --force.
        ///
        /// A shorter cutoff would remove silos that are starting (Joining) or shutting down
        /// right now.
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
    /// Deletes a whole cluster (its entries and version).
    ///
    /// Shows what it deletes; refuses without --yes (exit 3). The cluster is the argument or
    /// --cluster on the command line: CASSANDRA_MEMBERSHIP_CLUSTER alone is refused (exit 2).
    DeleteCluster {
        /// The cluster id to delete (or give it as --cluster).
        #[arg(value_name = "CLUSTER_ID")]
        target: Option<String>,
        /// Really delete.
        #[arg(long)]
        yes: bool,
    },
    /// Copies a table of the 0.2 shape into a new table of the current shape.
    ///
    /// Copies the configured table into the new one (created with the configured TTL and
    /// gc_grace), cluster by cluster, and reads each copy back to verify it. Offline: stop the silos first; a cluster active
    /// within --quiet-for is refused (exit 3, nothing written) unless --force. Every cell keeps
    /// its write time and remaining TTL, so running it again (or after an interruption) is
    /// safe. The old table is never changed. With --service / --cluster, only those clusters.
    /// Needs `ttl` set explicitly (config file or --ttl), like patch.
    Migrate {
        /// The new table (same keyspace).
        #[arg(long, value_name = "TABLE")]
        to_table: String,
        /// How long every entry of a cluster must have been silent (no heartbeat, no write).
        #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
        quiet_for: Duration,
        /// Copy clusters that were active within --quiet-for too.
        #[arg(long)]
        force: bool,
        /// Read and check; write and create nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Prints the DDL the provider executes and the grants its role needs; connects to nothing.
    ///
    /// For the configured keyspace, table and options: the exact statements of `initialize`
    /// (the entry type, the table with its derived `WITH ID`, its default_time_to_live with
    /// expiry on; the keyspace only with create_keyspace_with_replication), then the least
    /// privileges of the role (SELECT and MODIFY on the table, ALTER with ttl_mismatch =
    /// "patch"), and, commented out, what it needs more to create the schema itself.
    Schema {
        /// The role the grants name (default: the configured credentials' username).
        #[arg(long, value_name = "ROLE")]
        role: Option<String>,
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
    /// Prints the shell completion script; connects to nothing.
    ///
    /// E.g. `cassandra-membership completions bash >
    /// /etc/bash_completion.d/cassandra-membership`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

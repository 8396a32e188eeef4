//! Where the CLI's options come from, in increasing precedence: the library's defaults, the
//! TOML file a silo host loads (`--config`), environment variables, then flags. The result is
//! the library's own `CassandraClusteringOptions`, validated by the library.
//!
//! Not on `figment`: it would replace only the flag-over-file assignments (~65 lines; clap already
//! reads each flag's variable), while its TOML provider reports a syntax error as toml's `Display`,
//! which quotes the offending line — a password's — and the rest stays ours anyway: TLS paths
//! relative to the file, `--config-key` errors, whether `ttl` was set, credentials in pairs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use cassandra_membership::{
    CassandraClusteringOptions, ConsistencyProfile, Credentials, MembershipError, TlsOptions,
};
use serde::Deserialize;

/// Exit code for an operation that failed (storage unreachable, a timeout, no such cluster or
/// silo, an outcome that could not be resolved).
pub(crate) const EXIT_FAILED: u8 = 1;
/// Exit code for a usage or configuration error (clap uses 2 for its own usage errors too).
pub(crate) const EXIT_USAGE: u8 = 2;
/// Exit code for a change refused because it was not confirmed (`--yes` missing).
pub(crate) const EXIT_REFUSED: u8 = 3;
/// Exit code for access denied (credentials, grants) or a schema that is not the provider's
/// (keyspace missing, a table of another shape): retrying unchanged fails the same way.
pub(crate) const EXIT_DENIED: u8 = 4;

/// `--help`'s epilogue: where credentials come from, and the exit codes.
pub(crate) const AFTER_HELP: &str = concat!(
    "Credentials come from the config file's [credentials] or from ",
    "CASSANDRA_MEMBERSHIP_USERNAME and CASSANDRA_MEMBERSHIP_PASSWORD; they are never printed.\n\n",
    "Exit codes:\n",
    "  0  ok\n",
    "  1  the operation failed: no node answered, a timeout, no such cluster or silo, an outcome\n",
    "     that could not be resolved\n",
    "  2  usage or configuration error: a bad flag, config file or option value, a missing\n",
    "     --service or --cluster, a CA that does not trust the nodes' certificates\n",
    "  3  refused: a change that needs --yes was not confirmed; nothing was changed\n",
    "  4  access denied (credentials or grants), or the schema: the keyspace or table is\n",
    "     missing or has another shape"
);

/// `-h`'s epilogue: the exit codes in one line each, and where the rest is.
pub(crate) const AFTER_SHORT_HELP: &str = concat!(
    "Exit codes: 0 ok, 1 failed, 2 usage or configuration, 3 refused (no --yes), ",
    "4 access denied or schema.\n",
    "--help shows every detail, the credentials' variables and the exit codes in full."
);

/// Environment variables holding credentials: never flags, so they stay out of `ps` and shell history.
pub(crate) const ENV_USERNAME: &str = "CASSANDRA_MEMBERSHIP_USERNAME";
pub(crate) const ENV_PASSWORD: &str = "CASSANDRA_MEMBERSHIP_PASSWORD";

/// Why the CLI stops with a non-zero code.
#[derive(Debug)]
pub(crate) enum CliError {
    /// A usage or configuration error: exit 2.
    Usage(String),
    /// A change that needs `--yes` was not confirmed: exit 3.
    Refused(String),
    /// The library refused or failed: see [`membership_exit_code`].
    Membership(MembershipError),
    /// Something else failed (e.g. writing the output, no such cluster): exit 1.
    Failed(String),
}

/// The exit code of a library error.
fn membership_exit_code(e: &MembershipError) -> u8 {
    match e {
        MembershipError::InvalidConfiguration { .. }
        | MembershipError::InvalidSiloAddress { .. }
        // The tls options do not fit the nodes' certificates.
        | MembershipError::TlsHandshake { .. } => EXIT_USAGE,
        // Wrong credentials or grants, a wrong keyspace or table: retrying it unchanged fails
        // the same way. (One line per variant: a missing keyspace gets its own.)
        MembershipError::AccessDenied { .. } => EXIT_DENIED,
        MembershipError::SchemaMismatch { .. } => EXIT_DENIED,
        // A table of the 0.2 shape: `migrate` it first.
        MembershipError::TableNeedsMigration { .. } => EXIT_DENIED,
        MembershipError::KeyspaceMissing { .. } => EXIT_DENIED,
        _ => EXIT_FAILED,
    }
}

impl CliError {
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) => EXIT_USAGE,
            CliError::Refused(_) => EXIT_REFUSED,
            CliError::Membership(e) => membership_exit_code(e),
            CliError::Failed(_) => EXIT_FAILED,
        }
    }
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CliError::Usage(m) | CliError::Refused(m) | CliError::Failed(m) => f.write_str(m),
            // The library's message already holds its causes, each once.
            CliError::Membership(e) => write!(f, "{e}"),
        }
    }
}

impl From<MembershipError> for CliError {
    fn from(e: MembershipError) -> Self {
        CliError::Membership(e)
    }
}

/// The connection flags, already merged with their environment variables by clap.
#[derive(Debug, Default)]
pub(crate) struct Overrides {
    pub(crate) contact_points: Option<Vec<String>>,
    pub(crate) keyspace: Option<String>,
    pub(crate) table: Option<String>,
    pub(crate) service: Option<String>,
    pub(crate) cluster: Option<String>,
    pub(crate) consistency: Option<ConsistencyProfile>,
    pub(crate) serial_datacenter: Option<String>,
    pub(crate) request_timeout: Option<Duration>,
    pub(crate) connect_timeout: Option<Duration>,
    pub(crate) ttl: Option<bool>,
    pub(crate) tls_ca: Option<PathBuf>,
    pub(crate) tls_cert: Option<PathBuf>,
    pub(crate) tls_key: Option<PathBuf>,
    pub(crate) tls_server_name: Option<String>,
    /// What of the cluster's identity the command needs.
    pub(crate) scope: Scope,
}

/// Where the options file is: `--config`, else the default path when that file exists.
#[derive(Debug, Default)]
pub(crate) struct Source<'a> {
    /// `--config` (or its environment variable).
    pub(crate) file: Option<&'a Path>,
    /// `--config-key a.b`: the options are the table `[a.b]` of the file.
    pub(crate) key: Option<&'a str>,
}

/// `$XDG_CONFIG_HOME/cassandra-membership/config.toml`, else
/// `$HOME/.config/cassandra-membership/config.toml`.
pub(crate) fn default_config_path(env: &impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let base = match env("XDG_CONFIG_HOME").filter(|d| !d.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env("HOME").filter(|h| !h.is_empty())?).join(".config"),
    };
    Some(base.join("cassandra-membership").join("config.toml"))
}

/// What a command names: the library has no default service or cluster, so only the commands
/// that work on one ask for them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Scope {
    /// One cluster of one service (`members`, `watch`, `cleanup`, `declare-dead`): both ids
    /// are needed.
    #[default]
    Cluster,
    /// Clusters of one service, named by the command itself (`delete-cluster CLUSTER`).
    Service,
    /// The whole table, every service and cluster (`clusters`, `audit`, `patch`).
    Table,
}

/// What stands for an id a command does not use: the library needs one to build a table value,
/// and none of that command's statements binds it.
const UNUSED_ID: &str = "(unused by this command)";

/// The options, and what of them the operator said explicitly (where a default would be harmful).
#[derive(Debug)]
pub(crate) struct Resolved {
    pub(crate) options: CassandraClusteringOptions,
    /// `ttl` came from the config file or `--ttl`, not from the library's default (off).
    pub(crate) ttl_explicit: bool,
}

/// Reads the options file (if any: `--config`, else the default path when it exists),
/// applies environment credentials and flags, validates.
pub(crate) fn resolve(
    source: Source<'_>,
    overrides: Overrides,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Resolved, CliError> {
    let default_path = default_config_path(&env).filter(|p| p.is_file());
    let file = source.file.or(default_path.as_deref());
    if let Some(path) = file {
        tracing::info!(file = %path.display(), key = source.key, "reading the options file");
    }
    let (mut o, mut ttl_explicit) = match (file, source.key) {
        (Some(path), key) => load(path, key)?,
        (None, Some(key)) => {
            return Err(CliError::Usage(format!(
                "--config-key {key} needs a config file (--config, or the default {})",
                default_config_path(&env).map_or("path".into(), |p| p.display().to_string())
            )));
        }
        (None, None) => (CassandraClusteringOptions::default(), false),
    };
    match (env(ENV_USERNAME), env(ENV_PASSWORD)) {
        (Some(username), Some(password)) => {
            o.credentials = Some(Credentials::new(username, password))
        }
        (None, None) => {}
        (Some(_), None) => {
            return Err(CliError::Usage(format!(
                "{ENV_USERNAME} is set but {ENV_PASSWORD} is not"
            )));
        }
        (None, Some(_)) => {
            return Err(CliError::Usage(format!(
                "{ENV_PASSWORD} is set but {ENV_USERNAME} is not"
            )));
        }
    }
    let Overrides {
        contact_points,
        keyspace,
        table,
        service,
        cluster,
        consistency,
        serial_datacenter,
        request_timeout,
        connect_timeout,
        ttl,
        tls_ca,
        tls_cert,
        tls_key,
        tls_server_name,
        scope,
    } = overrides;
    if let Some(points) = contact_points {
        o.contact_points = points;
    }
    if let Some(k) = keyspace {
        o.keyspace = k;
    }
    if let Some(t) = table {
        o.table = t;
    }
    if let Some(s) = service {
        o.service_id = s;
    }
    if let Some(c) = cluster {
        o.cluster_id = c;
    }
    if let Some(c) = consistency {
        o.consistency = c;
    }
    if let Some(dc) = serial_datacenter {
        o.serial_datacenter = Some(dc);
    }
    if let Some(t) = request_timeout {
        o.request_timeout = t;
    }
    if let Some(t) = connect_timeout {
        o.connect_timeout = t;
    }
    if let Some(t) = ttl {
        o.ttl = t;
        ttl_explicit = true;
    }
    if tls_ca.is_some() || tls_cert.is_some() || tls_key.is_some() || tls_server_name.is_some() {
        let tls = o.tls.get_or_insert_with(TlsOptions::default);
        if let Some(ca) = tls_ca {
            tls.ca_file = Some(ca);
        }
        if let Some(cert) = tls_cert {
            tls.cert_file = Some(cert);
        }
        if let Some(key) = tls_key {
            tls.key_file = Some(key);
        }
        if let Some(name) = tls_server_name {
            tls.server_name = Some(name);
        }
    }
    // An operator tool never creates a keyspace, whatever a development config says.
    o.create_keyspace_with_replication = None;
    if scope != Scope::Cluster && o.cluster_id.is_empty() {
        o.cluster_id = UNUSED_ID.into();
    }
    if scope == Scope::Table && o.service_id.is_empty() {
        o.service_id = UNUSED_ID.into();
    }
    o.validate().map_err(|e| match &e {
        // The library's message names the option; an operator also wants the flag.
        MembershipError::InvalidConfiguration { option, .. }
            if (option == "service_id" && o.service_id.is_empty())
                || (option == "cluster_id" && o.cluster_id.is_empty()) =>
        {
            let (flag, env) = if option == "service_id" {
                ("--service", "CASSANDRA_MEMBERSHIP_SERVICE")
            } else {
                ("--cluster", "CASSANDRA_MEMBERSHIP_CLUSTER")
            };
            CliError::Usage(format!("{e}; this command needs {flag} (or {env})"))
        }
        _ => CliError::Membership(e),
    })?;
    Ok(Resolved {
        options: o,
        ttl_explicit,
    })
}

/// The options of the file (or of its table `key`, `a.b` for `[a.b]`), and whether they set
/// `ttl` themselves.
fn load(path: &Path, key: Option<&str>) -> Result<(CassandraClusteringOptions, bool), CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::Usage(format!("cannot read config file {}: {e}", path.display())))?;
    let invalid = |e: toml::de::Error| {
        CliError::Usage(format!(
            "invalid config file {}{}: {}",
            path.display(),
            key.map(|k| format!(" (table [{k}])")).unwrap_or_default(),
            describe(&text, &e)
        ))
    };
    // Parsed as a table first only to learn which keys it sets and to find `key`.
    let whole = toml::from_str::<toml::Table>(&text).map_err(invalid)?;
    let Some(key) = key else {
        let ttl_explicit = whole.contains_key("ttl");
        // Parsed again from the text: its errors carry the line and column.
        let options = toml::from_str(&text).map_err(invalid)?;
        return Ok((beside(path, options), ttl_explicit));
    };
    let mut table = &whole;
    for (i, part) in key.split('.').enumerate() {
        let so_far = key.split('.').take(i + 1).collect::<Vec<_>>().join(".");
        table = match table.get(part) {
            Some(toml::Value::Table(t)) => t,
            Some(_) => {
                return Err(CliError::Usage(format!(
                    "--config-key {key}: {so_far} in {} is not a table",
                    path.display()
                )));
            }
            None => {
                return Err(CliError::Usage(format!(
                    "--config-key {key}: {} has no table [{so_far}]",
                    path.display()
                )));
            }
        };
    }
    let ttl_explicit = table.contains_key("ttl");
    let options = CassandraClusteringOptions::deserialize(toml::Value::Table(table.clone()))
        .map_err(invalid)?;
    Ok((beside(path, options), ttl_explicit))
}

/// The `[tls]` files of a config file are relative to the file's directory (like kubeconfig's),
/// not to wherever the command runs; the flags' paths stay relative to the working directory.
fn beside(config: &Path, mut options: CassandraClusteringOptions) -> CassandraClusteringOptions {
    let dir = config.parent().unwrap_or(Path::new(""));
    if let Some(tls) = options.tls.as_mut() {
        for file in [&mut tls.ca_file, &mut tls.cert_file, &mut tls.key_file]
            .into_iter()
            .flatten()
        {
            if file.is_relative() {
                *file = dir.join(&*file);
            }
        }
    }
    options
}

/// A parse error as its message and position. toml's own `Display` quotes the offending source
/// line, which may hold the password: no text of the file is ever printed. The message itself
/// never holds it: the library's `Credentials` refuses a password of another type without quoting
/// it (serde's own message would: "invalid type: integer `123`"), in a `[credentials]` table and
/// an inline one alike.
fn describe(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim();
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
            format!("line {line}, column {column}: {message}")
        }
        None => message.to_owned(),
    }
}

#[cfg(test)]
mod tests;

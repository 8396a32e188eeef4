//! Where the CLI's options come from, in increasing precedence: the library's defaults, the
//! TOML file a silo host loads (`--config`), environment variables, then flags. The result is
//! the library's own `CassandraClusteringOptions`, validated by the library.

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
    "     --service or --cluster\n",
    "  3  refused: a change that needs --yes was not confirmed; nothing was changed\n",
    "  4  access denied (credentials or grants), or the schema: the keyspace or table is\n",
    "     missing or has another shape"
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
        | MembershipError::InvalidSiloAddress { .. } => EXIT_USAGE,
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
            CliError::Membership(e) => {
                // The library's typed message, then its causes (the driver's reason).
                write!(f, "{e}")?;
                let mut source = std::error::Error::source(e);
                while let Some(s) = source {
                    write!(f, ": {s}")?;
                    source = s.source();
                }
                Ok(())
            }
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
    pub(crate) local_datacenter: Option<String>,
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
            o.credentials = Some(Credentials { username, password })
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
        local_datacenter,
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
    if let Some(dc) = local_datacenter {
        o.local_datacenter = Some(dc);
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
/// line, which may be the `[credentials]` password: no text of the file is ever printed, and a
/// message that quotes a value (serde's "invalid type: integer `123`") has the password values
/// of the file blanked out.
fn describe(text: &str, e: &toml::de::Error) -> String {
    let mut message = e.message().trim().to_owned();
    for secret in secrets(text) {
        message = message.replace(&secret, "<redacted>");
    }
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
            format!("line {line}, column {column}: {message}")
        }
        None => message,
    }
}

/// The raw values of the file's `password` keys (quoted and unquoted forms), longest first.
fn secrets(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in text.lines() {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim().trim_matches(|c| c == '"' || c == '\'');
        if !key.to_ascii_lowercase().ends_with("password") {
            continue;
        }
        let value = value.trim();
        let unquoted = value.trim_matches(|c| c == '"' || c == '\'');
        for v in [value, unquoted] {
            if !v.is_empty() {
                found.push(v.to_owned());
            }
        }
    }
    found.sort_by_key(|s| std::cmp::Reverse(s.len()));
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No variable at all: not even HOME, so no default config file is read.
    fn no_env(_: &str) -> Option<String> {
        None
    }

    /// Flags naming a service and a cluster, nothing else.
    fn named() -> Overrides {
        Overrides {
            service: Some("svc".into()),
            cluster: Some("blue".into()),
            ..Overrides::default()
        }
    }

    #[test]
    fn the_ids_have_no_default_and_only_the_commands_on_a_cluster_need_them() {
        let e = resolve(Source::default(), Overrides::default(), no_env).unwrap_err();
        assert_eq!(e.exit_code(), EXIT_USAGE);
        assert!(e.to_string().contains("service_id: not set"), "{e}");
        let service_only = || Overrides {
            service: Some("svc".into()),
            ..Overrides::default()
        };
        let e = resolve(Source::default(), service_only(), no_env).unwrap_err();
        assert!(e.to_string().contains("cluster_id: not set"), "{e}");
        // delete-cluster names its cluster as its argument; the service it needs.
        let service = Overrides {
            scope: Scope::Service,
            ..service_only()
        };
        let o = resolve(Source::default(), service, no_env).unwrap().options;
        assert_eq!(o.service_id, "svc");
        let e = resolve(
            Source::default(),
            Overrides {
                scope: Scope::Service,
                ..Overrides::default()
            },
            no_env,
        )
        .unwrap_err();
        assert!(e.to_string().contains("service_id: not set"), "{e}");
        // clusters, audit, patch: the whole table, neither.
        let table_wide = Overrides {
            scope: Scope::Table,
            ..Overrides::default()
        };
        resolve(Source::default(), table_wide, no_env).unwrap();
        // Named ids are never replaced.
        let o = resolve(
            Source::default(),
            Overrides {
                scope: Scope::Table,
                ..named()
            },
            no_env,
        )
        .unwrap()
        .options;
        assert_eq!(
            (o.service_id.as_str(), o.cluster_id.as_str()),
            ("svc", "blue")
        );
    }

    #[test]
    fn flags_override_the_file_and_defaults_fill_the_rest() {
        let dir = std::env::temp_dir().join(format!("cm-cli-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.toml");
        std::fs::write(
            &path,
            "keyspace = \"from_file\"\ntable = \"t1\"\nttl = true\nservice_id = \"shop\"\ncluster_id = \"green\"\n",
        )
        .unwrap();
        let o = resolve(
            Source {
                file: Some(&path),
                key: None,
            },
            Overrides {
                table: Some("t2".into()),
                cluster: Some("blue".into()),
                ..Overrides::default()
            },
            no_env,
        )
        .unwrap();
        assert!(o.ttl_explicit, "the file sets ttl");
        let o = o.options;
        assert_eq!(o.keyspace, "from_file");
        assert_eq!(o.table, "t2");
        assert!(o.ttl);
        assert_eq!(o.service_id, "shop");
        assert_eq!(o.cluster_id, "blue");
    }

    #[test]
    fn local_datacenter_comes_from_the_flag_and_local_quorum_requires_it() {
        let local = Overrides {
            consistency: Some(ConsistencyProfile::LocalQuorum),
            ..named()
        };
        let e = resolve(Source::default(), local, no_env).unwrap_err();
        assert_eq!(e.exit_code(), EXIT_USAGE);
        assert!(e.to_string().contains("local_datacenter"), "{e}");
        let o = resolve(
            Source::default(),
            Overrides {
                consistency: Some(ConsistencyProfile::LocalQuorum),
                local_datacenter: Some("dc1".into()),
                ..named()
            },
            no_env,
        )
        .unwrap()
        .options;
        assert_eq!(o.local_datacenter.as_deref(), Some("dc1"));
    }

    #[test]
    fn an_unknown_option_in_the_file_is_a_usage_error_naming_it() {
        let dir = std::env::temp_dir().join(format!("cm-cli-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("b.toml");
        std::fs::write(&path, "keyspaec = \"x\"\n").unwrap();
        let e = resolve(
            Source {
                file: Some(&path),
                key: None,
            },
            Overrides::default(),
            no_env,
        )
        .unwrap_err();
        assert_eq!(e.exit_code(), EXIT_USAGE);
        assert!(e.to_string().contains("keyspaec"), "{e}");
    }

    #[test]
    fn credentials_come_from_the_environment_in_pairs() {
        let env = |k: &str| (k == ENV_USERNAME).then(|| "ops".to_owned());
        let e = resolve(Source::default(), named(), env).unwrap_err();
        assert_eq!(e.exit_code(), EXIT_USAGE);
        assert!(e.to_string().contains(ENV_PASSWORD), "{e}");
        let env = |k: &str| match k {
            ENV_USERNAME => Some("ops".to_owned()),
            ENV_PASSWORD => Some("s3cret".to_owned()),
            _ => None,
        };
        let o = resolve(Source::default(), named(), env).unwrap();
        assert!(!o.ttl_explicit);
        let o = o.options;
        assert_eq!(o.credentials.unwrap().username, "ops");
    }

    #[test]
    fn an_invalid_value_is_the_library_s_configuration_error() {
        let e = resolve(
            Source::default(),
            Overrides {
                keyspace: Some("no-dashes".into()),
                ..Overrides::default()
            },
            no_env,
        )
        .unwrap_err();
        assert_eq!(e.exit_code(), EXIT_USAGE);
        assert!(e.to_string().contains("keyspace"), "{e}");
    }

    #[test]
    fn the_default_config_path_is_xdg_config_home_then_home_dot_config() {
        let env = |k: &str| match k {
            "XDG_CONFIG_HOME" => Some("/x".to_owned()),
            "HOME" => Some("/h".to_owned()),
            _ => None,
        };
        assert_eq!(
            default_config_path(&env),
            Some(PathBuf::from("/x/cassandra-membership/config.toml"))
        );
        let env = |k: &str| match k {
            "XDG_CONFIG_HOME" => Some(String::new()),
            "HOME" => Some("/h".to_owned()),
            _ => None,
        };
        assert_eq!(
            default_config_path(&env),
            Some(PathBuf::from("/h/.config/cassandra-membership/config.toml"))
        );
        assert_eq!(default_config_path(&no_env), None);
    }

    #[test]
    fn tls_flags_fill_the_file_s_tls_section() {
        let dir = std::env::temp_dir().join(format!("cm-cli-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tls.toml");
        std::fs::write(
            &path,
            "[app.db]\nttl = true\n[app.db.tls]\nca_file = \"/etc/ca.pem\"\n\
             cert_file = \"c.pem\"\nkey_file = \"k.pem\"\n",
        )
        .unwrap();
        let o = resolve(
            Source {
                file: Some(&path),
                key: Some("app.db"),
            },
            Overrides {
                tls_server_name: Some("db.internal".into()),
                ..named()
            },
            no_env,
        )
        .unwrap();
        assert!(o.ttl_explicit, "the nested table sets ttl");
        let tls = o.options.tls.unwrap();
        assert_eq!(tls.ca_file, Some(PathBuf::from("/etc/ca.pem")));
        assert_eq!(tls.server_name.as_deref(), Some("db.internal"));
        // Relative to the config file's directory.
        assert_eq!(tls.cert_file, Some(dir.join("c.pem")));
        assert_eq!(tls.key_file, Some(dir.join("k.pem")));
        assert!(tls.verify);
    }

    #[test]
    fn refusals_access_and_schema_have_their_own_exit_codes() {
        assert_eq!(CliError::Refused("x".into()).exit_code(), EXIT_REFUSED);
        assert_eq!(CliError::Usage("x".into()).exit_code(), EXIT_USAGE);
        assert_eq!(CliError::Failed("x".into()).exit_code(), EXIT_FAILED);
        let schema = MembershipError::SchemaMismatch {
            table: "k.t".into(),
            detail: "x".into(),
        };
        assert_eq!(CliError::from(schema).exit_code(), EXIT_DENIED);
    }
}

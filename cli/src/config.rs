//! Where the CLI's options come from, in increasing precedence: the library's defaults, the
//! TOML file a silo host loads (`--config`), environment variables, then flags. The result is
//! the library's own `CassandraClusteringOptions`, validated by the library.

use std::path::Path;
use std::time::Duration;

use cassandra_membership::{
    CassandraClusteringOptions, ConsistencyProfile, Credentials, MembershipError,
};

/// Exit code for an operation that failed.
pub(crate) const EXIT_FAILED: u8 = 1;
/// Exit code for a usage or configuration error (clap uses 2 for its own usage errors too).
pub(crate) const EXIT_USAGE: u8 = 2;

/// Environment variables holding credentials: never flags, so they stay out of `ps` and shell history.
pub(crate) const ENV_USERNAME: &str = "CASSANDRA_MEMBERSHIP_USERNAME";
pub(crate) const ENV_PASSWORD: &str = "CASSANDRA_MEMBERSHIP_PASSWORD";

/// Why the CLI stops with a non-zero code.
#[derive(Debug)]
pub(crate) enum CliError {
    /// A usage or configuration error: exit 2.
    Usage(String),
    /// The library refused or failed: exit 2 for its configuration errors, 1 otherwise.
    Membership(MembershipError),
    /// Something else failed (e.g. writing the output): exit 1.
    Failed(String),
}

impl CliError {
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) => EXIT_USAGE,
            // Wrong credentials or grants, a wrong keyspace or table: the configuration is at
            // fault, and retrying it unchanged fails the same way.
            CliError::Membership(
                MembershipError::InvalidConfiguration { .. }
                | MembershipError::InvalidSiloAddress { .. }
                | MembershipError::AccessDenied { .. }
                | MembershipError::KeyspaceMissing { .. }
                | MembershipError::SchemaMismatch { .. },
            ) => EXIT_USAGE,
            CliError::Membership(_) | CliError::Failed(_) => EXIT_FAILED,
        }
    }
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CliError::Usage(m) | CliError::Failed(m) => f.write_str(m),
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
    /// What of the cluster's identity the command needs.
    pub(crate) scope: Scope,
}

/// What a command names: the library has no default service or cluster, so only the commands
/// that work on one ask for them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Scope {
    /// One cluster of one service (`members`, `watch`, `cleanup`): both ids are needed.
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

/// Reads the options file (if any), applies environment credentials and flags, validates.
pub(crate) fn resolve(
    file: Option<&Path>,
    overrides: Overrides,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Resolved, CliError> {
    let (mut o, mut ttl_explicit) = match file {
        Some(path) => load(path)?,
        None => (CassandraClusteringOptions::default(), false),
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
    // An operator tool never creates a keyspace, whatever a development config says.
    o.create_keyspace_with_replication = None;
    if scope != Scope::Cluster && o.cluster_id.is_empty() {
        o.cluster_id = UNUSED_ID.into();
    }
    if scope == Scope::Table && o.service_id.is_empty() {
        o.service_id = UNUSED_ID.into();
    }
    o.validate()?;
    Ok(Resolved {
        options: o,
        ttl_explicit,
    })
}

/// The options of the file, and whether it sets `ttl` itself.
fn load(path: &Path) -> Result<(CassandraClusteringOptions, bool), CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::Usage(format!("cannot read config file {}: {e}", path.display())))?;
    let invalid = |e: toml::de::Error| {
        CliError::Usage(format!(
            "invalid config file {}: {}",
            path.display(),
            describe(&text, &e)
        ))
    };
    let options = toml::from_str(&text).map_err(invalid)?;
    // Parsed twice only to learn which keys the file sets; it parsed once, so it parses again.
    let ttl_explicit = toml::from_str::<toml::Table>(&text)
        .map_err(invalid)?
        .contains_key("ttl");
    Ok((options, ttl_explicit))
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
        let e = resolve(None, Overrides::default(), no_env).unwrap_err();
        assert_eq!(e.exit_code(), EXIT_USAGE);
        assert!(e.to_string().contains("service_id: not set"), "{e}");
        let service_only = || Overrides {
            service: Some("svc".into()),
            ..Overrides::default()
        };
        let e = resolve(None, service_only(), no_env).unwrap_err();
        assert!(e.to_string().contains("cluster_id: not set"), "{e}");
        // delete-cluster names its cluster as its argument; the service it needs.
        let service = Overrides {
            scope: Scope::Service,
            ..service_only()
        };
        let o = resolve(None, service, no_env).unwrap().options;
        assert_eq!(o.service_id, "svc");
        let e = resolve(
            None,
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
        resolve(None, table_wide, no_env).unwrap();
        // Named ids are never replaced.
        let o = resolve(
            None,
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
            Some(&path),
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
        let e = resolve(None, local, no_env).unwrap_err();
        assert_eq!(e.exit_code(), EXIT_USAGE);
        assert!(e.to_string().contains("local_datacenter"), "{e}");
        let o = resolve(
            None,
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
        let e = resolve(Some(&path), Overrides::default(), no_env).unwrap_err();
        assert_eq!(e.exit_code(), EXIT_USAGE);
        assert!(e.to_string().contains("keyspaec"), "{e}");
    }

    #[test]
    fn credentials_come_from_the_environment_in_pairs() {
        let env = |k: &str| (k == ENV_USERNAME).then(|| "ops".to_owned());
        let e = resolve(None, named(), env).unwrap_err();
        assert_eq!(e.exit_code(), EXIT_USAGE);
        assert!(e.to_string().contains(ENV_PASSWORD), "{e}");
        let env = |k: &str| match k {
            ENV_USERNAME => Some("ops".to_owned()),
            ENV_PASSWORD => Some("s3cret".to_owned()),
            _ => None,
        };
        let o = resolve(None, named(), env).unwrap();
        assert!(!o.ttl_explicit);
        let o = o.options;
        assert_eq!(o.credentials.unwrap().username, "ops");
    }

    #[test]
    fn an_invalid_value_is_the_library_s_configuration_error() {
        let e = resolve(
            None,
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
}

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
            CliError::Membership(
                MembershipError::InvalidConfiguration { .. }
                | MembershipError::InvalidSiloAddress { .. },
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
    pub(crate) request_timeout: Option<Duration>,
}

/// Reads the options file (if any), applies environment credentials and flags, validates.
pub(crate) fn resolve(
    file: Option<&Path>,
    overrides: Overrides,
    env: impl Fn(&str) -> Option<String>,
) -> Result<CassandraClusteringOptions, CliError> {
    let mut o = match file {
        Some(path) => load(path)?,
        None => CassandraClusteringOptions::default(),
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
        request_timeout,
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
    if let Some(t) = request_timeout {
        o.request_timeout = t;
    }
    // An operator tool never creates a keyspace, whatever a development config says.
    o.create_keyspace_with_replication = None;
    o.validate()?;
    Ok(o)
}

fn load(path: &Path) -> Result<CassandraClusteringOptions, CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::Usage(format!("cannot read config file {}: {e}", path.display())))?;
    // toml's message names the offending key (or the unknown field) and shows its line.
    toml::from_str(&text)
        .map_err(|e| CliError::Usage(format!("invalid config file {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn flags_override_the_file_and_defaults_fill_the_rest() {
        let dir = std::env::temp_dir().join(format!("cm-cli-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.toml");
        std::fs::write(
            &path,
            "keyspace = \"from_file\"\ntable = \"t1\"\nttl = true\n",
        )
        .unwrap();
        let o = resolve(
            Some(&path),
            Overrides {
                table: Some("t2".into()),
                ..Overrides::default()
            },
            no_env,
        )
        .unwrap();
        assert_eq!(o.keyspace, "from_file");
        assert_eq!(o.table, "t2");
        assert!(o.ttl);
        assert_eq!(o.cluster_id, "default");
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
        let e = resolve(None, Overrides::default(), env).unwrap_err();
        assert_eq!(e.exit_code(), EXIT_USAGE);
        let env = |k: &str| match k {
            ENV_USERNAME => Some("ops".to_owned()),
            ENV_PASSWORD => Some("s3cret".to_owned()),
            _ => None,
        };
        let o = resolve(None, Overrides::default(), env).unwrap();
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

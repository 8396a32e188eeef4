//! The service's settings, layered with figment: built-in defaults, then the options file
//! (`--config FILE` or `SERVICE_CONFIG`, TOML), then `SERVICE_*` environment variables, then
//! the command line. The file's `[cassandra]` table is the library's own
//! `CassandraClusteringOptions` (its `[cassandra.membership]` the `MembershipOptions`), so every
//! library option — contact points, keyspace replication, TLS, credentials (`password_env`,
//! `password_file`), serial DC, expiry, timeouts — is set the way the library documents it.
//! deploy/service.toml is an example file, parsed by tests/service_deploy.rs.
//!
//! Environment: `SERVICE_LISTEN`, `SERVICE_ADVERTISE`, `SERVICE_STORAGE`, `SERVICE_LOG_FORMAT`
//! (`text`, the default, or `json`; `RUST_LOG` filters, default `info`), and any library option
//! as `SERVICE_CASSANDRA__<OPTION>` (`__` nests: `SERVICE_CASSANDRA__MEMBERSHIP__LEAVE_TIMEOUT=30s`,
//! `SERVICE_CASSANDRA__CONTACT_POINTS=[a:9042,b:9042]`). `POD_IP` (Kubernetes' downward API)
//! is the advertised IP when no address is advertised otherwise.
//! `SERVICE_CASSANDRA__CREDENTIALS__PASSWORD` is taken as a string whatever it looks like (prefer
//! `password_env` or `password_file`); an error never quotes a password, nor a line of the file.
//!
//! Flags (clap): `--listen`, `--advertise`, `--config`, `--cluster`, `--cassandra`, `--log-format`, each as
//! `--flag VALUE` or `--flag=VALUE`; an unknown flag, a flag without its value or a stray
//! argument exits 2 with clap's usage message (`--help` lists them).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use cassandra_membership::CassandraClusteringOptions;
use clap::Parser;
use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::Deserialize;

use super::constants::{
    ENV_PREFIX, MAX_LEAVE_TIMEOUT, PASSWORD_KEY, POD_IP, PORT, TERMINATION_GRACE,
};

/// Where the membership table lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Storage {
    /// The in-memory table: one process, for trying the service out.
    Memory,
    /// Cassandra, with the `[cassandra]` options.
    Cassandra,
}

/// How the service's log lines (the library's tracing events) are written on stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum LogFormat {
    /// One human-readable line an event (the default).
    Text,
    /// One JSON object a line, for a log collector.
    Json,
}

/// Everything the service reads from its file, environment and flags.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Settings {
    /// Where the HTTP server binds (port 0: a free one).
    pub(crate) listen: String,
    /// The silo's endpoint as the other silos reach it: `IP:PORT`, or `IP` (with the port it
    /// listens on). Unset: `POD_IP` with that port, else the listen address.
    pub(crate) advertise: Option<String>,
    /// `memory` (default) or `cassandra`.
    pub(crate) storage: Storage,
    /// `text` (default) or `json`.
    pub(crate) log_format: LogFormat,
    /// The library's options (service and cluster ids, contact points, TLS, credentials,
    /// `[cassandra.membership]`, …); with `storage = "memory"` only its ids and membership.
    pub(crate) cassandra: CassandraClusteringOptions,
}

/// A setting that cannot be used: the process exits 2 with this message.
#[derive(Debug)]
pub(crate) struct Refused(pub(crate) String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The service's flags: each overrides its file key and `SERVICE_*` variable.
#[derive(Debug, Parser)]
#[command(
    name = "service",
    about = "An HTTP service around a cluster-membership silo (examples/service)"
)]
struct Flags {
    /// Where the HTTP server binds, IP:PORT (port 0: a free one) [env: SERVICE_LISTEN] [default: 127.0.0.1:8080]
    #[arg(long, value_name = "IP:PORT")]
    listen: Option<String>,
    /// The silo's endpoint as the others reach it: IP:PORT, or an IP with the listen port [env: SERVICE_ADVERTISE]
    #[arg(long, value_name = "ADDR")]
    advertise: Option<String>,
    /// The options file (TOML) [env: SERVICE_CONFIG]
    #[arg(long, value_name = "FILE")]
    config: Option<String>,
    /// The cluster id [default: service-demo]
    #[arg(long, value_name = "ID")]
    cluster: Option<String>,
    /// Demo: Cassandra at HOST:PORT, in a keyspace cm_service it may create
    #[arg(long, value_name = "HOST:PORT")]
    cassandra: Option<String>,
    /// How log lines are written on stderr: text or json [env: SERVICE_LOG_FORMAT] [default: text]
    #[arg(long, value_name = "FORMAT")]
    log_format: Option<String>,
}

/// The flags in `args`; `--help` and `--version` print and exit 0, like any clap program.
fn flags(args: &[String]) -> Result<Flags, Refused> {
    let argv = std::iter::once("service".to_owned()).chain(args.iter().cloned());
    Flags::try_parse_from(argv).map_err(|e| {
        use clap::error::ErrorKind;
        if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
            e.exit();
        }
        Refused(e.render().to_string().trim_end().to_owned())
    })
}

impl Settings {
    /// The settings from `args` (without the program name) and the process environment.
    pub(crate) fn load(args: &[String]) -> Result<Settings, Refused> {
        let env = |name: &str| std::env::var(name).ok();
        Self::load_with(args, env)
    }

    /// [`Settings::load`] with `env` as the environment (`SERVICE_*` overrides come from the
    /// process environment through figment; `env` answers `SERVICE_CONFIG`).
    pub(crate) fn load_with(
        args: &[String],
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Settings, Refused> {
        let flags = flags(args)?;
        let mut figment = Figment::new()
            .merge(Serialized::default("listen", format!("127.0.0.1:{PORT}")))
            .merge(Serialized::default("storage", "memory"))
            .merge(Serialized::default("log_format", "text"))
            .merge(Serialized::default("cassandra.service_id", "service-demo"))
            .merge(Serialized::default("cassandra.cluster_id", "service-demo"));
        // `--cassandra ADDR`, the demo's shortcut: a throwaway keyspace it may create.
        let demo_contact = flags.cassandra;
        if demo_contact.is_some() {
            figment = figment
                .merge(Serialized::default("cassandra.keyspace", "cm_service"))
                .merge(Serialized::default(
                    "cassandra.create_keyspace_with_replication",
                    [("class", "SimpleStrategy"), ("replication_factor", "1")]
                        .into_iter()
                        .collect::<std::collections::BTreeMap<_, _>>(),
                ));
        }
        if let Some(file) = flags.config.or_else(|| env("SERVICE_CONFIG")) {
            let path = PathBuf::from(&file);
            if !path.is_file() {
                return Err(Refused(format!(
                    "options file {file} (--config / SERVICE_CONFIG): no such file"
                )));
            }
            check_toml(&path, &file)?;
            figment = figment.merge(Toml::file_exact(path));
        }
        // Only the service's own keys: a pod's environment holds other `SERVICE_*` names.
        figment = figment.merge(Env::prefixed(ENV_PREFIX).split("__").filter(|key| {
            let key = key.as_str().to_ascii_lowercase();
            (["listen", "advertise", "storage", "log_format"].contains(&key.as_str())
                || key.starts_with("cassandra."))
                && key != PASSWORD_KEY
        }));
        // The password as the string it is: figment would read `73571234` as a number (and
        // refuse it, quoting it). Case as figment matches names: any.
        let password_var = format!("{ENV_PREFIX}{}", PASSWORD_KEY.replace('.', "__"));
        if let Some((_, password)) = std::env::vars_os().find(|(name, _)| {
            name.to_str()
                .is_some_and(|n| n.eq_ignore_ascii_case(&password_var))
        }) {
            let password = password.into_string().map_err(|_| {
                Refused(format!(
                    "{password_var}: not Unicode (its value is not shown)"
                ))
            })?;
            figment = figment.merge(Serialized::default(PASSWORD_KEY, password));
        }
        for (value, key) in [
            (flags.listen, "listen"),
            (flags.advertise, "advertise"),
            (flags.log_format, "log_format"),
        ] {
            if let Some(value) = value {
                figment = figment.merge(Serialized::default(key, value));
            }
        }
        if let Some(cluster) = flags.cluster {
            figment = figment.merge(Serialized::default("cassandra.cluster_id", cluster));
        }
        if let Some(contact) = demo_contact {
            figment = figment
                .merge(Serialized::default("storage", "cassandra"))
                .merge(Serialized::default("cassandra.contact_points", [contact]));
        }
        let settings: Settings = figment.extract().map_err(|e| {
            // An error at a password key would quote the value it found: name the key only.
            let errors: Vec<String> = e
                .into_iter()
                .map(|e| match e.path.iter().any(|p| p.contains("password")) {
                    true => format!(
                        "{}: not a password string (its value is not shown); quote it, or use password_env or password_file",
                        e.path.join(".")
                    ),
                    false => e.to_string(),
                })
                .collect();
            Refused(format!("the service's options: {}", errors.join("; ")))
        })?;
        if settings.listen.parse::<SocketAddr>().is_err() {
            return Err(Refused(format!(
                "listen (--listen / SERVICE_LISTEN / the options file's listen): {:?} is not IP:PORT",
                settings.listen
            )));
        }
        let leave = settings.cassandra.membership.leave_timeout;
        if leave > MAX_LEAVE_TIMEOUT {
            return Err(Refused(format!(
                "cassandra.membership.leave_timeout {leave:?} exceeds {MAX_LEAVE_TIMEOUT:?}: the pod's termination grace ({TERMINATION_GRACE:?}) would cut the leave short"
            )));
        }
        Ok(settings)
    }

    /// The silo's endpoint: `advertise` (an IP alone takes `port`), else `POD_IP` with `port`,
    /// else `listen`. An unspecified address (`0.0.0.0`, `::`) is refused: no other silo can
    /// reach it.
    pub(crate) fn endpoint(
        &self,
        listen: SocketAddr,
        pod_ip: Option<&str>,
    ) -> Result<SocketAddr, Refused> {
        let (endpoint, from) = match (&self.advertise, pod_ip) {
            (Some(a), _) => (
                parse_endpoint(a, listen.port(), "--advertise / SERVICE_ADVERTISE")?,
                "advertise",
            ),
            (None, Some(ip)) => (parse_endpoint(ip, listen.port(), POD_IP)?, POD_IP),
            (None, None) => (listen, "--listen / SERVICE_LISTEN"),
        };
        if endpoint.ip().is_unspecified() {
            return Err(Refused(format!(
                "the silo's endpoint would be {endpoint} (from {from}), which no other silo can reach: advertise a reachable address with --advertise ADDR or SERVICE_ADVERTISE, or set {POD_IP} (Kubernetes' downward API: status.podIP)"
            )));
        }
        Ok(endpoint)
    }
}

/// `IP:PORT`, or an `IP` that takes `port`. An explicit port 0 is refused: nobody reaches it.
fn parse_endpoint(text: &str, port: u16, from: &str) -> Result<SocketAddr, Refused> {
    let text = text.trim();
    match text.parse::<SocketAddr>() {
        Ok(a) if a.port() == 0 => Err(Refused(format!(
            "{from}: {text:?} has port 0, which no other silo can reach: advertise the port the service listens on, or an IP alone (it takes the listen port)"
        ))),
        Ok(a) => Ok(a),
        Err(_) => text
            .parse::<IpAddr>()
            .map(|ip| SocketAddr::new(ip, port))
            .map_err(|_| Refused(format!("{from}: {text:?} is neither IP:PORT nor an IP"))),
    }
}

/// The options file's TOML syntax, checked before figment reads it: toml's own message quotes
/// the offending line, which may hold an inline password. This one names the line only.
fn check_toml(path: &std::path::Path, file: &str) -> Result<(), Refused> {
    let text =
        std::fs::read_to_string(path).map_err(|e| Refused(format!("options file {file}: {e}")))?;
    toml::from_str::<toml::Table>(&text).map(drop).map_err(|e| {
        let line = e
            .span()
            .map(|s| format!(" at line {}", text[..s.start].matches('\n').count() + 1))
            .unwrap_or_default();
        Refused(format!(
            "options file {file}: not valid TOML{line}: {}",
            e.message()
        ))
    })
}

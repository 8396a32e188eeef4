//! Logs of the CLI, the provider and the driver on stderr: warnings by default, more with
//! `-v` (info), `-vv` (debug), `-vvv` (trace); `RUST_LOG`, when set, takes precedence. Under
//! `--json` each event is one JSON object on its own line (JSON Lines), so a script can parse
//! the whole of stderr: the events, then the failure on the last line.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::CliError;

/// Installs the subscriber. A `RUST_LOG` that does not parse is a usage error (exit 2).
pub(crate) fn init(verbose: u8, rust_log: Option<String>, json: bool) -> Result<(), CliError> {
    let filter = match rust_log.filter(|s| !s.trim().is_empty()) {
        Some(directives) => EnvFilter::try_new(&directives)
            .map_err(|e| CliError::Usage(format!("RUST_LOG={directives:?}: {e}")))?,
        None => EnvFilter::new(match verbose {
            0 => "warn",
            1 => "info",
            2 => "debug",
            _ => "trace",
        }),
    };
    let events = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        events.json().with_ansi(false).init();
    } else {
        events.with_ansi(std::io::stderr().is_terminal()).init();
    }
    Ok(())
}

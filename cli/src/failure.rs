//! How the CLI reports a failure: one `error: …` line on stderr for people; under `--json`, one
//! JSON object on stderr (stdout keeps only documents, so a script reads its results from stdout
//! and its failure from stderr, and never meets two documents in one stream).

use std::io::Write;

use serde::Serialize;

use crate::config::{CliError, EXIT_DENIED, EXIT_FAILED, EXIT_REFUSED, EXIT_USAGE};
use crate::report::Document;

/// The JSON form of a failure: `{"schema": 1, "error": {…}}`.
#[derive(Debug, Serialize)]
pub(crate) struct Failure {
    error: FailureBody,
}

#[derive(Debug, Serialize)]
struct FailureBody {
    /// The whole story on one line, exactly as the text form prints it.
    message: String,
    /// What class of failure the exit code says: `failed`, `usage`, `refused`, `denied`.
    kind: &'static str,
    /// The process's exit code.
    exit_code: u8,
    /// The library's error variant (`Unavailable`, `TlsHandshake`, …), when the library failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    variant: Option<String>,
    /// The underlying causes, outermost first, each once (a cause whose text an outer one
    /// already quotes is left out, as in `message`).
    causes: Vec<String>,
}

/// The class an exit code stands for (`--help`'s table).
fn kind_of(exit_code: u8) -> &'static str {
    match exit_code {
        EXIT_USAGE => "usage",
        EXIT_REFUSED => "refused",
        EXIT_DENIED => "denied",
        EXIT_FAILED => "failed",
        _ => "failed",
    }
}

impl Failure {
    pub(crate) fn of(e: &CliError) -> Self {
        let exit_code = e.exit_code();
        let (variant, causes) = match e {
            CliError::Membership(m) => (Some(variant_name(m)), causes(m)),
            _ => (None, Vec::new()),
        };
        Failure {
            error: FailureBody {
                message: e.to_string(),
                kind: kind_of(exit_code),
                exit_code,
                variant,
                causes,
            },
        }
    }

    /// A usage error clap found before the command line was understood (exit 2).
    pub(crate) fn usage(message: &str) -> Self {
        Failure {
            error: FailureBody {
                message: message.to_owned(),
                kind: kind_of(EXIT_USAGE),
                exit_code: EXIT_USAGE,
                variant: None,
                causes: Vec::new(),
            },
        }
    }
}

/// The variant's name from its `Debug` form (`Unavailable { … }` → `Unavailable`): the enum is
/// `#[non_exhaustive]`, so a match here would name the library's new variants "other".
fn variant_name(e: &cassandra_membership::MembershipError) -> String {
    let debug = format!("{e:?}");
    debug
        .split(|c: char| !c.is_alphanumeric() && c != '_')
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// The `source()` chain below `e`, each message once.
fn causes(e: &(dyn std::error::Error + 'static)) -> Vec<String> {
    let mut seen = Vec::<String>::new();
    let mut next = e.source();
    while let Some(cause) = next {
        let message = cause.to_string();
        if !message.is_empty() && !seen.iter().any(|s| s.contains(&message)) {
            seen.push(message);
        }
        next = cause.source();
    }
    seen
}

/// Prints `e` on stderr: as a line, or under `--json` as one JSON object (one line).
pub(crate) fn report(e: &CliError, json: bool) {
    if json {
        print_json(&Failure::of(e));
    } else {
        eprintln!("error: {e}");
    }
}

/// Prints a failure document on stderr, on one line.
pub(crate) fn print_json(f: &Failure) {
    let line = serde_json::to_string(&Document::new(f))
        .unwrap_or_else(|_| r#"{"schema":1,"error":{"message":"cannot write JSON"}}"#.into());
    let mut stderr = std::io::stderr().lock();
    // Nothing is left to tell if stderr itself is gone.
    let _ = writeln!(stderr, "{line}");
}

/// Whether the command line asks for `--json`, read before clap parses it (so that clap's own
/// usage errors are JSON too). Stops at `--`, after which nothing is a flag.
pub(crate) fn json_requested(args: impl IntoIterator<Item = std::ffi::OsString>) -> bool {
    args.into_iter()
        .skip(1)
        .take_while(|a| a != "--")
        .any(|a| a == "--json")
}

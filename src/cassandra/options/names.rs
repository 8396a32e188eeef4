//! What the options' names may be: keyspace and table identifiers, the service and cluster
//! ids, data centre names. Each check names the option it refuses.

use crate::error::{MembershipError, Result};

/// Keyspace and table names: what Cassandra accepts unquoted, so quoting never changes meaning.
pub(crate) fn validate_identifier(option: &str, name: &str) -> Result<()> {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    if !first_ok || name.len() > 48 || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Err(MembershipError::config(
            option,
            format!(
                "{:?} is not a valid name: use 1 to 48 letters, digits or '_', starting with a letter",
                name.chars().take(64).collect::<String>()
            ),
        ));
    }
    Ok(())
}

/// The service id and the cluster id: set, with no default to fall back on.
pub(super) fn validate_identity(option: &str, value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(MembershipError::config(
            option,
            format!(
                "not set: there is no default, every process names its cluster \
                 (`{option} = \"...\"` in a config file, `.{option}(..)` in code)"
            ),
        ));
    }
    validate_value(option, value)
}

pub(crate) fn validate_value(option: &str, value: &str) -> Result<()> {
    if value.trim().is_empty() {
        return Err(MembershipError::config(
            option,
            "must not be empty or only whitespace",
        ));
    }
    if value.len() > 1024 {
        return Err(MembershipError::config(
            option,
            "must be at most 1024 bytes",
        ));
    }
    Ok(())
}

/// A DC name as Cassandra reports it: any printable text (the snitch takes it verbatim).
pub(super) fn valid_datacenter(dc: &str) -> bool {
    !dc.is_empty() && dc.len() <= 128 && dc.trim() == dc && !dc.chars().any(char::is_control)
}

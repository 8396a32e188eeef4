//! `schema`: the DDL the provider executes for the configured options and the grants its role
//! needs, for a DBA who creates the schema ahead of the silos. Connects to nothing.

use cassandra_membership::CassandraClusteringOptions;
use cassandra_membership::cassandra::SchemaScript;
use serde::Serialize;

use crate::config::CliError;

/// Stands for the role when neither `--role` nor the credentials name one.
const ROLE_PLACEHOLDER: &str = "<role>";

/// `schema --json`.
#[derive(Debug, Serialize)]
struct SchemaReport<'a> {
    keyspace: &'a str,
    table: &'a str,
    /// The role the grants name; `null` when none was given (the grants then name `<role>`).
    role: Option<&'a str>,
    /// The DDL, in order; each statement without its terminating `;`.
    ddl: Vec<&'a str>,
    /// The least privileges on the schema the DDL creates.
    grants: &'a [String],
    /// Only for a role that creates the schema itself.
    grants_to_create: &'a [String],
}

/// Prints the script for `options`: a CQL file to run as it is (`cqlsh -f`), or `--json`.
pub(crate) fn print(
    options: &CassandraClusteringOptions,
    role: Option<&str>,
    json: bool,
) -> Result<(), CliError> {
    let role = role.or(options.credentials.as_ref().map(|c| c.username.as_str()));
    let script = SchemaScript::for_options(options, role.unwrap_or(ROLE_PLACEHOLDER))?;
    let report = SchemaReport {
        keyspace: &options.keyspace,
        table: &options.table,
        role,
        ddl: script.statements().map(str::trim_end).collect(),
        grants: &script.grants,
        grants_to_create: &script.grants_to_create,
    };
    crate::print(json, &report, || text(options, role, &report))
}

fn text(options: &CassandraClusteringOptions, role: Option<&str>, r: &SchemaReport<'_>) -> String {
    let mut s = format!(
        "-- The schema cassandra-membership creates for \"{}\".\"{}\" (expiry {}, gc_grace {} s):\n\
         -- run it once before the silos start; their initialize then finds the table and creates nothing.\n\n",
        options.keyspace,
        options.table,
        match options.ttl_seconds() {
            Some(ttl) => format!("on: default_time_to_live {ttl} s"),
            None => "off".into(),
        },
        options.gc_grace.as_secs(),
    );
    for statement in &r.ddl {
        s.push_str(statement);
        s.push_str(";\n\n");
    }
    match role {
        Some(role) => s.push_str(&format!(
            "-- The least privileges of the provider's role {role:?} on this schema:\n"
        )),
        None => s.push_str(&format!(
            "-- The least privileges of the provider's role on this schema (pass --role, or \
             configure credentials, to name it instead of {ROLE_PLACEHOLDER}):\n"
        )),
    }
    for grant in r.grants {
        s.push_str(grant);
        s.push_str(";\n");
    }
    s.push_str("-- Only if the role creates the schema itself instead:\n");
    for grant in r.grants_to_create {
        s.push_str(&format!("-- {grant};\n"));
    }
    s
}

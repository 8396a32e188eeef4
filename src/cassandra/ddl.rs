//! The schema a table value creates for its options, as the exact statements it executes, and
//! the grants its role needs: for a DBA who creates the schema ahead of the silos.

use super::options::{CassandraClusteringOptions, ConsistencyProfile, TtlMismatchPolicy};
use super::statements::{
    create_entry_type_cql, create_keyspace_cql, create_table_cql, qualified, quote, table_id,
};
use crate::error::Result;

/// What [`initialize`](crate::MembershipTable::initialize) executes to create the schema for
/// given options (the text of `cql/`, with the names, the derived `WITH ID` and the numbers
/// filled in), and the least privileges the provider's role needs. See
/// [`docs::schema`](crate::docs::schema), "Creating the schema ahead of the silos".
///
/// Run [`statements`](Self::statements) in order, then [`grants`](Self::grants): the silos'
/// `initialize` then finds the table and creates nothing. The role needs
/// [`grants_to_create`](Self::grants_to_create) only when it creates the schema itself.
///
/// ```
/// use cassandra_membership::CassandraClusteringOptions;
/// use cassandra_membership::cassandra::SchemaScript;
/// // Neither service_id, cluster_id nor contact points: the script serves the whole table.
/// let options = CassandraClusteringOptions::default()
///     .keyspace("shop")
///     .ttl(true);
/// let script = SchemaScript::for_options(&options, "silo")?;
/// assert!(script.create_table.contains("WITH ID = "));
/// assert!(script.create_table.contains("default_time_to_live = 604800"));
/// assert_eq!(
///     script.grants,
///     [
///         r#"GRANT SELECT ON TABLE "shop"."membership" TO 'silo'"#,
///         r#"GRANT MODIFY ON TABLE "shop"."membership" TO 'silo'"#,
///     ]
/// );
/// # Ok::<(), cassandra_membership::MembershipError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SchemaScript {
    /// `CREATE KEYSPACE IF NOT EXISTS …`: only with `create_keyspace_with_replication`
    /// (development); a production keyspace is the operator's, with the replication it needs.
    pub create_keyspace: Option<String>,
    /// `CREATE TYPE IF NOT EXISTS "keyspace"."<table>_entry" (…)`, created before the table.
    pub create_entry_type: String,
    /// `CREATE TABLE IF NOT EXISTS … WITH ID = … AND default_time_to_live = … AND
    /// gc_grace_seconds = …`: the id derived from `keyspace.table` (every silo creates the same
    /// table), the TTL in seconds with expiry on (0 with it off).
    pub create_table: String,
    /// The least privileges the provider's role needs on a schema that exists: `SELECT` and
    /// `MODIFY` on the table (reads, conditional and plain writes, deletes; a conditional write
    /// needs both), and `ALTER` on it with `ttl_mismatch = "patch"` (which alters the table's
    /// `default_time_to_live`). Schema reads (`system_schema`) need no grant.
    pub grants: Vec<String>,
    /// What the role needs more to create the schema itself: `CREATE` on the keyspace (the type
    /// and the table; their creator is granted every permission on the table), and with
    /// `create_keyspace_with_replication`, `CREATE` on all keyspaces.
    pub grants_to_create: Vec<String>,
}

impl SchemaScript {
    /// The script for `options` and the role `role` (any name: it is written as a CQL string
    /// literal).
    ///
    /// Only what the DDL and the grants use must be set: `keyspace`, `table`, the expiry
    /// options (`ttl`, `membership.defunct_silo_expiration`, `ttl_renewal_interval`),
    /// `gc_grace`, `ttl_mismatch` and `create_keyspace_with_replication`; these are validated
    /// as [`validate`](CassandraClusteringOptions::validate) does. `service_id`, `cluster_id`,
    /// `contact_points` and the consistency profile (with its `serial_datacenter`) are not
    /// asked for: a script serves every cluster of the table, and connects to nothing.
    pub fn for_options(options: &CassandraClusteringOptions, role: &str) -> Result<SchemaScript> {
        // The checks of `validate`, with what the script does not use set to values it accepts.
        let mut checked = options.clone();
        checked.service_id = "schema".into();
        checked.cluster_id = "schema".into();
        checked.contact_points = vec!["schema".into()];
        checked.consistency = ConsistencyProfile::Quorum;
        checked.serial_datacenter = None;
        checked.validate()?;
        let (keyspace, table) = (&options.keyspace, &options.table);
        let qualified_table = qualified(keyspace, table);
        let to = role_literal(role);
        let grant =
            |permission: &str, resource: &str| format!("GRANT {permission} ON {resource} TO {to}");
        let on_table = format!("TABLE {qualified_table}");
        let mut grants = vec![grant("SELECT", &on_table), grant("MODIFY", &on_table)];
        if options.ttl_mismatch == TtlMismatchPolicy::Patch {
            grants.push(grant("ALTER", &on_table));
        }
        let mut grants_to_create = vec![grant("CREATE", &format!("KEYSPACE {}", quote(keyspace)))];
        if options.create_keyspace_with_replication.is_some() {
            grants_to_create.push(grant("CREATE", "ALL KEYSPACES"));
        }
        Ok(SchemaScript {
            create_keyspace: options
                .create_keyspace_with_replication
                .as_ref()
                .map(|replication| create_keyspace_cql(keyspace, replication)),
            create_entry_type: create_entry_type_cql(keyspace, table),
            create_table: create_table_cql(
                &qualified_table,
                table,
                table_id(keyspace, table),
                options.ttl_seconds().unwrap_or(0),
                options.gc_grace.as_secs(),
            ),
            grants,
            grants_to_create,
        })
    }

    /// The DDL, in the order `initialize` runs it: the keyspace (if any), the type, the table.
    pub fn statements(&self) -> impl Iterator<Item = &str> {
        self.create_keyspace
            .iter()
            .chain([&self.create_entry_type, &self.create_table])
            .map(String::as_str)
    }
}

/// A role name as a CQL string literal (quotes doubled): any name, its case kept.
fn role_literal(role: &str) -> String {
    format!("'{}'", role.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> CassandraClusteringOptions {
        CassandraClusteringOptions::default()
            .keyspace("ks")
            .table("members")
            .service_id("s")
            .cluster_id("c")
    }

    /// A DBA's script needs neither the cluster's identity nor where the nodes are: the DDL and
    /// the grants use neither; what they use is still checked.
    #[test]
    fn needs_only_the_options_the_ddl_uses() {
        let mut bare = CassandraClusteringOptions::default()
            .keyspace("ks")
            .table("members");
        bare.contact_points.clear();
        let script = SchemaScript::for_options(&bare, "r").unwrap();
        let full = SchemaScript::for_options(&options(), "r").unwrap();
        assert_eq!(
            script.statements().collect::<Vec<_>>(),
            full.statements().collect::<Vec<_>>()
        );
        assert_eq!(script.grants, full.grants);
        assert!(SchemaScript::for_options(&bare.clone().keyspace("a b"), "r").is_err());
        assert!(SchemaScript::for_options(&bare.gc_grace(std::time::Duration::MAX), "r").is_err());
    }

    #[test]
    fn the_ddl_is_the_cql_files_text_with_the_derived_id_and_the_ttl() {
        let off = SchemaScript::for_options(&options(), "r").unwrap();
        assert!(off.create_keyspace.is_none());
        assert!(
            off.create_entry_type
                .contains(r#"CREATE TYPE IF NOT EXISTS "ks"."members_entry""#)
        );
        assert!(
            off.create_table
                .contains(r#"CREATE TABLE IF NOT EXISTS "ks"."members""#)
        );
        assert!(
            off.create_table
                .contains(&format!("WITH ID = {}", table_id("ks", "members")))
        );
        assert!(
            off.create_table.contains("default_time_to_live = 0"),
            "{}",
            off.create_table
        );
        let on = SchemaScript::for_options(&options().ttl(true), "r").unwrap();
        assert!(
            on.create_table.contains("default_time_to_live = 604800"),
            "{}",
            on.create_table
        );
        assert_eq!(off.statements().count(), 2);
    }

    #[test]
    fn grants_are_select_and_modify_plus_alter_under_patch_and_quote_the_role() {
        let s = SchemaScript::for_options(&options(), "o'brien").unwrap();
        assert_eq!(
            s.grants,
            [
                r#"GRANT SELECT ON TABLE "ks"."members" TO 'o''brien'"#,
                r#"GRANT MODIFY ON TABLE "ks"."members" TO 'o''brien'"#,
            ]
        );
        assert_eq!(
            s.grants_to_create,
            [r#"GRANT CREATE ON KEYSPACE "ks" TO 'o''brien'"#]
        );
        let patch = options().ttl_mismatch(TtlMismatchPolicy::Patch);
        let s = SchemaScript::for_options(&patch, "r").unwrap();
        assert_eq!(
            s.grants.last().unwrap(),
            r#"GRANT ALTER ON TABLE "ks"."members" TO 'r'"#
        );
    }

    #[test]
    fn invalid_options_are_refused() {
        assert!(SchemaScript::for_options(&options().keyspace("a b"), "r").is_err());
    }
}

//! The audit's public types: what `patch` does (or would do) with one row ([`PatchAction`]),
//! one row that disagrees with the configuration ([`RowAudit`]), and the whole report
//! ([`TtlAudit`]). Plain data; the planner fills them in.

/// What `patch` would do (or did) with one row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PatchAction {
    /// The row already agrees with the configuration.
    Keep,
    /// Rewrite the row's cells, unchanged, to expire in this many seconds (0: never). For the
    /// version of a cluster whose rows have no version, write one.
    Rewrite {
        /// The TTL the rewrite carries.
        ttl_seconds: u32,
    },
    /// The row is older than the configured TTL allows: delete it.
    Remove,
    /// The row cannot be decoded (written by hand or another program); it is left alone
    /// (`delete_cluster` removes it).
    Unreadable,
    /// The row carries no TTL (or a longer one) and its silo may still be running — not Dead,
    /// alive within the TTL — possibly with expiry off, never renewing a TTL: giving it one could
    /// expire a live entry. It is left as it is until its silo is Dead or silent for the TTL
    /// (then `patch` at a later start, or defunct cleanup, removes it); meanwhile the version
    /// carries no TTL either.
    KeepWhileLive,
}

/// One row of the audit. `silo` is `None` for the cluster's table version (its row `''`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowAudit {
    /// The row's service id.
    pub service_id: String,
    /// The row's cluster id.
    pub cluster_id: String,
    /// The silo key, or `None` for the table version.
    pub silo: Option<String>,
    /// The TTL its cells carry now, in seconds (`None`: no TTL).
    pub current_ttl: Option<u32>,
    /// What `patch` does with it.
    pub action: PatchAction,
}

/// What [`CassandraMembershipTable::audit_ttl`](crate::CassandraMembershipTable::audit_ttl) found: the table's default and this cluster's
/// partition against the configuration, one line per row that disagrees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TtlAudit {
    /// `keyspace.table`.
    pub table: String,
    /// The table's `default_time_to_live`.
    pub table_default_ttl: u64,
    /// The configured TTL (DefunctSiloExpiration, 0 when expiry is off).
    pub configured_ttl: u64,
    /// Rows (and the version) of this cluster that disagree with the configuration, with what
    /// `patch` does.
    pub rows: Vec<RowAudit>,
}

impl TtlAudit {
    /// True when neither the table default nor any row of this cluster disagrees.
    pub fn agrees(&self) -> bool {
        self.table_default_ttl == self.configured_ttl && self.rows.is_empty()
    }

    /// How many rows (and versions) disagree.
    pub fn disagreeing(&self) -> u64 {
        self.rows.len() as u64
    }

    /// True when the table default agrees and only the cluster's version (not an entry)
    /// disagrees: a state the provider repairs by itself at `initialize`, whatever the policy.
    pub fn only_the_version_disagrees(&self) -> bool {
        self.table_default_ttl == self.configured_ttl
            && !self.rows.is_empty()
            && self.rows.iter().all(|r| r.silo.is_none())
    }
}

//! `serial_datacenter`: the execution profile every statement carries, and `initialize`'s check that
//! the cluster and the keyspace know the DC.
//!
//! Which DC coordinates a statement decides which DC's replicas run its LOCAL_SERIAL Paxos round:
//! two silos whose rounds ran in different DCs could both win one compare-and-set. So routing is
//! not left to the session's default policy (the Rust driver's prefers no DC, and a host's session
//! handed to `with_session` may do anything): each statement carries the provider's own profile.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use scylla::client::execution_profile::{ExecutionProfile, ExecutionProfileHandle};
use scylla::policies::load_balancing::DefaultPolicy;

use super::CassandraMembershipTable;
use super::errors::to_error;
use super::options::{CassandraClusteringOptions, ConsistencyProfile};
use crate::error::{MembershipError, Result};

/// The profile for the options' `serial_datacenter`, if they name one: token-aware, that DC's
/// nodes first; with `local_quorum` that DC's nodes only (a LOCAL_* statement coordinated
/// elsewhere would run in the other DC's quorum). Statement-level settings (consistency, timeout,
/// retry policy, idempotence) stay on each statement and take precedence over the profile's.
pub(super) fn routing_profile(
    options: &CassandraClusteringOptions,
) -> Option<ExecutionProfileHandle> {
    let dc = options.serial_datacenter.as_ref()?;
    let policy = DefaultPolicy::builder()
        .prefer_datacenter(dc.clone())
        .token_aware(true)
        .permit_dc_failover(options.consistency == ConsistencyProfile::Quorum)
        .build();
    let profile = ExecutionProfile::builder()
        .load_balancing_policy(policy)
        .build();
    Some(profile.into_handle_with_label(format!("cassandra-membership serial_datacenter={dc}")))
}

/// The DC must be one the driver knows: with `local_quorum` no statement could be sent otherwise.
/// Knowing no DC at all is the driver's metadata missing (a failed first fetch leaves nodes without
/// DC until it refreshes), not a wrong name: `Unavailable`, which heals.
pub(super) fn check_known(dc: &str, known: &BTreeSet<String>) -> Result<()> {
    if known.is_empty() {
        return Err(MembershipError::Unavailable {
            operation: "initialize",
            source: format!(
                "the driver knows no node's data centre yet (its metadata fetch failed?), so \
                 serial_datacenter {dc:?} cannot be checked or used"
            )
            .into(),
        });
    }
    if !known.contains(dc) {
        return Err(MembershipError::config(
            "serial_datacenter",
            format!(
                "{dc:?}: the cluster has no such data centre (its nodes are in {}); the name is \
                 as `nodetool status` prints it",
                list(known.iter())
            ),
        ));
    }
    Ok(())
}

/// With `local_quorum`, the provider's own session (`connect`) keeps connection pools to the
/// local DC's nodes only: the driver prepares every statement on every node it has a pool to, and
/// waits for every such node's schema version, so a hung node of another DC — one that keeps its
/// TCP connections open and never answers — would hold a starting silo for as long as the driver
/// takes to drop it (tens of seconds), although no statement of the provider ever goes there.
pub(super) fn host_filter(
    options: &CassandraClusteringOptions,
) -> Option<Arc<dyn scylla::policies::host_filter::HostFilter>> {
    match (&options.serial_datacenter, options.consistency) {
        (Some(dc), ConsistencyProfile::LocalQuorum) => Some(Arc::new(
            scylla::policies::host_filter::DcHostFilter::new(dc.clone()),
        )),
        _ => None,
    }
}

/// What `initialize` decides from the keyspace's replication map (the DC being known).
pub(super) fn check_replication(
    dc: &str,
    profile: ConsistencyProfile,
    known: &BTreeSet<String>,
    keyspace: &str,
    replication: &BTreeMap<String, String>,
    table: &str,
) -> Result<()> {
    let class = replication.get("class").map(String::as_str).unwrap_or("");
    if class.ends_with("NetworkTopologyStrategy") {
        let factor = replication.get(dc).and_then(|f| f.parse::<u32>().ok());
        if factor.unwrap_or(0) == 0 {
            let dcs = replication
                .iter()
                .filter(|(k, _)| k.as_str() != "class")
                .map(|(k, v)| format!("{k}: {v}"));
            return Err(MembershipError::SchemaMismatch {
                table: table.to_owned(),
                detail: format!(
                    "keyspace {keyspace:?} keeps no replica in serial_datacenter {dc:?} (it replicates \
                     to {}): ALTER KEYSPACE to replicate to {dc:?}, or name one of those DCs",
                    list(dcs)
                ),
            });
        }
        return Ok(());
    }
    // SimpleStrategy places replicas without regard to DC: LOCAL_QUORUM in one DC of several
    // is then a quorum of whichever replicas happen to be there.
    let single_dc = known.len() == 1;
    if profile == ConsistencyProfile::LocalQuorum && !single_dc {
        return Err(MembershipError::SchemaMismatch {
            table: table.to_owned(),
            detail: format!(
                "keyspace {keyspace:?} uses {class}, which places replicas regardless of data \
                 centre, on a cluster with data centres {}: consistency = \"local_quorum\" with \
                 serial_datacenter {dc:?} needs NetworkTopologyStrategy naming {dc:?}",
                list(known.iter())
            ),
        });
    }
    Ok(())
}

fn list(items: impl Iterator<Item = impl std::fmt::Display>) -> String {
    let items: Vec<String> = items.map(|i| i.to_string()).collect();
    if items.is_empty() {
        "none known".into()
    } else {
        items.join(", ")
    }
}

impl CassandraMembershipTable {
    /// The DCs of the nodes the driver knows.
    fn known_datacenters(&self) -> BTreeSet<String> {
        self.session()
            .get_cluster_state()
            .get_nodes_info()
            .iter()
            .filter_map(|n| n.datacenter.clone())
            .collect()
    }

    /// Checks `serial_datacenter` against the driver's metadata, before anything is sent (with a DC
    /// it does not know, a `local_quorum` statement has no node to go to).
    pub(super) fn check_datacenter_known(&self) -> Result<()> {
        match &self.options().serial_datacenter {
            Some(dc) => check_known(dc, &self.known_datacenters()),
            None => Ok(()),
        }
    }

    /// Checks `serial_datacenter` against the keyspace's replication (a keyspace that exists).
    pub(super) async fn check_serial_datacenter(&self) -> Result<()> {
        let o = self.options();
        let Some(dc) = &o.serial_datacenter else {
            return Ok(());
        };
        let known = self.known_datacenters();
        let rows = self
            .query_bounded(
                "SELECT replication FROM system_schema.keyspaces WHERE keyspace_name = ?",
                (&o.keyspace,),
            )
            .await
            .map_err(|e| to_error("initialize", e))?
            .into_rows_result()
            .map_err(|e| MembershipError::corrupt(None, format!("system_schema read: {e}")))?;
        let replication = rows
            .maybe_first_row::<(BTreeMap<String, String>,)>()
            .map_err(|e| MembershipError::corrupt(None, format!("system_schema read: {e}")))?
            .map(|(r,)| r)
            .unwrap_or_default();
        check_replication(
            dc,
            o.consistency,
            &known,
            &o.keyspace,
            &replication,
            &self.shared.qualified,
        )?;
        if o.consistency == ConsistencyProfile::LocalQuorum {
            // The one rule the provider cannot check: logged where an operator looks first.
            tracing::info!(
                serial_datacenter = %dc,
                "compare-and-sets of this cluster run in {dc}'s replicas (local_quorum): every silo \
                 of the cluster must name serial_datacenter = {dc:?}, or two can both win one round"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect()
    }

    fn dcs(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| (*n).into()).collect()
    }

    const NTS: &str = "org.apache.cassandra.locator.NetworkTopologyStrategy";
    const SIMPLE: &str = "org.apache.cassandra.locator.SimpleStrategy";

    #[test]
    fn a_dc_the_cluster_does_not_know_is_named_with_those_it_knows() {
        let e = check_known("dc3", &dcs(&["dc1", "dc2"])).unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(e, MembershipError::InvalidConfiguration { .. }),
            "{e:?}"
        );
        assert!(text.contains("dc3") && text.contains("dc1, dc2"), "{text}");
    }

    #[test]
    fn no_known_dc_at_all_is_missing_metadata_not_a_wrong_name() {
        let e = check_known("dc1", &BTreeSet::new()).unwrap_err();
        assert!(matches!(e, MembershipError::Unavailable { .. }), "{e:?}");
        assert!(
            e.is_transient(),
            "it heals when the driver refreshes its metadata"
        );
    }

    #[test]
    fn a_keyspace_without_a_replica_in_the_dc_is_a_schema_mismatch_naming_both() {
        for factor in [None, Some("0")] {
            let mut replication = map(&[("class", NTS), ("dc2", "3")]);
            if let Some(f) = factor {
                replication.insert("dc1".into(), f.into());
            }
            let e = check_replication(
                "dc1",
                ConsistencyProfile::Quorum,
                &dcs(&["dc1", "dc2"]),
                "ks",
                &replication,
                "\"ks\".\"t\"",
            )
            .unwrap_err();
            let text = e.to_string();
            assert!(matches!(e, MembershipError::SchemaMismatch { .. }), "{e:?}");
            assert!(
                text.contains("\"dc1\"") && text.contains("dc2: 3"),
                "{text}"
            );
        }
        check_replication(
            "dc1",
            ConsistencyProfile::LocalQuorum,
            &dcs(&["dc1", "dc2"]),
            "ks",
            &map(&[("class", NTS), ("dc1", "3"), ("dc2", "3")]),
            "t",
        )
        .unwrap();
    }

    #[test]
    fn simple_strategy_serves_local_quorum_in_a_single_dc_only() {
        let simple = map(&[("class", SIMPLE), ("replication_factor", "1")]);
        check_replication(
            "datacenter1",
            ConsistencyProfile::LocalQuorum,
            &dcs(&["datacenter1"]),
            "ks",
            &simple,
            "t",
        )
        .unwrap();
        let e = check_replication(
            "dc1",
            ConsistencyProfile::LocalQuorum,
            &dcs(&["dc1", "dc2"]),
            "ks",
            &simple,
            "t",
        )
        .unwrap_err();
        assert!(matches!(e, MembershipError::SchemaMismatch { .. }), "{e:?}");
        assert!(e.to_string().contains("NetworkTopologyStrategy"), "{e}");
        // `quorum` is a quorum of all replicas wherever they are: still correct.
        check_replication(
            "dc1",
            ConsistencyProfile::Quorum,
            &dcs(&["dc1", "dc2"]),
            "ks",
            &simple,
            "t",
        )
        .unwrap();
    }

    #[test]
    fn the_profile_exists_only_for_a_named_dc() {
        let o = CassandraClusteringOptions::default()
            .keyspace("ks")
            .service_id("s")
            .cluster_id("c");
        assert!(routing_profile(&o).is_none());
        assert!(routing_profile(&o.serial_datacenter("dc1")).is_some());
    }
}

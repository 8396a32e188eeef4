//! The load balancing every statement of the provider runs with: the base policy (the
//! `serial_datacenter` profile's, or the session's default), except that a plan with a node the
//! driver holds a connection to does not end on one it holds none to.
//!
//! Why: the driver's default policy puts the nodes it cannot reach (a killed node:
//! connection refused) at the end of every plan, "in the last resort". The driver skips such a
//! node without asking the retry policy, but records its pool error as the request's last error:
//! a read retried on the next node after two live coordinators answered a timeout then failed
//! with `ConnectionPoolError(Broken { ConnectionRefused })` — read as `Unavailable`, which is
//! neither what happened nor retried — instead of the timeout the live nodes answered. Left out
//! of the plan, the dead node cannot hide their answer. With no connected node at all the plan
//! is the base policy's, down nodes included: they are the only hope then.

use std::sync::Arc;
use std::time::Duration;

use scylla::cluster::{ClusterState, NodeRef};
use scylla::errors::RequestAttemptError;
use scylla::policies::load_balancing::{FallbackPlan, LoadBalancingPolicy, RoutingInfo};
use scylla::routing::Shard;

/// `base`, with the nodes the driver has no connection to left out of a plan that has others.
#[derive(Debug)]
pub(crate) struct ConnectedFirst {
    base: Arc<dyn LoadBalancingPolicy>,
}

impl ConnectedFirst {
    pub(crate) fn new(base: Arc<dyn LoadBalancingPolicy>) -> ConnectedFirst {
        ConnectedFirst { base }
    }
}

/// `plan` without the targets `connected` refuses, unless that leaves none.
fn keep_connected<T>(plan: Vec<T>, connected: impl Fn(&T) -> bool) -> Vec<T> {
    if plan.iter().any(&connected) {
        plan.into_iter().filter(|t| connected(t)).collect()
    } else {
        plan
    }
}

impl LoadBalancingPolicy for ConnectedFirst {
    fn pick<'a>(
        &'a self,
        request: &'a RoutingInfo,
        cluster: &'a ClusterState,
    ) -> Option<(NodeRef<'a>, Option<Shard>)> {
        // The base policy picks a connected node first whenever it has one.
        self.base.pick(request, cluster)
    }

    fn fallback<'a>(
        &'a self,
        request: &'a RoutingInfo,
        cluster: &'a ClusterState,
    ) -> FallbackPlan<'a> {
        // A plan is a handful of nodes; it is computed only after the first target failed.
        let plan: Vec<_> = self.base.fallback(request, cluster).collect();
        Box::new(keep_connected(plan, |(node, _)| node.is_connected()).into_iter())
    }

    fn on_request_success(&self, request: &RoutingInfo, latency: Duration, node: NodeRef<'_>) {
        self.base.on_request_success(request, latency, node);
    }

    fn on_request_failure(
        &self,
        request: &RoutingInfo,
        latency: Duration,
        node: NodeRef<'_>,
        error: &RequestAttemptError,
    ) {
        self.base.on_request_failure(request, latency, node, error);
    }

    fn name(&self) -> String {
        format!("cassandra-membership connected-first({})", self.base.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_with_a_connected_node_keeps_only_connected_ones() {
        let plan = vec![("a", true), ("dead", false), ("b", true)];
        assert_eq!(
            keep_connected(plan, |(_, up)| *up),
            vec![("a", true), ("b", true)]
        );
    }

    #[test]
    fn a_plan_without_any_connected_node_is_kept_whole() {
        let plan = vec![("a", false), ("b", false)];
        assert_eq!(keep_connected(plan.clone(), |(_, up)| *up), plan);
    }
}

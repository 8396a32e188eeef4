//! The conformance suite and the model-based property tests on Cassandra.

use std::sync::Arc;

use async_trait::async_trait;
use cassandra_membership::MembershipTable;
use cassandra_membership::conformance::{self, Harness, model};
use proptest::prelude::*;
use tokio::sync::OnceCell;

use crate::utils::{options, session_with_keyspace, table_on};

struct Cassandra {
    session: OnceCell<Arc<scylla::client::session::Session>>,
}

#[async_trait]
impl Harness for Cassandra {
    async fn table(&self, cluster_id: &str) -> Arc<dyn MembershipTable> {
        let s = self.session.get_or_init(session_with_keyspace).await;
        Arc::new(table_on(s, options(cluster_id)))
    }
}

fn cassandra() -> Cassandra {
    Cassandra {
        session: OnceCell::new(),
    }
}

cassandra_membership::conformance_tests!(cassandra());

proptest! {
    // Every case runs dozens of Paxos rounds on a real node: fewer cases than in memory.
    #![proptest_config(ProptestConfig { cases: 24, max_shrink_iters: 64, ..ProptestConfig::default() })]

    #[test]
    fn behaves_like_the_sequential_model(steps in model::steps(16)) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let outcome = rt.block_on(async {
            let h = cassandra();
            let table = h.table(&conformance::fresh_cluster_id("model")).await;
            table.initialize(true).await.unwrap();
            model::check(table, &steps).await
        });
        prop_assert!(outcome.is_ok(), "{}", outcome.unwrap_err());
    }
}

/// The same suite with every conditional write expecting the whole entry (`IF entry = ?`), as on
/// servers that compare no field of a frozen user type (ScyllaDB): forced here, on Cassandra.
mod whole_value {
    use super::*;
    use cassandra_membership::EntryConditions;

    struct WholeValue {
        session: OnceCell<Arc<scylla::client::session::Session>>,
    }

    #[async_trait]
    impl Harness for WholeValue {
        async fn table(&self, cluster_id: &str) -> Arc<dyn MembershipTable> {
            let s = self.session.get_or_init(session_with_keyspace).await;
            Arc::new(table_on(
                s,
                options(cluster_id).entry_conditions(EntryConditions::WholeValue),
            ))
        }
    }

    fn whole_value() -> WholeValue {
        WholeValue {
            session: OnceCell::new(),
        }
    }

    cassandra_membership::conformance_tests!(whole_value());

    proptest! {
        #![proptest_config(ProptestConfig { cases: 8, max_shrink_iters: 32, ..ProptestConfig::default() })]

        #[test]
        fn behaves_like_the_sequential_model(steps in model::steps(16)) {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            let outcome = rt.block_on(async {
                let h = whole_value();
                let table = h.table(&conformance::fresh_cluster_id("model-whole")).await;
                table.initialize(true).await.unwrap();
                model::check(table, &steps).await
            });
            prop_assert!(outcome.is_ok(), "{}", outcome.unwrap_err());
        }
    }
}

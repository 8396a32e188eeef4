//! The conformance suite and the model-based property tests on the in-memory table.

use std::sync::Arc;

use async_trait::async_trait;
use cassandra_membership::conformance::{self, Harness, model};
use cassandra_membership::{InMemoryMembershipTable, MembershipTable};
use proptest::prelude::*;

struct Memory(InMemoryMembershipTable);

#[async_trait]
impl Harness for Memory {
    async fn table(&self, cluster_id: &str) -> Arc<dyn MembershipTable> {
        Arc::new(self.0.for_cluster(cluster_id))
    }
}

fn memory() -> Memory {
    Memory(InMemoryMembershipTable::new("unused"))
}

cassandra_membership::conformance_tests!(memory());

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn behaves_like_the_sequential_model(steps in model::steps(30)) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let outcome = rt.block_on(async {
            let table: Arc<dyn MembershipTable> =
                Arc::new(InMemoryMembershipTable::new(conformance::fresh_cluster_id("model")));
            table.initialize(true).await.unwrap();
            model::check(table, &steps).await
        });
        prop_assert!(outcome.is_ok(), "{}", outcome.unwrap_err());
    }
}

/// A table with the Orleans provider's defect: `update_row` ignores the row tag.
#[derive(Debug)]
struct IgnoresRowTag(InMemoryMembershipTable);

#[async_trait]
impl MembershipTable for IgnoresRowTag {
    fn cluster_id(&self) -> &str {
        self.0.cluster_id()
    }
    async fn initialize(&self, v: bool) -> cassandra_membership::Result<()> {
        self.0.initialize(v).await
    }
    async fn read_all(
        &self,
    ) -> cassandra_membership::Result<cassandra_membership::MembershipSnapshot> {
        self.0.read_all().await
    }
    async fn read_row(
        &self,
        a: &cassandra_membership::SiloAddress,
    ) -> cassandra_membership::Result<cassandra_membership::MembershipSnapshot> {
        self.0.read_row(a).await
    }
    async fn insert_row(
        &self,
        e: &cassandra_membership::MembershipEntry,
        v: &cassandra_membership::TableVersion,
    ) -> cassandra_membership::Result<bool> {
        self.0.insert_row(e, v).await
    }
    async fn update_row(
        &self,
        e: &cassandra_membership::MembershipEntry,
        _row_etag: &cassandra_membership::ETag,
        v: &cassandra_membership::TableVersion,
    ) -> cassandra_membership::Result<bool> {
        let current = self.0.read_row(&e.address).await?;
        match current.rows.first() {
            Some(r) => self.0.update_row(e, &r.etag, v).await,
            None => Ok(false),
        }
    }
    async fn update_i_am_alive(
        &self,
        a: &cassandra_membership::SiloAddress,
        t: cassandra_membership::Timestamp,
    ) -> cassandra_membership::Result<cassandra_membership::HeartbeatOutcome> {
        self.0.update_i_am_alive(a, t).await
    }
    async fn cleanup_defunct(
        &self,
        b: cassandra_membership::Timestamp,
    ) -> cassandra_membership::Result<usize> {
        self.0.cleanup_defunct(b).await
    }
    async fn delete_cluster(&self, c: &str) -> cassandra_membership::Result<()> {
        self.0.delete_cluster(c).await
    }
}

#[tokio::test]
async fn the_model_check_catches_an_ignored_row_tag() {
    use model::{Op, Step, TagChoice};
    let table: Arc<dyn MembershipTable> =
        Arc::new(IgnoresRowTag(InMemoryMembershipTable::new("broken")));
    table.initialize(true).await.unwrap();
    let steps = [
        Step::One(Op::Insert {
            silo: 0,
            status: 2,
            version: TagChoice::Current,
        }),
        Step::One(Op::Update {
            silo: 0,
            status: 3,
            suspect: false,
            row: TagChoice::Random,
            version: TagChoice::Current,
        }),
    ];
    let verdict = model::check(table, &steps).await;
    assert!(
        verdict.is_err(),
        "a backend ignoring row tags must fail the model check"
    );
}

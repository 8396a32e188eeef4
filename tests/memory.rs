//! The conformance suite and the model-based property tests on the in-memory table.

use std::sync::Arc;

use async_trait::async_trait;
use cassandra_membership::conformance::faults::FaultyTable;
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

#[tokio::test]
async fn the_model_check_catches_an_ignored_row_tag() {
    use model::{Op, Step, TagChoice};
    // The Orleans provider's bug: `update_row` ignores the row tag.
    let broken = FaultyTable::new(Arc::new(InMemoryMembershipTable::new("broken")));
    broken.set_ignores_the_row_tag(true);
    let table: Arc<dyn MembershipTable> = Arc::new(broken);
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

/// The in-memory table's membership options: defaults, or what `with_options` set; every
/// handle on the store keeps them, and a fault-injecting wrapper forwards them.
#[test]
fn the_membership_options_are_the_table_s_and_its_wrappers_forward_them() {
    use std::time::Duration;

    use cassandra_membership::MembershipOptions;
    let plain = InMemoryMembershipTable::new("c");
    assert_eq!(plain.membership_options(), &MembershipOptions::default());
    let o = MembershipOptions::default().i_am_alive_table_publish_timeout(Duration::from_secs(3));
    let table = InMemoryMembershipTable::new("c").with_options(o.clone());
    assert_eq!(table.membership_options(), &o);
    assert_eq!(table.clone().membership_options(), &o);
    assert_eq!(table.for_cluster("d").membership_options(), &o);
    let wrapped = FaultyTable::new(Arc::new(table));
    assert_eq!(wrapped.membership_options(), &o);
}

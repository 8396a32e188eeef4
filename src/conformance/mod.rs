//! The conformance suite: the contract's semantics written once, run against every backend.
//!
//! It covers the Orleans `MembershipTableTestsBase` checks (with the extended-protocol
//! assertions) and this crate's stricter guarantees. A backend proves itself with one line:
//!
//! ```text
//! cassandra_membership::conformance_tests!(my_harness());
//! ```
//!
//! Each case panics (like `assert!`) on a violation, naming what was expected.
//! Available with the `conformance` feature.

mod dead_limit;
mod harness;
mod heartbeats;
mod lifecycle;
mod rows;

pub mod faults;
pub mod history;
pub mod model;
pub mod sim;
pub mod workload;

pub use dead_limit::{
    dead_entries_rank_by_their_latest_sign_of_life, dead_entries_tied_at_the_limit_go_together,
    excess_dead_entries_go_oldest_first,
};
pub use harness::{Harness, fresh_cluster_id, new_entry};
pub use heartbeats::{
    a_vote_decided_before_a_heartbeat_does_not_apply,
    heartbeat_on_dead_entry_reports_declared_dead, heartbeat_on_missing_entry_reports_not_found,
    i_am_alive_does_not_move_version, i_am_alive_time_only_moves_forward,
};
pub use lifecycle::{
    cleanup_counts_suspicions_and_heartbeats, cleanup_defunct_leaves_fresh_and_active,
    concurrent_initialize_is_idempotent, delete_cluster_isolated_and_reusable,
};
pub use rows::{
    absent_version_reads_as_zero, duplicate_and_stale_inserts_fail_read_all,
    duplicate_and_stale_inserts_fail_read_row, full_field_round_trip, insert_row_moves_version,
    parallel_inserts_and_update_loops, read_all_on_empty_table,
    update_on_missing_row_returns_false_and_creates_nothing, update_row_rounds,
    update_with_wrong_row_etag_fails,
};

/// Generates one `#[tokio::test]` per conformance case for the harness expression given.
#[macro_export]
macro_rules! conformance_tests {
    ($harness:expr) => {
        $crate::conformance_tests!(@cases $harness;
            read_all_on_empty_table,
            insert_row_moves_version,
            duplicate_and_stale_inserts_fail_read_row,
            duplicate_and_stale_inserts_fail_read_all,
            update_row_rounds,
            parallel_inserts_and_update_loops,
            i_am_alive_does_not_move_version,
            a_vote_decided_before_a_heartbeat_does_not_apply,
            cleanup_defunct_leaves_fresh_and_active,
            cleanup_counts_suspicions_and_heartbeats,
            update_on_missing_row_returns_false_and_creates_nothing,
            update_with_wrong_row_etag_fails,
            heartbeat_on_missing_entry_reports_not_found,
            heartbeat_on_dead_entry_reports_declared_dead,
            i_am_alive_time_only_moves_forward,
            full_field_round_trip,
            delete_cluster_isolated_and_reusable,
            concurrent_initialize_is_idempotent,
            absent_version_reads_as_zero,
            excess_dead_entries_go_oldest_first,
            dead_entries_rank_by_their_latest_sign_of_life,
            dead_entries_tied_at_the_limit_go_together,
        );
    };
    (@cases $harness:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let harness = $harness;
                $crate::conformance::$case(&harness).await;
            }
        )*
    };
}

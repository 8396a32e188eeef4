//! Shared by the one-node suites (`tests/cassandra`, `tests/metrics.rs`): burying a cluster's
//! partition in row tombstones, past the provider.

use scylla::client::session::Session;

/// Writes `n` row tombstones into the partition (`service`, `cluster`) of `qualified_table`, at
/// keys that sort before every silo key (a deleted generation leaves at least one such marker).
pub(crate) async fn bury(
    s: &Session,
    qualified_table: &str,
    service: &str,
    cluster: &str,
    n: usize,
) {
    use futures::StreamExt as _;
    let delete = s
        .prepare(format!(
            "DELETE FROM {qualified_table} WHERE service_id = ? AND cluster_id = ? AND silo = ?"
        ))
        .await
        .expect("prepare the raw delete");
    let delete = &delete;
    futures::stream::iter(0..n)
        .map(|i| async move {
            s.execute_unpaged(delete, (service, cluster, format!("0.0.0.0:0@{i:09}")))
                .await
                .expect("a plain delete")
        })
        .buffer_unordered(128)
        .for_each(|_| async {})
        .await;
}

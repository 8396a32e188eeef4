//! Shared by the ring suites (`tests/three_nodes`, `tests/two_dcs`): waiting until a ring whose
//! nodes were restarted or resumed has healed.

use std::time::{Duration, Instant};

use scylla::client::session::Session;

/// Waits (at most 90 s, else panics) until the node `s` asks sees `peers` peers and the nodes
/// agree on schema: gossip needs a moment to mark restarted peers up everywhere.
pub(crate) async fn await_healed(s: &Session, peers: usize) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let seen = s
            .query_unpaged("SELECT peer FROM system.peers", ())
            .await
            .ok()
            .and_then(|r| r.into_rows_result().ok())
            .map(|r| r.rows_num())
            .unwrap_or(0);
        let agreed = tokio::time::timeout(Duration::from_secs(10), s.await_schema_agreement())
            .await
            .is_ok_and(|r| r.is_ok());
        if seen == peers && agreed {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the ring did not heal within 90 s"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

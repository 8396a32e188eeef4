//! What the suite needs from a backend (a [`Harness`]) and the entries and tables its cases
//! start from, with the helpers the cases share.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};

use async_trait::async_trait;

use crate::error::MembershipError;
use crate::model::{
    MembershipEntry, MembershipRow, MembershipSnapshot, SiloAddress, SiloStatus, Timestamp,
};
use crate::table::MembershipTable;

/// What the suite needs from a backend: tables on clusters it names.
#[async_trait]
pub trait Harness: Send + Sync {
    /// A table bound to `cluster_id`, sharing storage with every other table this harness made.
    /// The suite calls `initialize` itself.
    async fn table(&self, cluster_id: &str) -> Arc<dyn MembershipTable>;
}

static GENERATION: AtomicI32 = AtomicI32::new(1);

/// A cluster id nobody else uses.
pub fn fresh_cluster_id(case: &str) -> String {
    format!("{case}-{}", uuid::Uuid::new_v4().simple())
}

/// An Orleans-suite entry: 127.0.0.1:12345, a new generation, status Joining, whole-second times.
pub fn new_entry(now: Timestamp) -> MembershipEntry {
    let generation = GENERATION.fetch_add(1, Ordering::Relaxed);
    let address = SiloAddress::from_v4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 12345), generation);
    let whole = Timestamp::from_millis(now.as_millis() - now.as_millis().rem_euclid(1000));
    let mut e = MembershipEntry::new(address, SiloStatus::Joining, whole);
    e.host_name = "host".into();
    e.silo_name = format!("silo-{generation}");
    e.role_name = "role".into();
    e.proxy_port = 30000;
    e.update_zone = 1;
    e.fault_zone = 2;
    e
}

pub(super) async fn fresh<H: Harness + ?Sized>(h: &H, case: &str) -> Arc<dyn MembershipTable> {
    let t = h.table(&fresh_cluster_id(case)).await;
    t.initialize(true).await.expect("initialize");
    t
}

pub(super) fn one_row(s: &MembershipSnapshot) -> &MembershipRow {
    assert_eq!(s.rows.len(), 1, "expected exactly one row in {s:?}");
    &s.rows[0]
}

/// `Some(applied)` for a definite answer, `None` for `OutcomeUnknown`; any other error fails.
pub(super) fn definite(r: crate::error::Result<bool>) -> Option<bool> {
    match r {
        Ok(applied) => Some(applied),
        Err(MembershipError::OutcomeUnknown { .. }) => None,
        Err(e) => panic!("a conditional write answers true, false or OutcomeUnknown: {e:?}"),
    }
}

pub(super) async fn futures_join<T: Send + 'static>(
    handles: impl IntoIterator<Item = tokio::task::JoinHandle<T>>,
) -> Vec<T> {
    let mut out = Vec::new();
    for h in handles.into_iter().collect::<Vec<_>>() {
        match h.await {
            Ok(v) => out.push(v),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    out
}

pub(super) trait WithStatus {
    fn with_status(self, status: SiloStatus) -> Self;
}

impl WithStatus for MembershipEntry {
    fn with_status(mut self, status: SiloStatus) -> Self {
        self.status = status;
        self
    }
}

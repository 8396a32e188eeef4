//! A fault-injecting [`MembershipTable`]: one configurable wrapper in front of any table, for
//! tests of what a caller does when storage fails, stalls, answers ambiguously or breaks the
//! contract.
//!
//! Per-call faults are [`Injection`]s: which calls ([`Calls`]), what happens to them (an error,
//! no answer, a hold until a [`Gate`] opens, a delay, a write that applies but whose answer is
//! lost, a race lost), after how many matching calls and how many times. Standing knobs change
//! what the table answers: rows read as damaged, heartbeats that do not look at the entry (the
//! Cassandra table between renewals), whether storage covers the defunct cleanup. Two knobs
//! break the contract on purpose, so that a test can prove the checkers catch it: writes that
//! drop the version condition, updates that ignore the row tag.
//!
//! ```
//! # async fn f() {
//! use std::sync::Arc;
//! use cassandra_membership::conformance::faults::{Calls, FaultyTable, Injection, Operation};
//! use cassandra_membership::{InMemoryMembershipTable, MembershipTable};
//!
//! let table = FaultyTable::new(Arc::new(InMemoryMembershipTable::new("blue")));
//! // The next three reads time out; then heartbeats fail until cleared.
//! table.inject(Injection::timeout(Calls::reads(), "injected").times(3));
//! let cut = table.inject(Injection::timeout(Operation::UpdateIAmAlive, "cut off"));
//! assert!(table.read_all().await.is_err());
//! table.clear(cut);
//! # }
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;

use crate::error::{MembershipError, Result};
use crate::model::{
    ETag, MembershipEntry, MembershipSnapshot, SiloAddress, SiloStatus, TableVersion, Timestamp,
};
use crate::options::MembershipOptions;
use crate::table::{HeartbeatOutcome, Lease, MembershipTable, StorageExpiry};

mod injection;

use injection::Action;
pub use injection::{Calls, Gate, Injection, Operation};

/// Names an injection, to clear it or ask how many calls it still affects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FaultId(u64);

/// The answer a call gets from the injections before the wrapped table is asked.
enum Verdict {
    Send,
    SendAndLoseTheAnswer,
    Fail(MembershipError),
    NotApplied,
}

/// A [`MembershipTable`] that injects faults in front of another one; see the module docs.
pub struct FaultyTable {
    inner: Arc<dyn MembershipTable>,
    injections: Mutex<BTreeMap<FaultId, Injection>>,
    next_id: AtomicU64,
    calls: [AtomicU64; Operation::ALL.len()],
    damaged: Mutex<BTreeSet<SiloAddress>>,
    covers_defunct_cleanup: Mutex<Option<bool>>,
    blind_heartbeats: AtomicBool,
    dead_after_next_insert: AtomicBool,
    drops_the_version_condition: AtomicBool,
    ignores_the_row_tag: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl fmt::Debug for FaultyTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyTable")
            .field("inner", &self.inner)
            .field("injections", &*lock(&self.injections))
            .field("damaged", &*lock(&self.damaged))
            .finish_non_exhaustive()
    }
}

impl FaultyTable {
    /// `inner` with no fault yet: every call goes through unchanged (and is counted).
    pub fn new(inner: Arc<dyn MembershipTable>) -> Self {
        FaultyTable {
            inner,
            injections: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(0),
            calls: std::array::from_fn(|_| AtomicU64::new(0)),
            damaged: Mutex::new(BTreeSet::new()),
            covers_defunct_cleanup: Mutex::new(None),
            blind_heartbeats: AtomicBool::new(false),
            dead_after_next_insert: AtomicBool::new(false),
            drops_the_version_condition: AtomicBool::new(false),
            ignores_the_row_tag: AtomicBool::new(false),
        }
    }

    /// The wrapped table, to act on storage past the faults (as another silo would).
    pub fn inner(&self) -> &Arc<dyn MembershipTable> {
        &self.inner
    }

    /// Adds a per-call fault. Injections act in the order they were added; a call stops at the
    /// first that answers it, after any delays and holds before it.
    pub fn inject(&self, injection: Injection) -> FaultId {
        let id = FaultId(self.next_id.fetch_add(1, Ordering::SeqCst));
        lock(&self.injections).insert(id, injection);
        id
    }

    /// Removes an injection; calls already held or delayed by it go on.
    pub fn clear(&self, id: FaultId) {
        lock(&self.injections).remove(&id);
    }

    /// Removes every injection.
    pub fn clear_all(&self) {
        lock(&self.injections).clear();
    }

    /// How many more calls the injection acts on: `u64::MAX` without a limit, 0 once spent or
    /// cleared (calls it lets through first not counted).
    pub fn remaining(&self, id: FaultId) -> u64 {
        lock(&self.injections)
            .get(&id)
            .map_or(0, |i| i.times.unwrap_or(u64::MAX))
    }

    /// How many calls of `operation` were made so far, faulted or not.
    pub fn calls(&self, operation: Operation) -> u64 {
        self.calls[operation as usize].load(Ordering::SeqCst)
    }

    /// `silo`'s row reads as damaged: `read_all` leaves it out (as the Cassandra table skips a
    /// row it cannot decode) and `read_row` answers `CorruptData`. Storage is unchanged.
    pub fn damage_row(&self, silo: SiloAddress) {
        lock(&self.damaged).insert(silo);
    }

    /// `silo`'s row reads as stored again.
    pub fn repair_row(&self, silo: &SiloAddress) {
        lock(&self.damaged).remove(silo);
    }

    /// Whether [`MembershipTable::storage_expiry`] reports that storage covers the defunct
    /// cleanup; `None` reports what the wrapped table says.
    pub fn set_covers_defunct_cleanup(&self, covers: Option<bool>) {
        *lock(&self.covers_defunct_cleanup) = covers;
    }

    /// With `true`, heartbeats do not look at the entry, like the Cassandra table's between
    /// renewals: they answer `Refreshed` where the wrapped table says `DeclaredDead` or
    /// `NotFound` (with an unbounded lease then).
    pub fn set_blind_heartbeats(&self, blind: bool) {
        self.blind_heartbeats.store(blind, Ordering::SeqCst);
    }

    /// The next insert that applies has its row declared Dead right after (by another silo,
    /// before the inserting one takes its next step).
    pub fn declare_dead_after_next_insert(&self) {
        self.dead_after_next_insert.store(true, Ordering::SeqCst);
    }

    /// Breaks the contract: conditional writes present the table's *current* version tag
    /// instead of the caller's (read just before, so a concurrent writer can slip in): lost
    /// updates. For tests that prove a checker catches it.
    pub fn set_drops_the_version_condition(&self, drops: bool) {
        self.drops_the_version_condition
            .store(drops, Ordering::SeqCst);
    }

    /// Breaks the contract: `update_row` ignores the row tag it is given (the row's current tag
    /// is used; a missing row still answers `false`), as the Orleans provider does. For tests
    /// that prove a checker catches it.
    pub fn set_ignores_the_row_tag(&self, ignores: bool) {
        self.ignores_the_row_tag.store(ignores, Ordering::SeqCst);
    }

    /// Runs the injections on one call, in order, until one answers it.
    async fn verdict(&self, operation: Operation, silo: Option<&SiloAddress>) -> Verdict {
        self.calls[operation as usize].fetch_add(1, Ordering::SeqCst);
        let mut after = None;
        loop {
            let next = {
                let mut injections = lock(&self.injections);
                let from = after.map_or(FaultId(0), |FaultId(n)| FaultId(n + 1));
                injections
                    .range_mut(from..)
                    .filter(|(_, i)| i.calls.matches(operation, silo))
                    .find_map(|(id, i)| i.take().then(|| (*id, i.action.clone())))
            };
            let Some((id, action)) = next else {
                return Verdict::Send;
            };
            after = Some(id);
            match action {
                Action::Fail(error) => return Verdict::Fail(error(operation)),
                Action::NotApplied => return Verdict::NotApplied,
                Action::AnswerLost => return Verdict::SendAndLoseTheAnswer,
                Action::Hang => std::future::pending::<()>().await,
                Action::Hold(gate) => gate.pass().await,
                Action::Delay(by) => tokio::time::sleep(by).await,
            }
        }
    }

    /// One call through the injections: `send` reaches the wrapped table. `lost_race` is what
    /// a conditional write answers when it loses its race unsent.
    async fn call<T>(
        &self,
        operation: Operation,
        silo: Option<&SiloAddress>,
        lost_race: Option<T>,
        send: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        match (self.verdict(operation, silo).await, lost_race) {
            (Verdict::Fail(e), _) => Err(e),
            (Verdict::NotApplied, Some(answer)) => Ok(answer),
            (Verdict::SendAndLoseTheAnswer, _) => {
                let answer = send.await.map(|_| ());
                Err(MembershipError::OutcomeUnknown {
                    operation: operation.name(),
                    detail: format!("injected: the answer was lost ({answer:?})"),
                    source: "injected".into(),
                })
            }
            (Verdict::NotApplied | Verdict::Send, _) => send.await,
        }
    }

    /// The version a conditional write presents: the caller's, or with the version condition
    /// dropped, the table's current tag.
    async fn presented_version(&self, new_version: &TableVersion) -> Result<TableVersion> {
        if !self.drops_the_version_condition.load(Ordering::SeqCst) {
            return Ok(new_version.clone());
        }
        let current = self.inner.read_all().await?.version;
        // Widens the window in which a concurrent writer moves the version.
        tokio::task::yield_now().await;
        Ok(TableVersion {
            etag: current.etag,
            ..new_version.clone()
        })
    }

    async fn declare_dead(&self, silo: &SiloAddress) -> Result<()> {
        let snapshot = self.inner.read_row(silo).await?;
        if let Some(row) = snapshot.rows.first() {
            let mut dead = row.entry.clone();
            dead.status = SiloStatus::Dead;
            self.inner
                .update_row(&dead, &row.etag, &snapshot.version.next())
                .await?;
        }
        Ok(())
    }
}

#[async_trait]
impl MembershipTable for FaultyTable {
    fn cluster_id(&self) -> &str {
        self.inner.cluster_id()
    }

    fn service_id(&self) -> &str {
        self.inner.service_id()
    }

    fn identity(&self) -> String {
        self.inner.identity()
    }

    fn membership_options(&self) -> &MembershipOptions {
        self.inner.membership_options()
    }

    fn storage_expiry(&self) -> StorageExpiry {
        let mut expiry = self.inner.storage_expiry();
        if let Some(covers) = *lock(&self.covers_defunct_cleanup) {
            expiry.covers_defunct_cleanup = covers;
        }
        expiry
    }

    async fn initialize(&self, try_init_version: bool) -> Result<()> {
        let send = self.inner.initialize(try_init_version);
        self.call(Operation::Initialize, None, None, send).await
    }

    async fn read_all(&self) -> Result<MembershipSnapshot> {
        let send = async {
            let mut snapshot = self.inner.read_all().await?;
            let damaged = lock(&self.damaged).clone();
            snapshot
                .rows
                .retain(|r| !damaged.contains(&r.entry.address));
            Ok(snapshot)
        };
        self.call(Operation::ReadAll, None, None, send).await
    }

    async fn read_row(&self, address: &SiloAddress) -> Result<MembershipSnapshot> {
        let send = async {
            if lock(&self.damaged).contains(address) {
                return Err(MembershipError::CorruptData {
                    silo: Some(address.to_string()),
                    reason: "injected".into(),
                });
            }
            self.inner.read_row(address).await
        };
        self.call(Operation::ReadRow, Some(address), None, send)
            .await
    }

    async fn insert_row(
        &self,
        entry: &MembershipEntry,
        new_version: &TableVersion,
    ) -> Result<bool> {
        let send = async {
            let version = self.presented_version(new_version).await?;
            let applied = self.inner.insert_row(entry, &version).await?;
            if applied && self.dead_after_next_insert.swap(false, Ordering::SeqCst) {
                self.declare_dead(&entry.address).await?;
            }
            Ok(applied)
        };
        self.call(
            Operation::InsertRow,
            Some(&entry.address),
            Some(false),
            send,
        )
        .await
    }

    async fn update_row(
        &self,
        entry: &MembershipEntry,
        row_etag: &ETag,
        new_version: &TableVersion,
    ) -> Result<bool> {
        let send = async {
            let row_etag = if self.ignores_the_row_tag.load(Ordering::SeqCst) {
                match self.inner.read_row(&entry.address).await?.rows.first() {
                    Some(row) => row.etag.clone(),
                    None => return Ok(false),
                }
            } else {
                row_etag.clone()
            };
            let version = self.presented_version(new_version).await?;
            self.inner.update_row(entry, &row_etag, &version).await
        };
        self.call(
            Operation::UpdateRow,
            Some(&entry.address),
            Some(false),
            send,
        )
        .await
    }

    async fn update_i_am_alive(
        &self,
        address: &SiloAddress,
        time: Timestamp,
    ) -> Result<HeartbeatOutcome> {
        let send = async {
            let outcome = self.inner.update_i_am_alive(address, time).await?;
            if !self.blind_heartbeats.load(Ordering::SeqCst) {
                return Ok(outcome);
            }
            Ok(match outcome {
                HeartbeatOutcome::DeclaredDead { lease } => HeartbeatOutcome::Refreshed { lease },
                HeartbeatOutcome::NotFound => HeartbeatOutcome::Refreshed {
                    lease: Lease::unbounded(time),
                },
                refreshed => refreshed,
            })
        };
        self.call(Operation::UpdateIAmAlive, Some(address), None, send)
            .await
    }

    async fn cleanup_defunct(&self, before: Timestamp) -> Result<usize> {
        let send = self.inner.cleanup_defunct(before);
        self.call(Operation::CleanupDefunct, None, None, send).await
    }

    /// Faults injected for [`Operation::CleanupDefunct`] apply to it as well.
    async fn cleanup_dead_entries(&self, before: Timestamp) -> Result<usize> {
        let send = self.inner.cleanup_dead_entries(before);
        self.call(Operation::CleanupDefunct, None, None, send).await
    }

    async fn delete_cluster(&self, cluster_id: &str) -> Result<()> {
        let send = self.inner.delete_cluster(cluster_id);
        self.call(Operation::DeleteCluster, None, None, send).await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::conformance::new_entry;
    use crate::memory::InMemoryMembershipTable;

    fn table() -> Arc<FaultyTable> {
        Arc::new(FaultyTable::new(Arc::new(InMemoryMembershipTable::new(
            "faults",
        ))))
    }

    async fn insert(t: &FaultyTable, e: &MembershipEntry) -> Result<bool> {
        let v = t.inner().read_all().await?.version;
        t.insert_row(e, &v.next()).await
    }

    async fn read_all_answers(t: &FaultyTable, n: usize) -> Vec<bool> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(t.read_all().await.is_ok());
        }
        out
    }

    #[tokio::test]
    async fn an_injection_lets_the_first_calls_through_then_acts_the_given_number_of_times() {
        let t = table();
        t.initialize(true).await.unwrap();
        let id = t.inject(Injection::contention(Operation::ReadAll).after(1).times(2));
        assert_eq!(t.remaining(id), 2);
        let answers: Vec<bool> = read_all_answers(&t, 4).await;
        assert_eq!(answers, [true, false, false, true]);
        assert_eq!(t.remaining(id), 0);
        assert_eq!(t.calls(Operation::ReadAll), 4);
        // Other operations are not selected.
        assert!(
            t.read_row(&new_entry(Timestamp::now()).address)
                .await
                .is_ok()
        );
    }

    #[tokio::test]
    async fn a_lost_race_writes_nothing_and_a_lost_answer_applies() {
        let t = table();
        t.initialize(true).await.unwrap();
        let e = new_entry(Timestamp::now());
        let lost = t.inject(Injection::not_applied(
            Calls::conditional_writes().about(e.address),
        ));
        assert!(!insert(&t, &e).await.unwrap());
        assert!(t.inner().read_all().await.unwrap().rows.is_empty());
        t.clear(lost);
        t.inject(Injection::answer_lost(Operation::InsertRow));
        assert!(matches!(
            insert(&t, &e).await,
            Err(MembershipError::OutcomeUnknown { .. })
        ));
        assert_eq!(t.inner().read_all().await.unwrap().rows.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_call_waits_for_its_gate() {
        let t = table();
        t.initialize(true).await.unwrap();
        let gate = Gate::new();
        t.inject(Injection::hold(Operation::ReadAll, &gate));
        let read = tokio::spawn({
            let t = Arc::clone(&t);
            async move { t.read_all().await }
        });
        gate.reached().await;
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(!read.is_finished(), "answered before the gate opened");
        gate.release();
        assert!(read.await.unwrap().is_ok());
        assert_eq!(gate.arrived(), 1);
    }

    #[tokio::test]
    async fn a_damaged_row_is_skipped_by_read_all_and_corrupt_for_read_row() {
        let t = table();
        t.initialize(true).await.unwrap();
        let e = new_entry(Timestamp::now());
        assert!(insert(&t, &e).await.unwrap());
        t.damage_row(e.address);
        assert!(t.read_all().await.unwrap().rows.is_empty());
        assert!(matches!(
            t.read_row(&e.address).await,
            Err(MembershipError::CorruptData { .. })
        ));
        t.repair_row(&e.address);
        assert_eq!(t.read_all().await.unwrap().rows.len(), 1);
    }
}

//! What a [`FaultyTable`](super::FaultyTable) can do to a call: which calls an injection
//! selects ([`Calls`] of [`Operation`]s), what happens to them ([`Injection`]), and the
//! [`Gate`] that holds them.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::error::MembershipError;
use crate::model::SiloAddress;

/// A method of the contract, as injections select calls and counters count them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operation {
    /// [`MembershipTable::initialize`](crate::MembershipTable::initialize).
    Initialize,
    /// [`MembershipTable::read_all`](crate::MembershipTable::read_all).
    ReadAll,
    /// [`MembershipTable::read_row`](crate::MembershipTable::read_row).
    ReadRow,
    /// [`MembershipTable::insert_row`](crate::MembershipTable::insert_row).
    InsertRow,
    /// [`MembershipTable::update_row`](crate::MembershipTable::update_row).
    UpdateRow,
    /// [`MembershipTable::update_i_am_alive`](crate::MembershipTable::update_i_am_alive) (the heartbeat).
    UpdateIAmAlive,
    /// [`MembershipTable::cleanup_defunct`](crate::MembershipTable::cleanup_defunct) and
    /// [`MembershipTable::cleanup_dead_entries`](crate::MembershipTable::cleanup_dead_entries).
    CleanupDefunct,
    /// [`MembershipTable::delete_cluster`](crate::MembershipTable::delete_cluster).
    DeleteCluster,
}

impl Operation {
    /// Every operation, in the trait's order.
    pub const ALL: [Operation; 8] = [
        Operation::Initialize,
        Operation::ReadAll,
        Operation::ReadRow,
        Operation::InsertRow,
        Operation::UpdateRow,
        Operation::UpdateIAmAlive,
        Operation::CleanupDefunct,
        Operation::DeleteCluster,
    ];

    /// The method's name, as errors name their operation.
    pub fn name(self) -> &'static str {
        match self {
            Operation::Initialize => "initialize",
            Operation::ReadAll => "read_all",
            Operation::ReadRow => "read_row",
            Operation::InsertRow => "insert_row",
            Operation::UpdateRow => "update_row",
            Operation::UpdateIAmAlive => "update_i_am_alive",
            Operation::CleanupDefunct => "cleanup_defunct",
            Operation::DeleteCluster => "delete_cluster",
        }
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// Which calls an [`Injection`] applies to: some operations, optionally only those about one silo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Calls {
    operations: u8,
    silo: Option<SiloAddress>,
}

impl Calls {
    /// Calls of any of `operations`.
    pub fn any_of(operations: impl IntoIterator<Item = Operation>) -> Self {
        Calls {
            operations: operations.into_iter().fold(0, |m, o| m | o.bit()),
            silo: None,
        }
    }

    /// Both reads: `read_all` and `read_row`.
    pub fn reads() -> Self {
        Calls::any_of([Operation::ReadAll, Operation::ReadRow])
    }

    /// Both conditional writes: `insert_row` and `update_row`.
    pub fn conditional_writes() -> Self {
        Calls::any_of([Operation::InsertRow, Operation::UpdateRow])
    }

    /// Only the calls about `silo`: its `read_row`, the writes of its entry and its heartbeats
    /// (calls that name no silo never match).
    pub fn about(mut self, silo: SiloAddress) -> Self {
        self.silo = Some(silo);
        self
    }

    pub(super) fn matches(&self, operation: Operation, silo: Option<&SiloAddress>) -> bool {
        self.operations & operation.bit() != 0 && self.silo.as_ref().is_none_or(|s| Some(s) == silo)
    }
}

impl From<Operation> for Calls {
    fn from(operation: Operation) -> Self {
        Calls::any_of([operation])
    }
}

/// Builds the error a failing call answers, from the operation it failed.
type ErrorFor = Arc<dyn Fn(Operation) -> MembershipError + Send + Sync>;

/// What happens to a call an injection selects.
#[derive(Clone)]
pub(super) enum Action {
    /// Answers the error without reaching the wrapped table.
    Fail(ErrorFor),
    /// A conditional write answers `false` without reaching the wrapped table (a race lost).
    NotApplied,
    /// Reaches the wrapped table, then answers `OutcomeUnknown` whatever it did.
    AnswerLost,
    /// Never answers.
    Hang,
    /// Waits until the gate opens, then goes on.
    Hold(Gate),
    /// Waits this long, then goes on.
    Delay(Duration),
}

impl fmt::Debug for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Fail(_) => f.write_str("Fail"),
            Action::NotApplied => f.write_str("NotApplied"),
            Action::AnswerLost => f.write_str("AnswerLost"),
            Action::Hang => f.write_str("Hang"),
            Action::Hold(g) => f.debug_tuple("Hold").field(g).finish(),
            Action::Delay(d) => f.debug_tuple("Delay").field(d).finish(),
        }
    }
}

/// One per-call fault for [`FaultyTable::inject`](super::FaultyTable::inject): the calls it selects, what happens to them,
/// and when. Without [`times`](Injection::times) it lasts until cleared.
#[derive(Clone, Debug)]
pub struct Injection {
    pub(super) calls: Calls,
    pub(super) action: Action,
    skip: u64,
    pub(super) times: Option<u64>,
}

impl Injection {
    fn new(calls: Calls, action: Action) -> Self {
        Injection {
            calls,
            action,
            skip: 0,
            times: None,
        }
    }

    /// The calls answer the error `error` builds for their operation; nothing reaches the
    /// wrapped table.
    pub fn fail(
        calls: impl Into<Calls>,
        error: impl Fn(Operation) -> MembershipError + Send + Sync + 'static,
    ) -> Self {
        Injection::new(calls.into(), Action::Fail(Arc::new(error)))
    }

    /// The calls time out (`MembershipError::Timeout`, `source` as the driver's error).
    pub fn timeout(calls: impl Into<Calls>, source: &'static str) -> Self {
        Injection::fail(calls, move |o| MembershipError::Timeout {
            operation: o.name(),
            source: source.into(),
        })
    }

    /// No node answers the calls (`MembershipError::Unavailable`).
    pub fn unavailable(calls: impl Into<Calls>, source: &'static str) -> Self {
        Injection::fail(calls, move |o| MembershipError::Unavailable {
            operation: o.name(),
            source: source.into(),
        })
    }

    /// The calls give up under contention, as a read whose snapshot kept moving does
    /// (`MembershipError::Contention` after 8 attempts).
    pub fn contention(calls: impl Into<Calls>) -> Self {
        Injection::fail(calls, |o| MembershipError::Contention {
            operation: o.name(),
            attempts: 8,
            elapsed: Duration::ZERO,
        })
    }

    /// The conditional writes among the calls lose their race: they answer `false` and nothing
    /// reaches the wrapped table. Other operations are not selected.
    pub fn not_applied(calls: impl Into<Calls>) -> Self {
        let mut calls = calls.into();
        calls.operations &= Calls::conditional_writes().operations;
        Injection::new(calls, Action::NotApplied)
    }

    /// The calls reach the wrapped table (a write applies) but their answer is lost: they
    /// answer `MembershipError::OutcomeUnknown`.
    pub fn answer_lost(calls: impl Into<Calls>) -> Self {
        Injection::new(calls.into(), Action::AnswerLost)
    }

    /// The calls never answer (the caller's timeout is what ends them).
    pub fn hang(calls: impl Into<Calls>) -> Self {
        Injection::new(calls.into(), Action::Hang)
    }

    /// The calls wait until `gate` opens, then go on (a coordinator that stalls a decided write).
    pub fn hold(calls: impl Into<Calls>, gate: &Gate) -> Self {
        Injection::new(calls.into(), Action::Hold(gate.clone()))
    }

    /// The calls wait `by`, then go on (slow but successful calls).
    pub fn delay(calls: impl Into<Calls>, by: Duration) -> Self {
        Injection::new(calls.into(), Action::Delay(by))
    }

    /// Applies to `n` matching calls, then no more.
    pub fn times(mut self, n: u64) -> Self {
        self.times = Some(n);
        self
    }

    /// Lets the first `n` matching calls through untouched.
    pub fn after(mut self, n: u64) -> Self {
        self.skip = n;
        self
    }

    /// Counts one matching call: whether this injection acts on it.
    pub(super) fn take(&mut self) -> bool {
        if self.skip > 0 {
            self.skip -= 1;
            return false;
        }
        match &mut self.times {
            None => true,
            Some(0) => false,
            Some(n) => {
                *n -= 1;
                true
            }
        }
    }
}

/// Holds the calls of [`Injection::hold`] until [`release`](Gate::release)d; tells when the
/// first one arrived. Clones share the gate.
#[derive(Clone, Debug)]
pub struct Gate(Arc<watch::Sender<GateState>>);

#[derive(Clone, Copy, Debug, Default)]
struct GateState {
    arrived: u64,
    released: bool,
}

impl Default for Gate {
    fn default() -> Self {
        Gate::new()
    }
}

impl Gate {
    /// A closed gate no call reached yet.
    pub fn new() -> Self {
        Gate(Arc::new(watch::Sender::new(GateState::default())))
    }

    /// Waits until a call reached the gate (at once if one already did).
    pub async fn reached(&self) {
        let mut state = self.0.subscribe();
        // The sender lives in `self`: the channel cannot close while this waits.
        let _ = state.wait_for(|s| s.arrived > 0).await;
    }

    /// How many calls reached the gate so far.
    pub fn arrived(&self) -> u64 {
        self.0.borrow().arrived
    }

    /// Opens the gate: held calls go on, later ones pass.
    pub fn release(&self) {
        self.0.send_modify(|s| s.released = true);
    }

    pub(super) async fn pass(&self) {
        self.0.send_modify(|s| s.arrived += 1);
        let mut state = self.0.subscribe();
        let _ = state.wait_for(|s| s.released).await;
    }
}

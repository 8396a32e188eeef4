//! Expiry per cluster: the audit of THIS cluster's partition against the configured TTL, the
//! `throw` / `allow` / `patch` policies, and what a table value learns from it (whether the
//! version may carry a TTL, whether storage covers defunct cleanup). This file only wires the
//! parts together; each part's opening comment says what it owns.
//!
//! Two rules make expiry safe in every configuration, including silos of one cluster running
//! with different settings (a rolling change) or older binaries that never renew anything:
//! - a row is given a TTL only when no running silo can own it any more (Dead, or silent for
//!   longer than the TTL); a row without TTL that may be live stays without TTL — its silo may
//!   run with expiry off and would never renew it. A membership write with expiry on keeps a row
//!   (and the version) without TTL if it has none, and never shortens a TTL (`read_ttls.cql`);
//!   a silo with expiry off takes back a TTL someone gave its own row or the version;
//! - the version carries no TTL while any row of the partition has none (or a longer one than
//!   this configuration renews), and otherwise at least the longest row TTL: the version must
//!   outlive every entry.
//!
//! Other clusters' rows are never read for the verdict and never written.
//!
//! The parts, leaves first (no file uses one listed after it); heartbeat cells as stored are
//! `../heartbeats.rs`'s:
//! - `ttl.rs`: TTL arithmetic and the rules every decision shares (floors, caps, renewals);
//! - `audit.rs`: the public audit types;
//! - `plan.rs`: the pure planner — what `patch` and the repairs do, decided from rows read;
//! - `state.rs`: what a table value knows of its partition's expiry, and the TTLs its writes
//!   and renewals carry;
//! - `scan.rs`: the reads the planner decides from, and the audit;
//! - `apply.rs`: the policies at `initialize` and the writes that apply a plan.

mod apply;
mod audit;
mod plan;
mod scan;
mod state;
mod ttl;

pub use audit::{PatchAction, RowAudit, TtlAudit};
pub(super) use state::ExpiryState;

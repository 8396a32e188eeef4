//! # cassandra-membership
//!
//! An Orleans-style cluster membership table kept in Apache Cassandra (or ScyllaDB), with
//! optional storage-side expiry so that a cluster that is gone for good disappears from the
//! table without any silo running.
//!
//! The crate is layered the way it is built:
//! - the model ([`SiloAddress`], [`MembershipEntry`], [`TableVersion`], [`MembershipSnapshot`]),
//! - the contract ([`MembershipTable`]), with its [`Lease`] and [`HeartbeatOutcome`],
//! - backends: [`InMemoryMembershipTable`] (reference semantics, embedded default) and
//!   [`CassandraMembershipTable`],
//! - one error type, [`MembershipError`].
//!
//! ```
//! use cassandra_membership::*;
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let table = InMemoryMembershipTable::new("my-cluster");
//! table.initialize(true).await?;
//! let me: SiloAddress = "10.0.0.1:11111@1".parse()?;
//! let version = table.read_all().await?.version;
//! let entry = MembershipEntry::new(me, SiloStatus::Joining, Timestamp::now());
//! assert!(table.insert_row(&entry, &version.next()).await?);
//! assert!(matches!(
//!     table.update_i_am_alive(&me, Timestamp::now()).await?,
//!     HeartbeatOutcome::Refreshed { .. }
//! ));
//! # Ok::<(), MembershipError>(())
//! # }).unwrap();
//! ```
//!
//! The guide — guarantees, fencing, expiry, schema, costs, operating — is the [`docs`] module.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod cassandra;
mod clock;
pub mod docs;
mod error;
mod memory;
mod model;
mod observe;
mod options;
pub mod runtime;
mod table;

#[cfg(feature = "conformance")]
#[cfg_attr(docsrs, doc(cfg(feature = "conformance")))]
pub mod conformance;

pub use cassandra::TlsOptions;
pub use cassandra::{
    CassandraClusteringOptions, CassandraMembershipTable, ClusterInspection, ConsistencyProfile,
    Credentials, EXPIRY_HORIZON_UNIX_SECONDS, EntryConditions, EntryInspection, MAX_TTL_SECONDS,
    PatchAction, RowAudit, StatementCounts, TtlAudit, TtlMismatchPolicy,
};
pub use cassandra::{
    ClusterMigration, DEFAULT_MIGRATION_QUIET_FOR, MigrationPlan, MigrationReport, SkippedCell,
    Verification,
};
pub use clock::{Clock, ManualClock, SystemClock, TokioClock};
pub use error::{BoxError, MembershipError, Result};
pub use memory::InMemoryMembershipTable;
pub use model::{
    ETag, MembershipEntry, MembershipRow, MembershipSnapshot, SiloAddress, SiloStatus, SuspectTime,
    TableVersion, Timestamp,
};
pub use observe::describe_metrics;
pub use options::MembershipOptions;
pub use runtime::health::{FailureCause, Fence, SiloHealth};
pub use runtime::silo::{Silo, SiloBuilder};
pub use table::{HeartbeatOutcome, Lease, MembershipTable, StorageExpiry};

// The README's code compiles (its Rust blocks are doc tests).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

//! # cassandra-membership
//!
//! An Orleans-style cluster membership table kept in Apache Cassandra (or ScyllaDB), and the host
//! runtime around it: each process joins as a [`Silo`], heartbeats, sees who the members are,
//! votes silent ones dead, and is told when it must stop serving. With optional storage-side
//! expiry, a cluster that is gone for good disappears from the table without any silo running.
//!
//! ## A host
//!
//! A host joins with [`Silo::join`] (or [`Silo::builder`]) on a table, then asks three things:
//! - **may I serve?** — [`Silo::should_serve`] / [`Silo::fence`] (a [`Fence`] per request
//!   handler): false from the fence horizon on, until healthy again;
//! - **who are the members?** — [`Silo::view`] / [`Silo::views`]: a [`ClusterView`], one committed
//!   table version at a time ([`ClusterWatcher`] for a process that is no silo);
//! - **how am I?** — [`Silo::health`]: a [`SiloHealth`]; [`SiloHealth::is_final`] means this
//!   incarnation is over.
//!
//! and leaves on shutdown with [`Silo::leave`].
//!
//! ```
//! use std::sync::Arc;
//! use cassandra_membership::{InMemoryMembershipTable, MembershipTable, Silo, SiloAddress};
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! // In production: `CassandraMembershipTable::connect(options).await?`.
//! let table: Arc<dyn MembershipTable> = Arc::new(InMemoryMembershipTable::new("my-cluster"));
//! let me = SiloAddress::new_incarnation("10.0.0.1:11111".parse().unwrap())?;
//! let silo = Silo::join(table, me).await?; // Joining → Active; heartbeats and detection run
//! assert!(silo.should_serve());
//! assert!(silo.view().borrow().is_member(&me));
//! assert!(!silo.health().borrow().is_final());
//! silo.leave().await?; // ShuttingDown → Dead: the others stop counting on it at once
//! # Ok::<(), cassandra_membership::MembershipError>(())
//! # }).unwrap();
//! ```
//!
//! ## The table, for backend authors and tools
//!
//! Below the runtime, the crate is layered the way it is built:
//! - the contract, [`MembershipTable`] (the Orleans `IMembershipTable`), with its [`Lease`] and
//!   [`HeartbeatOutcome`]; the conformance suite (feature `conformance`) any backend runs;
//! - the model ([`SiloAddress`], [`MembershipEntry`], [`TableVersion`], [`MembershipSnapshot`]);
//! - backends: [`CassandraMembershipTable`] (options: [`CassandraClusteringOptions`]; its schema:
//!   [`SchemaScript`](cassandra::SchemaScript)) and [`InMemoryMembershipTable`] (reference semantics, for a host's tests);
//! - one error type, [`MembershipError`].
//!
//! What operators' tools use besides (the TTL audit, inspection, the offline migration, the
//! schema script) is in the [`cassandra`] module.
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
//! # Ok::<(), MembershipError>(())
//! # }).unwrap();
//! ```
//!
//! The driver's types in this crate's signatures come from the re-exported [`scylla`] (a host's
//! own `Session` for [`CassandraMembershipTable::with_session`]) and, with the feature `rustls`,
//! [`rustls`] (its `ClientConfig` for [`CassandraMembershipTable::connect_tls`]): use these paths
//! and the versions always match.
//!
//! ```no_run
//! use std::sync::Arc;
//! use cassandra_membership::scylla::client::session_builder::SessionBuilder;
//! use cassandra_membership::{CassandraClusteringOptions, CassandraMembershipTable};
//! # async fn host(options: CassandraClusteringOptions) -> Result<(), Box<dyn std::error::Error>> {
//! let session = SessionBuilder::new().known_node("10.0.0.5:9042").build().await?;
//! let table = CassandraMembershipTable::with_session(Arc::new(session), options)?;
//! # Ok(())
//! # }
//! ```
//!
//! The guide — fencing, sharding, guarantees, expiry, schema, tracing, operating — is the
//! [`docs`] module.

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod cassandra;
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

/// rustls (feature `rustls`): its `ClientConfig` is in [`CassandraMembershipTable::connect_tls`].
#[cfg(feature = "rustls")]
#[cfg_attr(docsrs, doc(cfg(feature = "rustls")))]
pub use rustls;
/// The driver this crate builds on (its `Session` is in [`CassandraMembershipTable::with_session`]
/// and [`CassandraMembershipTable::session`]).
pub use scylla;
/// secrecy: [`Credentials::password`] is a `secrecy::SecretString` (build one with
/// `SecretString::from(String)`, read it with `ExposeSecret`), so a host names this version.
pub use secrecy;

pub use cassandra::{
    CassandraClusteringOptions, CassandraMembershipTable, ConsistencyProfile, Credentials,
    EntryConditions, TlsOptions, TtlMismatchPolicy,
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
pub use runtime::view::{ClusterView, Staleness};
pub use runtime::watcher::{ClusterWatcher, ClusterWatcherOptions};
pub use table::{HeartbeatOutcome, Lease, MembershipTable, StorageExpiry};

// The README's code compiles (its Rust blocks are doc tests).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

//! A rio-rs application on Cassandra alone: membership, object placement and object state.
//!
//! - [`CassandraMembershipStorage`] implements rio's
//!   [`MembershipStorage`](rio_rs::cluster::storage::MembershipStorage) on
//!   [`cassandra_membership::CassandraMembershipTable`] (or any
//!   [`MembershipTable`](cassandra_membership::MembershipTable)), so rio servers and clients find
//!   each other through it, with everything the table guarantees — linearizable membership
//!   changes and storage-side expiry of servers that are gone — and keeps each server's
//!   membership health.
//! - [`CassandraObjectPlacement`] implements rio's
//!   [`ObjectPlacement`](rio_rs::object_placement::ObjectPlacement): one conditional write per
//!   placement, so an object is placed on at most one live server; placements expire with it.
//! - [`CassandraState`] implements rio's [`StateLoader`](rio_rs::state::StateLoader) and
//!   [`StateSaver`](rio_rs::state::StateSaver) with versioned saves: two activations never
//!   overwrite each other's state silently.
//! - [`FencedClusterProvider`] stops a server whose entry is Dead or gone; while its lease is at
//!   risk the placement store refuses every object, so it serves nothing.
//!
//! ```no_run
//! use cassandra_membership::CassandraClusteringOptions;
//! use cassandra_membership_rio::*;
//! use rio_rs::prelude::*;
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! let options = CassandraClusteringOptions::default()
//!     .keyspace("rio")
//!     .service_id("my-service")
//!     .cluster_id("blue")
//!     .ttl(true);
//! let storage = CassandraMembershipStorage::connect(options).await?;
//! let placement = CassandraObjectPlacement::connect(&storage, PlacementOptions::default()).await?;
//! let state = CassandraState::connect(&storage, StateOptions::default()).await?;
//! let provider = FencedClusterProvider::new(
//!     PeerToPeerClusterProvider::builder().members_storage(storage.clone()).build(),
//! );
//! let client = ClientBuilder::new().members_storage(storage).build()?;
//! # drop((placement, state, provider, client)); Ok(()) }
//! ```
//!
#![doc = include_str!("../MAPPING.md")]

mod cql;
mod error;
mod fence;
mod mapping;
mod options;
mod placement;
mod state;
mod storage;

pub use error::{RioStoreError, RioStoreResult};
pub use fence::FencedClusterProvider;
pub use options::RioStorageOptions;
pub use placement::{CassandraObjectPlacement, PlacementOptions};
pub use state::{CassandraState, StateOptions};
pub use storage::CassandraMembershipStorage;

// The README's code compiles (its Rust blocks are doc tests).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

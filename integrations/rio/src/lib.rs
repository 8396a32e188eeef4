//! rio-rs clusters on an Orleans-style membership table in Cassandra.
//!
//! [`CassandraMembershipStorage`] implements rio's
//! [`MembershipStorage`](rio_rs::cluster::storage::MembershipStorage) on
//! [`cassandra_membership::CassandraMembershipTable`] (or any
//! [`MembershipTable`](cassandra_membership::MembershipTable)), so rio servers and clients find
//! each other through it, with everything the table guarantees — linearizable membership
//! changes and storage-side expiry of servers that are gone.
//!
//! ```no_run
//! use cassandra_membership::CassandraClusteringOptions;
//! use cassandra_membership_rio::CassandraMembershipStorage;
//! use rio_rs::prelude::*;
//! # async fn f() -> cassandra_membership::Result<()> {
//! let options = CassandraClusteringOptions::default()
//!     .keyspace("rio")
//!     .service_id("my-service")
//!     .cluster_id("blue")
//!     .ttl(true);
//! let storage = CassandraMembershipStorage::connect(options).await?;
//! let provider = PeerToPeerClusterProvider::builder().members_storage(storage.clone()).build();
//! let client = ClientBuilder::new().members_storage(storage).build();
//! # drop((provider, client)); Ok(()) }
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

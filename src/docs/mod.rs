//! The guide: what the table guarantees, how a host fences itself, storage-side expiry, the
//! schema, what each operation costs, and how to run it in production. One page per topic; each
//! page's Rust examples are doc tests.
//!
//! | page | what it covers |
//! |---|---|
//! | [`configuration`] | every option and its default |
//! | [`fencing`] | what a host does on each [`SiloHealth`](crate::SiloHealth), and why it is safe |
//! | [`sharding`] | splitting work with the cluster view and the fence; how fresh a view is |
//! | [`guarantees`] | the contract each operation keeps, its honest outcomes and time bounds; the Orleans provider's known defects |
//! | [`cleanup`] | defunct cleanup: one per table and process, the age and count rules |
//! | [`expiry`] | storage-side expiry: its contract, mixed settings, tables that disagree, migrating |
//! | [`consistency`] | consistency profiles and data centres |
//! | [`schema`] | the table's layout; creating it ahead of the silos (`cassandra-membership schema`) and the grants the role needs |
//! | [`tombstones`] | what expired and deleted data costs, and `gc_grace` |
//! | [`costs`] | the statements each operation executes |
//! | [`observability`] | tracing and metrics |
//! | [`tracing`] | every span and event: names, levels, targets, fields |
//! | [`migration`] | moving a table of the 0.2 shape to the current one: `cassandra-membership migrate` |
//! | [`operating`] | the command line (TLS, declare-dead, cleanup, JSON, exit codes), supported releases, Paxos v2 |
//!
//! Working on the crate itself (the test set-up, the Cassandra nodes, the fault suite, the layout
//! of the code): [CONTRIBUTING.md](https://github.com/cassandra-membership/cassandra-membership/blob/main/CONTRIBUTING.md).

#[doc = include_str!("configuration.md")]
pub mod configuration {}

#[doc = include_str!("fencing.md")]
pub mod fencing {}

#[doc = include_str!("sharding.md")]
pub mod sharding {}

#[doc = include_str!("guarantees.md")]
pub mod guarantees {}

#[doc = include_str!("cleanup.md")]
pub mod cleanup {}

#[doc = include_str!("expiry.md")]
pub mod expiry {}

#[doc = include_str!("consistency.md")]
pub mod consistency {}

#[doc = include_str!("schema.md")]
pub mod schema {}

#[doc = include_str!("tombstones.md")]
pub mod tombstones {}

#[doc = include_str!("costs.md")]
pub mod costs {}

#[doc = include_str!("observability.md")]
pub mod observability {}

#[doc = include_str!("tracing.md")]
pub mod tracing {}

#[doc = include_str!("operating.md")]
pub mod operating {}

#[doc = include_str!("migration.md")]
pub mod migration {}

#[cfg(test)]
mod tracing_page;

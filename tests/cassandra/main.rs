//! Tests against a real Cassandra node. One binary, one module per area (like the driver's own
//! integration tests). The node is found through `CASSANDRA_CONTACT_POINTS` (default
//! `127.0.0.1:9042`); `scripts/test.sh` starts one. A test fails loudly when no node answers.

#[path = "../common/tombstones.rs"]
mod buried;
#[path = "../common/logs.rs"]
mod logs;
mod utils;

mod bounded;
mod cassandra_only;
mod conformance;
mod contention;
mod expiry;
mod faults;
mod migrate;
mod outcomes;
mod provider;
mod runtime;
mod runtime_fencing;
#[cfg(feature = "rustls")]
mod secure;
mod smoke;
mod tombstones;
mod under_load;
mod version_lost;
mod view;

//! The host runtime on the in-memory table, under tokio's paused time: deterministic and fast.
//! One module per behaviour; faults come from the conformance module's `FaultyTable`.

#[path = "../common/logs.rs"]
mod logs;
mod utils;

mod cleanup;
mod clock_steps;
mod detection;
mod fencing;
mod join;
mod leave;
mod own_row;
mod view;
mod watcher;

#!/usr/bin/env bash
# The whole test suite of the workspace (the library and the `cassandra-membership` CLI in cli/):
# lints, docs, unit and in-memory tests, and every Cassandra test against a real Apache Cassandra
# 5.0 node that this script starts (downloading it from Maven Central the first time). Fails
# loudly if Cassandra cannot be started; never skips Cassandra tests.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

t0=$SECONDS
step() { printf '\n==> %s (%ds)\n' "$*" $((SECONDS - t0)); }

started_here=0
if [ -z "${CASSANDRA_CONTACT_POINTS:-}" ]; then
  # (No `| grep -q`: with pipefail, grep closing the pipe early would read as "down".)
  status=$(scripts/cassandra.sh status)
  if [[ "$status" != *"node 1: up"* ]]; then
    step "starting Cassandra"
    scripts/cassandra.sh start 1
    started_here=1
  fi
  export CASSANDRA_CONTACT_POINTS=127.0.0.1:9042
fi
cleanup() { if [ "$started_here" = 1 ] && [ -z "${KEEP_CASSANDRA:-}" ]; then scripts/cassandra.sh stop; fi; }
trap cleanup EXIT

step "cargo fmt --all --check"
cargo fmt --all --check
step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings
step "cargo clippy --workspace --all-targets --all-features -- -D warnings (rustls, metrics)"
cargo clippy --workspace --all-targets --all-features -- -D warnings
step "cargo doc --workspace --no-deps"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
step "cargo test (Cassandra at $CASSANDRA_CONTACT_POINTS)"
# The Cassandra tests mostly wait (on Paxos rounds and on TTLs): run more of them at once than cores.
export RUST_TEST_THREADS=${RUST_TEST_THREADS:-8}
# The CLI's tests run the built binary against the same node (keyspace cm_cli_test).
cargo test --workspace --lib --bins --tests
cargo test --workspace --doc
step "rio adapter: the three-server example"
cargo run -p cassandra-membership-rio --example rio_cluster
step "benchmarks compile"
cargo bench --no-run --quiet
step "done"

#!/usr/bin/env bash
# The whole test suite: lints, docs, unit and in-memory tests, and every Cassandra test against a
# real Apache Cassandra 5.0 node that this script starts (downloading it from Maven Central the
# first time). Fails loudly if Cassandra cannot be started; never skips Cassandra tests.
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
secure_started_here=0
cleanup() {
  if [ -n "${KEEP_CASSANDRA:-}" ]; then return; fi
  if [ "$secure_started_here" = 1 ]; then scripts/cassandra.sh stop 9; fi
  if [ "$started_here" = 1 ]; then scripts/cassandra.sh stop; fi
}
trap cleanup EXIT

step "cargo fmt --check"
cargo fmt --check
step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings
step "cargo clippy --all-targets --all-features -- -D warnings (rustls, metrics)"
cargo clippy --all-targets --all-features -- -D warnings
step "cargo doc --no-deps"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --quiet
step "cargo test (Cassandra at $CASSANDRA_CONTACT_POINTS)"
# The Cassandra tests mostly wait (on Paxos rounds and on TTLs): run more of them at once than cores.
export RUST_TEST_THREADS=${RUST_TEST_THREADS:-8}
cargo test --lib --bins --tests
cargo test --doc
step "TLS and authentication (a node on 127.0.0.9 that speaks only TLS and asks for a password)"
if [ -z "${CASSANDRA_SECURE_CONTACT_POINT:-}" ]; then
  status=$(scripts/cassandra.sh status)
  if [[ "$status" != *"node 9: up"* ]]; then
    scripts/cassandra.sh start-secure
    secure_started_here=1
  fi
fi
cargo test --features rustls --test cassandra secure::
step "benchmarks compile"
cargo bench --no-run --quiet
step "done"

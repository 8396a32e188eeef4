#!/usr/bin/env bash
# The whole test suite of the workspace (the library, the CLI in cli/, the rio adapter in
# integrations/rio): lints (actionlint on the CI workflow among them), docs, unit and in-memory
# tests, and every Cassandra test against a real node:
#
#   scripts/test.sh                   Apache Cassandra 5.0 that this script starts (downloading it
#                                     from Maven Central the first time), or reuses on 127.0.0.1:9042
#   CASSANDRA_RUNTIME=docker scripts/test.sh
#                                     the docker-compose.yml service of CASSANDRA_BACKEND: started,
#                                     awaited (healthcheck), and removed afterwards
#   CASSANDRA_CONTACT_POINTS=host:port scripts/test.sh
#                                     a node you run
#
# CASSANDRA_BACKEND=cassandra (default) or scylla says what the node is; for scylla the
# Cassandra-only tests (tests/cassandra/cassandra_only.rs) are excluded by name, and listed.
# KEEP_CASSANDRA=1 leaves a node this script started running.
# Fails loudly if the node cannot be started (or Docker is missing); never skips Cassandra tests.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

t0=$SECONDS
step() { printf '\n==> %s (%ds)\n' "$*" $((SECONDS - t0)); }
die() { printf '[test.sh] %s\n' "$*" >&2; exit 1; }

# The docker-compose.yml services, one per backend (tests/compose.rs checks the file against this).
backends="cassandra scylla"
backend=${CASSANDRA_BACKEND:-cassandra}
[[ " $backends " == *" $backend "* ]] || die "CASSANDRA_BACKEND must be one of: $backends (it is '$backend')"
export CASSANDRA_BACKEND=$backend
runtime=${CASSANDRA_RUNTIME:-maven}
case "$runtime" in
  maven | docker) ;;
  *) die "CASSANDRA_RUNTIME must be maven (default) or docker (it is '$runtime')" ;;
esac
if [ -n "${CASSANDRA_CONTACT_POINTS:-}" ] && [ "$runtime" = docker ]; then
  die "CASSANDRA_RUNTIME=docker starts its own node: unset CASSANDRA_CONTACT_POINTS, or unset CASSANDRA_RUNTIME to use that node"
fi
if [ -z "${CASSANDRA_CONTACT_POINTS:-}" ] && [ "$runtime" = maven ] && [ "$backend" != cassandra ]; then
  die "the Maven runtime runs Apache Cassandra only: for $backend use CASSANDRA_RUNTIME=docker, or CASSANDRA_CONTACT_POINTS for a node you run"
fi

compose() { docker compose -f docker-compose.yml "$@"; }

# Starts the compose service of $backend and waits until its healthcheck passes. A service that is
# already running is reused (and left running); one started here is removed at exit.
docker_id=
docker_start() {
  command -v docker >/dev/null ||
    die "CASSANDRA_RUNTIME=docker needs Docker, and there is no docker command: install Docker Engine with the Compose plugin, or run without CASSANDRA_RUNTIME (Cassandra from Maven Central)"
  docker compose version >/dev/null 2>&1 ||
    die "CASSANDRA_RUNTIME=docker needs the Docker Compose plugin: 'docker compose version' fails"
  local info
  info=$(docker info 2>&1) ||
    die "CASSANDRA_RUNTIME=docker: the Docker engine does not answer: $(printf '%s' "$info" | tail -n 1)"
  docker_id=$(compose ps --quiet --status running "$backend")
  if [ -n "$docker_id" ]; then
    printf '[test.sh] the %s service is already running; reusing it\n' "$backend" >&2
  else
    started_here=1
    compose up --detach "$backend"
    docker_id=$(compose ps --all --quiet "$backend")
  fi
  local timeout=${CASSANDRA_START_TIMEOUT:-300} state
  local deadline=$((SECONDS + timeout))
  while :; do
    state=$(docker inspect --format '{{.State.Status}}/{{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}' "$docker_id")
    case "$state" in
      running/healthy) break ;;
      running/starting) ;;
      */none) die "the $backend service has no healthcheck in docker-compose.yml" ;;
      *) die "the $backend container is $state" ;;
    esac
    [ "$SECONDS" -lt "$deadline" ] || die "the $backend service was not healthy within $timeout s"
    sleep 3
  done
  local published
  published=$(compose port "$backend" 9042) # e.g. 0.0.0.0:9043
  export CASSANDRA_CONTACT_POINTS="127.0.0.1:${published##*:}"
}

started_here=0
secure_started_here=0
older_started_here=0
dcs_started_here=0
ring_started_here=0
ring_nodes=
cleanup() {
  local rc=$?
  if [ "$ring_started_here" = 1 ] && [ -z "${KEEP_CASSANDRA:-}" ]; then
    for i in $ring_nodes; do scripts/cassandra.sh stop "$i"; done
  fi
  if [ "$secure_started_here" = 1 ] && [ -z "${KEEP_CASSANDRA:-}" ]; then scripts/cassandra.sh stop 9; fi
  if [ "$older_started_here" = 1 ] && [ -z "${KEEP_CASSANDRA:-}" ]; then scripts/cassandra.sh stop 5; fi
  if [ "$dcs_started_here" = 1 ] && [ -z "${KEEP_CASSANDRA:-}" ]; then
    scripts/cassandra.sh stop 6
    scripts/cassandra.sh stop 7
  fi
  if [ -n "$docker_id" ] && [ "$rc" != 0 ]; then
    printf '[test.sh] failed; the last lines of the %s container log:\n' "$backend" >&2
    compose logs --tail 60 "$backend" >&2 || true
  fi
  if [ "$started_here" = 1 ] && [ -z "${KEEP_CASSANDRA:-}" ]; then
    if [ "$runtime" = docker ]; then
      compose rm --stop --force --volumes "$backend"
      # `rm` leaves the project's network behind. `down` removes it (and no named volumes), but
      # it takes every service of the project with it: only when no other container of the
      # project (one this script did not start) is left.
      if [ -z "$(compose ps --all --quiet)" ]; then
        compose down
      fi
    else
      scripts/cassandra.sh stop
    fi
  fi
}
trap cleanup EXIT

if [ -z "${CASSANDRA_CONTACT_POINTS:-}" ] && [ "$runtime" = docker ]; then
  step "starting the $backend service of docker-compose.yml"
  docker_start
elif [ -z "${CASSANDRA_CONTACT_POINTS:-}" ]; then
  # (No `| grep -q`: with pipefail, grep closing the pipe early would read as "down".)
  status=$(scripts/cassandra.sh status)
  if [[ "$status" != *"node 1: up"* ]]; then
    step "starting Cassandra"
    scripts/cassandra.sh start 1
    started_here=1
  fi
  export CASSANDRA_CONTACT_POINTS=127.0.0.1:9042
fi

step "cargo fmt --all --check"
cargo fmt --all --check
step "actionlint (.github/workflows)"
scripts/actionlint.sh
step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings
step "cargo clippy --workspace --all-targets --all-features -- -D warnings (rustls, metrics)"
cargo clippy --workspace --all-targets --all-features -- -D warnings
# `--all-targets` leaves out the test targets with `test = false` (the ring stages' suites).
cargo clippy --test three_nodes --test two_dcs -- -D warnings
step "cargo doc --workspace --no-deps --all-features (as docs.rs builds it)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features --quiet
step "cargo publish --workspace --dry-run (each crate packaged, and its package built)"
# The CLI and rio crates depend on the library's version that is not on crates.io yet: publishing
# the workspace's crates together (cargo 1.90 or later) builds each package against the packages
# of the others (a local registry overlay). --allow-dirty: the working tree is checked, committed
# or not. Needs the crates.io index.
# Cargo treats a registry package of a given version as immutable, and the overlay is one: it
# reuses the copy it unpacked under $CARGO_HOME/registry/src/-<hash>/ and the library it built
# from it, so a second run would build the CLI and rio packages against the library as it was the
# first time. So the check builds in a target directory of its own (warm after its first run,
# which builds the dependencies once more with each package's own features), where our crates are
# forgotten before each run, and our crates' unpacked copies are removed (only local-registry
# sources: crates.io's are under index.crates.io-*).
package_target=target/package-check
rm -rf "$package_target"/debug/.fingerprint/cassandra-membership-* \
  "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/cassandra-membership-*[0-9]
CARGO_TARGET_DIR=$package_target cargo publish --workspace --dry-run --allow-dirty --quiet
# The TLS module runs in its own stage below (one test thread, its own node); with the CLI in the
# workspace the library is built with rustls here too, so it is skipped here, not run twice.
skip=(-- --skip secure::)
if [ "$backend" = scylla ]; then
  # Named here and counted as filtered out by cargo, never as passed: they pin Apache Cassandra
  # behaviour that ScyllaDB does not share (each says why).
  step "note: CASSANDRA_BACKEND=scylla excludes the Cassandra-only tests (cassandra_only::), not run:"
  excluded=$(cargo test --quiet --test cassandra -- --list cassandra_only:: | sed -n 's/^\(.*\): test$/    \1/p')
  printf '%s\n' "${excluded:-    (none)}"
  skip+=(--skip cassandra_only::)
fi
step "cargo test ($backend at $CASSANDRA_CONTACT_POINTS)"
# The Cassandra tests mostly wait (on Paxos rounds and on TTLs): run more of them at once than cores.
export RUST_TEST_THREADS=${RUST_TEST_THREADS:-8}
# The CLI's tests run the built binary against the same node (keyspace cm_cli_test).
cargo test --workspace --lib --bins --tests ${skip[@]+"${skip[@]}"}
cargo test --workspace --doc
step "metrics: what a recorder receives (feature metrics)"
cargo test --features metrics --test metrics
step "rio adapter: the three-server example"
cargo run -p cassandra-membership-rio --example rio_cluster
step "TLS and authentication (a node on 127.0.0.9 that speaks only TLS and asks for a password)"
# Whatever the runtime of the main node, this one runs from Maven on Java 17 (or set
# CASSANDRA_SECURE_CONTACT_POINT and CASSANDRA_SECURE_CERT to a node of yours configured alike).
if [ -z "${CASSANDRA_SECURE_CONTACT_POINT:-}" ]; then
  status=$(scripts/cassandra.sh status)
  if [[ "$status" != *"node 9: up"* ]]; then
    scripts/cassandra.sh start-secure
    secure_started_here=1
  fi
fi
# One thread: the log-capture test installs a thread-scoped tracing subscriber, and tracing's
# per-callsite interest cache is shared with whatever other test threads log at the same time.
cargo test --features rustls --test cassandra secure:: -- --test-threads 1
# The CLI over TLS (--tls-ca, --tls-server-name, the [tls] section) and its exit codes there.
cargo test -p cassandra-membership-cli --test secure
if [ "$secure_started_here" = 1 ] && [ -z "${KEEP_CASSANDRA:-}" ]; then
  # Two cores: the ring below needs the room.
  scripts/cassandra.sh stop 9
  secure_started_here=0
fi
step "older releases: Apache Cassandra 4.0 and 4.1, one node on 127.0.0.5, the tests of what differs"
# 4.x runs on Java 11 (installed by cassandra.sh on first use): the heartbeat-cell cleanup
# (expiry::leftovers), the contract (conformance), TTL
# expiry (expiry::contract), the runtime on the node (runtime::), the tombstone cliff's typed error and
# warning count (tombstones::: how each release words them) and the release check (smoke) run on
# each; all else runs on 5.0 above (the whole one-node suite passes on 4.1.10 when run by hand).
for release in ${CASSANDRA_OLDER_RELEASES-4.0.19 4.1.10}; do
  if (exec 3<>/dev/tcp/127.0.0.5/9042) 2>/dev/null; then
    die "a node this script did not start answers on 127.0.0.5:9042: stop it (the older releases run there)"
  fi
  older_started_here=1
  CASSANDRA_VERSION=$release CASSANDRA_PAXOS_VARIANT=v1 CASSANDRA_FIRST_NODE=5 CASSANDRA_HEAP=768M \
    scripts/cassandra.sh start 1
  # Apache Cassandra whatever the main stage's backend; `runtime::` (not `runtime_fencing::`).
  CASSANDRA_BACKEND=cassandra CASSANDRA_VERSION=$release CASSANDRA_CONTACT_POINTS=127.0.0.5:9042 \
    cargo test --test cassandra -- smoke:: conformance:: expiry::leftovers:: expiry::contract:: runtime:: tombstones::
  scripts/cassandra.sh stop 5
  older_started_here=0
done
# Apache Cassandra from Maven whatever the main stage's runtime and release (like the TLS node):
# CASSANDRA_TWO_DCS_VERSION (default 5.0.9; empty skips the stage).
dcs_version=${CASSANDRA_TWO_DCS_VERSION-5.0.9}
if [ -z "$dcs_version" ]; then
  step "two data centres: skipped (CASSANDRA_TWO_DCS_VERSION is empty)"
else
  step "two data centres ($dcs_version): dc1 on 127.0.0.6, dc2 on 127.0.0.7, keyspaces replicated once to each"
  for i in 6 7; do
    if (exec 3<>"/dev/tcp/127.0.0.$i/9042") 2>/dev/null; then
      die "a node this script did not start answers on 127.0.0.$i:9042: stop it (the two-DC ring runs there)"
    fi
  done
  dcs_started_here=1
  CASSANDRA_VERSION=$dcs_version CASSANDRA_PAXOS_VARIANT=v1 CASSANDRA_FIRST_NODE=6 CASSANDRA_HEAP=768M \
    scripts/cassandra.sh start-dcs dc1 dc2
  # local_datacenter honoured by every statement (server-side tracing), the race of one DC's silos,
  # initialize's checks, and dc2 down (local_quorum keeps working, quorum answers typed errors).
  # The release and heap also for the node the outage test restarts (`cassandra.sh restart`).
  CASSANDRA_VERSION=$dcs_version CASSANDRA_FIRST_NODE=6 CASSANDRA_HEAP=768M \
    cargo test --test two_dcs -- --test-threads 1 --nocapture
  # dc2 down: the contract, TTL expiry and the runtime, for clusters of dc1 on local_quorum.
  scripts/cassandra.sh kill 7
  CASSANDRA_BACKEND=cassandra CASSANDRA_VERSION=$dcs_version CASSANDRA_CONTACT_POINTS=127.0.0.6:9042,127.0.0.7:9042 \
    CASSANDRA_LOCAL_DC=dc1 CASSANDRA_DC_REPLICATION=dc1:1,dc2:1 cargo test --test cassandra -- conformance:: expiry::contract:: runtime::
  scripts/cassandra.sh stop 6
  scripts/cassandra.sh stop 7
  dcs_started_here=0
fi
step "three nodes, replication factor 3: the contract, then the fault suite, once per Paxos variant"
# 127.0.0.1–3 as CONTRIBUTING.md says; with Docker the compose node's ports are published on 127.0.0.1,
# so the ring moves to 127.0.0.4–6 (CASSANDRA_RING_FIRST_NODE chooses).
if [ "$runtime" = docker ]; then ring_first=${CASSANDRA_RING_FIRST_NODE:-4}; else ring_first=${CASSANDRA_RING_FIRST_NODE:-1}; fi
if [ "$ring_first" = 1 ] && [ "$started_here" = 1 ] && [ "$runtime" = maven ]; then
  # The one-node stage's node holds 127.0.0.1: make room for the ring.
  scripts/cassandra.sh stop 1
  started_here=0
fi
ring_nodes="$ring_first $((ring_first + 1)) $((ring_first + 2))"
ring=$(for i in $ring_nodes; do printf '127.0.0.%s:9042,' "$i"; done)
ring=${ring%,}
# Apache Cassandra 5.0.9 whatever the main stage's release (CASSANDRA_VERSION), since Paxos v2
# needs 4.1 or later; CASSANDRA_RING_VERSION chooses. The fault suite gets it too: its restarts
# (`scripts/cassandra.sh restart I`) pick the jars by CASSANDRA_VERSION.
ring_version=${CASSANDRA_RING_VERSION:-5.0.9}
# The model-based property test compares each concurrent group's answers with the sequential model
# and so needs definite answers; on a ring, dueling Paxos rounds may honestly answer OutcomeUnknown.
# Concurrency on the ring is judged by the fault suite's linearizability checker instead, which
# allows unknown outcomes. Named here, filtered out by cargo, never counted as passed.
printf '[test.sh] on three nodes, not run: conformance::behaves_like_the_sequential_model (see above), and conformance::whole_value:: (the ScyllaDB condition form: its statements, not the ring, differ; it runs on one node)\n'
ring_variants=${CASSANDRA_RING_PAXOS_VARIANTS-v1 v2}
[ -n "$ring_variants" ] || printf '[test.sh] CASSANDRA_RING_PAXOS_VARIANTS is empty: the three-node stage runs nothing\n'
for variant in $ring_variants; do
  case "$variant" in
    v1 | v2) ;;
    *) die "CASSANDRA_RING_PAXOS_VARIANTS lists Paxos variants, v1 and/or v2 (it has '$variant')" ;;
  esac
  step "three nodes: Apache Cassandra $ring_version, Paxos $variant"
  # A fresh ring per variant (a fresh start wipes the nodes' data; a node still answering would
  # be reused with the variant it runs): the previous variant's ring goes first, even with
  # KEEP_CASSANDRA. The last one is left to the cleanup at exit.
  if [ "$ring_started_here" = 1 ]; then
    for i in $ring_nodes; do scripts/cassandra.sh stop "$i"; done
    ring_started_here=0
  fi
  if (exec 3<>"/dev/tcp/127.0.0.$ring_first/9042") 2>/dev/null; then
    die "a node this script did not start answers on 127.0.0.$ring_first:9042: stop it, or put the ring elsewhere (CASSANDRA_RING_FIRST_NODE=4 uses 127.0.0.4–6)"
  fi
  ring_started_here=1
  CASSANDRA_VERSION=$ring_version CASSANDRA_PAXOS_VARIANT=$variant CASSANDRA_FIRST_NODE=$ring_first \
    CASSANDRA_HEAP=${CASSANDRA_RING_HEAP:-768M} scripts/cassandra.sh start 3
  CASSANDRA_BACKEND=cassandra CASSANDRA_VERSION=$ring_version CASSANDRA_CONTACT_POINTS=$ring CASSANDRA_RF=3 \
    cargo test --test cassandra conformance:: -- --skip conformance::behaves_like_the_sequential_model \
      --skip conformance::whole_value::
  # The nemesis scenarios run in the stage below, inside a network namespace of their own.
  CASSANDRA_VERSION=$ring_version CASSANDRA_FIRST_NODE=$ring_first \
    cargo test --test three_nodes -- --test-threads 1 --nocapture --skip nemesis::
done
if [ "$ring_started_here" = 1 ] && [ -z "${KEEP_CASSANDRA:-}" ]; then
  # Two cores: the nemesis ring below needs the room.
  for i in $ring_nodes; do scripts/cassandra.sh stop "$i"; done
  ring_started_here=0
fi
step "nemeses: partitions, loss and clock skew on a ring in a network namespace (the CI subset)"
# Needs root (a network namespace, iptables in it); installs iptables and faketime if missing.
# The whole set, on both Paxos variants: scripts/nemesis.sh (README "Faults").
# On the Paxos variants of the three-node stage (none: no nemesis stage either).
if [ "${CASSANDRA_NEMESIS:-1}" = 0 ]; then
  printf '[test.sh] CASSANDRA_NEMESIS=0: the nemesis stage is not run\n'
elif [ -z "$ring_variants" ]; then
  printf '[test.sh] CASSANDRA_RING_PAXOS_VARIANTS is empty: the nemesis stage runs nothing\n'
else
  CASSANDRA_RING_VERSION=$ring_version CASSANDRA_NEMESIS_PAXOS_VARIANTS=$ring_variants \
    scripts/nemesis.sh --subset
fi
step "benchmarks compile"
cargo bench --no-run --quiet
step "done"

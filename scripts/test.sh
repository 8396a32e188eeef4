#!/usr/bin/env bash
# The whole test suite of the workspace (the library, the CLI in cli/, the rio adapter in
# integrations/rio): lints (actionlint on the CI workflow among them), docs, the package check,
# unit and in-memory tests, and every Cassandra test against real nodes:
#
#   scripts/test.sh                   Apache Cassandra 5.0 that this script starts (downloading it
#                                     from Maven Central the first time), or reuses on 127.0.0.1:9042
#   scripts/test.sh --quick           the development loop: formatting, clippy and the one-node
#                                     suite (unit, in-memory, Cassandra, CLI, rio), nothing else
#   CASSANDRA_RUNTIME=docker scripts/test.sh
#                                     the docker-compose.yml service of CASSANDRA_BACKEND: started,
#                                     awaited (healthcheck), and removed afterwards
#   CASSANDRA_CONTACT_POINTS=host:port scripts/test.sh
#                                     a node you run
#
# CASSANDRA_BACKEND=cassandra (default) or scylla says what the node is; for scylla the
# Cassandra-only tests (tests/cassandra/cassandra_only.rs) are excluded by name, and listed.
# KEEP_CASSANDRA=1 leaves the nodes this script started running.
# Fails loudly if a node cannot be started (or Docker is missing); never skips Cassandra tests.
#
# How it spends its minutes: everything is compiled first (once, with every feature, so each
# later stage reuses the same test binaries), then the stages that mostly wait for Cassandra run
# side by side as lanes, each on loopback addresses of its own (CONTRIBUTING.md, "The test
# command"): at most CM_TEST_LANES (default 3) at a time. Each lane's output is
# printed whole when it ends (and in target/test-logs/); a table of every stage's seconds closes
# the run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

lane=${CM_TEST_LANE:-main}
die() { printf '[test.sh] %s\n' "$*" >&2; exit 1; }

# One flag set for every cargo test run, so that every stage reuses the binaries built once.
# --workspace: feature unification over all three crates, whichever binary a stage runs.
cargo_test=(cargo test --workspace --all-features)

# ---------------------------------------------------------------------------------------------
# Stage timing: each stage's lane, name, start (seconds into the run), seconds and result.
times=${CM_TEST_TIMES:-}
run_start=${CM_TEST_START:-$EPOCHSECONDS}
cur_stage='' cur_start=0
stage_done() {
  if [ -n "$cur_stage" ] && [ -n "$times" ]; then
    printf '%s\t%s\t%d\t%d\t%s\n' "$lane" "$cur_stage" $((cur_start - run_start)) \
      $((EPOCHSECONDS - cur_start)) "$1" >>"$times"
  fi
  cur_stage=''
}
stage() {
  stage_done ok
  cur_stage=$*
  cur_start=$EPOCHSECONDS
  printf '\n==> [%s] %s (%ds)\n' "$lane" "$*" $((EPOCHSECONDS - run_start))
}

# ---------------------------------------------------------------------------------------------
# Nodes a lane started, stopped when it exits (unless KEEP_CASSANDRA).
started_nodes=()
start_nodes() { # NODE... -- then the cassandra.sh command (env assignments allowed before it)
  local nodes=()
  while [ "$1" != -- ]; do nodes+=("$1"); shift; done
  shift
  for i in "${nodes[@]}"; do
    if (exec 3<>"/dev/tcp/127.0.0.$i/9042") 2>/dev/null; then
      die "a node this script did not start answers on 127.0.0.$i:9042: stop it (lane $lane runs a node there)"
    fi
  done
  started_nodes+=("${nodes[@]}")
  env "$@"
}
stop_nodes() {
  local i
  for i in "$@"; do scripts/cassandra.sh stop "$i"; done
  local keep=()
  for i in ${started_nodes[@]+"${started_nodes[@]}"}; do
    [[ " $* " == *" $i "* ]] || keep+=("$i")
  done
  started_nodes=(${keep[@]+"${keep[@]}"})
}
lane_exit() {
  local rc=$?
  if [ "$rc" = 0 ]; then stage_done ok; else stage_done FAILED; fi
  if [ -z "${KEEP_CASSANDRA:-}" ]; then
    for i in ${started_nodes[@]+"${started_nodes[@]}"}; do scripts/cassandra.sh stop "$i" || true; done
  fi
  exit "$rc"
}

# ---------------------------------------------------------------------------------------------
# The lanes. Each runs as its own process (`CM_TEST_LANE=name scripts/test.sh`), in its own
# process group, with the environment the main run exported.

# The tests that run beside others' nodes use these addresses (none is 127.0.0.4–6: the nemesis
# namespace's nodes keep their data where cassandra.sh keeps nodes 4–6).
older_node=8 dcs_first=11 tls_node=9
ring_first=${CASSANDRA_RING_FIRST_NODE:-13}
ring_version=${CASSANDRA_RING_VERSION:-5.0.9}
# The examples, built once with the test binaries (the fault suite's silo hosts among them), in
# the target directory cargo itself reports (CARGO_TARGET_DIR, a config's build.target-dir).
if [ -z "${CM_TEST_TARGET_DIR:-}" ]; then
  CM_TEST_TARGET_DIR=$(cargo metadata --format-version 1 --no-deps |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
  [ -n "$CM_TEST_TARGET_DIR" ] || die "cargo metadata names no target directory"
  export CM_TEST_TARGET_DIR
fi
examples=$CM_TEST_TARGET_DIR/debug/examples
export SILO_HOST_BIN=$examples/silo_host

skip_args() { # the tests the one-node run leaves out on this backend
  skip=(--skip secure::)
  if [ "$CASSANDRA_BACKEND" = scylla ]; then skip+=(--skip cassandra_only::); fi
}

lane_one_node() {
  skip_args
  stage "one-node suite: unit, in-memory, Cassandra, CLI, rio, metrics ($CASSANDRA_BACKEND at $CASSANDRA_CONTACT_POINTS)"
  # The Cassandra tests mostly wait (on Paxos rounds and on TTLs): more threads than cores.
  # --no-fail-fast: a failing binary must not hide the others' results (the lane still fails).
  RUST_TEST_THREADS=${RUST_TEST_THREADS:-8} "${cargo_test[@]}" --no-fail-fast --lib --bins --tests -- "${skip[@]}"
  stage "doc tests"
  "${cargo_test[@]}" --doc
  stage "rio adapter: the three-server example"
  "$examples/rio_cluster"
  if [ "${CM_TEST_NODE1_STARTED:-0}" = 1 ] && [ -z "${KEEP_CASSANDRA:-}" ]; then
    # Nothing else uses the main node: its core share goes to the other lanes.
    scripts/cassandra.sh stop 1
  fi
}

lane_tls() {
  stage "TLS and authentication (127.0.0.$tls_node: TLS only, a password asked)"
  # Whatever the runtime of the main node, this one runs from Maven on Java 17 (or set
  # CASSANDRA_SECURE_CONTACT_POINT and CASSANDRA_SECURE_CERT to a node of yours configured alike).
  if [ -z "${CASSANDRA_SECURE_CONTACT_POINT:-}" ]; then
    start_nodes "$tls_node" -- scripts/cassandra.sh start-secure
  fi
  "${cargo_test[@]}" --test cassandra secure::
  # The CLI over TLS (--tls-ca, --tls-server-name, the [tls] section) and its exit codes there; the
  # printed grants (secure/grants.rs) against this node's CassandraAuthorizer.
  "${cargo_test[@]}" --test secure
}

lane_older() {
  # 4.x runs on Java 11 (installed by cassandra.sh on first use): the heartbeat-cell cleanup
  # (expiry::leftovers), the contract (conformance), TTL expiry (expiry::contract), the runtime on
  # the node (runtime::), the tombstone cliff's typed error and warning count (tombstones::: how
  # each release words them) and the release check (smoke) run on each; all else runs on 5.0
  # (the whole one-node suite passes on 4.1.10 when run by hand).
  local release
  for release in ${CASSANDRA_OLDER_RELEASES-4.0.19 4.1.10}; do
    stage "older release $release (127.0.0.$older_node): the tests of what differs"
    start_nodes "$older_node" -- CASSANDRA_VERSION="$release" CASSANDRA_PAXOS_VARIANT=v1 \
      CASSANDRA_FIRST_NODE="$older_node" CASSANDRA_HEAP=768M scripts/cassandra.sh start 1
    # Apache Cassandra whatever the main stage's backend; `runtime::` (not `runtime_fencing::`).
    CASSANDRA_BACKEND=cassandra CASSANDRA_VERSION=$release CASSANDRA_CONTACT_POINTS=127.0.0.$older_node:9042 \
      "${cargo_test[@]}" --test cassandra -- smoke:: conformance:: expiry::leftovers:: expiry::contract:: \
      runtime:: tombstones::
    stop_nodes "$older_node"
  done
}

lane_dcs() {
  # Apache Cassandra from Maven whatever the main stage's runtime and release (like the TLS
  # node): CASSANDRA_TWO_DCS_VERSION (default 5.0.9; empty skips the stage).
  local version=${CASSANDRA_TWO_DCS_VERSION-5.0.9} dc2=$((dcs_first + 1))
  if [ -z "$version" ]; then
    stage "two data centres: skipped (CASSANDRA_TWO_DCS_VERSION is empty)"
    return
  fi
  stage "two data centres ($version): dc1 on 127.0.0.$dcs_first, dc2 on 127.0.0.$dc2"
  start_nodes "$dcs_first" "$dc2" -- CASSANDRA_VERSION="$version" CASSANDRA_PAXOS_VARIANT=v1 \
    CASSANDRA_FIRST_NODE="$dcs_first" CASSANDRA_HEAP=768M scripts/cassandra.sh start-dcs dc1 dc2
  # serial_datacenter honoured by every statement (server-side tracing), the race of one DC's
  # silos, initialize's checks, and dc2 down (local_quorum keeps working, quorum answers typed
  # errors). The release and heap also for the node the outage test restarts.
  CASSANDRA_VERSION=$version CASSANDRA_FIRST_NODE=$dcs_first CASSANDRA_HEAP=768M \
    "${cargo_test[@]}" --test two_dcs -- --test-threads 1 --nocapture
  stage "two data centres, dc2 down: the contract, TTL expiry and the runtime on local_quorum"
  scripts/cassandra.sh kill "$dc2"
  CASSANDRA_BACKEND=cassandra CASSANDRA_VERSION=$version \
    CASSANDRA_CONTACT_POINTS=127.0.0.$dcs_first:9042,127.0.0.$dc2:9042 CASSANDRA_LOCAL_DC=dc1 \
    CASSANDRA_DC_REPLICATION=dc1:1,dc2:1 "${cargo_test[@]}" --test cassandra -- conformance:: \
    expiry::contract:: runtime::
  stop_nodes "$dcs_first" "$dc2"
}

lane_ring() { # $1 = Paxos variant, $2 = the ring's first node
  local variant=$1 first=$2
  local ring="127.0.0.$first:9042,127.0.0.$((first + 1)):9042,127.0.0.$((first + 2)):9042"
  stage "three nodes (Paxos $variant, 127.0.0.$first–$((first + 2))): starting the ring"
  start_nodes "$first" $((first + 1)) $((first + 2)) -- CASSANDRA_VERSION="$ring_version" \
    CASSANDRA_PAXOS_VARIANT="$variant" CASSANDRA_FIRST_NODE="$first" \
    CASSANDRA_HEAP="${CASSANDRA_RING_HEAP:-768M}" scripts/cassandra.sh start 3
  stage "three nodes (Paxos $variant): the contract on replication factor 3"
  # The model-based property test compares each concurrent group's answers with the sequential
  # model and so needs definite answers; on a ring, dueling Paxos rounds may honestly answer
  # OutcomeUnknown. Concurrency on the ring is judged by the fault suite's linearizability checker
  # instead, which allows unknown outcomes. The ScyllaDB condition form (whole_value::) differs
  # in its statements, not its replication: it runs on one node and two DCs.
  CASSANDRA_BACKEND=cassandra CASSANDRA_VERSION=$ring_version CASSANDRA_CONTACT_POINTS=$ring CASSANDRA_RF=3 \
    "${cargo_test[@]}" --test cassandra conformance:: -- \
    --skip conformance::behaves_like_the_sequential_model --skip conformance::whole_value::
  stage "three nodes (Paxos $variant): the fault suite"
  # The nemesis scenarios run in their own lane, inside a network namespace of their own.
  CASSANDRA_VERSION=$ring_version CASSANDRA_FIRST_NODE=$first \
    "${cargo_test[@]}" --test three_nodes -- --test-threads 1 --nocapture --skip nemesis::
}

lane_nemesis() {
  stage "nemeses: partitions, loss and clock skew on a ring in a network namespace (the CI subset)"
  # Needs root (a network namespace, iptables in it); installs iptables and faketime if missing.
  # The whole set, on both Paxos variants: scripts/nemesis.sh (README "Faults").
  CASSANDRA_RING_VERSION=$ring_version CASSANDRA_NEMESIS_PAXOS_VARIANTS=$1 scripts/nemesis.sh --subset
}

if [ "$lane" != main ]; then
  trap lane_exit EXIT
  # A lane stopped by the main run (or CI) exits non-zero, so its unfinished stage reads FAILED.
  trap 'exit 143' TERM INT
  case "$lane" in
    one-node) lane_one_node; lane_tls ;;
    older) lane_older; lane_dcs ;;
    ring-v1 | ring-v2) lane_ring "${lane#ring-}" "$CM_TEST_RING_FIRST" ;;
    nemesis) lane_nemesis "$CM_TEST_NEMESIS_VARIANTS" ;;
    *) die "no lane '$lane'" ;;
  esac
  exit 0
fi

# ---------------------------------------------------------------------------------------------
# The main run.
quick=0
case "${1:-}" in
  --quick) quick=1 ;;
  '') ;;
  *) die "usage: scripts/test.sh [--quick]" ;;
esac

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
ring_variants=${CASSANDRA_RING_PAXOS_VARIANTS-v1 v2}
for variant in $ring_variants; do
  case "$variant" in
    v1 | v2) ;;
    *) die "CASSANDRA_RING_PAXOS_VARIANTS lists Paxos variants, v1 and/or v2 (it has '$variant')" ;;
  esac
done
ring_last=$((ring_first + 5))
if [ "$ring_first" -le 12 ] && [ "$ring_last" -ge 1 ]; then
  die "CASSANDRA_RING_FIRST_NODE=$ring_first: the rings need 127.0.0.13 or above (1 is the main node, 4-6 the nemesis ring's directories, 8, 9 and 11-12 other lanes')"
fi
[ "$ring_last" -le 254 ] || die "CASSANDRA_RING_FIRST_NODE=$ring_first: the rings need six addresses up to 127.0.0.254"
lanes_at_once=${CM_TEST_LANES:-3}
[[ "$lanes_at_once" =~ ^[1-9]$ ]] || die "CM_TEST_LANES must be 1 to 9 (it is '$lanes_at_once')"

logs=target/test-logs
rm -rf "$logs" && mkdir -p "$logs"
export CM_TEST_TIMES="$PWD/$logs/stages.tsv" CM_TEST_START=$run_start
times=$CM_TEST_TIMES
: >"$times"

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
node_start_pid=
declare -A lane_pid=()
print_stage_table() {
  printf '\n[test.sh] stage seconds (lanes ran side by side; start = seconds into the run):\n'
  printf '  %-10s %6s %6s  %-7s %s\n' lane start secs result stage
  sort -t $'\t' -k3,3n "$times" | while IFS=$'\t' read -r l name start secs result; do
    printf '  %-10s %6d %6d  %-7s %s\n' "$l" "$start" "$secs" "$result" "$name"
  done
  printf '  total: %d s\n' $((EPOCHSECONDS - run_start))
}
main_exit() {
  local rc=$?
  if [ "$rc" = 0 ]; then stage_done ok; else stage_done FAILED; fi
  # Lanes still running (a failure or an interrupt of the main run): stopped, their logs shown.
  local name
  for name in "${!lane_pid[@]}"; do
    if kill -0 "${lane_pid[$name]}" 2>/dev/null; then
      kill -TERM -- "-${lane_pid[$name]}" 2>/dev/null || true
      printf '\n[test.sh] lane %s stopped unfinished; the end of its log:\n' "$name" >&2
      tail -n 40 "$logs/$name.log" >&2 || true
    fi
  done
  wait 2>/dev/null || true
  print_stage_table
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
      scripts/cassandra.sh stop 1
    fi
  fi
  # The run's closing line: every lane's tests added up.
  if [ -n "${totals:-}" ]; then printf 'tests: %s\n' "$totals"; fi
  exit "$rc"
}
trap main_exit EXIT

# The main node starts while everything compiles (Maven and Docker alike).
if [ -z "${CASSANDRA_CONTACT_POINTS:-}" ] && [ "$runtime" = docker ]; then
  stage "starting the $backend service of docker-compose.yml"
  docker_start
elif [ -z "${CASSANDRA_CONTACT_POINTS:-}" ]; then
  # (No `| grep -q`: with pipefail, grep closing the pipe early would read as "down".)
  status=$(scripts/cassandra.sh status)
  if [[ "$status" != *"node 1: up"* ]]; then
    started_here=1
    export CM_TEST_NODE1_STARTED=1
    scripts/cassandra.sh start 1 >"$logs/node1-start.log" 2>&1 &
    node_start_pid=$!
  fi
  export CASSANDRA_CONTACT_POINTS=127.0.0.1:9042
fi

stage "cargo fmt --all --check"
cargo fmt --all --check
if [ "$quick" = 0 ]; then
  stage "actionlint (.github/workflows)"
  scripts/actionlint.sh
fi
stage "cargo clippy --workspace --all-targets -- -D warnings (default features)"
cargo clippy --workspace --all-targets -- -D warnings
stage "cargo clippy --workspace --all-targets --all-features -- -D warnings (rustls, metrics)"
# `--all-targets` leaves out the test targets with `test = false` (the ring stages' suites).
cargo clippy --workspace --all-targets --all-features -- -D warnings
cargo clippy --workspace --all-features --test three_nodes --test two_dcs -- -D warnings
if [ "$quick" = 0 ]; then
  stage "cargo doc --workspace --no-deps --all-features (as docs.rs builds it)"
  RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features --quiet
  stage "cargo publish --workspace --dry-run (each crate packaged, and its package built)"
  # The CLI and rio crates depend on the library's version that is not on crates.io yet:
  # publishing the workspace's crates together (cargo 1.90 or later) builds each package against
  # the packages of the others (a local registry overlay). --allow-dirty: the working tree is
  # checked, committed or not. Needs the crates.io index.
  # Cargo treats a registry package of a given version as immutable, and the overlay is one: it
  # reuses the copy it unpacked under $CARGO_HOME/registry/src/-<hash>/ and the library it built
  # from it, so a second run would build the CLI and rio packages against the library as it was
  # the first time. So the check builds in a target directory of its own (warm after its first
  # run, which builds the dependencies once more with each package's own features), where our
  # crates are forgotten before each run, and our crates' unpacked copies are removed (only
  # local-registry sources: crates.io's are under index.crates.io-*).
  package_target=$CM_TEST_TARGET_DIR/package-check
  rm -rf "$package_target"/debug/.fingerprint/cassandra-membership-* \
    "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/cassandra-membership-*[0-9]
  CARGO_TARGET_DIR=$package_target cargo publish --workspace --dry-run --allow-dirty --quiet
  stage "benchmarks compile"
  cargo bench --no-run --quiet
fi
stage "compiling every test binary (once, all features)"
if [ "$quick" = 0 ]; then
  "${cargo_test[@]}" --no-run --quiet --lib --bins --tests --test three_nodes --test two_dcs
  cargo build --quiet --workspace --all-features --examples
else
  "${cargo_test[@]}" --no-run --quiet --lib --bins --tests
fi
if [ -n "$node_start_pid" ]; then
  stage "waiting for the Cassandra node on 127.0.0.1"
  wait "$node_start_pid" || { cat "$logs/node1-start.log" >&2; die "node 1 did not start"; }
fi
if [ "$backend" = scylla ]; then
  # Named here and counted as filtered out by cargo, never as passed: they pin Apache Cassandra
  # behaviour that ScyllaDB does not share (each says why).
  stage "note: CASSANDRA_BACKEND=scylla excludes the Cassandra-only tests (cassandra_only::), not run:"
  excluded=$("${cargo_test[@]}" --quiet --test cassandra -- --list cassandra_only:: | sed -n 's/^\(.*\): test$/    \1/p')
  printf '%s\n' "${excluded:-    (none)}"
fi

if [ "$quick" = 1 ]; then
  CM_TEST_LANE=one-node
  lane=one-node
  skip_args
  stage "one-node suite ($backend at $CASSANDRA_CONTACT_POINTS)"
  RUST_TEST_THREADS=${RUST_TEST_THREADS:-8} "${cargo_test[@]}" --lib --bins --tests -- "${skip[@]}"
  lane=main
  stage "done (--quick: no docs, package check, TLS, older releases, two DCs, rings or nemeses)"
  stage_done ok
  exit 0
fi

# The lanes, at most $lanes_at_once at a time: the rings (the longest) and the one-node lane
# first; the nemesis ring in the first slot one of them frees (the one-node lane's, as it ends
# first; its clock-skew restarts under libfaketime are slow to start beside two other busy
# rings), then the older releases in the next.
queue=()
ring_no=0
for variant in $ring_variants; do
  queue+=("ring-$variant:$((ring_first + 3 * ring_no))")
  ring_no=$((ring_no + 1))
done
queue+=("one-node:")
if [ "${CASSANDRA_NEMESIS:-1}" = 0 ]; then
  printf '[test.sh] CASSANDRA_NEMESIS=0: the nemesis lane is not run\n'
elif [ -z "$ring_variants" ]; then
  printf '[test.sh] CASSANDRA_RING_PAXOS_VARIANTS is empty: no three-node and no nemesis lane\n'
else
  queue+=("nemesis:")
fi
queue+=("older:")
export CM_TEST_NEMESIS_VARIANTS=$ring_variants

failed=()
finish_lane() { # $1 = name: waits for it, prints its log
  local name=$1 rc=0
  wait "${lane_pid[$name]}" || rc=$?
  unset "lane_pid[$name]"
  printf '\n############ lane %s: %s (%ds into the run) ############\n' "$name" \
    "$([ "$rc" = 0 ] && echo passed || echo "FAILED (exit $rc)")" $((EPOCHSECONDS - run_start))
  cat "$logs/$name.log"
  printf '############ end of lane %s ############\n' "$name"
  [ "$rc" = 0 ] || failed+=("$name")
}
stage "lanes: ${queue[*]%%:*} (at most $lanes_at_once at a time)"
for entry in "${queue[@]}"; do
  name=${entry%%:*} first=${entry#*:}
  while [ "${#lane_pid[@]}" -ge "$lanes_at_once" ]; do
    wait -n "${lane_pid[@]}" 2>/dev/null || true
    for running in "${!lane_pid[@]}"; do
      kill -0 "${lane_pid[$running]}" 2>/dev/null || finish_lane "$running"
    done
  done
  printf '[test.sh] lane %s starts (%ds into the run)\n' "$name" $((EPOCHSECONDS - run_start))
  CM_TEST_LANE=$name CM_TEST_RING_FIRST=$first setsid scripts/test.sh >"$logs/$name.log" 2>&1 &
  lane_pid[$name]=$!
done
while [ "${#lane_pid[@]}" -gt 0 ]; do
  wait -n "${lane_pid[@]}" 2>/dev/null || true
  for running in "${!lane_pid[@]}"; do
    kill -0 "${lane_pid[$running]}" 2>/dev/null || finish_lane "$running"
  done
done
# Every test binary's closing line, in every lane, added up (the main run's own are in the lane
# logs too: nothing is compiled or tested outside a lane but the --no-run builds).
totals=$(cat "$logs"/*.log | sed -n 's/^test result: [A-Za-z]*\. \([0-9]*\) passed; \([0-9]*\) failed.*/\1 \2/p' |
  awk '{p += $1; f += $2} END {printf "%d passed, %d failed", p, f}')
if [ "${#failed[@]}" -gt 0 ]; then
  die "failed lanes: ${failed[*]} (their logs are above, and in $logs/)"
fi
stage_done ok
printf '[test.sh] every stage passed\n'

#!/usr/bin/env bash
# The nemesis suite (tests/three_nodes/nemesis.rs): partitions, loss and clock skew on a
# three-node ring that runs inside a network namespace this script creates for the run, on its
# own loopback (nodes 127.0.0.4–6, so nothing of a node on the host's 127.0.0.1–3 is touched).
# The tests add iptables rules there only; the namespace, its rules and its nodes are removed at
# exit, also when a test fails.
#
#   scripts/nemesis.sh            every scenario, on Paxos v1 and then v2 (README "Faults")
#   scripts/nemesis.sh --subset   the CI subset (scripts/test.sh): minority cut, one-way cut, a
#                                 clock ahead and a node lagging on a new keyspace, on each variant
#   scripts/nemesis.sh FILTER...  the scenarios whose test names contain a FILTER
#
# CASSANDRA_NEMESIS_PAXOS_VARIANTS (default "v1 v2") chooses the variants; CASSANDRA_RING_VERSION
# the release (default 5.0.9). Needs root (network namespaces, iptables); installs iptables and
# faketime from Debian's packages when they are missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

subset=
if [ "${1:-}" = --subset ]; then subset=1; shift; fi
# Anything else: test name filters (e.g. nemesis::a_node_whose_clock), instead of the whole set.
case "${1:-}" in -*) printf 'usage: %s [--subset] [TEST_FILTER...]\n' "$0" >&2; exit 2 ;; esac
die() { printf '[nemesis.sh] %s\n' "$*" >&2; exit 1; }
log() { printf '[nemesis.sh] %s\n' "$*" >&2; }

[ "$(id -u)" = 0 ] || die "needs root: it creates a network namespace and sets iptables rules in it"
if ! command -v iptables >/dev/null || [ ! -f /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 ]; then
  log "installing iptables and faketime (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q iptables faketime >/dev/null 2>&1 ||
    { apt-get update -q >/dev/null && apt-get install -y -q iptables faketime >/dev/null; } ||
    die "apt-get install iptables faketime failed"
fi
command -v setpriv >/dev/null || die "setpriv (util-linux) is missing: the nodes run with a group id each"

home=${CASSANDRA_MEMBERSHIP_HOME:-$HOME/.cache/cassandra-membership}
mkdir -p "$home"
# One run at a time: two would share nodes 4–6's directories.
exec 8>"$home/nemesis.lock"
flock -n 8 || die "another scripts/nemesis.sh runs (it holds $home/nemesis.lock)"
# A namespace an earlier run left (it was killed before its cleanup): its nodes, then itself.
for stale in $(ip netns list | awk '/^cm-nemesis-/ {print $1}'); do
  log "removing the namespace $stale an earlier run left"
  for pid in $(ip netns pids "$stale" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
  ip netns delete "$stale" || true
done
# The namespace's nodes keep their data where cassandra.sh keeps node 4–6's: a node of that
# number running outside the namespace (e.g. a ring on 127.0.0.4–6) would have its data wiped.
for i in 4 5 6; do
  if [ -f "$home/node$i/pid" ] && kill -0 "$(cat "$home/node$i/pid")" 2>/dev/null; then
    die "node $i runs (pid $(cat "$home/node$i/pid")): stop it first (scripts/cassandra.sh stop $i)"
  fi
done

version=${CASSANDRA_RING_VERSION:-5.0.9}
heap=${CASSANDRA_RING_HEAP:-768M}
variants=${CASSANDRA_NEMESIS_PAXOS_VARIANTS-v1 v2}
first=4
ns="cm-nemesis-$$"

# Built before entering the namespace (it has no route out; the build needs none, but cargo
# may want the index once).
cargo test --workspace --all-features --test three_nodes --no-run --quiet

in_ns() { ip netns exec "$ns" "$@"; }
cleanup() {
  local rc=$?
  if ip netns list | grep -qw "$ns"; then
    for i in $first $((first + 1)) $((first + 2)); do
      in_ns env CASSANDRA_VERSION="$version" scripts/cassandra.sh stop "$i" >/dev/null 2>&1 || true
    done
    # Whatever else still runs in it (nothing should), then the namespace and its rules.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns delete "$ns"
  fi
  exit "$rc"
}
trap cleanup EXIT
ip netns add "$ns"
in_ns ip link set lo up

if [ -n "$subset" ]; then
  filter=(nemesis::a_minority_node_cut_off nemesis::a_one_way_cut nemesis::a_node_whose_clock_runs_ahead
    nemesis::schema_race::)
elif [ $# -gt 0 ]; then
  filter=("$@")
else
  filter=(nemesis::)
fi
for variant in $variants; do
  case "$variant" in
    v1 | v2) ;;
    *) die "CASSANDRA_NEMESIS_PAXOS_VARIANTS lists v1 and/or v2 (it has '$variant')" ;;
  esac
  log "Paxos $variant: a three-node ring (Apache Cassandra $version) in network namespace $ns"
  for i in $first $((first + 1)) $((first + 2)); do
    in_ns env CASSANDRA_VERSION="$version" scripts/cassandra.sh stop "$i" >/dev/null 2>&1 || true
  done
  in_ns env CASSANDRA_VERSION="$version" CASSANDRA_PAXOS_VARIANT="$variant" CASSANDRA_FIRST_NODE=$first \
    CASSANDRA_HEAP="$heap" CASSANDRA_NODE_GIDS=1 scripts/cassandra.sh start 3
  t0=$SECONDS
  # The tests restart nodes (clock skew, heal) with the same heap and group ids.
  in_ns env CM_NEMESIS_NETNS="$ns" CASSANDRA_VERSION="$version" CASSANDRA_FIRST_NODE=$first \
    CASSANDRA_HEAP="$heap" CASSANDRA_NODE_GIDS=1 cargo test --workspace --all-features --test three_nodes -- --test-threads 1 --nocapture "${filter[@]}"
  log "Paxos $variant: the scenarios took $((SECONDS - t0)) s"
done

#!/usr/bin/env bash
# Benchmarks on a two-DC ring: each operation's latency per consistency profile (section "dcs").
#
#   scripts/bench-dcs.sh [DELAY]     DELAY: one-way delay added to every packet to dc2's node
#                                    (tc netem, e.g. 10ms; default 10ms; "none" adds nothing)
#
# Starts dc1 on 127.0.0.6 and dc2 on 127.0.0.7 (fresh data), runs
# `cargo bench --bench membership -- dcs`, keeps the report as bench-results/two-dcs.md, and stops
# the ring and removes the delay afterwards. The delay needs root and `tc`: a qdisc on `lo` whose
# filter matches only packets to 127.0.0.7, which nothing but this ring uses.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

delay=${1:-10ms}
for i in 6 7; do
  if (exec 3<>"/dev/tcp/127.0.0.$i/9042") 2>/dev/null; then
    echo "a node answers on 127.0.0.$i:9042: stop it first (scripts/cassandra.sh stop $i)" >&2
    exit 2
  fi
done
if [ "$delay" != none ]; then
  command -v tc >/dev/null || { echo "tc not found (iproute2): run with DELAY=none" >&2; exit 2; }
  tc qdisc show dev lo | grep -q '^qdisc noqueue' ||
    { echo "lo already has a qdisc: $(tc qdisc show dev lo); not touching it" >&2; exit 2; }
fi
cleanup() {
  if [ "$delay" != none ]; then tc qdisc del dev lo root 2>/dev/null || true; fi
  scripts/cassandra.sh stop 6 >/dev/null 2>&1 || true
  scripts/cassandra.sh stop 7 >/dev/null 2>&1 || true
}
trap cleanup EXIT
CASSANDRA_FIRST_NODE=6 CASSANDRA_HEAP=${CASSANDRA_RING_HEAP:-768M} scripts/cassandra.sh start-dcs dc1 dc2
if [ "$delay" != none ]; then
  # Band 4 of a prio qdisc gets only what the filter sends it: packets to dc2's node.
  tc qdisc add dev lo root handle 1: prio bands 4
  tc qdisc add dev lo parent 1:4 handle 40: netem delay "$delay"
  tc filter add dev lo parent 1:0 protocol ip prio 1 u32 match ip dst 127.0.0.7/32 flowid 1:4
fi
mkdir -p bench-results
CASSANDRA_CONTACT_POINTS=127.0.0.6:9042,127.0.0.7:9042 CASSANDRA_DC_REPLICATION=dc1:1,dc2:1 \
  CASSANDRA_LOCAL_DC=dc1 CM_BENCH_DC_LATENCY="$delay" cargo bench --bench membership -- dcs
cp bench-results/results.md bench-results/two-dcs.md
echo "wrote bench-results/two-dcs.md"

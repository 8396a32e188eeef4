#!/usr/bin/env bash
# Benchmarks on a three-node ring (RF 3), once per Paxos variant: Cassandra 5.0's v1 and v2.
#
#   scripts/bench-ring.sh [SECTIONS...]     default sections: ops contention
#
# Starts 127.0.0.1–3 for each variant (fresh data; stop any node on 127.0.0.1 first), runs
# `cargo bench --bench membership -- SECTIONS` against it and keeps each report as
# bench-results/ring-paxos-<variant>.md; stops the ring afterwards.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

sections=("$@")
[ ${#sections[@]} -gt 0 ] || sections=(ops contention)
# A node left running would be reused with its own settings: a mixed ring under one label.
for i in 1 2 3; do
  if (exec 3<>"/dev/tcp/127.0.0.$i/9042") 2>/dev/null; then
    echo "a node answers on 127.0.0.$i:9042: stop it first (scripts/cassandra.sh stop)" >&2
    exit 2
  fi
done
trap 'scripts/cassandra.sh stop >/dev/null 2>&1 || true' EXIT
mkdir -p bench-results
for variant in v1 v2; do
  # Same 768 MB heap as the test command's ring: three JVMs share the two cores with the client.
  CASSANDRA_PAXOS_VARIANT=$variant CASSANDRA_HEAP=${CASSANDRA_RING_HEAP:-768M} scripts/cassandra.sh start 3
  CASSANDRA_CONTACT_POINTS=127.0.0.1:9042,127.0.0.2:9042,127.0.0.3:9042 CASSANDRA_RF=3 \
    CASSANDRA_PAXOS_VARIANT=$variant cargo bench --bench membership -- "${sections[@]}"
  cp bench-results/results.md "bench-results/ring-paxos-$variant.md"
  scripts/cassandra.sh stop
done
echo "wrote bench-results/ring-paxos-v1.md and bench-results/ring-paxos-v2.md"

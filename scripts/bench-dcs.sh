#!/usr/bin/env bash
# Benchmarks on a two-DC ring: each operation's latency per consistency profile (section "dcs").
#
#   scripts/bench-dcs.sh
#
# Starts dc1 on 127.0.0.6 and dc2 on 127.0.0.7 (fresh data), runs
# `cargo bench --bench membership -- dcs`, keeps the report as bench-results/two-dcs.md, and stops
# the ring afterwards. Loopback has no WAN between the DCs (and these machines' kernel has no
# netem to add one): what the figures show is how many replicas and round trips each profile
# waits for; on a real deployment add the inter-DC round trip to every one `quorum` makes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

for i in 6 7; do
  if (exec 3<>"/dev/tcp/127.0.0.$i/9042") 2>/dev/null; then
    echo "a node answers on 127.0.0.$i:9042: stop it first (scripts/cassandra.sh stop $i)" >&2
    exit 2
  fi
done
cleanup() {
  scripts/cassandra.sh stop 6 >/dev/null 2>&1 || true
  scripts/cassandra.sh stop 7 >/dev/null 2>&1 || true
}
trap cleanup EXIT
CASSANDRA_FIRST_NODE=6 CASSANDRA_HEAP=${CASSANDRA_RING_HEAP:-768M} scripts/cassandra.sh start-dcs dc1 dc2
mkdir -p bench-results
# The bench writes results.md, which holds the full one-node run's report: kept aside and put back.
[ -f bench-results/results.md ] && cp bench-results/results.md bench-results/.results.md.keep
CASSANDRA_CONTACT_POINTS=127.0.0.6:9042,127.0.0.7:9042 CASSANDRA_DC_REPLICATION=dc1:1,dc2:1 \
  CASSANDRA_LOCAL_DC=dc1 cargo bench --bench membership -- dcs
mv bench-results/results.md bench-results/two-dcs.md
[ -f bench-results/.results.md.keep ] && mv bench-results/.results.md.keep bench-results/results.md
echo "wrote bench-results/two-dcs.md"

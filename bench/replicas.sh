#!/usr/bin/env bash
# Replica sets (issue 57): how long writes stop when a backend's primary dies
# or is switched over, measured from the clients' side with real servers,
# and what reads on replicas bring, in one run:
#   failover    crates/proxy/tests/failover_xa.rs, --failovers runs: bank
#               transfers over two backends, each a replica set of three
#               MariaDB servers (GTID, semi-sync AFTER_SYNC), through two
#               hscale instances; one backend's primary is SIGKILLed at a
#               seeded moment and hscale promotes a replica (failover =
#               "auto"). Per run: from the kill to the first acknowledged
#               transfer on that backend begun after it (resumed_ms), and
#               the slowest transfer on the other backend alone meanwhile
#               (other_backend_longest_ms). hscale's defaults: monitor_ms 500,
#               failover_after_ms 3000, the dictionary's lease_ms 10000
#               (target: median <= 5 s).
#   switchover  crates/proxy/tests/replicas.rs, --switchovers planned
#               switchovers round the set under two inserting clients: each
#               one's pause as HSCALE SWITCHOVER answers it, and the longest
#               time the clients went without an acknowledged insert
#               (target: <= 1 s); then one switchover through an instance
#               while the clients write through another, which holds their
#               statements as the dictionary asks it to.
#   reads       sysbench oltp_read_only (autocommitted) at --threads
#               clients for --seconds each, against a replica set's primary
#               directly, then through hscale as a user whose reads go to the
#               primary and as one whose reads go to the two replicas
#               (target: replicas >= 1.6x primary, on a machine where each
#               server has its cores; on one small machine all three servers
#               share the same cores).
# The correctness checks of both tests hold in every run (nothing
# acknowledged lost, no branch left prepared).
#
#   bench/replicas.sh [--failovers N] [--switchovers N] [--monitor-ms MS]
#                     [--failover-after-ms MS] [--lease-ms MS] [--seconds N]
#                     [--threads N]
set -euo pipefail
cd "$(dirname "$0")/.."

FAILOVERS=10
SWITCHOVERS=10
MONITOR_MS=500
FAILOVER_AFTER_MS=3000
LEASE_MS=10000
READ_SECONDS=10
READ_THREADS=8
while [ $# -gt 0 ]; do
  case "$1" in
    --failovers) FAILOVERS=$2; shift 2 ;;
    --switchovers) SWITCHOVERS=$2; shift 2 ;;
    --monitor-ms) MONITOR_MS=$2; shift 2 ;;
    --failover-after-ms) FAILOVER_AFTER_MS=$2; shift 2 ;;
    --lease-ms) LEASE_MS=$2; shift 2 ;;
    --seconds) READ_SECONDS=$2; shift 2 ;;
    --threads) READ_THREADS=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

out=$(mktemp -d)
# A failed run's log stays, named.
failed() { grep -E -B1 -A6 "^run [0-9]+:|panicked" "$1" | grep -v WARN | tail -40; echo "log: $1"; trap - EXIT; exit 1; }
trap 'rm -rf "$out"' EXIT

echo "machine: $(nproc) CPUs, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), $(free -g | awk '/Mem:/ {print $2}') GiB; $(mariadbd --version 2>/dev/null | head -1)"
echo "release build; monitor_ms=$MONITOR_MS failover_after_ms=$FAILOVER_AFTER_MS lease_ms=$LEASE_MS"

HSCALE_FAILOVER_RUNS=$FAILOVERS HSCALE_MONITOR_MS=$MONITOR_MS \
  HSCALE_FAILOVER_AFTER_MS=$FAILOVER_AFTER_MS HSCALE_LEASE_MS=$LEASE_MS \
  cargo test --release -q -p hscale-proxy --test failover_xa -- --nocapture \
  >"$out/failover.log" 2>&1 || failed "$out/failover.log"
HSCALE_SWITCHOVERS=$SWITCHOVERS \
  cargo test --release -q -p hscale-proxy --test replicas switchover -- --nocapture --test-threads 1 \
  >"$out/switchover.log" 2>&1 || failed "$out/switchover.log"
HSCALE_READS_SECONDS=$READ_SECONDS HSCALE_READS_THREADS=$READ_THREADS \
  cargo test --release -q -p hscale-proxy --test replicas oltp_read_only_over_replicas \
  -- --ignored --nocapture >"$out/reads.log" 2>&1 || failed "$out/reads.log"

# median and max of the numbers on stdin
stats() {
  sort -n | awk '{ v[NR] = $1 } END {
    if (NR == 0) { print "none"; exit }
    m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf "median %d, max %d (of %d)", m, v[NR], NR }'
}

resumed=$(sed -n 's/^failover: resumed_ms=\([0-9]*\).*/\1/p' "$out/failover.log")
others=$(sed -n 's/^failover: .*other_backend_longest_ms=\([0-9]*\).*/\1/p' "$out/failover.log")
echo "failover: writes to the failed backend resumed after the kill (ms): $(echo "$resumed" | stats)"
echo "failover: slowest transfer on the other backend meanwhile (ms): $(echo "$others" | stats)"
line=$(grep '^switchover:' "$out/switchover.log")
pauses=$(echo "$line" | sed 's/.*pause_ms=\[\([^]]*\)\].*/\1/' | tr ',' '\n' | tr -d ' ')
echo "switchover: pause as HSCALE SWITCHOVER answers it (ms): $(echo "$pauses" | stats)"
echo "switchover: longest time the clients went without an insert (ms): $(echo "$line" | sed 's/.*longest_gap_ms=\([0-9]*\).*/\1/')"
other=$(grep '^switchover through another instance:' "$out/switchover.log")
echo "switchover through another instance (held by the dictionary): pause $(echo "$other" | sed 's/.*pause_ms=\([0-9]*\).*/\1/') ms, longest time its clients went without an insert $(echo "$other" | sed 's/.*longest_gap_ms=\([0-9]*\).*/\1/') ms"
reads=$(grep '^reads:' "$out/reads.log")
echo "reads ($READ_THREADS clients, oltp_read_only autocommitted): $(echo "$reads" | sed 's/^reads: //')"

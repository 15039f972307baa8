#!/usr/bin/env bash
# What the kernel charges a proxy on this machine: hscale beside two byte relays
# that parse nothing, one on tokio (hscale's runtime, readiness polling) and one
# on io_uring (completions, many connections per system call). All three in front
# of the same MariaDB over its unix socket, runs interleaved.
#
#   bench/floor.sh [--runs N] [--queries N]
#
# Prints the median seconds and the CPU time per seed query of each.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=5
QUERIES=10000
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS=$2; shift 2 ;;
    --queries) QUERIES=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

cargo build --release --quiet --bin hscale --example relay_floor --example uring_relay_floor
# The io_uring relay speaks to unix sockets only: every one here takes that path.
export BACKEND_PATH=unix
source bench/common.sh
PORT=$(free_port)
LOG=$(mktemp)
trap 'stop_everything ${TOKIO_PID:-} ${URING_PID:-}; rm -f "$LOG"' EXIT
start_playground "$PORT" "$LOG"
TOKIO=$(free_port)
target/release/examples/relay_floor "127.0.0.1:$TOKIO" "$SOCKET" &
TOKIO_PID=$!
URING=$(free_port)
target/release/examples/uring_relay_floor "127.0.0.1:$URING" "$SOCKET" &
URING_PID=$!
create_seed_table

echo "machine: $(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), kernel $(uname -r)"
echo "seed query, $QUERIES queries per run, median of $RUNS runs; CPU per query over all runs"
echo
echo "| concurrency | hscale (s) | tokio relay (s) | io_uring relay (s) | hscale CPU/query (µs) | tokio relay CPU/query (µs) | io_uring relay CPU/query (µs) |"
echo "|---:|---:|---:|---:|---:|---:|---:|"
for c in 1 10 20 40; do
  declare -A seconds=() cpu=()
  for _ in $(seq 1 "$RUNS"); do
    for target in "$PORT:$PLAYGROUND_PID" "$TOKIO:$TOKIO_PID" "$URING:$URING_PID"; do
      port=${target%:*} pid=${target#*:}
      before=$(cpu_ns "$pid")
      seconds[$port]+="$(slap_seconds "$port" "$c") "
      cpu[$port]=$(( ${cpu[$port]:-0} + $(cpu_ns "$pid") - before ))
    done
  done
  row="| $c"
  for port in "$PORT" "$TOKIO" "$URING"; do
    row+=" | $(printf '%s\n' ${seconds[$port]} | median)"
  done
  for port in "$PORT" "$TOKIO" "$URING"; do
    row+=" | $(awk -v ns="${cpu[$port]}" -v n="$((QUERIES * RUNS))" 'BEGIN {printf "%.1f", ns/n/1000}')"
  done
  echo "$row |"
done

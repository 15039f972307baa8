#!/usr/bin/env bash
# What the TCP path to a backend costs hscale against its unix socket, side by
# side in one run: two hscale instances in front of the same MariaDB, one
# reaching it over TCP (the playground's), one over its unix socket (`hscale
# serve`, sharing the playground's dictionary), and MariaDB direct. Clients
# reach all three over TCP. Interleaved runs of the seed query; per query:
# hscale's CPU (all threads, schedstat) and its context switches (voluntary:
# a thread that went to sleep and was woken again; the wake-ups per query).
#
#   bench/paths.sh [--runs N] [--queries N] [--binary PATH]
#
# --binary runs the unix-socket instance from another build instead, for an
# A/B of two builds on the same path (both then reach MariaDB over TCP).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=5
QUERIES=10000
OTHER=""
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS=$2; shift 2 ;;
    --queries) QUERIES=$2; shift 2 ;;
    --binary) OTHER=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

cargo build --release --quiet --bin hscale
export BACKEND_PATH=tcp
source bench/common.sh
PORT=$(free_port)
LOG=$(mktemp)
SECOND=$(free_port)
trap 'stop_everything ${SECOND_PID:-}; rm -f "$LOG" "$LOG.second" "$LOG.second.toml"' EXIT
start_playground "$PORT" "$LOG"
TCP_PID=$PLAYGROUND_PID
create_seed_table

if [ -n "$OTHER" ]; then
  second_address="127.0.0.1:$DIRECT"; A="this build"; B="$OTHER"
else
  second_address=$SOCKET; OTHER=target/release/hscale; A="TCP"; B="unix socket"
fi
start_serve "$OTHER" "$SECOND" "$LOG.second" "$second_address"
SECOND_PID=$SERVE_PID

# Voluntary context switches of all of a process's threads.
switches() {
  cat /proc/"$1"/task/*/status 2>/dev/null |
    awk '/^voluntary_ctxt_switches/ {s += $2} END {printf "%d", s}'
}

echo "machine: $(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
echo "mariadb: $(mariadb -h127.0.0.1 -P"$DIRECT" -uroot -N -e 'SELECT VERSION()'), hscale: $(target/release/hscale --version)"
echo "seed query, $QUERIES queries per run, median of $RUNS runs, interleaved; A: $A, B: $B"
echo
echo "| concurrency | MariaDB direct (s) | A (s) | ratio | B (s) | ratio | A CPU/query (µs) | B CPU/query (µs) | B − A (µs) | A wake-ups/query | B wake-ups/query |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for c in 1 10 40; do
  direct=(); a=(); b=(); a_cpu=0; b_cpu=0; a_sw=0; b_sw=0
  for _ in $(seq 1 "$RUNS"); do
    direct+=("$(slap_seconds "$DIRECT" "$c")")
    for side in a b; do
      if [ $side = a ]; then pid=$TCP_PID port=$PORT; else pid=$SECOND_PID port=$SECOND; fi
      cpu=$(cpu_ns "$pid"); sw=$(switches "$pid")
      seconds=$(slap_seconds "$port" "$c")
      cpu=$(($(cpu_ns "$pid") - cpu)); sw=$(($(switches "$pid") - sw))
      if [ $side = a ]; then
        a+=("$seconds"); a_cpu=$((a_cpu + cpu)); a_sw=$((a_sw + sw))
      else
        b+=("$seconds"); b_cpu=$((b_cpu + cpu)); b_sw=$((b_sw + sw))
      fi
    done
  done
  d=$(printf '%s\n' "${direct[@]}" | median)
  ta=$(printf '%s\n' "${a[@]}" | median)
  tb=$(printf '%s\n' "${b[@]}" | median)
  awk -v c="$c" -v d="$d" -v a="$ta" -v b="$tb" -v ac="$a_cpu" -v bc="$b_cpu" \
    -v as="$a_sw" -v bs="$b_sw" -v n="$((QUERIES * RUNS))" \
    'BEGIN {printf "| %d | %.3f | %.3f | %.2f | %.3f | %.2f | %.1f | %.1f | %+.1f | %.2f | %.2f |\n",
      c, d, a, a/d, b, b/d, ac/n/1000, bc/n/1000, (bc-ac)/n/1000, as/n, bs/n}'
done

#!/usr/bin/env bash
# What routing adds to hscale's CPU per seed query, measured where a few µs
# show: one hscale, pinned to CPU 1 (MariaDB and the clients on CPU 0), the
# seed query alternately passed through (table `smalx`, the same rows, a name
# no partitioned table has) and routed (`small` in bench_part, partitioned by
# category with NONE(), the query sent to partition `books`), the same number
# of queries each turn. Across turns the scheduler's moods hit both alike; the
# median of the per-turn differences is a run's number.
#
# Runs differ more than turns do (±0.3 µs: each hscale process lays out its
# memory anew), so each run starts its own `hscale serve`, and the number is
# the median over every turn of every run. `--against BINARY` alternates runs
# of this build with runs of another (an older build, say), against the same
# MariaDB, so that two builds compare side by side (docs/benchmarks.md).
#
#   bench/routing_cost.sh [--runs N] [--turns N] [--queries N] [--concurrency N] [--against BINARY]
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=3
TURNS=8
QUERIES=20000
CONCURRENCY=1
BINARIES=(target/release/hscale)
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS=$2; shift 2 ;;
    --turns) TURNS=$2; shift 2 ;;
    --queries) QUERIES=$2; shift 2 ;;
    --concurrency) CONCURRENCY=$2; shift 2 ;;
    --against) BINARIES+=("$2"); shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

cargo build --release --quiet --bin hscale
source bench/common.sh
WORK=$(mktemp -d)
SERVE_PID=
trap 'stop_everything $SERVE_PID; rm -rf "$WORK"' EXIT
PLAYGROUND_PORT=$(free_port)
start_playground "$PLAYGROUND_PORT" "$WORK/playground.log"
create_seed_table
mariadb -h127.0.0.1 -P"$DIRECT" -uroot -e "CREATE TABLE bench.smalx LIKE bench.small;
  INSERT INTO bench.smalx SELECT * FROM bench.small;
  CREATE DATABASE bench_part; CREATE TABLE bench_part.small LIKE bench.small;
  INSERT INTO bench_part.small SELECT * FROM bench.small;"
mariadb -h127.0.0.1 -P"$PLAYGROUND_PORT" -uroot bench_part -e "
  HSCALE SETUP_TABLE('small', 'category', 'small_default', 1, 'NONE()');
  HSCALE ADD_PARTITION('small', 'books', 'books', 1);"
# The playground's own hscale stays idle, on CPU 0 out of the measured one's way.
taskset -a -p -c 0 "$PLAYGROUND_PID" >/dev/null

PASSED=${QUERY//small/smalx}
cpu_per_query() { # port schema query -> hscale CPU µs per query
  local before after
  before=$(cpu_ns)
  QUERY=$3 SCHEMA=$2 slap_seconds "$1" "$CONCURRENCY" >/dev/null
  after=$(cpu_ns)
  awk -v d=$((after - before)) -v q="$QUERIES" 'BEGIN {printf "%.2f", d / q / 1000}'
}

echo "machine: $(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1); mariadb: $(mariadb -h127.0.0.1 -P"$DIRECT" -uroot -N -e 'SELECT VERSION()')"
echo "seed query, $QUERIES queries per turn at concurrency $CONCURRENCY, $TURNS turns per run, hscale on CPU 1, over $BACKEND_PATH"
echo
echo "| run | hscale | passthrough (µs, median) | routed (µs, median) | routed − passthrough (µs, median of turns) |"
echo "|---:|---|---:|---:|---:|"
declare -A DIFFS
for run in $(seq 1 "$RUNS"); do
  for binary in "${BINARIES[@]}"; do
    port=$(free_port)
    start_serve "$binary" "$port" "$WORK/serve.log"
    HSCALE_PID=$SERVE_PID
    pin_apart
    # Warm-up: both shapes planned, the pool filled.
    QUERY=$PASSED SCHEMA=bench slap_seconds "$port" "$CONCURRENCY" >/dev/null
    QUERY=$QUERY SCHEMA=bench_part slap_seconds "$port" "$CONCURRENCY" >/dev/null
    passed_all=() routed_all=() diffs=()
    for _ in $(seq 1 "$TURNS"); do
      passed=$(cpu_per_query "$port" bench "$PASSED")
      routed=$(cpu_per_query "$port" bench_part "$QUERY")
      passed_all+=("$passed")
      routed_all+=("$routed")
      diffs+=("$(awk -v a="$passed" -v b="$routed" 'BEGIN {printf "%.2f", b - a}')")
    done
    kill "$SERVE_PID"
    wait "$SERVE_PID" 2>/dev/null || true
    SERVE_PID=
    DIFFS[$binary]="${DIFFS[$binary]:-} ${diffs[*]}"
    echo "| $run | $binary | $(printf '%s\n' "${passed_all[@]}" | median) | $(printf '%s\n' "${routed_all[@]}" | median) | $(printf '%s\n' "${diffs[@]}" | median) |"
  done
done
echo
for binary in "${BINARIES[@]}"; do
  # shellcheck disable=SC2086 # the differences are words
  echo "$binary: median of the differences over $RUNS runs: $(printf '%s\n' ${DIFFS[$binary]} | median) µs per query"
done

#!/usr/bin/env bash
# What routing adds to hscale's CPU per seed query, measured where a few µs
# show: one hscale, pinned to CPU 1 (MariaDB and the clients on CPU 0), the
# seed query alternately passed through (table `smalx`, the same rows, a name
# no partitioned table has) and routed (`small` in bench_part, partitioned by
# category with NONE(), the query sent to partition `books`), the same number
# of queries each turn. Across turns the scheduler's moods hit both alike; the
# median of the per-turn differences is the number (docs/benchmarks.md).
#
#   bench/routing_cost.sh [--turns N] [--queries N] [--concurrency N]
set -euo pipefail
cd "$(dirname "$0")/.."

TURNS=8
QUERIES=20000
CONCURRENCY=1
while [ $# -gt 0 ]; do
  case "$1" in
    --turns) TURNS=$2; shift 2 ;;
    --queries) QUERIES=$2; shift 2 ;;
    --concurrency) CONCURRENCY=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

cargo build --release --quiet --bin hscale
source bench/common.sh
PORT=$(free_port)
WORK=$(mktemp -d)
trap 'stop_everything; rm -rf "$WORK"' EXIT
start_playground "$PORT" "$WORK/playground.log"
HSCALE_PID=$PLAYGROUND_PID
create_seed_table
mariadb -h127.0.0.1 -P"$DIRECT" -uroot -e "CREATE TABLE bench.smalx LIKE bench.small;
  INSERT INTO bench.smalx SELECT * FROM bench.small;
  CREATE DATABASE bench_part; CREATE TABLE bench_part.small LIKE bench.small;
  INSERT INTO bench_part.small SELECT * FROM bench.small;"
mariadb -h127.0.0.1 -P"$PORT" -uroot bench_part -e "
  HSCALE SETUP_TABLE('small', 'category', 'small_default', 1, 'NONE()');
  HSCALE ADD_PARTITION('small', 'books', 'books', 1);"
pin_apart

PASSED=${QUERY//small/smalx}
cpu_per_query() { # schema query -> hscale CPU µs per query
  local before after
  before=$(cpu_ns)
  QUERY=$2 SCHEMA=$1 slap_seconds "$PORT" "$CONCURRENCY" >/dev/null
  after=$(cpu_ns)
  awk -v d=$((after - before)) -v q="$QUERIES" 'BEGIN {printf "%.2f", d / q / 1000}'
}
# Warm-up: both shapes planned, both pools filled.
QUERY=$PASSED SCHEMA=bench slap_seconds "$PORT" "$CONCURRENCY" >/dev/null
QUERY=$QUERY SCHEMA=bench_part slap_seconds "$PORT" "$CONCURRENCY" >/dev/null

echo "machine: $(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1); mariadb: $(mariadb -h127.0.0.1 -P"$DIRECT" -uroot -N -e 'SELECT VERSION()')"
echo "seed query, $QUERIES queries per turn at concurrency $CONCURRENCY, hscale on CPU 1, over $BACKEND_PATH"
echo
echo "| turn | passthrough (µs) | routed (µs) | routed − passthrough (µs) |"
echo "|---:|---:|---:|---:|"
DIFFS=()
for turn in $(seq 1 "$TURNS"); do
  passed=$(cpu_per_query bench "$PASSED")
  routed=$(cpu_per_query bench_part "$QUERY")
  diff=$(awk -v a="$passed" -v b="$routed" 'BEGIN {printf "%.2f", b - a}')
  DIFFS+=("$diff")
  echo "| $turn | $passed | $routed | $diff |"
done
echo
echo "median of the differences: $(printf '%s\n' "${DIFFS[@]}" | median) µs per query"

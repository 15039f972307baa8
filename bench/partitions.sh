#!/usr/bin/env bash
# The 2008 HSCALE suite's partition columns, side by side in one run:
#   passthrough      the seed query with nothing partitioned (the dictionary empty)
#   w/o partitions   the seed query while another table (demo.users) is partitioned
#   w/ partitions    `small` partitioned by category (NONE()), the query routed
#                    to one partition, in database bench_part
# each against MariaDB direct on the plain table; clients connect over TCP,
# and hscale reaches MariaDB over TCP too (--path unix: its unix socket).
#
#   bench/partitions.sh [--runs N] [--queries N] [--path tcp|unix] [--pin]
#
# --pin puts hscale's threads on CPU 1 and MariaDB and the clients on CPU 0:
# on a 2-core machine hscale's CPU per query otherwise follows how often the
# scheduler migrates its threads (docs/benchmarks.md), which hides a
# difference of a few µs between columns. Pinned, direct runs share one core
# with the client, so read the time ratios from an unpinned run.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=5
PIN=0
QUERIES=10000
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS=$2; shift 2 ;;
    --queries) QUERIES=$2; shift 2 ;;
    --path) export BACKEND_PATH=$2; shift 2 ;;
    --pin) PIN=1; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

cargo build --release --quiet --bin hscale
source bench/common.sh
PORT=$(free_port)
LOG=$(mktemp)
trap 'stop_everything; rm -f "$LOG"' EXIT
start_playground "$PORT" "$LOG"
HSCALE_PID=$PLAYGROUND_PID
create_seed_table
[ "$PIN" = 1 ] && pin_apart

direct_sql() { mariadb -h127.0.0.1 -P"$DIRECT" -uroot -N -e "$1"; }
proxy_sql() { mariadb -h127.0.0.1 -P"$PORT" -uroot -N "${@:2}" -e "$1"; }
direct_sql "CREATE DATABASE bench_part; CREATE TABLE bench_part.small LIKE bench.small;
  INSERT INTO bench_part.small SELECT * FROM bench.small;"
proxy_sql "HSCALE SETUP_TABLE('small', 'category', 'small_default', 1, 'NONE()');
  HSCALE ADD_PARTITION('small', 'books', 'books', 1);
  HSCALE ADD_PARTITION('small', 'hardware', 'hardware', 1);
  HSCALE ADD_PARTITION('small', 'software', 'software', 1);" bench_part
proxy_sql "HSCALE EXPLAIN $QUERY" bench_part >&2
direct_sql "CREATE TABLE hscale.saved_tables AS SELECT * FROM hscale.tables;
  CREATE TABLE hscale.saved_partitions AS SELECT * FROM hscale.partitions;"
# The dictionary is polled every second: a change is in force after that.
set_dictionary() { # empty | demo (only demo.users) | full
  direct_sql "DELETE FROM hscale.tables; DELETE FROM hscale.partitions;"
  case "$1" in
    demo) direct_sql "INSERT INTO hscale.tables SELECT * FROM hscale.saved_tables WHERE db = 'demo';
      INSERT INTO hscale.partitions SELECT * FROM hscale.saved_partitions WHERE db = 'demo';" ;;
    full) direct_sql "INSERT INTO hscale.tables SELECT * FROM hscale.saved_tables;
      INSERT INTO hscale.partitions SELECT * FROM hscale.saved_partitions;" ;;
  esac
  direct_sql "UPDATE hscale.version SET version = version + 1"
  sleep 1.5
}

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
echo "mariadb: $(direct_sql 'SELECT VERSION()'), hscale: $(target/release/hscale --version)"
echo "seed query, $QUERIES queries per run, median of $RUNS runs; each column beside its own direct runs; hscale reaches MariaDB over $BACKEND_PATH$([ "$PIN" = 1 ] && echo '; pinned: hscale on CPU 1, MariaDB and clients on CPU 0')"
echo

declare -A DIRECT_RUNS PROXY_RUNS CPU_NS
# One run of a column at concurrency $3: MariaDB direct, then through hscale.
run_once() { # label schema concurrency
  local before after
  DIRECT_RUNS[$1,$3]+="$(SCHEMA=bench slap_seconds "$DIRECT" "$3") "
  before=$(cpu_ns)
  PROXY_RUNS[$1,$3]+="$(SCHEMA=$2 slap_seconds "$PORT" "$3") "
  after=$(cpu_ns)
  CPU_NS[$1,$3]=$(( ${CPU_NS[$1,$3]:-0} + after - before ))
}

# Interleaved: each run visits the three columns in turn (a dictionary change
# takes a refresh, 1.5 s, to be seen everywhere).
for c in 1 10 40; do
  for _ in $(seq 1 "$RUNS"); do
    set_dictionary empty; run_once passthrough bench "$c"
    set_dictionary demo; run_once without bench "$c"
    set_dictionary full; run_once with bench_part "$c"
  done
done

echo "| concurrency | column | MariaDB direct (s) | hscale (s) | ratio | hscale CPU/query (µs) |"
echo "|---:|---|---:|---:|---:|---:|"
for c in 1 10 40; do
  for label in passthrough without with; do
    d=$(printf '%s\n' ${DIRECT_RUNS[$label,$c]} | median)
    p=$(printf '%s\n' ${PROXY_RUNS[$label,$c]} | median)
    cpu=$(awk -v t="${CPU_NS[$label,$c]}" -v n="$((QUERIES * RUNS))" 'BEGIN {printf "%.1f", t/n/1000}')
    name=$label
    [ "$label" = without ] && name="w/o partitions"
    [ "$label" = with ] && name="w/ partitions"
    awk -v c="$c" -v n="$name" -v d="$d" -v p="$p" -v cpu="$cpu" \
      'BEGIN {printf "| %d | %s | %.3f | %.3f | %.2f | %s |\n", c, n, d, p, p/d, cpu}'
  done
done

#!/usr/bin/env bash
# The 2008 HSCALE suite's partition columns, side by side in one run:
#   passthrough      the seed query with nothing partitioned (the dictionary empty)
#   w/o partitions   the seed query while another table (demo.users) is partitioned
#   w/ partitions    `small` partitioned by category (NONE()), the query routed
#                    to one partition, in database bench_part
# each against MariaDB direct on the plain table, over TCP (hscale reaches the
# playground's MariaDB over its unix socket, as in bench/seed.sh).
#
#   bench/partitions.sh [--runs N] [--queries N]
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

cargo build --release --quiet --bin hscale
source bench/common.sh
PORT=$(free_port)
LOG=$(mktemp)
trap 'stop_everything; rm -f "$LOG"' EXIT
start_playground "$PORT" "$LOG"
HSCALE_PID=$PLAYGROUND_PID
create_seed_table

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
set_dictionary() { # empty | full
  case "$1" in
    empty) direct_sql "DELETE FROM hscale.tables; DELETE FROM hscale.partitions;" ;;
    full) direct_sql "INSERT INTO hscale.tables SELECT * FROM hscale.saved_tables;
      INSERT INTO hscale.partitions SELECT * FROM hscale.saved_partitions;" ;;
  esac
  direct_sql "UPDATE hscale.version SET version = version + 1"
  sleep 1.5
}

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
echo "mariadb: $(direct_sql 'SELECT VERSION()'), hscale: $(target/release/hscale --version)"
echo "seed query, $QUERIES queries per run, median of $RUNS runs; each column beside its own direct runs"
echo

declare -A SECONDS_OF CPU_OF
# Runs `mode` (a label) with schema $2 at concurrency $3, RUNS times, each
# beside a direct run; records medians and hscale's CPU per query.
measure() { # label schema concurrency
  local label=$1 schema=$2 c=$3 direct=() proxied=() cpu=0 before after
  for _ in $(seq 1 "$RUNS"); do
    direct+=("$(SCHEMA=bench slap_seconds "$DIRECT" "$c")")
    before=$(cpu_ns)
    proxied+=("$(SCHEMA=$schema slap_seconds "$PORT" "$c")")
    after=$(cpu_ns)
    cpu=$((cpu + after - before))
  done
  SECONDS_OF[$label,$c]="$(printf '%s\n' "${direct[@]}" | median) $(printf '%s\n' "${proxied[@]}" | median)"
  CPU_OF[$label,$c]=$(awk -v t="$cpu" -v n="$((QUERIES * RUNS))" 'BEGIN {printf "%.1f", t/n/1000}')
}

set_dictionary empty
for c in 1 10 40; do measure passthrough bench "$c"; done
set_dictionary full
for c in 1 10 40; do
  measure without bench "$c"
  measure with bench_part "$c"
done

echo "| concurrency | column | MariaDB direct (s) | hscale (s) | ratio | hscale CPU/query (µs) |"
echo "|---:|---|---:|---:|---:|---:|"
for c in 1 10 40; do
  for label in passthrough without with; do
    read -r d p <<<"${SECONDS_OF[$label,$c]}"
    name=$label
    [ "$label" = without ] && name="w/o partitions"
    [ "$label" = with ] && name="w/ partitions"
    awk -v c="$c" -v n="$name" -v d="$d" -v p="$p" -v cpu="${CPU_OF[$label,$c]}" \
      'BEGIN {printf "| %d | %s | %.3f | %.3f | %.2f | %s |\n", c, n, d, p, p/d, cpu}'
  done
done

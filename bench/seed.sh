#!/usr/bin/env bash
# The 2008 HSCALE benchmark, then sysbench oltp_point_select: MariaDB direct vs
# through hscale, measured side by side in one run on this machine.
#
#   bench/seed.sh [--runs N] [--queries N] [--sysbench-seconds N] [--path tcp|unix]
#
# hscale and the byte relay reach MariaDB over TCP (--path tcp, the default: in
# production backends are on other hosts) or its unix socket (--path unix).
# Prints seconds per cell (median of N runs), the ratio to direct, and hscale's
# CPU time per query (all its threads, from /proc/<pid>/task/*/schedstat).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=5
QUERIES=10000
SYSBENCH_SECONDS=10
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS=$2; shift 2 ;;
    --queries) QUERIES=$2; shift 2 ;;
    --sysbench-seconds) SYSBENCH_SECONDS=$2; shift 2 ;;
    --path) export BACKEND_PATH=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

cargo build --release --quiet --bin hscale --example relay_floor
source bench/common.sh
PORT=$(free_port)
LOG=$(mktemp)
trap 'stop_everything ${RELAY_PID:-}; rm -f "$LOG"' EXIT
start_playground "$PORT" "$LOG"
HSCALE_PID=$PLAYGROUND_PID
# The floor: a byte relay that parses nothing, on the same path hscale takes.
RELAY=$(free_port)
target/release/examples/relay_floor "127.0.0.1:$RELAY" "$BACKEND" &
RELAY_PID=$!

create_seed_table

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
echo "mariadb: $(mariadb -h127.0.0.1 -P"$DIRECT" -uroot -N -e 'SELECT VERSION()'), hscale: $(target/release/hscale --version)"
echo "seed query, $QUERIES queries per run, median of $RUNS runs; hscale and the relay reach MariaDB over $BACKEND_PATH"
echo
echo "| concurrency | MariaDB direct (s) | hscale (s) | ratio | byte relay (s) | hscale CPU/query (µs) | byte relay CPU/query (µs) | MariaDB CPU/query, direct (µs) |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
for c in 1 10 20 40; do
  direct=(); proxied=(); relayed=(); cpu_total=0; relay_total=0; mariadb_total=0
  for _ in $(seq 1 "$RUNS"); do
    m_before=$(cpu_ns "$MARIADB_PID")
    direct+=("$(slap_seconds "$DIRECT" "$c")")
    m_after=$(cpu_ns "$MARIADB_PID")
    mariadb_total=$((mariadb_total + m_after - m_before))
    before=$(cpu_ns)
    proxied+=("$(slap_seconds "$PORT" "$c")")
    after=$(cpu_ns)
    cpu_total=$((cpu_total + after - before))
    before=$(cpu_ns "$RELAY_PID")
    relayed+=("$(slap_seconds "$RELAY" "$c")")
    after=$(cpu_ns "$RELAY_PID")
    relay_total=$((relay_total + after - before))
  done
  d=$(printf '%s\n' "${direct[@]}" | median)
  p=$(printf '%s\n' "${proxied[@]}" | median)
  r=$(printf '%s\n' "${relayed[@]}" | median)
  awk -v c="$c" -v d="$d" -v p="$p" -v r="$r" -v cpu="$cpu_total" -v rc="$relay_total" -v m="$mariadb_total" \
    -v n="$((QUERIES * RUNS))" \
    'BEGIN {printf "| %d | %.3f | %.3f | %.2f | %.3f | %.1f | %.1f | %.1f |\n", c, d, p, p/d, r, cpu/n/1000, rc/n/1000, m/n/1000}'
done

echo
echo "sysbench oltp_point_select, 8 threads, ${SYSBENCH_SECONDS}s each, server-side prepared statements"
echo
SB=(--db-driver=mysql --mysql-host=127.0.0.1 --mysql-user=root --mysql-password= --mysql-db=bench
    --tables=1 --table-size=100000 --threads=8 --time="$SYSBENCH_SECONDS" --percentile=95)
sysbench oltp_point_select "${SB[@]}" --mysql-port="$DIRECT" prepare >/dev/null 2>&1 || true
sysbench_run() { # port -> "qps p95"
  sysbench oltp_point_select "${SB[@]}" --mysql-port="$1" run |
    awk '/queries:/ {gsub(/\(/, "", $3); qps=$3} /95th percentile:/ {p95=$3} END {print qps, p95}'
}
# CPU nanoseconds of each of hscale's threads: "tid name ns" per line.
thread_cpu() {
  for task in /proc/"$HSCALE_PID"/task/*; do
    echo "${task##*/} $(tr ' ' '_' <"$task/comm") $(cut -d' ' -f1 "$task/schedstat")"
  done
}
read -r dq dp <<<"$(sysbench_run "$DIRECT")"
before=$(cpu_ns)
thread_cpu >"$LOG.threads"
read -r pq pp <<<"$(sysbench_run "$PORT")"
thread_cpu >>"$LOG.threads"
after=$(cpu_ns)
echo "| | qps | p95 (ms) |"
echo "|---|---:|---:|"
echo "| MariaDB direct | $dq | $dp |"
echo "| hscale | $pq | $pp |"
awk -v d="$dq" -v p="$pq" -v cpu="$((after - before))" -v s="$SYSBENCH_SECONDS" \
  'BEGIN {printf "| ratio | %.2f | |\n\nhscale CPU per sysbench query: %.1f µs\n", p/d, cpu/(p*s)/1000}'
# Multi-core: how hscale's CPU time during the sysbench run split over its threads.
awk -v s="$SYSBENCH_SECONDS" '
  { if ($1 in first) used[$1] = $3 - first[$1]; else { first[$1] = $3; name[$1] = $2 } }
  END {
    for (t in used) total += used[t]
    printf "hscale used %.2f cores during sysbench; threads with more than 1%% of it:", total / (s * 1e9)
    for (t in used) if (used[t] > total / 100) printf " %s %.0f%%", name[t], 100 * used[t] / total
    print ""
  }' "$LOG.threads"
rm -f "$LOG.threads"

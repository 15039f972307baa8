#!/usr/bin/env bash
# Server-side prepared statements through hscale (issue 8): sysbench
# oltp_point_select with --db-ps-mode=auto (prepared) and disable (text),
# MariaDB direct and through hscale side by side in one run; then the same
# table partitioned by id over two backends, its point selects routed by
# their parameter, and oltp_write_only's prepared writes on it checked row
# for row against the same run on one plain table; then 64 threads of
# prepared statements through a pool of 16 backend connections, counting
# the connections hscale holds while they run.
#
#   bench/prepared.sh [--seconds N] [--path tcp|unix]
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_EACH=10
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_EACH=$2; shift 2 ;;
    --path) export BACKEND_PATH=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
command -v sysbench >/dev/null || { echo "needs sysbench (apt-get install sysbench)" >&2; exit 1; }

cargo build --release --quiet --bin hscale
source bench/common.sh
WORK=$(mktemp -d)
PIDS=()
trap 'stop_everything "${PIDS[@]}"; rm -rf "$WORK"' EXIT
PLAY=$(free_port)
BACKENDS=2 start_playground "$PLAY" "$WORK/playground.log"

# hscale of its own on the playground's MariaDB, with a pool of 16.
PORT=$(free_port)
start_serve target/release/hscale "$PORT" "$WORK/hscale.log" "$BACKEND" "max_connections = 16"
HSCALE_PID=$SERVE_PID
HTTP=$SERVE_HTTP
PIDS+=("$HSCALE_PID")

mariadb -h127.0.0.1 -P"$DIRECT" -uroot -e "CREATE DATABASE IF NOT EXISTS bench"
SB=(--db-driver=mysql --mysql-host=127.0.0.1 --mysql-user=root --mysql-password= --mysql-db=bench
    --tables=1 --table-size=100000 --time="$SECONDS_EACH" --percentile=95)
sysbench oltp_point_select "${SB[@]}" --mysql-port="$DIRECT" prepare >/dev/null
sysbench_run() { # port threads ps-mode -> "qps p95 errors"
  sysbench oltp_point_select "${SB[@]}" --mysql-port="$1" --threads="$2" --db-ps-mode="$3" run |
    awk '/queries:/ {gsub(/\(/, "", $3); qps=$3} /95th percentile:/ {p95=$3}
         /ignored errors:/ {errors=$3} END {print qps, p95, errors}'
}
backend_connections() {
  curl -s "http://127.0.0.1:$HTTP/metrics" |
    sed -n 's/^hscale_backend_connections{backend="1"} //p'
}

echo "machine: $(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
echo "mariadb: $(mariadb -h127.0.0.1 -P"$DIRECT" -uroot -N -e 'SELECT VERSION()'), hscale reaches it over $BACKEND_PATH"
echo "sysbench oltp_point_select, ${SECONDS_EACH}s per cell, 8 threads"
echo
echo "| ps-mode | MariaDB direct (qps) | hscale (qps) | ratio | hscale p95 (ms) | hscale CPU/query (µs) |"
echo "|---|---:|---:|---:|---:|---:|"
for mode in auto disable; do
  read -r dq _ _ <<<"$(sysbench_run "$DIRECT" 8 "$mode")"
  before=$(cpu_ns)
  read -r pq pp _ <<<"$(sysbench_run "$PORT" 8 "$mode")"
  after=$(cpu_ns)
  awk -v m="$mode" -v d="$dq" -v p="$pq" -v pp="$pp" -v cpu="$((after - before))" -v s="$SECONDS_EACH" \
    'BEGIN {printf "| %s | %.0f | %.0f | %.2f | %s | %.1f |\n", m, d, p, p/d, pp, cpu/(p*s)/1000}'
done

echo
echo "sbtest1 partitioned by MOD(2) of id, odd ids on backend 2 (hscale playground, two MariaDB servers):"
direct_sql() { mariadb -h127.0.0.1 -P"$DIRECT" -uroot -N -e "$1"; }
play_sql() { mariadb -h127.0.0.1 -P"$PLAY" -uroot -N -e "$1" "$2"; }
for db in bench_part bench_plain; do
  direct_sql "CREATE DATABASE $db; CREATE TABLE $db.sbtest1 LIKE bench.sbtest1;
    INSERT INTO $db.sbtest1 SELECT * FROM bench.sbtest1;"
done
play_sql "HSCALE SETUP_TABLE('sbtest1', 'id', 'sbtest1_default', 1, 'MOD(2)');
  HSCALE ADD_PARTITION('sbtest1', 'odd', 1, 2);" bench_part
echo "rows on backend 2: $(mariadb -h127.0.0.1 -P"$DIRECT2" -uroot -N -e 'SELECT COUNT(*), SUM(id % 2 = 0) FROM bench_part.sbtest1_odd' | awk '{print $1 " (even: " $2 ")"}')"
PART=(--db-driver=mysql --mysql-host=127.0.0.1 --mysql-user=root --mysql-password= --tables=1 --table-size=100000)
echo
echo "| ps-mode | MariaDB direct, one table (qps) | hscale, partitioned (qps) | ratio | hscale p95 (ms) | errors |"
echo "|---|---:|---:|---:|---:|---:|"
for mode in auto disable; do
  read -r dq _ _ <<<"$(sysbench_run "$DIRECT" 8 "$mode")"
  read -r pq pp pe <<<"$(sysbench oltp_point_select "${PART[@]}" --mysql-port="$PLAY" --mysql-db=bench_part \
    --threads=8 --time="$SECONDS_EACH" --percentile=95 --db-ps-mode="$mode" run |
    awk '/queries:/ {gsub(/\(/, "", $3); qps=$3} /95th percentile:/ {p95=$3}
         /ignored errors:/ {errors=$3} END {print qps, p95, errors}')"
  awk -v m="$mode" -v d="$dq" -v p="$pq" -v pp="$pp" -v e="$pe" \
    'BEGIN {printf "| %s | %.0f | %.0f | %.2f | %s | %s |\n", m, d, p, p/d, pp, e}'
done
# One thread and a fixed seed: both runs make the same writes in the same order.
WRITES=(--threads=1 --events=3000 --time=0 --rand-seed=42 --skip_trx=on --db-ps-mode=auto)
sysbench oltp_write_only "${PART[@]}" --mysql-port="$DIRECT" --mysql-db=bench_plain "${WRITES[@]}" run >"$WORK/plain.out"
sysbench oltp_write_only "${PART[@]}" --mysql-port="$PLAY" --mysql-db=bench_part "${WRITES[@]}" run >"$WORK/part.out"
checksum() { # port db
  mariadb -h127.0.0.1 -P"$1" -uroot -N -e "SELECT id, k, c, pad FROM sbtest1" "$2" | sort -n | md5sum | cut -c1-16
}
plain=$(checksum "$DIRECT" bench_plain)
part=$(checksum "$PLAY" bench_part)
echo
echo "oltp_write_only, 3000 events, prepared: plain table $plain, partitioned through hscale $part," \
  "errors $(awk '/ignored errors:/ {print $3}' "$WORK/part.out")"
[ "$plain" = "$part" ] || { echo "MISMATCH: the partitioned table differs from the plain one" >&2; exit 1; }

echo
echo "64 threads, --db-ps-mode=auto, through hscale's pool of 16:"
(
  max=0
  while sleep 0.2; do
    n=$(backend_connections)
    [ -n "$n" ] && [ "$n" -gt "$max" ] && max=$n && echo "$max" >"$WORK/max"
  done
) &
SAMPLER=$!
PIDS+=("$SAMPLER")
read -r q p e <<<"$(sysbench_run "$PORT" 64 auto)"
kill "$SAMPLER" 2>/dev/null || true
echo "qps $q, p95 $p ms, errors $e, backend connections at most $(cat "$WORK/max" 2>/dev/null || echo '?') (pool max 16)"

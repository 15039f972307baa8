#!/usr/bin/env bash
# What a heavy statement costs the other clients of its worker: with one
# runtime per core, a client's session and its merges run on one worker
# thread, so a long step of one merge (a sort of the groups an ORDER BY over
# aggregates reorders) holds every other session of that worker.
#
#   bench/fairness.sh [--rows N] [--seconds N] [--before BINARY] [--threads K]
#
# One MariaDB (the playground's, over TCP); `big` partitioned by MOD(2) of id
# (both partitions on it), N rows in N/2 groups; each hscale instance
# (`threads = 1`: every client on one worker; with --before, that build's
# too) runs sysbench oltp_point_select at 4 threads alone, then while a fifth
# client runs `SELECT grp, COUNT(*) ... GROUP BY grp ORDER BY COUNT(*) DESC,
# grp` over and over (hscale combines the partitions' groups and sorts
# them); printed: the point selects' p99 and longest latency and rate, and
# how long the heavy statement took, beside them and alone.
# --threads K (K > 1): K workers, one instance that moves clients off a busy
# worker (`move_clients = "by_load"`, the default) and one that never does.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh

ROWS=400000
SECONDS_EACH=10
BEFORE=""
THREADS=1
while [ $# -gt 0 ]; do
  case "$1" in
    --rows) ROWS=$2; shift 2 ;;
    --seconds) SECONDS_EACH=$2; shift 2 ;;
    --before) BEFORE=$(realpath "$2"); shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
command -v sysbench >/dev/null || { echo "needs sysbench (apt-get install sysbench)" >&2; exit 1; }
cargo build --release --quiet --bin hscale

WORK=$(mktemp -d)
PIDS=()
trap 'stop_everything "${PIDS[@]}" ${HEAVY_PID:-}; rm -rf "$WORK"' EXIT
BACKEND_PATH=tcp start_playground "$(free_port)" "$WORK/playground.log"
direct() { mariadb -h127.0.0.1 -P"$DIRECT" -uroot -N "$@"; }

LABELS=() PORTS=() HTTPS=()
INSTANCES="now ${BEFORE:+before}"
[ "$THREADS" -gt 1 ] && INSTANCES="now never"
for build in $INSTANCES; do
  binary=target/release/hscale
  [ "$build" = before ] && binary=$BEFORE
  settings="threads = $THREADS"
  [ "$THREADS" -gt 1 ] && settings="$settings
move_clients = \"$([ "$build" = never ] && echo never || echo by_load)\""
  port=$(free_port)
  start_serve "$binary" "$port" "$WORK/hscale-$build.log" "" "max_connections = 64" "$settings"
  PIDS+=("$SERVE_PID") LABELS+=("$build") PORTS+=("$port") HTTPS+=("$SERVE_HTTP")
done
moved() { curl -s "http://127.0.0.1:$1/metrics" | awk '/^hscale_clients_moved_total/ {print $2}'; }

direct -e "CREATE DATABASE fair; CREATE TABLE fair.big (id INT PRIMARY KEY, grp INT NOT NULL);
  CREATE DATABASE sbtest"
proxy() { # port mariadb-args...
  local port=$1
  shift
  mariadb -h127.0.0.1 -P"$port" -uroot -N --skip-ssl fair "$@"
}
proxy "${PORTS[0]}" -e "HSCALE SETUP_TABLE('big', 'id', 'big_default', 1, 'MOD(2)');
  HSCALE ADD_PARTITION('big', 'odd', 1, 1)"
# Filled straight on the backend: even ids in the default table, odd ones
# in the partition.
direct fair -e "INSERT INTO big_default SELECT seq * 2, seq % $((ROWS / 2)) FROM seq_1_to_$((ROWS / 2));
  INSERT INTO big_odd SELECT seq * 2 - 1, seq * 7 % $((ROWS / 2)) FROM seq_1_to_$((ROWS / 2))"
HEAVY="SELECT grp, COUNT(*) FROM big GROUP BY grp ORDER BY COUNT(*) DESC, grp"
for port in "${PORTS[@]}"; do proxy "$port" -e "HSCALE REFRESH"; done

sysbench_run() { # port
  sysbench oltp_point_select --db-driver=mysql --mysql-host=127.0.0.1 --mysql-port="$1" \
    --mysql-user=root --mysql-db=sbtest --tables=1 --table-size=10000 --threads=4 \
    --time="$SECONDS_EACH" --percentile=99 "${2:-run}"
}
sysbench_run "$DIRECT" prepare >/dev/null

echo "bench/fairness.sh: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $ROWS rows in $((ROWS / 2)) groups, threads = $THREADS, sysbench point_select 4 threads, ${SECONDS_EACH}s per cell"
echo
echo "| hscale | heavy statement beside | point selects/s | p99 (ms) | longest (ms) | heavy statement (s) | clients moved |"
echo "|---|---|---:|---:|---:|---:|---:|"
for i in "${!LABELS[@]}"; do
  port=${PORTS[$i]}
  alone=$(for _ in 1 2 3; do
    start=$(date +%s.%N)
    proxy "$port" -e "$HEAVY" >/dev/null
    echo "$start $(date +%s.%N)" | awk '{print $2 - $1}'
  done | median)
  echo "| ${LABELS[$i]} | alone | - | - | - | $alone | - |"
  for heavy in no yes; do
    timing=""
    moved0=$(moved "${HTTPS[$i]}")
    if [ "$heavy" = yes ]; then
      (
        while :; do
          start=$(date +%s.%N)
          proxy "$port" -e "$HEAVY" >/dev/null 2>&1 || true
          echo "$start $(date +%s.%N)" >>"$WORK/heavy.$i"
        done
      ) &
      HEAVY_PID=$!
      sleep 1
    fi
    out=$(sysbench_run "$port" 2>&1)
    if [ "$heavy" = yes ]; then
      kill "$HEAVY_PID" 2>/dev/null; wait "$HEAVY_PID" 2>/dev/null || true
      HEAVY_PID=""
      timing=$(awk '{print $2 - $1}' "$WORK/heavy.$i" | median)
    fi
    rate=$(echo "$out" | awk '/queries:/ {gsub(/[(]/, "", $3); print $3; exit}')
    p99=$(echo "$out" | awk '/99th percentile:/ {print $3; exit}')
    longest=$(echo "$out" | awk '/max:/ {print $2; exit}')
    moved1=$(moved "${HTTPS[$i]}")
    echo "| ${LABELS[$i]} | $heavy | $rate | $p99 | $longest | ${timing:--} | $(( ${moved1:-0} - ${moved0:-0} )) |"
  done
done

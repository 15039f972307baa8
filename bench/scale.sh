#!/usr/bin/env bash
# How hscale scales across cores: throughput and CPU per query with K worker
# threads, side by side with MariaDB direct, in one run.
#
#   bench/scale.sh [--seconds N] [--threads "1 2 4"] [--paths "tcp unix"]
#
# Two MariaDB servers (the second holds half of a partitioned table), then for
# each K and each path from hscale to MariaDB (TCP as in production, the unix
# socket for comparison): sysbench oltp_point_select at 64 threads with
# prepared statements and as text, the same on `sbtest1` partitioned by MOD(2)
# of id over both servers (each query routed to one), and the 2008 seed query at
# concurrency 1 and 40 (mariadb-slap). Clients always reach hscale over TCP.
#
# With 16 cores or more the work is pinned: hscale on the first quarter of the
# cores (K of them), the clients on the second quarter, MariaDB on the second
# half. With fewer cores nothing is pinned and the run shows only that the
# script works, not how hscale scales.
#
# On the lent machine, which has no network: `bench/carry.sh` here packs
# `.devcarry/` (hscale, MariaDB, sysbench and their libraries); carried there,
# this script finds it and uses it.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_EACH=10
THREADS=""
PATHS="tcp unix"
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_EACH=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --paths) PATHS=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

WORK=$(mktemp -d)
MARIADB_ARGS=()
if [ -f .devcarry/bundle.txz ]; then
  tar xJf .devcarry/bundle.txz -C "$WORK"
  export LD_LIBRARY_PATH="$WORK/lib" PATH="$WORK/bin:$PATH"
  export LUA_PATH="$WORK/share/sysbench/?.lua;;"
  MARIADB_ARGS=(--lc-messages-dir="$WORK/share/mysql/english" --character-sets-dir="$WORK/share/mysql/charsets")
  HSCALE=$WORK/bin/hscale
  POINT_SELECT=$WORK/share/sysbench/oltp_point_select.lua
else
  for tool in mariadbd mariadb-install-db mariadb-slap sysbench; do
    command -v "$tool" >/dev/null || [ -x "/usr/sbin/$tool" ] ||
      { echo "needs $tool (apt-get install mariadb-server mariadb-client sysbench)" >&2; exit 1; }
  done
  export PATH="$PATH:/usr/sbin"
  cargo build --release --quiet --bin hscale
  HSCALE=target/release/hscale
  POINT_SELECT=oltp_point_select
fi
source bench/common.sh

CORES=$(nproc)
if [ "$CORES" -ge 16 ]; then
  quarter=$((CORES / 4))
  PROXY_CORES=$((quarter < 8 ? quarter : 8))
  CLIENT_CORES="$quarter-$((2 * quarter - 1))"
  SERVER_CORES="$((2 * quarter))-$((CORES - 1))"
  default_threads="1 2 4 8"
else
  PROXY_CORES=$CORES CLIENT_CORES="" SERVER_CORES=""
  default_threads="1 2"
fi
if [ -z "$THREADS" ]; then
  for k in $default_threads; do [ "$k" -le "$PROXY_CORES" ] && THREADS="$THREADS $k"; done
fi
THREADS=$(echo $THREADS)
pinned() { # cores command...
  local cores=$1; shift
  if [ -n "$cores" ]; then taskset -c "$cores" "$@"; else "$@"; fi
}
# For a server started with `&`: the process itself, so that $! is its pid.
pinned_exec() { # cores command...
  local cores=$1; shift
  if [ -n "$cores" ]; then exec taskset -c "$cores" "$@"; else exec "$@"; fi
}

PIDS=()
trap 'stop_everything "${PIDS[@]}"; wait; rm -rf "$WORK"' EXIT
PORTS=()
SOCKETS=()
for n in 1 2; do
  data=$WORK/db$n
  if [ -f .devcarry/datadir.tgz ]; then
    mkdir -p "$data" && tar xzf .devcarry/datadir.tgz -C "$data"
  else
    mariadb-install-db --no-defaults --datadir="$data" --auth-root-authentication-method=normal \
      --skip-test-db >/dev/null
  fi
  port=$(free_port)
  pinned_exec "$SERVER_CORES" mariadbd --no-defaults --datadir="$data" --port="$port" --bind-address=127.0.0.1 \
    --socket="$data/mariadb.sock" --user=root --skip-name-resolve --max-connections=2000 \
    --innodb-buffer-pool-size=1G --log-error="$data/error.log" "${MARIADB_ARGS[@]}" >"$data/stdout.log" 2>&1 &
  PIDS+=($!)
  PORTS+=("$port")
  SOCKETS+=("$data/mariadb.sock")
  for _ in $(seq 1 150); do [ -S "$data/mariadb.sock" ] && break; sleep 0.2; done
  mariadb -S "$data/mariadb.sock" -uroot -e "CREATE USER app@'%' IDENTIFIED BY 'secret';
    GRANT ALL ON *.* TO app@'%'; CREATE DATABASE sbpart" || { tail "$data/error.log"; exit 1; }
done
MARIADB_PID=${PIDS[0]}
MARIADB2_PID=${PIDS[1]}

first() { mariadb -S "${SOCKETS[0]}" -uroot "$@"; }
first -e "CREATE DATABASE sbtest; CREATE DATABASE bench;
  CREATE TABLE bench.small (id INT UNSIGNED PRIMARY KEY,
    category ENUM('books','hardware','software')) ENGINE=HEAP;
  INSERT INTO bench.small VALUES (1,'books'),(2,'hardware'),(3,'software');"
ROWS=100000
sysbench_point_select() { # port database ps-mode command
  pinned "$CLIENT_CORES" sysbench "$POINT_SELECT" --db-driver=mysql --mysql-host=127.0.0.1 \
    --mysql-port="$1" --mysql-user=app --mysql-password=secret --mysql-db="$2" --tables=1 \
    --table-size="$ROWS" --threads=64 --time="$SECONDS_EACH" --db-ps-mode="$3" "$4"
}
sysbench_point_select "${PORTS[0]}" sbtest auto prepare >/dev/null
first -e "CREATE TABLE sbpart.sbtest1 LIKE sbtest.sbtest1; INSERT INTO sbpart.sbtest1 SELECT * FROM sbtest.sbtest1"

HSCALE_PORT=$(free_port)
start_hscale() { # threads backend-path
  local address1=127.0.0.1:${PORTS[0]} address2=127.0.0.1:${PORTS[1]}
  if [ "$2" = unix ]; then address1=${SOCKETS[0]} address2=${SOCKETS[1]}; fi
  cat >"$WORK/hscale.toml" <<EOF
[proxy]
listen = "127.0.0.1:$HSCALE_PORT"
http = "127.0.0.1:$(free_port)"
max_connections = 4096
threads = $1

[[users]]
name = "app"
password = "secret"
admin = true

[[backends]]
id = 1
address = "$address1"
user = "app"
password = "secret"
max_connections = 256

[[backends]]
id = 2
address = "$address2"
user = "app"
password = "secret"
max_connections = 256

[log]
level = "warn"
EOF
  pinned_exec "${SERVER_CORES:+0-$(($1 - 1))}" "$HSCALE" serve --config "$WORK/hscale.toml" >"$WORK/hscale.log" 2>&1 &
  HSCALE_PID=$!
  PIDS+=("$HSCALE_PID")
  for _ in $(seq 1 100); do
    mariadb -h127.0.0.1 -P"$HSCALE_PORT" -uapp -psecret -e 'SELECT 1' >/dev/null 2>&1 && return
    sleep 0.1
  done
  cat "$WORK/hscale.log"
  return 1
}
stop_hscale() { kill "$HSCALE_PID"; wait "$HSCALE_PID" 2>/dev/null || true; }

# The partitioned copy, set up once through hscale: odd ids move to server 2.
start_hscale 1 tcp
mariadb -h127.0.0.1 -P"$HSCALE_PORT" -uapp -psecret sbpart -e "
  HSCALE SETUP_TABLE('sbtest1', 'id', 'sbtest1_default', 1, 'MOD(2)');
  HSCALE ADD_PARTITION('sbtest1', 'odd', 1, 2);"
stop_hscale

# One measurement as a line of RESULTS: label path workload qps p95 proxy-µs mariadb-µs.
RESULTS=$WORK/results
measure() { # label path port proxy-pid-or-empty workload
  local label=$1 path=$2 port=$3 proxy=$4 workload=$5 out queries seconds p95=""
  local p0=0 m0 p1=0 m1
  [ -n "$proxy" ] && p0=$(cpu_ns "$proxy")
  m0=$(($(cpu_ns "$MARIADB_PID") + $(cpu_ns "$MARIADB2_PID")))
  case "$workload" in
    point_select_ps | point_select_text | routed_ps | routed_text)
      local db=sbtest mode=auto
      [[ $workload == routed_* ]] && db=sbpart
      [[ $workload == *_text ]] && mode=disable
      out=$(sysbench_point_select "$port" "$db" "$mode" run 2>&1)
      queries=$(echo "$out" | awk '/queries:/ {print $2; exit}')
      seconds=$(echo "$out" | awk '/total time:/ {sub(/s$/, "", $3); print $3; exit}')
      p95=$(echo "$out" | awk '/95th percentile:/ {print $3}')
      echo "$out" | grep -q "errors: *0 " || { echo "$label $workload:"; echo "$out" | tail -15; } >&2
      ;;
    seed_c1 | seed_c40)
      local c=${workload#seed_c}
      queries=$((c == 1 ? 2000 * SECONDS_EACH : 20000 * SECONDS_EACH))
      seconds=$(pinned "$CLIENT_CORES" mariadb-slap -h127.0.0.1 -P"$port" -uapp -psecret \
        --create-schema=bench --query="$QUERY" --concurrency="$c" --number-of-queries="$queries" \
        --iterations=1 --no-drop 2>&1 | sed -n 's/.*Average number of seconds to run all queries: \([0-9.]*\) seconds/\1/p')
      ;;
  esac
  [ -n "$proxy" ] && p1=$(cpu_ns "$proxy")
  m1=$(($(cpu_ns "$MARIADB_PID") + $(cpu_ns "$MARIADB2_PID")))
  awk -v l="$label" -v path="$path" -v w="$workload" -v q="${queries:-0}" -v s="${seconds:-0}" \
    -v p95="${p95:--}" -v p="$((p1 - p0))" -v m="$((m1 - m0))" \
    'BEGIN {if (q == 0 || s == 0) {q = 1; s = 0}
      printf "%s\t%s\t%s\t%.0f\t%s\t%.1f\t%.1f\n", l, path, w, s ? q / s : 0, p95, p / q / 1000, m / q / 1000}' >>"$RESULTS"
}

WORKLOADS="point_select_ps point_select_text routed_ps routed_text seed_c1 seed_c40"
echo "machine: $CORES cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
echo "mariadb: $(first -N -e 'SELECT VERSION()'), hscale: $("$HSCALE" --version)"
if [ -n "$SERVER_CORES" ]; then
  echo "pinned: hscale on cores 0..K-1, clients on $CLIENT_CORES, MariaDB on $SERVER_CORES"
else
  echo "not pinned ($CORES cores): these numbers do not show scaling"
fi
echo "sysbench: 64 threads, $SECONDS_EACH s per cell, $ROWS rows; routed: sbtest1 by MOD(2) of id over two servers"
echo

for workload in $WORKLOADS; do
  # The direct column of a routed workload is the plain table's.
  case $workload in routed_*) continue ;; esac
  measure direct - "${PORTS[0]}" "" "$workload"
done
for k in $THREADS; do
  for path in $PATHS; do
    start_hscale "$k" "$path"
    for workload in $WORKLOADS; do measure "K=$k" "$path" "$HSCALE_PORT" "$HSCALE_PID" "$workload"; done
    stop_hscale
  done
done

echo "| workload | hscale | path | queries/s | × direct | p95 (ms) | hscale CPU/query (µs) | MariaDB CPU/query (µs) |"
echo "|---|---|---|---:|---:|---:|---:|---:|"
awk -F'\t' '
  $1 == "direct" {direct[$3] = $4}
  {base = $3; sub(/^routed/, "point_select", base); d = direct[base]
   printf "| %s | %s | %s | %d | %s | %s | %s | %s |\n", $3, $1, $2, $4,
     d ? sprintf("%.2f", $4 / d) : "-", $5, $1 == "direct" ? "-" : $6, $7}' "$RESULTS" | sort -s -t'|' -k2,2

# The targets of issue 10: CPU per query flat from the fewest to the most
# threads, throughput growing with them, TCP within 2 µs of the unix socket.
echo
echo "| workload | path | K | CPU/query vs K=${THREADS%% *} | queries/s vs K=${THREADS%% *} |"
echo "|---|---|---:|---:|---:|"
awk -F'\t' '
  $1 != "direct" {key = $3 "|" $2; split($1, k, "=")
    if (!(key in first)) {first[key] = $6; firstq[key] = $4; keys[++n] = key}
    last[key] = $6; lastq[key] = $4; lastk[key] = k[2]}
  END {for (i = 1; i <= n; i++) {key = keys[i]; split(key, p, "|")
    printf "| %s | %s | %s | %+.0f%% | %.2f× |\n", p[1], p[2], lastk[key],
      first[key] ? 100 * (last[key] / first[key] - 1) : 0, firstq[key] ? lastq[key] / firstq[key] : 0}}' "$RESULTS"
echo
echo "| workload | K | TCP − unix CPU/query (µs) |"
echo "|---|---:|---:|"
awk -F'\t' '
  $1 != "direct" {cpu[$3 "|" $1 "|" $2] = $6; if (!seen[$3 "|" $1]++) order[++n] = $3 "|" $1}
  END {for (i = 1; i <= n; i++) {t = cpu[order[i] "|tcp"]; u = cpu[order[i] "|unix"]
    if (t != "" && u != "") {split(order[i], p, "|"); printf "| %s | %s | %+.1f |\n", p[1], p[2], t - u}}}' "$RESULTS"

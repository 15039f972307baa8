#!/usr/bin/env bash
# hscale's own work per seed query, in user-space instructions: hscale and the
# byte relay each run under callgrind, which counts instructions, not time, so
# the numbers repeat from run to run whatever else the machine does. The
# difference is what hscale's parsing, pooling and bookkeeping cost on top of
# moving the bytes; the kernel's share (the larger one) is not counted here.
#
#   bench/instructions.sh [--queries N] [--concurrency N]
set -euo pipefail
cd "$(dirname "$0")/.."

QUERIES=4000
CONCURRENCY=10
while [ $# -gt 0 ]; do
  case "$1" in
    --queries) QUERIES=$2; shift 2 ;;
    --concurrency) CONCURRENCY=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }

cargo build --release --quiet --bin hscale --example relay_floor
# The io_uring relay speaks to unix sockets only: every one here takes that path.
export BACKEND_PATH=unix
source bench/common.sh
WORK=$(mktemp -d)
PIDS=()
trap 'stop_everything "${PIDS[@]}"; rm -rf "$WORK"' EXIT
PLAYGROUND_PORT=$(free_port)
start_playground "$PLAYGROUND_PORT" "$WORK/playground.log"
create_seed_table

# A copy of `small` in database bench_part, partitioned once the plain query
# is measured: the query routed to one partition (the w/ partitions column of
# bench/partitions.sh).
mariadb -h127.0.0.1 -P"$DIRECT" -uroot -e "CREATE DATABASE bench_part;
  CREATE TABLE bench_part.small LIKE bench.small; INSERT INTO bench_part.small SELECT * FROM bench.small;"
partition_small() {
  mariadb -h127.0.0.1 -P"$PLAYGROUND_PORT" -uroot bench_part -e "
    HSCALE SETUP_TABLE('small', 'category', 'small_default', 1, 'NONE()');
    HSCALE ADD_PARTITION('small', 'books', 'books', 1);"
}

slap() { # port queries
  mariadb-slap -h127.0.0.1 -P"$1" -uroot --create-schema="${SCHEMA:-bench}" --query="$QUERY" \
    --number-of-queries="$2" --concurrency="$CONCURRENCY" --iterations=1 >/dev/null
}

# Starts `$@` under callgrind listening on $port, warms it up, then counts the
# instructions of $QUERIES seed queries only (counters zeroed before, dumped after),
# in database $SCHEMA (default bench).
instructions_per_query() { # name port command...
  local name=$1 port=$2; shift 2
  valgrind --tool=callgrind --callgrind-out-file="$WORK/$name.%p" "$@" >"$WORK/$name.log" 2>&1 &
  local pid=$!
  PIDS+=("$pid")
  for _ in $(seq 1 600); do
    mariadb -h127.0.0.1 -P"$port" -uroot -e 'SELECT 1' >/dev/null 2>&1 && break
    sleep 0.2
  done
  slap "$port" $((CONCURRENCY * 20))
  callgrind_control -z "$pid" >/dev/null 2>&1
  slap "$port" "$QUERIES"
  callgrind_control -d "$pid" >/dev/null 2>&1
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  # The dump made by -d is the one with a part number; its totals line counts Ir.
  local total
  total=$(cat "$WORK/$name.$pid".[0-9]* | awk '/^totals:/ {s += $2} END {print s}')
  awk -v t="$total" -v q="$QUERIES" 'BEGIN {printf "%.0f", t / q}'
}

HSCALE_PORT=$(free_port)
cat >"$WORK/hscale.toml" <<EOF
[proxy]
listen = "127.0.0.1:$HSCALE_PORT"

[[users]]
name = "root"
password = ""

[[backends]]
id = 1
address = "$SOCKET"
user = "root"

[log]
level = "warn"
EOF
RELAY_PORT=$(free_port)
# Plain: the playground partitions only demo.users, so the lexer checks the
# query's names and finds none partitioned (w/o partitions).
hscale=$(instructions_per_query hscale "$HSCALE_PORT" target/release/hscale serve --config "$WORK/hscale.toml")
partition_small
# The same query in bench, now that `small` is a partitioned table's name in
# bench_part: the plan cache tells it is not this database's (one lookup).
elsewhere=$(instructions_per_query elsewhere "$HSCALE_PORT" target/release/hscale serve --config "$WORK/hscale.toml")
routed=$(SCHEMA=bench_part instructions_per_query routed "$HSCALE_PORT" target/release/hscale serve --config "$WORK/hscale.toml")
relay=$(instructions_per_query relay "$RELAY_PORT" target/release/examples/relay_floor "127.0.0.1:$RELAY_PORT" "$SOCKET")

echo "user-space instructions per seed query ($QUERIES queries, concurrency $CONCURRENCY, callgrind):"
echo
echo "| hscale | byte relay | hscale's own work | hscale, name partitioned in another database | hscale, w/ partitions | routing's share |"
echo "|---:|---:|---:|---:|---:|---:|"
echo "| $hscale | $relay | $((hscale - relay)) | $elsewhere | $routed | $((routed - hscale)) |"

#!/usr/bin/env bash
# The order-entry application of issue 55 (crates/testkit/src/order_entry.rs:
# warehouses, districts, customers, orders, order lines, stock, history,
# items shared; foreign keys; new orders over two warehouses, payments of
# another warehouse's customers, deliveries, stock levels), run unmodified
# by 8 clients: against one server directly, then the same server through a
# byte relay that parses nothing (what any proxy gets on this machine), then
# through hscale with its tables partitioned by warehouse, MOD(2) over two
# backends, items a reference table — side by side in one run. Prints each run's transactions
# a second, what the application retried (deadlocks, lock waits), the
# deadlocks hscale ended, each run's consistency checks, and the ratio.
# --scale standard: the size of the application the issue was filed with
# (2 warehouses of the standard size, more than a server's buffer pool)
# instead of 8 small ones that fit it.
#
#   bench/order_entry.sh [--seconds N] [--clients N] [--scale bench|standard]
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_EACH=60
CLIENTS=8
export ORDER_ENTRY_SCALE=bench
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_EACH=$2; shift 2 ;;
    --clients) CLIENTS=$2; shift 2 ;;
    --scale) ORDER_ENTRY_SCALE=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

cargo build --release --quiet --bin hscale --bin order-entry --example relay_floor
source bench/common.sh
WORK=$(mktemp -d)
trap 'stop_everything ${RELAY_PID:-}; rm -rf "$WORK"' EXIT
PORT=$(free_port)
BACKENDS=2 start_playground "$PORT" "$WORK/playground.log"
start_relay
app=target/release/order-entry
proxy() { mariadb -h127.0.0.1 -P"$PORT" -uroot -N "$@"; }
mariadb -h127.0.0.1 -P"$DIRECT" -uroot -e "CREATE DATABASE one; CREATE DATABASE relayed; CREATE DATABASE sharded"
mariadb -h127.0.0.1 -P"$DIRECT2" -uroot -e "CREATE DATABASE sharded"
$app create "$DIRECT" one
$app load "$DIRECT" one
$app create "$DIRECT" relayed
$app load "$DIRECT" relayed
$app create "$DIRECT" sharded
$app shard "$PORT" sharded
started=$(date +%s.%N)
$app load "$PORT" sharded
echo "loaded through hscale in $(echo "$(date +%s.%N) - $started" | bc | xargs printf '%.1f') s"

echo "machine: $(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
echo "mariadb: $(proxy -e 'SELECT VERSION()'), hscale: $(target/release/hscale --version); $CLIENTS clients, $SECONDS_EACH s each, scale $ORDER_ENTRY_SCALE"
run() { # name port db
  local out
  out=$($app run "$2" "$3" "$CLIENTS" "$SECONDS_EACH")
  echo "$1: $out" >&2
  echo "$1 checks: $($app check "$2" "$3" | head -1)" >&2
  echo "$out" | sed -n 's/^\([0-9.]*\) transactions.*/\1/p'
}
one_server_relay_then_hscale one relayed sharded "at least 0.8"

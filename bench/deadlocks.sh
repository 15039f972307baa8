#!/usr/bin/env bash
# sysbench oltp_write_only (issue 55 point 7): 8 threads on sbtest1
# partitioned by MOD(2) of id over two backends, the default configuration
# and the servers' default innodb_lock_wait_timeout (50 s), against the
# same table on one server directly and through a byte relay that parses
# nothing (what any proxy gets on this machine), side by side in one run. Its
# transactions write rows on both backends: two of them can wait for each
# other through two servers, which neither sees; hscale's deadlock detector
# ends one with 1213, which sysbench retries. Prints each run's
# transactions a second, the seconds with no transaction at all (sysbench's
# per-second report), the errors sysbench retried, the deadlocks hscale
# ended (HSCALE STATUS), the longest transaction, the CPU both servers and
# the proxy (hscale or the relay) spent per transaction, and the ratio to
# one server.
#
#   bench/deadlocks.sh [--seconds N] [--threads N] [--rows N]
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_EACH=120
THREADS=8
ROWS=10000
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_EACH=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --rows) ROWS=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

cargo build --release --quiet --bin hscale --example relay_floor
source bench/common.sh
WORK=$(mktemp -d)
trap 'stop_everything ${RELAY_PID:-}; rm -rf "$WORK"' EXIT
PORT=$(free_port)
BACKENDS=2 start_playground "$PORT" "$WORK/playground.log"
start_relay
proxy() { mariadb -h127.0.0.1 -P"$PORT" -uroot -N "$@"; }
sb() { # port db more...
  local port=$1 db=$2; shift 2
  sysbench oltp_write_only --db-driver=mysql --mysql-host=127.0.0.1 --mysql-port="$port" \
    --mysql-user=root --mysql-password= --mysql-db="$db" --tables=1 --table-size="$ROWS" "$@"
}
mariadb -h127.0.0.1 -P"$DIRECT" -uroot -e "CREATE DATABASE sb; CREATE DATABASE one; CREATE DATABASE relayed"
mariadb -h127.0.0.1 -P"$DIRECT2" -uroot -e "CREATE DATABASE sb"
sb "$DIRECT" sb prepare >/dev/null
sb "$DIRECT" one prepare >/dev/null
sb "$DIRECT" relayed prepare >/dev/null
proxy sb -e "HSCALE SETUP_TABLE('sbtest1', 'id', 'sbtest1_default', 1, 'MOD(2)'); HSCALE ADD_PARTITION('sbtest1', 'odd', 1, 2)"

echo "machine: $(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
echo "mariadb: $(proxy -e 'SELECT VERSION()'), hscale: $(target/release/hscale --version); $THREADS threads, $ROWS rows, $SECONDS_EACH s each"
M2_PID=$(sed -n 's/^backend 2: .*(pid \([0-9]*\)).*/\1/p' "$WORK/playground.log")
# CPU nanoseconds so far: both servers, then the proxies (hscale, the relay).
servers_ns() { echo $(( $(cpu_ns "$MARIADB_PID") + $(cpu_ns "$M2_PID") )); }
proxies_ns() { echo $(( $(cpu_ns "$PLAYGROUND_PID") + $(cpu_ns "$RELAY_PID") )); }
run() { # name port db
  local out servers proxies
  servers=$(servers_ns); proxies=$(proxies_ns)
  out=$(sb "$2" "$3" --threads="$THREADS" --time="$SECONDS_EACH" --report-interval=1 --db-ps-mode=disable run)
  servers=$(( $(servers_ns) - servers )); proxies=$(( $(proxies_ns) - proxies ))
  local tps count zero errors max
  tps=$(echo "$out" | sed -n 's/.*transactions: *[0-9]* *(\([0-9.]*\) per sec.*/\1/p')
  count=$(echo "$out" | sed -n 's/.*transactions: *\([0-9]*\) *(.*/\1/p')
  zero=$(echo "$out" | grep -c ' tps: 0\.00 ' || true)
  errors=$(echo "$out" | sed -n 's/.*ignored errors: *\([0-9]*\).*/\1/p')
  max=$(echo "$out" | sed -n 's/^ *max: *\([0-9.]*\)$/\1/p')
  echo "$1: $tps tps, seconds with 0 transactions: $zero, errors sysbench retried: $errors, longest transaction $max ms; CPU per transaction: servers $((servers / count / 1000)) us, proxy $((proxies / count / 1000)) us" >&2
  echo "$tps"
}
one_server_relay_then_hscale one relayed sb "at least 0.75, no second with 0 transactions"

#!/usr/bin/env bash
# Bulk loading (issue 55 point 8): multi-row INSERTs of about 512 KB each
# (an order-entry loader's), into a table partitioned by MOD(2) of its
# warehouse over two backends through hscale, and into the same table on
# one server directly, side by side in one run. Prints each load's seconds,
# the ratio, and hscale's CPU seconds for its load; with --perf, where
# hscale's CPU went (perf report, top symbols).
#
#   bench/bulk.sh [--statements N] [--rows N] [--perf]
set -euo pipefail
cd "$(dirname "$0")/.."

STATEMENTS=20
ROWS=5000
while [ $# -gt 0 ]; do
  case "$1" in
    --statements) STATEMENTS=$2; shift 2 ;;
    --rows) ROWS=$2; shift 2 ;;
    --perf) PERF=1; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

cargo build --release --quiet --bin hscale
source bench/common.sh
WORK=$(mktemp -d)
trap 'stop_everything; rm -rf "$WORK"' EXIT
PORT=$(free_port)
BACKENDS=2 start_playground "$PORT" "$WORK/playground.log"
STOCK="CREATE TABLE stock (s_w_id INT NOT NULL, s_i_id INT NOT NULL, s_quantity INT, s_data VARCHAR(100), PRIMARY KEY (s_w_id, s_i_id))"
mariadb -h127.0.0.1 -P"$DIRECT" -uroot -e "CREATE DATABASE bulk; CREATE DATABASE one; USE bulk; $STOCK; USE one; $STOCK"
mariadb -h127.0.0.1 -P"$DIRECT2" -uroot -e "CREATE DATABASE bulk"
mariadb -h127.0.0.1 -P"$PORT" -uroot bulk -e "HSCALE SETUP_TABLE('stock', 's_w_id', 'stock_default', 1, 'MOD(2)'); HSCALE ADD_PARTITION('stock', 'odd', 1, 2)"
# Each statement: ROWS rows of one item range over four warehouses.
python3 - "$STATEMENTS" "$ROWS" >"$WORK/load.sql" <<'PY'
import sys
statements, rows = int(sys.argv[1]), int(sys.argv[2])
data = "x" * 60
for s in range(statements):
    values = ",".join(
        f"({r % 4 + 1},{s * rows + r},{r % 100},'{data}{r:08d}')" for r in range(rows)
    )
    print(f"INSERT INTO stock VALUES {values};")
PY
echo "machine: $(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
echo "hscale: $(target/release/hscale --version); $STATEMENTS INSERTs of $ROWS rows, $(($(stat -c %s "$WORK/load.sql") / STATEMENTS / 1024)) KB each"
load() { # port db
  local started
  started=$(date +%s.%N)
  mariadb -h127.0.0.1 -P"$1" -uroot --max-allowed-packet=64M "$2" <"$WORK/load.sql"
  echo "$(date +%s.%N) - $started" | bc
}
direct=$(load "$DIRECT" one)
cpu_before=$(cpu_ns "$PLAYGROUND_PID")
if [ -n "${PERF:-}" ]; then
  perf record -F 999 -g -o "$WORK/perf.data" -p "$PLAYGROUND_PID" 2>/dev/null &
  PERF_PID=$!
  sleep 0.5
fi
through=$(load "$PORT" bulk)
cpu=$(( $(cpu_ns "$PLAYGROUND_PID") - cpu_before ))
[ -n "${PERF:-}" ] && { kill -INT "$PERF_PID"; wait "$PERF_PID" || true; }
rows=$(mariadb -h127.0.0.1 -P"$PORT" -uroot -N bulk -e "SELECT COUNT(*) FROM stock")
[ "$rows" = "$((STATEMENTS * ROWS))" ] || { echo "rows through hscale: $rows, expected $((STATEMENTS * ROWS))"; exit 1; }
echo "one server directly: ${direct} s; through hscale, MOD(2) over two backends: ${through} s; hscale/direct $(awk -v a="$through" -v b="$direct" 'BEGIN {printf "%.2f", a / b}') (target: at most 2)"
echo "hscale CPU for its load: $(awk -v n="$cpu" 'BEGIN {printf "%.2f", n / 1e9}') s"
if [ -n "${PERF:-}" ]; then
  perf report -i "$WORK/perf.data" --no-children --sort symbol --stdio 2>/dev/null | grep -v '^#' | grep '%' | head -25
fi

#!/usr/bin/env bash
# Writes over two backends (issue 40): the same autocommitted 10-row INSERT
# ... ON DUPLICATE KEY UPDATE, 5 rows on each backend, through two hscale
# instances on the same servers and dictionary, side by side in one run:
# one with transactions = "atomic" (two-phase commit: XA START, END,
# PREPARE, the decision in the dictionary, XA COMMIT) and one with "multi"
# (BEGIN and COMMIT on each backend in turn, not atomic). Also a 1-row
# INSERT (one backend: no XA) through both. Queries per second, medians of
# --runs interleaved rounds, and the ratio.
#
#   bench/atomic.sh [--queries N] [--runs N] [--concurrency N]
set -euo pipefail
cd "$(dirname "$0")/.."

QUERIES=2000
RUNS=3
CONCURRENCY=1
while [ $# -gt 0 ]; do
  case "$1" in
    --queries) QUERIES=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --concurrency) CONCURRENCY=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

cargo build --release --quiet --bin hscale
source bench/common.sh
WORK=$(mktemp -d)
trap 'stop_everything ${SERVE_PID:-}; rm -rf "$WORK"' EXIT
PORT=$(free_port)
BACKENDS=2 start_playground "$PORT" "$WORK/playground.log"
MULTI=$(free_port)
start_serve target/release/hscale "$MULTI" "$WORK/multi.log" "$BACKEND" \
  "$(printf '[[backends]]\nid = 2\naddress = "127.0.0.1:%s"\nuser = "root"' "$DIRECT2")" \
  'transactions = "multi"'

proxy() { mariadb -h127.0.0.1 -P"$PORT" -uroot -N "$@"; }
proxy -e "CREATE DATABASE bench; CREATE TABLE bench.t (id INT PRIMARY KEY, v INT NOT NULL);
  HSCALE SETUP_TABLE('bench.t', 'id', 't_even', 1, 'MOD(2)');
  HSCALE ADD_PARTITION('bench.t', 'odd', 1, 2);"
ROWS=$(seq 1 10 | sed 's/.*/(&, 0)/' | paste -sd,)
TEN="INSERT INTO t VALUES $ROWS ON DUPLICATE KEY UPDATE v = v + 1"
ONE="INSERT INTO t VALUES (2, 0) ON DUPLICATE KEY UPDATE v = v + 1"

qps() { # port query
  mariadb-slap -h127.0.0.1 -P"$1" -uroot --create-schema=bench --query="$2" \
    --number-of-queries="$QUERIES" --concurrency="$CONCURRENCY" --iterations=1 2>&1 |
    sed -n 's/.*Average number of seconds to run all queries: \([0-9.]*\) seconds/\1/p' |
    awk -v q="$QUERIES" '{printf "%.0f", q / $1}'
}

echo "machine: $(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
echo "mariadb: $(proxy -e 'SELECT VERSION()'), hscale: $(target/release/hscale --version); $QUERIES statements, concurrency $CONCURRENCY, median of $RUNS interleaved rounds"
for name in TEN ONE; do
  query=${!name}
  : >"$WORK/atomic" && : >"$WORK/multi"
  for _ in $(seq 1 "$RUNS"); do
    qps "$PORT" "$query" >>"$WORK/atomic"; echo >>"$WORK/atomic"
    qps "$MULTI" "$query" >>"$WORK/multi"; echo >>"$WORK/multi"
  done
  a=$(median <"$WORK/atomic"); m=$(median <"$WORK/multi")
  case $name in
    TEN) what="10 rows over two backends" ;;
    ONE) what="1 row, one backend        " ;;
  esac
  echo "$what: atomic $a q/s, multi $m q/s, atomic/multi $(awk -v a="$a" -v m="$m" 'BEGIN {printf "%.2f", a / m}')"
done
xa() { mariadb -h127.0.0.1 -P"$1" -uroot -N -e "SHOW GLOBAL STATUS LIKE 'Com_xa_commit'" | awk '{print $2}'; }
echo "XA COMMITs on backend 1 / 2: $(xa "$DIRECT") / $(xa "$DIRECT2") (the atomic instance's 10-row statements only)"

#!/usr/bin/env bash
# Writes over two backends (issue 40): the same autocommitted 10-row INSERT
# ... ON DUPLICATE KEY UPDATE, 5 rows on each backend, through two hscale
# instances on the same servers and dictionary, side by side in one run:
# one with transactions = "atomic" (two-phase commit: XA START, END,
# PREPARE, the decision in the dictionary, XA COMMIT) and one with "multi"
# (BEGIN and COMMIT on each backend in turn, not atomic). Also a 1-row
# INSERT (one backend: no XA) and a transaction of one INSERT (one backend:
# XA START ... XA COMMIT ONE PHASE in atomic mode, BEGIN ... COMMIT in
# multi) through both. Queries per second, medians of --runs interleaved
# rounds, and the ratio. Then transactions over both backends (BEGIN, an
# UPDATE on each, COMMIT) through the atomic instance by PyMySQL clients
# with and without CLIENT_MULTI_STATEMENTS (without, hscale sends its
# decision and each branch's XA START as queries of their own: issue 54),
# --concurrency clients, medians of --runs interleaved rounds and the
# ratio. Then sysbench oltp_write_only on sbtest1
# partitioned by MOD(2) of id (its transactions write on both backends),
# --seconds per cell, atomic and multi interleaved.
#
#   bench/atomic.sh [--queries N] [--runs N] [--concurrency N] [--seconds N]
#                   [--threads N] [--sysbench-only] [--multi-statements-only]
#
# A deadlock across two servers is seen by neither: it ends when a lock
# wait times out. The servers' innodb_lock_wait_timeout is set to 1 s for
# sysbench (its default, 50 s, leaves threads waiting through whole runs);
# sysbench retries what timed out (1205), in both modes.
set -euo pipefail
cd "$(dirname "$0")/.."

QUERIES=2000
RUNS=3
CONCURRENCY=1
SECONDS_EACH=10
THREADS=8
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_EACH=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --sysbench-only) SYSBENCH_ONLY=1; shift ;;
    --multi-statements-only) MULTI_STATEMENTS_ONLY=1; shift ;;
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
TX="BEGIN;$ONE;COMMIT"

qps() { # port query [statements per query]
  local per=${3:-1}
  mariadb-slap -h127.0.0.1 -P"$1" -uroot --create-schema=bench --query="$2" --delimiter=";" \
    --number-of-queries="$((QUERIES * per))" --concurrency="$CONCURRENCY" --iterations=1 2>&1 |
    sed -n 's/.*Average number of seconds to run all queries: \([0-9.]*\) seconds/\1/p' |
    awk -v q="$QUERIES" '{printf "%.0f", q / $1}'
}

echo "machine: $(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
echo "mariadb: $(proxy -e 'SELECT VERSION()'), hscale: $(target/release/hscale --version); $QUERIES statements, concurrency $CONCURRENCY, median of $RUNS interleaved rounds"
# Every XA statement but XA RECOVER (recovery's), on both backends.
xa_statements() {
  local sum=0 port
  for port in "$DIRECT" "$DIRECT2"; do
    sum=$((sum + $(mariadb -h127.0.0.1 -P"$port" -uroot -N -e "SELECT SUM(VARIABLE_VALUE) FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME LIKE 'COM_XA_%' AND VARIABLE_NAME <> 'COM_XA_RECOVER'")))
  done
  echo "$sum"
}
for name in $([ -n "${SYSBENCH_ONLY:-}${MULTI_STATEMENTS_ONLY:-}" ] || echo TEN ONE TX); do
  query=${!name}
  per=1
  [ "$name" = TX ] && per=3
  xa_before=$(xa_statements)
  : >"$WORK/atomic" && : >"$WORK/multi"
  for _ in $(seq 1 "$RUNS"); do
    qps "$PORT" "$query" "$per" >>"$WORK/atomic"; echo >>"$WORK/atomic"
    qps "$MULTI" "$query" "$per" >>"$WORK/multi"; echo >>"$WORK/multi"
  done
  a=$(median <"$WORK/atomic"); m=$(median <"$WORK/multi")
  case $name in
    TEN) what="10 rows over two backends (statements/s)" ;;
    ONE) what="1 row, one backend (statements/s)       " ;;
    TX) what="BEGIN, 1 row, COMMIT on one backend (tps)" ;;
  esac
  echo "$what: atomic $a q/s, multi $m q/s, atomic/multi $(awk -v a="$a" -v m="$m" 'BEGIN {printf "%.2f", a / m}'), XA statements on the backends: $(($(xa_statements) - xa_before))"
done
xa() { mariadb -h127.0.0.1 -P"$1" -uroot -N -e "SHOW GLOBAL STATUS LIKE 'Com_xa_prepare'" | awk '{print $2}'; }
[ -n "${SYSBENCH_ONLY:-}${MULTI_STATEMENTS_ONLY:-}" ] || echo "XA PREPAREs on backend 1 / 2: $(xa "$DIRECT") / $(xa "$DIRECT2") (the atomic instance's 10-row statements only)"

# Transactions over both backends by clients with and without
# CLIENT_MULTI_STATEMENTS (PyMySQL, which leaves it off by default).
if [ -z "${SYSBENCH_ONLY:-}" ]; then
  python3 -m venv "$WORK/venv" && "$WORK/venv/bin/pip" install -q PyMySQL==1.2.4
  cat >"$WORK/tx.py" <<'PY'
import sys, threading, time, pymysql
from pymysql.constants import CLIENT
port, flags, clients, count = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
flag = CLIENT.MULTI_STATEMENTS if flags == "multi" else 0
def run(i):
    conn = pymysql.connect(host="127.0.0.1", port=port, user="root", database="bench",
                           autocommit=True, client_flag=flag)
    cur = conn.cursor()
    even, odd = 1000 + 2 * i, 1001 + 2 * i
    cur.execute(f"INSERT INTO t VALUES ({even}, 0), ({odd}, 0) ON DUPLICATE KEY UPDATE v = 0")
    for _ in range(count):
        cur.execute("BEGIN")
        cur.execute(f"UPDATE t SET v = v + 1 WHERE id = {even}")
        cur.execute(f"UPDATE t SET v = v + 1 WHERE id = {odd}")
        cur.execute("COMMIT")
    conn.close()
threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
started = time.monotonic()
for t in threads: t.start()
for t in threads: t.join()
print(f"{clients * count / (time.monotonic() - started):.0f}")
PY
  : >"$WORK/without" && : >"$WORK/with"
  for _ in $(seq 1 "$RUNS"); do
    "$WORK/venv/bin/python" "$WORK/tx.py" "$PORT" none "$CONCURRENCY" "$((QUERIES / 4))" >>"$WORK/without"
    "$WORK/venv/bin/python" "$WORK/tx.py" "$PORT" multi "$CONCURRENCY" "$((QUERIES / 4))" >>"$WORK/with"
  done
  wo=$(median <"$WORK/without"); wi=$(median <"$WORK/with")
  echo "BEGIN, UPDATE on each backend, COMMIT, atomic (tps): without multi-statements $wo, with $wi, with/without $(awk -v a="$wi" -v b="$wo" 'BEGIN {printf "%.2f", a / b}') (target: at most 1.10)"
fi
[ -n "${MULTI_STATEMENTS_ONLY:-}" ] && exit 0

# sysbench oltp_write_only, 10,000 rows by MOD(2) of id over both backends.
sb() { # port more...
  local port=$1; shift
  sysbench oltp_write_only --db-driver=mysql --mysql-host=127.0.0.1 --mysql-port="$port" \
    --mysql-user=root --mysql-password= --mysql-db=sb --tables=1 --table-size=10000 "$@"
}
tps() { sed -n 's/.*transactions: *[0-9]* *(\([0-9.]*\) per sec.*/\1/p'; }
errors() { sed -n 's/.*ignored errors: *\([0-9]*\).*/\1/p'; }
if command -v sysbench >/dev/null; then
  mariadb -h127.0.0.1 -P"$DIRECT" -uroot -e "CREATE DATABASE sb; SET GLOBAL innodb_lock_wait_timeout = 1"
  mariadb -h127.0.0.1 -P"$DIRECT2" -uroot -e "CREATE DATABASE sb; SET GLOBAL innodb_lock_wait_timeout = 1"
  sb "$DIRECT" prepare >/dev/null
  proxy sb -e "HSCALE SETUP_TABLE('sbtest1', 'id', 'sbtest1_default', 1, 'MOD(2)'); HSCALE ADD_PARTITION('sbtest1', 'odd', 1, 2)"
  : >"$WORK/atomic" && : >"$WORK/multi"
  for _ in $(seq 1 "$RUNS"); do
    for mode in atomic multi; do
      port=$PORT
      [ "$mode" = multi ] && port=$MULTI
      out=$(sb "$port" --threads="$THREADS" --time="$SECONDS_EACH" --db-ps-mode=disable run)
      echo "$out" | tps >>"$WORK/$mode"
      printf '%s\n%s\n' "$(echo "$out" | tps)" "$(echo "$out" | errors)" >"$WORK/$mode.errors"
    done
  done
  a=$(median <"$WORK/atomic"); m=$(median <"$WORK/multi")
  echo "sysbench oltp_write_only, MOD(2), $THREADS threads (tps): atomic $a, multi $m, atomic/multi $(awk -v a="$a" -v m="$m" 'BEGIN {printf "%.2f", a / m}')"
  echo "  lock waits that timed out (1205) or deadlocks (1213) sysbench retried, last round: atomic $(sed -n 2p "$WORK/atomic.errors"), multi $(sed -n 2p "$WORK/multi.errors")"
fi

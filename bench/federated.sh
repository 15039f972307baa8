#!/usr/bin/env bash
# Statements no partition answers alone (issue 41), MariaDB direct on plain
# tables against hscale on the same rows partitioned over two backends, side
# by side in one run:
#   a selective join that is not co-located: one user by its id and its few
#     orders (orders partitioned by MOD(2) of their own id, joined by
#     user_id): hscale copies the user's row, then the orders of that user
#     (`user_id IN (...)`), and runs the join over the copies;
#   a full join of ROWS users x ROWS orders, COUNT and SUM over it;
#   a join with a reference table inside the partitions, against the same
#     join of two co-located tables;
#   BIG_ROWS x BIG_ROWS joined, and a derived table of 2 x BIG_ROWS rows,
#     with hscale's peak RSS (VmHWM).
#
#   bench/federated.sh [--rows N] [--big-rows N] [--runs N] [--queries N]
set -euo pipefail
cd "$(dirname "$0")/.."

ROWS=100000
BIG_ROWS=1000000
RUNS=3
QUERIES=2000
while [ $# -gt 0 ]; do
  case "$1" in
    --rows) ROWS=$2; shift 2 ;;
    --big-rows) BIG_ROWS=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --queries) QUERIES=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

cargo build --release --quiet --bin hscale
source bench/common.sh
WORK=$(mktemp -d)
trap 'stop_everything; rm -rf "$WORK"' EXIT
PORT=$(free_port)
BACKENDS=2 start_playground "$PORT" "$WORK/playground.log"
HSCALE_PID=$PLAYGROUND_PID

direct() { mariadb -h127.0.0.1 -P"$DIRECT" -uroot -N "$@"; }
direct2() { mariadb -h127.0.0.1 -P"$DIRECT2" -uroot -N "$@"; }
proxy() { mariadb -h127.0.0.1 -P"$PORT" -uroot -N "$@"; }
peak_rss_mib() { awk '/VmHWM/ {printf "%.1f", $2/1024}' /proc/"$HSCALE_PID"/status; }
median() { sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
seconds() { # port db query: the wall time of one run
  local start end
  start=$(date +%s.%N)
  mariadb -h127.0.0.1 -P"$1" -uroot -N "$2" -e "$3" >/dev/null
  end=$(date +%s.%N)
  awk -v s="$start" -v e="$end" 'BEGIN {printf "%.3f", e - s}'
}
qps() { # port db query-file
  mariadb-slap -h127.0.0.1 -P"$1" -uroot --create-schema="$2" --query="$3" --delimiter=";" \
    --number-of-queries="$QUERIES" --concurrency=1 --iterations=1 2>&1 |
    sed -n 's/.*Average number of seconds to run all queries: \([0-9.]*\) seconds/\1/p' |
    awk -v q="$QUERIES" '{printf "%.0f", q / $1}'
}

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
echo "mariadb: $(direct -e 'SELECT VERSION()'), hscale: $(target/release/hscale --version); $ROWS rows, median of $RUNS runs"
echo

USERS="CREATE TABLE users (id INT PRIMARY KEY, nickname VARCHAR(32) NOT NULL, country CHAR(2) NOT NULL)"
ORDERS="CREATE TABLE orders (id INT PRIMARY KEY, user_id INT NOT NULL, total DECIMAL(10,2) NOT NULL, KEY (user_id))"
COUNTRIES="CREATE TABLE countries (code CHAR(2) PRIMARY KEY, name VARCHAR(32) NOT NULL)"
fill_users() { # port db table rows where
  mariadb -h127.0.0.1 -P"$1" -uroot "$2" -e "INSERT INTO $3 SELECT seq, CONCAT('user', seq),
    ELT(1 + seq % 4, 'de', 'fr', 'us', 'it') FROM seq_1_to_$4 WHERE $5"
}
fill_orders() { # port db table rows where: about 3 orders per user
  mariadb -h127.0.0.1 -P"$1" -uroot "$2" -e "INSERT INTO $3 SELECT seq, 1 + (seq * 7919) % ($4 / 3),
    (seq * 104729 % 100000) / 100 FROM seq_1_to_$4 WHERE $5"
}
# hscale: users by MOD(2) of id, orders by MOD(2) of their own id (so a
# join by user_id is not co-located), items by MOD(2) of user_id (co-located
# with users); the oracle: the same rows in plain tables on backend 1.
setup() { # rows db
  local rows=$1 db=$2
  for port in "$DIRECT" "$DIRECT2"; do
    mariadb -h127.0.0.1 -P"$port" -uroot -e "CREATE DATABASE $db; CREATE DATABASE ${db}_oracle"
  done
  direct "$db" -e "$USERS; $ORDERS; $COUNTRIES; CREATE TABLE items LIKE orders"
  direct "${db}_oracle" -e "$USERS; $ORDERS; $COUNTRIES; CREATE TABLE items LIKE orders"
  proxy "$db" -e "HSCALE SETUP_TABLE('users', 'id', 'users_default', 1, 'MOD(2)');
    HSCALE ADD_PARTITION('users', 'odd', 1, 2);
    HSCALE SETUP_TABLE('orders', 'id', 'orders_default', 1, 'MOD(2)');
    HSCALE ADD_PARTITION('orders', 'odd', 1, 2);
    HSCALE SETUP_TABLE('items', 'user_id', 'items_default', 1, 'MOD(2)');
    HSCALE ADD_PARTITION('items', 'odd', 1, 2)"
  fill_users "$DIRECT" "$db" users_default "$rows" "seq % 2 = 0"
  fill_users "$DIRECT2" "$db" users_odd "$rows" "seq % 2 = 1"
  fill_orders "$DIRECT" "$db" orders_default "$rows" "seq % 2 = 0"
  fill_orders "$DIRECT2" "$db" orders_odd "$rows" "seq % 2 = 1"
  fill_orders "$DIRECT" "$db" items_default "$rows" "(1 + (seq * 7919) % ($rows / 3)) % 2 = 0"
  fill_orders "$DIRECT2" "$db" items_odd "$rows" "(1 + (seq * 7919) % ($rows / 3)) % 2 = 1"
  fill_users "$DIRECT" "${db}_oracle" users "$rows" "TRUE"
  fill_orders "$DIRECT" "${db}_oracle" orders "$rows" "TRUE"
  fill_orders "$DIRECT" "${db}_oracle" items "$rows" "TRUE"
  for d in "$db" "${db}_oracle"; do
    direct "$d" -e "INSERT INTO countries VALUES ('de', 'Germany'), ('fr', 'France'), ('us', 'USA'), ('it', 'Italy')"
  done
  if proxy "$db" -e "HSCALE SETUP_REFERENCE('countries')" 2>/dev/null; then
    REFERENCE=yes
  else
    REFERENCE=no
  fi
}

setup "$ROWS" fed
same() { # query: hscale's answer is the plain tables'
  [ "$(proxy fed -e "$1" | sort)" = "$(direct fed_oracle -e "$1" | sort)" ] || { echo "different answers: $1" >&2; exit 1; }
}

# A selective join: one user by its id, its orders; different users.
: >"$WORK/selective.sql"
for i in $(seq 1 200); do
  id=$(( (i * 7919) % (ROWS / 3) + 1 ))
  echo "SELECT u.nickname, o.id, o.total FROM users u JOIN orders o ON o.user_id = u.id WHERE u.id = $id;" >>"$WORK/selective.sql"
done
same "$(head -1 "$WORK/selective.sql")"
: >"$WORK/d" && : >"$WORK/h"
for _ in $(seq 1 "$RUNS"); do
  qps "$DIRECT" fed_oracle "$WORK/selective.sql" >>"$WORK/d"; echo >>"$WORK/d"
  qps "$PORT" fed "$WORK/selective.sql" >>"$WORK/h"; echo >>"$WORK/h"
done
d=$(median <"$WORK/d"); h=$(median <"$WORK/h")
echo "selective join, not co-located (one user, ~3 orders; queries/s, 1 client): direct $d, hscale $h, time hscale/direct $(ratio "$d" "$h") (target <= 2.5)"

# A full join.
FULL="SELECT COUNT(*), SUM(o.total), SUM(LENGTH(u.nickname)) FROM users u JOIN orders o ON o.user_id = u.id"
same "$FULL"
: >"$WORK/d" && : >"$WORK/h"
for _ in $(seq 1 "$RUNS"); do
  seconds "$DIRECT" fed_oracle "$FULL" >>"$WORK/d"; echo >>"$WORK/d"
  seconds "$PORT" fed "$FULL" >>"$WORK/h"; echo >>"$WORK/h"
done
d=$(median <"$WORK/d"); h=$(median <"$WORK/h")
echo "full join, $ROWS users x $ROWS orders (s): direct $d, hscale $h, hscale/direct $(ratio "$h" "$d") (target <= 6)"
echo "  hscale's peak RSS so far: $(peak_rss_mib) MiB"

# A join with a reference table inside each partition, against a join of two
# co-located tables.
if [ "$REFERENCE" = yes ]; then
  REF="SELECT c.name, COUNT(*) FROM users u JOIN countries c ON c.code = u.country WHERE u.id % 10 = 3 GROUP BY c.name"
  COLO="SELECT l.id, COUNT(*) FROM users u JOIN items l ON l.user_id = u.id WHERE u.id % 10 = 3 GROUP BY l.id % 4"
  same "$REF"
  : >"$WORK/r" && : >"$WORK/c"
  for _ in $(seq 1 "$RUNS"); do
    seconds "$PORT" fed "$REF" >>"$WORK/r"; echo >>"$WORK/r"
    seconds "$PORT" fed "$COLO" >>"$WORK/c"; echo >>"$WORK/c"
  done
  r=$(median <"$WORK/r"); c=$(median <"$WORK/c")
  echo "reference-table join inside partitions (s): $r; a co-located join: $c; reference/co-located $(ratio "$r" "$c") (target <= 1.3)"
else
  echo "reference tables: HSCALE SETUP_REFERENCE is not there yet"
fi

# Memory: big copies.
if [ "$BIG_ROWS" -gt 0 ]; then
  setup "$BIG_ROWS" big
  before=$(peak_rss_mib)
  BIGJOIN="SELECT COUNT(*), SUM(o.total) FROM users u JOIN orders o ON o.user_id = u.id"
  echo "join of $BIG_ROWS x $BIG_ROWS rows: $(seconds "$PORT" big "$BIGJOIN") s through hscale, $(seconds "$DIRECT" big_oracle "$BIGJOIN") s direct"
  DERIVED="SELECT COUNT(*), MAX(n) FROM (SELECT id, nickname n FROM users UNION ALL SELECT id, user_id FROM orders) d"
  echo "derived table of $((2 * BIG_ROWS)) rows: $(seconds "$PORT" big "$DERIVED") s through hscale, $(seconds "$DIRECT" big_oracle "$DERIVED") s direct"
  echo "  hscale's peak RSS: $before MiB before, $(peak_rss_mib) MiB after (target < 128)"
fi

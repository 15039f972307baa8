#!/usr/bin/env bash
# Full partition scans (issue 9), MariaDB direct on one table against hscale
# on the same rows partitioned over two backends, side by side in one run:
#   COUNT(*), ORDER BY k DESC LIMIT 10 and a GROUP BY with ~100k groups, with
#     the rows in 2, 4, 8 and 16 partitions (MOD of id; the default partition
#     and half the others on backend 1, the rest on backend 2);
#   sysbench oltp_read_only on sbtest1 partitioned by MOD(2) of id (every
#     range query on both backends), and by DIV(5000) of id (a range query
#     on one backend, but across the middle), beside the plain table direct
#     and through a byte relay that parses nothing (bench/floor.sh's);
#   each kind of oltp_read_only statement alone, with the CPU hscale and the
#     MariaDB servers spend on it;
#   the CPU each process (hscale or the relay, the MariaDB servers, sysbench)
#     spends per transaction at 8 threads, where the two cores are saturated:
#     oltp_read_only direct, through the relay, MOD(2) over two backends,
#     DIV(5000), MOD(2) with both partitions on one backend; and
#     oltp_point_select direct, through the relay, through hscale unpartitioned
#     and routed by MOD(2);
#   a 1M-row x 300-byte scan through hscale to a client that reads slowly,
#     with hscale's peak RSS.
# Times are medians of --runs runs; hscale's peak RSS (VmHWM) is printed after
# each part.
#
#   bench/scans.sh [--rows N] [--runs N] [--seconds N] [--big-rows N]
#                  [--sysbench-args "..."]   (added to every sysbench run,
#                  e.g. "--order_ranges=0 --distinct_ranges=0")
#                  [--parts "scans sysbench statements cpu big"]   (the parts to
#                  run, all by default)
set -euo pipefail
cd "$(dirname "$0")/.."

ROWS=200000
RUNS=5
SECONDS_EACH=10
BIG_ROWS=1000000
SYSBENCH_ARGS=""
PARTS="scans sysbench statements cpu big"
while [ $# -gt 0 ]; do
  case "$1" in
    --rows) ROWS=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --seconds) SECONDS_EACH=$2; shift 2 ;;
    --big-rows) BIG_ROWS=$2; shift 2 ;;
    --sysbench-args) SYSBENCH_ARGS=$2; shift 2 ;;
    --parts) PARTS=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
command -v sysbench >/dev/null || { echo "needs sysbench (apt-get install sysbench)" >&2; exit 1; }

cargo build --release --quiet --bin hscale --example relay_floor
source bench/common.sh
WORK=$(mktemp -d)
trap 'stop_everything ${RELAY_PID:-}; rm -rf "$WORK"' EXIT
PORT=$(free_port)
BACKENDS=2 start_playground "$PORT" "$WORK/playground.log"
HSCALE_PID=$PLAYGROUND_PID
start_relay

direct() { mariadb -h127.0.0.1 -P"$DIRECT" -uroot -N "$@"; }
proxy() { mariadb -h127.0.0.1 -P"$PORT" -uroot -N "$@"; }
peak_rss_mib() { awk '/VmHWM/ {printf "%.1f", $2/1024}' /proc/"$HSCALE_PID"/status; }

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
echo "mariadb: $(direct -e 'SELECT VERSION()'), hscale: $(target/release/hscale --version); $ROWS rows, median of $RUNS runs; hscale reaches both MariaDB servers over $BACKEND_PATH"
echo

scans_part() {
  # The rows, made by each server from MariaDB's sequence engine: k spread over
  # [0, ROWS/2) (about 100k groups for 200k rows). Partitions are filled
  # straight on their backends.
  TABLE="CREATE TABLE t (id INT PRIMARY KEY, k INT NOT NULL, c CHAR(120) NOT NULL, pad CHAR(60) NOT NULL)"
  fill() { # port db table where
    mariadb -h127.0.0.1 -P"$1" -uroot "$2" -e "INSERT INTO $3 SELECT seq, seq * 7919 % $((ROWS / 2)),
      LPAD(seq * 104729 % 1000000007, 120, '0'), LPAD(seq, 60, '0') FROM seq_1_to_$ROWS WHERE $4"
  }
  direct -e "CREATE DATABASE scan_direct; USE scan_direct; $TABLE;"
  fill "$DIRECT" scan_direct t 1
  direct -e "ANALYZE TABLE scan_direct.t" >/dev/null
  for p in 2 4 8 16; do
    direct -e "CREATE DATABASE scan_$p; USE scan_$p; $TABLE;"
    mariadb -h127.0.0.1 -P"$DIRECT2" -uroot -e "CREATE DATABASE scan_$p"
    proxy "scan_$p" -e "HSCALE SETUP_TABLE('t', 'id', 't_default', 1, 'MOD($p)')"
    fill "$DIRECT" "scan_$p" t_default "seq % $p = 0"
    for v in $(seq 1 $((p - 1))); do
      backend=$((v % 2 + 1))
      proxy "scan_$p" -e "HSCALE ADD_PARTITION('t', 'p$v', $v, $backend)"
      port=$DIRECT
      [ "$backend" = 2 ] && port=$DIRECT2
      fill "$port" "scan_$p" "t_p$v" "seq % $p = $v"
    done
  done
  echo "loaded; hscale peak RSS so far: $(peak_rss_mib) MiB"
  echo

  # Seconds per query: the median of RUNS runs of REPEAT queries each.
  seconds_per_query() { # port schema repeat sql
    local runs=() r
    for _ in $(seq 1 "$RUNS"); do
      r=$(QUERY=$4 QUERIES=$3 SCHEMA=$2 slap_seconds "$1" 1)
      runs+=("$(awk -v t="$r" -v n="$3" 'BEGIN {printf "%.6f", t/n}')")
    done
    printf '%s\n' "${runs[@]}" | median
  }

  echo "| query | partitions | MariaDB direct, one table (ms) | hscale (ms) | ratio |"
  echo "|---|---:|---:|---:|---:|"
  for query in "SELECT COUNT(*) FROM t" \
               "SELECT id, k FROM t ORDER BY k DESC LIMIT 10" \
               "SELECT k, COUNT(*) FROM t GROUP BY k"; do
    repeat=20
    case "$query" in *"GROUP BY"*) repeat=3 ;; esac
    d=$(seconds_per_query "$DIRECT" scan_direct "$repeat" "$query")
    for p in 2 4 8 16; do
      h=$(seconds_per_query "$PORT" "scan_$p" "$repeat" "$query")
      awk -v q="$query" -v p="$p" -v d="$d" -v h="$h" \
        'BEGIN {printf "| `%s` | %d | %.1f | %.1f | %.2f |\n", q, p, d*1000, h*1000, h/d}'
    done
  done
  echo
  echo "hscale peak RSS after the scans: $(peak_rss_mib) MiB"
  echo
}

# sysbench oltp_read_only: one plain table direct (and through a byte relay
# that parses nothing: what any proxy gets on this machine), the same rows
# partitioned over the two backends through hscale by MOD(2) of id and by
# DIV(5000).
sb() { # port db more...
  local port=$1 db=$2; shift 2
  sysbench oltp_read_only --db-driver=mysql --mysql-host=127.0.0.1 --mysql-port="$port" \
    --mysql-user=root --mysql-password= --mysql-db="$db" --tables=1 --table-size=10000 $SYSBENCH_ARGS "$@"
}
tps() { sed -n 's/.*transactions: *[0-9]* *(\([0-9.]*\) per sec.*/\1/p'; }
errors() { sed -n 's/.*ignored errors: *\([0-9]*\).*/\1/p'; }

sysbench_tables() {
  direct -e "CREATE DATABASE sb_direct; CREATE DATABASE sb_part; CREATE DATABASE sb_range; CREATE DATABASE sb_one"
  mariadb -h127.0.0.1 -P"$DIRECT2" -uroot -e "CREATE DATABASE sb_part; CREATE DATABASE sb_range"
  sb "$DIRECT" sb_direct prepare >/dev/null
  for db in sb_part sb_range sb_one; do
    direct -e "CREATE TABLE $db.sbtest1 LIKE sb_direct.sbtest1; INSERT INTO $db.sbtest1 SELECT * FROM sb_direct.sbtest1"
  done
  proxy sb_part -e "HSCALE SETUP_TABLE('sbtest1', 'id', 'sbtest1_default', 1, 'MOD(2)'); HSCALE ADD_PARTITION('sbtest1', 'odd', 1, 2)"
  proxy sb_range -e "HSCALE SETUP_TABLE('sbtest1', 'id', 'sbtest1_default', 1, 'DIV(5000)'); HSCALE ADD_PARTITION('sbtest1', 'upper', 1, 2); HSCALE ADD_PARTITION('sbtest1', 'upper', 2, 2)"
  # Both partitions on backend 1: a range query is one UNION ALL there.
  proxy sb_one -e "HSCALE SETUP_TABLE('sbtest1', 'id', 'sbtest1_default', 1, 'MOD(2)'); HSCALE ADD_PARTITION('sbtest1', 'odd', 1, 1)"
}

sysbench_part() {
  echo "sysbench oltp_read_only, 10,000 rows, $SECONDS_EACH s per cell:"
  echo
  echo "| threads | ps-mode | MariaDB direct (tps) | byte relay (tps) | ratio | hscale, MOD(2) (tps) | ratio | errors | hscale, DIV(5000) (tps) | ratio | errors | hscale, MOD(2) on one backend (tps) | ratio | errors |"
  echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  for threads in 1 8; do
    for mode in disable auto; do
      d=$(sb "$DIRECT" sb_direct --threads="$threads" --time="$SECONDS_EACH" --db-ps-mode="$mode" run)
      b=$(sb "$RELAY" sb_direct --threads="$threads" --time="$SECONDS_EACH" --db-ps-mode="$mode" run)
      h=$(sb "$PORT" sb_part --threads="$threads" --time="$SECONDS_EACH" --db-ps-mode="$mode" run)
      r=$(sb "$PORT" sb_range --threads="$threads" --time="$SECONDS_EACH" --db-ps-mode="$mode" run)
      # Each ordered range one UNION ALL (prepared, with ps-mode auto).
      o=$(sb "$PORT" sb_one --threads="$threads" --time="$SECONDS_EACH" --db-ps-mode="$mode" run)
      awk -v t="$threads" -v m="$mode" -v d="$(echo "$d" | tps)" -v b="$(echo "$b" | tps)" \
        -v h="$(echo "$h" | tps)" -v e="$(echo "$h" | errors)" \
        -v r="$(echo "$r" | tps)" -v f="$(echo "$r" | errors)" \
        -v o="$(echo "$o" | tps)" -v g="$(echo "$o" | errors)" \
        'BEGIN {printf "| %d | %s | %.0f | %.0f | %.2f | %.0f | %.2f | %s | %.0f | %.2f | %s | %.0f | %.2f | %s |\n", t, m, d, b, b/d, h, h/d, e, r, r/d, f, o, o/d, g}'
    done
  done
  echo
  echo "hscale peak RSS after sysbench: $(peak_rss_mib) MiB"
  echo
}

statements_part() {
  # Where a transaction's time goes: each kind of oltp_read_only statement alone
  # (one per transaction, no BEGIN/COMMIT; BEGIN + COMMIT alone on the last
  # line), 1 thread, with the CPU that hscale and the two MariaDB servers spend
  # per statement (both servers' threads: direct runs use backend 1 only).
  MARIADB2_PID=$(sed -n 's/^backend 2: .*(pid \([0-9]*\)).*/\1/p' "$WORK/playground.log")
  BREAKDOWN_SECONDS=$(( SECONDS_EACH < 5 ? SECONDS_EACH : 5 ))
  cell() { # port db args... -> "tps hscale_us mariadb_us"
    local h0 m0 h1 m1 out
    h0=$(cpu_ns); m0=$(( $(cpu_ns "$MARIADB_PID") + $(cpu_ns "$MARIADB2_PID") ))
    out=$(sb "$@" --threads=1 --time="$BREAKDOWN_SECONDS" --db-ps-mode=disable run)
    h1=$(cpu_ns); m1=$(( $(cpu_ns "$MARIADB_PID") + $(cpu_ns "$MARIADB2_PID") ))
    echo "$out" | awk -v h=$((h1 - h0)) -v m=$((m1 - m0)) '
      /transactions:/ {n = $2; gsub(/[(]/, "", $3); tps = $3}
      END {printf "%.0f %.0f %.0f", tps, h / n / 1000, m / n / 1000}'
  }
  NONE="--point_selects=0 --simple_ranges=0 --sum_ranges=0 --order_ranges=0 --distinct_ranges=0"
  echo "Each statement alone, 1 thread, $BREAKDOWN_SECONDS s per cell: tps, and CPU µs per statement of hscale and of both MariaDB servers:"
  echo
  echo "| statement | direct (tps) | MariaDB CPU | MOD(2) (tps) | hscale CPU | MariaDB CPU | DIV(5000) (tps) | hscale CPU | MariaDB CPU |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  for kind in point_selects simple_ranges sum_ranges order_ranges distinct_ranges begin_commit; do
    case $kind in
      begin_commit) args="$NONE" ;;
      *) args="$NONE --skip_trx=on --$kind=1" ;;
    esac
    read -r dt _ dm <<<"$(cell "$DIRECT" sb_direct $args)"
    read -r ht hh hm <<<"$(cell "$PORT" sb_part $args)"
    read -r rt rh rm <<<"$(cell "$PORT" sb_range $args)"
    echo "| $kind | $dt | $dm | $ht | $hh | $hm | $rt | $rh | $rm |"
  done
  echo
}

cpu_part() {
  # CPU time per transaction of each process, from its threads' schedstat
  # (sysbench's from time(1)), 8 threads, ps-mode=disable.
  MARIADB2_PID=$(sed -n 's/^backend 2: .*(pid \([0-9]*\)).*/\1/p' "$WORK/playground.log")
  cpu_cell() { # test label port db
    local h0 m0 h1 m1 out
    h0=$(( $(cpu_ns) + $(cpu_ns "$RELAY_PID") )); m0=$(( $(cpu_ns "$MARIADB_PID") + $(cpu_ns "$MARIADB2_PID") ))
    out=$(/usr/bin/time -f "sysbench cpu: %U %S" sysbench "$1" --db-driver=mysql --mysql-host=127.0.0.1 \
      --mysql-port="$3" --mysql-user=root --mysql-password= --mysql-db="$4" --tables=1 --table-size=10000 \
      --threads=8 --time="$SECONDS_EACH" --db-ps-mode=disable $SYSBENCH_ARGS run 2>&1)
    h1=$(( $(cpu_ns) + $(cpu_ns "$RELAY_PID") )); m1=$(( $(cpu_ns "$MARIADB_PID") + $(cpu_ns "$MARIADB2_PID") ))
    echo "$out" | awk -v label="$2" -v h=$((h1 - h0)) -v m=$((m1 - m0)) '
      /transactions:/ {n = $2; gsub(/[(]/, "", $3); tps = $3}
      /sysbench cpu:/ {s = ($3 + $4) * 1e9}
      END {printf "| %s | %.0f | %.0f | %.0f | %.0f | %.0f |\n", label, tps, h / n / 1000, m / n / 1000, s / n / 1000, (h + m + s) / n / 1000}'
  }
  echo "CPU per transaction (µs), 8 threads, $SECONDS_EACH s per cell (proxy: hscale or the byte relay; MariaDB: both servers):"
  echo
  echo "| workload | tps | proxy | MariaDB | sysbench | total |"
  echo "|---|---:|---:|---:|---:|---:|"
  cpu_cell oltp_read_only "oltp_read_only, direct" "$DIRECT" sb_direct
  cpu_cell oltp_read_only "oltp_read_only, byte relay" "$RELAY" sb_direct
  cpu_cell oltp_read_only "oltp_read_only, hscale MOD(2), two backends" "$PORT" sb_part
  cpu_cell oltp_read_only "oltp_read_only, hscale DIV(5000), two backends" "$PORT" sb_range
  cpu_cell oltp_read_only "oltp_read_only, hscale MOD(2), one backend" "$PORT" sb_one
  cpu_cell oltp_point_select "oltp_point_select, direct" "$DIRECT" sb_direct
  cpu_cell oltp_point_select "oltp_point_select, byte relay" "$RELAY" sb_direct
  cpu_cell oltp_point_select "oltp_point_select, hscale, not partitioned" "$PORT" sb_direct
  cpu_cell oltp_point_select "oltp_point_select, hscale MOD(2), two backends" "$PORT" sb_part
  echo
}

big_part() {
  # 1M rows of 300 bytes over two backends, read by a client that stops
  # reading for 10 s (a full pipe), then drains the rest.
  BIG="CREATE TABLE big (id INT PRIMARY KEY, pad CHAR(255) NOT NULL)"
  direct -e "CREATE DATABASE scan_big; USE scan_big; $BIG"
  mariadb -h127.0.0.1 -P"$DIRECT2" -uroot -e "CREATE DATABASE scan_big"
  proxy scan_big -e "HSCALE SETUP_TABLE('big', 'id', 'big_default', 1, 'MOD(2)'); HSCALE ADD_PARTITION('big', 'odd', 1, 2)"
  # Loaded straight into the physical tables: even ids on backend 1, odd on 2.
  direct scan_big -e "INSERT INTO big_default SELECT seq * 2, REPEAT('x', 255) FROM seq_1_to_$((BIG_ROWS / 2))"
  mariadb -h127.0.0.1 -P"$DIRECT2" -uroot scan_big -e "INSERT INTO big_odd SELECT seq * 2 - 1, REPEAT('x', 255) FROM seq_1_to_$((BIG_ROWS / 2))"
  before=$(peak_rss_mib)
  start=$(date +%s.%N)
  received=$(proxy --quick scan_big -e "SELECT id, pad FROM big" | { sleep 10; wc -l; })
  end=$(date +%s.%N)
  echo "1M-row scan: $received rows of ~300 B in $(awk -v s="$start" -v e="$end" 'BEGIN {printf "%.1f", e-s}') s (10 s of it the client not reading); hscale peak RSS $before MiB before, $(peak_rss_mib) MiB after"
}

runs_part() { [[ " $PARTS " == *" $1 "* ]]; }
if runs_part scans; then scans_part; fi
if runs_part sysbench || runs_part statements || runs_part cpu; then sysbench_tables; fi
if runs_part sysbench; then sysbench_part; fi
if runs_part statements; then statements_part; fi
if runs_part cpu; then cpu_part; fi
if runs_part big; then big_part; fi

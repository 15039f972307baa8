#!/usr/bin/env bash
# Online partition moves (issue 39), each target measured side by side in one
# run, on the playground's two MariaDB servers:
#   pause       sysbench oltp_write_only through hscale on sbtest1, MOD(4) of
#               id, each partition --rows rows, all on backend 1; mid-run
#               partition p1 moves to backend 2. Writers of p1 (through the
#               instance that runs sysbench) report the longest gap between
#               two completed writes; writers of the other partitions, through
#               an instance of their own, report their slowest write and that
#               instance's count of statements that waited.
#   resume      a move of --big-rows rows of ~200 bytes whose instance is
#               killed (SIGKILL) at half its copy; another instance takes the
#               job over; the rows the destination server wrote into the
#               table in all (TABLE_STATISTICS) against the rows moved.
#   throughput  the same rows moved back by a fresh instance, against
#               `mariadb-dump --single-transaction | mariadb` of them between
#               the same two servers in the same direction; that instance's
#               peak RSS before and after.
#
# The servers get an InnoDB buffer pool of --buffer-pool (default 4G) each,
# as a server of such tables would have: the playground's 64 MB makes every
# write a disk read.
#
#   bench/moves.sh [--rows N] [--big-rows N] [--threads N] [--buffer-pool SIZE]
#                  [--parts "pause resume throughput"]
set -euo pipefail
cd "$(dirname "$0")/.."

ROWS=1000000
BIG_ROWS=2000000
THREADS=4
BUFFER_POOL=4G
PARTS="pause resume throughput"
while [ $# -gt 0 ]; do
  case "$1" in
    --rows) ROWS=$2; shift 2 ;;
    --big-rows) BIG_ROWS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --buffer-pool) BUFFER_POOL=$2; shift 2 ;;
    --parts) PARTS=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
command -v sysbench >/dev/null || { echo "needs sysbench (apt-get install sysbench)" >&2; exit 1; }

cargo build --release --quiet --bin hscale --example move_probe
source bench/common.sh
WORK=$(mktemp -d)
echo "work folder: $WORK"
INSTANCES=()
trap 'touch "$WORK/stop"; stop_everything "${INSTANCES[@]}"; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
PORT=$(free_port)
BACKENDS=2 start_playground "$PORT" "$WORK/playground.log"

direct() { mariadb -h127.0.0.1 -P"$DIRECT" -uroot -N "$@"; }
direct2() { mariadb -h127.0.0.1 -P"$DIRECT2" -uroot -N "$@"; }
for port in "$DIRECT" "$DIRECT2"; do
  mariadb -h127.0.0.1 -P"$port" -uroot -e "SET GLOBAL innodb_buffer_pool_size = $(numfmt --from=iec "$BUFFER_POOL")"
done
peak_rss_mib() { awk '/VmHWM/ {printf "%.1f", $2/1024}' /proc/"$1"/status; }
runs_part() { [[ " $PARTS " == *" $1 "* ]]; }

# `hscale serve` in front of both servers, sharing the playground's
# dictionary: a process of its own, to kill or to measure alone. Sets
# SERVE_PID. $3: more [proxy] settings.
start_instance() { # name port [proxy settings]
  start_serve target/release/hscale "$2" "$WORK/$1.log" "127.0.0.1:$DIRECT" "
[[backends]]
id = 2
address = \"127.0.0.1:$DIRECT2\"
user = \"root\"" "${3:-}"
  INSTANCES+=("$SERVE_PID")
}

# Starts a move through the hscale on port $1 and prints its job id.
start_move() { # port db table partition backend
  mariadb -h127.0.0.1 -P"$1" -uroot -N "$2" -e "HSCALE MOVE_PARTITION('$3', '$4', $5)"
}
job_field() { direct -e "SELECT $2 FROM hscale.moves WHERE id = $1"; }
wait_for_job() { # job
  local phase deadline=$((SECONDS + 1800))
  while [ "$SECONDS" -lt "$deadline" ]; do
    phase=$(job_field "$1" phase)
    case "$phase" in
      done) return 0 ;;
      failed | cancelled) echo "job $1 $phase: $(job_field "$1" last_error)" >&2; return 1 ;;
    esac
    sleep 0.2
  done
  echo "job $1 still $(job_field "$1" phase) after 30 minutes" >&2
  return 1
}
# Seconds from the job's start to its end, as the dictionary recorded them.
job_seconds() { job_field "$1" "TIMESTAMPDIFF(MICROSECOND, started, finished) / 1e6"; }
# Rows the server has written into a table since userstat was turned on
# (MariaDB's TABLE_STATISTICS), rolled back or not.
rows_changed() { # port db table
  mariadb -h127.0.0.1 -P"$1" -uroot -N -e "SELECT COALESCE(SUM(ROWS_CHANGED), 0) FROM information_schema.TABLE_STATISTICS
    WHERE TABLE_SCHEMA = '$2' AND TABLE_NAME = '$3'"
}

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
echo "mariadb: $(direct -e 'SELECT VERSION()'), buffer pool $(direct -e 'SELECT @@innodb_buffer_pool_size DIV 1048576') MiB each; hscale: $(target/release/hscale --version)"
echo

TABLE="(id INT NOT NULL AUTO_INCREMENT, k INT NOT NULL DEFAULT 0, c CHAR(120) NOT NULL DEFAULT '',
  pad CHAR(60) NOT NULL DEFAULT '', PRIMARY KEY (id), KEY k_1 (k))"
# Rows made by the server from MariaDB's sequence engine, ids $4, $4 + step...
fill() { # port db table first step last
  mariadb -h127.0.0.1 -P"$1" -uroot "$2" -e "INSERT INTO $3 SELECT seq, seq * 7919 % 1000003,
    LPAD(seq * 104729 % 1000000007, 120, '7'), LPAD(seq, 60, '3') FROM seq_$4_to_$6_step_$5"
}

pause_part() {
  local total=$((ROWS * 4))
  direct -e "CREATE DATABASE sb; CREATE TABLE sb.sbtest1 $TABLE"
  direct2 -e "CREATE DATABASE sb"
  mariadb -h127.0.0.1 -P"$PORT" -uroot sb -e "HSCALE SETUP_TABLE('sbtest1', 'id', 'sbtest1_default', 1, 'MOD(4)');
    HSCALE ADD_PARTITION('sbtest1', 'p1', 1, 1); HSCALE ADD_PARTITION('sbtest1', 'p2', 2, 1);
    HSCALE ADD_PARTITION('sbtest1', 'p3', 3, 1)"
  fill "$DIRECT" sb sbtest1_default 4 4 "$total"
  for p in 1 2 3; do fill "$DIRECT" sb "sbtest1_p$p" "$p" 4 "$total"; done
  echo "pause: sbtest1 MOD(4), $ROWS rows per partition, loaded"

  # sysbench and the writers of p1 through instance A; the writers of the
  # other partitions through instance B, whose waits are theirs alone.
  # sysbench's transactions write several partitions, on two backends once
  # p1 has moved.
  local a b
  a=$(free_port); start_instance pause_a "$a" 'transactions = "multi"'
  b=$(free_port); start_instance pause_b "$b"; local b_http=$SERVE_HTTP b_pid=$SERVE_PID
  local stop="$WORK/stop"
  target/release/examples/move_probe "$a" sb sbtest1 4 1 "$total" 4 "$stop" "p1 (moved)" >"$WORK/probe_moved" &
  local moved_probe=$!
  target/release/examples/move_probe "$b" sb sbtest1 4 0,2,3 "$total" 4 "$stop" "p0, p2, p3 (staying)" >"$WORK/probe_staying" &
  local staying_probe=$!
  sysbench oltp_write_only --db-driver=mysql --mysql-host=127.0.0.1 --mysql-port="$a" \
    --mysql-user=root --mysql-db=sb --tables=1 --table-size="$total" --threads="$THREADS" \
    --time=3600 --report-interval=1 run >"$WORK/sysbench" 2>&1 &
  local sysbench_pid=$!
  INSTANCES+=("$sysbench_pid")
  sleep 10
  local waited_before job
  waited_before=$(curl -s "http://127.0.0.1:$b_http/metrics" | awk '/^hscale_statements_waited_total/ {print $2}')
  job=$(start_move "$a" sb sbtest1 p1 2)
  wait_for_job "$job"
  sleep 5
  touch "$stop"
  kill "$sysbench_pid"
  wait "$moved_probe" "$staying_probe"
  wait "$sysbench_pid" || true
  local waited_after
  waited_after=$(curl -s "http://127.0.0.1:$b_http/metrics" | awk '/^hscale_statements_waited_total/ {print $2}')
  echo "move of p1 ($ROWS rows) under sysbench oltp_write_only, $THREADS threads: $(job_seconds "$job") s," \
    "fence attempts $(job_field "$job" fence_attempts), last fence $(job_field "$job" last_fence_ms) ms," \
    "chunks verified $(job_field "$job" chunks_verified), repaired $(job_field "$job" chunks_repaired)"
  echo "job $job: started $(job_field "$job" "TIME(started)"), switched and done by $(job_field "$job" "TIME(finished)") ($(direct -e 'SELECT @@system_time_zone'))"
  cat "$WORK/probe_moved" "$WORK/probe_staying"
  echo "statements that waited, on the staying partitions' instance: $((waited_after - waited_before))"
  echo "sysbench: $(grep -c '^\[' "$WORK/sysbench") one-second reports, lowest tps $(sed -n 's/^\[.*tps: \([0-9.]*\).*/\1/p' "$WORK/sysbench" | sort -n | head -1)," \
    "highest $(sed -n 's/^\[.*tps: \([0-9.]*\).*/\1/p' "$WORK/sysbench" | sort -n | tail -1), errors: $(grep -c -i 'error\|fatal' "$WORK/sysbench" || true)"
  grep -i -m3 'error\|fatal' "$WORK/sysbench" || true
  kill "$b_pid"
  echo
}

big_table() {
  direct -e "CREATE DATABASE big; CREATE TABLE big.big $TABLE"
  direct2 -e "CREATE DATABASE big"
  mariadb -h127.0.0.1 -P"$PORT" -uroot big -e "HSCALE SETUP_TABLE('big', 'id', 'big_default', 1, 'MOD(2)');
    HSCALE ADD_PARTITION('big', 'p1', 1, 1)"
  fill "$DIRECT" big big_p1 1 2 $((BIG_ROWS * 2))
  echo "big: $BIG_ROWS rows of ~200 B in partition p1 on backend 1, loaded"
}

resume_part() {
  local d job
  d=$(free_port); start_instance resume_d "$d"; local d_pid=$SERVE_PID
  direct2 -e "SET GLOBAL userstat = 1; FLUSH TABLE_STATISTICS"
  job=$(start_move "$d" big big p1 2)
  while [ "$(job_field "$job" rows_copied)" -lt $((BIG_ROWS / 2)) ]; do sleep 0.05; done
  kill -KILL "$d_pid"
  local at_kill
  at_kill=$(job_field "$job" rows_copied)
  echo "resume: the moving instance killed with $at_kill of $BIG_ROWS rows reported copied; the job taken over"
  wait_for_job "$job"
  local total
  total=$(rows_changed "$DIRECT2" big big_p1)
  direct2 -e "SET GLOBAL userstat = 0"
  echo "rows the destination wrote in all: $total for $BIG_ROWS rows: $(awk -v t="$total" -v n="$BIG_ROWS" 'BEGIN {printf "%.2f%% more", (t/n - 1) * 100}') (owner $(job_field "$job" owner), $(job_seconds "$job") s)"
  echo
}

throughput_part() {
  # Both copies go from backend 2 (where p1 is now, or was put) to backend 1.
  if [ "$(direct -e "SELECT backend FROM hscale.partitions WHERE db = 'big' AND partition_name = 'p1'")" = 1 ]; then
    local j; j=$(start_move "$PORT" big big p1 2); wait_for_job "$j"
  fi
  direct -e "CREATE DATABASE dumped"
  local start end
  start=$(date +%s.%N)
  mariadb-dump -h127.0.0.1 -P"$DIRECT2" -uroot --single-transaction big big_p1 | mariadb -h127.0.0.1 -P"$DIRECT" -uroot dumped
  end=$(date +%s.%N)
  local dump_s; dump_s=$(awk -v s="$start" -v e="$end" 'BEGIN {printf "%.2f", e - s}')
  [ "$(direct -e 'SELECT COUNT(*) FROM dumped.big_p1')" = "$BIG_ROWS" ] || { echo "the dump lost rows" >&2; exit 1; }
  direct -e "DROP DATABASE dumped"

  local c job rss_before
  c=$(free_port); start_instance throughput_c "$c"; local c_pid=$SERVE_PID
  rss_before=$(peak_rss_mib "$c_pid")
  job=$(start_move "$c" big big p1 1)
  wait_for_job "$job"
  local move_s; move_s=$(job_seconds "$job")
  echo "throughput: $BIG_ROWS rows from backend 2 to 1: mariadb-dump | mariadb $dump_s s, MOVE_PARTITION $move_s s (copy, verification, catch-up, fence, switch):" \
    "$(awk -v d="$dump_s" -v m="$move_s" 'BEGIN {printf "%.2f", d / m}')x the dump's rate"
  echo "the moving instance's peak RSS: $rss_before MiB before, $(peak_rss_mib "$c_pid") MiB after"
  [ "$(mariadb -h127.0.0.1 -P"$c" -uroot -N big -e 'SELECT COUNT(*) FROM big')" = "$BIG_ROWS" ] || { echo "the move lost rows" >&2; exit 1; }
  echo
}

if runs_part pause; then pause_part; fi
if runs_part resume || runs_part throughput; then big_table; fi
if runs_part resume; then resume_part; fi
if runs_part throughput; then throughput_part; fi

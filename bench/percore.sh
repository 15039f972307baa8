#!/usr/bin/env bash
# What a query costs hscale and MariaDB with K worker threads, counted per
# query where two cores cannot show scaling: CPU, context switches, futex and
# epoll calls, pool lock acquisitions; and what MariaDB does per query
# behind hscale against direct (CPU, system calls, context switches).
#
#   bench/percore.sh [--seconds N] [--rounds N] [--threads "1 2"] [--before BINARY]
#                    [--strace-seconds N (0: no strace runs)] [--perf-seconds N (0: no profile)]
#                    [--apart]
#
# One MariaDB (the playground's, over TCP); sysbench oltp_point_select at 8
# threads, prepared and as text, passthrough (the table is not partitioned).
# Every hscale instance is live at once (one per K, and with --before one per
# K of that other build too), and the rounds interleave them with MariaDB
# direct; each cell's number is the median of the rounds. Then one short run
# per instance under `strace -c -f` counts its system calls per query, and
# one under strace on MariaDB counts the server's, direct and behind each;
# last, one under perf on MariaDB per path splits its CPU per query.
# --apart: MariaDB on CPU 0, hscale and sysbench on the others, so that
# MariaDB's caches hold only its own work, as on a machine where each has
# its cores.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh

SECONDS_EACH=10
ROUNDS=3
THREADS="1 2"
BEFORE=""
STRACE_SECONDS=5
PERF_SECONDS=8
APART=""
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_EACH=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --before) BEFORE=$(realpath "$2"); shift 2 ;;
    --strace-seconds) STRACE_SECONDS=$2; shift 2 ;;
    --perf-seconds) PERF_SECONDS=$2; shift 2 ;;
    --apart) APART=1; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
command -v sysbench >/dev/null || { echo "needs sysbench (apt-get install sysbench)" >&2; exit 1; }
command -v strace >/dev/null || { echo "needs strace (apt-get install strace)" >&2; exit 1; }
cargo build --release --quiet --bin hscale

WORK=$(mktemp -d)
PIDS=()
trap 'stop_everything "${PIDS[@]}"; rm -rf "$WORK"' EXIT
BACKEND_PATH=tcp start_playground "$(free_port)" "$WORK/playground.log"

OTHERS=""
[ -n "$APART" ] && OTHERS="1-$(($(nproc) - 1))"
sysbench_run() { # port mode seconds [command]
  ${OTHERS:+taskset -c "$OTHERS"} sysbench oltp_point_select --db-driver=mysql --mysql-host=127.0.0.1 --mysql-port="$1" \
    --mysql-user=root --mysql-db=sbtest --tables=1 --table-size=100000 --threads=8 \
    --time="$3" --db-ps-mode="$2" "${4:-run}"
}
mariadb -h127.0.0.1 -P"$DIRECT" -uroot -e "CREATE DATABASE sbtest"
sysbench_run "$DIRECT" auto 1 prepare >/dev/null
[ -n "$APART" ] && taskset -a -p -c 0 "$MARIADB_PID" >/dev/null

# Instances: label, port, pid, metrics port.
LABELS=() PORTS=() SERVE_PIDS=() HTTPS=()
for k in $THREADS; do
  for build in now ${BEFORE:+before}; do
    binary=target/release/hscale
    [ "$build" = before ] && binary=$BEFORE
    port=$(free_port)
    start_serve "$binary" "$port" "$WORK/hscale-$build-$k.log" "" "max_connections = 64" "threads = $k"
    label="K=$k"
    [ -n "$BEFORE" ] && label="$build K=$k"
    LABELS+=("$label") PORTS+=("$port") SERVE_PIDS+=("$SERVE_PID") HTTPS+=("$SERVE_HTTP")
    PIDS+=("$SERVE_PID")
    [ -n "$APART" ] && taskset -a -p -c "$OTHERS" "$SERVE_PID" >/dev/null
  done
done

ctx_switches() { # pid
  cat /proc/"$1"/task/*/status 2>/dev/null |
    awk '/^(voluntary|nonvoluntary)_ctxt_switches/ {s += $2} END {printf "%d", s}'
}
pool_counts() { # metrics port -> "lock-acquisitions borrowed"
  curl -s "http://127.0.0.1:$1/metrics" |
    awk '/^hscale_pool_lock_acquisitions_total/ {l += $2} /^hscale_pool_borrowed_total/ {b += $2}
      END {printf "%d %d", l, b}'
}
server_counts() { # -> "statements bytes-sent bytes-received" of MariaDB so far
  mariadb -h127.0.0.1 -P"$DIRECT" -uroot -N -e "SHOW GLOBAL STATUS WHERE Variable_name IN
    ('Questions', 'Bytes_sent', 'Bytes_received')" |
    awk '{v[$1] = $2} END {printf "%d %d %d", v["Questions"], v["Bytes_sent"], v["Bytes_received"]}'
}

# One measured run: a line "label|mode|qps|proxy-µs|mariadb-µs|proxy-cs|mariadb-cs|
# locks|borrowed|statements|bytes-sent|bytes-received", all but qps per query.
RESULTS=$WORK/results
measure() { # label port pid-or-empty http-or-empty mode
  local label=$1 port=$2 pid=$3 http=$4 mode=$5 out queries seconds
  local p0=0 c0=0 pool0="0 0" m0 mc0 s0
  [ -n "$pid" ] && p0=$(cpu_ns "$pid") c0=$(ctx_switches "$pid")
  [ -n "$http" ] && pool0=$(pool_counts "$http")
  s0=$(server_counts)
  m0=$(cpu_ns "$MARIADB_PID") mc0=$(ctx_switches "$MARIADB_PID")
  out=$(sysbench_run "$port" "$mode" "$SECONDS_EACH" 2>&1)
  local m1 mc1 p1=0 c1=0 pool1="0 0" s1
  m1=$(cpu_ns "$MARIADB_PID") mc1=$(ctx_switches "$MARIADB_PID")
  [ -n "$pid" ] && p1=$(cpu_ns "$pid") c1=$(ctx_switches "$pid")
  [ -n "$http" ] && pool1=$(pool_counts "$http")
  s1=$(server_counts)
  echo "$out" | grep -q "errors: *0 " || { echo "$label $mode:"; echo "$out" | tail -15; } >&2
  queries=$(echo "$out" | awk '/queries:/ {print $2; exit}')
  seconds=$(echo "$out" | awk '/total time:/ {sub(/s$/, "", $3); print $3; exit}')
  awk -v l="$label" -v mode="$mode" -v q="$queries" -v s="$seconds" -v p=$((p1 - p0)) \
    -v m=$((m1 - m0)) -v c=$((c1 - c0)) -v mc=$((mc1 - mc0)) -v pool="$pool0 $pool1" \
    -v server="$s0 $s1" \
    'BEGIN {split(pool, k, " "); split(server, v, " ");
      printf "%s|%s|%.0f|%.2f|%.2f|%.3f|%.3f|%.2f|%.3f|%.3f|%.1f|%.1f\n", l, mode, q / s,
        p / q / 1000, m / q / 1000, c / q, mc / q, (k[3] - k[1]) / q, (k[4] - k[2]) / q,
        (v[4] - v[1]) / q, (v[5] - v[2]) / q, (v[6] - v[3]) / q}' >>"$RESULTS"
}

echo "bench/percore.sh: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(mariadbd --version 2>/dev/null | awk '{print $3}' || /usr/sbin/mariadbd --version | awk '{print $3}'), sysbench point_select 8 threads, ${SECONDS_EACH}s per cell, $ROUNDS rounds${APART:+; MariaDB on CPU 0, hscale and sysbench on $OTHERS}"
for round in $(seq 1 "$ROUNDS"); do
  for mode in auto disable; do
    measure direct "$DIRECT" "" "" "$mode"
    for i in "${!LABELS[@]}"; do
      measure "${LABELS[$i]}" "${PORTS[$i]}" "${SERVE_PIDS[$i]}" "${HTTPS[$i]}" "$mode"
    done
  done
done

echo
echo "| workload | through | queries/s | hscale CPU/query (µs) | MariaDB CPU/query (µs) | hscale context switches/query | MariaDB context switches/query | pool locks/query | borrowed/query | MariaDB statements/query | MariaDB bytes sent/query | MariaDB bytes received/query |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for mode in auto disable; do
  workload=point_select_ps
  [ "$mode" = disable ] && workload=point_select_text
  for label in direct "${LABELS[@]}"; do
    line="| $workload | $label"
    for column in 3 4 5 6 7 8 9 10 11 12; do
      value=$(awk -F'|' -v l="$label" -v m="$mode" -v c=$column '$1 == l && $2 == m {print $c}' "$RESULTS" | median)
      line="$line | $value"
    done
    echo "$line |"
  done
done

# System calls per query, one short run each under strace (which slows the
# traced process: the counts per query hold, the speed does not).
syscalls() { # pid port mode -> "name=count/query ..." of the calls that matter
  local out="$WORK/strace.$1" q
  strace -c -f -q -p "$1" -o "$out" &
  local tracer=$!
  sleep 0.5
  q=$(sysbench_run "$2" "$3" "$STRACE_SECONDS" 2>&1 | awk '/queries:/ {print $2; exit}')
  kill -INT "$tracer"
  wait "$tracer" 2>/dev/null || true
  awk -v q="$q" '$NF ~ /^(futex|epoll_wait|epoll_ctl|epoll_pwait|sendto|recvfrom|read|write|writev|readv|poll|ppoll|sched_yield)$/ {
      printf "%s=%.2f ", $NF, $4 / q }' "$out"
}
if [ "$STRACE_SECONDS" -gt 0 ]; then
  echo
  echo "System calls per query (strace -c -f, ${STRACE_SECONDS}s, point_select):"
  for mode in auto disable; do
    for i in "${!LABELS[@]}"; do
      echo "  hscale ${LABELS[$i]} $mode: $(syscalls "${SERVE_PIDS[$i]}" "${PORTS[$i]}" "$mode")"
    done
    echo "  MariaDB direct $mode: $(syscalls "$MARIADB_PID" "$DIRECT" "$mode")"
    for i in "${!LABELS[@]}"; do
      echo "  MariaDB behind ${LABELS[$i]} $mode: $(syscalls "$MARIADB_PID" "${PORTS[$i]}" "$mode")"
    done
  done
fi

# Where the time per query goes, by one run under `perf record` (cpu-clock,
# so a sample is 1/999 s of the watched process's CPU) per path: MariaDB's,
# direct and behind the first instance, split into its own code, the C
# library, the kernel, and the part that builds result set column
# definitions (what a client that caches metadata is spared); then each
# hscale instance's, split into its own code, the C library, the kernel's
# scheduling and waiting (a worker parking in epoll_wait and woken again),
# and the rest of the kernel (sockets, TCP).
[ "$PERF_SECONDS" -gt 0 ] || exit 0
command -v perf >/dev/null || { echo "no perf: the profiles are skipped" >&2; exit 0; }
profile() { # pid port mode -> "µs per query: own libc kernel-scheduling kernel-rest metadata"
  local data="$WORK/perf.data" q
  perf record -q -e cpu-clock -F 999 -p "$1" -o "$data" -- sleep "$PERF_SECONDS" 2>/dev/null &
  local recorder=$!
  q=$(sysbench_run "$2" "$3" "$PERF_SECONDS" 2>&1 | awk '/queries:/ {print $2; exit}')
  wait "$recorder" 2>/dev/null || true
  perf report -i "$data" -n --no-children --sort dso,symbol --stdio 2>/dev/null |
    awk -v q="$q" '$1 ~ /%$/ {
        n = $2; dso = $3; sym = $5
        if (dso == "mariadbd" || dso == "hscale") own += n
        else if (dso ~ /^libc/) libc += n
        else if (dso ~ /kernel/) {
          if (sym ~ /schedule|switch_to|task_switch|wake_up|ep_poll|epoll_wait|irqrestore|enqueue_task|dequeue_task|update_curr|select_task_rq|idle/) sched += n
          else kernel += n
        }
        if (sym ~ /store_field_metadata|send_result_set_metadata|net_store_data_cs|my_convert|store_string_aux|send_fields/) meta += n
      }
      END { f = 1e6 / 999 / q; printf "%.2f %.2f %.2f %.2f %.3f", own * f, libc * f, sched * f, kernel * f, meta * f }'
}
echo
echo "MariaDB's CPU per query by where it runs (perf, ${PERF_SECONDS}s each, point_select; perf slows what it watches: compare direct with behind, not with the table above):"
echo "| workload | through | MariaDB's code (µs) | C library (µs) | kernel (µs) | of which column definitions (µs) |"
echo "|---|---|---:|---:|---:|---:|"
for mode in auto disable; do
  workload=point_select_ps
  [ "$mode" = disable ] && workload=point_select_text
  for target in direct "${LABELS[0]}"; do
    port=$DIRECT
    [ "$target" = direct ] || port=${PORTS[0]}
    read -r own libc sched kernel meta <<<"$(profile "$MARIADB_PID" "$port" "$mode")"
    echo "| $workload | $target | $own | $libc | $(echo "$sched $kernel" | awk '{printf "%.2f", $1 + $2}') | $meta |"
  done
done
echo
echo "hscale's CPU per query by where it runs (perf, ${PERF_SECONDS}s each, point_select; compare the instances with each other):"
echo "| workload | instance | hscale's code (µs) | C library (µs) | kernel: scheduling, epoll waits (µs) | kernel: the rest (µs) |"
echo "|---|---|---:|---:|---:|---:|"
for mode in auto disable; do
  workload=point_select_ps
  [ "$mode" = disable ] && workload=point_select_text
  for i in "${!LABELS[@]}"; do
    read -r own libc sched kernel _ <<<"$(profile "${SERVE_PIDS[$i]}" "${PORTS[$i]}" "$mode")"
    echo "| $workload | ${LABELS[$i]} | $own | $libc | $sched | $kernel |"
  done
done

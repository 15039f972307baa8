#!/usr/bin/env bash
# What TLS costs where the clients have cores of their own: on the lent
# 16-core machine, MariaDB on cores 8-15, sysbench on 4-7, hscale (4 worker
# threads) on 0-3; sysbench oltp_point_select, text protocol, 64 threads,
# persistent connections: MariaDB direct, hscale in clear, hscale with its
# clients over TLS, and with both hops over TLS, in rounds.
#
# Here: `bench/carry.sh` packs .devcarry/ (hscale, MariaDB, sysbench), then
# `bench/tls_device.sh --pack` adds certificates to it; there, with .devcarry
# carried: `bench/tls_device.sh`. Results to stdout and $OUT/tls.txt.
set -u
cd "$(dirname "$0")/.."
if [ "${1:-}" = --pack ]; then
  source bench/common.sh
  rm -rf .devcarry/tls && make_certificates .devcarry/tls && ls .devcarry/tls
  exit 0
fi
C=$PWD/.devcarry; R=$(mktemp -d); tar xJf "$C/bundle.txz" -C "$R"
export LD_LIBRARY_PATH=$R/lib PATH=$R/bin:$PATH LUA_PATH="$R/share/sysbench/?.lua;;"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SECS=${SECS:-10}; ROUNDS=${ROUNDS:-2}; T=$C/tls
exec > >(tee "$OUT/tls.txt") 2>&1
# Fewer than 16 cores: nothing pinned, the run only shows that the script works.
[ "$(nproc)" -ge 16 ] || taskset() { shift 2; "$@"; }
echo "machine: $(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
D=$R/db; mkdir -p "$D"; tar xzf "$C/datadir.tgz" -C "$D"
taskset -c 8-15 mariadbd --no-defaults --datadir="$D" --port=3306 --bind-address=127.0.0.1 \
  --socket="$R/db.sock" --user=root --skip-name-resolve --max-connections=2000 \
  --lc-messages-dir="$R/share/mysql/english" --character-sets-dir="$R/share/mysql/charsets" \
  --innodb-buffer-pool-size=2G --ssl-ca="$T/ca.pem" --ssl-cert="$T/server.pem" \
  --ssl-key="$T/server-key.pem" --log-error="$R/db.err" &
MPID=$!
for _ in $(seq 100); do [ -S "$R/db.sock" ] && break; sleep 0.2; done
mariadb -S "$R/db.sock" -uroot -e "CREATE DATABASE sbtest; CREATE USER app@'%' IDENTIFIED BY 'secret';
  GRANT ALL ON *.* TO app@'%'" || { tail "$R/db.err"; exit 1; }
PS=$R/share/sysbench/oltp_point_select.lua
SB=(--mysql-db=sbtest --tables=1 --table-size=100000 --mysql-user=app --mysql-password=secret)
sysbench "$PS" "${SB[@]}" --mysql-socket="$R/db.sock" prepare >"$R/prepare.log" 2>&1 || { tail "$R/prepare.log"; exit 1; }
serve() { # port backend-settings
  cat >"$R/h$1.toml" <<TOML
[proxy]
listen = "127.0.0.1:$1"
threads = 4
tls_cert = "$T/server.pem"
tls_key = "$T/server-key.pem"
[[users]]
name = "app"
password = "secret"
[[backends]]
id = 1
address = "127.0.0.1:3306"
user = "root"
max_connections = 256
$2
[log]
level = "warn"
TOML
  taskset -c 0-3 hscale serve --config "$R/h$1.toml" >"$R/h$1.log" 2>&1 &
  echo $!
}
CLEAR_PID=$(serve 4040 "")
BOTH_PID=$(serve 4041 "tls = \"verify\"
tls_ca = \"$T/ca.pem\"")
for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/4041) 2>/dev/null && break; sleep 0.2; done
sleep 1
# sysbench 1.0 with --mysql-ssl=on reads these from the folder it runs in.
cp "$T/ca.pem" "$R/cacert.pem"; cp "$T/server.pem" "$R/client-cert.pem"; cp "$T/server-key.pem" "$R/client-key.pem"
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
cell() { # port ssl proxy-pid -> "qps proxy-µs/q errors"
  local p0=0 p1=0 out
  [ -n "$3" ] && p0=$(ticks "$3")
  out=$(cd "$R" && taskset -c 4-7 sysbench "$PS" "${SB[@]}" --mysql-host=127.0.0.1 --mysql-port="$1" \
    --mysql-ssl="$2" --threads=64 --time="$SECS" --db-ps-mode=disable run 2>&1)
  [ -n "$3" ] && p1=$(ticks "$3")
  echo "$out" | awk -v t=$((p1 - p0)) '/queries:/ {n=$2; gsub(/\(/, "", $3); q=$3} /ignored errors:/ {e=$3}
    END {printf "%s %.1f %s\n", q, (n ? t * 10000 / n : 0), e}'
}
echo "sysbench oltp_point_select, text, 64 threads, ${SECS}s per cell; hscale 4 threads on cores 0-3"
echo
echo "| round | direct (qps) | hscale clear (qps, µs/q) | clients TLS | both hops TLS | clients TLS / clear | both / clear | errors |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
for round in $(seq 1 "$ROUNDS"); do
  read -r d _ de <<<"$(cell 3306 off "")"
  read -r c cu ce <<<"$(cell 4040 off "$CLEAR_PID")"
  read -r t tu te <<<"$(cell 4040 on "$CLEAR_PID")"
  read -r b bu be <<<"$(cell 4041 on "$BOTH_PID")"
  awk -v r="$round" -v d="$d" -v c="$c" -v cu="$cu" -v t="$t" -v tu="$tu" -v b="$b" -v bu="$bu" \
    -v e="$((de + ce + te + be))" 'BEGIN {printf "| %d | %.0f | %.0f, %.1f | %.0f, %.1f | %.0f, %.1f | %.3f | %.3f | %d |\n",
    r, d, c, cu, t, tu, b, bu, t/c, b/c, e}'
done
# Not a bare `wait`: it would wait for the tee above too, which never ends.
kill "$CLEAR_PID" "$BOTH_PID" "$MPID" 2>/dev/null
wait "$MPID" 2>/dev/null

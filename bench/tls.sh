#!/usr/bin/env bash
# What TLS costs (issue 38): sysbench oltp_point_select with persistent
# connections (each thread keeps its connection for the whole run), MariaDB
# direct, and hscale in clear, with its clients over TLS, and with both hops
# over TLS (backends verified against the CA), side by side, the cells of a
# round interleaved, in rounds.
#
#   bench/tls.sh [--seconds N] [--threads N] [--rounds N] [--path tcp|unix]
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_EACH=10
THREADS=8
ROUNDS=2
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_EACH=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --path) export BACKEND_PATH=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
command -v sysbench >/dev/null || { echo "needs sysbench (apt-get install sysbench)" >&2; exit 1; }

cargo build --release --quiet --bin hscale
source bench/common.sh
WORK=$(mktemp -d)
PIDS=()
trap 'stop_everything "${PIDS[@]}"; rm -rf "$WORK"' EXIT
make_certificates "$WORK/tls"
PLAY=$(free_port)
PLAYGROUND_TLS="$WORK/tls" start_playground "$PLAY" "$WORK/playground.log"

CLIENT_TLS="tls_cert = \"$WORK/tls/server.pem\"
tls_key = \"$WORK/tls/server-key.pem\""
BACKEND_TLS="tls = \"verify\"
tls_ca = \"$WORK/tls/ca.pem\""
CLEAR=$(free_port)
start_serve target/release/hscale "$CLEAR" "$WORK/clear.log" "$BACKEND" "" "$CLIENT_TLS"
CLEAR_PID=$SERVE_PID
BOTH=$(free_port)
start_serve target/release/hscale "$BOTH" "$WORK/both.log" "$BACKEND" "$BACKEND_TLS" "$CLIENT_TLS"
BOTH_PID=$SERVE_PID
PIDS+=("$CLEAR_PID" "$BOTH_PID")

mariadb -h127.0.0.1 -P"$DIRECT" -uroot -e "CREATE DATABASE IF NOT EXISTS bench"
SB=(--db-driver=mysql --mysql-host=127.0.0.1 --mysql-user=root --mysql-password= --mysql-db=bench
    --tables=1 --table-size=100000 --time="$SECONDS_EACH" --threads="$THREADS" --db-ps-mode=disable)
sysbench oltp_point_select "${SB[@]}" --mysql-port="$DIRECT" prepare >/dev/null
# sysbench 1.0 with --mysql-ssl=on reads cacert.pem, client-cert.pem and
# client-key.pem from the folder it runs in.
cp "$WORK/tls/ca.pem" "$WORK/tls/cacert.pem"
cp "$WORK/tls/server.pem" "$WORK/tls/client-cert.pem"
cp "$WORK/tls/server-key.pem" "$WORK/tls/client-key.pem"
qps() { # port ssl(on|off) -> qps errors
  (cd "$WORK/tls" && sysbench oltp_point_select "${SB[@]}" --mysql-port="$1" --mysql-ssl="$2" run) |
    awk '/queries:/ {gsub(/\(/, "", $3); qps=$3} /ignored errors:/ {e=$3} END {print qps, e}'
}

echo "machine: $(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
echo "mariadb: $(mariadb -h127.0.0.1 -P"$DIRECT" -uroot -N -e 'SELECT VERSION()'), hscale reaches it over $BACKEND_PATH"
echo "sysbench oltp_point_select, text protocol, $THREADS threads, ${SECONDS_EACH}s per cell, persistent connections"
echo "TLS: $(openssl version | cut -d' ' -f1-2) on the client side, rustls (ring) in hscale"
echo
echo "| round | direct (qps) | hscale clear | clients TLS | both hops TLS | clients TLS / clear | both / clear | errors |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
for round in $(seq 1 "$ROUNDS"); do
  read -r d de <<<"$(qps "$DIRECT" off)"
  read -r c ce <<<"$(qps "$CLEAR" off)"
  read -r t te <<<"$(qps "$CLEAR" on)"
  read -r b be <<<"$(qps "$BOTH" on)"
  awk -v r="$round" -v d="$d" -v c="$c" -v t="$t" -v b="$b" -v e="$((de + ce + te + be))" \
    'BEGIN {printf "| %d | %.0f | %.0f | %.0f | %.0f | %.3f | %.3f | %d |\n", r, d, c, t, b, t/c, b/c, e}'
done
# sysbench says nothing when --mysql-ssl is ignored: check that it was not.
cipher=$(mariadb -h127.0.0.1 -P"$CLEAR" -uroot --ssl -e 'status' | sed -n 's/^SSL:\s*//p')
echo
echo "a TLS client's session: $cipher"

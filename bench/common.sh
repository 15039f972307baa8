# Shared by the benchmark scripts: the seed query and table, and a playground
# with one MariaDB to run them against. Source it from the repository root.

# The 2008 HSCALE query: a plain select, then comments to load the tokenizer.
QUERY="SELECT id, category FROM small WHERE small.category='books' /* Added */ /* some */ /* comments */ /* to */ /* produce */ /* a */ /* higher */ /* tokenizer */ /* load */"

free_port() {
  if command -v python3 >/dev/null; then
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
    return
  fi
  # The lent machine may have no python: a random port nothing answers on.
  local port
  while :; do
    port=$((20000 + RANDOM % 40000))
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || { echo "$port"; return; }
  done
}

# How hscale (and the byte relay) reach MariaDB: BACKEND_PATH=tcp (the
# default: in production the backends are on other hosts) or unix (the
# server's socket, the cheapest path on one host).
BACKEND_PATH=${BACKEND_PATH:-tcp}

# Starts `hscale playground --backends 1` on port $1 with its output in $2 and
# sets PLAYGROUND_PID, DIRECT (MariaDB's port), MARIADB_PID, SOCKET (its unix
# socket) and BACKEND (the address hscale reaches it at, by BACKEND_PATH).
# Stop it with `kill -INT $PLAYGROUND_PID`.
# With BACKENDS=2, DIRECT2 is the second MariaDB's port.
start_playground() { # port log
  local tcp=()
  [ "$BACKEND_PATH" = tcp ] && tcp=(--tcp)
  # PLAYGROUND_TLS: a folder with ca.pem, server.pem, server-key.pem.
  [ -n "${PLAYGROUND_TLS:-}" ] && tcp+=(--tls "$PLAYGROUND_TLS")
  target/release/hscale playground --backends "${BACKENDS:-1}" --port "$1" "${tcp[@]}" >"$2" 2>&1 &
  PLAYGROUND_PID=$!
  for _ in $(seq 1 600); do grep -q "is ready" "$2" && break; sleep 0.1; done
  grep -q "is ready" "$2" || { cat "$2"; return 1; }
  DIRECT=$(sed -n 's/^backend 1: MariaDB on 127.0.0.1:\([0-9]*\).*/\1/p' "$2")
  DIRECT2=$(sed -n 's/^backend 2: MariaDB on 127.0.0.1:\([0-9]*\).*/\1/p' "$2")
  MARIADB_PID=$(sed -n 's/^backend 1: .*(pid \([0-9]*\)).*/\1/p' "$2")
  SOCKET="$(sed -n 's/^starting .* in \(.*\) \.\.\./\1/p' "$2")/backend1/mariadb.sock"
  case "$BACKEND_PATH" in
    tcp) BACKEND="127.0.0.1:$DIRECT" ;;
    *) BACKEND=$SOCKET ;;
  esac
}

# Starts `hscale serve` (binary $1) on port $2 with its output in $3 (its
# config in $3.toml), its one backend at $4 (default $BACKEND, the
# playground's MariaDB) with the backend settings $5 if any, and sets
# SERVE_PID once it answers and SERVE_HTTP to its metrics port: a proxy that
# can be stopped and started again apart from the playground's, or run as
# another build. $6: more [proxy] settings.
start_serve() { # binary port log [address] [backend settings] [proxy settings]
  SERVE_HTTP=$(free_port)
  cat >"$3.toml" <<EOF
[proxy]
listen = "127.0.0.1:$2"
http = "127.0.0.1:$SERVE_HTTP"
${6:-}

[[users]]
name = "root"
password = ""
admin = true

[[backends]]
id = 1
address = "${4:-$BACKEND}"
user = "root"
${5:-}

[log]
level = "warn"
EOF
  "$1" serve --config "$3.toml" >"$3" 2>&1 &
  SERVE_PID=$!
  for _ in $(seq 1 100); do
    mariadb -h127.0.0.1 -P"$2" -uroot --skip-ssl -e 'SELECT 1' >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  cat "$3"
  kill "$SERVE_PID"
  return 1
}

# Stops the processes given and the playground: for EXIT traps. Not under
# `set -e`, which would end the trap at the first process already gone and leave
# the playground's servers running.
stop_everything() { # pid...
  set +e
  for pid in "$@"; do kill "$pid" 2>/dev/null; done
  if [ -n "${PLAYGROUND_PID:-}" ]; then
    kill -INT "$PLAYGROUND_PID" 2>/dev/null
    wait "$PLAYGROUND_PID" 2>/dev/null
  fi
}

# hscale's threads on CPU 1, MariaDB and this script (and so the clients it
# starts) on CPU 0: on a 2-core machine hscale's CPU per query otherwise
# follows how often the scheduler migrates its threads, which hides a
# difference of a few µs.
pin_apart() {
  taskset -a -p -c 1 "$HSCALE_PID" >/dev/null
  taskset -a -p -c 0 "$MARIADB_PID" >/dev/null
  taskset -p -c 0 $$ >/dev/null
}

# The 2008 table in database `bench`, through MariaDB directly.
create_seed_table() {
  mariadb -h127.0.0.1 -P"$DIRECT" -uroot -e "CREATE DATABASE IF NOT EXISTS bench;
    CREATE TABLE IF NOT EXISTS bench.small (id INT UNSIGNED PRIMARY KEY,
      category ENUM('books','hardware','software')) ENGINE=HEAP;
    REPLACE INTO bench.small VALUES (1,'books'),(2,'hardware'),(3,'software');"
}

# CPU nanoseconds a process has used, all threads (default: hscale).
cpu_ns() { cat /proc/"${1:-$HSCALE_PID}"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%d", s}'; }

# Seconds mariadb-slap takes for $QUERIES seed queries, in database $SCHEMA
# (default bench).
slap_seconds() { # port concurrency
  mariadb-slap -h127.0.0.1 -P"$1" -uroot --create-schema="${SCHEMA:-bench}" --query="$QUERY" \
    --number-of-queries="$QUERIES" --concurrency="$2" --iterations=1 2>&1 |
    sed -n 's/.*Average number of seconds to run all queries: \([0-9.]*\) seconds/\1/p'
}

median() { sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

# A CA and a certificate it signs for localhost and 127.0.0.1, in folder $1
# (ca.pem, server.pem, server-key.pem), with the openssl command.
make_certificates() { # dir
  mkdir -p "$1"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj "/CN=hscale bench CA" -keyout "$1/ca-key.pem" -out "$1/ca.pem" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=localhost" \
    -keyout "$1/server-key.pem" -out "$1/server.csr" 2>/dev/null
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >"$1/san.ext"
  openssl x509 -req -in "$1/server.csr" -CA "$1/ca.pem" -CAkey "$1/ca-key.pem" -CAcreateserial \
    -days 2 -extfile "$1/san.ext" -out "$1/server.pem" 2>/dev/null
}

# What any proxy gets on this machine: a byte relay that parses nothing
# (crates/proxy/examples/relay_floor.rs) in front of the direct runs' server.
# Sets RELAY (its port) and RELAY_PID; needs `cargo build --release
# --example relay_floor`.
start_relay() {
  RELAY=$(free_port)
  target/release/examples/relay_floor "127.0.0.1:$RELAY" "$BACKEND" &
  RELAY_PID=$!
  for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$RELAY") 2>/dev/null && return; sleep 0.1; done
  echo "the byte relay did not start" >&2
  return 1
}

# Calls the script's own `run NAME PORT DB` (which prints the run's
# transactions a second on stdout) against one server directly ($DIRECT,
# database $1), then the same server through the byte relay ($RELAY,
# database $2, loaded as $1 was), then through hscale ($PORT, database $3),
# and prints the deadlocks hscale ended during the last and the ratios to
# one server, with hscale's target text $4.
one_server_relay_then_hscale() { # direct-db relay-db hscale-db target
  local one relayed through before after
  deadlocks() { mariadb -h127.0.0.1 -P"$PORT" -uroot -N -e "HSCALE STATUS" | awk '$1 == "deadlocks" {print $2}'; }
  one=$(run "one server directly" "$DIRECT" "$1")
  relayed=$(run "one server through a byte relay" "$RELAY" "$2")
  before=$(deadlocks)
  through=$(run "hscale, MOD(2) over two backends" "$PORT" "$3")
  after=$(deadlocks)
  echo "deadlocks through two backends ended by hscale: $((after - before))"
  echo "byte relay/one server: $(awk -v a="$relayed" -v b="$one" 'BEGIN {printf "%.2f", a / b}') (what any proxy gets here)"
  echo "hscale/one server: $(awk -v a="$through" -v b="$one" 'BEGIN {printf "%.2f", a / b}') (target: $4)"
}

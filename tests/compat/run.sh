#!/usr/bin/env bash
# Third-party test suites, unchanged, against hscale in front of real MariaDB:
# the tests go-sql-driver/mysql ships in its Go module, and the tests of the
# mysqlclient source package from PyPI (with the DB-API 2.0 compliance suite).
# Tests that cannot pass through a proxy by nature are listed in README.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
GO_DRIVER_VERSION=v1.10.1
MYSQLCLIENT_VERSION=2.3.1
# The driver matrix's (tests/compat/drivers, docs/drivers.md).
PYMYSQL_VERSION=1.2.4
MYSQL_CONNECTOR_PYTHON_VERSION=9.7.0
MYSQL2_VERSION=3.24.6
CONNECTOR_J_VERSION=9.4.0
MARIADB_CONNECTOR_J_VERSION=3.5.6
WORK=$(mktemp -d /tmp/hscale-compat-XXXXXX)

cargo build --release --quiet --bin hscale
HSCALE="$PWD/target/release/hscale"
source bench/common.sh
PORT=$(free_port)
# A CA of this run's own and a certificate it signs for localhost and
# 127.0.0.1: clients may switch to TLS, and hscale reaches its servers over TLS.
# And a CA that signed nothing here, which must not be trusted.
TLS="$WORK/tls"
make_certificates "$TLS"
make_certificates "$WORK/other"
target/release/hscale playground --backends 2 --port "$PORT" --tls "$TLS" >"$WORK/hscale.log" 2>&1 &
HSCALE_PID=$!
cleanup() { kill -INT "$HSCALE_PID" 2>/dev/null || true; wait "$HSCALE_PID" 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
for _ in $(seq 1 600); do grep -q "is ready" "$WORK/hscale.log" && break; sleep 0.1; done
grep -q "is ready" "$WORK/hscale.log" || { cat "$WORK/hscale.log"; exit 1; }
mariadb -h127.0.0.1 -P"$PORT" -uroot -e "CREATE DATABASE gotest; CREATE DATABASE mysqldb_test; CREATE DATABASE drivers"
BACKEND1=$(sed -n 's/^backend 1: MariaDB on 127.0.0.1:\([0-9]*\).*/\1/p' "$WORK/hscale.log")
BACKEND2=$(sed -n 's/^backend 2: MariaDB on 127.0.0.1:\([0-9]*\).*/\1/p' "$WORK/hscale.log")
DRIVERS="$PWD/tests/compat/drivers"
source "$DRIVERS/table.sh"

echo "== go-sql-driver/mysql $GO_DRIVER_VERSION"
(
  cd "$WORK" && mkdir gomod && cd gomod
  go mod init compat >/dev/null 2>&1
  GOFLAGS=-mod=mod go get "github.com/go-sql-driver/mysql@$GO_DRIVER_VERSION" >/dev/null 2>&1
  cp -r "$(go env GOMODCACHE)/github.com/go-sql-driver/mysql@$GO_DRIVER_VERSION" "$WORK/gosql"
  chmod -R u+w "$WORK/gosql"
  cd "$WORK/gosql"
  # MYSQL_TEST_CONCURRENT turns on TestConcurrent: 1000 clients connecting at once.
  MYSQL_TEST_CONCURRENT=1 MYSQL_TEST_ADDR="127.0.0.1:$PORT" MYSQL_TEST_USER=root MYSQL_TEST_PASS= MYSQL_TEST_DBNAME=gotest \
    go test -count=1 -v -skip '^TestConnectorReturnsTimeout$' . >"$WORK/go.log" 2>&1 \
    || { grep -E -B2 -A12 '^(--- FAIL|panic)' "$WORK/go.log" | head -200; exit 1; }
  echo "$(grep -c '^--- PASS' "$WORK/go.log") passed, 0 failed, $(grep -c '^--- SKIP' "$WORK/go.log") skipped: go-sql-driver/mysql"
)

echo "== mysqlclient $MYSQLCLIENT_VERSION"
(
  cd "$WORK"
  python3 -m venv venv
  venv/bin/pip install -q "mysqlclient==$MYSQLCLIENT_VERSION" pytest sqlalchemy
  venv/bin/pip download -q --no-deps --no-binary :all: "mysqlclient==$MYSQLCLIENT_VERSION" -d sdist
  tar xzf sdist/mysqlclient-*.tar.gz
  cat >"$WORK/test.cnf" <<CNF
[MySQLdb-tests]
host = 127.0.0.1
port = $PORT
user = root
database = mysqldb_test
default-character-set = utf8mb4
CNF
  cd "mysqlclient-$MYSQLCLIENT_VERSION"
  # Bounded like go test (10 minutes by default): a hang fails the run, not CI.
  # test_result_concurrent_use_raises: see README.md.
  TESTDB="$WORK/test.cnf" timeout 900 ../venv/bin/pytest -q -p no:cacheprovider tests \
    --deselect tests/test_connection.py::test_result_concurrent_use_raises
)

echo "== PyMySQL over TLS, hscale's certificate verified against the CA"
(
  cd "$WORK"
  venv/bin/pip install -q "PyMySQL==$PYMYSQL_VERSION"
  PORT="$PORT" CA="$TLS/ca.pem" OTHER_CA="$WORK/other/ca.pem" venv/bin/python - <<'PY'
import os, pymysql
conn = pymysql.connect(host="127.0.0.1", port=int(os.environ["PORT"]), user="root", password="",
                       ssl_ca=os.environ["CA"], ssl_verify_cert=True, ssl_verify_identity=True)
cipher = conn._sock.cipher()
with conn.cursor() as cur:
    cur.execute("SELECT 6 * 7")
    assert cur.fetchone() == (42,)
assert cipher, "not encrypted"
try:
    pymysql.connect(host="127.0.0.1", port=int(os.environ["PORT"]), user="root", password="",
                    ssl_ca=os.environ["OTHER_CA"], ssl_verify_cert=True)
    raise SystemExit("a certificate no trusted CA signed was accepted")
except pymysql.err.OperationalError:
    pass
print(f"2 passed, 0 failed: PyMySQL over TLS ({cipher[0]})")
PY
)

echo "== the driver matrix, each driver with its default options"
(
  cd "$WORK"
  venv/bin/pip install -q "mysql-connector-python==$MYSQL_CONNECTOR_PYTHON_VERSION"
  passed=0
  # One table per driver; the program prints the ids it read back, which
  # the backends must hold, each where it routes.
  run_matrix() {
    local name=$1 ids
    shift
    matrix_table "$name"
    ids=$("$@") || { echo "FAILED: $name"; exit 1; }
    matrix_check "$name" "$ids" || { echo "FAILED: $name"; exit 1; }
    passed=$((passed + 1))
    echo "passed: $name ($ids)"
  }
  for driver in pymysql mysql-connector-python mysqlclient; do
    run_matrix "m_${driver//-/_}" venv/bin/python "$DRIVERS/matrix.py" "$driver" "$PORT" drivers "m_${driver//-/_}"
  done
  mkdir gomatrix && cp "$DRIVERS/matrix.go" gomatrix/ && cd gomatrix
  go mod init matrix >/dev/null 2>&1
  GOFLAGS=-mod=mod go get "github.com/go-sql-driver/mysql@$GO_DRIVER_VERSION" >/dev/null 2>&1
  GOFLAGS=-mod=mod go build -o matrix . >/dev/null
  run_matrix m_go ./matrix "$PORT" drivers m_go
  cd "$WORK" && mkdir nodematrix && cp "$DRIVERS/matrix.js" nodematrix/ && cd nodematrix
  npm init -y >/dev/null && npm install --silent --no-audit --no-fund "mysql2@$MYSQL2_VERSION" >/dev/null
  run_matrix m_mysql2 node matrix.js "$PORT" drivers m_mysql2
  cd "$WORK" && mkdir jars
  for artifact in "com.mysql:mysql-connector-j:$CONNECTOR_J_VERSION" "org.mariadb.jdbc:mariadb-java-client:$MARIADB_CONNECTOR_J_VERSION"; do
    mvn -B -q dependency:copy -Dartifact="$artifact" -DoutputDirectory="$WORK/jars" >/dev/null
  done
  run_matrix m_connector_j java -cp "jars/mysql-connector-j-$CONNECTOR_J_VERSION.jar" "$DRIVERS/Matrix.java" "jdbc:mysql://127.0.0.1:$PORT/drivers" m_connector_j
  run_matrix m_mariadb_connector_j java -cp "jars/mariadb-java-client-$MARIADB_CONNECTOR_J_VERSION.jar" "$DRIVERS/Matrix.java" "jdbc:mariadb://127.0.0.1:$PORT/drivers" m_mariadb_connector_j
  echo "$passed passed, 0 failed: the driver matrix (the Rust drivers' run in cargo test: crates/proxy/tests/drivers.rs)"
)

echo "== mysql_async's own tests, directly and through hscale"
(
  # The version the workspace's tests use: cargo test has unpacked it.
  version=$(sed -n '/^name = "mysql_async"$/{n;s/^version = "\(.*\)"$/\1/p}' Cargo.lock)
  src=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"mysql_async-$version" | head -1)
  cp -r "$src" "$WORK/mysql_async"
  chmod -R u+w "$WORK/mysql_async"
  cd "$WORK/mysql_async"
  export CARGO_TARGET_DIR="$WORK/mysql_async-target"
  cargo test --lib --no-run -q
  # The names of the tests that passed against the server on `port`.
  passes() {
    # Some fail (directly too): the run's status says nothing here.
    { DATABASE_URL="mysql://root@127.0.0.1:$1/mysql" timeout 900 cargo test --lib 2>&1 || true; } |
      sed -n 's/^test \(.*\) \.\.\. ok$/\1/p' | sort
  }
  passes "$BACKEND1" >"$WORK/async-direct"
  passes "$PORT" >"$WORK/async-hscale"
  # Passed directly, not through hscale: each must be listed in README.md.
  missing=$(comm -23 "$WORK/async-direct" "$WORK/async-hscale")
  unexplained=$(for t in $missing; do grep -q "| mysql_async | \`$t\`" "$ROOT/tests/compat/README.md" || echo "$t"; done)
  [ -z "$unexplained" ] || { echo "mysql_async tests that pass directly and fail through hscale:"; echo "$unexplained"; exit 1; }
  [ -z "$missing" ] || echo "left out: $missing"
  echo "$(wc -l <"$WORK/async-hscale") passed through hscale, $(wc -l <"$WORK/async-direct") directly, $(wc -w <<<"$missing") left out (README.md): mysql_async $version"
)

echo "== MySQL 8 connectors with caching_sha2_password"
(
  cd "$WORK"
  # A second hscale on the playground's servers whose greeting asks for
  # caching_sha2_password, as a MySQL 8 server's does.
  SHA2_PORT=$(free_port)
  cat >"$WORK/sha2.toml" <<TOML
[proxy]
listen = "127.0.0.1:$SHA2_PORT"
default_auth = "caching_sha2_password"
tls_cert = "$TLS/server.pem"
tls_key = "$TLS/server-key.pem"

[[users]]
name = "tls8"
password = "pw-tls8"
backend_user = "root"
backend_password = ""

[[users]]
name = "rsa8"
password = "*$(python3 -c 'import hashlib; print(hashlib.sha1(hashlib.sha1(b"pw-rsa8").digest()).hexdigest().upper())')"
backend_user = "root"
backend_password = ""

[[backends]]
id = 1
address = "127.0.0.1:$BACKEND1"
user = "root"

[log]
level = "warn"
TOML
  "$HSCALE" serve --config "$WORK/sha2.toml" >"$WORK/sha2.log" 2>&1 &
  SHA2_PID=$!
  trap 'kill "$SHA2_PID" 2>/dev/null || true' EXIT
  for _ in $(seq 1 100); do
    mariadb -h127.0.0.1 -P"$SHA2_PORT" -utls8 -ppw-tls8 --ssl -e 'SELECT 1' >/dev/null 2>&1 && break
    sleep 0.1
  done
  venv/bin/pip install -q "mysql-connector-python==$MYSQL_CONNECTOR_PYTHON_VERSION" cryptography
  PORT="$SHA2_PORT" CA="$TLS/ca.pem" venv/bin/python - <<'PY'
import os, mysql.connector, pymysql
port, ca = int(os.environ["PORT"]), os.environ["CA"]
passed = 0
# mysql-connector-python over TLS: full authentication, then fast.
for _ in range(2):
    conn = mysql.connector.connect(host="127.0.0.1", port=port, user="tls8", password="pw-tls8",
                                   ssl_ca=ca, ssl_verify_cert=True, auth_plugin="caching_sha2_password")
    cur = conn.cursor()
    cur.execute("SELECT 6 * 7")
    assert cur.fetchone() == (42,)
    conn.close()
    passed += 1
try:
    mysql.connector.connect(host="127.0.0.1", port=port, user="tls8", password="wrong", ssl_ca=ca)
    raise SystemExit("a wrong password was accepted")
except mysql.connector.errors.ProgrammingError as e:
    assert e.errno == 1045, e
    passed += 1
# PyMySQL without TLS: the RSA key exchange (the user's password is known to
# hscale by its hash only).
for _ in range(2):
    conn = pymysql.connect(host="127.0.0.1", port=port, user="rsa8", password="pw-rsa8")
    with conn.cursor() as cur:
        cur.execute("SELECT CURRENT_USER()")
        assert cur.fetchone()[0].startswith("root@")
    conn.close()
    passed += 1
print(f"{passed} passed, 0 failed: caching_sha2_password (mysql-connector-python over TLS, PyMySQL with RSA)")
PY
)

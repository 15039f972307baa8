#!/usr/bin/env bash
# Records xa.binlog, xa.positions and the table's rows at the snapshot
# and at the end (xa.snapshot, xa.rows): the binary log the applier's XA tests
# read (crates/moves/src/follow.rs): prepared XA transactions decided from
# other connections, interleaved, rolled back, one-phase, one left undecided.
# Usage: record-xa.sh SOCKET BINLOG_DIR (a MariaDB with log_bin, binlog_format=ROW).
set -euo pipefail
sock=$1 dir=$2 out=$(dirname "$0")
sql() { mariadb -S "$sock" -uroot -N -e "$1"; }
sql "DROP DATABASE IF EXISTS d; CREATE DATABASE d; CREATE TABLE d.t (id INT PRIMARY KEY, v INT NOT NULL); CREATE TABLE d.other (id INT PRIMARY KEY)"
sql "FLUSH BINARY LOGS"
file=$(sql "SHOW MASTER STATUS" | cut -f1)
at() { echo "$1=$(sql "SHOW MASTER STATUS" | cut -f2)" >> "$out/xa.positions"; }
: > "$out/xa.positions"
at start
sql "INSERT INTO d.t VALUES (1, 1), (2, 2), (3, 3), (4, 4)"
sql "XA START 'a'; UPDATE d.t SET v = 10 WHERE id = 1; INSERT INTO d.other VALUES (1); XA END 'a'; XA PREPARE 'a'"
sql "XA START 'b', 'q', 7; UPDATE d.t SET v = 20 WHERE id = 2; XA END 'b', 'q', 7; XA PREPARE 'b', 'q', 7"
sql "INSERT INTO d.t VALUES (5, 5)"
at snapshot
sql "SELECT id, v FROM d.t ORDER BY id" | tr '\t' ' ' > "$out/xa.snapshot"
sql "XA COMMIT 'a'"
sql "XA ROLLBACK 'b', 'q', 7"
sql "XA START 'c'; INSERT INTO d.t VALUES (6, 6); XA END 'c'; XA COMMIT 'c' ONE PHASE"
sql "XA START 'd'; UPDATE d.t SET v = 30 WHERE id = 3; DELETE FROM d.t WHERE id = 5; XA END 'd'; XA PREPARE 'd'"
at checkpoint
sql "XA START 'e'; UPDATE d.t SET v = 40 WHERE id = 4; XA END 'e'; XA PREPARE 'e'"
sql "XA COMMIT 'e'"
sql "UPDATE d.t SET v = 42 WHERE id = 4"
sql "XA COMMIT 'd'"
sql "XA START 'f'; INSERT INTO d.t VALUES (7, 7); XA END 'f'; XA PREPARE 'f'"
at end
sql "SELECT id, v FROM d.t ORDER BY id" | tr '\t' ' ' > "$out/xa.rows"
sql "XA ROLLBACK 'f'"
sql "FLUSH BINARY LOGS"
cp "$dir/$file" "$out/xa.binlog"

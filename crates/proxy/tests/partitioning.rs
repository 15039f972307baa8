//! Partitioning end to end on real MariaDB servers: the HSCALE scenario of the
//! seeds (SETUP_TABLE, ADD_PARTITION, rows placed, found, updated, deleted,
//! DROP_PARTITION), refusals, transactions over two backends, and an oracle:
//! the same random rows and statements in one plain table on one server.

use std::sync::atomic::Ordering;

use hscale::config::{MoveClients, Transactions};
use hscale_testkit::{cluster, Proxy};
use mysql::prelude::Queryable;
use mysql::Conn;
use rand::{Rng, SeedableRng};

const USERS: &str = "CREATE TABLE users (id INT UNSIGNED PRIMARY KEY, nickname VARCHAR(64) NOT NULL, created DATE NOT NULL)";

/// A database with `users` on backend 1, and a proxy in front.
fn setup(db: &str) -> (Proxy, String) {
    setup_with(db, Transactions::Single)
}

fn setup_with(db: &str, transactions: Transactions) -> (Proxy, String) {
    let db = cluster().database(db);
    cluster().direct(1, Some(&db)).query_drop(USERS).unwrap();
    let mut config = cluster().config();
    config.proxy.transactions = transactions;
    (Proxy::start(config), db)
}

fn error_of(conn: &mut Conn, sql: &str) -> (u16, String) {
    match conn.query_drop(sql) {
        Err(mysql::Error::MySqlError(e)) => (e.code, e.message),
        other => panic!("{sql}: expected an error, got {other:?}"),
    }
}

/// users by MOD(4) of id, two partitions on each backend: ids 0 and 2 mod 4
/// on backend 1, 1 and 3 on backend 2.
fn split_in_two_per_backend(c: &mut Conn) {
    c.query_drop("HSCALE SETUP_TABLE('users', 'id', 'users_default', 1, 'MOD(4)')")
        .unwrap();
    for (name, value, backend) in [("p1", 1, 2), ("p2", 2, 1), ("p3", 3, 2)] {
        c.query_drop(format!(
            "HSCALE ADD_PARTITION('users', '{name}', {value}, {backend})"
        ))
        .unwrap();
    }
}

/// Ends hscale's connections to `backend` that are in database `db`, as a
/// backend that restarts would.
fn kill_connections_in(backend: usize, db: &str) {
    let mut admin = cluster().direct(backend, None);
    let ids: Vec<u64> = admin
        .exec(
            "SELECT id FROM information_schema.processlist WHERE db = ? AND id <> CONNECTION_ID()",
            (db,),
        )
        .unwrap();
    for id in ids {
        admin.query_drop(format!("KILL {id}")).unwrap();
    }
}

/// users by MOD(2) of id: even ids in the default table on backend 1, odd
/// ids in `users_odd` on backend 2.
fn split_by_parity(c: &mut Conn) {
    c.query_drop("HSCALE SETUP_TABLE('users', 'id', 'users_default', 1, 'MOD(2)')")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('users', 'odd', 1, 2)")
        .unwrap();
}

/// Rows of a physical table, straight from its backend.
fn physical(backend: usize, db: &str, table: &str) -> Vec<(u32, String)> {
    cluster()
        .direct(backend, Some(db))
        .query(format!("SELECT id, nickname FROM {table} ORDER BY id"))
        .unwrap()
}

#[test]
fn the_seed_scenario_places_finds_updates_and_deletes_rows_across_backends() {
    // Statements that write on both backends need transactions = "multi".
    let (proxy, db) = setup_with("part_seed", Transactions::Multi);
    let mut c = proxy.connect(Some(&db));
    c.query_drop("INSERT INTO users VALUES (1,'martin','2008-05-06'),(2,'Marvin','2008-06-01'),(3,'peter','2009-01-02')").unwrap();
    c.query_drop("HSCALE SETUP_TABLE('users', 'nickname', 'users_default', 1, 'PREFIX(3)')")
        .unwrap();
    // Rows stay in the default partition until a partition takes them.
    assert_eq!(physical(1, &db, "users_default").len(), 3);
    c.query_drop("HSCALE ADD_PARTITION('users', 'nick1', 'mar', 2)")
        .unwrap();
    assert_eq!(c.affected_rows(), 2, "rows moved");
    assert_eq!(
        physical(2, &db, "users_nick1"),
        [(1, "martin".into()), (2, "Marvin".into())]
    );
    assert_eq!(physical(1, &db, "users_default"), [(3, "peter".into())]);
    // Found through the partition, case-insensitively, as a _ci column would.
    let found: Vec<u32> = c
        .query("SELECT id FROM users WHERE nickname = 'MARTIN'")
        .unwrap();
    assert_eq!(found, [1]);
    let mut all: Vec<(u32, String)> = c.query("SELECT id, nickname FROM users").unwrap();
    all.sort();
    assert_eq!(all.len(), 3);
    // Inserts are placed by value, a multi-row insert split.
    c.query_drop("INSERT INTO users (id, nickname, created) VALUES (4, 'marlene', '2010-01-01'), (5, 'zoe', '2010-01-02')").unwrap();
    assert_eq!(c.affected_rows(), 2);
    assert_eq!(physical(2, &db, "users_nick1").len(), 3);
    assert_eq!(physical(1, &db, "users_default").len(), 2);
    c.query_drop("UPDATE users SET created = '2011-11-11' WHERE nickname IN ('martin', 'zoe')")
        .unwrap();
    assert_eq!(c.affected_rows(), 2);
    c.query_drop("DELETE FROM users WHERE id >= 4").unwrap();
    assert_eq!(c.affected_rows(), 2);
    let left: Vec<u32> = c
        .query("SELECT id FROM users WHERE nickname = 'marvin'")
        .unwrap();
    assert_eq!(left, [2]);
    // LOOKUP and EXPLAIN say where a value goes.
    let lookup: Vec<(String, String, u32, String)> =
        c.query("HSCALE LOOKUP('users', 'Mary')").unwrap();
    assert_eq!(
        lookup,
        [("mar".into(), "nick1".into(), 2, "users_nick1".into())]
    );
    let explain: Vec<(String, u32, String, String)> = c
        .query("HSCALE EXPLAIN SELECT * FROM users WHERE nickname = 'peter'")
        .unwrap();
    assert_eq!(explain[0].1, 1);
    assert_eq!(
        explain[0].3,
        "SELECT * FROM `users_default` AS `users` WHERE nickname = 'peter'"
    );
    // DROP_PARTITION brings the rows back.
    c.query_drop("HSCALE DROP_PARTITION('users', 'nick1')")
        .unwrap();
    assert_eq!(physical(1, &db, "users_default").len(), 3);
    let tables: Vec<String> = cluster().direct(2, Some(&db)).query("SHOW TABLES").unwrap();
    assert!(tables.is_empty(), "{tables:?}");
    let count: Vec<u32> = c
        .query("SELECT id FROM users WHERE nickname = 'martin'")
        .unwrap();
    assert_eq!(count, [1]);
}

#[test]
fn bad_admin_input_is_a_clear_error_and_changes_nothing() {
    let (proxy, db) = setup("part_admin_errors");
    let mut c = proxy.connect(Some(&db));
    assert_eq!(
        error_of(
            &mut c,
            "HSCALE SETUP_TABLE('nope', 'x', 'nope_d', 1, 'MOD(3)')"
        )
        .0,
        1146
    );
    assert_eq!(
        error_of(
            &mut c,
            "HSCALE SETUP_TABLE('users', 'nope', 'users_d', 1, 'MOD(3)')"
        )
        .0,
        1054
    );
    assert_eq!(
        error_of(
            &mut c,
            "HSCALE SETUP_TABLE('users', 'nickname', 'users_d', 1, 'MOD(3)')"
        )
        .0,
        1210
    );
    assert_eq!(
        error_of(
            &mut c,
            "HSCALE SETUP_TABLE('users', 'id', 'users_d', 1, 'SHA(3)')"
        )
        .0,
        1064
    );
    c.query_drop("HSCALE SETUP_TABLE('users', 'id', 'users_d', 1, 'MOD(3)')")
        .unwrap();
    assert_eq!(
        error_of(
            &mut c,
            "HSCALE SETUP_TABLE('users', 'id', 'users_e', 1, 'MOD(3)')"
        )
        .0,
        1050
    );
    c.query_drop("HSCALE ADD_PARTITION('users', 'one', 1, 2)")
        .unwrap();
    let (code, message) = error_of(&mut c, "HSCALE ADD_PARTITION('users', 'uno', '1', 1)");
    assert_eq!(code, 1210);
    assert!(message.contains("belongs to partition 'one'"), "{message}");
    assert_eq!(
        error_of(&mut c, "HSCALE ADD_PARTITION('users', 'three', 3, 1)").0,
        1210
    );
    assert_eq!(
        error_of(&mut c, "HSCALE ADD_PARTITION('users', 'two', 2, 9)").0,
        1105
    );
    let partitions: Vec<(String, Option<String>, u32, String, String)> =
        c.query("HSCALE SHOW_PARTITIONS('users')").unwrap();
    assert_eq!(partitions.len(), 2, "{partitions:?}");
    assert_eq!(error_of(&mut c, "HSCALE FROB").0, 1064);
    let mut user = proxy.connect(Some(&db));
    user.query_drop("SELECT 1").unwrap();
}

#[test]
fn refusals_are_1235_and_name_the_table() {
    let (proxy, db) = setup("part_refusals");
    let mut c = proxy.connect(Some(&db));
    split_by_parity(&mut c);
    for sql in [
        "SELECT * FROM users u JOIN users v ON u.nickname = v.nickname FOR UPDATE",
        "INSERT INTO users (nickname, created) VALUES ('x', '2000-01-01')",
        "UPDATE users SET id = 3 WHERE id = 1",
        "SELECT * FROM users WHERE id = 'abc'",
    ] {
        let (code, message) = error_of(&mut c, sql);
        assert_eq!(code, 1235, "{sql}: {message}");
        assert!(message.contains("`users`"), "{sql}: {message}");
    }
    // Prepared, the same: at PREPARE when the text decides, at EXECUTE
    // when the parameters' values do.
    let refused = |result: Result<(), mysql::Error>| match result {
        Err(mysql::Error::MySqlError(e)) => assert_eq!(e.code, 1235, "{}", e.message),
        other => panic!("expected a refusal, got {other:?}"),
    };
    refused(c.prep("UPDATE users SET id = ? WHERE id = 1").map(drop));
    let limited = c
        .prep("SELECT * FROM users WHERE id IN (?, ?) LIMIT ?")
        .unwrap();
    c.exec_drop(&limited, (1, 3, 5)).unwrap();
    // Over partitions whose answers hscale cannot merge: on copies.
    for id in 1..=3 {
        c.query_drop(format!(
            "INSERT INTO users VALUES ({id}, 'n{id}', '2000-01-01')"
        ))
        .unwrap();
    }
    let rows: Vec<(u32, String)> = c
        .exec(
            "SELECT id, nickname FROM users WHERE id IN (?, ?) ORDER BY id LIMIT ?",
            (1, 2, 5),
        )
        .unwrap();
    assert_eq!(rows, [(1, "n1".to_string()), (2, "n2".to_string())]);
    let rows: Vec<mysql::Row> = c.exec(&limited, (1, 2, 1)).unwrap();
    assert_eq!(rows.len(), 1);
    c.query_drop("SELECT 1").unwrap();
}

#[test]
fn transactions_write_on_one_backend_in_single_mode() {
    let (proxy, db) = setup("part_tx_single");
    let mut c = proxy.connect(Some(&db));
    split_by_parity(&mut c);
    c.query_drop("BEGIN").unwrap();
    c.query_drop("INSERT INTO users VALUES (1, 'a', '2000-01-01')")
        .unwrap();
    let (code, message) = error_of(&mut c, "INSERT INTO users VALUES (2, 'b', '2000-01-01')");
    assert_eq!(code, 1235);
    assert!(
        message.contains("backend 1") && message.contains("backend 2"),
        "{message}"
    );
    // Reads elsewhere are fine; the transaction sees its own write.
    let seen: Vec<u32> = c.query("SELECT id FROM users WHERE id = 1").unwrap();
    assert_eq!(seen, [1]);
    assert!(physical(2, &db, "users_odd").is_empty(), "uncommitted");
    c.query_drop("COMMIT").unwrap();
    assert_eq!(physical(2, &db, "users_odd").len(), 1);
    // A write over both backends outside a transaction is one too.
    assert_eq!(error_of(&mut c, "UPDATE users SET nickname = 'c'").0, 1235);
    let split = "INSERT INTO users VALUES (3, 'c', '2000-01-01'), (4, 'd', '2000-01-01')";
    assert_eq!(error_of(&mut c, split).0, 1235);
    assert_eq!(
        physical(1, &db, "users_default").len(),
        0,
        "nothing written"
    );
}

#[test]
fn transactions_commit_and_roll_back_on_every_backend_in_multi_mode() {
    let (proxy, db) = setup_with("part_tx_multi", Transactions::Multi);
    let mut c = proxy.connect(Some(&db));
    split_by_parity(&mut c);
    c.query_drop("BEGIN").unwrap();
    c.query_drop("INSERT INTO users VALUES (1, 'a', '2000-01-01'), (2, 'b', '2000-01-01')")
        .unwrap();
    c.query_drop("ROLLBACK").unwrap();
    assert!(physical(1, &db, "users_default").is_empty());
    assert!(physical(2, &db, "users_odd").is_empty());
    c.query_drop("START TRANSACTION").unwrap();
    c.query_drop("INSERT INTO users VALUES (3, 'c', '2000-01-01')")
        .unwrap();
    c.query_drop("INSERT INTO users VALUES (4, 'd', '2000-01-01')")
        .unwrap();
    c.query_drop("COMMIT").unwrap();
    assert_eq!(physical(1, &db, "users_default").len(), 1);
    assert_eq!(physical(2, &db, "users_odd").len(), 1);
    c.query_drop("UPDATE users SET nickname = 'z'").unwrap();
    assert_eq!(c.affected_rows(), 2);
}

#[test]
fn rollback_to_a_savepoint_undoes_what_every_backend_did_after_it() {
    let (proxy, db) = setup_with("part_tx_savepoints", Transactions::Multi);
    let mut c = proxy.connect(Some(&db));
    split_by_parity(&mut c);
    let ids = |c: &mut Conn| -> Vec<u32> { c.query("SELECT id FROM users ORDER BY id").unwrap() };
    let insert = |c: &mut Conn, id: u32| {
        c.query_drop(format!(
            "INSERT INTO users VALUES ({id}, 'n', '2000-01-01')"
        ))
        .unwrap()
    };
    c.query_drop("BEGIN").unwrap();
    insert(&mut c, 2);
    c.query_drop("SAVEPOINT a").unwrap();
    // Backend 2 joins after the savepoint: all it did goes.
    insert(&mut c, 1);
    insert(&mut c, 4);
    c.query_drop("SAVEPOINT `B`").unwrap();
    insert(&mut c, 3);
    insert(&mut c, 6);
    c.query_drop("ROLLBACK TO b").unwrap();
    assert_eq!(ids(&mut c), [1, 2, 4]);
    c.query_drop("rollback work to savepoint A").unwrap();
    assert_eq!(ids(&mut c), [2]);
    // Gone with the rollback to a, which stays.
    assert_eq!(error_of(&mut c, "ROLLBACK TO b").0, 1305);
    insert(&mut c, 5);
    c.query_drop("SAVEPOINT c").unwrap();
    insert(&mut c, 7);
    c.query_drop("RELEASE SAVEPOINT a").unwrap();
    assert_eq!(error_of(&mut c, "ROLLBACK TO c").0, 1305);
    c.query_drop("COMMIT").unwrap();
    assert_eq!(physical(1, &db, "users_default").len(), 1);
    assert_eq!(
        physical(2, &db, "users_odd")
            .iter()
            .map(|r| r.0)
            .collect::<Vec<_>>(),
        [5, 7]
    );
}

#[test]
fn a_savepoint_before_the_only_write_undoes_it_in_single_mode() {
    let (proxy, db) = setup("part_tx_savepoint_single");
    let mut c = proxy.connect(Some(&db));
    split_by_parity(&mut c);
    c.query_drop("BEGIN").unwrap();
    c.query_drop("SAVEPOINT a").unwrap();
    c.query_drop("INSERT INTO users VALUES (1, 'a', '2000-01-01')")
        .unwrap();
    c.query_drop("ROLLBACK TO SAVEPOINT a").unwrap();
    // Backend 2 wrote nothing now: backend 1 may write.
    c.query_drop("INSERT INTO users VALUES (2, 'b', '2000-01-01')")
        .unwrap();
    c.query_drop("COMMIT").unwrap();
    assert!(physical(2, &db, "users_odd").is_empty());
    assert_eq!(physical(1, &db, "users_default").len(), 1);
}

#[test]
fn a_chained_transaction_reaches_later_backends_too() {
    let (proxy, db) = setup_with("part_tx_chain", Transactions::Multi);
    let mut c = proxy.connect(Some(&db));
    split_by_parity(&mut c);
    c.query_drop("START TRANSACTION").unwrap();
    c.query_drop("INSERT INTO users VALUES (2, 'b', '2000-01-01')")
        .unwrap();
    c.query_drop("COMMIT AND CHAIN").unwrap();
    // Backend 2 joins the chained transaction, and its ROLLBACK undoes this.
    c.query_drop("INSERT INTO users VALUES (1, 'a', '2000-01-01')")
        .unwrap();
    c.query_drop("ROLLBACK").unwrap();
    assert_eq!(physical(1, &db, "users_default").len(), 1);
    assert!(physical(2, &db, "users_odd").is_empty());
}

#[test]
fn begin_and_ddl_inside_a_transaction_commit_it_on_every_backend() {
    let (proxy, db) = setup_with("part_tx_implicit", Transactions::Multi);
    let mut c = proxy.connect(Some(&db));
    split_by_parity(&mut c);
    let odd = || physical(2, &db, "users_odd").len();
    c.query_drop("BEGIN").unwrap();
    c.query_drop("INSERT INTO users VALUES (1, 'a', '2000-01-01')")
        .unwrap();
    c.query_drop("INSERT INTO users VALUES (2, 'b', '2000-01-01')")
        .unwrap();
    // As on MariaDB: the second BEGIN commits the first transaction.
    c.query_drop("BEGIN").unwrap();
    c.query_drop("ROLLBACK").unwrap();
    assert_eq!(odd(), 1);
    assert_eq!(physical(1, &db, "users_default").len(), 1);
    c.query_drop("START TRANSACTION").unwrap();
    c.query_drop("INSERT INTO users VALUES (3, 'c', '2000-01-01')")
        .unwrap();
    c.query_drop("CREATE TABLE other (id INT)").unwrap();
    c.query_drop("ROLLBACK").unwrap();
    assert_eq!(odd(), 2, "CREATE TABLE committed it");
    c.query_drop("START TRANSACTION").unwrap();
    c.query_drop("INSERT INTO users VALUES (5, 'e', '2000-01-01')")
        .unwrap();
    c.query_drop("CREATE TEMPORARY TABLE scratch (id INT)")
        .unwrap();
    c.query_drop("DROP TEMPORARY TABLE scratch").unwrap();
    c.query_drop("ROLLBACK").unwrap();
    assert_eq!(odd(), 2, "temporary tables commit nothing");
    c.query_drop("SET autocommit = 0").unwrap();
    c.query_drop("INSERT INTO users VALUES (7, 'g', '2000-01-01')")
        .unwrap();
    c.query_drop("SELECT 1").unwrap();
    c.query_drop("SET autocommit = 1").unwrap();
    assert_eq!(odd(), 3, "SET autocommit = 1 committed it");
}

/// A SET that turns autocommit on among other settings commits every
/// backend's part before the client's answer, or fails as a whole; where
/// hscale cannot run it on each backend first, it is refused and the
/// transaction stays whole.
#[test]
fn a_set_of_autocommit_among_other_settings_commits_every_backend_or_none() {
    let (proxy, db) = setup_with("part_tx_autocommit_set", Transactions::Multi);
    let mut c = proxy.connect(Some(&db));
    split_by_parity(&mut c);
    let counts = || {
        (
            physical(1, &db, "users_default").len(),
            physical(2, &db, "users_odd").len(),
        )
    };
    let insert = |c: &mut Conn, ids: [u32; 2]| {
        for id in ids {
            c.query_drop(format!(
                "INSERT INTO users VALUES ({id}, 'x', '2000-01-01')"
            ))
            .unwrap();
        }
    };
    c.query_drop("SET autocommit = 0").unwrap();
    insert(&mut c, [1, 2]);
    // MariaDB's error, and the transaction goes on.
    let (code, _) = error_of(&mut c, "SET autocommit = 1, sql_mode = 'NO_SUCH_MODE'");
    assert_eq!(code, 1231);
    assert_eq!(counts(), (0, 0));
    c.query_drop("SET sql_mode = 'ANSI_QUOTES', autocommit = 1")
        .unwrap();
    assert_eq!(counts(), (1, 1), "committed on both before the answer");
    let on_backend_2: (String, u8) = c
        .query_first("SELECT @@sql_mode, @@autocommit FROM users WHERE id = 1")
        .unwrap()
        .unwrap();
    assert_eq!(on_backend_2, ("ANSI_QUOTES".into(), 1));
    c.query_drop("SET autocommit = 0").unwrap();
    insert(&mut c, [3, 4]);
    c.query_drop("SET @on = 1").unwrap();
    for sql in ["SET autocommit = @on", "SET @x = 1, autocommit = 1"] {
        let (code, message) = error_of(&mut c, sql);
        assert_eq!(code, 1235, "{sql}");
        assert!(message.contains("backend 2"), "{message}");
    }
    c.query_drop("ROLLBACK").unwrap();
    assert_eq!(counts(), (1, 1), "the refusals committed nothing");
    // With the transaction on one backend, MariaDB decides alone.
    c.query_drop("SET autocommit = @on").unwrap();
    insert(&mut c, [5, 6]);
    assert_eq!(counts(), (2, 2));
    // Backend 2's connection lost: the client hears of it, and backend 1's
    // part is rolled back too, not committed.
    c.query_drop("SET autocommit = 0").unwrap();
    insert(&mut c, [7, 8]);
    kill_connections_in(2, &db);
    let (code, _) = error_of(&mut c, "SET sql_mode = '', autocommit = 1");
    assert_eq!(code, 2013);
    c.query_drop("ROLLBACK").unwrap();
    assert_eq!(counts(), (2, 2));
}

#[test]
fn a_setting_changed_mid_transaction_keeps_what_other_backends_hold() {
    let (proxy, db) = setup("part_tx_setting");
    let mut c = proxy.connect(Some(&db));
    split_by_parity(&mut c);
    c.query_drop("SET SESSION sort_buffer_size = 1048576")
        .unwrap();
    c.query_drop("BEGIN").unwrap();
    c.query_drop("INSERT INTO users VALUES (1, 'a', '2000-01-01')")
        .unwrap();
    // Runs on backend 1; backend 2's connection takes it on its next statement.
    c.query_drop("SET SESSION group_concat_max_len = 4096")
        .unwrap();
    let seen: Vec<(u32, u64)> = c
        .query("SELECT id, @@group_concat_max_len FROM users WHERE id = 1")
        .unwrap();
    assert_eq!(seen, [(1, 4096)], "its own write, with the new setting");
    c.query_drop("COMMIT").unwrap();
    assert_eq!(physical(2, &db, "users_odd").len(), 1);
}

#[test]
fn a_transaction_hscale_did_not_begin_stays_on_its_backend() {
    let (proxy, db) = setup_with("part_tx_unseen", Transactions::Multi);
    let mut c = proxy.connect(Some(&db));
    split_by_parity(&mut c);
    c.query_drop("XA START 'x'").unwrap();
    c.query_drop("INSERT INTO users VALUES (2, 'b', '2000-01-01')")
        .unwrap();
    // It would run outside the XA transaction, and stay after its rollback.
    let (code, message) = error_of(&mut c, "INSERT INTO users VALUES (1, 'a', '2000-01-01')");
    assert_eq!(code, 1235);
    assert!(message.contains("backend 2"), "{message}");
    c.query_drop("XA END 'x'").unwrap();
    c.query_drop("XA ROLLBACK 'x'").unwrap();
    assert!(physical(1, &db, "users_default").is_empty());
    assert!(physical(2, &db, "users_odd").is_empty());
    // A BEGIN inside a multi-statement query is not seen either.
    c.query_drop("BEGIN; SELECT 1").unwrap();
    c.query_drop("INSERT INTO users VALUES (4, 'd', '2000-01-01')")
        .unwrap();
    let (code, _) = error_of(&mut c, "INSERT INTO users VALUES (3, 'c', '2000-01-01')");
    assert_eq!(code, 1235);
    c.query_drop("ROLLBACK").unwrap();
    assert!(physical(1, &db, "users_default").is_empty());
    assert!(physical(2, &db, "users_odd").is_empty());
}

/// Rows 2, 4, ... 200 in the default partition on backend 1.
fn even_rows(c: &mut Conn) {
    let rows: Vec<String> = (2..=200)
        .step_by(2)
        .map(|id| format!("({id}, 'n', '2000-01-01')"))
        .collect();
    c.query_drop(format!("INSERT INTO users VALUES {}", rows.join(",")))
        .unwrap();
}

/// Waits until `statement` has run on `backend` for long enough that it
/// can only be waiting for a lock (`innodb_trx` does not always say so).
fn until_blocked(backend: usize, statement: &str) {
    let mut watch = cluster().direct(backend, None);
    for _ in 0..500 {
        let blocked: Option<u64> = watch
            .exec_first(
                "SELECT COUNT(*) FROM information_schema.processlist WHERE info = ? AND time_ms > 200",
                (statement,),
            )
            .unwrap();
        if blocked == Some(1) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("{statement} did not come to wait for a lock on backend {backend}");
}

#[test]
fn a_deadlock_on_one_backend_rolls_the_transaction_back_on_every_backend() {
    let (proxy, db) = setup_with("part_tx_deadlock", Transactions::Multi);
    let mut c = proxy.connect(Some(&db));
    split_by_parity(&mut c);
    even_rows(&mut c);
    c.query_drop("BEGIN").unwrap();
    c.query_drop("INSERT INTO users VALUES (1, 'a', '2000-01-01')")
        .unwrap();
    c.query_drop("UPDATE users SET nickname = 'a' WHERE id = 2")
        .unwrap();
    // Straight on backend 1, and heavier: InnoDB picks hscale's side as the victim.
    let mut other = cluster().direct(1, Some(&db));
    other.query_drop("BEGIN").unwrap();
    other
        .query_drop("UPDATE users_default SET nickname = 'b' WHERE id >= 4")
        .unwrap();
    let blocked = "UPDATE users_default SET nickname = 'b' WHERE id = 2";
    let waiter = std::thread::spawn(move || {
        other.query_drop(blocked).unwrap();
        other.query_drop("COMMIT").unwrap();
    });
    until_blocked(1, blocked);
    let (code, _) = error_of(&mut c, "UPDATE users SET nickname = 'a' WHERE id = 4");
    assert_eq!(code, 1213);
    waiter.join().unwrap();
    let errors: Vec<(String, u16, String)> = c.query("SHOW ERRORS").unwrap();
    // MariaDB lists the deadlock twice.
    assert!(
        !errors.is_empty() && errors.iter().all(|e| e.1 == 1213),
        "{errors:?}"
    );
    // MariaDB rolled the whole transaction back, so its row on backend 2 is
    // gone, and what follows runs in autocommit, as the client expects.
    let seen: Vec<u32> = c.query("SELECT id FROM users WHERE id = 1").unwrap();
    assert!(seen.is_empty(), "the rolled back row is still seen");
    c.query_drop("INSERT INTO users VALUES (3, 'c', '2000-01-01')")
        .unwrap();
    c.query_drop("BEGIN").unwrap();
    c.query_drop("ROLLBACK").unwrap();
    assert_eq!(
        physical(2, &db, "users_odd"),
        [(3, "c".to_string())],
        "row 1 rolled back, row 3 committed"
    );
}

#[test]
fn a_backend_connection_lost_mid_transaction_rolls_it_back_on_every_backend() {
    let (proxy, db) = setup_with("part_tx_lost", Transactions::Multi);
    let mut c = proxy.connect(Some(&db));
    split_by_parity(&mut c);
    c.query_drop("BEGIN").unwrap();
    c.query_drop("INSERT INTO users VALUES (1, 'a', '2000-01-01')")
        .unwrap();
    c.query_drop("INSERT INTO users VALUES (2, 'b', '2000-01-01')")
        .unwrap();
    kill_connections_in(1, &db);
    let (code, _) = error_of(&mut c, "UPDATE users SET nickname = 'c' WHERE id = 2");
    assert_eq!(code, 2013);
    // Backend 1's part went with its connection, so backend 2's goes too.
    c.query_drop("COMMIT").unwrap();
    assert!(physical(1, &db, "users_default").is_empty());
    assert!(physical(2, &db, "users_odd").is_empty());
    c.query_drop("INSERT INTO users VALUES (3, 'c', '2000-01-01')")
        .unwrap();
    assert_eq!(physical(2, &db, "users_odd").len(), 1, "autocommit again");
}

#[test]
fn several_statements_in_one_query_keep_the_transaction_whole() {
    let (proxy, db) = setup_with("part_tx_multi_statement", Transactions::Multi);
    let mut c = proxy.connect(Some(&db));
    split_by_parity(&mut c);
    let rows = |backend: usize, table: &str| physical(backend, &db, table).len();
    // Backend 2 takes the autocommit the query set on backend 1.
    c.query_drop("SET autocommit = 0; SELECT 1").unwrap();
    c.query_drop("INSERT INTO users VALUES (1, 'a', '2000-01-01')")
        .unwrap();
    c.query_drop("INSERT INTO users VALUES (2, 'b', '2000-01-01')")
        .unwrap();
    c.query_drop("ROLLBACK").unwrap();
    assert_eq!((rows(1, "users_default"), rows(2, "users_odd")), (0, 0));
    c.query_drop("INSERT INTO users VALUES (3, 'c', '2000-01-01')")
        .unwrap();
    // Its COMMIT would end the transaction on backend 1 only.
    let (code, message) = error_of(&mut c, "COMMIT; SELECT 1");
    assert_eq!(code, 1235);
    assert!(message.contains("backend 2"), "{message}");
    c.query_drop("COMMIT").unwrap();
    assert_eq!(rows(2, "users_odd"), 1);
    c.query_drop("SET autocommit = 1; SELECT 1").unwrap();
    c.query_drop("INSERT INTO users VALUES (5, 'e', '2000-01-01')")
        .unwrap();
    c.query_drop("INSERT INTO users VALUES (6, 'f', '2000-01-01')")
        .unwrap();
    assert_eq!((rows(1, "users_default"), rows(2, "users_odd")), (1, 2));
}

#[test]
fn settings_and_databases_changed_among_several_statements_reach_every_backend() {
    let (proxy, db) = setup("part_multi_state");
    let mut c = proxy.connect(Some(&db));
    split_by_parity(&mut c);
    c.query_drop("INSERT INTO users VALUES (1, 'a', '2000-01-01')")
        .unwrap();
    c.query_drop("INSERT INTO users VALUES (2, 'b', '2000-01-01')")
        .unwrap();
    // Ids 1 and 2 live on backends 2 and 1: each answers with its own connection's value.
    let on_both = |c: &mut Conn, variable: &str| -> Vec<String> {
        [1, 2]
            .map(|id| {
                c.query_first(format!(
                    "SELECT @@session.{variable} FROM users WHERE id = {id}"
                ))
                .unwrap()
                .unwrap()
            })
            .to_vec()
    };
    c.query_drop("SET time_zone = '+05:00'; SELECT 1").unwrap();
    assert_eq!(on_both(&mut c, "time_zone"), ["+05:00", "+05:00"]);
    // The statements before an error ran: their SET holds.
    let mut answers = c
        .query_iter("SET time_zone = '+06:00'; SELECT no_such_column")
        .unwrap();
    let mut codes = Vec::new();
    while let Some(set) = answers.iter() {
        for row in set {
            if let Err(mysql::Error::MySqlError(e)) = row {
                codes.push(e.code);
            }
        }
    }
    drop(answers);
    assert_eq!(codes, [1054]);
    let warnings: Vec<mysql::Row> = c.query("SHOW WARNINGS").unwrap();
    assert_eq!(warnings.len(), 1, "the error is still there to read");
    assert_eq!(on_both(&mut c, "time_zone"), ["+06:00", "+06:00"]);
    // A value only the server can tell, and the character set with SET NAMES.
    c.query_drop(
        "SET @zone = '+07:00'; SET time_zone = @zone, sql_mode = 'ANSI_QUOTES'; SET NAMES latin1",
    )
    .unwrap();
    assert_eq!(on_both(&mut c, "time_zone"), ["+07:00", "+07:00"]);
    assert_eq!(on_both(&mut c, "sql_mode"), ["ANSI_QUOTES", "ANSI_QUOTES"]);
    assert_eq!(
        on_both(&mut c, "character_set_client"),
        ["latin1", "latin1"]
    );
    let quoted: Vec<u32> = c
        .query(r#"SELECT "id" FROM "users" WHERE "id" = 1"#)
        .unwrap();
    assert_eq!(
        quoted,
        [1],
        "hscale reads quotes as the session's sql_mode now does"
    );
    c.query_drop("SET NAMES utf8mb4; SET sql_mode = DEFAULT")
        .unwrap();
    assert_eq!(
        on_both(&mut c, "character_set_client"),
        ["utf8mb4", "utf8mb4"]
    );
    // A database chosen among several statements names the tables that follow.
    let other = cluster().database("part_multi_state_other");
    let mut direct = cluster().direct(1, Some(&other));
    direct.query_drop(USERS).unwrap();
    direct
        .query_drop("INSERT INTO users VALUES (1, 'other', '2000-01-01')")
        .unwrap();
    c.query_drop(format!("DO 1; USE {other}")).unwrap();
    let nickname: Option<String> = c
        .query_first("SELECT nickname FROM users WHERE id = 1")
        .unwrap();
    assert_eq!(
        nickname.as_deref(),
        Some("other"),
        "{other}.users, not partitioned"
    );
    c.query_drop(format!("USE {db}; SELECT 1")).unwrap();
    assert_eq!(on_both(&mut c, "time_zone"), ["+07:00", "+07:00"]);
    // hscale reads the values back only after the client has read what the
    // last statement left: its row count.
    c.query_drop("CREATE TABLE plain (id INT)").unwrap();
    c.query_drop("INSERT INTO plain VALUES (1), (2)").unwrap();
    c.query_drop("SET time_zone = '+03:00'; UPDATE plain SET id = id + 10")
        .unwrap();
    let count: Option<i64> = c.query_first("SELECT ROW_COUNT()").unwrap();
    assert_eq!(count, Some(2));
    assert_eq!(on_both(&mut c, "time_zone"), ["+03:00", "+03:00"]);
    // A prepared SET takes its value at each execution.
    let set_zone = c.prep("SET time_zone = ?").unwrap();
    c.exec_drop(&set_zone, ("+08:00",)).unwrap();
    assert_eq!(on_both(&mut c, "time_zone"), ["+08:00", "+08:00"]);
    c.exec_drop(&set_zone, ("+09:00",)).unwrap();
    assert_eq!(on_both(&mut c, "time_zone"), ["+09:00", "+09:00"]);
    // As a dump sets and restores its sql_mode.
    let before = on_both(&mut c, "sql_mode");
    c.query_drop("/*!40101 SET @OLD_SQL_MODE=@@SQL_MODE, SQL_MODE='NO_AUTO_VALUE_ON_ZERO' */")
        .unwrap();
    assert_eq!(
        on_both(&mut c, "sql_mode"),
        ["NO_AUTO_VALUE_ON_ZERO", "NO_AUTO_VALUE_ON_ZERO"]
    );
    c.query_drop("/*!40101 SET SQL_MODE=@OLD_SQL_MODE */")
        .unwrap();
    assert_eq!(on_both(&mut c, "sql_mode"), before);
}

#[test]
fn procedures_and_sql_prepared_statements_keep_the_transaction_whole() {
    let (proxy, db) = setup_with("part_tx_call", Transactions::Multi);
    let mut c = proxy.connect(Some(&db));
    split_by_parity(&mut c);
    let rows = |backend: usize, table: &str| physical(backend, &db, table).len();
    c.query_drop("CREATE PROCEDURE commit_here() COMMIT")
        .unwrap();
    c.query_drop("CREATE PROCEDURE autocommit_off() SET autocommit = 0")
        .unwrap();
    c.query_drop("PREPARE commit_stmt FROM 'COMMIT'").unwrap();
    c.query_drop("BEGIN").unwrap();
    c.query_drop("INSERT INTO users VALUES (1, 'a', '2000-01-01')")
        .unwrap();
    c.query_drop("INSERT INTO users VALUES (2, 'b', '2000-01-01')")
        .unwrap();
    for hidden_commit in ["CALL commit_here()", "EXECUTE commit_stmt"] {
        let (code, message) = error_of(&mut c, hidden_commit);
        assert_eq!(code, 1235, "{hidden_commit}");
        assert!(message.contains("backend 2"), "{message}");
    }
    c.query_drop("ROLLBACK").unwrap();
    assert_eq!((rows(1, "users_default"), rows(2, "users_odd")), (0, 0));
    // Outside a transaction the procedure runs, and its setting is the session's.
    c.query_drop("CALL autocommit_off()").unwrap();
    c.query_drop("INSERT INTO users VALUES (3, 'c', '2000-01-01')")
        .unwrap();
    c.query_drop("INSERT INTO users VALUES (4, 'd', '2000-01-01')")
        .unwrap();
    c.query_drop("ROLLBACK").unwrap();
    assert_eq!((rows(1, "users_default"), rows(2, "users_odd")), (0, 0));
}

#[test]
fn a_transaction_reads_one_snapshot_on_each_backend_it_reaches() {
    let (proxy, db) = setup("part_tx_snapshot");
    let mut c = proxy.connect(Some(&db));
    split_by_parity(&mut c);
    let mut other = proxy.connect(Some(&db));
    let ids = |c: &mut Conn, sql: &str| -> Vec<u32> { c.query(sql).unwrap() };
    c.query_drop("BEGIN").unwrap();
    // The first read on backend 2 opens the transaction there.
    assert!(ids(&mut c, "SELECT id FROM users WHERE id = 1").is_empty());
    other
        .query_drop("INSERT INTO users VALUES (1, 'a', '2000-01-01')")
        .unwrap();
    other
        .query_drop("INSERT INTO users VALUES (2, 'b', '2000-01-01')")
        .unwrap();
    // Backend 1 joins now and sees row 2; backend 2 keeps its snapshot.
    assert_eq!(ids(&mut c, "SELECT id FROM users ORDER BY id"), [2]);
    other
        .query_drop("INSERT INTO users VALUES (4, 'd', '2000-01-01')")
        .unwrap();
    assert_eq!(ids(&mut c, "SELECT id FROM users ORDER BY id"), [2]);
    c.query_drop("COMMIT").unwrap();
    assert_eq!(ids(&mut c, "SELECT id FROM users ORDER BY id"), [1, 2, 4]);
}

#[test]
fn a_second_instance_obeys_a_change_before_the_admin_command_returns() {
    let (first, db) = setup("part_two_instances");
    let second = Proxy::for_cluster();
    let mut a = first.connect(Some(&db));
    let mut b = second.connect(Some(&db));
    a.query_drop("INSERT INTO users VALUES (1, 'martin', '2000-01-01')")
        .unwrap();
    a.query_drop("HSCALE SETUP_TABLE('users', 'nickname', 'users_default', 1, 'PREFIX(3)')")
        .unwrap();
    a.query_drop("HSCALE ADD_PARTITION('users', 'nick1', 'mar', 2)")
        .unwrap();
    // No wait: the command returned only once the second instance had loaded it.
    b.query_drop("INSERT INTO users VALUES (2, 'marvin', '2000-01-01')")
        .unwrap();
    assert_eq!(physical(2, &db, "users_nick1").len(), 2);
    let found: Vec<u32> = b
        .query("SELECT id FROM users WHERE nickname = 'martin'")
        .unwrap();
    assert_eq!(found, [1]);
}

#[test]
fn non_admin_users_may_not_run_admin_commands() {
    let db = cluster().database("part_non_admin");
    let mut config = cluster().config();
    config.users.push(hscale::config::UserConfig {
        name: "app".into(),
        password: "secret".into(),
        admin: false,
        // Runs as hscale's own backend account: no account of its own exists.
        backend_user: Some("root".into()),
        backend_password: Some(String::new()),
        ..Default::default()
    });
    let proxy = Proxy::start(config);
    let mut c = hscale_testkit::connect(proxy.port, "app", "secret", Some(&db));
    assert_eq!(error_of(&mut c, "HSCALE SHOW_TABLES").0, 1227);
}

/// Oracle: random rows and random point queries and writes answer the same
/// through hscale on partitions over two backends as on one plain table.
#[test]
fn random_point_statements_answer_like_one_plain_table() {
    let (proxy, db) = setup_with("part_oracle", Transactions::Multi);
    let oracle_db = cluster().database("part_oracle_plain");
    let mut oracle = cluster().direct(1, Some(&oracle_db));
    oracle.query_drop(USERS).unwrap();
    let mut c = proxy.connect(Some(&db));
    c.query_drop("HSCALE SETUP_TABLE('users', 'id', 'users_default', 1, 'MOD(5)')")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('users', 'p1', 1, 2)")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('users', 'p2', 2, 1)")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('users', 'p2', 3, 1)")
        .unwrap();
    let mut seed = 42u64;
    let mut next = |n: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    for step in 0..300 {
        let id = next(60);
        let sql = match next(5) {
            0 | 1 => format!(
                "INSERT IGNORE INTO users VALUES ({id}, 'n{}', '2008-05-06')",
                next(1000)
            ),
            2 => format!("UPDATE users SET nickname = 'u{step}' WHERE id = {id}"),
            3 => format!("DELETE FROM users WHERE id IN ({id}, {})", next(60)),
            _ => format!("REPLACE INTO users VALUES ({id}, 'r{step}', '2009-01-01')"),
        };
        oracle.query_drop(&sql).unwrap();
        let expected = oracle.affected_rows();
        c.query_drop(&sql).unwrap();
        assert_eq!(c.affected_rows(), expected, "{sql}");
        let probe = format!(
            "SELECT id, nickname FROM users WHERE id IN ({id}, {})",
            next(60)
        );
        let mut want: Vec<(u32, String)> = oracle.query(&probe).unwrap();
        let mut got: Vec<(u32, String)> = c.query(&probe).unwrap();
        want.sort();
        got.sort();
        assert_eq!(got, want, "{probe}");
    }
    let mut want: Vec<(u32, String)> = oracle.query("SELECT id, nickname FROM users").unwrap();
    let mut got: Vec<(u32, String)> = c.query("SELECT id, nickname FROM users").unwrap();
    want.sort();
    got.sort();
    assert_eq!(got, want);
}

/// Random writes inside random transactions — BEGIN, COMMIT, ROLLBACK,
/// savepoints, COMMIT AND CHAIN, autocommit off and on — through hscale over
/// two backends and on one plain table: the same answers, the same errors,
/// the same rows seen inside the transaction and by another client.
#[test]
fn random_transactions_answer_like_one_plain_table() {
    random_transactions("part_tx_oracle", false, Transactions::Multi);
}

/// The same in `transactions = "atomic"`: a transaction's first backend is
/// a plain part, the others XA branches, and its writes over both commit in
/// two phases.
#[test]
fn random_atomic_transactions_answer_like_one_plain_table() {
    random_transactions("part_tx_oracle_xa", false, Transactions::Atomic);
}

#[test]
fn random_prepared_atomic_transactions_answer_like_one_plain_table() {
    random_transactions("part_tx_oracle_xa_ps", true, Transactions::Atomic);
}

/// The same with every statement prepared (COM_STMT_PREPARE and EXECUTE).
#[test]
fn random_prepared_transactions_answer_like_one_plain_table() {
    random_transactions("part_tx_oracle_ps", true, Transactions::Multi);
}

/// Clients that move to another worker at every statement where they may
/// (`move_clients = "always"`, two workers) keep their transactions,
/// savepoints, autocommit and prepared statements: the same answers.
#[test]
fn random_transactions_of_clients_moving_between_workers_answer_like_one_plain_table() {
    let moved = random_transactions_with(
        "part_tx_oracle_moving",
        true,
        Transactions::Atomic,
        MoveClients::Always,
    );
    assert!(moved > 100, "clients moved {moved} times");
}

fn random_transactions(name: &str, prepared: bool, mode: Transactions) {
    random_transactions_with(name, prepared, mode, MoveClients::default());
}

/// Runs the generated transactions; how often clients moved between workers.
fn random_transactions_with(
    name: &str,
    prepared: bool,
    mode: Transactions,
    moves: MoveClients,
) -> u64 {
    let db = cluster().database(name);
    cluster().direct(1, Some(&db)).query_drop(USERS).unwrap();
    let mut config = cluster().config();
    config.proxy.transactions = mode;
    if moves == MoveClients::Always {
        config.proxy.move_clients = moves;
        config.proxy.threads = 2;
    }
    let proxy = Proxy::start(config);
    let oracle_db = cluster().database(&format!("{name}_plain"));
    let mut oracle = cluster().direct(1, Some(&oracle_db));
    oracle.query_drop(USERS).unwrap();
    let mut oracle_other = cluster().direct(1, Some(&oracle_db));
    let mut c = proxy.connect(Some(&db));
    let mut other = proxy.connect(Some(&db));
    c.query_drop("HSCALE SETUP_TABLE('users', 'id', 'users_default', 1, 'MOD(3)')")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('users', 'p1', 1, 2)")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('users', 'p2', 2, 1)")
        .unwrap();
    let seed = std::env::var("HSCALE_TX_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7u64);
    eprintln!("HSCALE_TX_SEED={seed}");
    let mut state = seed;
    let mut next = |n: u64| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) % n
    };
    let outcome = |conn: &mut Conn, sql: &str| match match prepared {
        true => conn.exec_drop(sql, ()),
        false => conn.query_drop(sql),
    } {
        Ok(()) => Ok(conn.affected_rows()),
        Err(mysql::Error::MySqlError(e)) => Err(e.code),
        Err(e) => panic!("{sql}: {e}"),
    };
    let rows = |conn: &mut Conn| {
        let mut rows: Vec<(u32, String)> = conn.query("SELECT id, nickname FROM users").unwrap();
        rows.sort();
        rows
    };
    for step in 0..400 {
        let id = next(30);
        let sql = match next(20) {
            0 => "BEGIN".to_string(),
            1 => "START TRANSACTION".to_string(),
            2 => "COMMIT".to_string(),
            3 => "ROLLBACK".to_string(),
            4 => format!("SAVEPOINT s{}", next(3)),
            5 => format!("ROLLBACK TO SAVEPOINT s{}", next(3)),
            6 => format!("RELEASE SAVEPOINT s{}", next(3)),
            7 => "COMMIT AND CHAIN".to_string(),
            8 => format!("SET autocommit = {}", next(2)),
            9..=11 => format!("INSERT IGNORE INTO users VALUES ({id}, 'n{step}', '2008-05-06')"),
            12 | 13 => format!("UPDATE users SET nickname = 'u{step}' WHERE id = {id}"),
            14 => format!("DELETE FROM users WHERE id IN ({id}, {})", next(30)),
            15 => format!("REPLACE INTO users VALUES ({id}, 'r{step}', '2009-01-01')"),
            _ => format!(
                "SELECT id, nickname FROM users WHERE id IN ({id}, {})",
                next(30)
            ),
        };
        eprintln!("step {step}: {sql}");
        let expected = outcome(&mut oracle, &sql);
        assert_eq!(outcome(&mut c, &sql), expected, "step {step}: {sql}");
        if step % 5 == 0 {
            assert_eq!(
                rows(&mut c),
                rows(&mut oracle),
                "step {step}: inside, after {sql}"
            );
            assert_eq!(
                rows(&mut other),
                rows(&mut oracle_other),
                "step {step}: committed, after {sql}"
            );
        }
    }
    c.query_drop("COMMIT").unwrap();
    oracle.query_drop("COMMIT").unwrap();
    assert_eq!(rows(&mut other), rows(&mut oracle_other));
    proxy.shared.balance.moved.load(Ordering::Relaxed)
}

#[test]
fn show_tables_and_desc_answer_for_the_logical_table() {
    let (proxy, db) = setup("part_schema");
    let mut direct = cluster().direct(1, Some(&db));
    direct.query_drop("CREATE TABLE notes (id INT)").unwrap();
    let describe_before: Vec<mysql::Row> = direct.query("DESC users").unwrap();
    let mut c = proxy.connect(Some(&db));
    c.query_drop("HSCALE SETUP_TABLE('users', 'nickname', 'users_default', 1, 'PREFIX(3)')")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('users', 'nick2', 'pet', 1)")
        .unwrap();
    let tables: Vec<String> = c.query("SHOW TABLES").unwrap();
    assert_eq!(tables, ["notes", "users"]);
    let full: Vec<(String, String)> = c
        .query(format!("SHOW FULL TABLES FROM `{db}` LIKE 'us%'"))
        .unwrap();
    assert_eq!(full, [("users".to_string(), "BASE TABLE".to_string())]);
    let describe: Vec<mysql::Row> = c.query("DESC users").unwrap();
    assert_eq!(format!("{describe:?}"), format!("{describe_before:?}"));
}

/// COM_FIELD_LIST's answers, raw, in both EOF modes: what the mariadb CLI's
/// completion and `mysql_list_fields` read.
fn field_lists(port: u16, db: &str, commands: &[&[u8]]) -> Vec<Vec<u8>> {
    use hscale_testkit::raw::RawClient;
    use hscale_wire::scan::Expect;
    use hscale_wire::CapabilityFlags;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut answers = Vec::new();
        for extra in [
            CapabilityFlags::empty(),
            CapabilityFlags::CLIENT_DEPRECATE_EOF,
        ] {
            let deprecate_eof = !extra.is_empty();
            let mut client = RawClient::login_with(port, "root", "", Some(db), extra).await;
            for command in commands {
                let answer = client
                    .command_bytes(command, Expect::FieldList, deprecate_eof)
                    .await;
                answers.push(answer);
            }
        }
        answers
    })
}

#[test]
fn field_list_of_a_partitioned_table_lists_the_columns_of_the_plain_table() {
    let (proxy, db) = setup("part_field_list");
    cluster()
        .direct(1, Some(&db))
        .query_drop("CREATE TABLE notes (id INT, body TEXT)")
        .unwrap();
    let commands: [&[u8]; 4] = [
        b"\x04users\0",
        b"\x04users\0nick%",
        b"\x04notes\0",
        b"\x04nosuch\0",
    ];
    // The oracle: the plain table, before hscale splits it.
    let plain = field_lists(cluster().port(1), &db, &commands);
    assert!(plain[0].len() > 150, "{} bytes", plain[0].len());
    assert!(plain[1].len() < plain[0].len());
    split_by_parity(&mut proxy.connect(Some(&db)));
    assert_eq!(field_lists(proxy.port, &db, &commands), plain);
}

#[test]
fn insert_select_runs_where_both_sides_live() {
    let (proxy, db) = setup("part_insert_select");
    let mut c = proxy.connect(Some(&db));
    split_by_parity(&mut c);
    for id in 1..=6 {
        c.query_drop(format!(
            "INSERT INTO users VALUES ({id}, 'n{id}', '2020-01-01')"
        ))
        .unwrap();
    }
    c.query_drop("CREATE TABLE archive (id INT UNSIGNED PRIMARY KEY, nickname VARCHAR(64))")
        .unwrap();
    c.query_drop("INSERT INTO archive SELECT id, nickname FROM users WHERE id IN (2, 4, 6)")
        .unwrap();
    assert_eq!(c.affected_rows(), 3);
    let archived: Vec<(u32, String)> = c
        .query("SELECT id, nickname FROM archive ORDER BY id")
        .unwrap();
    assert_eq!(
        archived,
        [(2, "n2".into()), (4, "n4".into()), (6, "n6".into())]
    );
    // The odd partition lives on backend 2, the archive on backend 1.
    assert_eq!(
        error_of(
            &mut c,
            "INSERT INTO archive SELECT id, nickname FROM users WHERE id = 3"
        )
        .0,
        1235
    );
    c.query_drop("INSERT INTO users (id, nickname, created) SELECT 8, nickname, '2021-01-01' FROM archive WHERE id = 2")
        .unwrap();
    assert_eq!(
        physical(1, &db, "users_default").last(),
        Some(&(8, "n2".into()))
    );
}

/// The mariadb CLI in character set `charset`: it says so in its handshake and
/// sends the bytes of `sql` as they are, one statement at a time. Its exit
/// status and what it printed (errors included).
fn cli_in(charset: &str, port: u16, db: &str, sql: &[u8]) -> (bool, String) {
    use std::io::Write;
    let mut child = std::process::Command::new("mariadb")
        .args(["-h127.0.0.1", &format!("-P{port}"), "-uroot", "--batch"])
        .arg(format!("--default-character-set={charset}"))
        .arg(db)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("mariadb CLI");
    child.stdin.take().unwrap().write_all(sql).unwrap();
    let output = child.wait_with_output().unwrap();
    let printed = [output.stdout, output.stderr].concat();
    (
        output.status.success(),
        String::from_utf8_lossy(&printed).into_owned(),
    )
}

/// A latin1 'é' read as UTF-8 became U+FFFD in the rewritten INSERT, and
/// UTF-8 bytes in a latin1 session are other characters to the server than
/// to hscale: both are refused, and nothing is stored. What reads the same
/// (ASCII, UTF-8 in a UTF-8 session) is routed as before.
#[test]
fn text_hscale_cannot_read_as_the_server_does_is_refused_and_nothing_is_stored() {
    let (proxy, db) = setup("part_charset");
    let mut c = proxy.connect(Some(&db));
    c.query_drop("HSCALE SETUP_TABLE('users', 'nickname', 'users_default', 1, 'PREFIX(3)')")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('users', 'nick1', 'mar', 2)")
        .unwrap();
    let port = proxy.port;
    for (charset, sql) in [
        (
            "latin1",
            &b"INSERT INTO users VALUES (1, 'mar\xe9', '2020-01-01')"[..],
        ),
        (
            "latin1",
            "INSERT INTO users VALUES (2, 'maré', '2020-01-01')".as_bytes(),
        ),
        (
            "utf8mb4",
            "SET NAMES latin1; INSERT INTO users VALUES (3, 'maré', '2020-01-01')".as_bytes(),
        ),
    ] {
        let (ok, printed) = cli_in(charset, port, &db, sql);
        assert!(
            !ok && printed.contains("1235") && printed.contains("not UTF-8"),
            "{printed}"
        );
    }
    let (ok, printed) = cli_in(
        "latin1",
        port,
        &db,
        "INSERT INTO users VALUES (4, 'martin', '2020-01-01'); SET NAMES utf8mb4; \
         INSERT INTO users VALUES (5, 'maré', '2020-01-01')"
            .as_bytes(),
    );
    assert!(ok, "{printed}");
    // A prepared statement's value is read as the session's text is.
    let mut latin1 = mysql::Conn::new(
        hscale_testkit::opts(port, "root", "", Some(&db)).init(vec!["SET NAMES latin1"]),
    )
    .unwrap();
    match latin1.exec_drop("INSERT INTO users VALUES (?, ?, '2020-01-01')", (6, "maré")) {
        Err(mysql::Error::MySqlError(e)) => assert_eq!(e.code, 1235, "{}", e.message),
        other => panic!("expected a refusal, got {other:?}"),
    }
    // So is a database name hscale replays on every connection it takes.
    match latin1.select_db("caf\u{e9}") {
        Err(mysql::Error::MySqlError(e)) => assert_eq!(e.code, 1235, "{}", e.message),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(
        physical(2, &db, "users_nick1"),
        [(4, "martin".to_string()), (5, "maré".to_string())]
    );
    assert!(physical(1, &db, "users_default").is_empty());
}

/// Users 1 'martin' (partition nick1, backend 2) and 2 'peter' (the default
/// partition, backend 1).
fn martin_on_backend_2(c: &mut mysql::Conn) {
    c.query_drop(
        "INSERT INTO users VALUES (1, 'martin', '2008-05-06'), (2, 'peter', '2009-01-02')",
    )
    .unwrap();
    c.query_drop("HSCALE SETUP_TABLE('users', 'nickname', 'users_default', 1, 'PREFIX(3)')")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('users', 'nick1', 'mar', 2)")
        .unwrap();
}

/// sql_mode ANSI_QUOTES, set by an expression and put back from a user
/// variable: hscale asks the server what the mode is after each, and reads
/// `"..."` as the server does.
#[test]
fn ansi_quotes_follow_the_sessions_sql_mode() {
    let (proxy, db) = setup("part_ansi");
    let mut c = proxy.connect(Some(&db));
    martin_on_backend_2(&mut c);
    let by_string = r#"SELECT id FROM users WHERE nickname = "martin""#;
    assert_eq!(c.query::<u32, _>(by_string).unwrap(), [1]);
    c.query_drop("SET @saved = @@sql_mode").unwrap();
    c.query_drop("SET sql_mode = CONCAT(@@sql_mode, ',ANSI')")
        .unwrap();
    let quoted = r#"SELECT "id" FROM "users" WHERE "nickname" = 'martin'"#;
    assert_eq!(c.query::<u32, _>(quoted).unwrap(), [1]);
    c.query_drop(
        r#"INSERT INTO "users" ("id", "nickname", "created") VALUES (3, 'marvin', '2010-01-01')"#,
    )
    .unwrap();
    assert_eq!(physical(2, &db, "users_nick1").len(), 2);
    // nickname = the column martin, which does not exist: the server's error.
    let (code, _) = error_of(&mut c, by_string);
    assert_eq!(code, 1054);
    // Carried to backend 2 by value: the text would read its unset @saved.
    c.query_drop("SET sql_mode = @saved").unwrap();
    assert_eq!(c.query::<u32, _>(by_string).unwrap(), [1]);
}

/// A stored procedure's SETs run where hscale cannot see them: the session
/// variables that differ after the CALL reach every backend.
#[test]
fn session_variables_a_procedure_sets_reach_every_backend() {
    let (proxy, db) = setup("part_call");
    let mut c = proxy.connect(Some(&db));
    martin_on_backend_2(&mut c);
    c.query_drop(
        "CREATE PROCEDURE tune() BEGIN \
           SET SESSION time_zone = '+05:00'; \
           SET SESSION div_precision_increment = 9; \
           SET @tuned = 1; \
         END",
    )
    .unwrap();
    type Seen = (String, u32, String);
    let on = |c: &mut mysql::Conn, nickname: &str| -> Seen {
        c.query_first(format!(
            "SELECT @@session.time_zone, @@session.div_precision_increment, id / 4 \
             FROM users WHERE nickname = '{nickname}'"
        ))
        .unwrap()
        .unwrap()
    };
    // A statement on backend 2 first, so that the session has a connection
    // there from before the CALL.
    assert_eq!(on(&mut c, "martin"), ("SYSTEM".into(), 4, "0.2500".into()));
    c.query_drop("CALL tune()").unwrap();
    let tuned = |id: u32| {
        (
            "+05:00".to_string(),
            9,
            format!("{:.9}", f64::from(id) / 4.0),
        )
    };
    assert_eq!(on(&mut c, "martin"), tuned(1), "backend 2");
    assert_eq!(
        on(&mut c, "peter"),
        tuned(2),
        "backend 1, which ran the CALL"
    );
    let main: (String, u32) = c
        .query_first("SELECT @@session.time_zone, @@session.div_precision_increment")
        .unwrap()
        .unwrap();
    assert_eq!(main, ("+05:00".into(), 9));

    // CALLs in a row are compared once, before the next other statement.
    c.query_drop("CREATE PROCEDURE untune() SET SESSION time_zone = 'SYSTEM'")
        .unwrap();
    c.query_drop("CREATE PROCEDURE names() SET SESSION lc_time_names = 'de_DE'")
        .unwrap();
    c.query_drop("CALL untune()").unwrap();
    c.query_drop("CALL names()").unwrap();
    let month = "SELECT @@session.time_zone, MONTHNAME(created) FROM users WHERE nickname = ";
    let seen: (String, String) = c.query_first(format!("{month}'martin'")).unwrap().unwrap();
    assert_eq!(seen, ("SYSTEM".into(), "Mai".into()));
    c.query_drop("CALL tune()").unwrap();
    c.query_drop("CALL untune()").unwrap();
    let seen: (String, String) = c.query_first(format!("{month}'martin'")).unwrap().unwrap();
    assert_eq!(seen, ("SYSTEM".into(), "Mai".into()));

    // The listing after a CALL stands for the settings the next CALL starts
    // from while no SET changes them: one listing per CALL, not two. The
    // main backend's connection is the session's since the first CALL, so
    // its own count of SELECTs counts hscale's listings.
    let selects = |c: &mut mysql::Conn| -> u64 {
        let (_, count): (String, u64) = c
            .query_first("SHOW SESSION STATUS LIKE 'Com_select'")
            .unwrap()
            .unwrap();
        count
    };
    c.query_drop("CALL untune()").unwrap();
    let before = selects(&mut c);
    c.query_drop("CALL untune()").unwrap();
    assert_eq!(selects(&mut c) - before, 1, "listings for one CALL");
    // A SET after the listing: the next CALL lists the settings first, or
    // it would take the listed value it sets back for no change at all.
    c.query_drop("SET time_zone = '+01:00'").unwrap();
    c.query_drop("CALL untune()").unwrap();
    let seen: (String, String) = c.query_first(format!("{month}'martin'")).unwrap().unwrap();
    assert_eq!(seen, ("SYSTEM".into(), "Mai".into()));
}

#[test]
fn show_warnings_reads_the_previous_statement_wherever_it_ran() {
    let (proxy, db) = setup("part_diagnostics");
    let oracle_db = cluster().database("part_diagnostics_oracle");
    let mut oracle = cluster().direct(1, Some(&oracle_db));
    oracle.query_drop(USERS).unwrap();
    let mut c = proxy.connect(Some(&db));
    split_by_parity(&mut c);
    for conn in [&mut c, &mut oracle] {
        for id in [1, 2] {
            conn.exec_drop("INSERT INTO users VALUES (?, 'n', '2000-01-01')", (id,))
                .unwrap();
        }
    }
    type Messages = Vec<(String, u32, String)>;
    let mut both = |sql: &str, expect_error: bool| -> (Messages, Messages) {
        for conn in [&mut c, &mut oracle] {
            assert_eq!(conn.query_drop(sql).is_err(), expect_error, "{sql}");
        }
        let ours: Messages = c.query("SHOW WARNINGS").unwrap();
        let theirs: Messages = oracle.query("SHOW WARNINGS").unwrap();
        let counts = "SELECT @@warning_count, @@error_count";
        assert_eq!(
            c.query_first::<(u32, u32), _>(counts).unwrap(),
            oracle.query_first::<(u32, u32), _>(counts).unwrap(),
            "after {sql}"
        );
        (ours, theirs)
    };
    let steps = [
        // Backend 1 warns, then a statement on backend 2 replaces its messages.
        (
            "SELECT CAST('1x' AS SIGNED) + id FROM users WHERE id = 2",
            false,
            1,
        ),
        ("SELECT nickname FROM users WHERE id = 1", false, 0),
        (
            "SELECT CAST('2y' AS SIGNED) + id FROM users WHERE id = 1",
            false,
            1,
        ),
        ("SELECT nickname FROM users WHERE id = 2", false, 0),
        ("SELECT nope FROM users WHERE id = 1", true, 1),
        ("BEGIN", false, 1),
        (
            "SELECT CAST('3z' AS SIGNED) + id FROM users WHERE id = 2",
            false,
            1,
        ),
        ("SELECT nickname FROM users WHERE id = 1", false, 0),
        ("COMMIT", false, 0),
        ("SELECT COUNT(*) FROM users", false, 0),
    ];
    for (sql, expect_error, messages) in steps {
        let (ours, theirs) = both(sql, expect_error);
        assert_eq!(ours, theirs, "after {sql}");
        assert_eq!(ours.len(), messages, "after {sql}: {ours:?}");
    }
    // Read twice, the messages stay.
    c.query_drop("SELECT CAST('4w' AS SIGNED) + id FROM users WHERE id = 1")
        .unwrap();
    for _ in 0..2 {
        let again: Messages = c.query("SHOW WARNINGS").unwrap();
        assert_eq!(again.len(), 1, "{again:?}");
        let count: Option<u32> = c.query_first("SHOW COUNT(*) WARNINGS").unwrap();
        assert_eq!(count, Some(1));
    }
    // After a statement over both backends, hscale counts the messages it
    // read from each (below).
    c.query_drop("SELECT CAST(nickname AS SIGNED) FROM users")
        .unwrap();
    assert_eq!(c.warnings(), 2);
    for sql in ["SHOW COUNT(*) WARNINGS", "SELECT @@warning_count"] {
        assert_eq!(c.query_first::<u32, _>(sql).unwrap(), Some(2), "{sql}");
    }
    assert_eq!(
        c.query_first::<u32, _>("SELECT @@error_count").unwrap(),
        Some(0)
    );
    // Nor ROW_COUNT(), even where a transaction holds a connection.
    c.query_drop("BEGIN").unwrap();
    c.query_drop("UPDATE users SET nickname = 'q' WHERE id = 2")
        .unwrap();
    c.query_drop("SELECT * FROM users").unwrap();
    assert_eq!(error_of(&mut c, "SELECT ROW_COUNT()").0, 1235);
    c.query_drop("ROLLBACK").unwrap();
}

#[test]
fn show_warnings_after_a_statement_over_several_partitions_lists_every_part() {
    let (proxy, db) = setup_with("part_scattered_messages", Transactions::Multi);
    let oracle_db = cluster().database("part_scattered_messages_oracle");
    let mut oracle = cluster().direct(1, Some(&oracle_db));
    oracle.query_drop(USERS).unwrap();
    let mut c = proxy.connect(Some(&db));
    // Remainders 0 and 2 on backend 1, 1 on backend 2.
    c.query_drop("HSCALE SETUP_TABLE('users', 'id', 'users_default', 1, 'MOD(3)')")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('users', 'one', 1, 2)")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('users', 'two', 2, 1)")
        .unwrap();
    type Messages = Vec<(String, u32, String)>;
    let sorted = |mut messages: Messages| {
        messages.sort();
        messages
    };
    for conn in [&mut c, &mut oracle] {
        for id in 1..=6 {
            conn.exec_drop(
                "INSERT INTO users VALUES (?, ?, '2000-01-01')",
                (id, format!("{id}x")),
            )
            .unwrap();
        }
    }

    // A scan: each partition's warnings, read as it ended.
    let scan = "SELECT CAST(nickname AS SIGNED) FROM users";
    for conn in [&mut c, &mut oracle] {
        conn.query_drop(scan).unwrap();
    }
    // The counts too, named and typed as the server has them, and reading
    // them leaves the messages in place.
    let counts = |conn: &mut Conn| -> Vec<(String, Option<u64>)> {
        [
            "SELECT @@Warning_Count",
            "SELECT @@session.error_count",
            "SHOW COUNT(*) WARNINGS",
            "SHOW COUNT(*) ERRORS",
        ]
        .iter()
        .map(|sql| {
            let mut result = conn.query_iter(*sql).unwrap();
            let column = result.columns();
            let column = &column.as_ref()[0];
            let described = format!(
                "{} {:?} {:?}",
                column.name_str(),
                column.column_type(),
                column.flags()
            );
            let row = result.next().unwrap().unwrap();
            (described, row.get(0))
        })
        .collect()
    };
    assert_eq!(counts(&mut c), counts(&mut oracle));
    assert_eq!(counts(&mut c)[0].1, Some(6));
    let theirs: Messages = oracle.query("SHOW WARNINGS").unwrap();
    assert_eq!(theirs.len(), 6);
    for _ in 0..2 {
        let ours: Messages = c.query("SHOW WARNINGS").unwrap();
        assert_eq!(sorted(ours), sorted(theirs.clone()));
    }
    let limited: Messages = c.query("SHOW WARNINGS LIMIT 2").unwrap();
    assert_eq!(limited.len(), 2);
    let limited: Messages = c.query("SHOW WARNINGS LIMIT 4, 10").unwrap();
    assert_eq!(limited.len(), 2);
    let errors: Messages = c.query("SHOW ERRORS").unwrap();
    assert!(errors.is_empty(), "{errors:?}");
    // Capped at max_error_count, as the server caps its own list.
    for conn in [&mut c, &mut oracle] {
        conn.query_drop("SET max_error_count = 4").unwrap();
        conn.query_drop(scan).unwrap();
        assert_eq!(conn.warnings(), 6);
    }
    let capped: Messages = c.query("SHOW WARNINGS").unwrap();
    assert_eq!(capped.len(), 4, "{capped:?}");
    // The count goes on past the list.
    assert_eq!(counts(&mut c), counts(&mut oracle));
    for conn in [&mut c, &mut oracle] {
        conn.query_drop("SET max_error_count = DEFAULT").unwrap();
    }

    // A scan that fails on one partition: its error, as the server lists it.
    let failing = "SELECT id FROM users WHERE IF(id = 5, (SELECT 1 UNION SELECT 2), 0)";
    for conn in [&mut c, &mut oracle] {
        // The error comes after the column definitions: read as rows.
        let outcome = conn.query::<u32, _>(failing);
        assert!(outcome.is_err(), "{outcome:?}");
    }
    for read in ["SHOW WARNINGS", "SHOW ERRORS"] {
        let ours: Messages = c.query(read).unwrap();
        let theirs: Messages = oracle.query(read).unwrap();
        assert_eq!(ours, theirs, "{read}");
        assert_eq!(ours.len(), 1, "{read}: {ours:?}");
    }
    assert_eq!(counts(&mut c), counts(&mut oracle));
    assert_eq!(counts(&mut c)[1].1, Some(1));

    // A write over three partitions, two of them on one connection, where
    // the second part's statement replaces the first's messages.
    let insert = "INSERT IGNORE INTO users VALUES (7, 'a', '2000-02-30'), (8, 'b', '2000-13-01'), (9, 'c', '2001-02-29')";
    for conn in [&mut c, &mut oracle] {
        conn.query_drop(insert).unwrap();
        assert_eq!(conn.warnings(), 3);
    }
    // A message that names a row counts the rows of its partition's statement.
    let without_rows = |messages: Messages| {
        sorted(messages)
            .into_iter()
            .map(|(level, code, message)| {
                (
                    level,
                    code,
                    message.split(" at row").next().unwrap().to_string(),
                )
            })
            .collect::<Vec<_>>()
    };
    let ours: Messages = c.query("SHOW WARNINGS").unwrap();
    let theirs: Messages = oracle.query("SHOW WARNINGS").unwrap();
    assert_eq!(without_rows(ours), without_rows(theirs));

    // A schema change on every physical table: each one's notes.
    c.query_drop("ALTER TABLE users ADD INDEX (nickname), ADD INDEX (nickname)")
        .unwrap();
    let notes: Messages = c.query("SHOW WARNINGS").unwrap();
    assert_eq!(notes.len(), 3, "{notes:?}");
    assert!(notes.iter().all(|(_, code, _)| *code == 1831), "{notes:?}");

    // The next statement's messages replace them.
    c.query_drop("SELECT nickname FROM users WHERE id = 1")
        .unwrap();
    let none: Messages = c.query("SHOW WARNINGS").unwrap();
    assert!(none.is_empty(), "{none:?}");
}

/// The file `LOAD DATA LOCAL INFILE` asks for is `content`, whatever its name.
fn serve_file(conn: &mut Conn, content: Vec<u8>) {
    conn.set_local_infile_handler(Some(mysql::LocalInfileHandler::new(move |_, file| {
        std::io::Write::write_all(file, &content)
    })));
}

/// Runs `load` (with `{table}` for the table's name) through hscale into
/// `users` and directly into an oracle table on one server: the answers,
/// and then the rows, are the same.
fn load_both(proxied: &mut Conn, direct: &mut Conn, load: &str, content: &[u8]) {
    serve_file(proxied, content.to_vec());
    serve_file(direct, content.to_vec());
    proxied
        .query_drop(load.replace("{table}", "users"))
        .unwrap();
    direct
        .query_drop(load.replace("{table}", "oracle"))
        .unwrap();
    assert_eq!(
        (proxied.affected_rows(), proxied.info_str().into_owned()),
        (direct.affected_rows(), direct.info_str().into_owned()),
        "{load}"
    );
    let rows = "SELECT id, nickname, created FROM {table} ORDER BY id, nickname, created";
    let through: Vec<(u32, String, String)> =
        proxied.query(rows.replace("{table}", "users")).unwrap();
    let oracle: Vec<(u32, String, String)> =
        direct.query(rows.replace("{table}", "oracle")).unwrap();
    assert_eq!(through, oracle, "{load}");
}

/// `users` (created by `ddl`) partitioned by `function` of its nickname,
/// and `oracle`, the same table on backend 1, with a proxy whose loads hold
/// `memory_bytes` in memory; a direct connection to backend 1.
fn load_setup(name: &str, ddl: &str, memory_bytes: usize, function: &str) -> (Proxy, Conn, String) {
    let db = cluster().database(name);
    let mut config = cluster().config();
    config.scans.memory_bytes = memory_bytes;
    // A file's lines go to both backends (with "single", as a multi-row
    // INSERT there, refused).
    config.proxy.transactions = Transactions::Multi;
    let proxy = Proxy::start(config);
    let mut direct = cluster().direct(1, Some(&db));
    direct.query_drop(ddl).unwrap();
    direct.query_drop(ddl.replace("users", "oracle")).unwrap();
    proxy
        .connect(Some(&db))
        .query_drop(format!(
            "HSCALE SETUP_TABLE('users', 'nickname', 'users_default', 1, '{function}')"
        ))
        .unwrap();
    (proxy, direct, db)
}

#[test]
fn load_data_local_places_every_line_as_one_table_loads_it() {
    // The bulk file below spills to temporary files past 4 KiB.
    let (proxy, mut direct, db) = load_setup("load_data", USERS, 4096, "PREFIX(3)");
    let mut c = proxy.connect(Some(&db));
    c.query_drop("HSCALE ADD_PARTITION('users', 'mar', 'mar', 2)")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('users', 'pet', 'pet', 1)")
        .unwrap();

    // CSV: a header line, quoted fields holding the separators and line
    // ends, doubled quotes, escapes, the word NULL as a string, mixed case.
    let csv = "id,nickname,created\r\n\
               1,\"Mar,tin\",2024-01-02\r\n\
               2,\"pet \"\"the\"\" great\",2024-01-03\r\n\
               3,\"MARY\r\nANNE\",2024-01-04\r\n\
               4,zoe\\,x,2024-01-05\r\n\
               5,\"NULL\",2024-01-06\r\n\
               6,PETRA,2024-01-07";
    load_both(
        &mut c,
        &mut direct,
        "LOAD DATA LOCAL INFILE 'users.csv' INTO TABLE {table} FIELDS TERMINATED BY ',' \
         OPTIONALLY ENCLOSED BY '\"' LINES TERMINATED BY '\\r\\n' IGNORE 1 LINES",
        csv.as_bytes(),
    );
    // Tab-separated, the defaults, with escapes and a column list.
    let tsv = "2024-02-01\tmarco\\tpolo\t10\n2024-02-02\tm\\\nar\t11\n";
    load_both(
        &mut c,
        &mut direct,
        "LOAD DATA LOCAL INFILE 'u.tsv' INTO TABLE {table} (created, nickname, id)",
        tsv.as_bytes(),
    );
    // Duplicates: skipped (LOCAL), or replacing their rows (REPLACE).
    let again = "1\tmarta\t2025-01-01\n12\tpeter\t2025-01-01\n6\tpetra\t2025-01-01\n";
    let load = "LOAD DATA LOCAL INFILE 'again' INTO TABLE {table}";
    load_both(&mut c, &mut direct, load, again.as_bytes());
    let replace = "LOAD DATA LOCAL INFILE 'again' REPLACE INTO TABLE {table}";
    load_both(&mut c, &mut direct, replace, again.as_bytes());

    // Many lines, across the client's packets and past the memory budget.
    let mut bulk = String::new();
    for i in 100..20_100u32 {
        let name = ["mar", "pet", "zed", "Mark", "PETE", "ann"][i as usize % 6];
        bulk.push_str(&format!("{i}\t{name}{i}\t2023-03-{:02}\n", i % 28 + 1));
    }
    load_both(&mut c, &mut direct, load, bulk.as_bytes());

    // Each row lives where a routed statement looks for it.
    let misplaced = |backend: usize, table: &str, prefix: &str| -> u64 {
        let sql =
            format!("SELECT COUNT(*) FROM {table} WHERE LOWER(LEFT(nickname, 3)) <> '{prefix}'");
        cluster()
            .direct(backend, Some(&db))
            .query_first(sql)
            .unwrap()
            .unwrap()
    };
    assert_eq!(misplaced(2, "users_mar", "mar"), 0);
    assert_eq!(misplaced(1, "users_pet", "pet"), 0);
    let found: Option<u32> = c
        .query_first("SELECT id FROM users WHERE nickname = 'mark10005'")
        .unwrap();
    assert_eq!(found, Some(10005));

    // A line hscale cannot place refuses the whole file: nothing is written,
    // and the connection goes on.
    let count = "SELECT COUNT(*) FROM users";
    let before: Option<u64> = c.query_first(count).unwrap();
    serve_file(&mut c, b"30000\tmarkus\t2024-01-01\n30001\n".to_vec());
    let (code, message) = error_of(
        &mut c,
        "LOAD DATA LOCAL INFILE 'short' INTO TABLE users (id, nickname)",
    );
    assert_eq!(code, 1235, "{message}");
    assert!(message.contains("line 2 of the file"), "{message}");
    assert_eq!(c.query_first::<u64, _>(count).unwrap(), before);
    // A server's refusal on one partition rolls back the others' lines
    // (backend 1's partition loads first).
    cluster()
        .direct(2, Some(&db))
        .query_drop(
            "CREATE TRIGGER no_markus BEFORE INSERT ON users_mar FOR EACH ROW \
             IF NEW.nickname = 'markus' THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'no markus'; END IF",
        )
        .unwrap();
    serve_file(
        &mut c,
        b"30001\tpeter\t2024-01-01\n30000\tmarkus\t2024-01-01\n".to_vec(),
    );
    let (code, message) = error_of(&mut c, "LOAD DATA LOCAL INFILE 'bad' INTO TABLE users");
    assert_eq!((code, message.as_str()), (1644, "no markus"));
    assert_eq!(c.query_first::<u64, _>(count).unwrap(), before);
    // A server-side file cannot be placed.
    let (code, message) = error_of(&mut c, "LOAD DATA INFILE '/tmp/x' INTO TABLE users");
    assert_eq!(code, 1235, "{message}");
    assert!(message.contains("LOAD DATA LOCAL INFILE"), "{message}");
}

/// Random files whose quotes, escapes, separators and line ends fall where
/// a reader could go wrong: hscale places each line where the server reads
/// it, so the rows equal those one table loads from the same file.
#[test]
fn random_files_load_as_into_one_table() {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let seed = std::env::var("HSCALE_LOAD_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(seed);
    eprintln!("random_files_load_as_into_one_table: seed {seed} (HSCALE_LOAD_SEED replays it)");
    let mut state = seed | 1;
    let mut next = move |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    // No unique key: a misread line may give an id twice, which one table
    // would skip and two partitions could not see.
    let table = "CREATE TABLE users (id INT, nickname VARCHAR(64) NOT NULL, created DATE NOT NULL)";
    let (proxy, mut direct, db) = load_setup("load_random", table, 64 << 20, "PREFIX(1)");
    let mut c = proxy.connect(Some(&db));
    c.query_drop("HSCALE ADD_PARTITION('users', 'm', 'm', 2)")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('users', 'p', 'p', 1)")
        .unwrap();
    let pieces = [
        "m", "P", "a", "z", " ", "\\\\", "\\,", "\\\"", "\\n", "\\t", "\\N", "NULL", ",", "\"",
        "\n", "\r\n",
    ];
    for round in 0..6 {
        let csv = round % 2 == 0;
        let mut file = String::new();
        for line in 0..150 {
            let id = round * 1000 + line;
            // The nickname: quoted, it may hold anything (a quote doubled);
            // bare, no separator, quote or line end but escaped ones.
            let quoted = csv && next(2) == 0;
            let mut nickname = String::from(if quoted { "\"m" } else { "p" });
            for _ in 0..1 + next(5) {
                let piece = pieces[next(pieces.len())];
                match (quoted, piece) {
                    (true, "\"") => nickname.push_str("\"\""),
                    (true, piece) => nickname.push_str(piece),
                    (false, piece) if piece.contains(['"', ',', '\n', '\r']) => {}
                    (false, piece) => nickname.push_str(piece),
                }
            }
            if quoted {
                nickname.push('"');
            }
            let sep = if csv { "," } else { "\t" };
            file.push_str(&format!("{id}{sep}{nickname}{sep}2024-01-0{}", 1 + next(9)));
            // A field past the table's columns: the server skips to the
            // next line end, even one inside quotes.
            if next(4) == 0 {
                let more = 900_000 + round * 1000 + line;
                file.push_str(&format!("{sep}\"x\n{more}{sep}mq{}\"", next(10)));
            }
            file.push('\n');
        }
        let load = match csv {
            true => {
                "LOAD DATA LOCAL INFILE 'r' INTO TABLE {table} FIELDS TERMINATED BY ',' \
                 ENCLOSED BY '\"'"
            }
            false => "LOAD DATA LOCAL INFILE 'r' INTO TABLE {table}",
        };
        load_both(&mut c, &mut direct, load, file.as_bytes());
    }
    for (backend, table, prefix) in [(2, "users_m", "m"), (1, "users_p", "p")] {
        let sql =
            format!("SELECT COUNT(*) FROM {table} WHERE LOWER(LEFT(nickname, 1)) <> '{prefix}'");
        let misplaced: u64 = cluster()
            .direct(backend, Some(&db))
            .query_first(sql)
            .unwrap()
            .unwrap();
        assert_eq!(misplaced, 0, "{table}");
    }
}

/// What a client learns of a result's columns, as the mysql crate reads it.
type ColumnFacts = Vec<(String, String, String, String, String, String)>;

fn column_facts(columns: &[mysql::Column]) -> ColumnFacts {
    columns
        .iter()
        .map(|c| {
            (
                c.schema_str().into_owned(),
                c.table_str().into_owned(),
                c.org_table_str().into_owned(),
                c.name_str().into_owned(),
                c.org_name_str().into_owned(),
                format!(
                    "{:?} {:?} length {} charset {} decimals {}",
                    c.column_type(),
                    c.flags(),
                    c.column_length(),
                    c.character_set(),
                    c.decimals()
                ),
            )
        })
        .collect()
}

/// The columns of a query's answer, and of a prepared statement's: what
/// PREPARE says, and what its execution says.
fn metadata(conn: &mut Conn, sql: &str, params: Vec<mysql::Value>) -> [ColumnFacts; 3] {
    let text = {
        let result = conn.query_iter(sql.replace('?', "3")).unwrap();
        column_facts(result.columns().as_ref())
    };
    let statement = conn.prep(sql).unwrap();
    let prepared = column_facts(&statement.columns());
    let executed = {
        let result = conn.exec_iter(&statement, params).unwrap();
        column_facts(result.columns().as_ref())
    };
    conn.close(statement).unwrap();
    [text, prepared, executed]
}

/// The oracle: each statement's answer from the plain table holding
/// `rows`, before hscale splits it.
fn on_the_plain_table<T>(
    db: &str,
    rows: &str,
    statements: &[&str],
    answer: impl Fn(&mut Conn, &str) -> T,
) -> Vec<T> {
    let mut direct = cluster().direct(1, Some(db));
    direct
        .query_drop(format!("INSERT INTO users VALUES {rows}"))
        .unwrap();
    statements
        .iter()
        .map(|sql| answer(&mut direct, sql))
        .collect()
}

#[test]
fn answers_name_the_logical_table_as_one_plain_table_would() {
    let (proxy, db) = setup("part_column_tables");
    let statements = [
        "SELECT id, nickname FROM users WHERE id = ?",
        "SELECT u.id, u.nickname AS nick FROM users u WHERE id = ?",
        "SELECT * FROM users WHERE id = ? + 1",
        "SELECT id, nickname FROM users WHERE id > ? ORDER BY id",
        "SELECT id FROM users WHERE id > ? ORDER BY nickname LIMIT 2",
        "SELECT id, created FROM users WHERE id < ?",
    ];
    let rows =
        "(1,'a','2020-01-01'),(2,'b','2020-01-02'),(3,'c','2020-01-03'),(4,'d','2020-01-04')";
    let plain = on_the_plain_table(&db, rows, &statements, |conn, sql| {
        metadata(conn, sql, vec![3.into()])
    });
    let mut c = proxy.connect(Some(&db));
    split_by_parity(&mut c);
    for (sql, plain) in statements.iter().zip(&plain) {
        assert_eq!(&metadata(&mut c, sql, vec![3.into()]), plain, "{sql}");
    }
}

/// A query's column facts and its rows, as text.
fn columns_and_rows(conn: &mut Conn, sql: &str) -> (ColumnFacts, Vec<String>) {
    let mut result = conn
        .query_iter(sql)
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let columns = column_facts(result.columns().as_ref());
    let rows: Vec<String> = result
        .by_ref()
        .map(|row| format!("{:?}", row.unwrap().unwrap()))
        .collect();
    (columns, rows)
}

#[test]
fn ordered_scans_in_a_transaction_keep_the_tables_columns_where_partitions_share_a_backend() {
    let (proxy, db) = setup("part_united_columns");
    let statements = [
        "SELECT id, nickname FROM users ORDER BY nickname",
        "SELECT u.id, u.created AS day FROM users u WHERE id > 1 ORDER BY nickname DESC LIMIT 3",
        "SELECT created, COUNT(*) FROM users GROUP BY created ORDER BY created",
        "SELECT id, id + 1, 'x', nickname FROM users ORDER BY id DESC",
    ];
    let rows = "(1,'a','2020-01-01'),(2,'b','2020-01-02'),(3,'c','2020-01-01'),(4,'d','2020-01-04'),(5,'e','2020-01-02'),(6,'f','2020-01-06')";
    let plain = on_the_plain_table(&db, rows, &statements, columns_and_rows);
    let mut c = proxy.connect(Some(&db));
    // ids 0 and 2 mod 3 on backend 1, 1 mod 3 on backend 2.
    c.query_drop("HSCALE SETUP_TABLE('users', 'id', 'users_default', 1, 'MOD(3)')")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('users', 'p1', 1, 2)")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('users', 'p2', 2, 1)")
        .unwrap();
    c.query_drop("BEGIN").unwrap();
    for (sql, plain) in statements.iter().zip(&plain) {
        assert_eq!(&columns_and_rows(&mut c, sql), plain, "{sql}");
    }
    c.query_drop("COMMIT").unwrap();
}

/// Prepared, inside a transaction, each backend's partitions join into one
/// prepared `UNION ALL` that takes each partition's parameters in turn; the
/// client gets the binary rows and the table's columns of one table.
#[test]
fn prepared_ordered_scans_in_a_transaction_answer_as_one_table() {
    let (proxy, db) = setup("part_united_prepared");
    let statements = [
        "SELECT id, nickname, created FROM users WHERE id > ? ORDER BY nickname DESC",
        "SELECT u.id, u.created AS day FROM users u WHERE id > ? ORDER BY created, id LIMIT 3",
        "SELECT DISTINCT created FROM users WHERE id > ? ORDER BY created",
    ];
    let rows = "(1,'a','2020-01-01'),(2,'b','2020-01-02'),(3,'c','2020-01-01'),(4,'d','2020-01-04'),(5,'e','2020-01-02'),(6,'f','2020-01-06'),(7,'g','2020-01-02'),(8,'h','2020-01-01')";
    let prepared = |conn: &mut Conn, sql: &str| -> Vec<(ColumnFacts, Vec<String>)> {
        [0, 3]
            .into_iter()
            .map(|after| {
                let mut result = conn
                    .exec_iter(sql, (after,))
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
                let columns = column_facts(result.columns().as_ref());
                let rows: Vec<String> = result
                    .by_ref()
                    .map(|row| format!("{:?}", row.unwrap().unwrap()))
                    .collect();
                (columns, rows)
            })
            .collect()
    };
    let plain = on_the_plain_table(&db, rows, &statements, prepared);
    let mut c = proxy.connect(Some(&db));
    split_in_two_per_backend(&mut c);
    // ADD_PARTITION moved the plain table's rows to the partitions.
    c.query_drop("BEGIN").unwrap();
    for (sql, plain) in statements.iter().zip(&plain) {
        assert_eq!(&prepared(&mut c, sql), plain, "{sql}");
    }
    c.query_drop("COMMIT").unwrap();
}

/// Where every backend holds several partitions, a union of them answers on
/// each, and a probe of one partition's statement gives the columns; a
/// repeated shape reuses what the probe found, with its own literals' names,
/// until the table changes. An expression's flags and decimals are the
/// union's (`id + 1` without BINARY, a string's 0 decimals, not 39): those
/// are compared without them.
#[test]
fn ordered_scans_in_a_transaction_keep_the_tables_columns_where_every_backend_unites_partitions() {
    let (proxy, db) = setup("part_united_probed");
    let statements = [
        "SELECT id, nickname FROM users WHERE id > 0 ORDER BY nickname",
        "SELECT id, nickname FROM users WHERE id > 2 ORDER BY nickname",
        "SELECT id, id + 1, 'x' FROM users ORDER BY id DESC LIMIT 5",
        "SELECT id, id + 1, 'yz' FROM users ORDER BY id DESC LIMIT 5",
        "SELECT created, COUNT(*) FROM users GROUP BY created ORDER BY created",
    ];
    let altered = "ALTER TABLE users MODIFY nickname VARCHAR(200) NOT NULL";
    let rows = "(1,'a','2020-01-01'),(2,'b','2020-01-02'),(3,'c','2020-01-01'),(4,'d','2020-01-04'),(5,'e','2020-01-02'),(6,'f','2020-01-06'),(7,'g','2020-01-02'),(8,'h','2020-01-01')";
    let both = |conn: &mut Conn| {
        let mut answers: Vec<_> = statements
            .iter()
            .map(|sql| columns_and_rows(conn, sql))
            .collect();
        conn.query_drop(altered).unwrap();
        answers.push(columns_and_rows(conn, statements[0]));
        answers
    };
    let plain = {
        let mut direct = cluster().direct(1, Some(&db));
        direct
            .query_drop(format!("INSERT INTO users VALUES {rows}"))
            .unwrap();
        let plain = both(&mut direct);
        direct.query_drop("DROP TABLE users").unwrap();
        direct.query_drop(USERS).unwrap();
        plain
    };
    let mut c = proxy.connect(Some(&db));
    split_in_two_per_backend(&mut c);
    // One backend per statement: transactions = "single".
    for row in rows.split("),(") {
        let row = row.trim_matches(|c| c == '(' || c == ')');
        c.query_drop(format!("INSERT INTO users VALUES ({row})"))
            .unwrap();
    }
    c.query_drop("BEGIN").unwrap();
    let mut through = Vec::new();
    for sql in &statements {
        through.push(columns_and_rows(&mut c, sql));
    }
    // One probe per shape, on the transaction's connection to backend 1. A
    // probe is kept per dictionary snapshot, and the other tests' admin
    // commands load new ones in every instance: a shape whose statements a
    // reload came between is probed twice, so fresh shapes are tried until
    // one runs between two reloads (a cache that keeps nothing probes each
    // statement, every time).
    let prepares = |c: &mut Conn| {
        let (_, count): (String, u64) = c
            .query_first("SHOW SESSION STATUS LIKE 'Com_stmt_prepare'")
            .unwrap()
            .unwrap();
        count
    };
    let mut probes_per_shape = Vec::new();
    for shape in 0..5 {
        let probes = {
            let before = prepares(&mut c);
            for id in [3, 4, 3] {
                let sql = format!(
                    "SELECT nickname, {shape} AS shape FROM users WHERE id < {id} ORDER BY nickname"
                );
                columns_and_rows(&mut c, &sql);
            }
            prepares(&mut c) - before
        };
        probes_per_shape.push(probes);
        if probes == 1 {
            break;
        }
    }
    assert_eq!(probes_per_shape.last(), Some(&1), "{probes_per_shape:?}");
    c.query_drop("COMMIT").unwrap();
    c.query_drop(altered).unwrap();
    c.query_drop("BEGIN").unwrap();
    through.push(columns_and_rows(&mut c, statements[0]));
    c.query_drop("COMMIT").unwrap();
    // The type, length and character set of an expression's column.
    let without_expression_flags = |(facts, rows): &(ColumnFacts, Vec<String>)| {
        let facts: ColumnFacts = facts
            .iter()
            .map(|(schema, table, org_table, name, org_name, kind)| {
                let kind = match table.is_empty() {
                    true => {
                        let (type_name, rest) = kind.split_once(' ').unwrap();
                        let sizes =
                            &rest[rest.find("length").unwrap()..rest.find(" decimals").unwrap()];
                        format!("{type_name} {sizes}")
                    }
                    false => kind.clone(),
                };
                let names = (schema.clone(), table.clone(), org_table.clone());
                (
                    names.0,
                    names.1,
                    names.2,
                    name.clone(),
                    org_name.clone(),
                    kind,
                )
            })
            .collect();
        (facts, rows.clone())
    };
    for ((sql, through), plain) in statements
        .iter()
        .chain([&statements[0]])
        .zip(&through)
        .zip(&plain)
    {
        assert_eq!(
            without_expression_flags(through),
            without_expression_flags(plain),
            "{sql}"
        );
        if !sql.contains('+') {
            assert_eq!(through, plain, "{sql}");
        }
    }
}

/// Each (table, column) partitioned by MOD(2) of its warehouse column:
/// even warehouses in the default table on backend 1, odd ones in `odd` on
/// backend 2 — co-located.
fn by_warehouse(c: &mut Conn, tables: &[(&str, &str)]) {
    for (table, column) in tables {
        c.query_drop(format!(
            "HSCALE SETUP_TABLE('{table}', '{column}', '{table}_default', 1, 'MOD(2)')"
        ))
        .unwrap();
        c.query_drop(format!("HSCALE ADD_PARTITION('{table}', 'odd', 1, 2)"))
            .unwrap();
    }
}

/// Runs a MOVE_PARTITION and waits for its job to be done.
fn moved(c: &mut Conn, sql: &str) {
    let job: u64 = c.query_first(sql).unwrap().expect("a job id");
    let mut dictionary = cluster().direct(1, Some("hscale"));
    let started = std::time::Instant::now();
    loop {
        let phase: String = dictionary
            .query_first(format!("SELECT phase FROM moves WHERE id = {job}"))
            .unwrap()
            .expect("the job's row");
        match phase.as_str() {
            "done" => return,
            "failed" | "cancelled" => panic!("{sql}: the move ended {phase}"),
            _ => {}
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "{sql}: still {phase}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

fn count(backend: usize, db: &str, sql: &str) -> u64 {
    cluster()
        .direct(backend, Some(db))
        .query_first(sql)
        .unwrap()
        .unwrap()
}

/// Tables with foreign keys, partitioned as an order-entry application's
/// are (by warehouse, MOD(2)): moving a parent's rows fires no cascade on
/// its children; a child's partition keeps a key that pairs the partition
/// columns, pointed at the parent's partition beside it, and follows its
/// parent's split; a key whose parent rows may be on another backend (a
/// plain parent elsewhere, a key on another column) is left out, never
/// refused with 1005 nor enforced against the wrong table.
#[test]
fn foreign_keys_follow_co_located_partitions_and_moves_fire_no_cascade() {
    let (proxy, db) = setup("partitioning_foreign_keys");
    let mut direct = cluster().direct(1, Some(&db));
    for sql in [
        "CREATE TABLE warehouse (w_id INT PRIMARY KEY, w_name VARCHAR(10))",
        "CREATE TABLE district (d_w_id INT NOT NULL, d_id INT NOT NULL, PRIMARY KEY (d_w_id, d_id), \
         CONSTRAINT fk_district_warehouse FOREIGN KEY (d_w_id) REFERENCES warehouse (w_id) ON DELETE CASCADE)",
        // Keyed by its own warehouse, naming another: that one's rows may
        // be on the other backend.
        "CREATE TABLE supply (s_w_id INT NOT NULL, s_from_w_id INT NOT NULL, PRIMARY KEY (s_w_id, s_from_w_id), \
         CONSTRAINT fk_supply_from FOREIGN KEY (s_from_w_id) REFERENCES warehouse (w_id))",
        "CREATE TABLE kinds (k_id INT PRIMARY KEY)",
        "CREATE TABLE history (h_id INT PRIMARY KEY, h_kind INT, \
         CONSTRAINT fk_history_kind FOREIGN KEY (h_kind) REFERENCES kinds (k_id))",
        "INSERT INTO warehouse VALUES (1, 'one'), (2, 'two')",
        "INSERT INTO district VALUES (1, 1), (1, 2), (2, 1), (2, 2)",
        "INSERT INTO supply VALUES (2, 2)",
        "INSERT INTO kinds VALUES (7)",
        "INSERT INTO history VALUES (1, 7), (2, 7)",
    ] {
        direct.query_drop(sql).unwrap();
    }
    let mut c = proxy.connect(Some(&db));
    // Every table partitioned before any partition is added: each split
    // finds its children partitioned alike.
    for sql in [
        "HSCALE SETUP_TABLE('warehouse', 'w_id', 'warehouse_default', 1, 'MOD(2)')",
        "HSCALE SETUP_TABLE('district', 'd_w_id', 'district_default', 1, 'MOD(2)')",
        "HSCALE SETUP_TABLE('supply', 's_w_id', 'supply_default', 1, 'MOD(2)')",
        "HSCALE SETUP_TABLE('history', 'h_id', 'history_default', 1, 'MOD(2)')",
    ] {
        c.query_drop(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    // Warehouse 1 leaves backend 1, its districts stay there, whole. A key
    // left out is the command's warning, which SHOW WARNINGS lists: the
    // supplies' key on warehouses goes with warehouse 1 (and their odd
    // partition has none to leave out).
    for (table, left_out) in [
        ("warehouse", Some("`supply_default` left out")),
        ("district", None),
        ("supply", None),
        ("history", Some("`history` left out of `history_odd`")),
    ] {
        let sql = format!("HSCALE ADD_PARTITION('{table}', 'odd', 1, 2)");
        c.query_drop(&sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
        let count = c.warnings();
        let warnings: Vec<(String, u32, String)> = c.query("SHOW WARNINGS").unwrap();
        assert_eq!(usize::from(count), warnings.len(), "{sql}");
        assert_eq!(
            warnings.len(),
            usize::from(left_out.is_some()),
            "{sql}: {warnings:?}"
        );
        for (level, code, message) in &warnings {
            assert_eq!((level.as_str(), *code), ("Warning", 1215), "{message}");
            assert!(message.contains(left_out.unwrap()), "{message}");
            assert!(message.contains("not enforced"), "{message}");
        }
    }
    assert_eq!(count(2, &db, "SELECT COUNT(*) FROM district_odd"), 2);
    assert_eq!(count(1, &db, "SELECT COUNT(*) FROM district_default"), 2);
    let definition = |backend: usize, table: &str| -> String {
        let row: (String, String) = cluster()
            .direct(backend, Some(&db))
            .query_first(format!("SHOW CREATE TABLE {table}"))
            .unwrap()
            .unwrap();
        row.1
    };
    let cascade = |parent: &str| {
        format!("FOREIGN KEY (`d_w_id`) REFERENCES `{parent}` (`w_id`) ON DELETE CASCADE")
    };
    assert!(definition(1, "district_default").contains(&cascade("warehouse_default")));
    let district = definition(2, "district_odd");
    assert!(district.contains(&cascade("warehouse_odd")), "{district}");
    // Moved away from warehouse 1's partition, it cannot keep the key.
    moved(&mut c, "HSCALE MOVE_PARTITION('district', 'odd', 1)");
    assert!(!definition(1, "district_odd").contains("FOREIGN KEY"));
    moved(&mut c, "HSCALE MOVE_PARTITION('warehouse', 'odd', 1)");
    assert!(definition(1, "district_default").contains(&cascade("warehouse_default")));
    for (backend, table) in [(1, "supply_default"), (2, "supply_odd")] {
        assert!(
            !definition(backend, table).contains("FOREIGN KEY"),
            "{table}"
        );
    }
    assert!(!definition(2, "history_odd").contains("FOREIGN KEY"));
    // Enforced as on one server where kept: warehouse 4 is nowhere.
    let sql = "INSERT INTO district VALUES (4, 1)";
    assert_eq!(error_of(&mut c, sql).0, 1452, "{sql}");
    c.query_drop("INSERT INTO district VALUES (1, 3)").unwrap();
    // Warehouse 2's supply from warehouse 1, which is on the other backend
    // (the key is on no backend).
    c.query_drop("INSERT INTO supply VALUES (2, 1)").unwrap();
    // A cascade inside the backend, as on one server.
    c.query_drop("DELETE FROM warehouse WHERE w_id = 2")
        .unwrap();
    assert_eq!(count(1, &db, "SELECT COUNT(*) FROM district_default"), 0);
    assert_eq!(count(1, &db, "SELECT COUNT(*) FROM district_odd"), 3);
    c.query_drop("INSERT INTO history VALUES (3, 7)").unwrap();
}

/// INSERT ... SELECT between co-located tables (order entry's new orders
/// from its orders): each partition's rows go to the same partition of the
/// target on their backend, pinned to one partition or fanned out; the
/// answers are the oracle's, and every row sits in its partition.
#[test]
fn insert_select_between_co_located_tables_stays_in_each_partition() {
    let (proxy, db) = setup_with("partitioning_insert_select", Transactions::Atomic);
    let oracle_db = cluster().database("partitioning_insert_select_oracle");
    let orders = "CREATE TABLE orders (o_w_id INT NOT NULL, o_id INT NOT NULL, o_d_id INT NOT NULL, PRIMARY KEY (o_w_id, o_id))";
    let new_orders = "CREATE TABLE new_orders (no_w_id INT NOT NULL, no_o_id INT NOT NULL, no_d_id INT NOT NULL, PRIMARY KEY (no_w_id, no_o_id))";
    let mut oracle = cluster().direct(1, Some(&oracle_db));
    let mut direct = cluster().direct(1, Some(&db));
    for conn in [&mut oracle, &mut direct] {
        conn.query_drop(orders).unwrap();
        conn.query_drop(new_orders).unwrap();
    }
    let mut c = proxy.connect(Some(&db));
    by_warehouse(&mut c, &[("orders", "o_w_id"), ("new_orders", "no_w_id")]);
    let rows: Vec<String> = (1..=4)
        .flat_map(|w| (1..=6).map(move |o| format!("({w}, {o}, {})", o % 3)))
        .collect();
    let insert = format!("INSERT INTO orders VALUES {}", rows.join(", "));
    c.query_drop(&insert).unwrap();
    oracle.query_drop(&insert).unwrap();
    for sql in [
        // Pinned to warehouse 2's partition.
        "INSERT INTO new_orders (no_o_id, no_d_id, no_w_id) SELECT o_id, o_d_id, o_w_id FROM orders WHERE o_id > 3 AND o_w_id = 2",
        // Every partition, each into its own.
        "INSERT INTO new_orders (no_w_id, no_o_id, no_d_id) SELECT o.o_w_id, o.o_id, o.o_d_id FROM orders AS o WHERE o.o_id <= 2",
        "INSERT INTO new_orders SELECT o_w_id, o_id + 100, o_d_id FROM orders WHERE o_d_id = 0 ON DUPLICATE KEY UPDATE no_d_id = VALUES(no_d_id)",
    ] {
        c.query_drop(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
        oracle.query_drop(sql).unwrap();
        assert_eq!(c.affected_rows(), oracle.affected_rows(), "{sql}");
    }
    let all = "SELECT no_w_id, no_o_id, no_d_id FROM new_orders ORDER BY no_w_id, no_o_id";
    let ours: Vec<(u32, u32, u32)> = c.query(all).unwrap();
    let theirs: Vec<(u32, u32, u32)> = oracle.query(all).unwrap();
    assert_eq!(ours, theirs);
    // On the backends: even warehouses in the default table, odd ones in
    // the odd partition.
    let even = count(
        1,
        &db,
        "SELECT COUNT(*) FROM new_orders_default WHERE no_w_id % 2 = 0",
    );
    let odd = count(
        2,
        &db,
        "SELECT COUNT(*) FROM new_orders_odd WHERE no_w_id % 2 = 1",
    );
    assert_eq!(even + odd, ours.len() as u64);
    assert_eq!(
        count(1, &db, "SELECT COUNT(*) FROM new_orders_default"),
        even
    );
    // Rows that could belong to another partition: refused, nothing written.
    for sql in [
        "INSERT INTO new_orders SELECT o_d_id, o_id + 200, o_d_id FROM orders",
        "INSERT INTO new_orders (no_o_id, no_d_id, no_w_id) SELECT o_id + 300, o_d_id, 2 FROM orders WHERE o_w_id = 2",
    ] {
        let (code, message) = error_of(&mut c, sql);
        assert_eq!(code, 1235, "{sql}: {message}");
    }
    assert_eq!(c.query::<(u32, u32, u32), _>(all).unwrap(), theirs);
}

/// Order entry's stock-level query: both tables' partition columns equal
/// literals of one partition (1 and 1, or 2 and 4 of MOD(2)), so both read
/// one partition on one backend; with literals of two partitions the join
/// is answered from copies. Prepared, with a parameter for each warehouse,
/// alike at each execution. Every answer is the oracle's.
#[test]
fn joins_pinned_to_one_partition_by_equal_literals_answer_as_one_server() {
    let (proxy, db) = setup_with("partitioning_equal_literals", Transactions::Atomic);
    let oracle_db = cluster().database("partitioning_equal_literals_oracle");
    let mut oracle = cluster().direct(1, Some(&oracle_db));
    let mut direct = cluster().direct(1, Some(&db));
    for conn in [&mut oracle, &mut direct] {
        conn.query_drop("CREATE TABLE order_line (ol_w_id INT NOT NULL, ol_o_id INT NOT NULL, ol_i_id INT NOT NULL, PRIMARY KEY (ol_w_id, ol_o_id))").unwrap();
        conn.query_drop("CREATE TABLE stock (s_w_id INT NOT NULL, s_i_id INT NOT NULL, s_quantity INT NOT NULL, PRIMARY KEY (s_w_id, s_i_id))").unwrap();
    }
    let mut c = proxy.connect(Some(&db));
    by_warehouse(&mut c, &[("order_line", "ol_w_id"), ("stock", "s_w_id")]);
    let lines: Vec<String> = (1..=4)
        .flat_map(|w| (1..=30).map(move |o| format!("({w}, {o}, {})", (o * 7 + w) % 20)))
        .collect();
    let stock: Vec<String> = (1..=4)
        .flat_map(|w| (0..20).map(move |i| format!("({w}, {i}, {})", (i * 3 + w * 5) % 30)))
        .collect();
    for insert in [
        format!("INSERT INTO order_line VALUES {}", lines.join(", ")),
        format!("INSERT INTO stock VALUES {}", stock.join(", ")),
    ] {
        c.query_drop(&insert).unwrap();
        oracle.query_drop(&insert).unwrap();
    }
    let copied = |c: &mut Conn| {
        let rows: Vec<(String, String)> = c.query("HSCALE STATUS").unwrap();
        rows.iter()
            .find(|(n, _)| n == "copied_statements")
            .unwrap()
            .1
            .parse::<u64>()
            .unwrap()
    };
    let stock_level = |w: &str, s: &str| {
        format!(
            "SELECT COUNT(DISTINCT s_i_id) FROM order_line, stock WHERE ol_w_id = {w} \
             AND ol_o_id < 25 AND ol_o_id >= 5 AND s_w_id = {s} AND s_i_id = ol_i_id AND s_quantity < 15"
        )
    };
    // Warehouses 0, 5 and 6 have no rows; even ones are the default's.
    let seed = hscale_testkit::seed("HSCALE_PINNED_SEED");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut warehouses = vec![(1, 1), (2, 2), (3, 3), (1, 2), (2, 4), (4, 3), (1, 1)];
    warehouses.extend((0..12).map(|_| (rng.random_range(0..=6), rng.random_range(0..=6))));
    // Only the statements over two partitions are answered from copies.
    let apart = warehouses.iter().filter(|(w, s)| w % 2 != s % 2).count() as u64;
    let copied_before = copied(&mut c);
    for (w, s) in &warehouses {
        let sql = stock_level(&w.to_string(), &s.to_string());
        let ours: Option<u64> = c.query_first(&sql).unwrap();
        let theirs: Option<u64> = oracle.query_first(&sql).unwrap();
        assert_eq!(ours, theirs, "seed {seed}: {sql}");
    }
    assert_eq!(copied(&mut c) - copied_before, apart, "seed {seed}");
    let prepared = c.prep(stock_level("?", "?")).unwrap();
    let copied_before = copied(&mut c);
    for (w, s) in &warehouses {
        let ours: Option<u64> = c.exec_first(&prepared, (w, s)).unwrap();
        let theirs: Option<u64> = oracle
            .query_first(stock_level(&w.to_string(), &s.to_string()))
            .unwrap();
        assert_eq!(ours, theirs, "seed {seed}: {w}, {s}");
    }
    assert_eq!(copied(&mut c) - copied_before, apart, "seed {seed}");
}

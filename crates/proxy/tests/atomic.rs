//! Writes over several backends in `transactions = "atomic"`, the default:
//! an autocommitted statement whose rows live on two servers commits on
//! both in two phases, or on neither; a write on one backend sends no XA
//! statement; and branches an instance left prepared are resolved by
//! recovery as the dictionary's decision says. Checked on the backends
//! directly: rows, `XA RECOVER`, the servers' Com_xa_* counters.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use hscale_testkit::{cluster, Proxy};
use mysql::prelude::Queryable;
use mysql::Conn;

/// The tests run one at a time: some count the servers' XA statements.
static COUNTING: Mutex<()> = Mutex::new(());

const ORDERS: &str =
    "CREATE TABLE orders (id INT UNSIGNED PRIMARY KEY, user_id INT UNSIGNED NOT NULL, total DECIMAL(10,2) NOT NULL)";

/// `orders` by MOD(2) of id: even ids on backend 1, odd ids on backend 2;
/// a proxy with the default configuration in front.
fn setup(db: &str) -> (Proxy, String, Conn) {
    let db = cluster().database(db);
    cluster().direct(1, Some(&db)).query_drop(ORDERS).unwrap();
    let proxy = Proxy::start(cluster().config());
    let mut c = proxy.connect(Some(&db));
    c.query_drop("HSCALE SETUP_TABLE('orders', 'id', 'orders_even', 1, 'MOD(2)')")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('orders', 'odd', 1, 2)")
        .unwrap();
    (proxy, db, c)
}

fn ids(backend: usize, db: &str, table: &str) -> Vec<u32> {
    cluster()
        .direct(backend, Some(db))
        .query(format!("SELECT id FROM {table} ORDER BY id"))
        .unwrap()
}

/// The XA statements a backend ran so far, by kind.
fn xa_counts(backend: usize) -> Vec<(String, u64)> {
    cluster()
        .direct(backend, None)
        .query("SHOW GLOBAL STATUS LIKE 'Com_xa_%'")
        .unwrap()
}

fn xa_count(counts: &[(String, u64)], name: &str) -> u64 {
    counts
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map_or(0, |(_, v)| *v)
}

fn prepared(backend: usize) -> Vec<String> {
    let rows: Vec<(u32, u32, u32, Vec<u8>)> =
        cluster().direct(backend, None).query("XA RECOVER").unwrap();
    rows.into_iter()
        .map(|(_, _, _, data)| String::from_utf8_lossy(&data).into_owned())
        .collect()
}

#[test]
fn a_write_over_two_backends_commits_on_both_in_two_phases() {
    let _alone = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let (_proxy, db, mut c) = setup("atomic_two");
    let before = [xa_counts(1), xa_counts(2)];
    c.query_drop(
        "INSERT INTO orders VALUES (1, 1, 1.00), (2, 2, 2.00), (3, 3, 3.00), (4, 4, 4.00)",
    )
    .unwrap();
    assert_eq!(c.affected_rows(), 4);
    assert_eq!(ids(1, &db, "orders_even"), [2, 4]);
    assert_eq!(ids(2, &db, "orders_odd"), [1, 3]);
    c.query_drop("UPDATE orders SET total = total + 1").unwrap();
    assert_eq!(c.affected_rows(), 4);
    c.query_drop("DELETE FROM orders WHERE user_id > 2")
        .unwrap();
    assert_eq!(c.affected_rows(), 2);
    let after = [xa_counts(1), xa_counts(2)];
    for backend in 0..2 {
        for (what, expected) in [
            ("Com_xa_start", 3),
            ("Com_xa_prepare", 3),
            ("Com_xa_commit", 3),
        ] {
            let ran = xa_count(&after[backend], what) - xa_count(&before[backend], what);
            assert_eq!(ran, expected, "{what} on backend {}", backend + 1);
        }
        assert!(prepared(backend + 1).is_empty(), "nothing left prepared");
    }
    let rows: Vec<(u32, String)> = c
        .query("SELECT id, CAST(total AS CHAR) FROM orders ORDER BY id")
        .unwrap();
    assert_eq!(rows, [(1, "2.00".into()), (2, "3.00".into())]);
}

#[test]
fn a_write_over_two_backends_that_fails_on_one_writes_nothing() {
    let _alone = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let (_proxy, db, mut c) = setup("atomic_fails");
    // Row 3 is there already: the INSERT fails on backend 2 after backend 1
    // took row 2.
    cluster()
        .direct(2, Some(&db))
        .query_drop("INSERT INTO orders_odd VALUES (3, 0, 0)")
        .unwrap();
    match c.query_drop("INSERT INTO orders VALUES (2, 2, 2.00), (3, 3, 3.00), (4, 4, 4.00)") {
        Err(mysql::Error::MySqlError(e)) => assert_eq!(e.code, 1062, "{}", e.message),
        other => panic!("expected a duplicate key, got {other:?}"),
    }
    assert!(
        ids(1, &db, "orders_even").is_empty(),
        "rolled back on backend 1"
    );
    assert_eq!(ids(2, &db, "orders_odd"), [3]);
    // The session goes on.
    c.query_drop("INSERT INTO orders VALUES (2, 2, 2.00), (5, 5, 5.00)")
        .unwrap();
    assert_eq!(ids(1, &db, "orders_even"), [2]);
    assert_eq!(ids(2, &db, "orders_odd"), [3, 5]);
}

#[test]
fn writes_on_one_backend_send_no_xa_statement() {
    let _alone = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let (_proxy, db, mut c) = setup("atomic_one");
    let before = [xa_counts(1), xa_counts(2)];
    c.query_drop("INSERT INTO orders VALUES (2, 2, 2.00)")
        .unwrap();
    // Several rows, one backend.
    c.query_drop("INSERT INTO orders VALUES (4, 4, 4.00), (6, 6, 6.00)")
        .unwrap();
    c.query_drop("BEGIN").unwrap();
    c.query_drop("INSERT INTO orders VALUES (1, 1, 1.00)")
        .unwrap();
    c.query_drop("UPDATE orders SET total = 9 WHERE id = 1")
        .unwrap();
    c.query_drop("COMMIT").unwrap();
    c.query_drop("UPDATE orders SET total = 0 WHERE id IN (2, 4)")
        .unwrap();
    let after = [xa_counts(1), xa_counts(2)];
    assert_eq!(before, after, "no XA statement");
    assert_eq!(ids(1, &db, "orders_even"), [2, 4, 6]);
    assert_eq!(ids(2, &db, "orders_odd"), [1]);
}

#[test]
fn recovery_resolves_branches_a_dead_instance_left_prepared() {
    let _alone = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let (_proxy, db, _c) = setup("atomic_recovery");
    let format = hscale_transaction::FORMAT_ID;
    let dead = "999999-deadbeef";
    // Transaction 1 was decided (commit), transaction 2 was not: its owner
    // died between PREPARE and the decision.
    cluster()
        .direct(1, Some("hscale"))
        .query_drop(format!(
            "INSERT INTO xa_decisions VALUES ('{dead}:1', 'commit', NOW(6))"
        ))
        .unwrap();
    for (sequence, even, odd) in [(1, 10, 11), (2, 20, 21)] {
        for (backend, table, id) in [(1, "orders_even", even), (2, "orders_odd", odd)] {
            let mut direct = cluster().direct(backend, Some(&db));
            let xid = format!("'{dead}:{sequence}','{backend}',{format}");
            direct.query_drop(format!("XA START {xid}")).unwrap();
            direct
                .query_drop(format!("INSERT INTO {table} VALUES ({id}, 0, 0)"))
                .unwrap();
            direct.query_drop(format!("XA END {xid}")).unwrap();
            direct.query_drop(format!("XA PREPARE {xid}")).unwrap();
            // The connection goes: the branch stays prepared.
        }
    }
    // A client's own XA branch is not hscale's: left alone.
    let mut own = cluster().direct(1, Some(&db));
    own.query_drop("XA START 'client-branch'").unwrap();
    own.query_drop("INSERT INTO orders_even VALUES (30, 0, 0)")
        .unwrap();
    own.query_drop("XA END 'client-branch'").unwrap();
    own.query_drop("XA PREPARE 'client-branch'").unwrap();
    drop(own);
    let deadline = Instant::now() + Duration::from_secs(20);
    let ours = |backend| {
        prepared(backend)
            .into_iter()
            .filter(|data| data.starts_with(dead))
            .count()
    };
    while ours(1) + ours(2) > 0 {
        assert!(Instant::now() < deadline, "recovery left branches prepared");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(ids(1, &db, "orders_even"), [10], "committed as decided");
    assert_eq!(
        ids(2, &db, "orders_odd"),
        [11],
        "and the undecided rolled back"
    );
    let decision: Option<String> = cluster()
        .direct(1, Some("hscale"))
        .query_first(format!(
            "SELECT decision FROM xa_decisions WHERE gtrid = '{dead}:2'"
        ))
        .unwrap();
    assert_eq!(
        decision.as_deref(),
        Some("abort"),
        "fenced before the rollback"
    );
    assert_eq!(prepared(1), ["client-branch"]);
    cluster()
        .direct(1, None)
        .query_drop("XA ROLLBACK 'client-branch'")
        .unwrap();
}

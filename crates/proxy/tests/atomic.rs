//! Writes over several backends in `transactions = "atomic"`, the default:
//! an autocommitted statement whose rows live on two servers commits on
//! both in two phases, or on neither; a write on one backend sends no XA
//! statement; and branches an instance left prepared are resolved by
//! recovery as the dictionary's decision says. Checked on the backends
//! directly: rows, `XA RECOVER`, the servers' Com_xa_* counters.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use hscale_testkit::{cluster, xa_prepared, Proxy};
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

/// The XA statements a backend ran so far, by kind (but XA RECOVER, which
/// every instance's recovery runs on its own).
fn xa_counts(backend: usize) -> Vec<(String, u64)> {
    cluster()
        .direct(backend, None)
        .query("SHOW GLOBAL STATUS WHERE Variable_name LIKE 'Com_xa_%' AND Variable_name <> 'Com_xa_recover'")
        .unwrap()
}

fn xa_count(counts: &[(String, u64)], name: &str) -> u64 {
    counts
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map_or(0, |(_, v)| *v)
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
    // Each statement's first backend runs its part in a plain transaction
    // whose commit carries the decision; the other's is an XA branch,
    // prepared before that commit and committed after it.
    let after = [xa_counts(1), xa_counts(2)];
    for what in ["Com_xa_start", "Com_xa_prepare", "Com_xa_commit"] {
        let ran: u64 = (0..2)
            .map(|backend| xa_count(&after[backend], what) - xa_count(&before[backend], what))
            .sum();
        assert_eq!(ran, 3, "{what}: one branch per statement");
    }
    for backend in 1..=2 {
        assert!(xa_prepared(backend).is_empty(), "nothing left prepared");
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
fn writes_on_one_backend_send_no_xa_statement_and_prepare_nothing() {
    let _alone = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let (_proxy, db, mut c) = setup("atomic_one");
    let before = [xa_counts(1), xa_counts(2)];
    c.query_drop("INSERT INTO orders VALUES (2, 2, 2.00)")
        .unwrap();
    // Several rows, one backend.
    c.query_drop("INSERT INTO orders VALUES (4, 4, 4.00), (6, 6, 6.00)")
        .unwrap();
    c.query_drop("UPDATE orders SET total = 0 WHERE id IN (2, 4)")
        .unwrap();
    assert_eq!(before, [xa_counts(1), xa_counts(2)], "no XA statement");
    // A transaction's first part is a plain one, which would carry the
    // commit decision were a second backend written later: on one backend
    // it is a plain transaction, with autocommit on or off.
    c.query_drop("BEGIN").unwrap();
    c.query_drop("INSERT INTO orders VALUES (1, 1, 1.00)")
        .unwrap();
    c.query_drop("UPDATE orders SET total = 9 WHERE id = 1")
        .unwrap();
    c.query_drop("COMMIT").unwrap();
    c.query_drop("SET autocommit = 0").unwrap();
    c.query_drop("UPDATE orders SET total = 8 WHERE id = 1")
        .unwrap();
    c.query_drop("COMMIT").unwrap();
    c.query_drop("SET autocommit = 1").unwrap();
    let after = [xa_counts(1), xa_counts(2)];
    assert_eq!(before, after, "no XA statement");
    assert_eq!(ids(1, &db, "orders_even"), [2, 4, 6]);
    assert_eq!(ids(2, &db, "orders_odd"), [1]);
}

/// Transactions the client begins, over two backends: written on both,
/// COMMIT prepares the XA branch, commits the first (plain) part with the
/// decision inside, and commits the branch; ROLLBACK and ROLLBACK TO
/// SAVEPOINT undo on both; AND CHAIN goes on.
#[test]
fn a_transaction_over_two_backends_commits_in_two_phases() {
    let _alone = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let (proxy, db, mut c) = setup("atomic_tx");
    let mut other = proxy.connect(Some(&db));
    let before = [xa_counts(1), xa_counts(2)];
    c.query_drop("BEGIN").unwrap();
    c.query_drop("INSERT INTO orders VALUES (1, 1, 1.00)")
        .unwrap();
    c.query_drop("INSERT INTO orders VALUES (2, 2, 2.00)")
        .unwrap();
    let seen: Vec<u32> = other.query("SELECT id FROM orders").unwrap();
    assert!(seen.is_empty(), "not before COMMIT");
    c.query_drop("COMMIT").unwrap();
    let after = [xa_counts(1), xa_counts(2)];
    let ran = |backend: usize, what: &str| {
        xa_count(&after[backend - 1], what) - xa_count(&before[backend - 1], what)
    };
    assert_eq!(
        (ran(1, "Com_xa_prepare"), ran(1, "Com_xa_commit")),
        (1, 1),
        "backend 1's part is an XA branch: prepared, committed"
    );
    assert_eq!(
        before[1], after[1],
        "backend 2's part, the first, is plain: its commit carries the decision"
    );
    assert_eq!(ids(1, &db, "orders_even"), [2]);
    assert_eq!(ids(2, &db, "orders_odd"), [1]);
    // ROLLBACK, and ROLLBACK TO a savepoint set before one backend wrote.
    c.query_drop("START TRANSACTION").unwrap();
    c.query_drop("INSERT INTO orders VALUES (3, 3, 3.00), (4, 4, 4.00)")
        .unwrap();
    c.query_drop("ROLLBACK").unwrap();
    c.query_drop("BEGIN").unwrap();
    c.query_drop("UPDATE orders SET total = 5 WHERE id = 1")
        .unwrap();
    c.query_drop("SAVEPOINT a").unwrap();
    c.query_drop("INSERT INTO orders VALUES (6, 6, 6.00), (7, 7, 7.00)")
        .unwrap();
    c.query_drop("ROLLBACK TO SAVEPOINT a").unwrap();
    c.query_drop("COMMIT AND CHAIN").unwrap();
    c.query_drop("INSERT INTO orders VALUES (8, 8, 8.00), (9, 9, 9.00)")
        .unwrap();
    c.query_drop("COMMIT").unwrap();
    let rows: Vec<(u32, String)> = other
        .query("SELECT id, CAST(total AS CHAR) FROM orders ORDER BY id")
        .unwrap();
    assert_eq!(
        rows,
        [
            (1, "5.00".into()),
            (2, "2.00".into()),
            (8, "8.00".into()),
            (9, "9.00".into())
        ]
    );
    // Autocommit off: each transaction's branches are XA branches too.
    c.query_drop("SET autocommit = 0").unwrap();
    c.query_drop("UPDATE orders SET total = total + 1 WHERE id IN (8, 9)")
        .unwrap();
    c.query_drop("COMMIT").unwrap();
    // No transaction begun yet: the next one's characteristics may be set.
    c.query_drop("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .unwrap();
    c.query_drop("UPDATE orders SET total = 0").unwrap();
    c.query_drop("ROLLBACK").unwrap();
    c.query_drop("SET autocommit = 1").unwrap();
    let totals: Vec<String> = other
        .query("SELECT CAST(total AS CHAR) FROM orders WHERE id IN (8, 9) ORDER BY id")
        .unwrap();
    assert_eq!(totals, ["9.00", "10.00"]);
    for backend in 1..=2 {
        assert!(xa_prepared(backend).is_empty(), "nothing left prepared");
    }
}

#[test]
fn recovery_resolves_branches_a_dead_instance_left_prepared() {
    let _alone = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let (_proxy, db, _c) = setup("atomic_recovery");
    let format = hscale_transaction::FORMAT_ID;
    let dead = "999999-deadbeef";
    // Transaction 1 was decided (commit, with hscale's proof), transaction
    // 2 was not: its owner died between PREPARE and the decision.
    let mut dictionary = cluster().direct(1, Some("hscale"));
    let key: Vec<u8> = dictionary
        .query_first("SELECT secret FROM xa_key WHERE id = 1")
        .unwrap()
        .unwrap();
    let proof = hscale::xa::DecisionKey::new(key.try_into().unwrap())
        .proof(&format!("{dead}:1"), hscale_transaction::Decision::Commit);
    dictionary
        .query_drop(format!(
            "INSERT INTO xa_decisions (gtrid, decision, decided, proof) VALUES ('{dead}:1', 'commit', NOW(6), '{proof}')"
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
        xa_prepared(backend)
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
    assert_eq!(xa_prepared(1), ["client-branch"]);
    cluster()
        .direct(1, None)
        .query_drop("XA ROLLBACK 'client-branch'")
        .unwrap();
}

/// A `hscale serve` process of the test's own, with `HSCALE_FAILPOINT` set.
struct Serve;

impl Serve {
    fn start(name: &str, failpoint: &str) -> hscale_testkit::Serve {
        Serve::start_with(name, failpoint, "", "hscale")
    }

    fn start_with(name: &str, failpoint: &str, more: &str, schema: &str) -> hscale_testkit::Serve {
        hscale_testkit::Serve::start(env!("CARGO_BIN_EXE_hscale"), name, failpoint, more, schema)
    }
}

/// Moves `amount` from account `from` to `to` in one autocommitted
/// statement: with `from` even and `to` odd, a write over both backends.
fn transfer_sql(from: u32, to: u32, amount: u32) -> String {
    format!(
        "UPDATE orders SET total = total + CASE id WHEN {from} THEN -{amount} WHEN {to} THEN {amount} END WHERE id IN ({from}, {to})"
    )
}

/// The same inside a transaction the client begins and commits, one
/// UPDATE per account: the COMMIT writes over both backends.
fn transfer_in_transaction(c: &mut Conn, from: u32, to: u32, amount: u32) -> mysql::Result<()> {
    let moved = (|| {
        c.query_drop("BEGIN")?;
        c.query_drop(format!(
            "UPDATE orders SET total = total - {amount} WHERE id = {from}"
        ))?;
        c.query_drop(format!(
            "UPDATE orders SET total = total + {amount} WHERE id = {to}"
        ))?;
        c.query_drop("COMMIT")
    })();
    if moved.is_err() {
        let _ = c.query_drop("ROLLBACK");
    }
    moved
}

fn balances(c: &mut Conn) -> Vec<(u32, i64)> {
    c.query("SELECT id, CAST(total AS SIGNED) FROM orders ORDER BY id")
        .unwrap()
}

/// Waits until no branch whose id begins with `prefix` is prepared on
/// either backend: recovery resolved them.
fn wait_for_recovery(prefix: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let left = || {
        (1..=2)
            .flat_map(xa_prepared)
            .filter(|data| data.starts_with(prefix))
            .count()
    };
    while left() > 0 {
        assert!(
            Instant::now() < deadline,
            "branches of {prefix} left prepared"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// XA statements of the client's own run on the main backend, where its
/// transaction stays: a write it would take to another backend is refused
/// (1235), and so is an XA statement while hscale's transaction is open on
/// another backend; with autocommit off hscale opens no branch under it.
#[test]
fn the_clients_own_xa_transaction_stays_on_one_backend() {
    let _alone = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let (_proxy, db, mut c) = setup("atomic_client_xa");
    for autocommit in [1, 0] {
        c.query_drop(format!("SET autocommit = {autocommit}"))
            .unwrap();
        c.query_drop("XA START 'client'").unwrap();
        c.query_drop(format!(
            "INSERT INTO orders VALUES ({}, 0, 0)",
            10 + 2 * autocommit
        ))
        .unwrap_or_else(|e| panic!("autocommit {autocommit}: {e}"));
        let refused = c.query_drop("INSERT INTO orders VALUES (13, 0, 0)");
        assert!(
            matches!(&refused, Err(mysql::Error::MySqlError(e)) if e.code == 1235),
            "{refused:?}"
        );
        c.query_drop("XA END 'client'").unwrap();
        c.query_drop("XA PREPARE 'client'").unwrap();
        c.query_drop("XA COMMIT 'client'").unwrap();
    }
    c.query_drop("SET autocommit = 1").unwrap();
    assert_eq!(ids(1, &db, "orders_even"), [10, 12]);
    c.query_drop("BEGIN").unwrap();
    c.query_drop("INSERT INTO orders VALUES (21, 0, 0)")
        .unwrap();
    let refused = c.query_drop("XA START 'late'");
    assert!(
        matches!(&refused, Err(mysql::Error::MySqlError(e)) if e.code == 1235),
        "{refused:?}"
    );
    c.query_drop("COMMIT").unwrap();
    assert_eq!(ids(2, &db, "orders_odd"), [21]);
}

/// What hscale cannot see into (a procedure's body, several statements in
/// one query) may commit by itself, which MariaDB refuses inside an XA
/// branch: it runs in a plain transaction, as MariaDB would run it, with
/// autocommit off and inside BEGIN.
#[test]
fn statements_hscale_cannot_see_into_run_outside_xa_branches() {
    let _alone = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let (_proxy, db, mut c) = setup("atomic_unseen");
    c.query_drop("SET autocommit = 0").unwrap();
    c.query_drop("DROP PROCEDURE IF EXISTS twice").unwrap();
    // An XA branch open, written: the CREATE commits it first, as MariaDB
    // commits a transaction before DDL.
    c.query_drop("INSERT INTO orders VALUES (6, 0, 0)").unwrap();
    c.query_drop("CREATE PROCEDURE twice(arg INT)\nBEGIN\n  SELECT arg * 2;\nEND")
        .unwrap();
    assert_eq!(ids(1, &db, "orders_even"), [6], "committed by the CREATE");
    let twice: Option<i64> = c.query_first("CALL twice(21)").unwrap();
    assert_eq!(twice, Some(42));
    c.query_drop("COMMIT").unwrap();
    c.query_drop("SET autocommit = 1").unwrap();
    // Several statements in one query, on a table that is not partitioned.
    c.query_drop("CREATE TABLE notes (id INT PRIMARY KEY)")
        .unwrap();
    for end in ["ROLLBACK", "COMMIT"] {
        c.query_drop("BEGIN").unwrap();
        c.query_drop("INSERT INTO notes VALUES (2); INSERT INTO notes VALUES (4)")
            .unwrap();
        c.query_drop("INSERT INTO orders VALUES (2, 0, 0)").unwrap();
        // That transaction cannot be prepared: its writes stay on one backend.
        let refused = c.query_drop("INSERT INTO orders VALUES (1, 0, 0)");
        assert!(
            matches!(&refused, Err(mysql::Error::MySqlError(e)) if e.code == 1235),
            "{refused:?}"
        );
        c.query_drop(end).unwrap();
    }
    assert_eq!(ids(1, &db, "notes"), [2, 4], "committed once");
    assert_eq!(ids(1, &db, "orders_even"), [2, 6]);
    assert!(ids(2, &db, "orders_odd").is_empty());
    c.query_drop("DROP PROCEDURE twice").unwrap();
}

/// hscale killed (SIGKILL) at each step of a write over two backends, one
/// statement or a transaction's COMMIT (before the decision, after it,
/// between two XA COMMITs) and a backend
/// connection dropped while it prepares, while clients of another instance
/// move money between accounts over both backends: after recovery the total
/// is unchanged, every transfer a client saw succeed is there and none that
/// failed, the killed write is whole or absent as its decision says, and
/// nothing is left prepared.
#[test]
fn writes_over_two_backends_survive_hscale_killed_at_every_step() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let _alone = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let (proxy, db, mut c) = setup("atomic_killed");
    let accounts: Vec<String> = (1..=10).map(|id| format!("({id}, {id}, 1000)")).collect();
    c.query_drop(format!("INSERT INTO orders VALUES {}", accounts.join(", ")))
        .unwrap();
    let mut expected: Vec<i64> = vec![1000; 11];

    // A backend connection dropped while the write prepares: rolled back.
    let paused = Serve::start("atomic_killed_pause", "xa_before_prepare:1500");
    let mut through = paused.connect(&db);
    let writer = std::thread::spawn(move || through.query_drop(transfer_sql(1, 2, 10)));
    std::thread::sleep(Duration::from_millis(700));
    let mut backend2 = cluster().direct(2, None);
    let ids: Vec<u64> = backend2
        .exec(
            "SELECT id FROM information_schema.processlist WHERE db = ? AND id <> CONNECTION_ID()",
            (&db,),
        )
        .unwrap();
    assert!(!ids.is_empty(), "the write's connection to backend 2");
    for id in ids {
        let _ = backend2.query_drop(format!("KILL {id}"));
    }
    assert!(writer.join().unwrap().is_err(), "the client gets an error");
    wait_for_recovery(&paused.branches());
    assert_eq!(
        balances(&mut c)[..2],
        [(1, 1000), (2, 1000)],
        "nothing of it"
    );
    drop(paused);

    // Clients of the test's instance move money among accounts 3..=10 all
    // along; what they saw succeed is what must be there.
    let stop = Arc::new(AtomicBool::new(false));
    let movers: Vec<_> = (0..2u64)
        .map(|k| {
            let stop = Arc::clone(&stop);
            let mut conn = proxy.connect(Some(&db));
            std::thread::spawn(move || {
                let mut moved: Vec<(u32, u32, i64)> = Vec::new();
                let mut n = k;
                while !stop.load(Ordering::Relaxed) {
                    n = n
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let from = 4 + 2 * ((n >> 33) % 4) as u32;
                    let to = 3 + 2 * ((n >> 40) % 4) as u32;
                    let amount = 1 + (n >> 50) as u32 % 20;
                    let done = match n >> 60 & 1 {
                        0 => conn.query_drop(transfer_sql(from, to, amount)),
                        _ => transfer_in_transaction(&mut conn, from, to, amount),
                    };
                    if done.is_ok() {
                        moved.push((from, to, i64::from(amount)));
                    }
                }
                moved
            })
        })
        .collect();

    // One statement (both parts XA branches, the decision in the
    // dictionary), or a transaction whose COMMIT writes both backends (the
    // first part plain, its commit the decision).
    for (point, in_transaction, commits) in [
        ("xa_after_prepare", false, false),
        ("xa_after_prepare", true, false),
        ("xa_after_decision", true, true),
        ("xa_between_commits", true, true),
    ] {
        let name = format!("atomic_killed_{point}_{in_transaction}");
        let mut killed = Serve::start(&name, point);
        let mut through = killed.connect(&db);
        let died = match in_transaction {
            false => through.query_drop(transfer_sql(2, 1, 7)),
            true => transfer_in_transaction(&mut through, 2, 1, 7),
        };
        let point = format!("{point} (in a transaction: {in_transaction})");
        assert!(died.is_err(), "{point}: the process died under the client");
        assert!(!killed.wait().success(), "{point}: killed");
        wait_for_recovery(&killed.branches());
        if commits {
            expected[2] -= 7;
            expected[1] += 7;
        }
        let now = balances(&mut c);
        assert_eq!(
            now[..2],
            [(1, expected[1]), (2, expected[2])],
            "{point}: the decision's outcome, on both backends"
        );
    }
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    for mover in movers {
        for (from, to, amount) in mover.join().unwrap() {
            expected[from as usize] -= amount;
            expected[to as usize] += amount;
        }
    }
    let now = balances(&mut c);
    let wanted: Vec<(u32, i64)> = (1..=10).map(|id| (id, expected[id as usize])).collect();
    assert_eq!(now, wanted, "every acknowledged transfer, nothing else");
    assert_eq!(now.iter().map(|(_, b)| b).sum::<i64>(), 10_000);
    let hscale_branches: usize = (1..=2)
        .flat_map(xa_prepared)
        .filter(|data| data.contains(':'))
        .count();
    assert_eq!(hscale_branches, 0, "XA RECOVER empty of hscale's branches");
}

/// A plain part's commit writes its decision with the client's account,
/// which may therefore insert decision rows: recovery believes only rows
/// that carry hscale's proof. An instance dies after PREPARE (the decision
/// is abort); a commit row forged for its transaction, as the client's
/// account could write it, is not believed: the branch is rolled back, and
/// no transfer is half applied.
#[test]
fn a_decision_without_hscales_proof_is_not_believed() {
    let _alone = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let (_proxy, db, mut c) = setup("atomic_forged");
    c.query_drop("INSERT INTO orders VALUES (1, 1, 100.00), (2, 2, 100.00)")
        .unwrap();
    let mut killed = Serve::start("atomic_forged", "xa_after_prepare");
    let mut through = killed.connect(&db);
    // The plain part on backend 1 (id 2), the XA branch on backend 2.
    assert!(transfer_in_transaction(&mut through, 2, 1, 7).is_err());
    assert!(!killed.wait().success());
    let branch: Vec<(u32, u32, u32, Vec<u8>)> =
        cluster().direct(2, None).query("XA RECOVER").unwrap();
    let (_, gtrid_length, _, data) = branch
        .into_iter()
        .find(|(_, _, _, data)| data.starts_with(killed.branches().as_bytes()))
        .expect("the dead instance's branch, prepared");
    let gtrid = String::from_utf8_lossy(&data[..gtrid_length as usize]).into_owned();
    for proof in ["NULL", "REPEAT('0', 64)"] {
        cluster()
            .direct(1, Some("hscale"))
            .query_drop(format!(
                "REPLACE INTO xa_decisions (gtrid, decision, decided, proof) VALUES ('{gtrid}', 'commit', NOW(6), {proof})"
            ))
            .unwrap();
    }
    wait_for_recovery(&killed.branches());
    assert_eq!(
        balances(&mut c),
        [(1, 100), (2, 100)],
        "the forged commit was not believed: rolled back on both backends"
    );
}

/// A backend killed (SIGKILL) while a write over it and another backend is
/// prepared, and started again on its data: MariaDB kept the prepared
/// branch; hscale records the decision, commits the other branch, and the
/// client gets OK; the killed backend's branch is committed by recovery
/// once it is back.
#[test]
fn a_backend_killed_after_prepare_commits_its_branch_when_it_is_back() {
    let _alone = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let (mut server, dir) = hscale_testkit::scratch_server("atomic_backend_killed");
    let third = format!(
        "[[backends]]\nid = 3\naddress = \"{}\"\nuser = \"root\"\n",
        server.address()
    );
    // A dictionary of its own: other tests' instances know no backend 3.
    let serve = Serve::start_with(
        "atomic_backend_killed_serve",
        "xa_after_prepare:3000",
        &third,
        "hscale_xa_backend_killed",
    );
    let db = cluster().database("atomic_backend_killed");
    cluster().direct(1, Some(&db)).query_drop(ORDERS).unwrap();
    let mut on_third = mysql::Conn::new(
        mysql::OptsBuilder::new()
            .socket(Some(server.socket()))
            .user(Some("root")),
    )
    .unwrap();
    on_third
        .query_drop(format!("CREATE DATABASE IF NOT EXISTS {db}"))
        .unwrap();
    let mut c = serve.connect(&db);
    c.query_drop("HSCALE SETUP_TABLE('orders', 'id', 'orders_even', 1, 'MOD(2)')")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('orders', 'odd', 1, 3)")
        .unwrap();
    cluster()
        .direct(1, Some(&db))
        .query_drop("INSERT INTO orders_even VALUES (2, 2, 1000)")
        .unwrap();
    on_third
        .query_drop(format!("INSERT INTO {db}.orders_odd VALUES (1, 1, 1000)"))
        .unwrap();
    drop(on_third);
    let writer = std::thread::spawn(move || {
        let outcome = c.query_drop(transfer_sql(2, 1, 7));
        (outcome, c)
    });
    // In the pause after both branches prepared.
    std::thread::sleep(Duration::from_millis(1000));
    server.kill();
    std::thread::sleep(Duration::from_millis(300));
    server.restart().unwrap();
    let (outcome, _c) = writer.join().unwrap();
    outcome.expect("OK: the decision was durable");
    let mut third_again = mysql::Conn::new(
        mysql::OptsBuilder::new()
            .socket(Some(server.socket()))
            .user(Some("root")),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let rows: Vec<(u32, u32, u32, Vec<u8>)> = third_again.query("XA RECOVER").unwrap();
        if rows.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the branch left prepared: {rows:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let odd: Vec<(u32, i64)> = third_again
        .query(format!(
            "SELECT id, CAST(total AS SIGNED) FROM {db}.orders_odd"
        ))
        .unwrap();
    let even: Vec<(u32, i64)> = cluster()
        .direct(1, Some(&db))
        .query("SELECT id, CAST(total AS SIGNED) FROM orders_even")
        .unwrap();
    assert_eq!(
        (even, odd),
        (vec![(2, 993)], vec![(1, 1007)]),
        "both branches committed"
    );
    assert!(xa_prepared(1)
        .iter()
        .all(|data| !data.starts_with(&serve.branches())));
    drop(serve);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client that does not ask for several statements per query (the
/// default of PyMySQL, go-sql-driver/mysql, mysql2, Connector/J) writes
/// over two backends: what hscale sends of its own (a branch's XA START, the
/// plain part's decision and COMMIT) needs no several statements per query
/// where the client's connection cannot run them. Before, its COMMIT of a
/// transaction over two backends and its INSERT over both answered 1064.
/// Its own query of several statements is still refused, as MariaDB refuses
/// it.
#[test]
fn a_client_without_multi_statements_writes_over_two_backends() {
    let _alone = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let (proxy, db, mut c) = setup("atomic_one_statement");
    c.query_drop("CREATE TABLE countries (code CHAR(2) PRIMARY KEY, name VARCHAR(20))")
        .unwrap();
    c.query_drop("HSCALE SETUP_REFERENCE('countries')").unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut raw =
            hscale_testkit::raw::RawClient::login(proxy.port, "root", "", Some(&db)).await;
        for sql in [
            "INSERT INTO orders VALUES (1, 1, 1.00), (2, 2, 2.00)",
            "BEGIN",
            "UPDATE orders SET total = total + 1 WHERE id = 1",
            "UPDATE orders SET total = total + 1 WHERE id = 2",
            "COMMIT",
            "BEGIN",
            "UPDATE orders SET total = total + 10 WHERE id = 1",
            "UPDATE orders SET total = total + 10 WHERE id = 2",
            "ROLLBACK",
            "INSERT INTO orders VALUES (3, 3, 3.00), (4, 4, 4.00)",
            // A reference table's copies, alone and in a transaction.
            "INSERT INTO countries VALUES ('de', 'Germany')",
            "BEGIN",
            "UPDATE orders SET total = total + 1 WHERE id = 3",
            "INSERT INTO countries VALUES ('fr', 'France')",
            "COMMIT",
        ] {
            let first = first_packet(&mut raw, sql).await;
            assert_eq!(first[0], 0x00, "{sql}: {}", String::from_utf8_lossy(&first));
        }
        let refused = first_packet(&mut raw, "SELECT 1; SELECT 2").await;
        assert_eq!(refused[0], 0xff);
        assert_eq!(u16::from_le_bytes([refused[1], refused[2]]), 1064);
    });
    assert_eq!(balances(&mut c), [(1, 2), (2, 3), (3, 4), (4, 4)]);
    for backend in 1..=2 {
        let copy: Vec<String> = cluster()
            .direct(backend, Some(&db))
            .query("SELECT code FROM countries ORDER BY code")
            .unwrap();
        assert_eq!(copy, ["de", "fr"], "backend {backend}'s copy");
    }
    assert_eq!(ids(1, &db, "orders_even"), [2, 4]);
    assert_eq!(ids(2, &db, "orders_odd"), [1, 3]);
    assert!((1..=2).all(|b| xa_prepared(b).iter().all(|d| !d.contains(':'))));
}

/// The first packet of a query's answer.
async fn first_packet(raw: &mut hscale_testkit::raw::RawClient, sql: &str) -> Vec<u8> {
    let bytes = raw.query_bytes(sql, false).await;
    hscale_testkit::raw::payloads(&bytes).remove(0)
}

fn hscale_status(c: &mut Conn, name: &str) -> u64 {
    let rows: Vec<(String, String)> = c.query("HSCALE STATUS").unwrap();
    let value = rows.iter().find(|(n, _)| n == name).map(|(_, v)| v);
    value
        .unwrap_or_else(|| panic!("no {name} in HSCALE STATUS"))
        .parse()
        .unwrap()
}

fn error_code(result: &mysql::Result<()>) -> Option<u16> {
    match result {
        Err(mysql::Error::MySqlError(e)) => Some(e.code),
        Err(e) => panic!("not a server error: {e}"),
        Ok(()) => None,
    }
}

/// Waits until `backend` runs a statement like `pattern` in `db` (one
/// that can only wait for a lock there). Not by INNODB_TRX: InnoDB
/// renews it only 100 ms after anyone's last read, so polling it would
/// show hscale's deadlock detector, which reads it too, the rows of before.
fn wait_until_running(backend: usize, db: &str, pattern: &str) {
    let mut direct = cluster().direct(backend, None);
    let deadline = Instant::now() + Duration::from_secs(30);
    let running = format!(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE COMMAND = 'Query' AND DB = '{db}' AND INFO LIKE '{pattern}'"
    );
    while direct.query_first::<u64, _>(&running).unwrap() == Some(0) {
        assert!(
            Instant::now() < deadline,
            "backend {backend} never ran {pattern}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Rows 2 (backend 1) and 3 (backend 2) at 100; `a` adds 1 to both and `b`
/// 10, in the other order, each in a transaction: a cycle no server sees
/// alone. The clients, and the change of the one that was not ended: each
/// row's total is 100 plus it.
fn deadlock(c: &mut Conn, db: &str, mut a: Conn, mut b: Conn) -> (Conn, Conn, i64) {
    c.query_drop("INSERT INTO orders VALUES (2, 1, 100), (3, 1, 100)")
        .unwrap();
    a.query_drop("BEGIN").unwrap();
    a.query_drop("UPDATE orders SET total = total + 1 WHERE id = 2")
        .unwrap();
    b.query_drop("BEGIN").unwrap();
    b.query_drop("UPDATE orders SET total = total + 10 WHERE id = 3")
        .unwrap();
    let started = Instant::now();
    let first = std::thread::spawn(move || {
        let result = a.query_drop("UPDATE orders SET total = total + 1 WHERE id = 3");
        (a, result)
    });
    wait_until_running(2, db, "UPDATE %orders_odd%");
    let second = std::thread::spawn(move || {
        let result = b.query_drop("UPDATE orders SET total = total + 10 WHERE id = 2");
        (b, result)
    });
    let (a, in_a) = first.join().unwrap();
    let (b, in_b) = second.join().unwrap();
    eprintln!("the cycle ended after {:?}", started.elapsed());
    // MariaDB ends one transaction of a deadlock: 1213, not a lock wait
    // timeout (1205) for both.
    let change = match [error_code(&in_a), error_code(&in_b)] {
        [None, Some(1213)] => 1,
        [Some(1213), None] => 10,
        other => panic!("one transaction must end with 1213: {other:?}"),
    };
    (a, b, change)
}

/// Each row's total, on its backend.
fn totals(db: &str) -> (i64, i64) {
    let total = |backend, table: &str, id| -> i64 {
        cluster()
            .direct(backend, Some(db))
            .query_first(format!(
                "SELECT CAST(total AS SIGNED) FROM {table} WHERE id = {id}"
            ))
            .unwrap()
            .unwrap()
    };
    (total(1, "orders_even", 2), total(2, "orders_odd", 3))
}

#[test]
fn a_deadlock_through_two_backends_ends_one_transaction_with_1213() {
    // Alone: no other test's branch is prepared when XA RECOVER is read.
    let _alone = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let (proxy, db, mut c) = setup("atomic_deadlock");
    let (a, b) = (proxy.connect(Some(&db)), proxy.connect(Some(&db)));
    let (mut a, mut b, change) = deadlock(&mut c, &db, a, b);
    let (survivor, victim) = match change {
        1 => (&mut a, &mut b),
        _ => (&mut b, &mut a),
    };
    survivor.query_drop("COMMIT").unwrap();
    // The victim's transaction is gone on both backends: what follows is a
    // new one.
    victim.query_drop("COMMIT").unwrap();
    assert_eq!(totals(&db), (100 + change, 100 + change));
    for backend in 1..=2 {
        assert!(xa_prepared(backend).is_empty());
    }
    assert_eq!(hscale_status(&mut c, "deadlocks"), 1);
    // Both clients go on.
    for client in [survivor, victim] {
        client
            .query_drop("UPDATE orders SET total = total WHERE id IN (2, 3)")
            .unwrap();
    }
}

/// A cycle through clients of two instances: each instance sees its own
/// session wait and learns the other's from the dictionary; the one that
/// owns the transaction the cycle names ends it with 1213.
#[test]
fn a_deadlock_through_two_instances_clients_ends_one_transaction_with_1213() {
    let _alone = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let (proxy, db, mut c) = setup("atomic_deadlock_instances");
    let other = Proxy::start(cluster().config());
    let (a, b) = (proxy.connect(Some(&db)), other.connect(Some(&db)));
    let (mut a, mut b, change) = deadlock(&mut c, &db, a, b);
    let survivor = if change == 1 { &mut a } else { &mut b };
    survivor.query_drop("COMMIT").unwrap();
    assert_eq!(totals(&db), (100 + change, 100 + change));
    // Only the victim's own instance ended it.
    let mut on_other = other.connect(Some(&db));
    let ended = [
        hscale_status(&mut c, "deadlocks"),
        hscale_status(&mut on_other, "deadlocks"),
    ];
    assert_eq!(ended, if change == 1 { [0, 1] } else { [1, 0] });
}

/// Clients moving amounts between accounts on the two backends in both
/// orders, inside transactions, retrying on 1213 as applications do: every
/// cycle is ended at once (never by innodb_lock_wait_timeout, 1205), and
/// the total stays what it was.
#[test]
fn transfers_in_both_orders_never_wait_for_the_lock_wait_timeout() {
    let _alone = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let (proxy, db, mut c) = setup("atomic_deadlocks_many");
    let accounts: Vec<u32> = (1..=6).collect();
    let values: Vec<String> = accounts
        .iter()
        .map(|id| format!("({id}, 0, 1000)"))
        .collect();
    c.query_drop(format!("INSERT INTO orders VALUES {}", values.join(", ")))
        .unwrap();
    let seed: u64 = std::env::var("SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("seed {seed}");
    let clients: Vec<_> = (0..4u64)
        .map(|n| {
            let mut conn = proxy.connect(Some(&db));
            std::thread::spawn(move || {
                let mut state = seed ^ (n + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                let mut next = move || {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state
                };
                let (mut done, mut retried) = (0, 0);
                while done < 25 {
                    // An even and an odd account, in either order.
                    let even = 2 * (next() % 3 + 1) as u32;
                    let odd = 2 * (next() % 3) as u32 + 1;
                    let (from, to) = match next() % 2 {
                        0 => (even, odd),
                        _ => (odd, even),
                    };
                    match transfer_in_transaction(&mut conn, from, to, 1) {
                        Ok(()) => done += 1,
                        Err(mysql::Error::MySqlError(e)) if e.code == 1213 => retried += 1,
                        Err(e) => panic!("seed {seed}: {e}"),
                    }
                }
                retried
            })
        })
        .collect();
    let retried: u64 = clients.into_iter().map(|t| t.join().unwrap()).sum();
    let total: i64 = balances(&mut c).iter().map(|(_, total)| total).sum();
    assert_eq!(total, 6000, "seed {seed}");
    assert!(hscale_status(&mut c, "deadlocks") <= retried, "seed {seed}");
    eprintln!("seed {seed}: {retried} transactions retried after 1213");
    for backend in 1..=2 {
        assert!(xa_prepared(backend).is_empty(), "seed {seed}");
    }
}

/// A transaction on one backend that prepares statements on the
/// partitioned table (prepared where some partition is) and executes them
/// there, and prepares one for the main backend, stays on its backend: a
/// COM_STMT_PREPARE opens no part of the transaction elsewhere, so COMMIT
/// sends no XA statement.
#[test]
fn statements_prepared_inside_a_transaction_open_no_part_elsewhere() {
    let _alone = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let (_proxy, db, mut c) = setup("atomic_prepared_inside");
    c.query_drop("INSERT INTO orders VALUES (1, 1, 1.00), (2, 2, 2.00)")
        .unwrap();
    let before = [xa_counts(1), xa_counts(2)];
    c.query_drop("BEGIN").unwrap();
    c.query_drop("UPDATE orders SET total = 3 WHERE id = 1")
        .unwrap();
    let read = c.prep("SELECT total FROM orders WHERE id = ?").unwrap();
    let total: Option<String> = c.exec_first(&read, (1,)).unwrap();
    assert_eq!(total.as_deref(), Some("3.00"));
    let write = c
        .prep("UPDATE orders SET total = total + ? WHERE id = ?")
        .unwrap();
    c.exec_drop(&write, (1, 1)).unwrap();
    // Prepared on the main backend, not executed.
    c.prep("SELECT ? + 1").unwrap();
    c.query_drop("COMMIT").unwrap();
    let after = [xa_counts(1), xa_counts(2)];
    assert_eq!(before, after, "no XA statement on either backend");
    let total: Option<String> = cluster()
        .direct(2, Some(&db))
        .query_first("SELECT total FROM orders_odd WHERE id = 1")
        .unwrap();
    assert_eq!(total.as_deref(), Some("4.00"));
}

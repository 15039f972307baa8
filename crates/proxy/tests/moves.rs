//! Online partition moves (docs/moves.md): a partition moves to another
//! backend while clients write it, through hscale, and every change a
//! client saw committed is there once afterwards. Each write goes through
//! hscale and, the same, to an oracle table on one server; at the end both
//! read the same, and the backends are checked directly.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hscale_testkit::{cluster, Proxy};
use mysql::prelude::Queryable;
use mysql::{Conn, Row};
use rand::{Rng, SeedableRng};

const ITEMS: &str = "CREATE TABLE items (id INT PRIMARY KEY, val INT NOT NULL, note VARCHAR(40) CHARACTER SET utf8mb4, f FLOAT, d DECIMAL(12,3), ts TIMESTAMP(6) NULL, b BLOB, u BIGINT UNSIGNED, y YEAR NULL, e ENUM('x','y','z') NULL, s SET('a','b','c') NULL, bits BIT(10) NULL)";

fn seed() -> u64 {
    hscale_testkit::seed("HSCALE_MOVE_SEED")
}

/// A row's values as SQL, from a generator.
fn random_row(rng: &mut impl Rng, id: i64) -> String {
    let note = match rng.random_range(0..4) {
        0 => "NULL".to_string(),
        1 => "'naïve ünïcödé ✓'".to_string(),
        _ => format!("'note {}'", rng.random::<u32>()),
    };
    let f: f32 = rng.random_range(-1e6..1e6);
    let ts = match rng.random_range(0..5) {
        0 => "NULL".to_string(),
        1 => "'0000-00-00 00:00:00'".to_string(),
        _ => format!(
            "FROM_UNIXTIME({}.{:06})",
            rng.random_range(1..2_000_000_000u32),
            rng.random_range(0..1_000_000u32)
        ),
    };
    let blob = match rng.random_range(0..3) {
        0 => "NULL".to_string(),
        _ => format!("X'{:08x}00ff'", rng.random::<u32>()),
    };
    let u = match rng.random_range(0..3) {
        0 => "18446744073709551615".to_string(),
        _ => rng.random::<u64>().to_string(),
    };
    let y = ["NULL", "0", "1901", "2155", "1999"][rng.random_range(0..5)];
    let e = ["NULL", "'x'", "'z'", "''"][rng.random_range(0..3)];
    let s = ["NULL", "''", "'a,c'", "'b'"][rng.random_range(0..4)];
    let bits = ["NULL", "b'1111111111'", "b'0'", "b'101'"][rng.random_range(0..4)];
    format!(
        "({id}, {}, {note}, {f:?}, {}.{:03}, {ts}, {blob}, {u}, {y}, {e}, {s}, {bits})",
        rng.random_range(-1000..1000),
        rng.random_range(-999_999_999i64..999_999_999),
        rng.random_range(0..1000)
    )
}

/// Runs a write through hscale and on the oracle table, in that order:
/// the oracle records what hscale acknowledged.
fn both(proxy: &mut Conn, oracle: &mut Conn, sql: &str) {
    proxy
        .query_drop(sql)
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    oracle
        .query_drop(sql.replace("items", "oracle_items"))
        .unwrap();
}

fn all_rows(conn: &mut Conn, table: &str) -> Vec<Row> {
    conn.query(format!("SELECT * FROM {table} ORDER BY id"))
        .unwrap()
}

fn values(rows: Vec<Row>) -> Vec<Vec<mysql::Value>> {
    rows.into_iter().map(|r| r.unwrap()).collect()
}

/// `table` read on `got` holds the oracle's rows, in key order.
fn assert_oracle_rows(got: &mut Conn, table: &str, oracle: &mut Conn, seed: u64) {
    let through = values(all_rows(got, table));
    let expected = values(all_rows(oracle, "oracle_items"));
    let only = |a: &[Vec<mysql::Value>], b: &[Vec<mysql::Value>]| -> Vec<mysql::Value> {
        a.iter()
            .filter(|row| !b.iter().any(|other| other[0] == row[0]))
            .map(|row| row[0].clone())
            .collect()
    };
    assert_eq!(
        through.len(),
        expected.len(),
        "rows of {table} (seed {seed}): ids only there {:?}, only in the oracle {:?}",
        only(&through, &expected),
        only(&expected, &through)
    );
    assert_eq!(through, expected, "{table} (seed {seed})");
}

fn move_phase(admin: &mut Conn, job: u64) -> (String, Option<String>) {
    let row = job_row(admin, job);
    (
        row.get::<String, _>("phase").unwrap(),
        row.get::<Option<String>, _>("last_error").unwrap(),
    )
}

fn wait_for_move(admin: &mut Conn, job: u64, limit: Duration) -> String {
    let started = Instant::now();
    loop {
        let (phase, error) = move_phase(admin, job);
        if matches!(phase.as_str(), "done" | "failed" | "cancelled") {
            assert_eq!(phase, "done", "the move ended {phase}: {error:?}");
            return phase;
        }
        assert!(started.elapsed() < limit, "the move is still {phase}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn tables_on(backend: usize, db: &str) -> Vec<String> {
    cluster()
        .direct(backend, Some(db))
        .query("SHOW TABLES")
        .unwrap()
}

/// `items` and its oracle table in the database `db` of backend 1;
/// `items` set up by `function` of `id` with its default table on backend
/// 1, and `partitions` added before any row.
fn items(proxy: &Proxy, db: &str, function: &str, partitions: &[&str]) -> Conn {
    let mut direct = cluster().direct(1, Some(db));
    direct.query_drop(ITEMS).unwrap();
    direct
        .query_drop(ITEMS.replace("items", "oracle_items"))
        .unwrap();
    let mut admin = proxy.connect(Some(db));
    admin
        .query_drop(format!(
            "HSCALE SETUP_TABLE('items', 'id', 'items_default', 1, '{function}')"
        ))
        .unwrap();
    for partition in partitions {
        admin
            .query_drop(format!("HSCALE ADD_PARTITION('items', {partition})"))
            .unwrap();
    }
    admin
}

/// `count` random rows from id 0 on, written through hscale and to the
/// oracle.
fn load(admin: &mut Conn, oracle: &mut Conn, rng: &mut impl Rng, count: i64) {
    for start in (0..count).step_by(500) {
        let rows: Vec<String> = (start..count.min(start + 500))
            .map(|id| random_row(rng, id))
            .collect();
        both(
            admin,
            oracle,
            &format!("INSERT INTO items VALUES {}", rows.join(", ")),
        );
    }
}

/// Two transactions open before a job, to be committed while it copies
/// (the writes the issue found lost): one inserts id 1,000,001, the other
/// sets id 1's val to 42. Returns them and the inserted row.
fn open_transactions(proxy: &Proxy, db: &str, rng: &mut impl Rng) -> (Conn, Conn, String) {
    let mut a = proxy.connect(Some(db));
    let mut b = proxy.connect(Some(db));
    let row = random_row(rng, 1_000_001);
    a.query_drop("BEGIN").unwrap();
    a.query_drop(format!("INSERT INTO items VALUES {row}"))
        .unwrap();
    b.query_drop("BEGIN").unwrap();
    b.query_drop("UPDATE items SET val = 42 WHERE id = 1")
        .unwrap();
    (a, b, row)
}

/// Commits the transactions `open_transactions` left while a job runs,
/// waits for the job (about half of 5,000 rows to move) and the writer, and
/// checks that the rows read through hscale are the oracle's with the
/// transactions' changes; the oracle's rows.
fn end_with_open_transactions(
    (mut a, mut b, a_row): (Conn, Conn, String),
    job: std::thread::JoinHandle<mysql::Result<u64>>,
    (writer, stop): (std::thread::JoinHandle<usize>, Arc<AtomicBool>),
    (admin, oracle): (&mut Conn, &mut Conn),
    seed: u64,
) -> Vec<Vec<mysql::Value>> {
    a.query_drop("COMMIT").unwrap();
    b.query_drop("COMMIT").unwrap();
    let moved = job.join().unwrap().expect("the job ends well");
    stop.store(true, Ordering::Relaxed);
    let writes = writer.join().unwrap();
    assert!(
        writes > 10,
        "the writer ran during the job ({writes} writes)"
    );
    assert!(moved >= 2000, "about half the rows moved: {moved}");
    oracle
        .query_drop(format!("INSERT INTO oracle_items VALUES {a_row}"))
        .unwrap();
    oracle
        .query_drop("UPDATE oracle_items SET val = 42 WHERE id = 1")
        .unwrap();
    let through = values(all_rows(admin, "items"));
    let expected = values(all_rows(oracle, "oracle_items"));
    assert_eq!(through.len(), expected.len(), "row count (seed {seed})");
    for (got, want) in through.iter().zip(&expected) {
        assert_eq!(got, want, "seed {seed}");
    }
    expected
}

/// A client writing rows whose ids `pick` draws (REPLACE, DELETE, UPDATE,
/// INSERT IGNORE of a far id), through hscale and to the oracle, until
/// `stop`; answers how many writes it made.
fn writer(
    proxy: &Proxy,
    db: &str,
    seed: u64,
    pick: fn(&mut rand::rngs::StdRng) -> i64,
    stop: &Arc<AtomicBool>,
) -> std::thread::JoinHandle<usize> {
    let stop = Arc::clone(stop);
    let mut through = proxy.connect(Some(db));
    let mut oracle = cluster().direct(1, Some(db));
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    std::thread::spawn(move || {
        let mut writes = 0;
        while !stop.load(Ordering::Relaxed) {
            let id = pick(&mut rng);
            let sql = match rng.random_range(0..4) {
                0 => format!("REPLACE INTO items VALUES {}", random_row(&mut rng, id)),
                1 => format!("DELETE FROM items WHERE id = {id}"),
                2 => format!("UPDATE items SET val = val + 1, note = 'upd' WHERE id = {id}"),
                _ => {
                    let row = random_row(&mut rng, id + 2_000_000);
                    format!("INSERT IGNORE INTO items VALUES {row}")
                }
            };
            both(&mut through, &mut oracle, &sql);
            writes += 1;
        }
        writes
    })
}

/// The error code and message of a statement that must be refused.
fn refusal(conn: &mut Conn, sql: &str) -> (u16, String) {
    match conn.query_drop(sql) {
        Err(mysql::Error::MySqlError(e)) => (e.code, e.message),
        other => panic!("{sql}: expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_partition_moves_while_clients_write_and_no_committed_change_is_lost() {
    let seed = seed();
    let db = cluster().database("moves_live");
    let proxy = Proxy::for_cluster();
    let mut admin = items(&proxy, &db, "MOD(2)", &["'odd', 1, 1"]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut oracle = cluster().direct(1, Some(&db));
    load(&mut admin, &mut oracle, &mut rng, 5000);
    let (mut a, mut b, _) = open_transactions(&proxy, &db, &mut rng);
    let job: u64 = admin
        .query_first("HSCALE MOVE_PARTITION('items', 'odd', 2)")
        .unwrap()
        .expect("a job id");
    let stop = Arc::new(AtomicBool::new(false));
    // Odd ids of the moved partition, but not the two the open
    // transactions write.
    let writer = writer(
        &proxy,
        &db,
        seed ^ 1,
        |rng| rng.random_range(1..3000i64) * 2 + 1,
        &stop,
    );
    std::thread::sleep(Duration::from_millis(300));
    a.query_drop("COMMIT").unwrap();
    b.query_drop("COMMIT").unwrap();
    wait_for_move(&mut admin, job, Duration::from_secs(120));
    stop.store(true, Ordering::Relaxed);
    let writes = writer.join().unwrap();
    assert!(
        writes > 10,
        "the writer ran during the move ({writes} writes)"
    );

    // The transactions' changes, which went to hscale only: the oracle
    // takes them as they must read.
    let mut check = cluster().direct(1, Some(&db));
    let a_row: Vec<Row> = admin
        .query("SELECT * FROM items WHERE id = 1000001")
        .unwrap();
    assert_eq!(
        a_row.len(),
        1,
        "the insert committed before the copy ended is there"
    );
    let val: Option<i32> = admin
        .query_first("SELECT val FROM items WHERE id = 1")
        .unwrap();
    assert_eq!(
        val,
        Some(42),
        "the update committed during the copy is there"
    );
    check
        .query_drop("DELETE FROM oracle_items WHERE id IN (1, 1000001)")
        .unwrap();
    let through: Vec<Row> = admin
        .query("SELECT * FROM items WHERE id NOT IN (1, 1000001) ORDER BY id")
        .unwrap();
    let expected = all_rows(&mut check, "oracle_items");
    let (through, expected) = (values(through), values(expected));
    assert_eq!(through.len(), expected.len(), "row count (seed {seed})");
    for (got, want) in through.iter().zip(&expected) {
        assert_eq!(got, want, "seed {seed}");
    }
    // On the backends: the partition's table lives on backend 2 only, its
    // old table is retired on backend 1, and no row is in two tables.
    assert!(tables_on(2, &db).contains(&"items_odd".to_string()));
    let on_one = tables_on(1, &db);
    assert!(!on_one.contains(&"items_odd".to_string()), "{on_one:?}");
    // Retired where no client lists it: the dictionary's schema.
    let retired = tables_on(1, "hscale");
    assert!(
        retired
            .iter()
            .any(|t| t == &format!("_hscale_retired_{job}_items_odd")),
        "{retired:?}"
    );
    assert!(
        !on_one.iter().any(|t| t.starts_with("_hscale_")),
        "{on_one:?}"
    );
    let mut two = cluster().direct(2, Some(&db));
    let odd: Vec<i64> = two.query("SELECT id FROM items_odd").unwrap();
    assert!(odd.iter().all(|id| id % 2 != 0));
    let even_in_default: u64 = check
        .query_first("SELECT COUNT(*) FROM items_default WHERE id % 2 <> 0")
        .unwrap()
        .unwrap();
    assert_eq!(even_in_default, 0);
    let (phase, _) = move_phase(&mut admin, job);
    assert_eq!(phase, "done");
}

#[test]
fn a_move_that_cannot_run_is_refused_with_its_reason_and_changes_nothing() {
    let db = cluster().database("moves_refused");
    let proxy = Proxy::for_cluster();
    let mut admin = proxy.connect(Some(&db));
    let mut direct = cluster().direct(1, Some(&db));
    direct
        .query_drop("CREATE TABLE nokey (id INT NOT NULL, v INT, UNIQUE KEY (v))")
        .unwrap();
    direct
        .query_drop("INSERT INTO nokey VALUES (1, 1), (3, NULL)")
        .unwrap();
    admin
        .query_drop("HSCALE SETUP_TABLE('nokey', 'id', 'nokey_default', 1, 'MOD(2)')")
        .unwrap();
    // A unique key of a nullable column names no row: a split moves the
    // rows during its fence instead of copying them while they change...
    let added = admin
        .query_iter("HSCALE ADD_PARTITION('nokey', 'odd', 1, 1)")
        .unwrap()
        .affected_rows();
    assert_eq!(added, 2, "ids 1 and 3 are odd");
    // ... and a move of a partition is refused.
    for sql in [
        "HSCALE MOVE_PARTITION('nokey', 'odd', 2)",
        "HSCALE MOVE_PARTITION('nokey', '(default)', 2)",
    ] {
        let (code, message) = refusal(&mut admin, sql);
        assert_eq!(code, 1235, "{sql}: {message}");
        assert!(message.contains("neither a primary key"), "{message}");
    }
    let (code, message) = refusal(&mut admin, "HSCALE MOVE_PARTITION('nokey', '(default)', 1)");
    assert_eq!(code, 1210, "{message}");
    assert!(message.contains("on backend 1 already"), "{message}");
    let (code, _) = refusal(&mut admin, "HSCALE MOVE_PARTITION('nokey', 'none', 2)");
    assert_eq!(code, 1210);
    assert!(!tables_on(2, &db).iter().any(|t| t.starts_with("nokey")));
    assert_eq!(tables_on(1, &db), ["nokey_default", "nokey_odd"]);
    let odd: Vec<i64> = direct
        .query("SELECT id FROM nokey_odd ORDER BY id")
        .unwrap();
    assert_eq!(odd, [1, 3]);
    let even: u64 = direct
        .query_first("SELECT COUNT(*) FROM nokey_default")
        .unwrap()
        .unwrap();
    assert_eq!(even, 0);
    let rows: Vec<Row> = admin.query("SELECT * FROM nokey").unwrap();
    assert_eq!(rows.len(), 2);
}

/// The lost writes, for a split: ADD_PARTITION of a value the
/// default table holds rows of, while transactions that were open before
/// it commit during its copy and a writer changes rows that move and rows
/// that stay.
#[test]
fn a_split_of_a_table_with_rows_loses_no_committed_write() {
    let seed = seed();
    let db = cluster().database("moves_split");
    let proxy = Proxy::for_cluster();
    let mut admin = items(&proxy, &db, "MOD(2)", &[]);
    let mut direct = cluster().direct(1, Some(&db));
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut oracle = cluster().direct(1, Some(&db));
    load(&mut admin, &mut oracle, &mut rng, 5000);
    let (a, b, a_row) = open_transactions(&proxy, &db, &mut rng);
    let split = {
        let mut admin = proxy.connect(Some(&db));
        std::thread::spawn(move || {
            admin
                .query_iter("HSCALE ADD_PARTITION('items', 'odd', 1, 2)")
                .map(|answer| answer.affected_rows())
        })
    };
    let stop = Arc::new(AtomicBool::new(false));
    // Rows that move (odd) and rows that stay (even), but not the two the
    // open transactions write.
    let writer = writer(
        &proxy,
        &db,
        seed ^ 2,
        |rng| rng.random_range(2..5000i64),
        &stop,
    );
    std::thread::sleep(Duration::from_millis(300));
    let expected = end_with_open_transactions(
        (a, b, a_row),
        split,
        (writer, stop),
        (&mut admin, &mut oracle),
        seed,
    );
    // On the backends: each row in the one table its value routes to, the
    // old default table retired, the split's rest gone into its place.
    let mut two = cluster().direct(2, Some(&db));
    let odd: Vec<i64> = two.query("SELECT id FROM items_odd").unwrap();
    assert!(odd.iter().all(|id| id % 2 != 0));
    let even: Vec<i64> = direct.query("SELECT id FROM items_default").unwrap();
    assert!(even.iter().all(|id| id % 2 == 0));
    assert_eq!(odd.len() + even.len(), expected.len());
    let job: u64 = cluster()
        .direct(1, None)
        .exec_first("SELECT id FROM hscale.moves WHERE db = ?", (&db,))
        .unwrap()
        .unwrap();
    let own = tables_on(1, "hscale");
    assert!(
        own.contains(&format!("_hscale_retired_{job}_items_default")),
        "{own:?}"
    );
    assert!(
        !own.contains(&format!("_hscale_rest_{job}_items_default")),
        "{own:?}"
    );
}

/// DROP_PARTITION runs on the move engine: the rows of a partition of two
/// values on backend 2 join the default table on backend 1 while a writer
/// changes rows of every partition and two transactions open on the
/// partition's rows commit during the copy; the default table's rows are
/// read meanwhile. Afterwards
/// every row is the oracle's, the partition's values route to the default
/// table, which holds each row once, and the partition's old table is
/// retired.
#[test]
fn a_partition_is_dropped_into_the_default_table_while_it_is_written() {
    let seed = seed();
    let db = cluster().database("moves_drop");
    let proxy = Proxy::for_cluster();
    let mut admin = items(&proxy, &db, "MOD(4)", &["'pair', 1, 2", "'pair', 3, 2"]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut oracle = cluster().direct(1, Some(&db));
    // Each statement on one backend: the odd ids are the partition's.
    for start in (0..5000).step_by(500) {
        for parity in [0, 1] {
            let rows: Vec<String> = (start..start + 500)
                .filter(|id| id % 2 == parity)
                .map(|id| random_row(&mut rng, id))
                .collect();
            let sql = format!("INSERT INTO items VALUES {}", rows.join(", "));
            both(&mut admin, &mut oracle, &sql);
        }
    }
    let (a, b, a_row) = open_transactions(&proxy, &db, &mut rng);
    let dropping = {
        let mut admin = proxy.connect(Some(&db));
        std::thread::spawn(move || {
            admin
                .query_iter("HSCALE DROP_PARTITION('items', 'pair')")
                .map(|answer| answer.affected_rows())
        })
    };
    let stop = Arc::new(AtomicBool::new(false));
    let writer = writer(
        &proxy,
        &db,
        seed ^ 5,
        |rng| rng.random_range(2..5000i64),
        &stop,
    );
    std::thread::sleep(Duration::from_millis(300));
    let even: i64 = admin
        .query_first("SELECT COUNT(*) FROM items WHERE id = 0")
        .unwrap()
        .unwrap();
    assert_eq!(
        even, 1,
        "the default table's rows are read while the partition merges"
    );
    let expected = end_with_open_transactions(
        (a, b, a_row),
        dropping,
        (writer, stop),
        (&mut admin, &mut oracle),
        seed,
    );
    let mut direct = cluster().direct(1, Some(&db));
    let in_default: i64 = direct
        .query_first("SELECT COUNT(*) FROM items_default")
        .unwrap()
        .unwrap();
    assert_eq!(
        in_default as usize,
        expected.len(),
        "every row in the default table once"
    );
    assert!(!tables_on(2, &db).contains(&"items_pair".to_string()));
    let lookup: Vec<Row> = admin.query("HSCALE LOOKUP('items', 7)").unwrap();
    assert_eq!(
        lookup[0].get::<String, _>("partition").unwrap(),
        "(default)"
    );
    assert_eq!(lookup[0].get::<i64, _>("backend").unwrap(), 1);
    let job: u64 = cluster()
        .direct(1, None)
        .exec_first(
            "SELECT id FROM hscale.moves WHERE db = ? ORDER BY id DESC",
            (&db,),
        )
        .unwrap()
        .unwrap();
    assert!(
        tables_on(2, "hscale").contains(&format!("_hscale_retired_{job}_items_pair")),
        "the partition's table is retired on its backend"
    );
    assert!(!tables_on(1, "hscale").contains(&format!("_hscale_stage_{job}_items_pair")));
}

/// ADD_PARTITION on a table with rows whose partition column the copy
/// cannot read as the router hashes it (an ENUM): the value's rows move in
/// the split's fence, read and routed as the router does, and every row is
/// where the dictionary says once it answers.
#[test]
fn a_split_by_a_column_the_copy_cannot_read_moves_its_rows_in_the_fence() {
    let db = cluster().database("moves_enum_split");
    let proxy = Proxy::for_cluster();
    let mut direct = cluster().direct(1, Some(&db));
    direct
        .query_drop("CREATE TABLE shelf (id INT PRIMARY KEY, category ENUM('books','music','film') NOT NULL, title VARCHAR(20))")
        .unwrap();
    direct
        .query_drop("INSERT INTO shelf SELECT seq, ELT(1 + seq % 3, 'books', 'music', 'film'), CONCAT('t', seq) FROM seq_1_to_3000")
        .unwrap();
    let mut admin = proxy.connect(Some(&db));
    admin
        .query_drop("HSCALE SETUP_TABLE('shelf', 'category', 'shelf_default', 1, 'NONE()')")
        .unwrap();
    let moved = admin
        .query_iter("HSCALE ADD_PARTITION('shelf', 'music', 'music', 2)")
        .unwrap()
        .affected_rows();
    assert_eq!(moved, 1000);
    let mut two = cluster().direct(2, Some(&db));
    let on_two: Vec<(String, i64)> = two
        .query("SELECT category, COUNT(*) FROM shelf_music GROUP BY category")
        .unwrap();
    assert_eq!(on_two, [("music".to_string(), 1000)]);
    let left: i64 = direct
        .query_first("SELECT COUNT(*) FROM shelf_default WHERE category = 'music'")
        .unwrap()
        .unwrap();
    assert_eq!(left, 0, "the value's rows left the default table");
    for category in ["books", "music", "film"] {
        let count: i64 = admin
            .exec_first("SELECT COUNT(*) FROM shelf WHERE category = ?", (category,))
            .unwrap()
            .unwrap();
        assert_eq!(count, 1000, "{category} read through hscale");
    }
    let all: i64 = admin
        .query_first("SELECT COUNT(*) FROM shelf")
        .unwrap()
        .unwrap();
    assert_eq!(all, 3000);
}

/// SPLIT_PARTITION takes one value of a partition that has several to a
/// partition of its own on another backend, while a writer changes rows of
/// both values; a partition's only value is refused (a move does that).
#[test]
fn a_value_splits_off_a_partition_while_it_is_written() {
    let seed = seed();
    let db = cluster().database("moves_split_partition");
    let proxy = Proxy::for_cluster();
    let mut admin = items(&proxy, &db, "MOD(4)", &["'pair', 1, 1", "'pair', 3, 1"]);
    let mut direct = cluster().direct(1, Some(&db));
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut oracle = cluster().direct(1, Some(&db));
    load(&mut admin, &mut oracle, &mut rng, 3000);
    let (code, message) = refusal(
        &mut admin,
        "HSCALE SPLIT_PARTITION('items', 'default', 'x', 0, 2)",
    );
    assert_eq!(code, 1210, "{message}");
    let job: u64 = admin
        .query_first("HSCALE SPLIT_PARTITION('items', 'pair', 'three', 3, 2)")
        .unwrap()
        .expect("a job id");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = writer(
        &proxy,
        &db,
        seed ^ 3,
        |rng| rng.random_range(0..3000i64),
        &stop,
    );
    wait_for_move(&mut admin, job, Duration::from_secs(120));
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let through = values(all_rows(&mut admin, "items"));
    let expected = values(all_rows(&mut oracle, "oracle_items"));
    assert_eq!(through, expected, "seed {seed}");
    let pair: Vec<i64> = direct.query("SELECT id FROM items_pair").unwrap();
    assert!(pair.iter().all(|id| id % 4 == 1), "only 1 stays");
    let mut two = cluster().direct(2, Some(&db));
    let three: Vec<i64> = two.query("SELECT id FROM items_three").unwrap();
    assert!(!three.is_empty() && three.iter().all(|id| id % 4 == 3));
    let lookup: Vec<Row> = admin.query("HSCALE LOOKUP('items', 7)").unwrap();
    assert_eq!(lookup[0].get::<String, _>("partition").unwrap(), "three");
    let (code, message) = refusal(
        &mut admin,
        "HSCALE SPLIT_PARTITION('items', 'pair', 'one', 1, 2)",
    );
    assert_eq!(code, 1210);
    assert!(message.contains("MOVE_PARTITION"), "{message}");
}

/// `items` in a new database with `rows` random rows written on backend 1
/// (quicker than through hscale), then set up MOD(2) with the odd ids in a
/// partition on backend 1, through `proxy`.
fn odd_items(proxy: &Proxy, name: &str, seed: u64, rows: i64) -> (String, Conn) {
    let db = cluster().database(name);
    let mut direct = cluster().direct(1, Some(&db));
    direct.query_drop(ITEMS).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for start in (0..rows).step_by(1000) {
        let batch: Vec<String> = (start..rows.min(start + 1000))
            .map(|id| random_row(&mut rng, id))
            .collect();
        direct
            .query_drop(format!("INSERT INTO items VALUES {}", batch.join(", ")))
            .unwrap();
    }
    direct
        .query_drop("CREATE TABLE oracle_items AS SELECT * FROM items WHERE id % 2 = 1")
        .unwrap();
    let mut admin = proxy.connect(Some(&db));
    admin
        .query_drop("HSCALE SETUP_TABLE('items', 'id', 'items_default', 1, 'MOD(2)')")
        .unwrap();
    admin
        .query_drop("HSCALE ADD_PARTITION('items', 'odd', 1, 1)")
        .unwrap();
    (db, direct)
}

/// A client that waits for a fence longer than its instance's
/// `lock_wait_ms` gets 1205 naming the move: a transaction open on the
/// partition holds each fence's rename back, and a statement on the
/// partition through an instance with a short wait runs into the fence.
/// Once the transaction commits, the move ends.
#[test]
fn a_statement_held_past_lock_wait_by_a_fence_gets_1205_naming_the_move() {
    let seed = seed();
    let proxy = Proxy::for_cluster();
    let (db, _direct) = odd_items(&proxy, "moves_lock_wait", seed, 2000);
    let mut config = cluster().config();
    config.dictionary.lock_wait_ms = 100;
    let impatient = Proxy::start(config);
    let mut holder = proxy.connect(Some(&db));
    holder.query_drop("BEGIN").unwrap();
    holder
        .query_drop("UPDATE items SET val = 1 WHERE id = 1")
        .unwrap();
    let mut admin = proxy.connect(Some(&db));
    let job: u64 = admin
        .query_first("HSCALE MOVE_PARTITION('items', 'odd', 2)")
        .unwrap()
        .expect("a job id");
    let mut client = impatient.connect(Some(&db));
    let started = Instant::now();
    let (code, message) = loop {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no statement waited past lock_wait_ms"
        );
        match client.query_drop("UPDATE items SET val = val + 1 WHERE id = 3") {
            Err(mysql::Error::MySqlError(e)) => break (e.code, e.message),
            Ok(()) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(code, 1205, "{message}");
    assert!(message.contains(&format!("move {job} ")), "{message}");
    holder.query_drop("COMMIT").unwrap();
    assert_eq!(
        wait_for_move(&mut admin, job, Duration::from_secs(120)),
        "done"
    );
}

/// A transaction that ran beside a fenced partition, on the same backend,
/// but not on it, waits for the switch like any statement and then runs
/// where the rows went: it holds nothing on the old table that the fence
/// had to wait for, and that table is renamed away while it waits (it got
/// 1146 when every transaction on a backend passed fences). A client
/// holding the default table's rows on the server directly keeps the merge
/// inside its fence, after the rename, for as long as the test needs.
#[test]
fn a_transaction_beside_a_fenced_partition_waits_for_the_switch() {
    let seed = seed();
    let db = cluster().database("moves_beside_fence");
    let proxy = Proxy::for_cluster();
    let mut admin = items(&proxy, &db, "MOD(4)", &["'one', 1, 1", "'three', 3, 1"]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut oracle = cluster().direct(1, Some(&db));
    load(&mut admin, &mut oracle, &mut rng, 2000);
    let mut holder = cluster().direct(1, Some(&db));
    holder.query_drop("BEGIN").unwrap();
    holder
        .query_drop("SELECT COUNT(*) FROM items_default FOR UPDATE")
        .unwrap();
    let mut beside = proxy.connect(Some(&db));
    beside.query_drop("BEGIN").unwrap();
    both(
        &mut beside,
        &mut oracle,
        "UPDATE items SET val = 5 WHERE id = 1",
    );
    let dropping = {
        let mut admin = proxy.connect(Some(&db));
        std::thread::spawn(move || {
            admin
                .query_iter("HSCALE DROP_PARTITION('items', 'three')")
                .map(|answer| answer.affected_rows())
        })
    };
    let mut main = cluster().direct(1, None);
    let started = Instant::now();
    let retired = loop {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the merge never renamed the partition's table"
        );
        let job: Option<u64> = main
            .exec_first(
                "SELECT id FROM hscale.moves WHERE db = ? AND partition_name = 'three'",
                (&db,),
            )
            .unwrap();
        let retired = job.map(|job| format!("_hscale_retired_{job}_items_three"));
        if let Some(retired) = retired.filter(|r| tables_on(1, "hscale").contains(r)) {
            break retired;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let reading = std::thread::spawn(move || {
        let val: mysql::Result<Option<i32>> =
            beside.query_first("SELECT val FROM items WHERE id = 3");
        (beside, val)
    });
    std::thread::sleep(Duration::from_millis(500));
    if reading.is_finished() {
        let (_, val) = reading.join().unwrap();
        panic!("the statement should wait for the switch ({retired} is renamed): {val:?}");
    }
    holder.query_drop("COMMIT").unwrap();
    let (mut beside, val) = reading.join().unwrap();
    let want: Option<i32> = oracle
        .query_first("SELECT val FROM oracle_items WHERE id = 3")
        .unwrap();
    assert_eq!(val.expect("read where the rows went"), want);
    both(
        &mut beside,
        &mut oracle,
        "UPDATE items SET val = 7 WHERE id = 3",
    );
    beside.query_drop("COMMIT").unwrap();
    let moved = dropping.join().unwrap().expect("the merge ends well");
    assert_eq!(moved, 500, "the partition's rows");
    assert_oracle_rows(&mut admin, "items", &mut oracle, seed);
}

/// An instance acknowledges a fence only once none of its sessions is on the
/// fenced partition: a transaction that ran there through hscale keeps
/// running there (its next statement passes the fence) while the move
/// lifts its fence and tries again, and the old table is never renamed
/// under it (no RENAME waits on the source for it, as one did when the
/// instance acknowledged at once). Once it commits, the move ends, with
/// the transaction's changes.
#[test]
fn a_fence_waits_for_the_transactions_of_its_instances_to_leave_the_partition() {
    let seed = seed();
    let proxy = Proxy::for_cluster();
    let (db, mut direct) = odd_items(&proxy, "moves_fence_ack", seed, 2000);
    let mut holder = proxy.connect(Some(&db));
    holder.query_drop("BEGIN").unwrap();
    holder
        .query_drop("UPDATE items SET val = 1 WHERE id = 1")
        .unwrap();
    let mut admin = proxy.connect(Some(&db));
    let job: u64 = admin
        .query_first("HSCALE MOVE_PARTITION('items', 'odd', 2)")
        .unwrap()
        .expect("a job id");
    let mut source = cluster().direct(1, None);
    let renaming = format!("RENAME TABLE `{db}`.%");
    let started = Instant::now();
    let mut fenced_while_open = false;
    while started.elapsed() < Duration::from_secs(4) {
        let waiting: i64 = source
            .exec_first(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE ?",
                (&renaming,),
            )
            .unwrap()
            .unwrap();
        assert_eq!(waiting, 0, "a rename waits for the open transaction");
        fenced_while_open |= move_phase(&mut admin, job).0 == "fencing";
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        fenced_while_open,
        "the move fenced while the transaction was open"
    );
    holder
        .query_drop("UPDATE items SET val = val + 1 WHERE id = 3")
        .expect("the transaction's next statement passes the fence");
    holder.query_drop("COMMIT").unwrap();
    direct
        .query_drop("UPDATE oracle_items SET val = 1 WHERE id = 1")
        .unwrap();
    direct
        .query_drop("UPDATE oracle_items SET val = val + 1 WHERE id = 3")
        .unwrap();
    wait_for_move(&mut admin, job, Duration::from_secs(120));
    let attempts: u64 = job_row(&mut admin, job).get("fence_attempts").unwrap();
    assert!(
        attempts >= 2,
        "the open transaction held fences off: {attempts}"
    );
    let mut destination = cluster().direct(2, Some(&db));
    assert_oracle_rows(&mut destination, "items_odd", &mut direct, seed);
}

/// A move survives the instance that ran it: the instance stops in the
/// middle of the copy (its tasks end where they are, its connections
/// close), and another takes the job over once its heartbeat is older than
/// the lease, raises its epoch and resumes from the checkpoint. Every row
/// is at the destination once, and nowhere else.
#[test]
fn a_move_survives_the_instance_that_ran_it() {
    let seed = seed();
    // The first instance copies at 2,000 rows a second at most: it is still
    // copying (8 s of its 20,000 rows left) when the test, however slowly
    // a loaded machine runs it, stops it after 3,000. Unthrottled, a busy
    // machine let the copy finish between the two (issue 54).
    let (db, mut direct) = {
        let setup = Proxy::for_cluster();
        odd_items(&setup, "moves_takeover", seed, 40_000)
    };
    let mut config = cluster().config();
    config.moves.rows_per_s = 2_000;
    let first = Proxy::start(config);
    let mut admin = first.connect(Some(&db));
    let job: u64 = admin
        .query_first("HSCALE MOVE_PARTITION('items', 'odd', 2)")
        .unwrap()
        .expect("a job id");
    let mut main = cluster().direct(1, None);
    let progress = |main: &mut Conn| -> (u64, u64, String) {
        main.exec_first(
            "SELECT rows_copied, epoch, phase FROM hscale.moves WHERE id = ?",
            (job,),
        )
        .unwrap()
        .unwrap()
    };
    let started = Instant::now();
    while progress(&mut main).0 < 3000 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the copy does not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(admin);
    drop(first);
    let (copied, _, phase) = progress(&mut main);
    assert_eq!(phase, "copying", "stopped during the copy ({copied} rows)");

    let second = Proxy::for_cluster();
    let mut admin = second.connect(Some(&db));
    wait_for_move(&mut admin, job, Duration::from_secs(120));
    let (_, epoch, _) = progress(&mut main);
    assert!(
        epoch >= 2,
        "another instance took the job over (epoch {epoch})"
    );
    let through = values(
        admin
            .query("SELECT * FROM items WHERE id % 2 = 1 ORDER BY id")
            .unwrap(),
    );
    let expected = values(all_rows(&mut direct, "oracle_items"));
    assert_eq!(through.len(), expected.len(), "seed {seed}");
    assert!(through == expected, "seed {seed}");
    let mut two = cluster().direct(2, Some(&db));
    let at_two: u64 = two
        .query_first("SELECT COUNT(*) FROM items_odd")
        .unwrap()
        .unwrap();
    assert_eq!(at_two as usize, expected.len());
    assert!(!tables_on(1, &db).contains(&"items_odd".to_string()));
    let progress_rows: u64 = two
        .exec_first(
            "SELECT COUNT(*) FROM hscale.move_progress WHERE job = ?",
            (job,),
        )
        .unwrap()
        .unwrap();
    assert_eq!(progress_rows, 0, "the checkpoint is forgotten");
}

/// Moves one instance runs at once share its own connections to a
/// backend (a move holds several on its source): a move that finds none
/// free waits for them, as for a server that went away, and goes on from
/// its checkpoint; every move ends with all its rows at the destination.
#[test]
fn moves_run_at_once_by_one_instance_wait_for_its_connections() {
    let seed = seed();
    let mut config = cluster().config();
    config.moves.rows_per_s = 3000;
    let proxy = Proxy::start(config);
    let tables: Vec<(String, Conn)> = (0..4)
        .map(|i| odd_items(&proxy, &format!("moves_at_once_{i}"), seed + i, 12_000))
        .collect();
    let mut admins: Vec<(Conn, u64)> = tables
        .iter()
        .map(|(db, _)| {
            let mut admin = proxy.connect(Some(db));
            let job: u64 = admin
                .query_first("HSCALE MOVE_PARTITION('items', 'odd', 2)")
                .unwrap()
                .expect("a job id");
            (admin, job)
        })
        .collect();
    for ((admin, job), (db, direct)) in admins.iter_mut().zip(tables) {
        wait_for_move(admin, *job, Duration::from_secs(180));
        let mut destination = cluster().direct(2, Some(&db));
        let mut direct = direct;
        assert_oracle_rows(&mut destination, "items_odd", &mut direct, seed);
    }
}

/// CANCEL_MOVE stops a move before its switch: the job ends `cancelled`,
/// the tables it wrote are gone, the partition is served from where it was
/// and takes writes; a job that is over cannot be cancelled.
#[test]
fn a_cancelled_move_leaves_the_partition_where_it_was() {
    let seed = seed();
    let proxy = Proxy::for_cluster();
    let (db, mut direct) = odd_items(&proxy, "moves_cancel", seed, 30_000);
    let mut admin = proxy.connect(Some(&db));
    let before = values(all_rows(&mut admin, "items"));
    let job: u64 = admin
        .query_first("HSCALE MOVE_PARTITION('items', 'odd', 2)")
        .unwrap()
        .expect("a job id");
    let started = Instant::now();
    loop {
        let rows: Vec<Row> = admin.query("HSCALE SHOW_MOVES").unwrap();
        let copied: u64 = rows
            .iter()
            .find(|r| r.get::<u64, _>("job") == Some(job))
            .and_then(|r| r.get("rows_copied"))
            .unwrap();
        if copied >= 1000 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(10));
    }
    admin
        .query_drop(format!("HSCALE CANCEL_MOVE({job})"))
        .unwrap();
    let started = Instant::now();
    let (phase, error) = loop {
        let (phase, error) = move_phase(&mut admin, job);
        if phase != "copying" && phase != "catching_up" && phase != "fencing" {
            break (phase, error);
        }
        assert!(started.elapsed() < Duration::from_secs(60), "still {phase}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(phase, "cancelled", "{error:?}");
    assert!(!tables_on(2, &db).contains(&"items_odd".to_string()));
    assert!(tables_on(1, &db).contains(&"items_odd".to_string()));
    assert_eq!(values(all_rows(&mut admin, "items")), before);
    admin
        .query_drop("UPDATE items SET val = 7 WHERE id = 1")
        .unwrap();
    let val: i32 = direct
        .query_first("SELECT val FROM items_odd WHERE id = 1")
        .unwrap()
        .unwrap();
    assert_eq!(val, 7, "the partition is written where it was");
    let refused = admin.query_drop(format!("HSCALE CANCEL_MOVE({job})"));
    assert!(
        matches!(refused, Err(mysql::Error::MySqlError(ref e)) if e.code == 1210),
        "{refused:?}"
    );
}

/// The kill matrix: a move (of a partition or of the default table), a
/// split or a merge (DROP_PARTITION) runs on one instance while a second
/// serves a writer on the moving and the staying rows; the first is stopped
/// at a random moment (its tasks end where they are, its connections close,
/// as a SIGKILL leaves the servers), the second takes the job over once its
/// heartbeat is older than the lease, and the job ends. Afterwards the rows
/// read through hscale are the oracle's, and on the backends every row is in
/// one physical table: none lost, none in two. `HSCALE_KILL_RUNS` runs (6 by
/// default), each with its own seed printed.
#[test]
fn a_job_whose_instance_stops_at_any_moment_is_taken_over_and_loses_nothing() {
    let runs: u64 = std::env::var("HSCALE_KILL_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(6);
    let seed = seed();
    let mut stopped_in = Vec::new();
    for run in 0..runs {
        stopped_in.push(kill_run(run, seed.wrapping_add(run)));
    }
    println!("stopped in: {stopped_in:?}");
}

/// One run of the kill matrix; the phase the job was in when its instance
/// stopped, and what the job did.
fn kill_run(run: u64, seed: u64) -> (String, &'static str) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let work = ["move", "split", "move default", "drop"][rng.random_range(0..4)];
    let split = work == "split";
    let db = cluster().database(&format!("moves_kill_{run}"));
    let serving = Proxy::for_cluster();
    let partitions: &[&str] = if split { &[] } else { &["'odd', 1, 1"] };
    let mut admin = items(&serving, &db, "MOD(2)", partitions);
    let mut oracle = cluster().direct(1, Some(&db));
    load(&mut admin, &mut oracle, &mut rng, 6000);
    let stop = Arc::new(AtomicBool::new(false));
    let writes = writer(
        &serving,
        &db,
        seed ^ 5,
        |rng| rng.random_range(0..6000i64),
        &stop,
    );

    // The mover copies about 4,000 rows a second, so that a stop lands in
    // every phase; the instance that takes over copies at full speed.
    let mut config = cluster().config();
    config.moves.rows_per_s = 4000;
    let mover = Proxy::start(config);
    let mut on_mover = mover.connect(Some(&db));
    let mut main = cluster().direct(1, None);
    // The job this run starts, not one of the partitions' set-up.
    let earlier: u64 = main
        .exec_first(
            "SELECT COALESCE(MAX(id), 0) FROM hscale.moves WHERE db = ?",
            (&db,),
        )
        .unwrap()
        .unwrap();
    let job_of = |main: &mut Conn| -> Option<(u64, String)> {
        main.exec_first(
            "SELECT id, phase FROM hscale.moves WHERE db = ? AND id > ? ORDER BY id DESC LIMIT 1",
            (&db, earlier),
        )
        .unwrap()
    };
    // Its client loses the instance; the job goes on elsewhere.
    let client = match work {
        "split" => Some(std::thread::spawn(move || {
            let _ = on_mover.query_drop("HSCALE ADD_PARTITION('items', 'odd', 1, 2)");
        })),
        "drop" => Some(std::thread::spawn(move || {
            let _ = on_mover.query_drop("HSCALE DROP_PARTITION('items', 'odd')");
        })),
        _ => {
            let partition = match work {
                "move" => "odd",
                _ => "(default)",
            };
            on_mover
                .query_drop(format!("HSCALE MOVE_PARTITION('items', '{partition}', 2)"))
                .unwrap();
            None
        }
    };
    let started = Instant::now();
    while job_of(&mut main).is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no job (seed {seed})"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // A random moment, or the first sight of a phase.
    let target = ["", "catching_up", "fencing", "switched"][rng.random_range(0..4)];
    match target {
        "" => std::thread::sleep(Duration::from_millis(rng.random_range(0..1500))),
        phase => {
            let started = Instant::now();
            while !job_of(&mut main).is_some_and(|(_, p)| {
                p == phase || matches!(p.as_str(), "done" | "failed" | "cancelled")
            }) {
                assert!(started.elapsed() < Duration::from_secs(60), "seed {seed}");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    let (job, stopped_in) = job_of(&mut main).unwrap();
    drop(mover);
    if let Some(client) = client {
        client.join().unwrap();
    }

    let started = Instant::now();
    let ended = loop {
        let (_, phase) = job_of(&mut main).unwrap();
        if matches!(phase.as_str(), "done" | "failed" | "cancelled") {
            break phase;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "job {job} still {phase} (seed {seed}, stopped in {stopped_in})"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    stop.store(true, Ordering::Relaxed);
    assert!(writes.join().unwrap() > 0);
    let context = format!("seed {seed}, {work}, stopped in {stopped_in}, ended {ended}");
    assert_eq!(ended, "done", "{context}");
    let through = values(all_rows(&mut admin, "items"));
    let expected = values(all_rows(&mut oracle, "oracle_items"));
    if through != expected {
        let ids = |rows: &[Vec<mysql::Value>]| -> std::collections::BTreeSet<i64> {
            rows.iter()
                .map(|r| mysql::from_value(r[0].clone()))
                .collect()
        };
        let (got, want) = (ids(&through), ids(&expected));
        let extra: Vec<_> = got.difference(&want).collect();
        let missing: Vec<_> = want.difference(&got).collect();
        let changed: Vec<_> = through
            .iter()
            .filter(|r| expected.iter().any(|e| e[0] == r[0] && e != *r))
            .map(|r| r[0].clone())
            .collect();
        panic!("rows differ: {context}: extra {extra:?}, missing {missing:?}, changed {changed:?}");
    }
    // Every row in one physical table of the database, on either backend.
    let mut physical = 0;
    for backend in [1, 2] {
        let mut conn = cluster().direct(backend, Some(&db));
        for table in tables_on(backend, &db) {
            if table.starts_with("items") {
                let rows: u64 = conn
                    .query_first(format!("SELECT COUNT(*) FROM `{table}`"))
                    .unwrap()
                    .unwrap();
                physical += rows as usize;
            }
        }
    }
    assert_eq!(
        physical,
        expected.len(),
        "a row lost or in two tables: {context}"
    );
    let on_two: &[&str] = match work {
        "move default" => &["items_default"],
        "drop" => &[],
        _ => &["items_odd"],
    };
    assert_eq!(tables_on(2, &db), on_two, "{context}");
    if work == "drop" {
        assert_eq!(
            tables_on(1, &db),
            ["items_default", "oracle_items"],
            "{context}"
        );
    }
    (stopped_in, work)
}

/// `[moves] rows_per_s` holds the copy to its rate, and the old table of a
/// move is dropped once `[moves] retired_retention_s` has passed.
#[test]
fn a_move_keeps_its_rate_and_its_retired_table_goes_after_the_retention() {
    let seed = seed();
    let mut config = cluster().config();
    config.moves.rows_per_s = 2000;
    config.moves.retired_retention_s = 0;
    // A dictionary of its own: its sweep must not drop other tests' tables.
    config.dictionary.schema = "hscale_polite".into();
    let proxy = Proxy::start(config);
    let db = cluster().database("moves_polite");
    let mut admin = items(&proxy, &db, "MOD(2)", &["'odd', 1, 1"]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut oracle = cluster().direct(1, Some(&db));
    // 3,000 odd rows: three chunks, at 2,000 rows a second.
    load(&mut admin, &mut oracle, &mut rng, 6000);
    let started = Instant::now();
    let job: u64 = admin
        .query_first("HSCALE MOVE_PARTITION('items', 'odd', 2)")
        .unwrap()
        .expect("a job id");
    wait_for_move(&mut admin, job, Duration::from_secs(120));
    assert!(
        started.elapsed() >= Duration::from_millis(1400),
        "3,000 rows at 2,000 a second took {:?}",
        started.elapsed()
    );
    let retired = format!("_hscale_retired_{job}_items_odd");
    let started = Instant::now();
    let retired_of = |admin: &mut Conn| -> Option<String> {
        let rows: Vec<Row> = admin.query("HSCALE SHOW_MOVES").unwrap();
        rows.into_iter()
            .find(|r| r.get::<u64, _>("job") == Some(job))
            .and_then(|r| r.get::<Option<String>, _>("retired_table").unwrap())
    };
    while retired_of(&mut admin).is_some() || tables_on(1, "hscale_polite").contains(&retired) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{retired} is kept"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        values(all_rows(&mut admin, "items")),
        values(all_rows(&mut oracle, "oracle_items"))
    );
}

/// Rows written straight to the destination while the copy runs (not
/// through hscale, so not in the source) are found by the chunk checksums,
/// or past the copy's last key, and removed: the partition reads as the
/// oracle afterwards. While the table moves, DDL and DROP_PARTITION through
/// hscale are refused with the job's id.
#[test]
fn verification_repairs_a_destination_changed_behind_the_move() {
    let seed = seed();
    let mut config = cluster().config();
    config.moves.rows_per_s = 2000;
    let proxy = Proxy::start(config);
    let db = cluster().database("moves_repair");
    let mut admin = items(&proxy, &db, "MOD(2)", &["'odd', 1, 1"]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut oracle = cluster().direct(1, Some(&db));
    load(&mut admin, &mut oracle, &mut rng, 6000);
    both(&mut admin, &mut oracle, "DELETE FROM items WHERE id = 3001");
    let job: u64 = admin
        .query_first("HSCALE MOVE_PARTITION('items', 'odd', 2)")
        .unwrap()
        .expect("a job id");
    // The copy's second chunk (ids 2001 to 3999) starts half a second on.
    let mut two = cluster().direct(2, Some(&db));
    for id in [3001, 9_999_999] {
        two.query_drop(format!(
            "INSERT INTO items_odd VALUES {}",
            random_row(&mut rng, id)
        ))
        .unwrap();
    }
    for sql in [
        "ALTER TABLE items ADD COLUMN extra INT",
        "HSCALE DROP_PARTITION('items', 'odd')",
        "HSCALE MOVE_PARTITION('items', '(default)', 2)",
    ] {
        let (code, message) = refusal(&mut admin, sql);
        assert_eq!(code, 1210, "{sql}: {message}");
        assert!(message.contains(&format!("job {job}")), "{sql}: {message}");
    }
    wait_for_move(&mut admin, job, Duration::from_secs(120));
    let rows: Vec<Row> = admin.query("HSCALE SHOW_MOVES").unwrap();
    let repaired: u64 = rows
        .iter()
        .find(|r| r.get::<u64, _>("job") == Some(job))
        .and_then(|r| r.get("chunks_repaired"))
        .unwrap();
    assert!(repaired >= 2, "the chunk of 3001 and the tail: {repaired}");
    assert_eq!(
        values(all_rows(&mut admin, "items")),
        values(all_rows(&mut oracle, "oracle_items")),
        "seed {seed}"
    );
}

/// The bank-transfer invariant: 1,000 accounts, clients of two instances
/// moving money between accounts of one partition inside transactions, a
/// split (ADD_PARTITION through one instance) and then a move (through the
/// other) of the partition they write; the total read through hscale is the
/// same at every sample, and at the end every balance is an oracle's.
#[test]
fn money_is_neither_made_nor_lost_while_a_partition_splits_and_moves() {
    const ACCOUNTS: i64 = 1000;
    const TOTAL: i64 = ACCOUNTS * 1000;
    let seed = seed();
    let db = cluster().database("moves_bank");
    let mut direct = cluster().direct(1, Some(&db));
    for table in ["accounts", "oracle_accounts"] {
        direct
            .query_drop(format!(
                "CREATE TABLE {table} (id INT PRIMARY KEY, balance BIGINT NOT NULL)"
            ))
            .unwrap();
        direct
            .query_drop(format!(
                "INSERT INTO {table} SELECT seq, 1000 FROM seq_1_to_{ACCOUNTS}"
            ))
            .unwrap();
    }
    let (first, second) = (Proxy::for_cluster(), Proxy::for_cluster());
    let mut admin = first.connect(Some(&db));
    admin
        .query_drop("HSCALE SETUP_TABLE('accounts', 'id', 'accounts_default', 1, 'MOD(2)')")
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for client in 0..4u64 {
        let proxy = if client % 2 == 0 { &first } else { &second };
        let mut conn = proxy.connect(Some(&db));
        let mut oracle = cluster().direct(1, Some(&db));
        let stop = Arc::clone(&stop);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ client);
        clients.push(std::thread::spawn(move || {
            let mut transfers = 0;
            while !stop.load(Ordering::Relaxed) {
                // Two accounts of one parity: one partition, one backend.
                let parity = rng.random_range(0..2i64);
                let from = rng.random_range(0..ACCOUNTS / 2) * 2 + 1 + parity;
                let to = rng.random_range(0..ACCOUNTS / 2) * 2 + 1 + parity;
                let amount = rng.random_range(1..50i64);
                if from == to || from > ACCOUNTS || to > ACCOUNTS {
                    continue;
                }
                let transfer = [
                    "BEGIN".to_string(),
                    format!("UPDATE accounts SET balance = balance - {amount} WHERE id = {from}"),
                    format!("UPDATE accounts SET balance = balance + {amount} WHERE id = {to}"),
                    "COMMIT".to_string(),
                ];
                let done = transfer.iter().try_for_each(|sql| conn.query_drop(sql));
                match done {
                    Ok(()) => {
                        for (id, delta) in [(from, -amount), (to, amount)] {
                            oracle
                                .query_drop(format!(
                                    "UPDATE oracle_accounts SET balance = balance + {delta} WHERE id = {id}"
                                ))
                                .unwrap();
                        }
                        transfers += 1;
                    }
                    // A deadlock rolled the transfer back: it did not happen.
                    Err(mysql::Error::MySqlError(e)) if e.code == 1213 => {
                        let _ = conn.query_drop("ROLLBACK");
                    }
                    Err(e) => panic!("a transfer failed: {e}"),
                }
            }
            transfers
        }));
    }
    let sampler = {
        let (stop, mut a, mut b) = (
            Arc::clone(&stop),
            first.connect(Some(&db)),
            second.connect(Some(&db)),
        );
        std::thread::spawn(move || {
            let mut samples = 0;
            while !stop.load(Ordering::Relaxed) {
                let conn = if samples % 2 == 0 { &mut a } else { &mut b };
                let (total, count): (i64, i64) = conn
                    .query_first("SELECT SUM(balance), COUNT(*) FROM accounts")
                    .unwrap()
                    .unwrap();
                assert_eq!((total, count), (TOTAL, ACCOUNTS), "sample {samples}");
                samples += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            samples
        })
    };
    admin
        .query_drop("HSCALE ADD_PARTITION('accounts', 'odd', 1, 2)")
        .unwrap();
    let mut other = second.connect(Some(&db));
    let job: u64 = other
        .query_first("HSCALE MOVE_PARTITION('accounts', 'odd', 1)")
        .unwrap()
        .expect("a job id");
    wait_for_move(&mut other, job, Duration::from_secs(120));
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    let transfers: usize = clients.into_iter().map(|c| c.join().unwrap()).sum();
    let samples = sampler.join().unwrap();
    assert!(
        transfers > 50 && samples > 10,
        "{transfers} transfers, {samples} samples"
    );
    let through: Vec<(i64, i64)> = admin
        .query("SELECT id, balance FROM accounts ORDER BY id")
        .unwrap();
    let expected: Vec<(i64, i64)> = direct
        .query("SELECT id, balance FROM oracle_accounts ORDER BY id")
        .unwrap();
    assert_eq!(through, expected, "seed {seed}");
}

/// The moves of `a_move_waits_for_a_server_that_went_away`: which server
/// dies (the one the rows leave or the one they go to) and when (in the
/// copy, or in the fence after the old table was renamed).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Killed {
    DestinationInCopy,
    DestinationInFence,
    SourceInCopy,
    SourceInFence,
}

/// The job's row of SHOW_MOVES.
fn job_row(admin: &mut Conn, job: u64) -> Row {
    let rows: Vec<Row> = admin.query("HSCALE SHOW_MOVES").unwrap();
    rows.into_iter()
        .find(|r| r.get::<u64, _>("job") == Some(job))
        .expect("the job is listed")
}

/// The newest job of `db`'s table in the dictionary `schema`, once there
/// is one newer than `after`.
fn job_after(schema: &str, db: &str, after: u64) -> u64 {
    let mut main = cluster().direct(1, None);
    let started = Instant::now();
    loop {
        let job: Option<u64> = main
            .exec_first(
                format!(
                    "SELECT MAX(id) FROM `{schema}`.moves WHERE db = ? AND table_name = 'items'"
                ),
                (db,),
            )
            .unwrap()
            .flatten();
        if let Some(job) = job.filter(|j| *j > after) {
            return job;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no job for {db}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

const SERVER_KILLED_SCHEMA: &str = "hscale_server_killed";

/// SIGKILL of a MariaDB server a move reads or writes, in its copy and in
/// its fence; the server restarts on its data a few seconds later. The job
/// waits for it (SHOW_MOVES' last_error says so), a fence it held is undone
/// so that the source serves meanwhile, and it goes on from its checkpoint
/// and ends `done`. A writer through hscale changes the moving rows (and an
/// oracle) before, during and after, pausing only while a server it writes
/// is down; at the end the rows read through hscale and on the servers
/// directly are the oracle's, each in one table. A fence is held open past
/// the rename by a client that locks the default table's rows on the server
/// (the merge's last step waits for it), so the kill lands inside it.
#[test]
fn a_move_waits_for_a_server_that_went_away() {
    let seed = seed();
    let (mut server, dir) = hscale_testkit::scratch_server("moves_server_killed");
    let mut config = cluster().config();
    let mut third = config.backends[0].clone();
    third.id = 3;
    third.address = server.address();
    config.backends.push(third);
    config.proxy.connect_timeout_ms = 1000;
    config.dictionary.lock_wait_ms = 60_000;
    // A dictionary of its own: other tests' instances know no backend 3.
    config.dictionary.schema = SERVER_KILLED_SCHEMA.into();
    // Copies that last long enough to be killed in.
    config.moves.rows_per_s = 3000;
    let proxy = Proxy::start(config);
    for (run, killed) in [
        Killed::DestinationInCopy,
        Killed::DestinationInFence,
        Killed::SourceInCopy,
        Killed::SourceInFence,
    ]
    .into_iter()
    .enumerate()
    {
        println!("{killed:?}");
        kill_a_server_of_a_move(&proxy, &mut server, killed, seed + run as u64);
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

fn kill_a_server_of_a_move(
    proxy: &Proxy,
    server: &mut hscale::mariadb::LocalServer,
    killed: Killed,
    seed: u64,
) {
    let db = cluster().database(&format!("moves_killed_{}", killed as u8));
    let mut third = hscale_testkit::connect(server.port, "root", "", None);
    third
        .query_drop(format!("DROP DATABASE IF EXISTS `{db}`"))
        .unwrap();
    third.query_drop(format!("CREATE DATABASE `{db}`")).unwrap();
    let (port, name) = (server.port, db.clone());
    let connect = move |backend: usize, db: &str| match backend {
        3 => hscale_testkit::connect(port, "root", "", Some(db)),
        b => cluster().direct(b, Some(db)),
    };
    let direct = move |backend: usize| connect(backend, &name);
    // Where the default table and the odd partition live, and what moves:
    // the odd partition to another server, or into the default table.
    let (default_on, odd_on, command) = match killed {
        Killed::DestinationInCopy => (1, 1, "HSCALE MOVE_PARTITION('items', 'odd', 3)"),
        Killed::DestinationInFence => (3, 1, "HSCALE DROP_PARTITION('items', 'odd')"),
        Killed::SourceInCopy => (1, 3, "HSCALE MOVE_PARTITION('items', 'odd', 2)"),
        Killed::SourceInFence => (1, 3, "HSCALE DROP_PARTITION('items', 'odd')"),
    };
    direct(default_on).query_drop(ITEMS).unwrap();
    let mut oracle = cluster().direct(1, Some(&db));
    oracle
        .query_drop(ITEMS.replace("items", "oracle_items"))
        .unwrap();
    let mut admin = proxy.connect(Some(&db));
    admin
        .query_drop(format!(
            "HSCALE SETUP_TABLE('items', 'id', 'items_default', {default_on}, 'MOD(2)')"
        ))
        .unwrap();
    admin
        .query_drop(format!("HSCALE ADD_PARTITION('items', 'odd', 1, {odd_on})"))
        .unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    // Each statement on one server.
    for start in (0..8000).step_by(500) {
        for parity in [0, 1] {
            let rows: Vec<String> = (start..start + 500)
                .filter(|id| id % 2 == parity)
                .map(|id| random_row(&mut rng, id))
                .collect();
            let sql = format!("INSERT INTO items VALUES {}", rows.join(", "));
            both(&mut admin, &mut oracle, &sql);
        }
    }
    let writing = |seed| {
        let stop = Arc::new(AtomicBool::new(false));
        let odd = |rng: &mut rand::rngs::StdRng| rng.random_range(0..4000i64) * 2 + 1;
        (writer(proxy, &db, seed, odd, &stop), stop)
    };
    let stop_writing = |(writer, stop): (std::thread::JoinHandle<usize>, Arc<AtomicBool>)| {
        stop.store(true, Ordering::Relaxed);
        writer.join().expect("the writer's statements succeed")
    };
    let in_fence = matches!(killed, Killed::DestinationInFence | Killed::SourceInFence);
    // The merge's last step, an INSERT into the default table, waits for
    // this client's locks on its rows.
    let mut holder = direct(default_on);
    if in_fence {
        holder.query_drop("BEGIN").unwrap();
        holder
            .query_drop("SELECT COUNT(*) FROM items_default FOR UPDATE")
            .unwrap();
    }
    let mut writes = writing(seed ^ 1);
    let set_up = job_after(SERVER_KILLED_SCHEMA, &db, 0);
    let moving = {
        let mut admin = proxy.connect(Some(&db));
        std::thread::spawn(move || admin.query_iter(command).map(drop))
    };
    let job = job_after(SERVER_KILLED_SCHEMA, &db, set_up);
    let started = Instant::now();
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "never reached the moment to kill"
        );
        let row = job_row(&mut admin, job);
        let (phase, rows): (String, u64) =
            (row.get("phase").unwrap(), row.get("rows_copied").unwrap());
        assert!(
            !matches!(phase.as_str(), "done" | "failed"),
            "the job ended {phase} first"
        );
        // In the fence, the merge's last step: its INSERT waits for the
        // holder, with the old table renamed and its last changes applied.
        let merging: i64 = connect(default_on, "information_schema")
            .exec_first(
                "SELECT COUNT(*) FROM PROCESSLIST WHERE INFO LIKE ?",
                (format!("INSERT INTO `{db}`.`items_default` SELECT%"),),
            )
            .unwrap()
            .unwrap();
        if (in_fence && merging > 0) || (!in_fence && phase == "copying" && rows > 0) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let source_killed = matches!(killed, Killed::SourceInCopy | Killed::SourceInFence);
    // The writer writes the source (odd rows): it pauses while that is down.
    if killed == Killed::SourceInCopy {
        stop_writing(writes);
        writes = (std::thread::spawn(|| 0), Arc::new(AtomicBool::new(true)));
    }
    server.kill();
    if killed == Killed::SourceInFence {
        // Everything the merge needs from the source was read before its
        // last step: it ends without it.
        holder.query_drop("COMMIT").unwrap();
        moving.join().unwrap().expect("the merge ends");
        server.restart().unwrap();
    } else {
        std::thread::sleep(Duration::from_secs(3));
        let (_, why) = move_phase(&mut admin, job);
        assert!(
            why.as_deref()
                .is_some_and(|w| w.contains("waiting for a server")),
            "{why:?}"
        );
        server.restart().unwrap();
        if source_killed {
            stop_writing(writes);
            writes = writing(seed ^ 2);
        }
        let ended = moving.join().unwrap();
        if killed == Killed::DestinationInFence {
            ended.expect("the merge ends");
        } else {
            ended.unwrap();
        }
    }
    wait_for_move(&mut admin, job, Duration::from_secs(120));
    let written = stop_writing(writes);
    println!("{written} writes through hscale");
    assert_oracle_rows(&mut admin, "items", &mut oracle, seed);
    // On the servers: the odd rows in the one table the dictionary names.
    let (odd_table, odd_server) = match killed {
        Killed::DestinationInCopy => ("items_odd", 3),
        Killed::SourceInCopy => ("items_odd", 2),
        _ => ("items_default", default_on),
    };
    let odd_rows: i64 = direct(odd_server)
        .query_first(format!("SELECT COUNT(*) FROM {odd_table} WHERE id % 2 = 1"))
        .unwrap()
        .unwrap();
    let oracle_odd: i64 = oracle
        .query_first("SELECT COUNT(*) FROM oracle_items WHERE id % 2 = 1")
        .unwrap()
        .unwrap();
    assert_eq!(
        odd_rows, oracle_odd,
        "each odd row once, where the dictionary says"
    );
    for backend in [1, 2, 3] {
        let tables: Vec<String> = direct(backend).query("SHOW TABLES").unwrap();
        let odd_here = tables.contains(&"items_odd".to_string());
        assert_eq!(
            odd_here,
            (odd_table, odd_server) == ("items_odd", backend),
            "items_odd on backend {backend}: {tables:?}"
        );
    }
}

/// SIGSTOP of another instance, a `hscale serve` process, past its lease
/// while a split catches up and fences: the mover's fence is not
/// acknowledged by the stopped instance, so it is lifted and tried again
/// until the stopped instance's heartbeat is older than the lease, and the
/// split then ends without it. Woken (SIGCONT), the instance refuses what
/// it would route by its stale dictionary until it has read the new one:
/// no write of its clients lands in the split's rest under the old table's
/// name, where no one would read it. A client writes the moving and the
/// staying rows through the stopped instance all along, and an oracle what
/// it acknowledged.
#[test]
fn an_instance_stopped_past_its_lease_is_fenced_out_and_loses_nothing() {
    let seed = seed();
    let proxy = Proxy::for_cluster();
    let db = cluster().database("moves_stopped_instance");
    let mut admin = items(&proxy, &db, "MOD(4)", &[]);
    let mut oracle = cluster().direct(1, Some(&db));
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    load(&mut admin, &mut oracle, &mut rng, 4000);
    let port = hscale::mariadb::free_port().unwrap();
    let config = hscale_testkit::serve_config("moves_stopped_instance", port, "", "hscale", 5000);
    /// The instance's process, ended with the test however it ends.
    struct Serve(std::process::Child);
    impl Drop for Serve {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stopped = Serve(
        std::process::Command::new(env!("CARGO_BIN_EXE_hscale"))
            .args(["serve", "--config", config.to_str().unwrap()])
            .spawn()
            .unwrap(),
    );
    let started = Instant::now();
    let mut through_stopped = loop {
        let opts = hscale_testkit::opts(port, "root", "", Some(&db))
            .read_timeout(Some(Duration::from_secs(30)));
        match mysql::Conn::new(opts) {
            Ok(conn) => break conn,
            Err(e) => {
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "hscale serve: {e}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    // The instance is stopped between two of the client's statements (one
    // in flight past the lease check when the process stops can still
    // reach the old table: docs/moves.md); the next is sent while it is
    // stopped and read when it runs again.
    let (hold, held) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let written = {
        let stop = Arc::clone(&stop);
        let (hold, held) = (Arc::clone(&hold), Arc::clone(&held));
        let mut oracle = cluster().direct(1, Some(&db));
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 7);
        std::thread::spawn(move || {
            let (mut writes, mut refused) = (0, 0);
            let mut log: Vec<(i64, String)> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                if hold.load(Ordering::SeqCst) {
                    held.store(true, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                }
                // Mostly the split value's rows: a stale write of one is
                // what would vanish.
                let id = match rng.random_range(0..4) {
                    0 => rng.random_range(0..4000i64),
                    _ => rng.random_range(0..1000i64) * 4 + 3,
                };
                let sql = match rng.random_range(0..3) {
                    0 => format!("REPLACE INTO items VALUES {}", random_row(&mut rng, id)),
                    1 => format!("DELETE FROM items WHERE id = {id}"),
                    _ => format!("UPDATE items SET val = val + 1, note = 'upd' WHERE id = {id}"),
                };
                let outcome = through_stopped.query_drop(&sql);
                let what: String = sql.chars().take(24).collect();
                log.push((id, format!("{what} -> {outcome:?}")));
                match outcome {
                    Ok(()) => {
                        oracle
                            .query_drop(sql.replace("items", "oracle_items"))
                            .unwrap();
                        writes += 1;
                    }
                    // Refused before it reached a table: not written.
                    Err(mysql::Error::MySqlError(e))
                        if e.code == 1146
                            || e.code == 1205
                            || e.code == 1105 && e.message.contains("within its lease") =>
                    {
                        refused += 1
                    }
                    Err(e) => panic!("{sql}: {e}"),
                }
            }
            (writes, refused, log)
        })
    };
    let splitting = {
        let mut admin = proxy.connect(Some(&db));
        std::thread::spawn(move || {
            admin
                .query_iter("HSCALE ADD_PARTITION('items', 'three', 3, 2)")
                .map(drop)
        })
    };
    let job = job_after("hscale", &db, 0);
    let started = Instant::now();
    while move_phase(&mut admin, job).0 == "copying" {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the split never caught up"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let pid = stopped.0.id().to_string();
    hold.store(true, Ordering::SeqCst);
    while !held.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(1));
    }
    hscale_testkit::run_program("kill", &["-STOP", &pid]);
    hold.store(false, Ordering::SeqCst);
    let paused = Instant::now();
    while !splitting.is_finished() {
        assert!(
            paused.elapsed() < Duration::from_secs(60),
            "the split did not end while the instance was stopped"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let waited = paused.elapsed();
    splitting
        .join()
        .unwrap()
        .expect("the split ends while the instance is stopped");
    hscale_testkit::run_program("kill", &["-CONT", &pid]);
    let attempts: u64 = job_row(&mut admin, job).get("fence_attempts").unwrap();
    assert!(
        // Its heartbeat was a refresh or so old when it stopped.
        attempts >= 2 && waited >= Duration::from_millis(4000),
        "the fence waited for the stopped instance's lease: {attempts} attempts in {waited:?}"
    );
    // It serves again once it has read the dictionary.
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    let (writes, refused, log) = written.join().unwrap();
    drop(stopped);
    let _ = std::fs::remove_dir_all(config.parent().expect("its folder"));
    assert!(writes > 0, "{writes} writes, {refused} refused");
    let ids = |conn: &mut Conn, table: &str| -> Vec<i64> {
        conn.query(format!("SELECT id FROM {table} ORDER BY id"))
            .unwrap()
    };
    let (through_ids, oracle_ids) = (ids(&mut admin, "items"), ids(&mut oracle, "oracle_items"));
    for id in through_ids
        .iter()
        .filter(|i| !oracle_ids.contains(i))
        .chain(oracle_ids.iter().filter(|i| !through_ids.contains(i)))
    {
        let ops: Vec<&String> = log
            .iter()
            .filter(|(i, _)| i == id)
            .map(|(_, op)| op)
            .collect();
        println!("id {id} differs; the client's statements on it: {ops:#?}");
    }
    assert_oracle_rows(&mut admin, "items", &mut oracle, seed);
    let misplaced: i64 = oracle
        .query_first("SELECT COUNT(*) FROM items_default WHERE id % 4 = 3")
        .unwrap()
        .unwrap();
    assert_eq!(
        misplaced, 0,
        "a row of the split value in the rest (seed {seed})"
    );
    let moved: i64 = cluster()
        .direct(2, Some(&db))
        .query_first("SELECT COUNT(*) FROM items_three WHERE id % 4 = 3")
        .unwrap()
        .unwrap();
    let want: i64 = oracle
        .query_first("SELECT COUNT(*) FROM oracle_items WHERE id % 4 = 3")
        .unwrap()
        .unwrap();
    assert_eq!(moved, want);
}

/// A poll of the dictionary that read it before a move's fence (or its
/// switch) and ends after the move's own read installed it does not serve
/// its older snapshot again: the instance acknowledged the fence, and a
/// statement planned by the older snapshot would go to the partition's old
/// table after the move renamed it away (error 1146; seen in the third
/// `make test` run in a row beside two busy loops, issue 54). Every poll of
/// the instance pauses 300 ms between its read and its install
/// (`HSCALE_FAILPOINT=dictionary_poll_before_install:300`) while the
/// dictionary's version is bumped every 40 ms, so that a poll is often
/// in flight when a move fences and switches; the partition moves ten
/// times, a client writes its rows through the instance all along, and
/// none of its writes fails. Before the fix, one run in three got 1146 for
/// about 1% of its writes.
#[test]
fn a_poll_that_ends_after_a_newer_read_does_not_take_a_fence_back() {
    let seed = seed();
    let db = cluster().database("moves_late_poll");
    let setup = Proxy::for_cluster();
    let mut admin = items(&setup, &db, "MOD(2)", &["'odd', 1, 1"]);
    let mut oracle = cluster().direct(1, Some(&db));
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    load(&mut admin, &mut oracle, &mut rng, 2000);
    let late = hscale_testkit::Serve::start(
        env!("CARGO_BIN_EXE_hscale"),
        "moves_late_poll",
        "dictionary_poll_before_install:300",
        "",
        "hscale",
    );
    let mut mover = late.connect(&db);
    let stop = Arc::new(AtomicBool::new(false));
    let bumps = {
        let stop = Arc::clone(&stop);
        let mut main = cluster().direct(1, None);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                main.query_drop("UPDATE hscale.version SET version = version + 1 WHERE id = 1")
                    .unwrap();
                std::thread::sleep(Duration::from_millis(40));
            }
        })
    };
    let written = {
        let stop = Arc::clone(&stop);
        let mut through = late.connect(&db);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 3);
        std::thread::spawn(move || {
            let (mut writes, mut failed) = (0, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                let id = rng.random_range(0..1000i64) * 2 + 1;
                let sql = format!("UPDATE items SET val = val + 1 WHERE id = {id}");
                match through.query_drop(&sql) {
                    Ok(()) => writes += 1,
                    Err(e) => failed.push(format!("{sql}: {e}")),
                }
            }
            (writes, failed)
        })
    };
    for destination in [2, 1].repeat(5) {
        let job: u64 = mover
            .query_first(format!(
                "HSCALE MOVE_PARTITION('items', 'odd', {destination})"
            ))
            .unwrap()
            .expect("a job id");
        wait_for_move(&mut mover, job, Duration::from_secs(120));
    }
    stop.store(true, Ordering::Relaxed);
    bumps.join().unwrap();
    let (writes, failed) = written.join().unwrap();
    assert!(writes > 10, "the client wrote during the moves ({writes})");
    assert!(
        failed.is_empty(),
        "seed {seed}: {} of {} writes failed, the first: {}",
        failed.len(),
        writes + failed.len(),
        failed[0]
    );
}

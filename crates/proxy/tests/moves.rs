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

fn move_phase(admin: &mut Conn, job: u64) -> (String, Option<String>) {
    let rows: Vec<Row> = admin.query("HSCALE SHOW_MOVES").unwrap();
    let row = rows
        .into_iter()
        .find(|r| r.get::<u64, _>("job") == Some(job))
        .expect("the job is listed");
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

#[test]
fn a_partition_moves_while_clients_write_and_no_committed_change_is_lost() {
    let seed = seed();
    let db = cluster().database("moves_live");
    let proxy = Proxy::for_cluster();
    let mut admin = proxy.connect(Some(&db));
    let mut direct = cluster().direct(1, Some(&db));
    direct.query_drop(ITEMS).unwrap();
    direct
        .query_drop(ITEMS.replace("items", "oracle_items"))
        .unwrap();
    admin
        .query_drop("HSCALE SETUP_TABLE('items', 'id', 'items_default', 1, 'MOD(2)')")
        .unwrap();
    admin
        .query_drop("HSCALE ADD_PARTITION('items', 'odd', 1, 1)")
        .unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut oracle = cluster().direct(1, Some(&db));
    for batch in 0..10 {
        let rows: Vec<String> = (0..500)
            .map(|i| random_row(&mut rng, batch * 500 + i))
            .collect();
        both(
            &mut admin,
            &mut oracle,
            &format!("INSERT INTO items VALUES {}", rows.join(", ")),
        );
    }
    // Transactions open before the move, committed while it copies: the
    // writes the issue found lost.
    let mut a = proxy.connect(Some(&db));
    let mut b = proxy.connect(Some(&db));
    a.query_drop("BEGIN").unwrap();
    a.query_drop(format!(
        "INSERT INTO items VALUES {}",
        random_row(&mut rng, 1_000_001)
    ))
    .unwrap();
    b.query_drop("BEGIN").unwrap();
    b.query_drop("UPDATE items SET val = 42 WHERE id = 1")
        .unwrap();

    let job: u64 = admin
        .query_first("HSCALE MOVE_PARTITION('items', 'odd', 2)")
        .unwrap()
        .expect("a job id");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, db) = (Arc::clone(&stop), db.clone());
        let mut through = proxy.connect(Some(&db));
        let mut oracle = cluster().direct(1, Some(&db));
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 1);
        std::thread::spawn(move || {
            let mut writes = 0;
            while !stop.load(Ordering::Relaxed) {
                // Odd ids of the moved partition, but not the two the
                // open transactions write.
                let id = rng.random_range(1..3000i64) * 2 + 1;
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
    };
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
    assert!(on_one.iter().any(|t| t.starts_with("_hscale_retired_")));
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
    admin
        .query_drop("HSCALE ADD_PARTITION('nokey', 'odd', 1, 1)")
        .unwrap();
    let refused = |admin: &mut Conn, sql: &str| match admin.query_drop(sql) {
        Err(mysql::Error::MySqlError(e)) => (e.code, e.message),
        other => panic!("{sql}: expected a refusal, got {other:?}"),
    };
    // A unique key of a nullable column names no row.
    let (code, message) = refused(&mut admin, "HSCALE MOVE_PARTITION('nokey', 'odd', 2)");
    assert_eq!(code, 1235, "{message}");
    assert!(message.contains("neither a primary key"), "{message}");
    let (code, message) = refused(&mut admin, "HSCALE MOVE_PARTITION('nokey', 'odd', 1)");
    assert_eq!(code, 1210, "{message}");
    assert!(message.contains("on backend 1 already"), "{message}");
    let (code, _) = refused(&mut admin, "HSCALE MOVE_PARTITION('nokey', 'none', 2)");
    assert_eq!(code, 1210);
    assert!(!tables_on(2, &db).contains(&"nokey_odd".to_string()));
    let rows: Vec<Row> = admin.query("SELECT * FROM nokey").unwrap();
    assert_eq!(rows.len(), 2);
}

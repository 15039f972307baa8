//! Statements no partition answers alone — joins of tables that are not
//! co-located, partitioned tables in subqueries and derived tables, UNION,
//! aggregates of DISTINCT, window functions — answered from copies of their
//! tables on the main backend, against an oracle: the same rows in plain
//! tables on one server give the same answers.

use hscale_testkit::{cluster, differential, Proxy};
use mysql::prelude::Queryable;
use mysql::{Conn, Row};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const USERS: &str = "CREATE TABLE users (id INT PRIMARY KEY, nickname VARCHAR(20) \
    COLLATE utf8mb4_general_ci NOT NULL, country CHAR(2), score FLOAT, \
    KEY (nickname))";
const ORDERS: &str = "CREATE TABLE orders (id INT PRIMARY KEY, user_id INT, \
    total DECIMAL(8,2), note TEXT, placed DATETIME, KEY (user_id))";
const COUNTRIES: &str = "CREATE TABLE countries (code CHAR(2) PRIMARY KEY, name VARCHAR(20))";

/// `users` partitioned by PREFIX(1) of nickname and `orders` by MOD(3) of
/// user_id over two backends, `countries` plain on the main backend; the
/// same rows in plain tables of `<db>_oracle`.
fn setup(db: &str, seed: u64) -> (Proxy, String, Conn) {
    let proxy = Proxy::start(cluster().config());
    let db = cluster().database(db);
    let oracle_db = cluster().database(&format!("{db}_oracle"));
    let mut oracle = cluster().direct(1, Some(&oracle_db));
    let mut direct = cluster().direct(1, Some(&db));
    for ddl in [USERS, ORDERS, COUNTRIES] {
        oracle.query_drop(ddl).unwrap();
        direct.query_drop(ddl).unwrap();
    }
    let mut c = proxy.connect(Some(&db));
    c.query_drop("HSCALE SETUP_TABLE('users', 'nickname', 'users_default', 1, 'PREFIX(1)')")
        .unwrap();
    for (name, value, backend) in [("a", "a", 2), ("b", "b", 1), ("m", "m", 2)] {
        c.query_drop(format!(
            "HSCALE ADD_PARTITION('users', '{name}', '{value}', {backend})"
        ))
        .unwrap();
    }
    c.query_drop("HSCALE SETUP_TABLE('orders', 'user_id', 'orders_default', 1, 'MOD(3)')")
        .unwrap();
    for (name, value, backend) in [("p1", 1, 1), ("p2", 2, 2)] {
        c.query_drop(format!(
            "HSCALE ADD_PARTITION('orders', '{name}', {value}, {backend})"
        ))
        .unwrap();
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let nicknames = [
        "alice", "Bob", "bea", "mia", "Max", "zed", "ana", "b ", "Ärger",
    ];
    let countries = ["de", "fr", "us", "DE"];
    let mut inserts = Vec::new();
    for id in 1..=40 {
        let nickname = format!(
            "{}{}",
            nicknames[rng.random_range(0..nicknames.len())],
            id % 7
        );
        let country = match rng.random_bool(0.85) {
            true => format!("'{}'", countries[rng.random_range(0..countries.len())]),
            false => "NULL".into(),
        };
        let score = match rng.random_bool(0.85) {
            true => format!("{}", rng.random_range(-1000..1000) as f64 / 7.0),
            false => "NULL".into(),
        };
        inserts.push(format!(
            "INSERT INTO users (id, nickname, country, score) VALUES ({id}, '{nickname}', {country}, {score})"
        ));
    }
    for id in 1..=120 {
        // Some orders of users that do not exist, some without a user.
        let user = match rng.random_bool(0.9) {
            true => rng.random_range(1..46).to_string(),
            false => "NULL".into(),
        };
        let cents: i64 = rng.random_range(0..20_000);
        let total = match rng.random_bool(0.9) {
            true => format!("{}.{:02}", cents / 100, cents % 100),
            false => "NULL".into(),
        };
        let note = ["'gift'", "'rush'", "''", "NULL", "'Gift'"][rng.random_range(0..5)];
        let placed = format!(
            "'2026-{:02}-{:02} {:02}:00:00'",
            rng.random_range(1..13),
            rng.random_range(1..29),
            rng.random_range(0..24)
        );
        inserts.push(format!(
            "INSERT INTO orders VALUES ({id}, {user}, {total}, {note}, {placed})"
        ));
    }
    for (code, name) in [
        ("de", "Germany"),
        ("fr", "France"),
        ("us", "USA"),
        ("it", "Italy"),
    ] {
        inserts.push(format!("INSERT INTO countries VALUES ('{code}', '{name}')"));
    }
    for insert in &inserts {
        oracle.query_drop(insert).unwrap();
        c.query_drop(insert).unwrap();
    }
    (proxy, db, oracle)
}

fn seed() -> u64 {
    hscale_testkit::seed("HSCALE_FEDERATED_SEED")
}

/// The answer as rows of printed values, and the columns' names and types.
type Answer = (Vec<String>, Vec<(String, String)>);

fn answer(conn: &mut Conn, sql: &str) -> Result<Answer, String> {
    let answer = differential::answer(conn, sql, false).map_err(|e| e.to_string())?;
    let rows = answer
        .rows
        .iter()
        .map(|row| {
            let values: Vec<String> = row.iter().map(|v| v.as_sql(false)).collect();
            values.join(", ")
        })
        .collect();
    Ok((rows, answer.columns))
}

/// Compares hscale's answer with the oracle's: in order where the statement
/// orders its rows totally (`ordered`), else as multisets.
fn same(c: &mut Conn, oracle: &mut Conn, sql: &str, ordered: bool, seed: u64) {
    let theirs = answer(oracle, sql);
    let ours = answer(c, sql);
    // Values a case-insensitive collation holds equal ('Gift', 'gift') are
    // one group, one DISTINCT row, one MIN, and which of them stands for
    // the rest depends on the order rows are read in: compared folded.
    let upper = sql.to_uppercase();
    let folds = [
        "GROUP BY",
        "DISTINCT",
        "MIN(",
        "MAX(",
        "UNION",
        "INTERSECT",
        "EXCEPT",
        "LIMIT",
    ]
    .iter()
    .any(|w| upper.contains(w));
    let sorted = |a: Result<Answer, String>| {
        a.map(|(mut rows, columns)| {
            if folds {
                rows = rows.into_iter().map(|r| r.to_lowercase()).collect();
            }
            if !ordered {
                rows.sort();
            }
            (rows, columns)
        })
    };
    let (theirs, ours) = (sorted(theirs), sorted(ours));
    match (&theirs, &ours) {
        (Ok(t), Ok(o)) if o != t => {
            let only = |a: &[String], b: &[String]| {
                let mut rest = b.to_vec();
                let mut only = Vec::new();
                for row in a {
                    match rest.iter().position(|r| r == row) {
                        Some(i) => drop(rest.remove(i)),
                        None => only.push(row.clone()),
                    }
                }
                only
            };
            panic!(
                "{sql} (seed {seed}): only hscale {:?}, only one table {:?}, columns {:?} / {:?}, {} / {} rows",
                only(&o.0, &t.0),
                only(&t.0, &o.0),
                o.1,
                t.1,
                o.0.len(),
                t.0.len()
            );
        }
        (Ok(_), Ok(_)) => {}
        (Err(t), Err(o)) => assert_eq!(
            o.split(" (").next(),
            t.split(" (").next(),
            "{sql} (seed {seed}): both failed, differently"
        ),
        _ => panic!("{sql} (seed {seed}): hscale {ours:?}, one table {theirs:?}"),
    }
}

const STATEMENTS: &[(&str, bool)] = &[
    // Joins whose condition is not the partition columns.
    ("SELECT u.nickname, o.total FROM users u JOIN orders o ON o.user_id = u.id", false),
    ("SELECT u.nickname, o.id FROM users u JOIN orders o ON o.user_id = u.id WHERE u.id = 5", false),
    ("SELECT u.id, o.id, o.total FROM users u LEFT JOIN orders o ON o.user_id = u.id AND o.total > 50 ORDER BY u.id, o.id", true),
    ("SELECT o.id, u.nickname FROM orders o LEFT JOIN users u ON u.id = o.user_id WHERE o.id < 30 ORDER BY o.id", true),
    ("SELECT o.id, u.nickname FROM users u RIGHT JOIN orders o ON u.id = o.user_id WHERE u.nickname IS NULL ORDER BY o.id", true),
    ("SELECT u.country, COUNT(*), SUM(o.total) FROM users u, orders o WHERE u.id = o.user_id GROUP BY u.country ORDER BY u.country", true),
    ("SELECT COUNT(*) FROM users u JOIN orders o ON o.user_id = u.id", true),
    ("SELECT a.id, b.id FROM orders a JOIN orders b ON a.user_id = b.user_id AND a.id < b.id", false),
    ("SELECT u.nickname, c.name, o.total FROM users u JOIN countries c ON c.code = u.country JOIN orders o ON o.user_id = u.id WHERE c.code = 'de'", false),
    ("SELECT * FROM users u JOIN orders o ON o.user_id = u.id WHERE u.nickname LIKE 'b%'", false),
    ("SELECT * FROM users NATURAL JOIN countries", false),
    ("SELECT u.id FROM users u JOIN orders o USING (id)", false),
    // Subqueries.
    ("SELECT * FROM orders WHERE user_id IN (SELECT id FROM users)", false),
    ("SELECT id FROM orders WHERE user_id NOT IN (SELECT id FROM users WHERE id > 10)", false),
    ("SELECT id FROM users u WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.user_id = u.id)", false),
    ("SELECT u.id, (SELECT MAX(total) FROM orders o WHERE o.user_id = u.id) FROM users u", false),
    ("SELECT id, total FROM orders WHERE total > (SELECT AVG(total) FROM orders)", false),
    ("SELECT nickname FROM users WHERE id = (SELECT MAX(user_id) FROM orders)", false),
    ("SELECT code FROM countries WHERE code IN (SELECT country FROM users)", false),
    // Derived tables and WITH.
    ("SELECT d.c, COUNT(*) FROM (SELECT user_id, COUNT(*) c FROM orders GROUP BY user_id) d GROUP BY d.c ORDER BY d.c", true),
    ("WITH big AS (SELECT * FROM orders WHERE total > 100) SELECT COUNT(*), MIN(total) FROM big", true),
    ("SELECT MAX(n) FROM (SELECT nickname n FROM users UNION ALL SELECT note FROM orders) x", true),
    // UNION, INTERSECT, EXCEPT.
    ("SELECT id FROM users UNION SELECT user_id FROM orders", false),
    ("SELECT id FROM users UNION ALL SELECT user_id FROM orders ORDER BY 1 LIMIT 7", true),
    ("SELECT id FROM users INTERSECT SELECT user_id FROM orders", false),
    ("SELECT id FROM users EXCEPT SELECT user_id FROM orders", false),
    // Aggregates the partitions cannot combine.
    ("SELECT COUNT(DISTINCT user_id), SUM(DISTINCT total), AVG(DISTINCT total) FROM orders", true),
    ("SELECT user_id, COUNT(DISTINCT note) FROM orders GROUP BY user_id", false),
    ("SELECT DISTINCT * FROM orders", false),
    ("SELECT DISTINCT COUNT(*) FROM orders GROUP BY user_id", false),
    ("SELECT user_id FROM orders GROUP BY user_id HAVING SUM(total) > 200", false),
    ("SELECT user_id, SUM(total) DIV 3, AVG(total) * 2 FROM orders GROUP BY user_id", false),
    ("SELECT GROUP_CONCAT(id ORDER BY id SEPARATOR '|') FROM orders WHERE user_id = 4", true),
    ("SELECT user_id, GROUP_CONCAT(DISTINCT note ORDER BY note) FROM orders GROUP BY user_id", false),
    // Window functions.
    ("SELECT id, ROW_NUMBER() OVER (PARTITION BY user_id ORDER BY id) FROM orders", false),
    // Floats keep their values.
    ("SELECT u.score, o.id FROM users u JOIN orders o ON o.user_id = u.id WHERE u.score > 0", false),
    ("SELECT id FROM users WHERE score IN (SELECT score FROM users WHERE id < 20)", false),
    // Errors the one table gives too.
    ("SELECT nope FROM users u JOIN orders o ON o.user_id = u.id", false),
    ("SELECT id FROM users WHERE id = (SELECT user_id FROM orders)", false),
];

#[test]
fn statements_no_partition_answers_alone_answer_like_one_table() {
    let seed = seed();
    let (proxy, db, mut oracle) = setup("federated", seed);
    let mut c = proxy.connect(Some(&db));
    for (sql, ordered) in STATEMENTS {
        same(&mut c, &mut oracle, sql, *ordered, seed);
    }
    // Nothing stays behind: the base tables are what they were.
    same(
        &mut c,
        &mut oracle,
        "SELECT COUNT(*), SUM(id) FROM orders",
        true,
        seed,
    );
    let left: Vec<Row> = c.query("SHOW TABLES").unwrap();
    assert_eq!(left.len(), 3, "{left:?}");
}

#[test]
fn a_join_inside_a_transaction_reads_its_own_writes() {
    let seed = seed();
    let (proxy, db, mut oracle) = setup("federated_tx", seed);
    let mut c = proxy.connect(Some(&db));
    let join = "SELECT u.id, o.id FROM users u JOIN orders o ON o.user_id = u.id WHERE o.id > 500";
    for conn in [&mut c, &mut oracle] {
        conn.query_drop("BEGIN").unwrap();
        conn.query_drop(
            "INSERT INTO orders VALUES (501, 3, 1.00, 'x', NOW()), (502, 4, 2.00, 'y', NOW())",
        )
        .unwrap();
        conn.query_drop("UPDATE users SET country = 'it' WHERE id = 3")
            .unwrap();
    }
    same(&mut c, &mut oracle, join, false, seed);
    same(
        &mut c,
        &mut oracle,
        "SELECT c.name, COUNT(*) FROM users u JOIN countries c ON c.code = u.country JOIN orders o ON o.user_id = u.id GROUP BY c.name",
        false,
        seed,
    );
    for conn in [&mut c, &mut oracle] {
        conn.query_drop("ROLLBACK").unwrap();
    }
    same(&mut c, &mut oracle, join, false, seed);
}

/// Copies take no locks and read the transaction's snapshot (issue 55,
/// point 1). Inside a REPEATABLE READ transaction a statement from copies
/// answers from what the transaction's plain SELECTs see on each backend,
/// not from rows committed since; and a writer of the copied rows does not
/// wait for that transaction. Before, the main backend's partitions were
/// copied by `INSERT ... SELECT` in the client's transaction: a locking read
/// of the latest rows, whose shared locks stayed until COMMIT (the writer's
/// UPDATE: 1205). Outside a transaction the copy is its own snapshot and
/// the writer does not wait either.
#[test]
fn copies_take_no_locks_and_read_the_transactions_snapshot() {
    let seed = seed();
    let (proxy, db, _) = setup("federated_snapshot", seed);
    let mut c = proxy.connect(Some(&db));
    // A derived table: answered from a copy. The same totals from a scan of
    // the partitions, merged by hscale, are the plain reads.
    let copied = "SELECT COUNT(*), SUM(total) FROM (SELECT user_id, total FROM orders) o";
    let plain_read = "SELECT COUNT(*), SUM(total) FROM orders";
    let plan: Vec<(String, u32, Option<String>, String)> =
        c.query(format!("HSCALE EXPLAIN {copied}")).unwrap();
    assert_eq!(plan[0].0, "(copy)", "{plan:?}");
    type Totals = (i64, Option<String>);
    let mut writer = proxy.connect(Some(&db));
    writer
        .query_drop("SET SESSION innodb_lock_wait_timeout = 2")
        .unwrap();
    for in_transaction in [true, false] {
        if in_transaction {
            c.query_drop("BEGIN").unwrap();
        }
        let plain: Totals = c.query_first(plain_read).unwrap().unwrap();
        let from_copies: Totals = c.query_first(copied).unwrap().unwrap();
        assert_eq!(from_copies, plain, "seed {seed}");
        // Every order, on both backends (the main one's partitions too).
        writer
            .query_drop("UPDATE orders SET total = total + 1")
            .unwrap();
        writer
            .query_drop(format!(
                "INSERT INTO orders VALUES ({0}, 3, 1.00, 'n', NOW()), ({1}, 4, 1.00, 'n', NOW()), ({2}, 5, 1.00, 'n', NOW())",
                if in_transaction { 601 } else { 701 },
                if in_transaction { 602 } else { 702 },
                if in_transaction { 603 } else { 703 },
            ))
            .unwrap();
        let again: Totals = c.query_first(copied).unwrap().unwrap();
        if in_transaction {
            assert_eq!(again, plain, "the transaction's snapshot (seed {seed})");
            c.query_drop("COMMIT").unwrap();
        } else {
            assert_ne!(again, plain, "a statement of its own sees the writes");
        }
        let now: Totals = c.query_first(plain_read).unwrap().unwrap();
        assert_eq!(c.query_first::<Totals, _>(copied).unwrap().unwrap(), now);
        assert_eq!(now.0, plain.0 + 3);
    }
}

#[test]
fn explain_names_the_copies_and_what_narrows_them() {
    let (proxy, db, _) = setup("federated_explain", 1);
    let mut c = proxy.connect(Some(&db));
    let rows: Vec<(String, u32, Option<String>, String)> = c
        .query("HSCALE EXPLAIN SELECT u.nickname, o.total FROM users u JOIN orders o ON o.user_id = u.id WHERE u.id = 5")
        .unwrap();
    let what: Vec<&str> = rows.iter().map(|r| r.3.as_str()).collect();
    assert_eq!(rows.len(), 5, "{rows:?}");
    // A lookup join: the user's row, then its orders by its key.
    assert_eq!(rows[0].0, "(lookup join)");
    assert!(what[0].contains("(u.id = 5)"), "{what:?}");
    assert!(what[1].contains("`o`.`user_id` IN ("), "{what:?}");
    // The copies, where it cannot answer.
    assert!(
        what[2].contains("copy of") && what[2].contains("users") && what[2].contains("u.id = 5"),
        "{what:?}"
    );
    assert!(
        what[3].contains("orders") && what[3].contains("`user_id` among the values of"),
        "{what:?}"
    );
    assert_eq!(rows[4].0, "(on the copies)");
    // Without a lookup join, copies alone.
    let rows: Vec<(String, u32, Option<String>, String)> = c
        .query("HSCALE EXPLAIN SELECT COUNT(DISTINCT user_id) FROM orders")
        .unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0].0, "(copy)");
    // A subquery correlated on the partition column runs inside each
    // partition: one step per partition, each naming that partition's
    // table twice.
    let rows: Vec<(String, u32, Option<String>, String)> = c
        .query("HSCALE EXPLAIN SELECT o.id FROM orders o WHERE EXISTS (SELECT 1 FROM orders x WHERE x.user_id = o.user_id AND x.id <> o.id)")
        .unwrap();
    assert!(rows.len() > 1, "{rows:?}");
    for (_, _, table, sql) in &rows {
        let table = table.as_deref().expect("a partition's table");
        assert_eq!(sql.matches(&format!("`{table}`")).count(), 2, "{rows:?}");
    }
}

/// A random SELECT over the three tables: joins on other columns than the
/// partition columns, outer joins, subqueries (correlated ones too),
/// derived tables, set operations, DISTINCT and aggregates of DISTINCT,
/// conditions the copies read and ones they must not.
fn generate(rng: &mut StdRng) -> (String, bool) {
    let n = |rng: &mut StdRng, hi: i32| rng.random_range(0..hi);
    let from = match n(rng, 8) {
        0 => ("users u", vec!["u"]),
        1 => ("orders o", vec!["o"]),
        2 => ("users u JOIN orders o ON o.user_id = u.id", vec!["u", "o"]),
        3 => (
            "users u LEFT JOIN orders o ON o.user_id = u.id",
            vec!["u", "o"],
        ),
        4 => (
            "orders o LEFT JOIN users u ON u.id = o.user_id",
            vec!["u", "o"],
        ),
        5 => (
            "users u JOIN countries c ON c.code = u.country",
            vec!["u", "c"],
        ),
        6 => (
            "users u JOIN orders o ON o.user_id = u.id JOIN countries c ON c.code = u.country",
            vec!["u", "o", "c"],
        ),
        _ => (
            "(SELECT user_id, COUNT(*) n, SUM(total) s FROM orders GROUP BY user_id) d \
             JOIN users u ON u.id = d.user_id",
            vec!["u", "d"],
        ),
    };
    let (from, aliases) = from;
    let has = |a: &str| aliases.contains(&a);
    let mut conditions = Vec::new();
    for _ in 0..n(rng, 3) {
        let pick = n(rng, 15);
        let threshold = n(rng, 200);
        let condition = match pick {
            0 if has("u") => format!("u.id < {}", n(rng, 45)),
            1 if has("u") => format!("u.id = {}", n(rng, 45)),
            2 if has("o") => format!("o.total > {threshold}"),
            3 if has("u") => "u.nickname LIKE 'b%'".to_string(),
            4 if has("o") => "o.note IS NULL".to_string(),
            5 if has("u") => "u.country IN ('de', 'fr')".to_string(),
            6 if has("u") => {
                format!("u.id IN (SELECT user_id FROM orders WHERE total > {threshold})")
            }
            7 if has("u") => format!(
                "EXISTS (SELECT 1 FROM orders o2 WHERE o2.user_id = u.id AND o2.total > {threshold})"
            ),
            8 if has("o") => format!(
                "o.user_id NOT IN (SELECT id FROM users WHERE id > {})",
                n(rng, 45)
            ),
            9 if has("o") => "o.total > (SELECT AVG(total) FROM orders)".to_string(),
            10 if has("d") => format!("d.n > {}", n(rng, 4)),
            11 if has("c") => "c.name <> 'France'".to_string(),
            // Correlated on the partition column: with `orders o` alone,
            // inside each partition.
            12 if has("o") => format!(
                "EXISTS (SELECT 1 FROM orders o3 WHERE o3.user_id = o.user_id AND o3.id <> o.id AND o3.total > {threshold})"
            ),
            13 if has("o") => {
                "o.total >= (SELECT MAX(o4.total) FROM orders o4 WHERE o4.user_id = o.user_id)".to_string()
            }
            14 if has("o") => format!(
                "NOT EXISTS (SELECT 1 FROM orders o5 WHERE o5.user_id = o.user_id AND o5.total < {threshold})"
            ),
            _ => continue,
        };
        conditions.push(condition);
    }
    let columns: Vec<&str> = aliases
        .iter()
        .flat_map(|a| match *a {
            "u" => vec!["u.id", "u.nickname", "u.country", "u.score"],
            "o" => vec![
                "o.id",
                "o.user_id",
                "o.total",
                "o.note",
                "(SELECT COUNT(*) FROM orders o6 WHERE o6.user_id = o.user_id)",
            ],
            "c" => vec!["c.name"],
            _ => vec!["d.n", "d.s"],
        })
        .collect();
    let mut picked: Vec<&str> = (0..1 + n(rng, 3))
        .map(|_| columns[n(rng, columns.len() as i32) as usize])
        .collect();
    picked.dedup();
    let aggregate = |rng: &mut StdRng| {
        let column = columns[rng.random_range(0..columns.len())];
        match rng.random_range(0..6) {
            0 => "COUNT(*)".to_string(),
            1 => format!("COUNT(DISTINCT {column})"),
            2 => format!("MAX({column})"),
            3 if column.ends_with("total") || column.ends_with(".s") => {
                format!("SUM(DISTINCT {column})")
            }
            4 => format!("GROUP_CONCAT(DISTINCT {column} ORDER BY {column} SEPARATOR '|')"),
            _ => format!("COUNT({column})"),
        }
    };
    let mut sql;
    let mut ordered = false;
    match n(rng, 4) {
        // Groups: the keys and aggregates, maybe a HAVING on another.
        0 => {
            let aggregates: Vec<String> = (0..1 + n(rng, 2)).map(|_| aggregate(rng)).collect();
            sql = format!(
                "SELECT {}, {} FROM {from}",
                picked.join(", "),
                aggregates.join(", ")
            );
            if !conditions.is_empty() {
                sql.push_str(&format!(" WHERE {}", conditions.join(" AND ")));
            }
            sql.push_str(&format!(" GROUP BY {}", picked.join(", ")));
            if rng.random_bool(0.4) {
                sql.push_str(" HAVING COUNT(*) > 1");
            }
        }
        // One row of aggregates.
        1 => {
            let aggregates: Vec<String> = (0..1 + n(rng, 3)).map(|_| aggregate(rng)).collect();
            sql = format!("SELECT {} FROM {from}", aggregates.join(", "));
            if !conditions.is_empty() {
                sql.push_str(&format!(" WHERE {}", conditions.join(" AND ")));
            }
        }
        // Rows, maybe DISTINCT, maybe the first few in a total order.
        2 => {
            let distinct = if rng.random_bool(0.3) {
                "DISTINCT "
            } else {
                ""
            };
            sql = format!("SELECT {distinct}{} FROM {from}", picked.join(", "));
            if !conditions.is_empty() {
                sql.push_str(&format!(" WHERE {}", conditions.join(" AND ")));
            }
            if rng.random_bool(0.4) {
                let order: Vec<String> = picked
                    .iter()
                    .map(|c| format!("{c}{}", if rng.random_bool(0.5) { " DESC" } else { "" }))
                    .collect();
                sql.push_str(&format!(
                    " ORDER BY {} LIMIT {}",
                    order.join(", "),
                    1 + n(rng, 9)
                ));
                ordered = true;
            }
        }
        // A set operation of two single columns.
        _ => {
            let left = [
                "SELECT id FROM users",
                "SELECT user_id FROM orders WHERE total > 50",
            ][n(rng, 2) as usize];
            let right = [
                "SELECT user_id FROM orders",
                "SELECT id FROM users WHERE country = 'de'",
                "SELECT 7",
            ][n(rng, 3) as usize];
            let op = ["UNION", "UNION ALL", "INTERSECT", "EXCEPT"][n(rng, 4) as usize];
            sql = format!("{left} {op} {right}");
        }
    }
    (sql, ordered)
}

#[test]
fn generated_statements_answer_like_one_table() {
    let seed = seed();
    let (proxy, db, mut oracle) = setup("federated_generated", seed);
    let mut c = proxy.connect(Some(&db));
    let mut rng = StdRng::seed_from_u64(seed);
    for _ in 0..150 {
        let (sql, ordered) = generate(&mut rng);
        same(&mut c, &mut oracle, &sql, ordered, seed);
    }
}

#[test]
fn prepared_statements_run_on_copies_at_each_execution() {
    let seed = seed();
    let (proxy, db, mut oracle) = setup("federated_prepared", seed);
    let mut c = proxy.connect(Some(&db));
    let statements = [
        "SELECT u.nickname, o.id, o.total FROM users u JOIN orders o ON o.user_id = u.id WHERE u.id = ? ORDER BY o.id",
        "SELECT COUNT(DISTINCT user_id), SUM(total) FROM orders WHERE total > ?",
        "SELECT id FROM users WHERE id IN (SELECT user_id FROM orders WHERE total > ?) ORDER BY id",
        // Correlated on the partition column: inside each partition.
        "SELECT o.id FROM orders o WHERE EXISTS (SELECT 1 FROM orders x WHERE x.user_id = o.user_id AND x.id <> o.id AND x.total > ?) ORDER BY o.id",
    ];
    let mut rng = StdRng::seed_from_u64(seed);
    for sql in statements {
        let ours = c.prep(sql).unwrap();
        let theirs = oracle.prep(sql).unwrap();
        assert_eq!(ours.num_params(), 1, "{sql}");
        for round in 0..6 {
            let value = rng.random_range(0..150);
            if round == 3 {
                // Inside a transaction, which reads its own write.
                c.query_drop("BEGIN").unwrap();
                oracle.query_drop("BEGIN").unwrap();
                let insert = format!(
                    "INSERT INTO orders VALUES (900, {}, 140.00, 'new', NOW())",
                    value % 40
                );
                c.query_drop(&insert).unwrap();
                oracle.query_drop(&insert).unwrap();
            }
            let got: Vec<Row> = c.exec(&ours, (value,)).unwrap();
            let want: Vec<Row> = oracle.exec(&theirs, (value,)).unwrap();
            let print = |rows: Vec<Row>| -> Vec<String> {
                rows.into_iter()
                    .map(|r| format!("{:?}", r.unwrap()))
                    .collect()
            };
            assert_eq!(print(got), print(want), "{sql} with {value} (seed {seed})");
            if round == 4 {
                c.query_drop("ROLLBACK").unwrap();
                oracle.query_drop("ROLLBACK").unwrap();
            }
        }
    }
}

/// What the lookup join generators select from.
const LOOKUP_COLUMNS: [&str; 9] = [
    "u.id",
    "u.nickname",
    "u.country",
    "u.score",
    "o.id",
    "o.user_id",
    "o.total",
    "o.note",
    "o.placed",
];

#[test]
fn lookup_joins_answer_like_one_table() {
    let seed = seed();
    let (proxy, db, mut oracle) = setup("federated_lookup", seed);
    let mut c = proxy.connect(Some(&db));
    let mut rng = StdRng::seed_from_u64(seed);
    let columns = LOOKUP_COLUMNS;
    for _ in 0..60 {
        let picked: Vec<String> = (0..1 + rng.random_range(0..4))
            .map(|i| {
                let column = columns[rng.random_range(0..columns.len())];
                match rng.random_bool(0.2) {
                    true => format!("{column} AS c{i}"),
                    false => column.to_string(),
                }
            })
            .collect();
        let id = rng.random_range(0..48);
        let outer = [
            format!("u.id = {id}"),
            format!("u.id IN ({id}, {}, 41)", id + 1),
            format!("u.id < {id}"),
            "u.nickname LIKE 'b%'".to_string(),
            format!("o.id = {}", rng.random_range(1..130)),
            format!("o.total > {}", rng.random_range(100..200)),
        ][rng.random_range(0..6)]
        .clone();
        let more = [
            "",
            " AND o.note IS NOT NULL",
            " AND u.country = 'de'",
            " AND o.total < 150",
        ][rng.random_range(0..4)];
        let sql = match rng.random_range(0..3) {
            0 => format!(
                "SELECT {} FROM users u JOIN orders o ON o.user_id = u.id WHERE {outer}{more}",
                picked.join(", ")
            ),
            1 => format!(
                "SELECT {} FROM orders o, users u WHERE u.id = o.user_id AND {outer}{more}",
                picked.join(", ")
            ),
            // The users kept, with their orders over some total or none.
            _ => format!(
                "SELECT {} FROM users u LEFT JOIN orders o ON o.user_id = u.id AND o.total > {} \
                 WHERE u.id < {id}",
                picked.join(", "),
                rng.random_range(0..200)
            ),
        };
        same(&mut c, &mut oracle, &sql, false, seed);
        // The columns' flags too: a left join's inner columns may be NULL.
        let flags = |conn: &mut Conn| -> Vec<u16> {
            let result = conn.query_iter(&sql).unwrap();
            let flags = result
                .columns()
                .as_ref()
                .iter()
                .map(|c| c.flags().bits())
                .collect();
            drop(result);
            flags
        };
        assert_eq!(flags(&mut c), flags(&mut oracle), "{sql} (seed {seed})");
    }
}

#[test]
fn a_copy_takes_the_tables_own_engine_where_aria_refuses_its_keys() {
    let (proxy, db, mut oracle) = setup("federated_engine", 7);
    let mut c = proxy.connect(Some(&db));
    // A unique key of 2400 bytes: more than Aria's 2300 (InnoDB's 3072).
    let ddl = "CREATE TABLE notes (id INT PRIMARY KEY, body VARCHAR(600) CHARACTER SET utf8mb4, \
               UNIQUE KEY (body))";
    oracle.query_drop(ddl).unwrap();
    cluster().direct(1, Some(&db)).query_drop(ddl).unwrap();
    c.query_drop("HSCALE SETUP_TABLE('notes', 'id', 'notes_default', 1, 'MOD(2)')")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('notes', 'odd', 1, 2)")
        .unwrap();
    for id in 1..=9 {
        let insert = format!(
            "INSERT INTO notes VALUES ({id}, CONCAT({id}, REPEAT('é', {})))",
            id % 4
        );
        c.query_drop(&insert).unwrap();
        oracle.query_drop(&insert).unwrap();
    }
    same(
        &mut c,
        &mut oracle,
        "SELECT COUNT(DISTINCT body), MAX(body) FROM notes",
        true,
        7,
    );
    same(
        &mut c,
        &mut oracle,
        "SELECT n.id, u.nickname FROM notes n JOIN users u ON u.id = n.id + 1 ORDER BY n.id",
        true,
        7,
    );
}

/// Executions of prepared joins that are not co-located: answered by a
/// lookup join in the binary protocol (its rows converted from the text
/// reads, each value as the server would send it) where every column has an
/// exact binary form, else from copies; either way as one table answers,
/// value for value and type for type.
#[test]
fn prepared_lookup_joins_answer_like_one_table() {
    let seed = seed();
    let (proxy, db, mut oracle) = setup("federated_prepared_lookup", seed);
    let mut c = proxy.connect(Some(&db));
    let mut rng = StdRng::seed_from_u64(seed);
    let columns = LOOKUP_COLUMNS;
    let status = |c: &mut Conn, name: &str| -> u64 {
        let rows: Vec<(String, String)> = c.query("HSCALE STATUS").unwrap();
        let value = rows.into_iter().find(|(n, _)| n == name).unwrap().1;
        value.parse().unwrap()
    };
    let (lookups, copies) = (
        status(&mut c, "lookup_joins"),
        status(&mut c, "copied_statements"),
    );
    let mut floats = 0;
    for _ in 0..24 {
        let picked: Vec<&str> = (0..1 + rng.random_range(0..4))
            .map(|_| columns[rng.random_range(0..columns.len())])
            .collect();
        floats += usize::from(picked.contains(&"u.score"));
        let (outer, value) = [
            ("u.id = ?", rng.random_range(0..48)),
            ("u.id < ?", rng.random_range(0..48)),
            ("o.total > ?", rng.random_range(100..200)),
            ("o.id = ?", rng.random_range(1..130)),
        ][rng.random_range(0..4)];
        let sql = match rng.random_bool(0.7) {
            true => format!(
                "SELECT {} FROM users u JOIN orders o ON o.user_id = u.id WHERE {outer}",
                picked.join(", ")
            ),
            false => format!(
                "SELECT {} FROM users u LEFT JOIN orders o ON o.user_id = u.id WHERE {outer}",
                picked.join(", ")
            ),
        };
        let ours = c.prep(&sql).unwrap();
        let theirs = oracle.prep(&sql).unwrap();
        let typed = |rows: Vec<Row>| -> Vec<String> {
            let mut printed: Vec<String> = rows
                .into_iter()
                .map(|r| format!("{:?}", r.unwrap()))
                .collect();
            printed.sort();
            printed
        };
        let got: Vec<Row> = c.exec(&ours, (value,)).unwrap();
        let want: Vec<Row> = oracle.exec(&theirs, (value,)).unwrap();
        assert_eq!(typed(got), typed(want), "{sql} with {value} (seed {seed})");
    }
    // Without FLOAT columns a lookup join answers; with them, the copies.
    assert!(status(&mut c, "lookup_joins") > lookups, "seed {seed}");
    if floats > 0 {
        assert!(status(&mut c, "copied_statements") > copies, "seed {seed}");
    }
}

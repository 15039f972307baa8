//! Full partition scans against an oracle: the same random rows in one plain
//! table on one server and in a table partitioned over two backends (two
//! partitions on each, the default one among them) must give the same
//! answers, row for row where ORDER BY makes the order total.

use hscale::config::ScansConfig;
use hscale_testkit::{cluster, Proxy};
use mysql::prelude::Queryable;
use mysql::{Conn, Row};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const ITEMS: &str = "CREATE TABLE items (id INT PRIMARY KEY, grp INT, \
    name VARCHAR(32) COLLATE utf8mb4_general_ci, price DECIMAL(8,2), made DATETIME, \
    t TIME, f DOUBLE, b VARBINARY(8), label VARCHAR(16) COLLATE utf8mb4_unicode_ci)";

/// `items` in `db` partitioned by MOD(4) of id (0 in the default table and 2
/// on backend 1, 1 and 3 on backend 2), and in `<db>_oracle` as one table on
/// backend 1, both with the same random rows.
fn setup(db: &str, seed: u64) -> (Proxy, String, Conn) {
    setup_with(db, seed, ScansConfig::default())
}

/// `setup` through a proxy whose scans are bounded by `scans`.
fn setup_with(db: &str, seed: u64, scans: ScansConfig) -> (Proxy, String, Conn) {
    let mut config = cluster().config();
    config.scans = scans;
    let proxy = Proxy::start(config);
    let db = cluster().database(db);
    let oracle_db = cluster().database(&format!("{db}_oracle"));
    let mut oracle = cluster().direct(1, Some(&oracle_db));
    oracle.query_drop(ITEMS).unwrap();
    cluster().direct(1, Some(&db)).query_drop(ITEMS).unwrap();
    let mut c = proxy.connect(Some(&db));
    c.query_drop("HSCALE SETUP_TABLE('items', 'id', 'items_default', 1, 'MOD(4)')")
        .unwrap();
    for (name, value, backend) in [("p1", 1, 2), ("p2", 2, 1), ("p3", 3, 2)] {
        c.query_drop(format!(
            "HSCALE ADD_PARTITION('items', '{name}', {value}, {backend})"
        ))
        .unwrap();
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let names = [
        "apple", "Apple", "apple ", "ÄPFEL", "banana", "b", "", "zebra",
    ];
    let labels = ["a", "ä", "ß", "ss", "Z", "z "];
    let mut values = Vec::new();
    for id in 1..=120 {
        let grp = rng.random_range(0..5).to_string();
        let name = format!("'{}'", names[rng.random_range(0..names.len())]);
        let cents: i64 = rng.random_range(-50_000..50_000);
        let price = format!(
            "{}{}.{:02}",
            if cents < 0 { "-" } else { "" },
            cents.abs() / 100,
            cents.abs() % 100
        );
        // Years on both sides of 1792 (0x0700): the binary protocol sends
        // them little-endian.
        let made = format!(
            "'{}-{:02}-{:02} {:02}:{:02}:00'",
            [1780, 2000][rng.random_range(0..2)] + rng.random_range(0..30),
            rng.random_range(1..13),
            rng.random_range(1..29),
            rng.random_range(0..24),
            rng.random_range(0..60)
        );
        let t = format!(
            "'{}:{:02}:00'",
            rng.random_range(-200..200),
            rng.random_range(0..60)
        );
        let f = format!("{:e}", rng.random_range(-1e6..1e6f64));
        let b = format!("0x{:04x}", rng.random_range(0..0x10000));
        let label = format!("'{}'", labels[rng.random_range(0..labels.len())]);
        // Each value NULL now and then.
        let [grp, name, price, made, t, f, b, label] = [grp, name, price, made, t, f, b, label]
            .map(|v| match rng.random_bool(0.85) {
                true => v,
                false => "NULL".into(),
            });
        values.push(format!(
            "({id}, {grp}, {name}, {price}, {made}, {t}, {f}, {b}, {label})"
        ));
    }
    let insert = format!("INSERT INTO items VALUES {}", values.join(", "));
    oracle.query_drop(&insert).unwrap();
    let mut writer = proxy.connect(Some(&db));
    writer
        .query_drop("SET SESSION sql_mode = 'STRICT_ALL_TABLES'")
        .unwrap();
    // Multi-row inserts over both backends need one transaction per backend.
    for row in values {
        writer
            .query_drop(format!("INSERT INTO items VALUES {row}"))
            .unwrap();
    }
    (proxy, db, oracle)
}

fn seed() -> u64 {
    hscale_testkit::seed("HSCALE_SCAN_SEED")
}

fn rows(conn: &mut Conn, sql: &str) -> Vec<Vec<mysql::Value>> {
    let rows: Vec<Row> = conn.query(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    rows.into_iter().map(Row::unwrap).collect()
}

#[test]
fn ordered_and_limited_scans_match_one_table() {
    let seed = seed();
    let (proxy, db, mut oracle) = setup("scan_order", seed);
    let mut c = proxy.connect(Some(&db));
    let orders = [
        "id",
        "id DESC",
        "name, id",
        "name DESC, id DESC",
        "price, id",
        "price DESC, id",
        "made DESC, id",
        "t, id",
        "f DESC, id",
        "b, id",
        "label, id",
        "grp, name DESC, price, id",
        "2, 1",
        "nick DESC, id",
        "price * -1, id",
        "LOWER(name), id",
        "price IS NULL, grp * 2 + 1 DESC, id",
        "CASE WHEN grp > 2 THEN name ELSE label END, id",
        "CASE WHEN grp > 2 THEN name ELSE label END COLLATE utf8mb4_unicode_ci, id",
    ];
    let limits = [
        "",
        " LIMIT 7",
        " LIMIT 3, 5",
        " LIMIT 4 OFFSET 110",
        " LIMIT 1000",
        " LIMIT 0",
    ];
    let filters = [
        "",
        " WHERE grp > 1",
        " WHERE id < 0",
        " WHERE id IN (3, 4, 7, 8)",
    ];
    let mut checked = 0;
    let mut refused = 0;
    // Inside a transaction each backend's two partitions answer as one
    // UNION ALL that the backend sorts; MariaDB cannot unite a CASE between
    // two collations, which hscale refuses where a backend unites.
    for transaction in [false, true] {
        if transaction {
            c.query_drop("BEGIN").unwrap();
        }
        for order in orders {
            for limit in limits {
                for filter in filters {
                    let sql = format!(
                        "SELECT id, name AS nick, price, made, t, f, b, label FROM items{filter} ORDER BY {order}{limit}"
                    );
                    let expected = rows(&mut oracle, &sql);
                    checked += 1;
                    let got = match c.query::<Row, _>(&sql) {
                        Err(mysql::Error::MySqlError(e))
                            if transaction
                                && order.starts_with("CASE")
                                && !order.contains("COLLATE") =>
                        {
                            assert_eq!(e.code, 1235, "{sql}: {}", e.message);
                            refused += 1;
                            continue;
                        }
                        got => got.unwrap_or_else(|e| panic!("{sql}: {e}")),
                    };
                    let got: Vec<Vec<mysql::Value>> = got.into_iter().map(Row::unwrap).collect();
                    assert_eq!(
                        got, expected,
                        "seed {seed}: {sql} (transaction: {transaction})"
                    );
                }
            }
        }
        if transaction {
            c.query_drop("COMMIT").unwrap();
        }
    }
    assert_eq!(checked, 2 * orders.len() * limits.len() * filters.len());
    assert!(refused > 0, "a CASE between two collations over a union");
    // Every column, in the order of the definition.
    let sql = "SELECT * FROM items ORDER BY id DESC LIMIT 10";
    assert_eq!(rows(&mut c, sql), rows(&mut oracle, sql));
}

#[test]
fn a_scan_answers_with_the_columns_of_one_table() {
    let (proxy, db, mut oracle) = setup("scan_columns", 1);
    let mut c = proxy.connect(Some(&db));
    let sql = "SELECT id, name, price, made FROM items ORDER BY name, id LIMIT 3";
    let describe = |conn: &mut Conn| {
        let result = conn.query_iter(sql).unwrap();
        let columns: Vec<_> = result
            .columns()
            .as_ref()
            .iter()
            .map(|c| {
                (
                    c.name_str().to_string(),
                    c.table_str().to_string(),
                    c.column_type(),
                    c.flags(),
                    c.character_set(),
                    c.decimals(),
                )
            })
            .collect();
        drop(result);
        columns
    };
    assert_eq!(describe(&mut c), describe(&mut oracle));
    // Inside a transaction the partitions of a backend answer as one UNION,
    // whose columns name no table and carry no key flags: the same names,
    // types, character sets and scales still.
    c.query_drop("BEGIN").unwrap();
    let values = |columns: Vec<(String, String, _, _, u16, u8)>| {
        columns
            .into_iter()
            .map(|(name, _, kind, _, charset, decimals)| (name, kind, charset, decimals))
            .collect::<Vec<_>>()
    };
    assert_eq!(values(describe(&mut c)), values(describe(&mut oracle)));
    c.query_drop("COMMIT").unwrap();
}

#[test]
fn limits_without_order_stop_early_and_lose_no_row() {
    let (proxy, db, mut oracle) = setup("scan_limit", 2);
    let mut c = proxy.connect(Some(&db));
    let all: Vec<i64> = oracle.query("SELECT id FROM items").unwrap();
    for (sql, count) in [
        ("SELECT id FROM items LIMIT 5", 5),
        ("SELECT id FROM items LIMIT 100, 50", 20),
        ("SELECT id FROM items LIMIT 500", 120),
        ("SELECT id FROM items", 120),
    ] {
        let mut got: Vec<i64> = c.query(sql).unwrap();
        assert_eq!(got.len(), count, "{sql}");
        assert!(got.iter().all(|id| all.contains(id)), "{sql}");
        got.sort_unstable();
        got.dedup();
        assert_eq!(got.len(), count, "{sql}: a row twice");
    }
}

#[test]
fn a_failing_partition_fails_the_whole_scan_and_the_session_goes_on() {
    let (proxy, db, _oracle) = setup("scan_errors", 3);
    let mut c = proxy.connect(Some(&db));
    match c.query_drop("SELECT id, nosuch FROM items ORDER BY id LIMIT 3") {
        Err(mysql::Error::MySqlError(e)) => assert_eq!(e.code, 1054, "{}", e.message),
        other => panic!("expected an error, got {other:?}"),
    }
    // A partition whose table no longer has the column: its error, whole.
    cluster()
        .direct(2, Some(&db))
        .query_drop("ALTER TABLE items_p3 DROP COLUMN label")
        .unwrap();
    match c.query_drop("SELECT id, label FROM items ORDER BY id") {
        Err(mysql::Error::MySqlError(e)) => assert_eq!(e.code, 1054, "{}", e.message),
        other => panic!("expected an error, got {other:?}"),
    }
    let count: Vec<i64> = c.query("SELECT id FROM items ORDER BY id LIMIT 2").unwrap();
    assert_eq!(count, [1, 2]);
}

#[test]
fn inside_a_transaction_ordered_scans_run_one_statement_per_backend() {
    let (proxy, db, mut oracle) = setup("scan_tx", 4);
    let mut c = proxy.connect(Some(&db));
    c.query_drop("BEGIN").unwrap();
    // Its own writes, which only the transaction's connections see.
    c.query_drop("UPDATE items SET price = 1.50 WHERE id IN (4, 6, 8)")
        .unwrap();
    oracle.query_drop("BEGIN").unwrap();
    oracle
        .query_drop("UPDATE items SET price = 1.50 WHERE id IN (4, 6, 8)")
        .unwrap();
    for sql in [
        "SELECT id, price FROM items ORDER BY price DESC, id -- a comment at the end",
        "SELECT id, name FROM items ORDER BY name, id LIMIT 7 OFFSET 3",
        "SELECT grp, COUNT(*), SUM(price) FROM items GROUP BY grp LIMIT 2",
        "SELECT DISTINCT grp FROM items ORDER BY grp DESC",
        "SELECT grp, COUNT(*) AS n FROM items GROUP BY grp ORDER BY n DESC, grp LIMIT 3",
    ] {
        assert_eq!(
            texts(&mut c, sql, &[1]),
            texts(&mut oracle, sql, &[1]),
            "{sql}"
        );
    }
    // Concatenated, partitions take turns on the transaction's connections.
    let ids: Vec<i64> = c.query("SELECT id FROM items LIMIT 200").unwrap();
    assert_eq!(ids.len(), 120);
    // Prepared, each backend's partitions join into one prepared statement,
    // which sees the transaction's writes.
    let sql = "SELECT id, price FROM items WHERE id > ? ORDER BY price DESC, id LIMIT 6";
    for after in [0, 5] {
        let expected: Vec<(i64, Option<String>)> = oracle.exec(sql, (after,)).unwrap();
        let got: Vec<(i64, Option<String>)> = c.exec(sql, (after,)).unwrap();
        assert_eq!(got, expected, "{sql} ({after})");
    }
    c.query_drop("ROLLBACK").unwrap();
    oracle.query_drop("ROLLBACK").unwrap();
    let ids: Vec<i64> = c.query("SELECT id FROM items ORDER BY id").unwrap();
    assert_eq!(ids, (1..=120).collect::<Vec<_>>());
}

/// Values as text, with the strings of `folded` columns folded as their
/// collation compares them: which of several equal strings MIN, MAX or a
/// group shows is the server's choice, on one table as over partitions.
fn texts(conn: &mut Conn, sql: &str, folded: &[usize]) -> Vec<Vec<Option<String>>> {
    rows(conn, sql)
        .into_iter()
        .map(|row| {
            row.into_iter()
                .enumerate()
                .map(|(i, value)| {
                    let text = match value {
                        mysql::Value::NULL => return None,
                        mysql::Value::Bytes(b) => String::from_utf8_lossy(&b).into_owned(),
                        other => format!("{other:?}"),
                    };
                    Some(match folded.contains(&i) {
                        true => text
                            .to_lowercase()
                            .trim_end()
                            .replace('ä', "a")
                            .replace('ß', "ss"),
                        false => text,
                    })
                })
                .collect()
        })
        .collect()
}

#[test]
fn aggregates_groups_and_distinct_match_one_table() {
    let seed = seed();
    let (proxy, db, mut oracle) = setup("scan_groups", seed);
    let mut c = proxy.connect(Some(&db));
    let filters = [
        "",
        " WHERE grp > 1",
        " WHERE id < 0",
        " WHERE id IN (3, 4, 7, 8)",
    ];
    let cases: [(&str, &[usize]); 22] = [
        (
            "SELECT grp, COUNT(*) AS n FROM items{filter} GROUP BY grp ORDER BY n DESC, grp LIMIT 3",
            &[],
        ),
        (
            "SELECT label, SUM(price) AS s, MIN(id) AS m FROM items{filter} GROUP BY label ORDER BY s DESC, m LIMIT 1, 2",
            &[0],
        ),
        (
            "SELECT grp, COUNT(*) AS n, SUM(price) FROM items{filter} GROUP BY grp HAVING n > 20 OR SUM(price) < 0",
            &[],
        ),
        (
            "SELECT label, COUNT(*), AVG(price) FROM items{filter} GROUP BY label HAVING AVG(price) >= -10.5 AND NOT COUNT(*) = 3 ORDER BY label DESC LIMIT 3",
            &[0],
        ),
        (
            "SELECT t, MAX(id) FROM items{filter} GROUP BY t HAVING 60 > MAX(id) LIMIT 2, 4",
            &[],
        ),
        (
            "SELECT COUNT(*), COUNT(price), SUM(price), MIN(price), MAX(price), AVG(price), \
             MIN(made), MAX(t), SUM(grp), AVG(grp), MIN(f), MAX(b), MIN(name), MAX(label) FROM items{filter}",
            &[12, 13],
        ),
        (
            "SELECT grp, COUNT(*), SUM(price), MIN(price), MAX(made), AVG(price) FROM items{filter} GROUP BY grp",
            &[],
        ),
        (
            "SELECT grp AS g, COUNT(*) AS n, AVG(price) FROM items{filter} GROUP BY g ORDER BY g DESC",
            &[],
        ),
        (
            "SELECT grp, COUNT(id) FROM items{filter} GROUP BY 1 LIMIT 2, 2",
            &[],
        ),
        (
            "SELECT name, COUNT(*), SUM(price), MAX(label) FROM items{filter} GROUP BY name",
            &[0, 3],
        ),
        (
            "SELECT label, grp, COUNT(*), MIN(id), MAX(id) FROM items{filter} GROUP BY label, grp ORDER BY grp, label",
            &[0],
        ),
        ("SELECT DISTINCT grp FROM items{filter}", &[]),
        (
            "SELECT DISTINCT grp, label FROM items{filter} ORDER BY label DESC, grp",
            &[1],
        ),
        ("SELECT DISTINCT name FROM items{filter} ORDER BY name LIMIT 3", &[0]),
        // DISTINCT over a literal or an alias that names a column too: the
        // partitions group by position, not by the text (`GROUP BY 56`
        // would be a position, `GROUP BY -11` an unknown column).
        ("SELECT DISTINCT 56 FROM items{filter}", &[]),
        ("SELECT DISTINCT - 11 AS grp, grp FROM items{filter}", &[]),
        (
            "SELECT DISTINCT grp * 2 AS label, label FROM items{filter} ORDER BY 2, 1",
            &[1],
        ),
        // DISTINCT over the GROUP BY's own keys: the groups.
        ("SELECT DISTINCT grp FROM items{filter} GROUP BY grp", &[]),
        (
            "SELECT DISTINCT label, grp FROM items{filter} GROUP BY grp, label ORDER BY grp",
            &[0],
        ),
        ("SELECT COUNT(*) AS total FROM items{filter} ORDER BY total", &[]),
        ("SELECT MAX(id), MIN(id) FROM items{filter} LIMIT 1 OFFSET 1", &[]),
        (
            "SELECT t, COUNT(*) FROM items{filter} GROUP BY t ORDER BY t LIMIT 5",
            &[],
        ),
    ];
    // Inside a transaction too: each backend's partitions as one UNION ALL.
    for transaction in [false, true] {
        if transaction {
            c.query_drop("BEGIN").unwrap();
        }
        for (template, folded) in cases {
            for filter in filters {
                let sql = template.replace("{filter}", filter);
                let mut expected = texts(&mut oracle, &sql, folded);
                let mut got = texts(&mut c, &sql, folded);
                // DISTINCT without ORDER BY: any order.
                if !sql.contains("ORDER BY") && sql.contains("DISTINCT") {
                    expected.sort();
                    got.sort();
                }
                assert_eq!(
                    got, expected,
                    "seed {seed}: {sql} (transaction: {transaction})"
                );
            }
        }
        if transaction {
            c.query_drop("COMMIT").unwrap();
        }
    }
    // DISTINCT over a GROUP BY of other columns folds groups after the
    // merge, never by a second GROUP BY: on a copy of the table.
    let sql = "SELECT DISTINCT COUNT(*) AS n FROM items GROUP BY grp ORDER BY n";
    assert_eq!(
        texts(&mut c, sql, &[]),
        texts(&mut oracle, sql, &[]),
        "seed {seed}"
    );
    // Sums of doubles add up in another order than on one table: equal to
    // the last digits.
    let sql = "SELECT SUM(f), AVG(f) FROM items";
    let (sum, avg): (f64, f64) = c.query_first(sql).unwrap().unwrap();
    let (direct_sum, direct_avg): (f64, f64) = oracle.query_first(sql).unwrap().unwrap();
    assert!(
        (sum - direct_sum).abs() <= direct_sum.abs() * 1e-12,
        "{sum} {direct_sum}"
    );
    assert!(
        (avg - direct_avg).abs() <= direct_avg.abs() * 1e-12,
        "{avg} {direct_avg}"
    );
}

/// The same merges over the binary protocol: prepared statements, rows in
/// the types' binary forms, parameters in the WHERE.
#[test]
fn prepared_scans_merge_binary_rows_like_one_table() {
    let seed = seed();
    let (proxy, db, mut oracle) = setup("scan_prepared", seed);
    let mut c = proxy.connect(Some(&db));
    let statements = [
        "SELECT id, name, price, made, t, f, b, label FROM items WHERE grp > ? ORDER BY made DESC, id",
        "SELECT id, price FROM items WHERE grp > ? ORDER BY price, id LIMIT 5, 7",
        "SELECT id, t FROM items WHERE grp > ? ORDER BY t DESC, id",
        "SELECT id, f, grp FROM items WHERE grp > ? ORDER BY grp, f DESC, id",
        "SELECT COUNT(*), SUM(price), MIN(made), MAX(t), AVG(price), AVG(grp), MIN(f), MAX(id) FROM items WHERE grp > ?",
        "SELECT grp, COUNT(*), SUM(price), MAX(made), AVG(price) FROM items WHERE grp > ? GROUP BY grp ORDER BY grp DESC",
        "SELECT DISTINCT grp FROM items WHERE grp > ? ORDER BY grp",
    ];
    // Inside a transaction each backend's partitions join into one prepared
    // UNION ALL that takes each partition's parameters in turn.
    for transaction in [false, true] {
        if transaction {
            c.query_drop("BEGIN").unwrap();
        }
        for sql in statements {
            for threshold in [-1, 2, 9] {
                let expected: Vec<Row> = oracle.exec(sql, (threshold,)).unwrap();
                let got: Vec<Row> = c
                    .exec(sql, (threshold,))
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
                let values = |rows: Vec<Row>| rows.into_iter().map(Row::unwrap).collect::<Vec<_>>();
                assert_eq!(
                    values(got),
                    values(expected),
                    "seed {seed}: {sql} ({threshold}, transaction: {transaction})"
                );
            }
        }
        if transaction {
            c.query_drop("COMMIT").unwrap();
        }
    }
}

/// One generated SELECT and the result columns whose strings compare folded.
struct Generated {
    sql: String,
    folded: Vec<usize>,
}

/// How a generated statement names its group keys.
#[derive(Clone, Copy, PartialEq)]
enum Naming {
    Column,
    Position,
    Alias,
}

/// A random SELECT over `items`: plain rows in a total order, aggregates,
/// GROUP BY or DISTINCT, with a random filter and LIMIT.
fn generate(rng: &mut StdRng) -> Generated {
    let pick = |rng: &mut StdRng, from: &[&'static str]| from[rng.random_range(0..from.len())];
    let filters = [
        "",
        " WHERE grp > 1",
        " WHERE price < 0",
        " WHERE id BETWEEN 20 AND 70",
        " WHERE id BETWEEN 5 AND 6",
        " WHERE id BETWEEN 9 AND 9 OR id = 14",
        " WHERE name LIKE 'a%'",
        " WHERE label IS NULL OR grp = 2",
        " WHERE t > '10:00:00' AND price IS NOT NULL",
        " WHERE id < 0",
    ];
    let filter = pick(rng, &filters);
    let strings = ["name", "label"];
    let limit = match rng.random_range(0..4) {
        0 => format!(" LIMIT {}", rng.random_range(0..15)),
        1 => format!(
            " LIMIT {}, {}",
            rng.random_range(0..10),
            rng.random_range(1..10)
        ),
        _ => String::new(),
    };
    let direction = |rng: &mut StdRng| if rng.random_bool(0.5) { " DESC" } else { "" };
    match rng.random_range(0..4) {
        // Rows, ordered totally (id last).
        0 => {
            let columns = ["id", "grp", "name", "price", "made", "t", "f", "b", "label"];
            let mut order = Vec::new();
            for _ in 0..rng.random_range(0..3) {
                order.push(format!("{}{}", pick(rng, &columns[1..]), direction(rng)));
            }
            order.push(format!("id{}", direction(rng)));
            Generated {
                sql: format!(
                    "SELECT {} FROM items{filter} ORDER BY {}{limit}",
                    columns.join(", "),
                    order.join(", ")
                ),
                folded: vec![],
            }
        }
        // Aggregates over every row.
        1 | 2 => {
            let grouped = rng.random_bool(0.7);
            let keys: Vec<&str> = match grouped {
                true => {
                    let first = pick(rng, &["grp", "label", "name", "t"]);
                    let mut keys = vec![first];
                    if rng.random_bool(0.4) {
                        let second = pick(rng, &["grp", "label", "made"]);
                        if second != first {
                            keys.push(second);
                        }
                    }
                    keys
                }
                false => vec![],
            };
            let mut items: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
            let mut folded: Vec<usize> = (0..keys.len())
                .filter(|&i| strings.contains(&keys[i]))
                .collect();
            for _ in 0..rng.random_range(1..4) {
                // Aggregates of DISTINCT and GROUP_CONCAT run on a copy of
                // the table (the partitions' parts cannot be combined).
                let function = pick(
                    rng,
                    &[
                        "COUNT",
                        "SUM",
                        "MIN",
                        "MAX",
                        "AVG",
                        "COUNT",
                        "SUM",
                        "MIN",
                        "MAX",
                        "AVG",
                        "COUNT DISTINCT",
                        "SUM DISTINCT",
                        "AVG DISTINCT",
                        "GROUP_CONCAT",
                    ],
                );
                let argument = match function {
                    "COUNT" => pick(rng, &["*", "price", "name"]),
                    "SUM" | "AVG" | "SUM DISTINCT" | "AVG DISTINCT" => {
                        pick(rng, &["price", "grp", "id"])
                    }
                    "COUNT DISTINCT" => pick(rng, &["grp", "price", "made", "b"]),
                    "GROUP_CONCAT" => pick(rng, &["id", "name", "price", "grp"]),
                    _ => pick(rng, &["price", "made", "t", "name", "label", "id", "b"]),
                };
                if strings.contains(&argument)
                    && !function.starts_with("COUNT")
                    && function != "GROUP_CONCAT"
                {
                    folded.push(items.len());
                }
                items.push(match function.split_once(' ') {
                    Some((name, _)) => format!("{name}(DISTINCT {argument})"),
                    None if function == "GROUP_CONCAT" => {
                        format!("GROUP_CONCAT({argument} ORDER BY id DESC SEPARATOR '|')")
                    }
                    None => format!("{function}({argument})"),
                });
            }
            // An expression over aggregates, now and then (never first:
            // HAVING reads the first aggregate).
            if rng.random_bool(0.3) {
                items.push(
                    pick(
                        rng,
                        &[
                            "COUNT(*) * 2 + 1",
                            "SUM(price) - MIN(price)",
                            "SUM(price) / COUNT(*)",
                            "SUM(grp) * 1.5",
                            "-SUM(id)",
                            "COUNT(price) / 3",
                            "(MAX(id) - MIN(id)) * 2",
                            // On a copy: what the merge does not compute.
                            "SUM(price) DIV 3",
                            "AVG(price) * 2",
                            "ROUND(SUM(price), 1)",
                            "1 + SUM(id) / COUNT(*)",
                        ],
                    )
                    .to_string(),
                );
            }
            // The keys as the statement names them: the column, its
            // position in the select list, or an alias given there.
            let named = match rng.random_range(0..3) {
                0 => Naming::Column,
                1 => Naming::Position,
                _ => Naming::Alias,
            };
            let key_name = |i: usize| match named {
                Naming::Column => keys[i].to_string(),
                Naming::Position => (i + 1).to_string(),
                Naming::Alias => format!("k{i}"),
            };
            if named == Naming::Alias {
                for (i, item) in items.iter_mut().enumerate().take(keys.len()) {
                    *item = format!("{item} AS k{i}");
                }
            }
            let group = match keys.is_empty() {
                true => String::new(),
                false => format!(
                    " GROUP BY {}",
                    (0..keys.len()).map(key_name).collect::<Vec<_>>().join(", ")
                ),
            };
            let order = match (keys.is_empty(), rng.random_bool(0.5)) {
                (false, true) => format!(
                    " ORDER BY {}",
                    (0..keys.len())
                        .map(|i| format!("{}{}", key_name(i), direction(rng)))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                _ => String::new(),
            };
            // HAVING on the first aggregate (a number), now and then.
            let first = &items[keys.len()];
            let numeric = !["name", "label", "made", "t", "b"]
                .iter()
                .any(|c| first.contains(c));
            let having = match (keys.is_empty(), rng.random_range(0..4)) {
                (false, 0) if numeric => {
                    format!(" HAVING {first} > {}", rng.random_range(-50..50))
                }
                // On what the select list lacks: on a copy.
                (false, 1) => format!(
                    " HAVING {} > {}",
                    pick(rng, &["COUNT(*)", "MAX(id)", "SUM(grp)"]),
                    rng.random_range(0..60)
                ),
                _ => String::new(),
            };
            Generated {
                sql: format!(
                    "SELECT {} FROM items{filter}{group}{having}{order}{limit}",
                    items.join(", ")
                ),
                folded,
            }
        }
        // DISTINCT, ordered by what it returns.
        _ => {
            let first = pick(rng, &["grp", "label", "name", "t"]);
            let mut columns = vec![first];
            if rng.random_bool(0.5) {
                let second = pick(rng, &["grp", "label"]);
                if second != first {
                    columns.push(second);
                }
            }
            let order: Vec<String> = columns
                .iter()
                .rev()
                .map(|c| format!("{c}{}", direction(rng)))
                .collect();
            // A literal among them now and then: a GROUP BY of its text
            // would read as a position or a column, and an ORDER BY that
            // leaves it out sorts the combined groups in hscale.
            if rng.random_bool(0.3) {
                let literal = pick(rng, &["56", "- 11 AS minus", "'x'", "1"]);
                columns.insert(rng.random_range(0..=columns.len()), literal);
            }
            let folded = (0..columns.len())
                .filter(|&i| strings.contains(&columns[i]))
                .collect();
            Generated {
                sql: format!(
                    "SELECT DISTINCT {} FROM items{filter} ORDER BY {}{limit}",
                    columns.join(", "),
                    order.join(", ")
                ),
                folded,
            }
        }
    }
}

#[test]
fn generated_selects_answer_like_one_table() {
    let seed = seed();
    let (proxy, db, mut oracle) = setup("scan_generated", seed);
    let mut c = proxy.connect(Some(&db));
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    for case in 0..300 {
        let Generated { sql, folded } = generate(&mut rng);
        let expected = texts(&mut oracle, &sql, &folded);
        let got = texts(&mut c, &sql, &folded);
        assert_eq!(got, expected, "seed {seed} case {case}: {sql}");
    }
}

/// The partition queries still running a statement that has `marker` in it.
fn still_running(marker: &str) -> Vec<String> {
    (1..=2)
        .flat_map(|backend| running(&mut cluster().direct(backend, None), marker))
        .collect()
}

/// The queries with `marker` in them running on a backend.
fn running(backend: &mut Conn, marker: &str) -> Vec<String> {
    backend
        .query(format!(
            "SELECT INFO FROM information_schema.PROCESSLIST \
             WHERE INFO LIKE '%{marker}%' AND INFO NOT LIKE '%PROCESSLIST%'"
        ))
        .unwrap()
}

/// Waits (up to 8 s, well under the 15 s the partitions would run on) until
/// no partition query has `marker` in it.
fn until_stopped(marker: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(8);
    while !still_running(marker).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "still running: {:?}",
            still_running(marker)
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn kill_query_stops_every_partition_of_a_scan() {
    let (proxy, db, _oracle) = setup("scan_kill", 5);
    let mut c = proxy.connect(Some(&db));
    let id: u32 = c.query_first("SELECT CONNECTION_ID()").unwrap().unwrap();
    // Each partition sleeps 0.5 s per row: 15 seconds, unless stopped.
    let slow = "SELECT id, SLEEP(0.5) FROM items ORDER BY id";
    let started = std::time::Instant::now();
    let result: Result<Vec<(u32, u32)>, _> = std::thread::scope(|scope| {
        scope.spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(700));
            proxy
                .connect(Some(&db))
                .query_drop(format!("KILL QUERY {id}"))
                .unwrap();
        });
        c.query(slow)
    });
    match result {
        Err(mysql::Error::MySqlError(e)) => assert_eq!(e.code, 1317, "{}", e.message),
        other => panic!("expected the query interrupted, got {other:?}"),
    }
    stopped_and_serving_on(&mut c, started, "SLEEP(0.5)");
}

/// A scan that started at `started` ended well before its partitions would
/// have, none of them still runs, and the session goes on.
fn stopped_and_serving_on(c: &mut Conn, started: std::time::Instant, marker: &str) {
    let elapsed = started.elapsed();
    assert!(elapsed < std::time::Duration::from_secs(8), "{elapsed:?}");
    until_stopped(marker);
    let count: i64 = c
        .query_first("SELECT COUNT(*) FROM items")
        .unwrap()
        .unwrap();
    assert_eq!(count, 120);
}

#[test]
fn a_client_that_leaves_mid_scan_stops_its_partitions_queries() {
    let (proxy, db, _oracle) = setup("scan_gone", 6);
    // Each partition sleeps 0.5 s per row: 15 seconds, unless stopped.
    let mut client = std::process::Command::new("mariadb")
        .args(["-h127.0.0.1", &format!("-P{}", proxy.port), "-uroot", &db])
        .args(["-e", "SELECT id, SLEEP(0.5) + 0 FROM items ORDER BY id"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the mariadb client");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(8);
    while still_running("SLEEP(0.5) + 0").is_empty() {
        assert!(std::time::Instant::now() < deadline, "the scan never ran");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    client.kill().unwrap();
    client.wait().unwrap();
    until_stopped("SLEEP(0.5) + 0");
}

#[test]
fn a_scan_past_its_time_budget_stops_with_1969_and_kills_its_partitions() {
    let scans = ScansConfig {
        timeout_ms: 700,
        ..ScansConfig::default()
    };
    let (proxy, db, _oracle) = setup_with("scan_timeout", 7, scans);
    let mut c = proxy.connect(Some(&db));
    // Each partition sleeps 0.5 s per row: 15 seconds, unless stopped.
    let started = std::time::Instant::now();
    let result: Result<Vec<(u32, f64)>, _> =
        c.query("SELECT id, SLEEP(0.5) + 1 FROM items ORDER BY id");
    match result {
        Err(mysql::Error::MySqlError(e)) => {
            assert_eq!((e.code, e.state.as_str()), (1969, "70100"), "{}", e.message);
            assert!(e.message.contains("timeout_ms = 700"), "{}", e.message);
        }
        other => panic!("expected the statement stopped, got {other:?}"),
    }
    stopped_and_serving_on(&mut c, started, "SLEEP(0.5) + 1");
}

#[test]
fn groups_sorted_by_an_aggregate_spill_past_the_memory_budget() {
    let seed = seed();
    let small = ScansConfig {
        memory_bytes: 2048,
        ..ScansConfig::default()
    };
    let (proxy, db, mut oracle) = setup_with("scan_spill", seed, small);
    let mut c = proxy.connect(Some(&db));
    // 120 groups, sorted by hscale without a LIMIT: more than 2 KiB of them.
    for sql in [
        "SELECT id, COUNT(*) AS n, MAX(price) AS top FROM items GROUP BY id ORDER BY top DESC, id",
        "SELECT grp, id, SUM(price) AS s FROM items GROUP BY grp, id ORDER BY s, grp, id LIMIT 5, 100",
        "SELECT name, COUNT(*) AS n FROM items GROUP BY name ORDER BY n DESC, name",
    ] {
        assert_eq!(
            texts(&mut c, sql, &[0]),
            texts(&mut oracle, sql, &[0]),
            "{sql} (seed {seed})"
        );
    }
    // Too little disk for them: error 1038, and the session goes on.
    let mut config = cluster().config();
    config.scans = ScansConfig {
        memory_bytes: 1024,
        spill_bytes: 2048,
        ..ScansConfig::default()
    };
    let tight = Proxy::start(config);
    let mut c = tight.connect(Some(&db));
    let sql = "SELECT id, MAX(price) AS top FROM items GROUP BY id ORDER BY top DESC, id";
    match c.query::<(u32, Option<String>), _>(sql) {
        Err(mysql::Error::MySqlError(e)) => assert_eq!(e.code, 1038, "{}", e.message),
        other => panic!("expected the merge out of budget, got {other:?}"),
    }
    let count: i64 = c
        .query_first("SELECT COUNT(*) FROM items")
        .unwrap()
        .unwrap();
    assert_eq!(count, 120);
}

/// The most queries with `marker` seen running at once on each backend
/// while `run` runs.
fn most_at_once(marker: &str, run: impl FnOnce() + Send) -> [usize; 2] {
    let done = std::sync::atomic::AtomicBool::new(false);
    let mut most = [0, 0];
    std::thread::scope(|scope| {
        scope.spawn(|| {
            run();
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        let mut backends = [cluster().direct(1, None), cluster().direct(2, None)];
        while !done.load(std::sync::atomic::Ordering::SeqCst) {
            for (i, conn) in backends.iter_mut().enumerate() {
                most[i] = most[i].max(running(conn, marker).len());
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    });
    most
}

#[test]
fn an_unordered_scan_runs_at_most_fan_out_partitions_of_a_backend_at_once() {
    // Two partitions on each backend, each sleeping 0.2 s a row for 4 rows.
    let one = ScansConfig {
        fan_out: 1,
        ..ScansConfig::default()
    };
    let (proxy, db, _oracle) = setup_with("scan_fan_out", 8, one);
    let wide = Proxy::for_cluster();
    for (proxy, expected) in [(&proxy, [1, 1]), (&wide, [2, 2])] {
        let sql = "SELECT id, SLEEP(0.2) + 3 FROM items WHERE id <= 16";
        let most = most_at_once("SLEEP(0.2) + 3", || {
            let rows: Vec<(u32, f64)> = proxy.connect(Some(&db)).query(sql).unwrap();
            assert_eq!(rows.len(), 16);
        });
        assert_eq!(most, expected, "partition queries at once per backend");
    }
}

#[test]
fn an_ordered_scan_after_a_statement_with_warnings_runs_and_replaces_them() {
    let (proxy, db, mut oracle) = setup("scan_after_warnings", 9);
    let mut c = proxy.connect(Some(&db));
    // The warning keeps the main backend's connection for SHOW WARNINGS,
    // where two partitions of the scan live.
    c.query_drop("SELECT 1 / 0").unwrap();
    let warnings: Vec<(String, u32, String)> = c.query("SHOW WARNINGS").unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let sql = "SELECT id, name FROM items ORDER BY name DESC, id LIMIT 30";
    assert_eq!(texts(&mut c, sql, &[1]), texts(&mut oracle, sql, &[1]));
    let warnings: Vec<(String, u32, String)> = c.query("SHOW WARNINGS").unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
}

//! Reference tables (`HSCALE SETUP_REFERENCE`): a small table copied to
//! every backend, joined inside each partition, written on every copy in
//! one transaction; checked on the backends directly and against an
//! oracle, the same rows in plain tables on one server.

use hscale_testkit::{cluster, Proxy};
use mysql::prelude::Queryable;
use mysql::Conn;

/// `users` partitioned by MOD(2) of id (odd ids on backend 2) and
/// `countries`, a reference table; the same rows plain in `<db>_oracle`.
fn setup(db: &str) -> (Proxy, String, Conn, Conn) {
    let mut config = cluster().config();
    // Writes wait for a table being copied this long.
    config.dictionary.lock_wait_ms = 1_000;
    let proxy = Proxy::start(config);
    let db = cluster().database(db);
    let oracle_db = cluster().database(&format!("{db}_oracle"));
    let mut oracle = cluster().direct(1, Some(&oracle_db));
    let mut direct = cluster().direct(1, Some(&db));
    for conn in [&mut oracle, &mut direct] {
        conn.query_drop("CREATE TABLE users (id INT PRIMARY KEY, country CHAR(2))")
            .unwrap();
        conn.query_drop(
            "CREATE TABLE countries (code CHAR(2) PRIMARY KEY, name VARCHAR(20) NOT NULL, \
             rank INT)",
        )
        .unwrap();
        conn.query_drop(
            "INSERT INTO countries VALUES ('de', 'Germany', 1), ('fr', 'France', 2), \
             ('it', 'Italy', NULL), ('xx', 'Nowhere', 4)",
        )
        .unwrap();
    }
    let mut c = proxy.connect(Some(&db));
    c.query_drop("HSCALE SETUP_TABLE('users', 'id', 'users_default', 1, 'MOD(2)')")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('users', 'odd', 1, 2)")
        .unwrap();
    for row in [
        "1, 'de'", "2, 'fr'", "3, 'it'", "4, 'de'", "5, NULL", "6, 'zz'", "7, 'fr'",
    ] {
        let insert = format!("INSERT INTO users VALUES ({row})");
        c.query_drop(&insert).unwrap();
        oracle.query_drop(&insert).unwrap();
    }
    (proxy, db, c, oracle)
}

/// The copy of `countries` on a backend, read there.
fn copy(backend: usize, db: &str) -> Vec<(String, String, Option<i32>)> {
    cluster()
        .direct(backend, Some(db))
        .query("SELECT code, name, rank FROM countries ORDER BY code")
        .unwrap()
}

fn refused(c: &mut Conn, sql: &str) -> String {
    match c.query_drop(sql) {
        Err(mysql::Error::MySqlError(e)) => {
            assert_eq!(e.code, 1235, "{sql}: {}", e.message);
            e.message
        }
        other => panic!("{sql}: expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_reference_table_is_copied_joined_inside_partitions_and_written_everywhere() {
    let (_proxy, db, mut c, mut oracle) = setup("reference");
    c.query_drop("HSCALE SETUP_REFERENCE('countries')").unwrap();
    assert_eq!(c.affected_rows(), 4, "the rows copied");
    assert_eq!(copy(2, &db), copy(1, &db));
    let listed: Vec<mysql::Row> = c.query("HSCALE SHOW_TABLES").unwrap();
    let functions: Vec<(String, String)> = listed
        .into_iter()
        .map(|r| {
            (
                r.get::<String, _>(1).unwrap(),
                r.get::<String, _>(3).unwrap(),
            )
        })
        .collect();
    assert!(
        functions.contains(&("countries".into(), "REFERENCE".into())),
        "{functions:?}"
    );

    // Joined inside each partition: routed, not copied.
    let join =
        "SELECT u.id, c.name FROM users u JOIN countries c ON c.code = u.country ORDER BY u.id";
    let explained: Vec<(String, u32, Option<String>, String)> =
        c.query(format!("HSCALE EXPLAIN {join}")).unwrap();
    assert_eq!(explained.len(), 2, "{explained:?}");
    assert!(explained.iter().all(|r| r.0 != "(copy)"), "{explained:?}");
    let same = |c: &mut Conn, oracle: &mut Conn, sql: &str| {
        let ours: Vec<mysql::Row> = c.query(sql).unwrap();
        let theirs: Vec<mysql::Row> = oracle.query(sql).unwrap();
        let print = |rows: Vec<mysql::Row>| -> Vec<Vec<String>> {
            rows.into_iter()
                .map(|r| r.unwrap().iter().map(|v| v.as_sql(false)).collect())
                .collect()
        };
        assert_eq!(print(ours), print(theirs), "{sql}");
    };
    same(&mut c, &mut oracle, join);
    same(
        &mut c,
        &mut oracle,
        "SELECT c.name, COUNT(*) FROM users u LEFT JOIN countries c ON c.code = u.country GROUP BY c.name ORDER BY c.name",
    );

    // Writes reach every copy, counted once.
    for (sql, affected) in [
        (
            "UPDATE countries SET rank = rank + 10 WHERE rank IS NOT NULL",
            3,
        ),
        ("INSERT INTO countries VALUES ('es', 'Spain', 7)", 1),
        ("DELETE FROM countries WHERE code = 'xx'", 1),
        ("REPLACE INTO countries VALUES ('it', 'Italia', 5)", 2),
    ] {
        c.query_drop(sql).unwrap();
        assert_eq!(c.affected_rows(), affected, "{sql}");
        oracle.query_drop(sql).unwrap();
        assert_eq!(copy(1, &db), copy(2, &db), "{sql}");
    }
    same(&mut c, &mut oracle, join);

    // A transaction's write is in every copy it joins, and a rollback
    // takes it back from all of them.
    c.query_drop("BEGIN").unwrap();
    c.query_drop("UPDATE countries SET name = 'Frankreich' WHERE code = 'fr'")
        .unwrap();
    let renamed: Vec<(i32, String)> = c
        .query("SELECT u.id, c.name FROM users u JOIN countries c ON c.code = u.country WHERE c.code = 'fr' ORDER BY u.id")
        .unwrap();
    assert_eq!(
        renamed,
        [(2, "Frankreich".into()), (7, "Frankreich".into())]
    );
    c.query_drop("ROLLBACK").unwrap();
    assert_eq!(copy(1, &db), copy(2, &db));
    assert_eq!(copy(2, &db)[2].1, "France");

    // A write that fails fails on every copy, and changes none.
    let duplicate = c.query_drop("INSERT INTO countries VALUES ('es', 'again', 1)");
    assert!(
        matches!(&duplicate, Err(mysql::Error::MySqlError(e)) if e.code == 1062),
        "{duplicate:?}"
    );
    assert_eq!(copy(1, &db), copy(2, &db));

    // What would make the copies differ is refused.
    assert!(refused(
        &mut c,
        "UPDATE countries SET name = UUID() WHERE code = 'de'"
    )
    .contains("UUID"));
    assert!(refused(&mut c, "ALTER TABLE countries ADD COLUMN x INT").contains("schema statement"));
    assert!(refused(
        &mut c,
        "INSERT INTO countries SELECT country, 'x', id FROM users WHERE id = 6"
    )
    .contains("reads tables other than reference tables"));
    assert!(refused(
        &mut c,
        "UPDATE countries c JOIN users u ON u.country = c.code SET c.rank = 0"
    )
    .contains("not one table's"));
    assert_eq!(copy(1, &db), copy(2, &db));
    // Read alone, it is the main backend's.
    same(&mut c, &mut oracle, "SELECT * FROM countries ORDER BY code");
    // It stays one: a second SETUP_REFERENCE is refused.
    assert!(c.query_drop("HSCALE SETUP_REFERENCE('countries')").is_err());
}

#[test]
fn a_setup_reference_that_stopped_midway_is_run_again() {
    let (proxy, db, mut c, _oracle) = setup("reference_again");
    // What an instance that died while copying leaves: the table recorded
    // as being copied, and a partial copy on backend 2.
    cluster()
        .direct(1, None)
        .query_drop(format!(
            "INSERT INTO hscale.reference_tables VALUES ('{db}', 'countries', '1,2', 'copying')"
        ))
        .unwrap();
    let mut other = cluster().direct(2, Some(&db));
    other
        .query_drop("CREATE TABLE countries (code CHAR(2) PRIMARY KEY, name VARCHAR(20) NOT NULL, rank INT)")
        .unwrap();
    other
        .query_drop("INSERT INTO countries VALUES ('de', 'Germany', 1)")
        .unwrap();
    c.query_drop("HSCALE REFRESH").unwrap();
    // Its writes wait for the copy (here until the lock wait runs out).
    let mut short = proxy.connect(Some(&db));
    let started = std::time::Instant::now();
    let waited = short.query_drop("UPDATE countries SET rank = 9 WHERE code = 'fr'");
    assert!(waited.is_err(), "a write while copying: {waited:?}");
    assert!(started.elapsed() >= std::time::Duration::from_millis(500));
    assert_eq!(copy(1, &db)[1].2, Some(2), "nothing written");
    // Run again, it copies anew and the table is ready.
    c.query_drop("HSCALE SETUP_REFERENCE('countries')").unwrap();
    assert_eq!(copy(2, &db), copy(1, &db));
    assert_eq!(copy(2, &db).len(), 4);
    c.query_drop("UPDATE countries SET rank = 9 WHERE code = 'fr'")
        .unwrap();
    assert_eq!(copy(2, &db), copy(1, &db));
}

//! Reference tables (`HSCALE SETUP_REFERENCE`): a small table copied to
//! every backend, joined inside each partition, written on every copy in
//! one transaction; checked on the backends directly and against an
//! oracle, the same rows in plain tables on one server.

use hscale_testkit::{cluster, Proxy};
use mysql::prelude::Queryable;
use mysql::Conn;

/// Every proxy that starts finishes the schema changes any test left in the
/// dictionary: one test at a time, so that none finishes another's
/// interrupted change while it is looked at.
fn alone() -> std::sync::MutexGuard<'static, ()> {
    static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ALONE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

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

/// `sql` answers through hscale as on the oracle's plain tables.
fn same(c: &mut Conn, oracle: &mut Conn, sql: &str) {
    let ours: Vec<mysql::Row> = c.query(sql).unwrap();
    let theirs: Vec<mysql::Row> = oracle.query(sql).unwrap();
    let print = |rows: Vec<mysql::Row>| -> Vec<Vec<String>> {
        rows.into_iter()
            .map(|r| r.unwrap().iter().map(|v| v.as_sql(false)).collect())
            .collect()
    };
    assert_eq!(print(ours), print(theirs), "{sql}");
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
    let _alone = alone();
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
    let _alone = alone();
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

/// The definition of `table` on a backend, as it tells it.
fn definition(backend: usize, db: &str, table: &str) -> Option<String> {
    cluster()
        .direct(backend, Some(db))
        .query_first::<(String, String), _>(format!("SHOW CREATE TABLE {table}"))
        .ok()
        .flatten()
        .map(|(_, definition)| definition)
}

/// The tables of `db` HSCALE SHOW_TABLES lists, with their functions.
fn listed(c: &mut Conn, db: &str) -> Vec<(String, String)> {
    let rows: Vec<mysql::Row> = c.query("HSCALE SHOW_TABLES").unwrap();
    rows.into_iter()
        .filter(|r| r.get::<String, _>(0).as_deref() == Some(db))
        .map(|r| {
            (
                r.get::<String, _>(1).unwrap(),
                r.get::<String, _>(3).unwrap(),
            )
        })
        .collect()
}

#[test]
fn schema_statements_on_a_reference_table_change_every_copy() {
    let _alone = alone();
    let (_proxy, db, mut c, mut oracle) = setup("reference_schema");
    c.query_drop("HSCALE SETUP_REFERENCE('countries')").unwrap();
    let join = |table: &str| {
        format!("SELECT u.id, c.* FROM users u JOIN {table} c ON c.code = u.country ORDER BY u.id")
    };
    for sql in [
        "ALTER TABLE countries ADD COLUMN continent VARCHAR(10) NOT NULL DEFAULT 'EU'",
        "CREATE INDEX by_name ON countries (name)",
        "UPDATE countries SET continent = 'none' WHERE code = 'xx'",
        "ALTER TABLE countries MODIFY rank BIGINT",
        "DROP INDEX by_name ON countries",
    ] {
        c.query_drop(sql).unwrap();
        oracle.query_drop(sql).unwrap();
        let main = definition(1, &db, "countries").expect("the original");
        assert_eq!(
            definition(2, &db, "countries").as_ref(),
            Some(&main),
            "{sql}"
        );
        // Joined inside each partition, with the new definition.
        same(&mut c, &mut oracle, &join("countries"));
    }
    assert!(definition(2, &db, "countries")
        .unwrap()
        .contains("`continent` varchar(10) NOT NULL DEFAULT 'EU'"));
    // Writes after the change reach every copy.
    c.query_drop("INSERT INTO countries VALUES ('pl', 'Poland', 8, 'EU')")
        .unwrap();
    let rows = |backend: usize| -> Vec<(String, String)> {
        cluster()
            .direct(backend, Some(&db))
            .query("SELECT code, continent FROM countries ORDER BY code")
            .unwrap()
    };
    assert_eq!(rows(1), rows(2));
    assert_eq!(rows(2).len(), 5);

    // What would leave the copies apart, or cannot be told, is refused.
    assert!(refused(&mut c, "ALTER TABLE countries RENAME TO lands").contains("RENAME TABLE"));
    assert!(refused(&mut c, "DROP TABLE countries, users").contains("statement of its own"));
    assert!(refused(&mut c, "RENAME TABLE countries TO users").contains("partitioned or reference"));
    assert_eq!(
        definition(1, &db, "countries"),
        definition(2, &db, "countries")
    );

    // RENAME: every copy, and the dictionary.
    c.query_drop("RENAME TABLE countries TO lands").unwrap();
    oracle
        .query_drop("RENAME TABLE countries TO lands")
        .unwrap();
    for backend in [1, 2] {
        assert_eq!(definition(backend, &db, "countries"), None);
        assert!(
            definition(backend, &db, "lands").is_some(),
            "backend {backend}"
        );
    }
    let tables = listed(&mut c, &db);
    assert!(
        tables.contains(&("lands".into(), "REFERENCE".into())),
        "{tables:?}"
    );
    assert!(
        !tables.iter().any(|(name, _)| name == "countries"),
        "{tables:?}"
    );
    let explained: Vec<(String, u32, Option<String>, String)> = c
        .query(format!("HSCALE EXPLAIN {}", join("lands")))
        .unwrap();
    assert!(explained.iter().all(|r| r.0 != "(copy)"), "{explained:?}");
    same(&mut c, &mut oracle, &join("lands"));

    // TRUNCATE: every copy.
    c.query_drop("TRUNCATE TABLE lands").unwrap();
    for backend in [1, 2] {
        let count: Option<u64> = cluster()
            .direct(backend, Some(&db))
            .query_first("SELECT COUNT(*) FROM lands")
            .unwrap();
        assert_eq!(count, Some(0), "backend {backend}");
    }

    // DROP: every copy, and the dictionary forgets it; a table made anew
    // under its name is a plain table on the main backend.
    c.query_drop("DROP TABLE lands").unwrap();
    for backend in [1, 2] {
        assert_eq!(definition(backend, &db, "lands"), None, "backend {backend}");
    }
    assert!(!listed(&mut c, &db).iter().any(|(name, _)| name == "lands"));
    c.query_drop("CREATE TABLE lands (code CHAR(2) PRIMARY KEY)")
        .unwrap();
    c.query_drop("INSERT INTO lands VALUES ('de')").unwrap();
    assert!(definition(1, &db, "lands").is_some());
    assert_eq!(definition(2, &db, "lands"), None);
}

#[test]
fn a_schema_change_on_a_reference_table_that_stopped_midway_is_finished() {
    let _alone = alone();
    let (proxy, db, mut c, _oracle) = setup("reference_schema_again");
    c.query_drop("HSCALE SETUP_REFERENCE('countries')").unwrap();
    // What an instance that died between the copies leaves: the change
    // recorded, done on the main backend's copy, not on backend 2's.
    let step = "ALTER TABLE countries ADD COLUMN z INT";
    let mut main = cluster().direct(1, Some(&db));
    main.query_drop(step).unwrap();
    for (i, backend, done) in [(0, 1, true), (1, 2, false)] {
        main.exec_drop(
            "INSERT INTO hscale.schema_changes VALUES (?, 'countries', ?, ?, 'countries', NULL, ?, ?, 'unchanged', NULL, NULL)",
            (&db, i, backend, step, done),
        )
        .unwrap();
    }
    c.query_drop("HSCALE REFRESH").unwrap();
    // Its writes wait for the change (here until the lock wait runs out);
    // reads go to the main backend's copy.
    let tables = listed(&mut c, &db);
    assert!(
        tables.contains(&("countries".into(), "REFERENCE (writes wait)".into())),
        "{tables:?}"
    );
    let mut short = proxy.connect(Some(&db));
    let waited = short.query_drop("UPDATE countries SET rank = 9 WHERE code = 'fr'");
    assert!(waited.is_err(), "a write during the change: {waited:?}");
    let z: Vec<Option<i32>> = c.query("SELECT z FROM countries").unwrap();
    assert_eq!(z.len(), 4);
    // The next instance to start finishes it.
    drop(Proxy::start(cluster().config()));
    assert!(definition(2, &db, "countries").unwrap().contains("`z` int"));
    assert_eq!(
        definition(1, &db, "countries"),
        definition(2, &db, "countries")
    );
    let left: Option<u64> = main
        .exec_first(
            "SELECT COUNT(*) FROM hscale.schema_changes WHERE db = ?",
            (&db,),
        )
        .unwrap();
    assert_eq!(left, Some(0));
    c.query_drop("HSCALE REFRESH").unwrap();
    c.query_drop("UPDATE countries SET z = 1 WHERE code = 'fr'")
        .unwrap();
    assert_eq!(copy(1, &db), copy(2, &db));
    let z: Vec<(String, Option<i32>)> = cluster()
        .direct(2, Some(&db))
        .query("SELECT code, z FROM countries WHERE z IS NOT NULL")
        .unwrap();
    assert_eq!(z, [("fr".to_string(), Some(1))]);
}

/// Whether a row of `countries` on `backend`'s copy can be written now, or
/// someone holds its lock (1205 after a second).
fn copy_row_locked(backend: usize, db: &str, code: &str) -> bool {
    let mut direct = cluster().direct(backend, Some(db));
    direct
        .query_drop("SET SESSION innodb_lock_wait_timeout = 1")
        .unwrap();
    let write = format!("UPDATE countries SET rank = rank WHERE code = '{code}'");
    match direct.query_drop(write) {
        Ok(()) => false,
        Err(mysql::Error::MySqlError(e)) if e.code == 1205 => true,
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn reads_of_a_reference_table_stay_on_the_backend_the_transaction_is_on() {
    let _alone = alone();
    let (_proxy, db, mut c, mut oracle) = setup("reference_reads_local");
    c.query_drop("HSCALE SETUP_REFERENCE('countries')").unwrap();
    // A transaction on backend 2 (odd ids) reads the reference table: it
    // reads backend 2's copy, and opens nothing on backend 1. Locking
    // reads show where: the lock is on the copy they read.
    for (text, prepared) in [("as a query", false), ("prepared", true)] {
        c.query_drop("BEGIN").unwrap();
        c.query_drop("UPDATE users SET country = country WHERE id = 3")
            .unwrap();
        let read = "SELECT name FROM countries WHERE code = 'de' FOR UPDATE";
        let name: Option<String> = match prepared {
            false => c.query_first(read).unwrap(),
            true => c.exec_first(read, ()).unwrap(),
        };
        assert_eq!(name.as_deref(), Some("Germany"), "{text}");
        assert!(
            copy_row_locked(2, &db, "de"),
            "{text}: backend 2's copy was not read"
        );
        assert!(
            !copy_row_locked(1, &db, "de"),
            "{text}: backend 1's copy was read"
        );
        // Joined with its partitioned table and alone, as the oracle answers.
        same(
            &mut c,
            &mut oracle,
            "SELECT code, name FROM countries ORDER BY code",
        );
        c.query_drop("COMMIT").unwrap();
    }
    // Outside a transaction, and in one on the main backend: the main
    // backend's copy.
    c.query_drop("BEGIN").unwrap();
    c.query_drop("UPDATE users SET country = country WHERE id = 2")
        .unwrap();
    c.query_drop("SELECT name FROM countries WHERE code = 'fr' FOR UPDATE")
        .unwrap();
    assert!(copy_row_locked(1, &db, "fr"));
    assert!(!copy_row_locked(2, &db, "fr"));
    c.query_drop("COMMIT").unwrap();
    same(
        &mut c,
        &mut oracle,
        "SELECT code, name, rank FROM countries ORDER BY code",
    );
}

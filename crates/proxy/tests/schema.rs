//! Schema statements on a partitioned table, on real MariaDB servers: ALTER,
//! CREATE/DROP INDEX, TRUNCATE, RENAME and DROP reach every physical table
//! under the table lock; a failure on one partition names the ones that
//! changed; CREATE TABLE of the logical name is refused as the server would.

use hscale_testkit::{cluster, Proxy};
use mysql::prelude::Queryable;
use mysql::Conn;

const USERS: &str = "CREATE TABLE users (id INT UNSIGNED PRIMARY KEY, nickname VARCHAR(64) NOT NULL, created DATE NOT NULL)";

/// `users` by PREFIX(3) of nickname: 'mar' in users_nick1 on backend 2,
/// 'pet' in users_nick2 on backend 1, the rest in users_default on backend 1,
/// a row in each.
fn partitioned(db: &str) -> (Proxy, String) {
    let db = cluster().database(db);
    cluster().direct(1, Some(&db)).query_drop(USERS).unwrap();
    let proxy = Proxy::for_cluster();
    let mut c = proxy.connect(Some(&db));
    c.query_drop("HSCALE SETUP_TABLE('users', 'nickname', 'users_default', 1, 'PREFIX(3)')")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('users', 'nick1', 'mar', 2)")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('users', 'nick2', 'pet', 1)")
        .unwrap();
    // One backend per statement: transactions = "single".
    for row in [
        "(1, 'martin', '2008-05-06')",
        "(2, 'peter', '2008-05-07')",
        "(3, 'zoe', '2008-05-08')",
    ] {
        c.query_drop(format!("INSERT INTO users VALUES {row}"))
            .unwrap();
    }
    (proxy, db)
}

/// The physical tables of the test's partitioned table, and their backends.
const PHYSICAL: [(usize, &str); 3] = [(1, "users_default"), (2, "users_nick1"), (1, "users_nick2")];

fn error_of(conn: &mut Conn, sql: &str) -> (u16, String) {
    match conn.query_drop(sql) {
        Err(mysql::Error::MySqlError(e)) => (e.code, e.message),
        other => panic!("{sql}: expected an error, got {other:?}"),
    }
}

fn columns_of(backend: usize, db: &str, table: &str) -> Vec<String> {
    cluster()
        .direct(backend, None)
        .exec(
            "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
            (db, table),
        )
        .unwrap()
}

fn indexes(backend: usize, db: &str, table: &str) -> Vec<String> {
    cluster()
        .direct(backend, None)
        .exec(
            "SELECT DISTINCT INDEX_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY INDEX_NAME",
            (db, table),
        )
        .unwrap()
}

fn tables(backend: usize, db: &str) -> Vec<String> {
    cluster()
        .direct(backend, Some(db))
        .query("SHOW TABLES")
        .unwrap()
}

#[test]
fn alter_and_indexes_reach_every_partition() {
    let (proxy, db) = partitioned("schema_alter");
    let mut c = proxy.connect(Some(&db));
    c.query_drop("ALTER TABLE users ADD COLUMN age INT NULL")
        .unwrap();
    for (backend, table) in PHYSICAL {
        assert_eq!(
            columns_of(backend, &db, table),
            ["id", "nickname", "created", "age"],
            "{table}"
        );
    }
    // A column added before the partition column moves it: an INSERT without
    // a column list is still placed by the nickname.
    c.query_drop(format!(
        "ALTER TABLE `{db}`.users ADD COLUMN tag CHAR(1) NULL FIRST"
    ))
    .unwrap();
    c.query_drop("INSERT INTO users VALUES ('x', 4, 'mary', '2009-01-01', 40)")
        .unwrap();
    let placed: Vec<u32> = cluster()
        .direct(2, Some(&db))
        .query("SELECT id FROM users_nick1 ORDER BY id")
        .unwrap();
    assert_eq!(placed, [1, 4]);
    let explain: Vec<(String, u32, String, String)> = c
        .query("HSCALE EXPLAIN CREATE INDEX by_age ON users (age)")
        .unwrap();
    assert_eq!(explain.len(), 3);
    assert_eq!(explain[1].3, "CREATE INDEX by_age ON `users_nick1` (age)");
    c.query_drop("CREATE INDEX by_age ON users (age)").unwrap();
    for (backend, table) in PHYSICAL {
        assert_eq!(
            indexes(backend, &db, table),
            ["by_age", "PRIMARY"],
            "{table}"
        );
    }
    c.query_drop("DROP INDEX by_age ON users").unwrap();
    for (backend, table) in PHYSICAL {
        assert_eq!(indexes(backend, &db, table), ["PRIMARY"], "{table}");
    }
    // The partition column stays as it is.
    let (code, message) = error_of(&mut c, "ALTER TABLE users MODIFY nickname INT");
    assert_eq!(code, 1235);
    assert!(message.contains("partition column `nickname`"), "{message}");
    assert_eq!(
        error_of(&mut c, "ALTER TABLE users RENAME TO people").0,
        1235
    );
}

#[test]
fn a_failing_schema_statement_names_the_partitions_that_changed() {
    let (proxy, db) = partitioned("schema_partial");
    let mut c = proxy.connect(Some(&db));
    // Refused by the first physical table: nothing changed, the server's error.
    let (code, message) = error_of(&mut c, "ALTER TABLE users ADD COLUMN nickname INT");
    assert_eq!(code, 1060);
    assert!(!message.contains("hscale"), "{message}");
    // A partition that drifted: the statement stops there, and says so.
    cluster()
        .direct(2, Some(&db))
        .query_drop("ALTER TABLE users_nick1 ADD COLUMN extra INT")
        .unwrap();
    let (code, message) = error_of(&mut c, "ALTER TABLE users ADD COLUMN extra INT");
    assert_eq!(code, 1060);
    assert!(
        message.contains("changed already: users_default (backend 1)")
            && message.contains("not changed: users_nick2 (backend 1)"),
        "{message}"
    );
    assert!(columns_of(1, &db, "users_default").contains(&"extra".to_string()));
    assert!(!columns_of(1, &db, "users_nick2").contains(&"extra".to_string()));
    // The table is not left locked.
    let found: Vec<u32> = c
        .query("SELECT id FROM users WHERE nickname = 'peter'")
        .unwrap();
    assert_eq!(found, [2]);
}

#[test]
fn truncate_rename_and_drop_reach_every_partition_and_the_dictionary() {
    let (proxy, db) = partitioned("schema_rename");
    let mut c = proxy.connect(Some(&db));
    c.query_drop("RENAME TABLE users TO members").unwrap();
    assert_eq!(tables(1, &db), ["members_default", "members_nick2"]);
    assert_eq!(tables(2, &db), ["members_nick1"]);
    let found: Vec<u32> = c
        .query("SELECT id FROM members WHERE nickname = 'martin'")
        .unwrap();
    assert_eq!(found, [1]);
    let mut all: Vec<u32> = c.query("SELECT id FROM members").unwrap();
    all.sort();
    assert_eq!(all, [1, 2, 3]);
    assert_eq!(error_of(&mut c, "SELECT id FROM users").0, 1146);
    let partitions: Vec<(String, Option<String>, u32, String, String)> =
        c.query("HSCALE SHOW_PARTITIONS('members')").unwrap();
    let physical: Vec<&str> = partitions.iter().map(|p| p.3.as_str()).collect();
    assert_eq!(
        physical,
        ["members_default", "members_nick1", "members_nick2"]
    );
    // The logical name is taken, though no physical table has it.
    assert_eq!(error_of(&mut c, "CREATE TABLE members (id INT)").0, 1050);
    c.query_drop("CREATE TABLE IF NOT EXISTS members (id INT)")
        .unwrap();
    assert_eq!(tables(1, &db), ["members_default", "members_nick2"]);
    c.query_drop("TRUNCATE TABLE members").unwrap();
    for (backend, table) in [
        (1, "members_default"),
        (2, "members_nick1"),
        (1, "members_nick2"),
    ] {
        let rows: Vec<u32> = cluster()
            .direct(backend, Some(&db))
            .query(format!("SELECT id FROM {table}"))
            .unwrap();
        assert!(rows.is_empty(), "{table}: {rows:?}");
    }
    c.query_drop("DROP TABLE members").unwrap();
    assert!(tables(1, &db).is_empty());
    assert!(tables(2, &db).is_empty());
    let partitioned: Vec<mysql::Row> = c.query("HSCALE SHOW_TABLES").unwrap();
    assert!(!format!("{partitioned:?}").contains(&db), "{partitioned:?}");
    assert_eq!(error_of(&mut c, "SELECT id FROM members").0, 1146);
    // The name is free again for a plain table.
    c.query_drop("CREATE TABLE members (id INT)").unwrap();
    assert_eq!(tables(1, &db), ["members"]);
}

#[test]
fn a_schema_statement_commits_the_open_transaction_first() {
    let (proxy, db) = partitioned("schema_commit");
    let mut c = proxy.connect(Some(&db));
    c.query_drop("BEGIN").unwrap();
    c.query_drop("INSERT INTO users VALUES (5, 'marek', '2010-01-01')")
        .unwrap();
    c.query_drop("ALTER TABLE users ADD COLUMN age INT NULL")
        .unwrap();
    c.query_drop("ROLLBACK").unwrap();
    let found: Vec<u32> = cluster()
        .direct(2, Some(&db))
        .query("SELECT id FROM users_nick1 WHERE id = 5")
        .unwrap();
    assert_eq!(
        found,
        [5],
        "the server commits before DDL, and so does hscale"
    );
}

#[test]
fn metadata_names_the_logical_table_never_a_physical_one() {
    let (proxy, db) = partitioned("schema_metadata");
    let mut direct = cluster().direct(1, Some(&db));
    direct.query_drop("CREATE TABLE notes (id INT)").unwrap();
    let mut c = proxy.connect(Some(&db));

    let (_, physical): (String, String) = direct
        .query_first("SHOW CREATE TABLE users_default")
        .unwrap()
        .unwrap();
    let (name, create): (String, String) =
        c.query_first("SHOW CREATE TABLE users").unwrap().unwrap();
    assert_eq!(name, "users");
    assert_eq!(create, physical.replace("`users_default`", "`users`"));
    assert!(create.starts_with("CREATE TABLE `users` ("), "{create}");

    let keys: Vec<mysql::Row> = c
        .query(format!("SHOW KEYS FROM users FROM `{db}`"))
        .unwrap();
    let direct_keys: Vec<mysql::Row> = direct.query("SHOW INDEX FROM users_default").unwrap();
    assert_eq!(keys.len(), direct_keys.len());
    for key in &keys {
        assert_eq!(key.get::<String, _>(0).unwrap(), "users");
    }

    let status: Vec<mysql::Row> = c.query("SHOW TABLE STATUS").unwrap();
    let names: Vec<String> = status.iter().map(|r| r.get(0).unwrap()).collect();
    assert_eq!(names, ["notes", "users"]);
    let status: Vec<mysql::Row> = c.query("SHOW TABLE STATUS LIKE 'users'").unwrap();
    assert_eq!(status.len(), 1);
    let status: Vec<mysql::Row> = c.query("SHOW TABLE STATUS LIKE 'users\\_%'").unwrap();
    assert!(status.is_empty());

    let tables: Vec<String> = c
        .query(format!("SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = '{db}' ORDER BY TABLE_NAME"))
        .unwrap();
    assert_eq!(tables, ["notes", "users"]);
    let mut renamed: Vec<(String, String)> = c
        .query("SELECT table_name AS t, table_schema FROM information_schema.tables WHERE table_schema = DATABASE()")
        .unwrap();
    renamed.sort();
    assert_eq!(
        renamed,
        [("notes".into(), db.clone()), ("users".into(), db.clone())]
    );
    let columns: Vec<(String, String)> = c
        .query(format!("SELECT DISTINCT TABLE_NAME, TABLE_SCHEMA FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = '{db}' ORDER BY TABLE_NAME"))
        .unwrap();
    assert_eq!(
        columns,
        [("notes".into(), db.clone()), ("users".into(), db.clone())]
    );

    // What ORMs and drivers ask about one table: its logical name finds it,
    // whatever the filter's form, and excludes it where negated.
    let mut named = |filter: &str| -> Vec<String> {
        c.query(format!("SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = '{db}' AND {filter} ORDER BY TABLE_NAME"))
            .unwrap()
    };
    assert_eq!(named("TABLE_NAME = 'users'"), ["users"]);
    assert_eq!(named("'USERS' = TABLES.table_name"), ["users"]);
    assert_eq!(named("TABLE_NAME LIKE 'us%'"), ["users"]);
    assert_eq!(
        named("TABLE_NAME IN ('notes', 'users')"),
        ["notes", "users"]
    );
    assert_eq!(named("TABLE_NAME <> 'users'"), ["notes"]);
    assert_eq!(named("TABLE_NAME NOT LIKE 'u%'"), ["notes"]);
    assert_eq!(named("TABLE_NAME NOT IN ('users')"), ["notes"]);
    let logical: Vec<String> = c
        .query(format!("SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = '{db}' AND TABLE_NAME = 'users' ORDER BY ORDINAL_POSITION"))
        .unwrap();
    assert_eq!(logical, columns_of(1, &db, "users_default"));
    assert!(!logical.is_empty());
}

/// `notes` on backend 1, the main one; `events` by MOD(2) of id with its
/// default table on backend 2 and partition `odd` on backend 1.
fn default_off_main(db: &str) -> (Proxy, Conn, String) {
    let db = cluster().database(db);
    cluster()
        .direct(1, Some(&db))
        .query_drop("CREATE TABLE notes (id INT)")
        .unwrap();
    cluster()
        .direct(2, Some(&db))
        .query_drop("CREATE TABLE events (id INT PRIMARY KEY, what VARCHAR(20)) ENGINE=InnoDB")
        .unwrap();
    let proxy = Proxy::for_cluster();
    let mut c = proxy.connect(Some(&db));
    c.query_drop("HSCALE SETUP_TABLE('events', 'id', 'events_default', 2, 'MOD(2)')")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('events', 'odd', 1, 1)")
        .unwrap();
    (proxy, c, db)
}

#[test]
fn table_status_finds_a_table_whose_default_partition_is_on_another_backend() {
    let (_proxy, mut c, db) = default_off_main("schema_status_elsewhere");

    let names = |c: &mut Conn, sql: &str| -> Vec<(String, String)> {
        let rows: Vec<mysql::Row> = c.query(sql).unwrap();
        rows.iter()
            .map(|r| (r.get(0).unwrap(), r.get(1).unwrap()))
            .collect()
    };
    let engines = |tables: &[&str]| -> Vec<(String, String)> {
        tables
            .iter()
            .map(|t| (t.to_string(), "InnoDB".to_string()))
            .collect()
    };
    assert_eq!(
        names(&mut c, "SHOW TABLE STATUS"),
        engines(&["events", "notes"])
    );
    assert_eq!(
        names(
            &mut c,
            &format!("SHOW TABLE STATUS FROM `{db}` LIKE 'ev%';")
        ),
        engines(&["events"])
    );
    assert_eq!(
        names(&mut c, "SHOW TABLE STATUS LIKE 'no%'"),
        engines(&["notes"])
    );
    assert_eq!(
        names(&mut c, "SHOW TABLE STATUS WHERE Engine = 'InnoDB'"),
        engines(&["events", "notes"])
    );
    assert!(names(&mut c, "SHOW TABLE STATUS WHERE Engine = 'Aria'").is_empty());
    // The statistics are the default table's, read on backend 2.
    let status: Vec<mysql::Row> = c.query("SHOW TABLE STATUS LIKE 'events'").unwrap();
    let direct: Vec<mysql::Row> = cluster()
        .direct(2, Some(&db))
        .query("SHOW TABLE STATUS LIKE 'events_default'")
        .unwrap();
    assert_eq!(
        status[0].get::<String, _>("Create_time"),
        direct[0].get::<String, _>("Create_time")
    );
}

#[test]
fn information_schema_finds_a_table_whose_default_partition_is_on_another_backend() {
    let (_proxy, mut c, db) = default_off_main("schema_is_elsewhere");
    let tables = "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()";

    let mut unordered: Vec<String> = c.query(tables).unwrap();
    unordered.sort();
    assert_eq!(unordered, ["events", "notes"]);
    let ordered: Vec<String> = c.query(format!("{tables} ORDER BY TABLE_NAME")).unwrap();
    assert_eq!(ordered, ["events", "notes"]);
    let others: Vec<String> = c
        .query(format!("{tables} AND TABLE_NAME <> 'events'"))
        .unwrap();
    assert_eq!(others, ["notes"]);
    // Rows of one backend keep the order the query asked for.
    let columns: Vec<String> = c
        .query(format!("SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = '{db}' AND TABLE_NAME = 'events' ORDER BY ORDINAL_POSITION DESC"))
        .unwrap();
    assert_eq!(columns, ["what", "id"]);
    let mut aliased: Vec<(String, String)> = c
        .query("SELECT c.column_name, c.table_name AS t FROM information_schema.columns AS c WHERE c.table_schema = DATABASE() AND c.table_name LIKE 'ev%'")
        .unwrap();
    aliased.sort();
    assert_eq!(
        aliased,
        [
            ("id".to_string(), "events".to_string()),
            ("what".to_string(), "events".to_string())
        ]
    );
    let indexes: Vec<String> = c
        .query("SELECT INDEX_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'events'")
        .unwrap();
    assert_eq!(indexes, ["PRIMARY"]);
    // An aggregate that does not reach the other backend's tables is exact.
    let count: Option<u64> = c
        .query_first("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'notes'")
        .unwrap();
    assert_eq!(count, Some(1));

    // What hscale cannot combine exactly, it refuses.
    for refused in [
        "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()"
            .to_string(),
        format!("{tables} ORDER BY CREATE_TIME"),
        format!("{tables} LIMIT 5"),
    ] {
        let (code, message) = error_of(&mut c, &refused);
        assert_eq!(code, 1235, "{refused}: {message}");
        assert!(message.contains("backend 2"), "{message}");
        assert!(message.contains(&format!("{db}.events")), "{message}");
    }
}

//! What an admin command must never do, tried as a hostile tester would: a
//! command that would corrupt the dictionary or another table is refused
//! before it changes anything, and one that fails leaves nothing behind that
//! stops a retry. Each outcome is checked on the backends directly.

use hscale_testkit::{cluster, Proxy};
use mysql::prelude::Queryable;
use mysql::Conn;

const USERS: &str = "CREATE TABLE users (id INT UNSIGNED PRIMARY KEY, nickname VARCHAR(64) NOT NULL, created DATE NOT NULL)";

/// `users` by MOD(2) of id, odd ids on backend 2, two rows in each place.
fn partitioned_users(name: &str) -> (Proxy, Conn, String) {
    let db = cluster().database(name);
    let mut direct = cluster().direct(1, Some(&db));
    direct.query_drop(USERS).unwrap();
    direct
        .query_drop(
            "INSERT INTO users VALUES (1, 'ann', '2024-01-01'), (2, 'bob', '2024-01-02'), (3, 'cid', '2024-01-03'), (4, 'dan', '2024-01-04')",
        )
        .unwrap();
    let proxy = Proxy::for_cluster();
    let mut c = proxy.connect(Some(&db));
    c.query_drop("HSCALE SETUP_TABLE('users', 'id', 'users_default', 1, 'MOD(2)')")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('users', 'odd', 1, 2)")
        .unwrap();
    (proxy, c, db)
}

fn error_of(conn: &mut Conn, sql: &str) -> (u16, String) {
    match conn.query_drop(sql) {
        Err(mysql::Error::MySqlError(e)) => (e.code, e.message),
        other => panic!("{sql}: expected an error, got {other:?}"),
    }
}

fn tables_on(backend: usize, db: &str) -> Vec<String> {
    cluster()
        .direct(backend, Some(db))
        .query("SHOW TABLES")
        .unwrap()
}

/// The dictionary's rows of `db`'s tables, straight from the main backend.
fn dictionary_rows(schema_table: &str, db: &str) -> Vec<String> {
    cluster()
        .direct(1, None)
        .query(format!(
            "SELECT CONCAT_WS(',', db, {}) FROM hscale.{schema_table} WHERE db = '{db}' ORDER BY 1",
            if schema_table == "tables" {
                "name, default_table"
            } else {
                "table_name, partition_name"
            }
        ))
        .unwrap()
}

/// The table still answers as one table, through hscale.
fn all_ids(c: &mut Conn) -> Vec<u32> {
    c.query("SELECT id FROM users ORDER BY id").unwrap()
}

#[test]
fn setup_table_of_a_table_the_dictionary_uses_is_refused_before_anything_changes() {
    let (_proxy, mut c, db) = partitioned_users("trust_claimed");
    let tables = dictionary_rows("tables", &db);
    let partitions = dictionary_rows("partitions", &db);
    for sql in [
        // Another table's default table, its partition, itself.
        "HSCALE SETUP_TABLE('users_default', 'id', 'ud_default', 1, 'MOD(2)')",
        "HSCALE SETUP_TABLE('users_odd', 'id', 'uo_default', 2, 'MOD(2)')",
        // A default table named like another table's default or partition.
        "HSCALE SETUP_TABLE('users', 'id', 'x_default', 1, 'MOD(2)')",
    ] {
        let (code, message) = error_of(&mut c, sql);
        assert!(matches!(code, 1210 | 1050), "{sql}: {code} {message}");
    }
    cluster()
        .direct(1, Some(&db))
        .query_drop("CREATE TABLE other (id INT PRIMARY KEY)")
        .unwrap();
    for default in ["users_default", "USERS_ODD", "users", "other"] {
        let sql = format!("HSCALE SETUP_TABLE('other', 'id', '{default}', 1, 'MOD(2)')");
        let (code, message) = error_of(&mut c, &sql);
        assert!(matches!(code, 1210 | 1050), "{sql}: {code} {message}");
    }
    let (code, message) = error_of(
        &mut c,
        "HSCALE SETUP_TABLE('other', 'id', 'mysql.other_default', 1, 'MOD(2)')",
    );
    assert_eq!(code, 1210, "{message}");
    assert!(message.contains("database"), "{message}");
    assert_eq!(dictionary_rows("tables", &db), tables);
    assert_eq!(dictionary_rows("partitions", &db), partitions);
    assert_eq!(tables_on(1, &db), ["other", "users_default"]);
    assert_eq!(tables_on(2, &db), ["users_odd"]);
    assert_eq!(all_ids(&mut c), [1, 2, 3, 4]);
}

#[test]
fn setup_table_in_hscales_own_schema_is_refused_and_the_dictionary_survives_a_restart() {
    let (proxy, mut c, _db) = partitioned_users("trust_own_schema");
    for sql in [
        "HSCALE SETUP_TABLE('hscale.partitions', 'db', 'partitions_default', 1, 'NONE()')",
        "HSCALE SETUP_TABLE('HSCALE.tables', 'db', 'tables_default', 1, 'NONE()')",
    ] {
        let (code, message) = error_of(&mut c, sql);
        assert_eq!(code, 1210, "{sql}: {message}");
        assert!(message.contains("hscale's own schema"), "{message}");
    }
    let hscale_tables = tables_on(1, "hscale");
    assert!(
        hscale_tables.contains(&"partitions".to_string()),
        "{hscale_tables:?}"
    );
    assert!(
        hscale_tables.contains(&"tables".to_string()),
        "{hscale_tables:?}"
    );
    assert_eq!(all_ids(&mut c), [1, 2, 3, 4]);
    // A new instance reads the same dictionary: every partition is known.
    drop(c);
    drop(proxy);
    let proxy = Proxy::for_cluster();
    let mut c = proxy.connect(Some("trust_own_schema"));
    assert_eq!(all_ids(&mut c), [1, 2, 3, 4]);
    assert_eq!(
        c.query_first::<u64, _>("SELECT COUNT(*) FROM users")
            .unwrap(),
        Some(4)
    );
}

#[test]
fn an_admin_command_followed_by_another_statement_runs_neither() {
    let (_proxy, mut c, db) = partitioned_users("trust_alone");
    cluster()
        .direct(1, Some(&db))
        .query_drop("CREATE TABLE victim (id INT)")
        .unwrap();
    for sql in [
        "HSCALE STATUS; DROP TABLE victim",
        "HSCALE ADD_PARTITION('users', 'two', 2, 2); DROP TABLE victim",
        "HSCALE EXPLAIN SELECT * FROM users; DROP TABLE victim",
    ] {
        let (code, message) = error_of(&mut c, sql);
        assert_eq!(code, 1064, "{sql}: {message}");
        assert!(message.contains("alone in its query"), "{message}");
    }
    assert!(tables_on(1, &db).contains(&"victim".to_string()));
    assert_eq!(
        dictionary_rows("partitions", &db).len(),
        1,
        "no partition 'two'"
    );
    // Trailing semicolons are no statement.
    let rows: Vec<mysql::Row> = c.query("HSCALE SHOW_TABLES;").unwrap();
    assert!(!rows.is_empty());
}

#[test]
fn a_failed_add_partition_leaves_no_table_and_a_retry_works() {
    let (_proxy, mut c, db) = partitioned_users("trust_retry");
    cluster()
        .direct(1, Some(&db))
        .query_drop("CREATE TABLE notes (id INT PRIMARY KEY, body VARCHAR(400) NOT NULL)")
        .unwrap();
    c.query_drop("HSCALE SETUP_TABLE('notes', 'body', 'notes_default', 1, 'NONE()')")
        .unwrap();
    let long = "x".repeat(300);
    let sql = format!("HSCALE ADD_PARTITION('notes', 'long', '{long}', 2)");
    let (code, message) = error_of(&mut c, &sql);
    assert_eq!(code, 1210, "{message}");
    assert!(!tables_on(2, &db).contains(&"notes_long".to_string()));
    c.query_drop("HSCALE ADD_PARTITION('notes', 'long', 'short', 2)")
        .unwrap();
    c.query_drop("INSERT INTO notes VALUES (1, 'short')")
        .unwrap();
    let on_2: Vec<i32> = cluster()
        .direct(2, Some(&db))
        .query("SELECT id FROM notes_long")
        .unwrap();
    assert_eq!(on_2, [1]);

    // A kill between the partition table's CREATE and the dictionary's
    // INSERT leaves an empty table of the partition's name: a retry takes it.
    cluster()
        .direct(2, Some(&db))
        .query_drop(USERS.replace("TABLE users", "TABLE users_even"))
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('users', 'even', 0, 2)")
        .unwrap();
    let even: Vec<u32> = cluster()
        .direct(2, Some(&db))
        .query("SELECT id FROM users_even ORDER BY id")
        .unwrap();
    assert_eq!(even, [2, 4]);
    assert_eq!(all_ids(&mut c), [1, 2, 3, 4]);

    // A table of that name with rows, or another definition, is someone's:
    // refused, and left as it was.
    let mut direct = cluster().direct(2, Some(&db));
    direct
        .query_drop("CREATE TABLE notes_kept (id INT PRIMARY KEY, body VARCHAR(400) NOT NULL)")
        .unwrap();
    direct
        .query_drop("INSERT INTO notes_kept VALUES (7, 'mine')")
        .unwrap();
    direct
        .query_drop("CREATE TABLE notes_other (id BIGINT PRIMARY KEY, body TEXT NOT NULL)")
        .unwrap();
    for (partition, value) in [("kept", "k"), ("other", "o")] {
        let sql = format!("HSCALE ADD_PARTITION('notes', '{partition}', '{value}', 2)");
        let (code, message) = error_of(&mut c, &sql);
        assert_eq!(code, 1050, "{sql}: {message}");
    }
    let kept: Vec<(i32, String)> = direct.query("SELECT id, body FROM notes_kept").unwrap();
    assert_eq!(kept, [(7, "mine".to_string())]);
    let partitions = dictionary_rows("partitions", &db);
    assert!(!partitions
        .iter()
        .any(|p| p.ends_with(",kept") || p.ends_with(",other")));
}

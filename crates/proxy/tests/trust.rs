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

fn user(name: &str, password: &str) -> hscale::config::UserConfig {
    hscale::config::UserConfig {
        name: name.into(),
        password: password.into(),
        ..Default::default()
    }
}

#[test]
fn a_user_without_admin_runs_as_its_own_account_and_cannot_reach_what_hscale_owns() {
    let (_root_proxy, mut root, db) = partitioned_users("trust_boundary");
    cluster().account("trust_app", "app-pw", &db, None);
    let mut config = cluster().config();
    config.users.push(user("trust_app", "app-pw"));
    let proxy = Proxy::start(config);
    let mut app = hscale_testkit::connect(proxy.port, "trust_app", "app-pw", Some(&db));
    let account: String = app.query_first("SELECT CURRENT_USER()").unwrap().unwrap();
    assert_eq!(account, "trust_app@localhost");
    assert_eq!(all_ids(&mut app), [1, 2, 3, 4]);
    app.query_drop("INSERT INTO users VALUES (5, 'eve', '2024-01-05')")
        .unwrap();
    let account_on_2: String = app
        .query_first("SELECT CURRENT_USER() FROM users WHERE id = 5")
        .unwrap()
        .unwrap();
    assert_eq!(account_on_2, "trust_app@localhost", "backend 2 too");
    // A transaction over both backends by an account that may not write the
    // commit decision (docs/security.md): every part is an XA branch, and it
    // commits on both all the same.
    app.query_drop("BEGIN").unwrap();
    app.query_drop("INSERT INTO users VALUES (6, 'fay', '2024-01-06')")
        .unwrap();
    app.query_drop("INSERT INTO users VALUES (7, 'gus', '2024-01-07')")
        .unwrap();
    app.query_drop("COMMIT").unwrap();
    assert_eq!(all_ids(&mut app), [1, 2, 3, 4, 5, 6, 7]);

    let partitions = dictionary_rows("partitions", &db);
    // What hscale refuses itself, before any backend sees it.
    for sql in [
        "UPDATE hscale.partitions SET backend = 1",
        "UPDATE `hscale`.version SET version = version + 1",
        "SELECT GET_LOCK('hscale.admin', 0)",
        "INSERT INTO users_default VALUES (99, 'mario', '2024-01-01')",
        "SELECT * FROM users_odd",
        "USE hscale",
    ] {
        let (code, message) = error_of(&mut app, sql);
        assert_eq!(code, 1142, "{sql}: {message}");
    }
    // Prepared, the same.
    let err = app
        .exec_drop("UPDATE hscale.version SET version = ?", (1,))
        .unwrap_err();
    assert!(
        matches!(&err, mysql::Error::MySqlError(e) if e.code == 1142),
        "{err:?}"
    );
    // A session that changes user runs as the new user's account.
    let mut switched = proxy.connect(Some(&db));
    let as_app = mysql::ChangeUserOpts::new()
        .with_user(Some("trust_app".into()))
        .with_pass(Some("app-pw".into()))
        .with_db_name(Some(db.clone()));
    switched.change_user(as_app).unwrap();
    let account: String = switched
        .query_first("SELECT CURRENT_USER()")
        .unwrap()
        .unwrap();
    assert_eq!(account, "trust_app@localhost");
    let (code, _) = error_of(&mut switched, "SELECT * FROM hscale.partitions");
    assert_eq!(code, 1142);
    // What the backends refuse the application's account.
    let (code, message) = error_of(&mut app, "CREATE USER trust_evil IDENTIFIED BY 'x'");
    assert_eq!(code, 1227, "{message}");
    let (code, message) = error_of(&mut app, "SELECT * FROM mysql.user");
    assert_eq!(code, 1142, "{message}");
    // Another account's thread on backend 1: the text of an EXECUTE
    // IMMEDIATE is the client's statement, a KILL hscale answers (no client
    // of its has that id); the backend refuses the application's account.
    let direct = cluster().direct(1, None);
    let kill = format!("EXECUTE IMMEDIATE 'KILL QUERY {}'", direct.connection_id());
    let (code, message) = error_of(&mut app, &kill);
    assert_eq!(code, 1094, "{message}");
    let mut app_on_backend =
        hscale_testkit::connect(cluster().port(1), "trust_app", "app-pw", None);
    let kill = format!("KILL QUERY {}", direct.connection_id());
    let (code, message) = error_of(&mut app_on_backend, &kill);
    assert_eq!(code, 1095, "{message}");
    let others: u64 = app
        .query_first(
            "SELECT COUNT(*) FROM information_schema.processlist WHERE user <> 'trust_app'",
        )
        .unwrap()
        .unwrap();
    assert_eq!(others, 0, "another account's statements are visible");
    let err =
        hscale_testkit::try_connect(proxy.port, "trust_app", "app-pw", Some("hscale")).unwrap_err();
    assert!(
        matches!(err, mysql::Error::MySqlError(ref e) if e.code == 1142),
        "{err:?}"
    );

    // Nothing changed, and the admin lock is free.
    assert_eq!(dictionary_rows("partitions", &db), partitions);
    let evil: u64 = cluster()
        .direct(1, None)
        .query_first("SELECT COUNT(*) FROM mysql.user WHERE user = 'trust_evil'")
        .unwrap()
        .unwrap();
    assert_eq!(evil, 0);
    root.query_drop("HSCALE ADD_PARTITION('users', 'even', 0, 2)")
        .unwrap();
    assert_eq!(all_ids(&mut app), [1, 2, 3, 4, 5, 6, 7]);
    // An admin reaches hscale's tables.
    let version: Option<u64> = root
        .query_first("SELECT version FROM hscale.version")
        .unwrap();
    assert!(version.is_some());
}

/// 64 clients of 4 users, each user its own backend account (one known to
/// hscale by its password's hash only), share 16 connections per backend:
/// every statement runs, each as its own user's account.
#[test]
fn four_accounts_share_sixteen_backend_connections_without_errors() {
    let db = cluster().database("trust_pool");
    cluster()
        .direct(1, Some(&db))
        .query_drop("CREATE TABLE hits (account VARCHAR(32) NOT NULL, n INT NOT NULL)")
        .unwrap();
    let mut config = cluster().config();
    for backend in &mut config.backends {
        backend.max_connections = 16;
    }
    for i in 0..4 {
        let (name, password) = (format!("trust_pool{i}"), format!("pool-pw-{i}"));
        cluster().account(&name, &password, &db, None);
        let configured = match i {
            // Only the hash: hscale learns what answers the backend from the
            // user's own login.
            3 => cluster()
                .direct(1, None)
                .query_first::<String, _>(format!("SELECT PASSWORD('{password}')"))
                .unwrap()
                .unwrap(),
            _ => password,
        };
        config.users.push(user(&name, &configured));
    }
    let proxy = Proxy::start(config);
    let clients: Vec<_> = (0..64)
        .map(|client| {
            let port = proxy.port;
            let db = db.clone();
            std::thread::spawn(move || {
                let i = client % 4;
                let name = format!("trust_pool{i}");
                let mut c =
                    hscale_testkit::connect(port, &name, &format!("pool-pw-{i}"), Some(&db));
                for n in 0..20 {
                    let account: String = c.query_first("SELECT CURRENT_USER()").unwrap().unwrap();
                    assert_eq!(account, format!("{name}@localhost"));
                    c.exec_drop("INSERT INTO hits VALUES (CURRENT_USER(), ?)", (n,))
                        .unwrap();
                }
            })
        })
        .collect();
    for client in clients {
        client.join().expect("a client failed");
    }
    let counts: Vec<(String, u64)> = cluster()
        .direct(1, Some(&db))
        .query("SELECT account, COUNT(*) FROM hits GROUP BY account ORDER BY account")
        .unwrap();
    let expected: Vec<(String, u64)> = (0..4)
        .map(|i| (format!("trust_pool{i}@localhost"), 16 * 20))
        .collect();
    assert_eq!(counts, expected);
}

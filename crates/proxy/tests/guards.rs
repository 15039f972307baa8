//! What a user without `admin` may not reach around hscale (issue 53):
//! dynamic SQL is planned and routed where hscale can read its text, and
//! refused where it cannot; XA statements on hscale's own branches are
//! refused and XA RECOVER does not list them; lock names are guarded by
//! value; admin commands leave system and hscale tables alone. Each route
//! tried, then the backends read directly: nothing changed that should not.

use hscale_testkit::{cluster, Proxy};
use mysql::prelude::Queryable;
use mysql::Conn;

fn error_of(conn: &mut Conn, sql: &str) -> (u16, String) {
    match conn.query_drop(sql) {
        Err(mysql::Error::MySqlError(e)) => (e.code, e.message),
        other => panic!("{sql}: expected an error, got {other:?}"),
    }
}

/// `users` by MOD(2) of id (odd ids on backend 2), `countries` copied to
/// both backends; a proxy with an admin (`root`) and a user without admin
/// (`app`, whose backend account may write the database and, as
/// docs/security.md asks, insert two-phase commit decisions).
fn setup(name: &str) -> (Proxy, String, Conn, Conn) {
    let db = cluster().database(name);
    let mut direct = cluster().direct(1, Some(&db));
    direct
        .query_drop("CREATE TABLE users (id INT PRIMARY KEY, nickname VARCHAR(20))")
        .unwrap();
    direct
        .query_drop("CREATE TABLE countries (code CHAR(2) PRIMARY KEY, name VARCHAR(20))")
        .unwrap();
    direct
        .query_drop("INSERT INTO countries VALUES ('de', 'Germany')")
        .unwrap();
    let account = format!("{name}_app");
    cluster().account(&account, "secret", &db, None);
    for backend in 1..=2 {
        let mut root = cluster().direct(backend, None);
        for host in ["localhost", "127.0.0.1"] {
            root.query_drop("CREATE DATABASE IF NOT EXISTS hscale")
                .unwrap();
            root.query_drop("CREATE TABLE IF NOT EXISTS hscale.xa_decisions (gtrid VARCHAR(64) NOT NULL PRIMARY KEY, decision VARCHAR(8) NOT NULL, decided DATETIME(6) NOT NULL, proof CHAR(64) NULL)").unwrap();
            root.query_drop(format!(
                "GRANT INSERT ON hscale.xa_decisions TO '{account}'@'{host}'"
            ))
            .unwrap();
        }
    }
    let mut config = cluster().config();
    config.users.push(hscale::config::UserConfig {
        name: "app".into(),
        password: "secret".into(),
        admin: false,
        backend_user: Some(account),
        backend_password: Some("secret".into()),
        ..Default::default()
    });
    let proxy = Proxy::start(config);
    let mut admin = proxy.connect(Some(&db));
    for sql in [
        "HSCALE SETUP_TABLE('users', 'id', 'users_default', 1, 'MOD(2)')",
        "HSCALE ADD_PARTITION('users', 'odd', 1, 2)",
        "HSCALE SETUP_REFERENCE('countries')",
        "INSERT INTO users VALUES (1, 'one'), (2, 'two')",
    ] {
        admin.query_drop(sql).unwrap();
    }
    let app = hscale_testkit::connect(proxy.port, "app", "secret", Some(&db));
    (proxy, db, admin, app)
}

/// Every id on the backends, with the table it is in.
fn ids_on_backends(db: &str) -> Vec<(u32, String)> {
    let mut ids = Vec::new();
    for (backend, table) in [(1, "users_default"), (2, "users_odd")] {
        let found: Vec<u32> = cluster()
            .direct(backend, Some(db))
            .query(format!("SELECT id FROM {table} ORDER BY id"))
            .unwrap();
        ids.extend(found.into_iter().map(|id| (id, table.to_string())));
    }
    ids.sort();
    ids
}

fn countries_on(backend: usize, db: &str) -> Vec<(String, String)> {
    cluster()
        .direct(backend, Some(db))
        .query("SELECT code, name FROM countries ORDER BY code")
        .unwrap()
}

#[test]
fn dynamic_sql_is_routed_where_hscale_reads_it_and_refused_where_it_cannot() {
    let (_proxy, db, mut admin, mut app) = setup("guards_dynamic");
    // Read: planned and routed like the statement itself.
    app.query_drop("EXECUTE IMMEDIATE 'INSERT INTO users VALUES (3, ''three'')'")
        .unwrap();
    app.query_drop("EXECUTE IMMEDIATE 'INSERT INTO users VALUES (?, ?)' USING 4, 'four'")
        .unwrap();
    app.query_drop("PREPARE ins FROM 'INSERT INTO users VALUES (?, ?)'")
        .unwrap();
    app.query_drop("EXECUTE ins USING 5, 'five'").unwrap();
    app.query_drop("EXECUTE INS USING 6, 'six'").unwrap();
    app.query_drop("DEALLOCATE PREPARE ins").unwrap();
    app.query_drop("PREPARE total FROM 'SELECT COUNT(*) FROM users'")
        .unwrap();
    let total: u32 = app.query_first("EXECUTE total").unwrap().unwrap();
    assert_eq!(total, 6, "counted on every partition");
    app.query_drop("EXECUTE IMMEDIATE 'INSERT INTO countries VALUES (''fr'', ''France'')'")
        .unwrap();
    // A statement hscale does not route prepares on the server, as before.
    app.query_drop("PREPARE two FROM 'SELECT 1 + ?'").unwrap();
    let two: u32 = app.query_first("EXECUTE two USING 1").unwrap().unwrap();
    assert_eq!(two, 2);

    // What it reads and guards: the same refusals as written plainly.
    for sql in [
        "EXECUTE IMMEDIATE 'INSERT INTO users_default VALUES (99, ''mario'')'",
        "EXECUTE IMMEDIATE 'SELECT * FROM users_odd'",
        "EXECUTE IMMEDIATE 'DELETE FROM hscale.partitions'",
        "EXECUTE IMMEDIATE 'SELECT GET_LOCK(''hscale.admin'', 0)'",
        "PREPARE s FROM 'SELECT * FROM users_default'",
    ] {
        assert_eq!(error_of(&mut app, sql).0, 1142, "{sql}");
    }
    // Admin commands, as written plainly: 1227 (a PREPARE of one names
    // hscale's schema: 1142).
    let setup = "EXECUTE IMMEDIATE 'HSCALE SETUP_TABLE(''countries'', ''code'', ''c_default'', 1, ''NONE()'')'";
    assert_eq!(error_of(&mut app, setup).0, 1227);
    assert_eq!(
        error_of(&mut app, "PREPARE a FROM 'HSCALE SHOW_TABLES'").0,
        1142
    );
    // What it cannot read: refused, naming why.
    app.query_drop("SET @q = 'INSERT INTO users_default VALUES (98, ''luigi'')'")
        .unwrap();
    for sql in [
        "EXECUTE IMMEDIATE CONCAT('INSERT INTO users', '_default VALUES (97, ''x'')')",
        "EXECUTE IMMEDIATE @q",
        "PREPARE s FROM @q",
        "PREPARE s FROM CONCAT('SELECT * FROM users', '_odd')",
        "CREATE PROCEDURE sneak() BEGIN PREPARE s FROM @q; EXECUTE s; END",
        "CREATE PROCEDURE sneak2(q TEXT) EXECUTE IMMEDIATE q",
    ] {
        let (code, message) = error_of(&mut app, sql);
        assert_eq!(code, 1235, "{sql}: {message}");
        assert!(message.contains("cannot read"), "{sql}: {message}");
    }
    app.query_drop("PREPARE pick FROM 'SELECT nickname FROM users WHERE id = ?'")
        .unwrap();
    app.query_drop("SET @id = 1").unwrap();
    assert_eq!(error_of(&mut app, "EXECUTE pick USING @id").0, 1235);
    let one: String = app.query_first("EXECUTE pick USING 1").unwrap().unwrap();
    assert_eq!(one, "one");

    // On the backends: every row in its partition, none where routing
    // never looks; the copies equal.
    let expected: Vec<(u32, String)> = (1..=6)
        .map(|id| {
            let table = if id % 2 == 1 {
                "users_odd"
            } else {
                "users_default"
            };
            (id, table.to_string())
        })
        .collect();
    assert_eq!(ids_on_backends(&db), expected);
    assert_eq!(countries_on(1, &db), countries_on(2, &db));
    assert_eq!(countries_on(1, &db).len(), 2);
    let procedures: u32 = cluster()
        .direct(1, None)
        .query_first(format!(
            "SELECT COUNT(*) FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = '{db}'"
        ))
        .unwrap()
        .unwrap();
    assert_eq!(procedures, 0);

    // An admin runs what hscale cannot read as written, and an admin
    // command inside EXECUTE IMMEDIATE is checked as written plainly.
    admin
        .query_drop("EXECUTE IMMEDIATE CONCAT('SELECT COUNT(*) FROM users', '_default')")
        .unwrap();
    let (code, _) = error_of(
        &mut admin,
        "EXECUTE IMMEDIATE 'HSCALE SETUP_TABLE(''mysql.global_priv'', ''User'', ''g_default'', 1, ''NONE()'')'",
    );
    assert_eq!(code, 1210);
}

#[test]
fn xa_statements_cannot_reach_hscales_branches() {
    let (_proxy, _db, _admin, mut app) = setup("guards_xa");
    // A branch in hscale's format, prepared on the main backend (its
    // sequence no number, so that recovery leaves it to the test), and one
    // of a client's own.
    let format = hscale_planner::XA_FORMAT_ID;
    let mut held = cluster().direct(1, None);
    held.query_drop(format!("XA START 'guards-0:x', '1', {format}"))
        .unwrap();
    held.query_drop(format!("XA END 'guards-0:x', '1', {format}"))
        .unwrap();
    held.query_drop(format!("XA PREPARE 'guards-0:x', '1', {format}"))
        .unwrap();
    let mut own = cluster().direct(1, None);
    own.query_drop("XA START 'client-own'").unwrap();
    own.query_drop("XA END 'client-own'").unwrap();
    own.query_drop("XA PREPARE 'client-own'").unwrap();

    for sql in [
        format!("XA ROLLBACK 'guards-0:x', '1', {format}"),
        format!("XA COMMIT 'guards-0:x', '1', {format:#x}"),
        format!("xa rollback 'guards' '-0:x', X'31', {format}"),
        format!("EXECUTE IMMEDIATE 'XA ROLLBACK ''guards-0:x'', ''1'', {format}'"),
        format!("PREPARE x FROM 'XA ROLLBACK ''guards-0:x'', ''1'', {format}'"),
    ] {
        let (code, message) = error_of(&mut app, &sql);
        assert!(code == 1235, "{sql}: {code} {message}");
    }
    let listed: Vec<(u32, u32, u32, Vec<u8>)> = app.query("XA RECOVER").unwrap();
    let data: Vec<String> = listed
        .iter()
        .map(|(_, _, _, d)| String::from_utf8_lossy(d).into_owned())
        .collect();
    assert!(data.contains(&"client-own".to_string()), "{data:?}");
    assert!(
        listed.iter().all(|(f, ..)| *f != format),
        "hscale's branch listed: {data:?}"
    );
    // Still prepared on the backend: no client ended it.
    let on_backend: Vec<(u32, u32, u32, Vec<u8>)> =
        cluster().direct(1, None).query("XA RECOVER").unwrap();
    assert!(on_backend.iter().any(|(f, ..)| *f == format));
    // The client's own branch, once its connection left it, is the
    // client's to end: once the server has seen that connection go (until
    // then the branch is attached to it, and others get XAER_NOTA).
    let own_id = own.connection_id();
    drop(own);
    let mut watcher = cluster().direct(1, None);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while watcher
        .exec_first::<u64, _, _>(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?",
            (own_id,),
        )
        .unwrap()
        != Some(0)
    {
        assert!(std::time::Instant::now() < deadline, "the connection stays");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // MariaDB answers a rollback from another connection with 1402
    // (XA_RBROLLBACK), having rolled it back.
    match app.query_drop("XA ROLLBACK 'client-own'") {
        Ok(()) => {}
        Err(mysql::Error::MySqlError(e)) if e.code == 1402 => {}
        Err(e) => panic!("the client's own branch: {e}"),
    }
    let left: Vec<(u32, u32, u32, Vec<u8>)> =
        cluster().direct(1, None).query("XA RECOVER").unwrap();
    assert!(left.iter().all(|(_, _, _, d)| d != b"client-own"));
    held.query_drop(format!("XA ROLLBACK 'guards-0:x', '1', {format}"))
        .unwrap();
}

#[test]
fn hscales_locks_are_guarded_by_value() {
    let (_proxy, _db, _admin, mut app) = setup("guards_locks");
    for sql in [
        "SELECT GET_LOCK('hscale' '.admin', 0)",
        "SELECT GET_LOCK(0x687363616c652e61646d696e, 0)",
        "SELECT IS_USED_LOCK(_utf8mb4'hscale.move_writers')",
        "SELECT GET_LOCK(CONCAT('hscale', '.admin'), 0)",
    ] {
        assert_eq!(error_of(&mut app, sql).0, 1142, "{sql}");
    }
    let got: u32 = app
        .query_first("SELECT GET_LOCK('app' '.lock', 0)")
        .unwrap()
        .unwrap();
    assert_eq!(got, 1);
}

#[test]
fn admin_commands_leave_system_and_hscale_tables_alone() {
    let (_proxy, db, mut admin, _app) = setup("guards_admin");
    // This test's database's (other tests run beside it).
    let listed = |admin: &mut Conn| -> Vec<Vec<mysql::Value>> {
        let rows: Vec<mysql::Row> = admin.query("HSCALE SHOW_TABLES").unwrap();
        rows.into_iter()
            .map(mysql::Row::unwrap)
            .filter(|row| row[0] == mysql::Value::from(db.as_str()))
            .collect()
    };
    let partitioned = listed(&mut admin);
    for sql in [
        "HSCALE SETUP_TABLE('mysql.global_priv', 'User', 'global_priv_default', 1, 'NONE()')"
            .to_string(),
        "HSCALE SETUP_TABLE('information_schema.TABLES', 'TABLE_NAME', 't_default', 1, 'NONE()')"
            .into(),
        "HSCALE SETUP_TABLE('performance_schema.threads', 'NAME', 't_default', 1, 'NONE()')".into(),
        "HSCALE SETUP_TABLE('sys.sys_config', 'variable', 's_default', 1, 'NONE()')".into(),
        "HSCALE SETUP_TABLE('hscale.partitions', 'db', 'p_default', 1, 'NONE()')".into(),
        "HSCALE SETUP_TABLE('users_default', 'id', 'again_default', 1, 'MOD(2)')".into(),
        "HSCALE SETUP_TABLE('users_odd', 'id', 'again_default', 1, 'MOD(2)')".into(),
        "HSCALE SETUP_TABLE('countries', 'code', 'countries_default', 1, 'NONE()')".into(),
        "HSCALE SETUP_REFERENCE('users_default')".into(),
        "HSCALE SETUP_REFERENCE('users')".into(),
        "HSCALE SETUP_REFERENCE('hscale.partitions')".into(),
        "HSCALE SETUP_REFERENCE('mysql.global_priv')".into(),
        "HSCALE SETUP_REFERENCE('countries')".into(),
    ] {
        let (code, message) = error_of(&mut admin, &sql);
        assert_eq!(code, 1210, "{sql}: {message}");
    }
    // Nothing changed: the privilege table is where the server reads it,
    // the dictionary as it was, no copy made on backend 2.
    let privileges: u32 = cluster()
        .direct(1, None)
        .query_first("SELECT COUNT(*) FROM mysql.global_priv")
        .unwrap()
        .unwrap();
    assert!(privileges > 0);
    assert_eq!(listed(&mut admin), partitioned);
    let on_two: Vec<String> = cluster().direct(2, Some(&db)).query("SHOW TABLES").unwrap();
    assert_eq!(on_two, ["countries", "users_odd"]);
}

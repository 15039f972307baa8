//! Real command-line clients through hscale: the mariadb CLI, mariadb-admin,
//! mariadb-slap and sysbench with server-side prepared statements, on a
//! plain table and on one partitioned over two backends.

use hscale_testkit::{cluster, run_program, scratch, Proxy};
use mysql::prelude::Queryable;

fn cli(port: u16, db: &str, sql: &str) -> String {
    run_program(
        "mariadb",
        &[
            "-h127.0.0.1",
            &format!("-P{port}"),
            "-uroot",
            "--batch",
            db,
            "-e",
            sql,
        ],
    )
}

#[test]
fn mariadb_cli_prints_the_same_as_direct() {
    let db = cluster().database("cli_same");
    let proxy = Proxy::for_cluster();
    let setup = "CREATE TABLE t (id INT PRIMARY KEY, name VARCHAR(20), v DECIMAL(6,2));
                 INSERT INTO t VALUES (1,'a',1.5),(2,NULL,-2),(3,'c\\td',0)";
    cli(proxy.port, &db, setup);
    let sql = "SELECT * FROM t ORDER BY id; SELECT COUNT(*), SUM(v) FROM t; SHOW CREATE TABLE t; SELECT @@sql_mode";
    let direct = cli(cluster().port(1), &db, sql);
    let proxied = cli(proxy.port, &db, sql);
    assert!(direct.contains("c\\td"), "{direct}");
    assert_eq!(direct, proxied);
}

#[test]
fn mariadb_admin_ping_and_status_are_answered() {
    let proxy = Proxy::for_cluster();
    let port = format!("-P{}", proxy.port);
    let ping = run_program("mariadb-admin", &["-h127.0.0.1", &port, "-uroot", "ping"]);
    assert!(ping.contains("is alive"), "{ping}");
    let status = run_program("mariadb-admin", &["-h127.0.0.1", &port, "-uroot", "status"]);
    assert!(
        status.contains("Uptime:") && status.contains("Questions:"),
        "{status}"
    );
}

#[test]
fn mariadb_slap_runs_its_generated_load() {
    let proxy = Proxy::for_cluster();
    let out = run_program(
        "mariadb-slap",
        &[
            "-h127.0.0.1",
            &format!("-P{}", proxy.port),
            "-uroot",
            "--create-schema=slap_generated",
            "--auto-generate-sql",
            "--auto-generate-sql-load-type=mixed",
            "--concurrency=8",
            "--number-of-queries=800",
            "--iterations=2",
        ],
    );
    assert!(
        out.contains("Average number of seconds to run all queries"),
        "{out}"
    );
}

#[test]
fn sysbench_with_prepared_statements_runs_without_errors() {
    let db = cluster().database("sysbench_ps");
    let common = |port: u16| {
        vec![
            "--db-driver=mysql".to_string(),
            "--mysql-host=127.0.0.1".into(),
            format!("--mysql-port={port}"),
            "--mysql-user=root".into(),
            "--mysql-password=".into(),
            format!("--mysql-db={db}"),
            "--tables=2".into(),
            "--table-size=2000".into(),
        ]
    };
    let direct_args = common(cluster().port(1));
    let mut prepare: Vec<&str> = vec!["oltp_read_only"];
    prepare.extend(direct_args.iter().map(String::as_str));
    prepare.push("prepare");
    run_program("sysbench", &prepare);
    // Two workers, the clients moving to the other at every statement
    // where they may: a worker takes the idle connections a client left on
    // the other rather than open its own (before, connections grew with
    // workers times clients, and this test failed when the load of the
    // tests beside it moved clients).
    let mut config = cluster().config();
    config.proxy.threads = 2;
    config.proxy.move_clients = hscale::config::MoveClients::Always;
    let proxy = Proxy::start(config);
    let proxy_args = common(proxy.port);
    for test in ["oltp_point_select", "oltp_read_only"] {
        let mut run: Vec<&str> = vec![test];
        run.extend(proxy_args.iter().map(String::as_str));
        run.extend(["--threads=4", "--time=2", "--db-ps-mode=auto", "run"]);
        let out = run_program("sysbench", &run);
        let queries = out
            .lines()
            .find(|l| l.trim_start().starts_with("queries:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no query count in:\n{out}"));
        assert!(queries > 100, "{test}: only {queries} queries\n{out}");
        assert!(
            out.contains("ignored errors:                      0"),
            "{test}:\n{out}"
        );
    }
    // At most one backend connection per sysbench thread at a time.
    let open = proxy.shared.main_pool().open_connections();
    assert!(
        open <= 5,
        "{open} backend connections for 4 sysbench threads"
    );
    let _ = cluster().direct(1, Some(&db)).query_drop("SELECT 1");
}

/// sysbench's arguments for database `db` through `port`.
fn sysbench_args(test: &str, port: u16, db: &str, more: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = vec![
        test.into(),
        "--db-driver=mysql".into(),
        "--mysql-host=127.0.0.1".into(),
        format!("--mysql-port={port}"),
        "--mysql-user=root".into(),
        "--mysql-password=".into(),
        format!("--mysql-db={db}"),
        "--tables=1".into(),
        "--table-size=2000".into(),
    ];
    args.extend(more.iter().map(|a| a.to_string()));
    args
}

/// Runs sysbench; a `run` must end without errors.
fn sysbench(args: &[String]) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_program("sysbench", &args);
    if args.last() == Some(&"run") {
        assert!(
            out.contains("ignored errors:                      0"),
            "{args:?}:\n{out}"
        );
    }
}

#[test]
fn sysbench_on_a_partitioned_table_leaves_the_rows_one_table_would() {
    let plain = cluster().database("sysbench_plain");
    let part = cluster().database("sysbench_part");
    sysbench(&sysbench_args(
        "oltp_write_only",
        cluster().port(1),
        &plain,
        &["prepare"],
    ));
    cluster()
        .direct(1, Some(&part))
        .query_drop(format!(
            "CREATE TABLE sbtest1 LIKE {plain}.sbtest1; INSERT INTO sbtest1 SELECT * FROM {plain}.sbtest1"
        ))
        .unwrap();
    let proxy = Proxy::for_cluster();
    let mut c = proxy.connect(Some(&part));
    c.query_drop("HSCALE SETUP_TABLE('sbtest1', 'id', 'sbtest1_default', 1, 'MOD(2)')")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('sbtest1', 'odd', 1, 2)")
        .unwrap();
    // One thread and a fixed seed: both runs make the same writes in the same
    // order (deletes and inserts of the same ids, updates by id).
    let writes = [
        "--threads=1",
        "--events=600",
        "--time=0",
        "--rand-seed=7",
        "--skip_trx=on",
        "--db-ps-mode=auto",
        "run",
    ];
    sysbench(&sysbench_args(
        "oltp_write_only",
        cluster().port(1),
        &plain,
        &writes,
    ));
    sysbench(&sysbench_args(
        "oltp_write_only",
        proxy.port,
        &part,
        &writes,
    ));
    type Row = (u32, u32, String, String);
    let rows = |conn: &mut mysql::Conn| {
        let mut rows: Vec<Row> = conn.query("SELECT id, k, c, pad FROM sbtest1").unwrap();
        rows.sort();
        rows
    };
    let expected = rows(&mut cluster().direct(1, Some(&plain)));
    let found = rows(&mut c);
    assert_eq!(found.len(), expected.len());
    let differs = found.iter().zip(&expected).find(|(f, e)| f != e);
    assert_eq!(differs, None, "the first row that differs");
    let odd: Vec<u32> = cluster()
        .direct(2, Some(&part))
        .query("SELECT id FROM sbtest1_odd")
        .unwrap();
    assert!(!odd.is_empty() && odd.iter().all(|id| id % 2 == 1));
    // Point selects routed by their parameter.
    let threads = ["--threads=4", "--time=2", "--db-ps-mode=auto", "run"];
    sysbench(&sysbench_args(
        "oltp_point_select",
        proxy.port,
        &part,
        &threads,
    ));
    // Reads that scan both partitions (ranges, SUM over ranges, ORDER BY and
    // DISTINCT ranges) between the same writes, as queries: the same rows.
    let read_write = [
        "--threads=1",
        "--events=300",
        "--time=0",
        "--rand-seed=11",
        "--skip_trx=on",
        "--db-ps-mode=disable",
        "run",
    ];
    sysbench(&sysbench_args(
        "oltp_read_write",
        cluster().port(1),
        &plain,
        &read_write,
    ));
    sysbench(&sysbench_args(
        "oltp_read_write",
        proxy.port,
        &part,
        &read_write,
    ));
    assert_eq!(rows(&mut c), rows(&mut cluster().direct(1, Some(&plain))));
    for mode in ["--db-ps-mode=disable", "--db-ps-mode=auto"] {
        let threads = ["--threads=4", "--time=2", mode, "run"];
        sysbench(&sysbench_args(
            "oltp_read_only",
            proxy.port,
            &part,
            &threads,
        ));
    }
}

/// `users` by PREFIX(1) of `nickname` ('m' on backend 2, 'z' beside the
/// default partition on backend 1) in `db`, empty.
/// A proxy whose transactions may write on several backends.
fn multi_backend_transactions() -> Proxy {
    let mut config = cluster().config();
    config.proxy.transactions = hscale::config::Transactions::Multi;
    Proxy::start(config)
}

fn partitioned_users(proxy: &Proxy, db: &str) -> mysql::Conn {
    cluster()
        .direct(1, Some(db))
        .query_drop(
            "CREATE TABLE users (id INT PRIMARY KEY, nickname VARCHAR(32) NOT NULL, created DATE)",
        )
        .unwrap();
    let mut c = proxy.connect(Some(db));
    c.query_drop("HSCALE SETUP_TABLE('users', 'nickname', 'users_default', 1, 'PREFIX(1)')")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('users', 'm', 'm', 2)")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('users', 'z', 'z', 1)")
        .unwrap();
    c
}

/// mariadb-import --local sends LOAD DATA LOCAL INFILE: each line lands in
/// its partition, and the tool reports the counts a single table gives.
#[test]
fn mariadb_import_loads_a_partitioned_table() {
    let db = cluster().database("cli_import");
    let proxy = multi_backend_transactions();
    let mut c = partitioned_users(&proxy, &db);
    let file = scratch("cli_import").join("users.txt");
    std::fs::write(
        &file,
        "1\tmia\t2024-01-01\n2\tzoe\t2024-01-02\n3\tann\t\\N\n4\tMax\t2024-01-04\n",
    )
    .unwrap();
    let port = format!("-P{}", proxy.port);
    let imported = run_program(
        "mariadb-import",
        &[
            "-h127.0.0.1",
            &port,
            "-uroot",
            "--local",
            &db,
            file.to_str().unwrap(),
        ],
    );
    assert!(
        imported.contains("Records: 4  Deleted: 0  Skipped: 0  Warnings: 0"),
        "{imported}"
    );
    let rows: Vec<(u32, String, Option<String>)> = c
        .query("SELECT id, nickname, CAST(created AS CHAR) FROM users ORDER BY id")
        .unwrap();
    let date = |d: &str| Some(d.to_string());
    assert_eq!(
        rows,
        [
            (1, "mia".into(), date("2024-01-01")),
            (2, "zoe".into(), date("2024-01-02")),
            (3, "ann".into(), None),
            (4, "Max".into(), date("2024-01-04")),
        ]
    );
    let on_backend_2: Vec<u32> = cluster()
        .direct(2, Some(&db))
        .query("SELECT id FROM users_m ORDER BY id")
        .unwrap();
    assert_eq!(on_backend_2, [1, 4]);
}

/// mariadb-dump locks the tables it reads (LOCK TABLES ... READ LOCAL) and
/// writes LOCK TABLES ... WRITE around its rows: both work on a partitioned
/// table, whose partitions are locked on their backends, and a dump loads
/// back through hscale into a table partitioned alike.
#[test]
fn mariadb_dump_of_a_partitioned_table_loads_back_through_hscale() {
    // A dump's INSERT carries many rows, for partitions on both backends.
    let proxy = multi_backend_transactions();
    let from = cluster().database("dump_from");
    let into = cluster().database("dump_into");
    let mut c = partitioned_users(&proxy, &from);
    c.query_drop("CREATE TABLE notes (id INT PRIMARY KEY, body TEXT)")
        .unwrap();
    c.query_drop("INSERT INTO notes VALUES (1, 'plain')")
        .unwrap();
    c.query_drop(
        "INSERT INTO users VALUES (1, 'martin', '2008-05-06'), (2, 'anna', NULL), (3, 'Marlene', '2010-07-08'), (4, 'zoe', '2012-04-05')",
    )
    .unwrap();
    let port = format!("-P{}", proxy.port);
    let dump = run_program(
        "mariadb-dump",
        &["-h127.0.0.1", &port, "-uroot", "--no-create-info", &from],
    );
    assert!(dump.contains("LOCK TABLES `users` WRITE"), "{dump}");
    let file = hscale_testkit::scratch("dump").join("dump.sql");
    std::fs::write(&file, &dump).unwrap();
    cluster()
        .direct(1, Some(&into))
        .query_drop("CREATE TABLE notes (id INT PRIMARY KEY, body TEXT)")
        .unwrap();
    let mut loaded = partitioned_users(&proxy, &into);
    run_program(
        "mariadb",
        &[
            "-h127.0.0.1",
            &port,
            "-uroot",
            &into,
            "-e",
            &format!("source {}", file.display()),
        ],
    );
    let rows = |c: &mut mysql::Conn| -> Vec<(i32, String, Option<String>)> {
        c.query("SELECT id, nickname, CAST(created AS CHAR) FROM users ORDER BY id")
            .unwrap()
    };
    let original = rows(&mut c);
    assert_eq!(original.len(), 4);
    assert_eq!(rows(&mut loaded), original);
    let on_backend_2: Vec<String> = cluster()
        .direct(2, Some(&into))
        .query("SELECT nickname FROM users_m ORDER BY id")
        .unwrap();
    assert_eq!(on_backend_2, ["martin", "Marlene"]);
    let note: Option<String> = loaded.query_first("SELECT body FROM notes").unwrap();
    assert_eq!(note.as_deref(), Some("plain"));
}

/// LOCK TABLES of a partitioned table locks every partition, on every
/// backend, until UNLOCK TABLES; and behaves as on one table for its holder.
#[test]
fn lock_tables_holds_every_partition_until_unlock() {
    let proxy = Proxy::for_cluster();
    let db = cluster().database("lock_partitioned");
    let mut c = partitioned_users(&proxy, &db);
    c.query_drop("INSERT INTO users VALUES (1, 'martin', NULL)")
        .unwrap();
    c.query_drop("INSERT INTO users VALUES (2, 'anna', NULL)")
        .unwrap();
    c.query_drop("INSERT INTO users VALUES (8, 'zoe', NULL)")
        .unwrap();
    c.query_drop("LOCK TABLES users READ").unwrap();
    let count: Option<u64> = c.query_first("SELECT COUNT(*) FROM users").unwrap();
    assert_eq!(count, Some(3));
    let found: Option<String> = c
        .query_first("SELECT users.nickname FROM users WHERE users.id = 8 AND nickname = 'zoe'")
        .unwrap();
    assert_eq!(found.as_deref(), Some("zoe"));
    // As on MariaDB: a READ lock refuses its holder's writes (1099).
    match c.query_drop("INSERT INTO users VALUES (3, 'mia', NULL)") {
        Err(mysql::Error::MySqlError(e)) => assert_eq!(e.code, 1099, "{}", e.message),
        other => panic!("expected error 1099, got {other:?}"),
    }
    let write_on_backend_2 = || {
        let mut other = cluster().direct(2, Some(&db));
        other
            .query_drop("SET SESSION lock_wait_timeout = 1")
            .unwrap();
        other.query_drop("INSERT INTO users_m VALUES (5, 'max', NULL)")
    };
    match write_on_backend_2() {
        Err(mysql::Error::MySqlError(e)) => assert_eq!(e.code, 1205, "{}", e.message),
        other => panic!("the partition on backend 2 is not locked: {other:?}"),
    }
    c.query_drop("UNLOCK TABLES").unwrap();
    write_on_backend_2().expect("UNLOCK TABLES released backend 2");
    // A new LOCK TABLES releases the locks the session held before, on
    // every backend: here it locks only a table of the main backend.
    c.query_drop("CREATE TABLE plain (id INT)").unwrap();
    c.query_drop("LOCK TABLES users WRITE").unwrap();
    c.query_drop("INSERT INTO users VALUES (6, 'mo', NULL)")
        .unwrap();
    c.query_drop("LOCK TABLES plain READ").unwrap();
    let mut other = cluster().direct(2, Some(&db));
    other
        .query_drop("SET SESSION lock_wait_timeout = 1")
        .unwrap();
    other
        .query_drop("INSERT INTO users_m VALUES (7, 'mel', NULL)")
        .expect("the second LOCK TABLES released backend 2");
    c.query_drop("UNLOCK TABLES").unwrap();
    let count: Option<u64> = c.query_first("SELECT COUNT(*) FROM users").unwrap();
    assert_eq!(count, Some(6));
}

/// ANALYZE, CHECK, OPTIMIZE, REPAIR and CHECKSUM TABLE of a partitioned
/// table run on every partition, on its backend, and answer as one table
/// holding the same rows answers on one server: the oracle.
#[test]
fn table_maintenance_answers_as_one_table_would() {
    let proxy = Proxy::for_cluster();
    let db = cluster().database("maintenance");
    let mut c = partitioned_users(&proxy, &db);
    let rows = "(1, 'martin', '2008-05-06'), (2, 'anna', NULL), (3, 'Marlene', '2010-07-08'), (4, 'zoe', '2012-04-05')";
    // One row at a time: a statement writes on one backend.
    for row in rows.split("), (") {
        let row = row.trim_matches(|c| c == '(' || c == ')');
        c.query_drop(format!("INSERT INTO users VALUES ({row})"))
            .unwrap();
    }
    let mut direct = cluster().direct(1, Some(&db));
    direct
        .query_drop(
            "CREATE TABLE oracle (id INT PRIMARY KEY, nickname VARCHAR(32) NOT NULL, created DATE)",
        )
        .unwrap();
    direct
        .query_drop(format!("INSERT INTO oracle VALUES {rows}"))
        .unwrap();
    c.query_drop("CREATE TABLE plain (id INT PRIMARY KEY)")
        .unwrap();
    type Row = (String, String, String, String);
    let of_oracle = |rows: Vec<Row>| -> Vec<Row> {
        rows.into_iter()
            .map(|(table, op, kind, text)| {
                let table = table.replace(".oracle", ".users");
                (table, op, kind, text)
            })
            .collect()
    };
    for statement in [
        "CHECK TABLE {}",
        "CHECK TABLE {} EXTENDED",
        "ANALYZE TABLE {}",
        "ANALYZE NO_WRITE_TO_BINLOG TABLE {} PERSISTENT FOR ALL",
        "OPTIMIZE TABLE {}",
        "REPAIR TABLE {}",
    ] {
        let through: Vec<Row> = c.query(statement.replace("{}", "users")).unwrap();
        let expected: Vec<Row> = direct.query(statement.replace("{}", "oracle")).unwrap();
        assert_eq!(through, of_oracle(expected), "{statement}");
    }
    // MariaDB adds up its rows' checksums: the partitions' add up to the
    // table's.
    for statement in ["CHECKSUM TABLE {}", "CHECKSUM TABLE {} EXTENDED"] {
        let through: Vec<(String, Option<u64>)> =
            c.query(statement.replace("{}", "users")).unwrap();
        let expected: Vec<(String, Option<u64>)> =
            direct.query(statement.replace("{}", "oracle")).unwrap();
        assert!(expected[0].1.is_some(), "{expected:?}");
        assert_eq!(through, [(format!("{db}.users"), expected[0].1)]);
    }
    // Every partition and the default, on both backends, were read.
    let twice: Vec<(String, Option<u64>)> = c
        .query("CHECKSUM TABLE users, plain, nosuch QUICK")
        .unwrap();
    let names: Vec<&str> = twice.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        [
            format!("{db}.users"),
            format!("{db}.plain"),
            format!("{db}.nosuch")
        ]
    );
    // The tables in the order the statement names them, with the errors
    // the server gives for a table that is not there.
    let listed: Vec<Row> = c.query("CHECK TABLE plain, nosuch, users").unwrap();
    let listed: Vec<(&str, &str)> = listed
        .iter()
        .map(|(table, _, kind, _)| (table.as_str(), kind.as_str()))
        .collect();
    let (plain, nosuch, users) = (
        format!("{db}.plain"),
        format!("{db}.nosuch"),
        format!("{db}.users"),
    );
    assert_eq!(
        listed,
        [
            (plain.as_str(), "status"),
            (nosuch.as_str(), "Error"),
            (nosuch.as_str(), "status"),
            (users.as_str(), "status")
        ]
    );
    // HSCALE EXPLAIN shows each backend's statement.
    let explained: Vec<(String, u32, Option<String>, String)> =
        c.query("HSCALE EXPLAIN CHECK TABLE users QUICK").unwrap();
    let explained: Vec<(u32, &str)> = explained
        .iter()
        .map(|(_, backend, _, sql)| (*backend, sql.as_str()))
        .collect();
    assert_eq!(
        explained,
        [
            (
                1,
                format!("CHECK TABLE `{db}`.`users_default`, `{db}`.`users_z` QUICK").as_str()
            ),
            (2, format!("CHECK TABLE `{db}`.`users_m` QUICK").as_str()),
        ]
    );
    // mariadb-check lists the logical table, and its checks pass.
    let port = format!("-P{}", proxy.port);
    let checked = run_program(
        "mariadb-check",
        &["-h127.0.0.1", &port, "-uroot", "--extended", &db],
    );
    let line = |table: &str| {
        checked
            .lines()
            .find(|line| line.split_whitespace().next() == Some(table))
            .map(|line| line.split_whitespace().collect::<Vec<_>>())
    };
    assert_eq!(line(&users), Some(vec![users.as_str(), "OK"]), "{checked}");
    assert!(
        !checked.contains("users_"),
        "a physical table is listed: {checked}"
    );
}

/// As on MariaDB, table maintenance commits the transaction in progress
/// first, on every backend it reached: a ROLLBACK after it has nothing
/// left to undo.
#[test]
fn table_maintenance_commits_the_transaction_on_every_backend() {
    let proxy = multi_backend_transactions();
    let db = cluster().database("maintenance_commits");
    let mut c = partitioned_users(&proxy, &db);
    c.query_drop("CREATE TABLE plain (id INT PRIMARY KEY)")
        .unwrap();
    let on_backend_2 = |id: u32| -> bool {
        let found: Option<u32> = cluster()
            .direct(2, Some(&db))
            .query_first(format!("SELECT id FROM users_m WHERE id = {id}"))
            .unwrap();
        found.is_some()
    };
    for (id, statement) in [(1, "ANALYZE TABLE plain"), (2, "CHECK TABLE users")] {
        c.query_drop("BEGIN").unwrap();
        c.query_drop(format!("INSERT INTO users VALUES ({id}, 'mia', NULL)"))
            .unwrap();
        c.query_drop(format!("INSERT INTO plain VALUES ({id})"))
            .unwrap_or_else(|e| panic!("{e}"));
        let _: Vec<mysql::Row> = c.query(statement).unwrap();
        c.query_drop("ROLLBACK").unwrap();
        assert!(on_backend_2(id), "{statement} left backend 2 uncommitted");
        let plain: Option<u32> = c
            .query_first(format!("SELECT id FROM plain WHERE id = {id}"))
            .unwrap();
        assert_eq!(plain, Some(id), "{statement}");
    }
}

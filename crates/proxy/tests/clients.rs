//! Real command-line clients through hscale: the mariadb CLI, mariadb-admin,
//! mariadb-slap and sysbench with server-side prepared statements.

use hscale_testkit::{cluster, run_program, Proxy};
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
    let proxy = Proxy::for_cluster();
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
    // Prepared statements bind their client to a backend connection, so the pool
    // grew by at most one connection per sysbench thread.
    assert!(proxy.shared.main_pool().open_connections() <= 5);
    let _ = cluster().direct(1, Some(&db)).query_drop("SELECT 1");
}

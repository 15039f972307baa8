//! Prepared statements owned by hscale: clients get hscale's ids, statements
//! are prepared lazily on whichever backend connection runs them, and
//! preparing does not pin a client to a connection.

use hscale_testkit::raw::{payloads, RawClient};
use hscale_testkit::{cluster, Proxy};
use hscale_wire::scan::Expect;
use mysql::prelude::Queryable;

fn proxy_with(max_connections: usize, prepared_statements: usize) -> Proxy {
    let mut config = cluster().config();
    config.backends[0].max_connections = max_connections;
    config.backends[0].prepared_statements = prepared_statements;
    config.proxy.queue_timeout_ms = 2000;
    Proxy::start(config)
}

/// A new database whose table `t` holds `rows` rows.
fn database_with_rows(name: &str, rows: usize) -> String {
    let db = cluster().database(name);
    let mut direct = cluster().direct(1, Some(&db));
    direct.query_drop("CREATE TABLE t (id INT)").unwrap();
    let values: Vec<String> = (1..=rows).map(|i| format!("({i})")).collect();
    direct
        .query_drop(format!("INSERT INTO t VALUES {}", values.join(", ")))
        .unwrap();
    db
}

#[test]
fn clients_with_prepared_statements_share_a_small_pool() {
    let db = cluster().database("prepared_share");
    let proxy = proxy_with(2, 128);
    let mut clients: Vec<_> = (0..12).map(|_| proxy.connect(Some(&db))).collect();
    let statements: Vec<_> = clients
        .iter_mut()
        .map(|c| c.prep("SELECT ? * 2").unwrap())
        .collect();
    for round in 0..3i64 {
        for (i, (c, stmt)) in clients.iter_mut().zip(&statements).enumerate() {
            let n = i as i64 * 10 + round;
            let doubled: Option<i64> = c.exec_first(stmt, (n,)).unwrap();
            assert_eq!(doubled, Some(n * 2), "client {i}, round {round}");
        }
    }
    let open = proxy.shared.main_pool().open_connections();
    assert!(
        open <= 2,
        "12 clients with prepared statements opened {open}"
    );
}

#[test]
fn the_same_text_in_two_databases_reads_each_its_own_table() {
    let a = database_with_rows("prepared_db_a", 1);
    let b = database_with_rows("prepared_db_b", 2);
    // One backend connection: both clients' statements live on it.
    let proxy = proxy_with(1, 128);
    let mut in_a = proxy.connect(Some(&a));
    let mut in_b = proxy.connect(Some(&b));
    for _ in 0..3 {
        let count: Option<i64> = in_a.exec_first("SELECT COUNT(*) FROM t", ()).unwrap();
        assert_eq!(count, Some(1));
        let count: Option<i64> = in_b.exec_first("SELECT COUNT(*) FROM t", ()).unwrap();
        assert_eq!(count, Some(2));
    }
}

#[test]
fn statements_pushed_out_of_the_connection_cache_are_prepared_again() {
    let db = cluster().database("prepared_evicted");
    let proxy = proxy_with(1, 2);
    let mut client = proxy.connect(Some(&db));
    let texts: Vec<String> = (1..=5).map(|k| format!("SELECT ? + {k}")).collect();
    let statements: Vec<_> = texts.iter().map(|t| client.prep(t).unwrap()).collect();
    for round in 0..3i64 {
        for (k, stmt) in statements.iter().enumerate() {
            let sum: Option<i64> = client.exec_first(stmt, (round,)).unwrap();
            assert_eq!(
                sum,
                Some(round + k as i64 + 1),
                "statement {k}, round {round}"
            );
        }
    }
}

#[test]
fn a_prepared_set_of_a_user_variable_keeps_it_for_later_queries() {
    let db = cluster().database("prepared_user_variable");
    let proxy = proxy_with(2, 128);
    let mut client = proxy.connect(Some(&db));
    client.exec_drop("SET @x = ?", (42,)).unwrap();
    // Others come and go on the pool meanwhile.
    for _ in 0..3 {
        let mut other = proxy.connect(Some(&db));
        other.query_drop("SET @x = 7").unwrap();
    }
    let x: Option<i64> = client.query_first("SELECT @x").unwrap();
    assert_eq!(x, Some(42));
    let x: Option<i64> = client.exec_first("SELECT @x + ?", (1,)).unwrap();
    assert_eq!(x, Some(43));
}

#[test]
fn a_prepared_statement_runs_in_the_database_it_was_prepared_in() {
    let a = database_with_rows("prepared_use_a", 1);
    let b = database_with_rows("prepared_use_b", 3);
    // One statement per connection: the next statement pushes it out, and
    // it is prepared again after the client moved to database b.
    let proxy = proxy_with(1, 1);
    let mut client = proxy.connect(Some(&a));
    let count = client.prep("SELECT COUNT(*) FROM t").unwrap();
    client.query_drop(format!("USE {b}")).unwrap();
    let _ = client.exec_first::<i64, _, _>("SELECT ?", (1,)).unwrap();
    let n: Option<i64> = client.exec_first(&count, ()).unwrap();
    assert_eq!(n, Some(1), "as on MariaDB: the table of database a");
    let n: Option<i64> = client.query_first("SELECT COUNT(*) FROM t").unwrap();
    assert_eq!(n, Some(3));
}

/// COM_STMT_PREPARE of `sql` through `client`; returns the statement id.
async fn prepare(client: &mut RawClient, sql: &str, packets: usize) -> [u8; 4] {
    let mut prepare = vec![0x16];
    prepare.extend_from_slice(sql.as_bytes());
    let answer = client.command(&prepare, packets).await;
    assert_eq!(
        answer[0][0],
        0x00,
        "{:?}",
        String::from_utf8_lossy(&answer[0])
    );
    answer[0][1..5].try_into().unwrap()
}

/// COM_STMT_EXECUTE of a statement of one BIGINT parameter, its type sent or
/// not; returns the answer's packets (column count, definition, EOF, row, EOF).
async fn execute(client: &mut RawClient, stmt: [u8; 4], value: i64, types: bool) -> Vec<Vec<u8>> {
    let mut execute = vec![0x17];
    execute.extend_from_slice(&stmt);
    execute.extend_from_slice(&[0x00, 1, 0, 0, 0, 0x00]);
    match types {
        true => execute.extend_from_slice(&[0x01, 0x08, 0x00]),
        false => execute.push(0x00),
    }
    execute.extend_from_slice(&value.to_le_bytes());
    let answer = client
        .command_bytes(&execute, Expect::ResultSets, false)
        .await;
    let packets = payloads(&answer);
    assert_ne!(
        packets[0][0],
        0xff,
        "{}",
        String::from_utf8_lossy(&packets[0])
    );
    packets
}

fn binary_bigint(row: &[u8]) -> i64 {
    // Header 0, one byte of NULL bitmap, then the value.
    i64::from_le_bytes(row[2..10].try_into().unwrap())
}

#[tokio::test]
async fn types_bound_once_follow_the_statement_to_another_backend_statement() {
    let db = cluster().database("prepared_types");
    let proxy = tokio::task::spawn_blocking(|| proxy_with(1, 1))
        .await
        .unwrap();
    let mut client = RawClient::login(proxy.port, "root", "", Some(&db)).await;
    // OK, parameter definition + EOF, column definition + EOF.
    let plus_one = prepare(&mut client, "SELECT ? + 1", 5).await;
    let times_ten = prepare(&mut client, "SELECT ? * 10", 5).await;
    assert_ne!(plus_one, times_ten);
    let answer = execute(&mut client, plus_one, 1, true).await;
    assert_eq!(binary_bigint(&answer[3]), 2);
    // The connection keeps one statement: this one pushes `? + 1` out.
    let answer = execute(&mut client, times_ten, 5, true).await;
    assert_eq!(binary_bigint(&answer[3]), 50);
    // Prepared again on the backend, which never saw the types: hscale
    // sends the ones the client bound before.
    let answer = execute(&mut client, plus_one, 7, false).await;
    assert_eq!(binary_bigint(&answer[3]), 8);

    // COM_RESET_CONNECTION closes every statement, as on MariaDB.
    assert_eq!(client.command(&[0x1f], 1).await[0][0], 0x00);
    let mut again = vec![0x17];
    again.extend_from_slice(&plus_one);
    again.extend_from_slice(&[0x00, 1, 0, 0, 0, 0x00, 0x00]);
    again.extend_from_slice(&7i64.to_le_bytes());
    let error = client.command(&again, 1).await;
    assert_eq!(error[0][0], 0xff);
    assert_eq!(u16::from_le_bytes([error[0][1], error[0][2]]), 1243);
    drop(client);
    tokio::task::spawn_blocking(move || drop(proxy))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_cursor_holds_its_connection_until_its_last_row() {
    let db = cluster().database("prepared_cursor_hold");
    let proxy = tokio::task::spawn_blocking(|| proxy_with(4, 128))
        .await
        .unwrap();
    let mut client = RawClient::login(proxy.port, "root", "", Some(&db)).await;
    let stmt = prepare(&mut client, "SELECT seq FROM seq_1_to_3", 3).await;
    let mut open = vec![0x17];
    open.extend_from_slice(&stmt);
    open.extend_from_slice(&[0x01, 1, 0, 0, 0]);
    client.command(&open, 3).await;
    let idle = |proxy: &Proxy| proxy.shared.main_pool().idle_connections();
    let idle_while_open = idle(&proxy);
    let mut fetch = vec![0x1c];
    fetch.extend_from_slice(&stmt);
    fetch.extend_from_slice(&10u32.to_le_bytes());
    let rows = client.command(&fetch, 4).await;
    let status = u16::from_le_bytes([rows[3][3], rows[3][4]]);
    assert_ne!(status & 0x0080, 0, "last row sent");
    // The session returns the connection just after it answers.
    let started = std::time::Instant::now();
    while idle(&proxy) == idle_while_open && started.elapsed() < std::time::Duration::from_secs(5) {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(
        idle(&proxy),
        idle_while_open + 1,
        "the connection goes back to the pool once the cursor is read"
    );
    // No cursor now: MariaDB's error.
    let error = client.command(&fetch, 1).await;
    assert_eq!(u16::from_le_bytes([error[0][1], error[0][2]]), 1421);
    drop(client);
    tokio::task::spawn_blocking(move || drop(proxy))
        .await
        .unwrap();
}

#[test]
fn change_user_closes_prepared_statements_as_on_mariadb() {
    let db = database_with_rows("prepared_change_user", 2);
    let proxy = proxy_with(4, 128);
    let outcome = |port: u16| {
        let mut c = hscale_testkit::connect(port, "root", "", Some(&db));
        let stmt = c.prep("SELECT COUNT(*) FROM t WHERE id > ?").unwrap();
        let before: Option<i64> = c.exec_first(&stmt, (0,)).unwrap();
        c.change_user(mysql::ChangeUserOpts::default().with_db_name(Some(db.clone())))
            .unwrap();
        let after = match c.exec_first::<i64, _, _>(&stmt, (0,)) {
            Err(mysql::Error::MySqlError(e)) => Err(e.code),
            Ok(n) => Ok(n),
            Err(other) => panic!("{other:?}"),
        };
        // Prepared again, it runs.
        let again = c.prep("SELECT COUNT(*) FROM t WHERE id > ?").unwrap();
        let n: Option<i64> = c.exec_first(&again, (1,)).unwrap();
        (before, after, n)
    };
    let direct = outcome(cluster().port(1));
    assert_eq!(direct.0, Some(2));
    assert_eq!(outcome(proxy.port), direct);
}

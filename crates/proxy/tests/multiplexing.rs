//! Many clients share few backend connections, and none of them notices: each
//! keeps its own settings, transaction, insert id, temporary tables, variables.

use hscale_testkit::{cluster, run_program, Proxy};
use mysql::prelude::Queryable;

/// A new database on backend 1 with an empty table `t (id INT PRIMARY KEY)`.
fn database_with_table(name: &str) -> String {
    let db = cluster().database(name);
    cluster().direct(1, Some(&db)).query_drop(TABLE_T).unwrap();
    db
}

const TABLE_T: &str = "CREATE TABLE t (id INT PRIMARY KEY) ENGINE=InnoDB";

fn small_pool_proxy(max: usize) -> Proxy {
    let mut config = cluster().config();
    config.backends[0].max_connections = max;
    Proxy::start(config)
}

#[test]
fn idle_clients_hold_no_backend_connection() {
    let db = cluster().database("mux_idle");
    let proxy = Proxy::for_cluster();
    let mut clients: Vec<_> = (0..20).map(|_| proxy.connect(Some(&db))).collect();
    for (i, c) in clients.iter_mut().enumerate() {
        let v: Option<i64> = c.query_first(format!("SELECT {i}")).unwrap();
        assert_eq!(v, Some(i as i64));
    }
    // One per worker (each opens its own rather than borrow another's
    // while the pool has room), and the one hscale learned the server by.
    let open = proxy.shared.main_pool().open_connections();
    assert!(
        open <= proxy.shared.cores + 1,
        "20 clients used one after another opened {open} backend connections on {} workers",
        proxy.shared.cores
    );
}

/// Two workers and one backend connection: the client the second worker
/// serves borrows the connection the first worker's client returned (the
/// backend's maximum holds over all workers); then eight clients on both
/// workers share two connections and every statement of every client is
/// answered: none starves because its worker's list is empty.
#[test]
fn workers_share_the_backend_connections_under_its_maximum() {
    let db = database_with_table("mux_workers");
    let mut config = cluster().config();
    config.proxy.threads = 2;
    config.backends[0].max_connections = 1;
    let proxy = Proxy::start(config);
    let pool = proxy.shared.main_pool().clone();
    let mut first = proxy.connect(Some(&db));
    let mut second = proxy.connect(Some(&db));
    for i in 0..20 {
        first
            .query_drop(format!("INSERT INTO t VALUES ({i})"))
            .unwrap();
        let count: u64 = second
            .query_first("SELECT COUNT(*) FROM t")
            .unwrap()
            .unwrap();
        assert_eq!(count, i + 1);
    }
    assert_eq!(pool.open_connections(), 1);
    assert!(pool.borrowed() >= 20, "borrowed {}", pool.borrowed());
    drop((first, second));

    let mut config = cluster().config();
    config.proxy.threads = 2;
    config.backends[0].max_connections = 2;
    let proxy = Proxy::start(config);
    clients_at_once_get_every_answer(&proxy, &db, 8, 200);
    assert!(proxy.shared.main_pool().open_connections() <= 2);
}

/// `clients` clients at once, each running `statements` statements, get
/// every answer, their own.
fn clients_at_once_get_every_answer(proxy: &Proxy, db: &str, clients: u64, statements: u64) {
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let mut conn = proxy.connect(Some(db));
            std::thread::spawn(move || {
                (0..statements)
                    .map(|i| {
                        conn.query_first::<u64, _>(format!("SELECT {c} * 1000 + {i}"))
                            .unwrap()
                            .unwrap()
                    })
                    .sum::<u64>()
            })
        })
        .collect();
    let sums: Vec<u64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let expected: Vec<u64> = (0..clients)
        .map(|c| (0..statements).map(|i| c * 1000 + i).sum())
        .collect();
    assert_eq!(sums, expected);
}

/// A session gets back the connection it returned last if no one used it
/// since: clients that run one statement at a time each stay on one backend
/// connection (warm, its settings applied), however many others a burst
/// left idle, and ROW_COUNT() finds the connection that ran the UPDATE
/// although another client ran a statement in between.
#[test]
fn clients_stay_on_the_connections_they_returned() {
    let db = database_with_table("mux_own");
    let proxy = Proxy::for_cluster();
    let mut burst: Vec<_> = (0..6).map(|_| proxy.connect(Some(&db))).collect();
    let mut burst_ids = Vec::new();
    for c in &mut burst {
        c.query_drop("BEGIN").unwrap();
        let id: u64 = c.query_first("SELECT @@pseudo_thread_id").unwrap().unwrap();
        burst_ids.push(id);
    }
    for c in &mut burst {
        c.query_drop("COMMIT").unwrap();
    }
    burst_ids.sort();
    burst_ids.dedup();
    assert_eq!(
        burst_ids.len(),
        6,
        "a transaction each holds its own connection"
    );
    assert!(proxy.shared.main_pool().idle_connections() >= 6);

    let mut a = proxy.connect(Some(&db));
    let mut b = proxy.connect(Some(&db));
    let (mut a_ids, mut b_ids) = (Vec::new(), Vec::new());
    for round in 0..8 {
        a.query_drop(format!("INSERT INTO t VALUES ({round})"))
            .unwrap();
        let b_id: u64 = b.query_first("SELECT @@pseudo_thread_id").unwrap().unwrap();
        b_ids.push(b_id);
        let (count, a_id): (i64, u64) = a
            .query_first("SELECT ROW_COUNT(), @@pseudo_thread_id")
            .unwrap()
            .unwrap();
        assert_eq!(count, 1, "round {round}: A's INSERT");
        a_ids.push(a_id);
    }
    assert!(a_ids.iter().all(|id| *id == a_ids[0]), "A ran on {a_ids:?}");
    assert!(b_ids.iter().all(|id| *id == b_ids[0]), "B ran on {b_ids:?}");
    assert_ne!(a_ids[0], b_ids[0]);
}

#[test]
fn each_client_keeps_its_own_settings_on_shared_connections() {
    let db = cluster().database("mux_settings");
    let proxy = small_pool_proxy(2);
    let zones = ["+01:00", "+02:00", "-03:00", "+04:30", "+05:00", "-11:00"];
    let mut clients: Vec<_> = zones.iter().map(|_| proxy.connect(Some(&db))).collect();
    for (c, zone) in clients.iter_mut().zip(zones) {
        c.query_drop(format!("SET time_zone = '{zone}'")).unwrap();
    }
    clients[0]
        .query_drop("SET sql_mode = 'ANSI_QUOTES'")
        .unwrap();
    for round in 0..3 {
        for (i, (c, zone)) in clients.iter_mut().zip(zones).enumerate() {
            let (tz, mode): (String, String) = c
                .query_first("SELECT @@time_zone, @@sql_mode")
                .unwrap()
                .unwrap();
            assert_eq!(tz, zone, "client {i}, round {round}");
            assert_eq!(
                mode.contains("ANSI_QUOTES"),
                i == 0,
                "client {i}: sql_mode {mode}"
            );
        }
    }
    assert!(proxy.shared.main_pool().open_connections() <= 2);
}

#[test]
fn a_transaction_keeps_its_connection_until_it_ends() {
    let db = database_with_table("mux_tx");
    let proxy = small_pool_proxy(2);
    let mut a = proxy.connect(Some(&db));
    let mut b = proxy.connect(Some(&db));
    a.query_drop("BEGIN").unwrap();
    a.query_drop("INSERT INTO t VALUES (1)").unwrap();
    let seen_by_b: Option<i64> = b.query_first("SELECT COUNT(*) FROM t").unwrap();
    assert_eq!(seen_by_b, Some(0));
    let seen_by_a: Option<i64> = a.query_first("SELECT COUNT(*) FROM t").unwrap();
    assert_eq!(
        seen_by_a,
        Some(1),
        "the transaction's own row is visible to it"
    );
    a.query_drop("ROLLBACK").unwrap();
    let after: Option<i64> = a.query_first("SELECT COUNT(*) FROM t").unwrap();
    assert_eq!(after, Some(0));
    a.query_drop("SET autocommit = 0").unwrap();
    a.query_drop("INSERT INTO t VALUES (2)").unwrap();
    assert_eq!(
        b.query_first::<i64, _>("SELECT COUNT(*) FROM t").unwrap(),
        Some(0)
    );
    a.query_drop("COMMIT").unwrap();
    assert_eq!(
        b.query_first::<i64, _>("SELECT COUNT(*) FROM t").unwrap(),
        Some(1)
    );
}

/// BEGIN, then another client's rows arrive before and after the first read:
/// what the transaction sees at each step.
fn snapshot_steps(a: &mut mysql::Conn, other: &mut mysql::Conn, begin: &str) -> Vec<i64> {
    let count =
        |c: &mut mysql::Conn| -> i64 { c.query_first("SELECT COUNT(*) FROM t").unwrap().unwrap() };
    a.query_drop(begin).unwrap();
    other.query_drop("INSERT INTO t VALUES (1)").unwrap();
    let mut seen = vec![count(a)];
    other.query_drop("INSERT INTO t VALUES (2)").unwrap();
    seen.push(count(a));
    seen.push(a.query_first("SELECT @@in_transaction").unwrap().unwrap());
    a.query_drop("COMMIT").unwrap();
    seen.push(count(a));
    seen.push(a.query_first("SELECT @@in_transaction").unwrap().unwrap());
    other.query_drop("DELETE FROM t").unwrap();
    seen
}

#[test]
fn a_begin_answered_by_hscale_opens_the_transaction_with_its_first_read() {
    let db = database_with_table("mux_begin");
    let proxy = small_pool_proxy(2);
    for begin in [
        "BEGIN",
        "start transaction;",
        "BEGIN WORK",
        "START TRANSACTION WITH CONSISTENT SNAPSHOT",
    ] {
        let direct = snapshot_steps(
            &mut cluster().direct(1, Some(&db)),
            &mut cluster().direct(1, Some(&db)),
            begin,
        );
        let proxied = snapshot_steps(
            &mut proxy.connect(Some(&db)),
            &mut proxy.connect(Some(&db)),
            begin,
        );
        assert_eq!(proxied, direct, "{begin}");
    }
    // The snapshot is taken at the first read: what InnoDB does anyway.
    let plain = snapshot_steps(
        &mut proxy.connect(Some(&db)),
        &mut proxy.connect(Some(&db)),
        "BEGIN",
    );
    assert_eq!(plain, [1, 1, 1, 2, 0]);

    // A transaction that reached no backend ends with nothing open.
    let mut a = proxy.connect(Some(&db));
    let mut other = proxy.connect(Some(&db));
    for end in ["COMMIT", "ROLLBACK WORK", "COMMIT AND NO CHAIN"] {
        a.query_drop("BEGIN").unwrap();
        a.query_drop(end).unwrap();
        a.query_drop("INSERT INTO t VALUES (7)").unwrap();
        let seen: Option<i64> = other.query_first("SELECT COUNT(*) FROM t").unwrap();
        assert_eq!(seen, Some(1), "after BEGIN; {end} the insert committed");
        a.query_drop("DELETE FROM t").unwrap();
    }
}

#[test]
fn last_insert_id_is_the_clients_own() {
    let db = cluster().database("mux_insert_id");
    cluster()
        .direct(1, Some(&db))
        .query_drop("CREATE TABLE t (id INT PRIMARY KEY AUTO_INCREMENT, v INT)")
        .unwrap();
    let proxy = small_pool_proxy(1);
    let mut a = proxy.connect(Some(&db));
    let mut b = proxy.connect(Some(&db));
    a.query_drop("INSERT INTO t (v) VALUES (1)").unwrap();
    b.query_drop("INSERT INTO t (v) VALUES (2), (3)").unwrap();
    assert_eq!(
        a.query_first::<u64, _>("SELECT LAST_INSERT_ID()").unwrap(),
        Some(1)
    );
    assert_eq!(
        b.query_first::<u64, _>("SELECT LAST_INSERT_ID()").unwrap(),
        Some(2)
    );
    a.query_drop("UPDATE t SET v = 9 WHERE id = 3").unwrap();
    assert_eq!(
        a.query_first::<u64, _>("SELECT LAST_INSERT_ID()").unwrap(),
        Some(1)
    );
}

#[test]
fn temporary_tables_and_user_variables_stay_with_their_client() {
    let db = cluster().database("mux_sticky");
    let proxy = small_pool_proxy(3);
    let mut a = proxy.connect(Some(&db));
    let mut b = proxy.connect(Some(&db));
    a.query_drop("CREATE TEMPORARY TABLE scratch (x INT)")
        .unwrap();
    a.query_drop("INSERT INTO scratch VALUES (1), (2)").unwrap();
    b.query_drop("SET @mine = 'b'").unwrap();
    for _ in 0..5 {
        let mut other = proxy.connect(Some(&db));
        other.query_drop("SELECT 1").unwrap();
    }
    assert_eq!(
        a.query_first::<i64, _>("SELECT COUNT(*) FROM scratch")
            .unwrap(),
        Some(2)
    );
    assert_eq!(
        b.query_first::<String, _>("SELECT @mine")
            .unwrap()
            .as_deref(),
        Some("b")
    );
    assert!(
        b.query_drop("SELECT * FROM scratch").is_err(),
        "another client's temporary table is invisible"
    );
}

#[test]
fn show_warnings_sees_the_previous_statement() {
    let db = cluster().database("mux_warnings");
    let proxy = small_pool_proxy(1);
    let mut a = proxy.connect(Some(&db));
    let mut b = proxy.connect(Some(&db));
    a.query_drop("SELECT CAST('12abc' AS SIGNED)").unwrap();
    for _ in 0..2 {
        let warnings: Vec<(String, u32, String)> = a.query("SHOW WARNINGS").unwrap();
        assert_eq!(warnings.len(), 1);
        assert_eq!(warnings[0].1, 1292);
    }
    // Reading them gave the one connection back.
    b.query_drop("SELECT 1").unwrap();
    let none: Vec<(String, u32, String)> = b.query("SHOW WARNINGS").unwrap();
    assert!(none.is_empty());
    // b has used it since: a's messages are gone, and hscale says so.
    match a.query_drop("SHOW WARNINGS") {
        Err(mysql::Error::MySqlError(e)) => assert_eq!(e.code, 1105, "{e}"),
        other => panic!("expected 1105, got {other:?}"),
    }
    // An error keeps no connection: b is served at once.
    assert!(a.query_drop("SELECT nope").is_err());
    b.query_drop("SELECT 1").unwrap();
}

#[test]
fn use_switches_database_for_that_client_only() {
    let one = cluster().database("mux_use_one");
    let two = cluster().database("mux_use_two");
    let proxy = small_pool_proxy(1);
    let mut a = proxy.connect(Some(&one));
    let mut b = proxy.connect(Some(&one));
    a.query_drop(format!("USE `{two}`")).unwrap();
    assert_eq!(
        a.query_first::<String, _>("SELECT DATABASE()").unwrap(),
        Some(two.clone())
    );
    assert_eq!(
        b.query_first::<String, _>("SELECT DATABASE()").unwrap(),
        Some(one.clone())
    );
    assert_eq!(
        a.query_first::<String, _>("SELECT DATABASE()").unwrap(),
        Some(two)
    );
}

/// Runs the same statements on `conn` and returns what each SELECT answered.
fn previous_statement_script(conn: &mut mysql::Conn) -> Vec<Option<i64>> {
    let mut seen = Vec::new();
    conn.query_drop("INSERT INTO t VALUES (1), (2), (3)")
        .unwrap();
    seen.push(conn.query_first("SELECT ROW_COUNT()").unwrap());
    conn.query_drop("UPDATE t SET id = id + 10 WHERE id < 3")
        .unwrap();
    seen.push(conn.query_first("SELECT ROW_COUNT()").unwrap());
    conn.query_drop("SELECT id FROM t WHERE id > 10").unwrap();
    seen.push(conn.query_first("SELECT FOUND_ROWS()").unwrap());
    seen
}

#[test]
fn row_count_and_found_rows_answer_the_clients_previous_statement() {
    let db = database_with_table("mux_row_count");
    let mut direct = cluster().direct(1, Some(&db));
    let oracle = previous_statement_script(&mut direct);
    assert_eq!(oracle, [Some(3), Some(2), Some(2)]);
    direct.query_drop("DROP TABLE t").unwrap();
    direct.query_drop(TABLE_T).unwrap();

    // Three transactions at once leave three idle connections in the pool, so
    // that any statement of A's may land on another one than the last.
    let proxy = small_pool_proxy(4);
    let mut others: Vec<_> = (0..3).map(|_| proxy.connect(Some(&db))).collect();
    for other in &mut others {
        other.query_drop("BEGIN").unwrap();
        other.query_drop("DO 0").unwrap();
    }
    for other in &mut others {
        other.query_drop("COMMIT").unwrap();
    }
    assert!(proxy.shared.main_pool().open_connections() >= 3);
    let mut a = proxy.connect(Some(&db));
    assert_eq!(previous_statement_script(&mut a), oracle);
}

#[test]
fn row_count_after_the_connection_served_another_client_is_an_error() {
    let db = database_with_table("mux_row_count_gone");
    let proxy = small_pool_proxy(1);
    let mut a = proxy.connect(Some(&db));
    let mut b = proxy.connect(Some(&db));
    a.query_drop("INSERT INTO t VALUES (1), (2)").unwrap();
    b.query_drop("DELETE FROM t WHERE id = 2").unwrap();
    let err = a.query_drop("SELECT ROW_COUNT()").unwrap_err();
    match err {
        mysql::Error::MySqlError(e) => {
            assert_eq!(e.code, 1105, "{e}");
            assert!(e.message.contains("ROW_COUNT()"), "{e}");
        }
        e => panic!("expected a server error, got {e}"),
    }
    let b_count: Option<i64> = b.query_first("SELECT ROW_COUNT()").unwrap();
    assert_eq!(b_count, Some(1), "B's own connection answers for B");
    let rows: Option<i64> = a.query_first("SELECT COUNT(*) FROM t").unwrap();
    assert_eq!(rows, Some(1), "A's session goes on");
}

/// Type, flags, length and name of the one column `SELECT CONNECTION_ID()` returns.
fn connection_id_column(conn: &mut mysql::Conn) -> (String, u64) {
    let result = conn.query_iter("SELECT CONNECTION_ID()").unwrap();
    let columns = result.columns();
    let column = &columns.as_ref()[0];
    let shape = format!(
        "{} {:?} {:?} {}",
        column.name_str(),
        column.column_type(),
        column.flags(),
        column.column_length()
    );
    let rows: Vec<mysql::Row> = result.collect::<Result<_, _>>().unwrap();
    (shape, mysql::from_row(rows[0].clone()))
}

#[test]
fn connection_id_is_the_id_the_client_was_greeted_with() {
    let db = cluster().database("mux_connection_id");
    let (direct_shape, direct_id) = connection_id_column(&mut cluster().direct(1, Some(&db)));
    assert!(direct_id > 0);
    let proxy = small_pool_proxy(1);
    let mut clients: Vec<_> = (0..3).map(|_| proxy.connect(Some(&db))).collect();
    for client in &mut clients {
        let greeted = u64::from(client.connection_id());
        let (shape, id) = connection_id_column(client);
        assert_eq!(id, greeted, "one backend connection, three clients");
        assert_eq!(shape, direct_shape, "the server's own metadata");
    }
    // The id is the one KILL takes: it ends that client, not another.
    let victim: u64 = clients[2]
        .query_first("select connection_id() AS id;")
        .unwrap()
        .unwrap();
    clients[0].query_drop(format!("KILL {victim}")).unwrap();
    assert!(clients[2].query_drop("SELECT 1").is_err());
    clients[1].query_drop("SELECT 1").unwrap();
    // The binary protocol, and the names of columns around the call.
    let client = &mut clients[1];
    let greeted = u64::from(client.connection_id());
    let prepared: Option<u64> = client.exec_first("SELECT CONNECTION_ID()", ()).unwrap();
    assert_eq!(prepared, Some(greeted));
    let names = |conn: &mut mysql::Conn| {
        let sql = "SELECT CONNECTION_ID() + 0, 7 AS seven, connection_id( ) > 0";
        let result = conn.query_iter(sql).unwrap();
        let columns = result.columns();
        let names: Vec<String> = columns
            .as_ref()
            .iter()
            .map(|c| c.name_str().into())
            .collect();
        names
    };
    assert_eq!(names(client), names(&mut cluster().direct(1, Some(&db))));
}

/// The variables that say where "the server" is answer hscale's listener, in
/// text and prepared statements, alone and in a select list, on the main
/// backend and routed to partitions, with the columns MariaDB gives them. The
/// Rust `mysql` crate with its default `prefer_socket` reads `@@socket` after
/// login and moves to that socket when the server is on its host: through
/// hscale it must stay with hscale (before, it went to backend 1's socket and
/// its partitioned table was not there: 1146).
#[test]
fn variables_naming_the_server_answer_hscales_listener() {
    let db = cluster().database("mux_server_variables");
    let mut direct = cluster().direct(1, Some(&db));
    direct
        .query_drop("CREATE TABLE acc (id INT PRIMARY KEY, owner INT)")
        .unwrap();
    let proxy = Proxy::for_cluster();
    let mut admin = proxy.connect(Some(&db));
    admin
        .query_drop("HSCALE SETUP_TABLE('acc', 'id', 'acc_default', 1, 'MOD(2)')")
        .unwrap();
    admin
        .query_drop("HSCALE ADD_PARTITION('acc', 'odd', 1, 2)")
        .unwrap();
    admin
        .query_drop("INSERT INTO acc VALUES (1, 10), (2, 20)")
        .unwrap();
    let backend_socket: Option<String> = direct.query_first("SELECT @@socket").unwrap();
    assert!(
        backend_socket.is_some(),
        "the backend has a socket to move to"
    );

    let opts = hscale_testkit::opts(proxy.port, "root", "", Some(&db)).prefer_socket(true);
    let mut client = mysql::Conn::new(opts).unwrap();
    let rows: Vec<(i32, i32)> = client
        .query("SELECT id, owner FROM acc ORDER BY id")
        .unwrap();
    assert_eq!(rows, [(1, 10), (2, 20)], "still talking to hscale");

    let port = i64::from(proxy.port);
    let hostname: String = direct.query_first("SELECT @@hostname").unwrap().unwrap();
    let text: (String, i64, String, i64, String) = client
        .query_first("SELECT @@socket, @@port, @@hostname, @@global.port, @@bind_address")
        .unwrap()
        .unwrap();
    assert_eq!(
        text,
        (String::new(), port, hostname, port, "127.0.0.1".to_string())
    );
    let prepared: (String, Option<String>, i64, i64) = client
        .exec_first("SELECT @@socket, @@report_host, @@port, ? + 1", (1,))
        .unwrap()
        .unwrap();
    assert_eq!(prepared, (String::new(), None, port, 2));
    let routed: Vec<(i64, i32)> = client
        .query("SELECT @@port, owner FROM acc WHERE id = 1")
        .unwrap();
    assert_eq!(routed, [(port, 10)]);
    let scanned: Vec<(i64, i32)> = client
        .exec("SELECT @@report_port p, owner FROM acc ORDER BY owner", ())
        .unwrap();
    assert_eq!(scanned, [(port, 10), (port, 20)]);

    // Names and types as MariaDB gives them.
    let columns = |conn: &mut mysql::Conn| {
        let sql = "SELECT @@port, @@socket, @@global.port AS p, @@hostname, @@version IS NOT NULL";
        let result = conn.query_iter(sql).unwrap();
        let columns = result.columns();
        let shape: Vec<String> = columns
            .as_ref()
            .iter()
            .map(|c| format!("{} {:?}", c.name_str(), c.column_type()))
            .collect();
        shape
    };
    assert_eq!(columns(&mut client), columns(&mut direct));
    // Session scope is the server's error to give, as MariaDB gives it.
    let session = client.query_drop("SELECT @@session.port").unwrap_err();
    assert!(
        matches!(&session, mysql::Error::MySqlError(e) if e.code == 1238),
        "{session:?}"
    );
}

/// A queue claimed by connection id, a common MySQL pattern: each client must
/// find the job it claimed, whichever backend connection runs each statement.
#[test]
fn jobs_claimed_by_connection_id_stay_with_their_client() {
    let db = cluster().database("mux_claim_by_connection_id");
    let mut setup = cluster().direct(1, Some(&db));
    setup
        .query_drop(
            "CREATE TABLE jobs (id INT PRIMARY KEY, owner INT UNSIGNED);
             INSERT INTO jobs VALUES (1, NULL), (2, NULL), (3, NULL)",
        )
        .unwrap();
    let proxy = small_pool_proxy(1);
    let mut clients: Vec<_> = (0..2).map(|_| proxy.connect(Some(&db))).collect();
    let claim = "UPDATE jobs SET owner = CONNECTION_ID() WHERE owner IS NULL ORDER BY id LIMIT 1";
    for client in &mut clients {
        client.query_drop(claim).unwrap();
    }
    for (client, job) in clients.iter_mut().zip([1, 2]) {
        let mine: Vec<i32> = client
            .query("SELECT id FROM jobs WHERE owner = CONNECTION_ID() ORDER BY id")
            .unwrap();
        assert_eq!(mine, vec![job]);
        let owner: Option<u64> = setup
            .exec_first("SELECT owner FROM jobs WHERE id = ?", (job,))
            .unwrap();
        assert_eq!(owner, Some(u64::from(client.connection_id())));
    }
}

#[test]
fn row_count_as_the_first_statement_is_a_new_connections() {
    let db = database_with_table("mux_row_count_first");
    // The mariadb CLI in batch mode sends nothing before the statement (the
    // Rust driver reads settings first); logging in with a database checks it
    // on the pooled connection the writer (same client, same settings) left.
    let cli = |port: u16, sql: &str| {
        let port = format!("-P{port}");
        run_program(
            "mariadb",
            &["-h127.0.0.1", &port, "-uroot", "-N", &db, "-e", sql],
        )
    };
    let fresh = cli(cluster().port(1), "SELECT ROW_COUNT()");
    assert_eq!(fresh.trim(), "0");
    let proxy = small_pool_proxy(1);
    cli(proxy.port, "INSERT INTO t VALUES (1), (2), (3)");
    assert_eq!(
        cli(proxy.port, "SELECT ROW_COUNT()"),
        fresh,
        "not the writer's 3"
    );
}

/// A batch of reads, writes and transaction control changes no session state,
/// so its client lets go of the connection; a batch with a SET keeps it.
#[test]
fn batches_bind_only_when_they_change_session_state() {
    let db = database_with_table("mux_batches");
    let mut config = cluster().config();
    config.backends[0].max_connections = 1;
    config.proxy.queue_timeout_ms = 300;
    let proxy = Proxy::start(config);
    let mut batcher = proxy.connect(Some(&db));
    let mut other = proxy.connect(Some(&db));
    batcher
        .query_drop("BEGIN; INSERT INTO t VALUES (1); COMMIT; SELECT * FROM t")
        .unwrap();
    let seen: Option<i64> = other.query_first("SELECT COUNT(*) FROM t").unwrap();
    assert_eq!(
        seen,
        Some(1),
        "the one connection was free for another client"
    );

    batcher
        .query_drop("SELECT 1; SET time_zone = '+03:00'")
        .unwrap();
    let zone: Option<String> = batcher.query_first("SELECT @@time_zone").unwrap();
    assert_eq!(zone.as_deref(), Some("+03:00"));
    match other.query_drop("SELECT 1").unwrap_err() {
        mysql::Error::MySqlError(e) => assert_eq!(e.code, 1040, "{e}"),
        e => panic!("expected a pool timeout, got {e}"),
    }
}

/// A stored procedure can change its connection's session state where hscale
/// cannot see it: the caller keeps that connection, and no one else gets it.
#[test]
fn a_procedure_that_changes_the_session_binds_its_caller() {
    let db = cluster().database("mux_call");
    cluster()
        .direct(1, Some(&db))
        .query_drop("CREATE PROCEDURE east() SET SESSION time_zone = '+05:00'")
        .unwrap();
    let proxy = small_pool_proxy(2);
    let mut caller = proxy.connect(Some(&db));
    caller.query_drop("CALL east()").unwrap();
    for _ in 0..3 {
        let mut other = proxy.connect(Some(&db));
        let zone: Option<String> = other.query_first("SELECT @@time_zone").unwrap();
        assert_eq!(
            zone.as_deref(),
            Some("SYSTEM"),
            "the procedure's zone leaked"
        );
    }
    let zone: Option<String> = caller.query_first("SELECT @@time_zone").unwrap();
    assert_eq!(zone.as_deref(), Some("+05:00"));
}

#[test]
fn kill_cannot_share_a_query_with_other_statements() {
    let proxy = Proxy::for_cluster();
    let mut client = proxy.connect(None);
    let id = client.connection_id();
    match client
        .query_drop(format!("KILL QUERY {id}; SELECT 1"))
        .unwrap_err()
    {
        mysql::Error::MySqlError(e) => assert_eq!(e.code, 1235, "{e}"),
        e => panic!("expected an error, got {e}"),
    }
    client.query_drop("SELECT 1").unwrap();
}

/// Clients outnumbering the pool run random statements that leave session
/// state, all at once; each must only ever see its own time zone, database,
/// insert id, row count, uncommitted rows, variables and temporary tables.
#[test]
fn concurrent_clients_only_ever_see_their_own_session_state() {
    let db = cluster().database("mux_random");
    let other_db = cluster().database("mux_random_other");
    cluster()
        .direct(1, Some(&db))
        .query_drop(
            "CREATE TABLE t (id INT AUTO_INCREMENT PRIMARY KEY, owner INT, v INT) ENGINE=InnoDB",
        )
        .unwrap();
    let proxy = small_pool_proxy(4);
    std::thread::scope(|scope| {
        for me in 0..6u64 {
            let (proxy, db, other_db) = (&proxy, &db, &other_db);
            scope.spawn(move || random_session(proxy, me, db, other_db));
        }
    });
}

/// One client's random walk; `me` seeds it and marks its rows.
fn random_session(proxy: &Proxy, me: u64, db: &str, other_db: &str) {
    let mut conn = proxy.connect(Some(db));
    let greeted = u64::from(conn.connection_id());
    let mut seed = 0x9e37_79b9_7f4a_7c15 ^ (me + 1);
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    // Two clients bind themselves for good; the others stay multiplexed.
    if me == 0 {
        conn.query_drop(format!("SET @mine = {me}")).unwrap();
    }
    if me == 1 {
        conn.query_drop("CREATE TEMPORARY TABLE mine (x INT)")
            .unwrap();
    }
    let (mut zone, mut current_db, mut last_id) = ("SYSTEM".to_string(), db.to_string(), 0u64);
    let (mut committed, mut pending, mut in_tx_for) = (0i64, 0i64, None::<u32>);
    for step in 0..150 {
        let context = format!("client {me}, step {step}");
        match next(10) {
            0 => {
                zone = format!("+0{}:{}0", me % 10, next(6));
                conn.query_drop(format!("SET time_zone = '{zone}'"))
                    .unwrap();
            }
            1 => {
                let seen: Option<String> = conn.query_first("SELECT @@time_zone").unwrap();
                assert_eq!(seen.as_deref(), Some(zone.as_str()), "{context}");
            }
            2 => {
                conn.query_drop(format!(
                    "INSERT INTO `{db}`.t (owner, v) VALUES ({me}, {step})"
                ))
                .unwrap();
                last_id = conn.last_insert_id();
                pending += 1;
                if in_tx_for.is_none() {
                    committed += std::mem::take(&mut pending);
                }
            }
            3 if last_id != 0 => {
                let seen: Option<u64> = conn.query_first("SELECT LAST_INSERT_ID()").unwrap();
                assert_eq!(seen, Some(last_id), "{context}");
            }
            4 if in_tx_for.is_none() => {
                conn.query_drop("BEGIN").unwrap();
                in_tx_for = Some(0);
            }
            5 => {
                let count: Option<i64> = conn
                    .query_first(format!("SELECT COUNT(*) FROM `{db}`.t WHERE owner = {me}"))
                    .unwrap();
                assert_eq!(count, Some(committed + pending), "{context}");
            }
            6 => {
                current_db = if current_db == db { other_db } else { db }.to_string();
                conn.query_drop(format!("USE `{current_db}`")).unwrap();
                let seen: Option<String> = conn.query_first("SELECT DATABASE()").unwrap();
                assert_eq!(seen.as_deref(), Some(current_db.as_str()), "{context}");
            }
            7 => {
                let seen: Option<u64> = conn.query_first("SELECT CONNECTION_ID()").unwrap();
                assert_eq!(seen, Some(greeted), "{context}");
            }
            8 => {
                // ROW_COUNT() answers this client's UPDATE or fails with 1105,
                // never with what another client's statement did.
                let update = format!("UPDATE `{db}`.t SET v = v + 1 WHERE owner = {me}");
                match conn.query_drop(update) {
                    Ok(()) => {}
                    // InnoDB may pick this transaction as a deadlock victim and
                    // roll it back; that is the server's answer, not hscale's.
                    Err(mysql::Error::MySqlError(e)) if e.code == 1213 => {
                        pending = 0;
                        in_tx_for = None;
                        continue;
                    }
                    Err(e) => panic!("{context}: {e}"),
                }
                let updated = conn.affected_rows();
                match conn.query_first::<i64, _>("SELECT ROW_COUNT()") {
                    Ok(seen) => assert_eq!(seen, Some(updated as i64), "{context}"),
                    Err(mysql::Error::MySqlError(e)) => assert_eq!(e.code, 1105, "{context}"),
                    Err(e) => panic!("{context}: {e}"),
                }
            }
            _ => {
                if me == 0 {
                    let mine: Option<u64> = conn.query_first("SELECT @mine").unwrap();
                    assert_eq!(mine, Some(me), "{context}");
                }
                if me == 1 {
                    conn.query_drop(format!("INSERT INTO `{db}`.mine VALUES (1)"))
                        .unwrap();
                }
            }
        }
        // Transactions end within a few steps, by commit or rollback.
        if let Some(age) = in_tx_for.as_mut() {
            *age += 1;
            if *age > 4 {
                if next(2) == 0 {
                    conn.query_drop("COMMIT").unwrap();
                    committed += pending;
                } else {
                    conn.query_drop("ROLLBACK").unwrap();
                }
                pending = 0;
                in_tx_for = None;
            }
        }
    }
}

/// Under sql_mode NO_BACKSLASH_ESCAPES, `'C:\'` is a whole string: hscale must
/// see the statements after it as the server does, the session's sql_mode
/// going by the status of the server's last answer.
#[test]
fn a_backslash_ends_no_string_when_the_session_says_so() {
    let db = cluster().database("mux_no_backslash_escapes");
    let proxy = small_pool_proxy(3);
    let mut a = proxy.connect(Some(&db));
    a.query_drop("SET SESSION sql_mode = 'NO_BACKSLASH_ESCAPES'")
        .unwrap();
    let id_query = r"SELECT 'C:\', CONNECTION_ID()";
    let (path, id): (String, u32) = a.query_first(id_query).unwrap().unwrap();
    assert_eq!((path.as_str(), id), (r"C:\", a.connection_id()));
    a.query_drop(r"SELECT 'C:\'; SET @mine = 'a'").unwrap();
    for _ in 0..5 {
        let mut other = proxy.connect(Some(&db));
        other.query_drop("SELECT 1").unwrap();
    }
    let mine: Option<Option<String>> = a.query_first("SELECT @mine").unwrap();
    assert_eq!(mine, Some(Some("a".into())), "the user variable stayed");
    // Back to the default, a backslash escapes again.
    a.query_drop("SET SESSION sql_mode = DEFAULT").unwrap();
    let (quote, id): (String, u32) = a
        .query_first(r"SELECT 'it\'s', CONNECTION_ID()")
        .unwrap()
        .unwrap();
    assert_eq!((quote.as_str(), id), ("it's", a.connection_id()));
}

/// A server whose default sql_mode has NO_BACKSLASH_ESCAPES says so in its
/// greeting, and clients escape strings by it: hscale's greeting must say it
/// too, and hscale must read the first statement that way.
#[test]
fn the_greeting_tells_a_server_default_of_no_backslash_escapes() {
    use hscale_wire::packets::ServerGreeting;
    use hscale_wire::StatusFlags;
    use std::io::Read;
    // Backend 2 serves no other test of this binary, so its global mode is ours.
    let db = cluster().database("mux_global_no_backslash_escapes");
    let mut backend = cluster().direct(2, None);
    backend
        .query_drop("SET GLOBAL sql_mode = CONCAT(@@sql_mode, ',NO_BACKSLASH_ESCAPES')")
        .unwrap();
    let mut config = cluster().config();
    config.dictionary.backend = 2;
    let proxy = Proxy::start(config);
    let mut socket = std::net::TcpStream::connect(("127.0.0.1", proxy.port)).unwrap();
    let mut header = [0u8; 4];
    socket.read_exact(&mut header).unwrap();
    let mut greeting = vec![0u8; u32::from_le_bytes([header[0], header[1], header[2], 0]) as usize];
    socket.read_exact(&mut greeting).unwrap();
    let status = ServerGreeting::parse(&greeting).unwrap().status;
    let mut client = hscale_testkit::connect(proxy.port, "root", "", Some(&db));
    let first: Option<(String, u32)> = client
        .query_first(r"SELECT 'C:\', CONNECTION_ID()")
        .unwrap();
    let id = client.connection_id();
    drop(client);
    drop(proxy);
    backend.query_drop("SET GLOBAL sql_mode = DEFAULT").unwrap();
    assert!(
        status.contains(StatusFlags::SERVER_STATUS_NO_BACKSLASH_ESCAPES),
        "{status:?}"
    );
    assert_eq!(first, Some((r"C:\".to_string(), id)));
}

#[test]
fn a_client_idle_past_its_wait_timeout_is_closed_and_the_pool_keeps_its_connection() {
    let db = cluster().database("mux_wait_timeout");
    let proxy = Proxy::for_cluster();
    let mut idle = proxy.connect(Some(&db));
    let mut patient = proxy.connect(Some(&db));
    idle.query_drop("SET SESSION wait_timeout = 1").unwrap();
    let timeout: Option<u64> = idle.query_first("SELECT @@wait_timeout").unwrap();
    assert_eq!(timeout, Some(1));
    let open = proxy.shared.main_pool().open_connections();
    // Closed one to two seconds after wait_timeout (hscale looks every second).
    std::thread::sleep(std::time::Duration::from_millis(4500));
    let err = idle.query_drop("SELECT 1").unwrap_err();
    assert!(
        matches!(err, mysql::Error::IoError(_) | mysql::Error::DriverError(_)),
        "the connection was closed: {err:?}"
    );
    assert_eq!(
        proxy.shared.main_pool().open_connections(),
        open,
        "the backend connections stay in the pool"
    );
    let one: Option<i32> = patient.query_first("SELECT 1").unwrap();
    assert_eq!(one, Some(1), "a client with the default wait_timeout stays");
}

/// Two workers, every client moving to the other at every statement where
/// it may (`move_clients = "always"`): none notices. Each keeps its
/// settings, variables, database, prepared statements, insert id, the
/// previous statement's warnings and row counts; a temporary table keeps
/// its client on one worker while it lives; KILL finds a client that moved;
/// clients at once on both workers get every answer.
#[test]
fn clients_moving_between_workers_notice_nothing() {
    let db = database_with_table("mux_moving");
    let other_db = cluster().database("mux_moving_other");
    cluster()
        .direct(1, Some(&db))
        .query_drop("CREATE TABLE seq (id INT PRIMARY KEY AUTO_INCREMENT, v INT)")
        .unwrap();
    let mut config = cluster().config();
    config.proxy.threads = 2;
    config.proxy.move_clients = hscale::config::MoveClients::Always;
    config.backends[0].max_connections = 4;
    let proxy = Proxy::start(config);
    let moved = || {
        proxy
            .shared
            .balance
            .moved
            .load(std::sync::atomic::Ordering::Relaxed)
    };

    let zones = ["+01:00", "-03:00", "+04:30"];
    let mut clients: Vec<_> = zones.iter().map(|_| proxy.connect(Some(&db))).collect();
    let mut statements = Vec::new();
    for (i, (c, zone)) in clients.iter_mut().zip(zones).enumerate() {
        c.query_drop(format!("SET time_zone = '{zone}'")).unwrap();
        statements.push(c.prep(format!("SELECT ? + {i}, @@time_zone")).unwrap());
    }
    let before = moved();
    for round in 0..5 {
        for (i, (c, zone)) in clients.iter_mut().zip(zones).enumerate() {
            let tz: Option<String> = c.query_first("SELECT @@time_zone").unwrap();
            assert_eq!(tz.as_deref(), Some(zone), "client {i}, round {round}");
            let prepared: Option<(i64, String)> = c.exec_first(&statements[i], (round,)).unwrap();
            assert_eq!(prepared, Some((round + i as i64, zone.to_string())));
        }
    }
    assert!(moved() >= before + 15, "moved {} times", moved() - before);

    let a = &mut clients[0];
    a.query_drop("INSERT INTO seq (v) VALUES (1)").unwrap();
    a.query_drop("SELECT 1").unwrap();
    assert_eq!(
        a.query_first::<u64, _>("SELECT LAST_INSERT_ID()").unwrap(),
        Some(1)
    );
    a.query_drop("SELECT CAST('12abc' AS SIGNED)").unwrap();
    let warnings: Vec<(String, u32, String)> = a.query("SHOW WARNINGS").unwrap();
    assert_eq!(warnings.len(), 1);
    assert_eq!(warnings[0].1, 1292);
    let mut direct = cluster().direct(1, Some(&db));
    let oracle = previous_statement_script(&mut direct);
    direct.query_drop("DELETE FROM t").unwrap();
    assert_eq!(previous_statement_script(a), oracle);
    a.query_drop(format!("USE {other_db}")).unwrap();
    for _ in 0..3 {
        let current: Option<String> = a.query_first("SELECT DATABASE()").unwrap();
        assert_eq!(current.as_deref(), Some(other_db.as_str()));
    }
    a.query_drop(format!("USE {db}")).unwrap();

    // A temporary table or a user variable binds its connection, and so its
    // client to its worker.
    let b = &mut clients[1];
    b.query_drop("CREATE TEMPORARY TABLE scratch (x INT)")
        .unwrap();
    let pinned = moved();
    for x in 0..5 {
        b.query_drop(format!("INSERT INTO scratch VALUES ({x})"))
            .unwrap();
    }
    assert_eq!(
        b.query_first::<i64, _>("SELECT SUM(x) FROM scratch")
            .unwrap(),
        Some(10)
    );
    assert_eq!(moved(), pinned, "a client with a temporary table moved");
    let c = &mut clients[2];
    c.query_drop("SET @mine = 7").unwrap();
    for _ in 0..3 {
        assert_eq!(c.query_first::<i64, _>("SELECT @mine").unwrap(), Some(7));
    }
    assert_eq!(moved(), pinned, "a client with a user variable moved");

    // KILL of a client that moved since it logged in.
    let victim = u64::from(clients[2].connection_id());
    for _ in 0..3 {
        clients[2].query_drop("SELECT 1").unwrap();
    }
    clients[0].query_drop(format!("KILL {victim}")).unwrap();
    assert!(clients[2].query_drop("SELECT 1").is_err());
    clients[1].query_drop("SELECT 1").unwrap();

    let before = moved();
    clients_at_once_get_every_answer(&proxy, &db, 6, 100);
    assert!(moved() > before + 100, "moved {} times", moved() - before);
    // Each worker's count follows its clients there and back: the two left.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let serving = || proxy.shared.balance.serving().iter().sum::<usize>();
    while serving() != 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(serving(), 2, "{:?}", proxy.shared.balance.serving());
}

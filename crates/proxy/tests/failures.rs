//! Bad input and broken backends: a clear error for the one who caused it, and
//! the proxy keeps serving everyone else.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use hscale_testkit::raw::RawClient;
use hscale_testkit::{cluster, Proxy};
use mysql::prelude::Queryable;

fn mysql_error(err: mysql::Error) -> mysql::MySqlError {
    match err {
        mysql::Error::MySqlError(e) => e,
        other => panic!("expected a server error, got {other:?}"),
    }
}

#[test]
fn garbage_closes_only_that_connection() {
    let proxy = Proxy::for_cluster();
    let mut bystander = proxy.connect(None);
    for garbage in [
        &b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..],
        &[0xff; 64],
        &[1, 0, 0, 7, 3],
    ] {
        let mut socket = std::net::TcpStream::connect(("127.0.0.1", proxy.port)).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut greeting = [0u8; 256];
        let _ = socket.read(&mut greeting).unwrap();
        socket.write_all(garbage).unwrap();
        let mut rest = Vec::new();
        let _ = socket.read_to_end(&mut rest);
    }
    assert_eq!(
        bystander.query_first::<i32, _>("SELECT 1").unwrap(),
        Some(1)
    );
    let mut fresh = proxy.connect(None);
    assert_eq!(fresh.query_first::<i32, _>("SELECT 1").unwrap(), Some(1));
}

#[tokio::test]
async fn unknown_and_hscale_answered_commands() {
    let db = cluster().database("fail_commands");
    cluster()
        .direct(1, Some(&db))
        .query_drop("CREATE TABLE t (a INT, b VARCHAR(3))")
        .unwrap();
    let proxy = tokio::task::spawn_blocking(Proxy::for_cluster)
        .await
        .unwrap();
    let mut client = RawClient::login(proxy.port, "root", "", Some(&db)).await;
    let answer = client.command(&[0x99], 1).await;
    assert_eq!(answer[0][0], 0xff);
    assert_eq!(u16::from_le_bytes([answer[0][1], answer[0][2]]), 1047);
    let stats = client.command(&[0x09], 1).await;
    assert!(String::from_utf8_lossy(&stats[0]).starts_with("Uptime: "));
    // COM_FIELD_LIST: two column definitions, then EOF.
    let fields = client.command(b"\x04t\0", 3).await;
    assert_eq!(fields[2][0], 0xfe);
    let ping = client.command(&[0x0e], 1).await;
    assert_eq!(ping[0][0], 0x00);
    // COM_STMT_EXECUTE of a statement never prepared.
    let err = client.command(&[0x17, 9, 0, 0, 0, 0, 1, 0, 0, 0], 1).await;
    assert_eq!(u16::from_le_bytes([err[0][1], err[0][2]]), 1243);
    drop(client);
    tokio::task::spawn_blocking(move || drop(proxy))
        .await
        .unwrap();
}

#[test]
fn too_many_clients_get_error_1040() {
    let mut config = cluster().config();
    config.proxy.max_connections = 2;
    let proxy = Proxy::start(config);
    let _a = proxy.connect(None);
    let _b = proxy.connect(None);
    let err = mysql_error(hscale_testkit::try_connect(proxy.port, "root", "", None).unwrap_err());
    assert_eq!(err.code, 1040);
    drop(_a);
    std::thread::sleep(Duration::from_millis(100));
    let mut c = proxy.connect(None);
    assert_eq!(c.query_first::<i32, _>("SELECT 2").unwrap(), Some(2));
}

#[test]
fn a_full_pool_makes_waiters_time_out_with_a_clear_error() {
    let mut config = cluster().config();
    config.backends[0].max_connections = 1;
    config.proxy.queue_timeout_ms = 300;
    let proxy = Proxy::start(config);
    let mut holder = proxy.connect(None);
    let mut waiter = proxy.connect(None);
    // A transaction holds its connection from its first statement on.
    holder.query_drop("BEGIN").unwrap();
    holder.query_drop("SELECT 1").unwrap();
    let started = Instant::now();
    let err = mysql_error(waiter.query_drop("SELECT 1").unwrap_err());
    assert!(started.elapsed() >= Duration::from_millis(250));
    assert_eq!(err.code, 1040);
    assert!(err.message.contains("backend 1"), "{}", err.message);
    holder.query_drop("COMMIT").unwrap();
    assert_eq!(waiter.query_first::<i32, _>("SELECT 3").unwrap(), Some(3));
}

#[test]
fn a_dead_backend_fails_only_its_statements_and_is_reconnected_after_restart() {
    let (mut server, dir) = hscale_testkit::scratch_server("dead_backend");
    let mut config = cluster().config();
    config.backends[0].address = server.address();
    config.proxy.connect_timeout_ms = 1000;
    let proxy = Proxy::start(config);
    let mut client = proxy.connect(None);
    assert_eq!(client.query_first::<i32, _>("SELECT 1").unwrap(), Some(1));
    let prepared = client.prep("SELECT ? + 1").unwrap();

    server.kill();
    let started = Instant::now();
    let err = mysql_error(client.query_drop("SELECT 1").unwrap_err());
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the error came after {:?}",
        started.elapsed()
    );
    assert!(err.message.contains("backend 1"), "{}", err.message);
    assert!(err.message.contains(&server.address()), "{}", err.message);
    // The client connection survives and so does the proxy.
    let err = mysql_error(client.query_drop("SELECT 1").unwrap_err());
    assert_eq!(err.code, 1429);

    server.restart().unwrap();
    assert_eq!(client.query_first::<i32, _>("SELECT 5").unwrap(), Some(5));
    // Prepared before the restart: prepared again on a new connection.
    let sum: Option<i64> = client.exec_first(&prepared, (4,)).unwrap();
    assert_eq!(sum, Some(5));
    let mut other = proxy.connect(None);
    assert_eq!(other.query_first::<i32, _>("SELECT 6").unwrap(), Some(6));
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_backend_dying_mid_result_closes_only_that_client() {
    let db = cluster().database("fail_mid_result");
    let proxy = Proxy::for_cluster();
    let mut victim = proxy.connect(Some(&db));
    let victim_id: u64 = victim
        .query_first("SELECT CONNECTION_ID()")
        .unwrap()
        .unwrap();
    assert_eq!(victim_id, u64::from(victim.connection_id()));
    victim.query_drop("SET @hold = 1").unwrap(); // keeps the same backend connection
                                                 // The backend thread's own id; CONNECTION_ID() answers hscale's.
    let backend_id: u64 = victim
        .query_first("SELECT @@pseudo_thread_id")
        .unwrap()
        .unwrap();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        cluster()
            .direct(1, None)
            .query_drop(format!("KILL {backend_id}"))
            .unwrap();
    });
    let result = victim
        .query_iter("SELECT seq, SLEEP(0.01) FROM seq_1_to_1000")
        .and_then(|mut r| {
            let mut n = 0;
            while let Some(set) = r.iter() {
                for row in set {
                    row?;
                    n += 1;
                }
            }
            Ok(n)
        });
    killer.join().unwrap();
    assert!(result.is_err(), "the killed query cannot succeed");
    let mut bystander = proxy.connect(Some(&db));
    assert_eq!(
        bystander.query_first::<i32, _>("SELECT 8").unwrap(),
        Some(8)
    );
}

/// Two workers: the killer and its victim are served by different ones
/// (a new client goes to the worker serving the fewest).
#[test]
fn kill_query_names_the_connection_id_the_client_was_given() {
    let mut config = cluster().config();
    config.proxy.threads = 2;
    let proxy = Proxy::start(config);
    let mut victim = proxy.connect(None);
    let victim_id = victim.connection_id();
    let sleeper = std::thread::spawn(move || {
        let started = Instant::now();
        let result = victim.query_first::<i64, _>("SELECT SLEEP(20)");
        (victim, started.elapsed(), result)
    });
    std::thread::sleep(Duration::from_millis(500));
    let mut killer = proxy.connect(None);
    killer
        .query_drop(format!("KILL QUERY {victim_id}"))
        .unwrap();
    let (mut victim, elapsed, result) = sleeper.join().unwrap();
    assert!(
        elapsed < Duration::from_secs(10),
        "the query ran {elapsed:?}"
    );
    // MariaDB answers an interrupted SLEEP with 1 (or error 1317).
    assert!(
        matches!(&result, Ok(Some(1)))
            || matches!(&result, Err(mysql::Error::MySqlError(e)) if e.code == 1317),
        "{result:?}"
    );
    assert_eq!(
        victim.query_first::<i32, _>("SELECT 4").unwrap(),
        Some(4),
        "only the query was killed"
    );
}

#[test]
fn kill_connection_ends_that_client_and_checks_ids_and_owners() {
    let mut config = cluster().config();
    config.users.push(hscale::config::UserConfig {
        name: "guest".into(),
        password: "guest".into(),
        admin: false,
        // Runs as hscale's own backend account: no account of its own exists.
        backend_user: Some("root".into()),
        backend_password: Some(String::new()),
        ..Default::default()
    });
    let proxy = Proxy::start(config);
    let mut victim = proxy.connect(None);
    victim.query_drop("BEGIN").unwrap();
    let victim_id = victim.connection_id();
    let mut guest = hscale_testkit::connect(proxy.port, "guest", "guest", None);
    let denied = mysql_error(guest.query_drop(format!("KILL {victim_id}")).unwrap_err());
    assert_eq!(denied.code, 1095);
    let unknown = mysql_error(guest.query_drop("KILL 4000000").unwrap_err());
    assert_eq!(unknown.code, 1094);
    let mut admin = proxy.connect(None);
    admin
        .query_drop(format!("KILL CONNECTION {victim_id}"))
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        victim.query_drop("SELECT 1").is_err(),
        "the killed client's connection is gone"
    );
    assert_eq!(admin.query_first::<i32, _>("SELECT 9").unwrap(), Some(9));
    let unsupported = mysql_error(admin.query_drop("KILL USER guest").unwrap_err());
    assert_eq!(unsupported.code, 1235);
}

/// A connection killed by another closes at once, idle or in the middle of a
/// statement, without a word, as MariaDB closes it: pools see the close and
/// open another (before, a busy one got an error of hscale's own first, and
/// mysql_async's pool test of killed connections failed through hscale).
#[tokio::test]
async fn a_killed_connection_closes_at_once_as_mariadb_closes_it() {
    let proxy = tokio::task::spawn_blocking(Proxy::for_cluster)
        .await
        .unwrap();
    let mut answers = Vec::new();
    for port in [cluster().port(1), proxy.port] {
        let mut killer = RawClient::login(port, "root", "", None).await;
        for statement in [None, Some("SELECT SLEEP(20)")] {
            let mut victim = RawClient::login(port, "root", "", None).await;
            if let Some(sql) = statement {
                let command = [&[0x03][..], sql.as_bytes()].concat();
                victim.stream.send_packet(0, &command).await.unwrap();
                // The statement has reached the server once it is listed.
                let running = format!(
                    "SELECT COUNT(*) FROM information_schema.processlist WHERE info = '{sql}'"
                );
                let direct = cluster().port(1);
                let mut watcher = RawClient::login(direct, "root", "", None).await;
                let deadline = Instant::now() + Duration::from_secs(10);
                while !String::from_utf8_lossy(&watcher.query_bytes(&running, false).await)
                    .contains("\u{1}1")
                {
                    assert!(Instant::now() < deadline, "the statement never ran");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            let killed = killer
                .query_bytes(&format!("KILL {}", victim.connection_id), false)
                .await;
            assert_eq!(killed[4], 0, "KILL answers OK: {killed:?}");
            let started = Instant::now();
            let said = victim.read_to_close().await;
            assert!(started.elapsed() < Duration::from_secs(5));
            answers.push((statement, said));
        }
    }
    assert_eq!(answers[..2], answers[2..], "hscale closes as MariaDB does");
    assert!(
        answers.iter().all(|(_, said)| said.is_empty()),
        "{answers:?}"
    );
}

/// A client that kills itself, by CONNECTION_ID() or by its id, gets what
/// MariaDB answers: KILL QUERY interrupts the KILL itself (1317) and the
/// connection lives on; KILL CONNECTION ends it (1927), an open transaction
/// with it.
#[test]
fn a_client_killing_itself_gets_what_mariadb_answers() {
    let db = cluster().database("failures_kill_self");
    cluster()
        .direct(1, Some(&db))
        .query_drop("CREATE TABLE t (id INT PRIMARY KEY)")
        .unwrap();
    let proxy = Proxy::start(cluster().config());
    let by_call = |_: &mysql::Conn| "CONNECTION_ID()".to_string();
    let by_id = |conn: &mysql::Conn| conn.connection_id().to_string();
    for target in [&by_call as &dyn Fn(&mysql::Conn) -> String, &by_id] {
        let mut answers = Vec::new();
        for mut conn in [cluster().direct(1, Some(&db)), proxy.connect(Some(&db))] {
            let query = mysql_error(
                conn.query_drop(format!("KILL QUERY {}", target(&conn)))
                    .unwrap_err(),
            );
            let alive: Option<i32> = conn.query_first("SELECT 7").unwrap();
            conn.query_drop("BEGIN").unwrap();
            conn.query_drop("INSERT INTO t VALUES (1)").unwrap();
            let connection = mysql_error(
                conn.query_drop(format!("KILL {}", target(&conn)))
                    .unwrap_err(),
            );
            let gone = conn.query_drop("SELECT 1").is_err();
            answers.push((
                query.code,
                query.state,
                alive,
                connection.code,
                connection.state,
                gone,
            ));
        }
        assert_eq!(
            answers[0],
            (1317, "70100".into(), Some(7), 1927, "70100".into(), true)
        );
        assert_eq!(answers[1], answers[0], "through hscale as direct");
        let rows: Vec<i32> = cluster()
            .direct(1, Some(&db))
            .query("SELECT id FROM t")
            .unwrap();
        assert!(rows.is_empty(), "the killed transaction was rolled back");
    }
}

/// A backend connection lost after the statement went out: the server may
/// have run it, in part or whole. hscale must not send it again on another
/// connection (a write would run twice); the client gets the lost connection.
#[test]
fn a_statement_whose_connection_dies_mid_run_is_not_sent_again() {
    let db = cluster().database("at_most_once");
    let mut direct = cluster().direct(1, Some(&db));
    direct
        .query_drop("CREATE TABLE m (v INT NOT NULL) ENGINE=MyISAM")
        .unwrap();
    let proxy = Proxy::for_cluster();
    let mut client = proxy.connect(Some(&db));
    // Warm: the session takes back the connection it used last.
    assert_eq!(client.query_first::<i32, _>("SELECT 1").unwrap(), Some(1));
    // The third row waits on a user lock the killer holds: the kill lands
    // after two rows are written, whatever the machine's speed. The killer
    // holds the lock until the killed thread is gone, so no later row gets it.
    let lock = format!("{db}.third_row");
    let (locked_tx, locked) = std::sync::mpsc::channel();
    let killer = std::thread::spawn({
        let (db, lock) = (db.clone(), lock.clone());
        move || {
            let mut dba = cluster().direct(1, None);
            let held: Option<i64> = dba
                .query_first(format!("SELECT GET_LOCK('{lock}', 10)"))
                .unwrap();
            assert_eq!(held, Some(1));
            locked_tx.send(()).unwrap();
            let find = format!(
                "SELECT id FROM information_schema.processlist \
                 WHERE db = '{db}' AND info LIKE 'INSERT INTO m %' AND state = 'User lock'"
            );
            let started = Instant::now();
            let thread = loop {
                if let Some(id) = dba.query_first::<u64, _>(&find).unwrap() {
                    break id;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "the INSERT never waited for the third row"
                );
                std::thread::sleep(Duration::from_millis(20));
            };
            dba.query_drop(format!("KILL {thread}")).unwrap();
            (dba, thread)
        }
    });
    locked.recv().unwrap();
    let started = Instant::now();
    let result = client.query_drop(format!(
        "INSERT INTO m SELECT seq FROM seq_1_to_10 WHERE seq < 3 OR GET_LOCK('{lock}', 10)"
    ));
    let (mut dba, killed) = killer.join().unwrap();
    let err = mysql_error(result.unwrap_err());
    assert_eq!(err.code, 2013, "{}", err.message);
    assert!(err.message.contains("backend 1"), "{}", err.message);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the answer came after {:?}: the statement ran again",
        started.elapsed()
    );
    // The socket closes at the KILL; the thread ends its statement after. A
    // count before that would see the table as it was (concurrent insert).
    let gone = format!("SELECT COUNT(*) FROM information_schema.processlist WHERE id = {killed}");
    while dba.query_first::<u64, _>(&gone).unwrap() != Some(0) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the killed thread never ended"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (rows, distinct): (u64, u64) = direct
        .query_first("SELECT COUNT(*), COUNT(DISTINCT v) FROM m")
        .unwrap()
        .unwrap();
    assert_eq!(rows, distinct, "a row was written twice");
    assert_eq!(rows, 2, "the two rows before the kill, once each");
    // The client goes on, on another connection.
    assert_eq!(
        client
            .query_first::<u64, _>("SELECT COUNT(*) FROM m")
            .unwrap(),
        Some(rows)
    );
}

/// Opens `n` TCP connections to hscale and reads each greeting (or the 1040
/// that replaces it); they send nothing more.
fn silent_clients(port: u16, n: usize) -> Vec<std::net::TcpStream> {
    (0..n)
        .map(|_| {
            let mut socket = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            socket
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            let mut header = [0u8; 4];
            socket.read_exact(&mut header).unwrap();
            let len = u32::from_le_bytes([header[0], header[1], header[2], 0]) as usize;
            socket.read_exact(&mut vec![0u8; len]).unwrap();
            socket
        })
        .collect()
}

/// What a socket says next: true if hscale closed it (after an error packet
/// or none).
fn closed_by_peer(socket: &mut std::net::TcpStream) -> bool {
    let mut rest = Vec::new();
    match socket.read_to_end(&mut rest) {
        Ok(_) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

#[test]
fn clients_that_never_log_in_are_closed_after_login_timeout_ms() {
    let mut config = cluster().config();
    config.proxy.max_connections = 1000;
    config.proxy.login_timeout_ms = 1000;
    let proxy = Proxy::start(config);
    let started = Instant::now();
    let mut silent = silent_clients(proxy.port, 1100);
    let err = mysql_error(hscale_testkit::try_connect(proxy.port, "root", "", None).unwrap_err());
    assert_eq!(err.code, 1040, "every slot is held by a silent client");
    for socket in &mut silent {
        assert!(closed_by_peer(socket));
    }
    let closed_after = started.elapsed();
    assert!(
        closed_after < Duration::from_secs(5),
        "the silent clients were closed after {closed_after:?}"
    );
    std::thread::sleep(Duration::from_millis(100));
    let mut client = proxy.connect(None);
    assert_eq!(client.query_first::<i32, _>("SELECT 1").unwrap(), Some(1));
}

fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

#[test]
fn a_login_packet_announcing_16_mib_reserves_no_memory_for_it() {
    let proxy = Proxy::for_cluster();
    let before = resident_bytes();
    let mut clients = silent_clients(proxy.port, 1000);
    for socket in &mut clients {
        // A frame of 16 MiB - 1 bytes announced, 100 of them sent.
        let mut frame = vec![0xff, 0xff, 0xff, 1];
        frame.extend_from_slice(&[b'x'; 100]);
        socket.write_all(&frame).unwrap();
    }
    std::thread::sleep(Duration::from_millis(500));
    let grown = resident_bytes().saturating_sub(before);
    assert!(grown < 200 << 20, "RSS grew by {} MiB", grown >> 20);
    // Each was told why, as MariaDB tells a client over max_allowed_packet.
    let mut answer = Vec::new();
    clients[0].read_to_end(&mut answer).unwrap();
    assert_eq!(
        u16::from_le_bytes([answer[5], answer[6]]),
        1153,
        "{answer:?}"
    );
    let mut client = proxy.connect(None);
    assert_eq!(client.query_first::<i32, _>("SELECT 1").unwrap(), Some(1));
}

#[test]
fn a_command_over_max_allowed_packet_gets_1153_and_the_connection_ends() {
    let mut direct = cluster().direct(1, None);
    let limit: usize = direct
        .query_first("SELECT @@global.max_allowed_packet")
        .unwrap()
        .unwrap();
    direct
        .query_drop("SET GLOBAL max_allowed_packet = 1048576")
        .unwrap();
    let proxy = Proxy::for_cluster();
    direct
        .query_drop(format!("SET GLOBAL max_allowed_packet = {limit}"))
        .unwrap();
    let mut client = proxy.connect(None);
    let fits = format!("SELECT LENGTH('{}')", "x".repeat(1000 << 10));
    assert_eq!(
        client.query_first::<u64, _>(&fits).unwrap(),
        Some(1000 << 10)
    );
    let over = format!("SELECT LENGTH('{}')", "x".repeat(1100 << 10));
    let err = mysql_error(client.query_drop(&over).unwrap_err());
    assert_eq!(err.code, 1153, "{}", err.message);
    assert!(
        client.query_drop("SELECT 1").is_err(),
        "the connection ended"
    );
    let mut other = proxy.connect(None);
    assert_eq!(other.query_first::<i32, _>("SELECT 2").unwrap(), Some(2));
}

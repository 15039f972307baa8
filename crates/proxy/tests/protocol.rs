//! A real driver (the `mysql` crate, text and binary protocol) through hscale,
//! compared with the same statements sent straight to MariaDB.

use hscale_testkit::{cluster, Proxy};
use mysql::prelude::Queryable;
use mysql::{Row, Value};

fn setup(db: &str) -> (Proxy, String) {
    let db = cluster().database(db);
    let mut direct = cluster().direct(1, Some(&db));
    direct
        .query_drop(
            "CREATE TABLE items (id INT PRIMARY KEY AUTO_INCREMENT, name VARCHAR(40), price DECIMAL(10,2),
             added DATE, data BLOB, ratio DOUBLE, note TEXT NULL)",
        )
        .unwrap();
    direct
        .query_drop(
            "INSERT INTO items (name, price, added, data, ratio, note) VALUES
             ('apple', 1.25, '2008-05-06', x'00ff10', 0.5, NULL),
             ('pear', 2.50, '2009-01-01', '', -1e300, 'ripe'),
             ('plum', 0.00, '1999-12-31', NULL, 3.14159, '')",
        )
        .unwrap();
    (Proxy::for_cluster(), db)
}

#[test]
fn text_protocol_results_match_direct_results() {
    let (proxy, db) = setup("protocol_text");
    let sql = "SELECT id, name, price, added, data, ratio, note FROM items ORDER BY id";
    let direct: Vec<Row> = cluster().direct(1, Some(&db)).query(sql).unwrap();
    let proxied: Vec<Row> = proxy.connect(Some(&db)).query(sql).unwrap();
    assert_eq!(direct.len(), 3);
    assert_eq!(format!("{direct:?}"), format!("{proxied:?}"));
}

#[test]
fn binary_protocol_results_match_direct_results() {
    let (proxy, db) = setup("protocol_binary");
    let sql = "SELECT id, name, price, added, data, ratio, note FROM items WHERE id >= ? AND name <> ? ORDER BY id";
    let params = (2, "x");
    let direct: Vec<Row> = cluster().direct(1, Some(&db)).exec(sql, params).unwrap();
    let mut conn = proxy.connect(Some(&db));
    let proxied: Vec<Row> = conn.exec(sql, params).unwrap();
    assert_eq!(direct.len(), 2);
    assert_eq!(format!("{direct:?}"), format!("{proxied:?}"));
    // The statement stays usable, and closing it works.
    let stmt = conn.prep("SELECT name FROM items WHERE id = ?").unwrap();
    let name: Option<String> = conn.exec_first(&stmt, (3,)).unwrap();
    assert_eq!(name.as_deref(), Some("plum"));
    conn.close(stmt).unwrap();
}

#[test]
fn multiple_statements_return_every_result_set() {
    let (proxy, db) = setup("protocol_multi");
    let mut conn = proxy.connect(Some(&db));
    let mut result = conn.query_iter("SELECT 1; SELECT name FROM items WHERE id = 2; UPDATE items SET note = 'x' WHERE id = 3").unwrap();
    let mut sets = Vec::new();
    while let Some(set) = result.iter() {
        let rows: Vec<Row> = set.map(|r| r.unwrap()).collect();
        sets.push(rows.len());
    }
    assert_eq!(sets, [1, 1, 0]);
    drop(result);
    assert_eq!(conn.affected_rows(), 1);
}

#[test]
fn backend_errors_keep_their_code_sqlstate_and_message() {
    let (proxy, db) = setup("protocol_errors");
    for sql in [
        "SELECT * FROM no_such_table",
        "SELEC 1",
        "INSERT INTO items (id) VALUES (1)",
    ] {
        let direct = cluster().direct(1, Some(&db)).query_drop(sql).unwrap_err();
        let proxied = proxy.connect(Some(&db)).query_drop(sql).unwrap_err();
        match (direct, proxied) {
            (mysql::Error::MySqlError(d), mysql::Error::MySqlError(p)) => {
                assert_eq!(
                    (d.code, &d.state, &d.message),
                    (p.code, &p.state, &p.message)
                );
            }
            other => panic!("{other:?}"),
        }
    }
    // The connection goes on after an error.
    let mut conn = proxy.connect(Some(&db));
    assert!(conn.query_drop("SELECT * FROM no_such_table").is_err());
    let one: Option<i32> = conn.query_first("SELECT 1").unwrap();
    assert_eq!(one, Some(1));
}

#[test]
fn packets_of_16_mib_and_more_travel_both_ways() {
    // Over the backend's unix socket (the default) and over TCP: a 20 MiB
    // statement fills either socket, so hscale must wait for write space.
    let db = cluster().database("protocol_large");
    for proxy in [
        Proxy::for_cluster(),
        Proxy::start(cluster().config_over_tcp()),
    ] {
        large_packets_round_trip(&proxy, &db);
    }
}

fn large_packets_round_trip(proxy: &Proxy, db: &str) {
    let mut conn = proxy.connect(Some(db));
    conn.query_drop("DROP TABLE IF EXISTS big").unwrap();
    conn.query_drop("CREATE TABLE big (id INT PRIMARY KEY, body LONGBLOB)")
        .unwrap();
    let body: Vec<u8> = (0..20 * 1024 * 1024 + 7).map(|i| (i % 251) as u8).collect();
    conn.exec_drop("INSERT INTO big VALUES (1, ?)", (body.clone(),))
        .unwrap();
    let text: Option<Vec<u8>> = conn
        .query_first("SELECT body FROM big WHERE id = 1")
        .unwrap();
    assert_eq!(text.as_deref(), Some(&body[..]));
    let binary: Option<Vec<u8>> = conn
        .exec_first("SELECT body FROM big WHERE id = ?", (1,))
        .unwrap();
    assert_eq!(binary.as_deref(), Some(&body[..]));
    let exact: Vec<u8> = vec![b'z'; 0xff_ffff - 40];
    conn.exec_drop("INSERT INTO big VALUES (2, ?)", (exact.clone(),))
        .unwrap();
    let len: Option<u64> = conn
        .query_first("SELECT LENGTH(body) FROM big WHERE id = 2")
        .unwrap();
    assert_eq!(len, Some(exact.len() as u64));
}

#[test]
fn init_db_ping_reset_and_change_user_work() {
    let (proxy, db) = setup("protocol_commands");
    let mut conn = proxy.connect(None);
    let none: Option<Option<String>> = conn.query_first("SELECT DATABASE()").unwrap();
    assert_eq!(none, Some(None));
    conn.select_db(&db).unwrap();
    let current: Option<String> = conn.query_first("SELECT DATABASE()").unwrap();
    assert_eq!(current.as_deref(), Some(db.as_str()));
    conn.ping().unwrap();
    conn.query_drop("SET @v = 5").unwrap();
    conn.reset().unwrap();
    let v: Option<Option<i64>> = conn.query_first("SELECT @v").unwrap();
    assert_eq!(v, Some(None), "COM_RESET_CONNECTION clears user variables");
    conn.change_user(mysql::ChangeUserOpts::default().with_db_name(Some(db.clone())))
        .unwrap();
    let count: Option<i64> = conn.query_first("SELECT COUNT(*) FROM items").unwrap();
    assert_eq!(count, Some(3));
    assert!(
        matches!(conn.select_db("no_such_db_here"), Err(mysql::Error::MySqlError(e)) if e.code == 1049)
    );
}

#[test]
fn unknown_database_at_login_is_refused_like_mysql() {
    let proxy = Proxy::for_cluster();
    let err =
        hscale_testkit::try_connect(proxy.port, "root", "", Some("no_such_db_at_all")).unwrap_err();
    assert!(
        matches!(err, mysql::Error::MySqlError(e) if e.code == 1049),
        "unexpected error"
    );
}

#[test]
fn wrong_password_and_unknown_user_are_denied() {
    let mut config = cluster().config();
    config.users[0].password = "secret".into();
    // The backends' root has no password.
    config.users[0].backend_password = Some(String::new());
    let proxy = Proxy::start(config);
    for (user, password) in [("root", "wrong"), ("nobody", "secret"), ("root", "")] {
        let err = hscale_testkit::try_connect(proxy.port, user, password, None).unwrap_err();
        assert!(
            matches!(&err, mysql::Error::MySqlError(e) if e.code == 1045),
            "{user}/{password}: {err:?}"
        );
    }
    let mut conn = hscale_testkit::connect(proxy.port, "root", "secret", None);
    assert_eq!(conn.query_first::<i32, _>("SELECT 7").unwrap(), Some(7));
}

#[test]
fn load_data_local_infile_streams_the_file() {
    let (proxy, db) = setup("protocol_infile");
    let mut conn = proxy.connect(Some(&db));
    conn.query_drop("CREATE TABLE loaded (a INT, b VARCHAR(20))")
        .unwrap();
    let rows = 50_000;
    conn.set_local_infile_handler(Some(mysql::LocalInfileHandler::new(move |_, stream| {
        use std::io::Write;
        for i in 0..rows {
            writeln!(stream, "{i}\trow{i}")?;
        }
        Ok(())
    })));
    conn.query_drop("LOAD DATA LOCAL INFILE 'rows.tsv' INTO TABLE loaded")
        .unwrap();
    let count: Option<i64> = conn.query_first("SELECT COUNT(*) FROM loaded").unwrap();
    assert_eq!(count, Some(rows));
    let value: Option<Value> = conn
        .query_first("SELECT b FROM loaded WHERE a = 49999")
        .unwrap();
    assert_eq!(value, Some(Value::Bytes(b"row49999".to_vec())));
}

#[tokio::test]
async fn answers_are_byte_identical_to_direct_with_deprecate_eof_on_and_off() {
    use hscale_testkit::raw::RawClient;
    use hscale_wire::CapabilityFlags;
    let (proxy, db) = tokio::task::spawn_blocking(|| setup("protocol_deprecate_eof"))
        .await
        .unwrap();
    let sql = "SELECT id, name, price, added, data, ratio, note FROM items ORDER BY id; \
               SELECT COUNT(*) FROM items; UPDATE items SET note = note WHERE id = 1; SELECT 1 FROM items WHERE 0";
    let multi = CapabilityFlags::CLIENT_MULTI_STATEMENTS | CapabilityFlags::CLIENT_MULTI_RESULTS;
    for deprecate_eof in [false, true] {
        let extra = if deprecate_eof {
            multi | CapabilityFlags::CLIENT_DEPRECATE_EOF
        } else {
            multi
        };
        let mut direct =
            RawClient::login_with(cluster().port(1), "root", "", Some(&db), extra).await;
        let mut proxied = RawClient::login_with(proxy.port, "root", "", Some(&db), extra).await;
        let expected = direct.query_bytes(sql, deprecate_eof).await;
        let got = proxied.query_bytes(sql, deprecate_eof).await;
        assert!(
            expected.len() > 200,
            "a real answer: {} bytes",
            expected.len()
        );
        assert_eq!(got, expected, "deprecate_eof = {deprecate_eof}");
        let field_list = b"\x04items\0";
        let expect = hscale_wire::scan::Expect::Rows;
        let expected = direct
            .command_bytes(field_list, expect, deprecate_eof)
            .await;
        let got = proxied
            .command_bytes(field_list, expect, deprecate_eof)
            .await;
        assert!(
            expected.len() > 100,
            "COM_FIELD_LIST: {} bytes",
            expected.len()
        );
        assert_eq!(
            got, expected,
            "COM_FIELD_LIST, deprecate_eof = {deprecate_eof}"
        );
    }
    tokio::task::spawn_blocking(move || drop(proxy))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_read_only_cursor_fetches_rows_in_batches() {
    use hscale_testkit::raw::RawClient;
    let db = cluster().database("protocol_cursor");
    let proxy = tokio::task::spawn_blocking(Proxy::for_cluster)
        .await
        .unwrap();
    let mut client = RawClient::login(proxy.port, "root", "", Some(&db)).await;
    let mut prepare = vec![0x16];
    prepare.extend_from_slice(b"SELECT seq FROM seq_1_to_10");
    // OK, one column definition, EOF.
    let prepared = client.command(&prepare, 3).await;
    assert_eq!(
        prepared[0][0],
        0x00,
        "{:?}",
        String::from_utf8_lossy(&prepared[0])
    );
    let stmt = [
        prepared[0][1],
        prepared[0][2],
        prepared[0][3],
        prepared[0][4],
    ];
    let mut execute = vec![0x17];
    execute.extend_from_slice(&stmt);
    execute.extend_from_slice(&[0x01, 1, 0, 0, 0]); // CURSOR_TYPE_READ_ONLY, one iteration
                                                    // Column count, definition, EOF with SERVER_STATUS_CURSOR_EXISTS: no rows yet.
    let opened = client.command(&execute, 3).await;
    let status = u16::from_le_bytes([opened[2][3], opened[2][4]]);
    assert_ne!(status & 0x0040, 0, "cursor exists");
    let mut seen = Vec::new();
    for batch in [4usize, 4, 2] {
        let mut fetch = vec![0x1c];
        fetch.extend_from_slice(&stmt);
        fetch.extend_from_slice(&4u32.to_le_bytes());
        let rows = client.command(&fetch, batch + 1).await;
        for row in &rows[..batch] {
            // Binary row: header 0, null bitmap, then a BIGINT UNSIGNED.
            seen.push(u64::from_le_bytes(row[2..10].try_into().unwrap()));
        }
        assert_eq!(rows[batch][0], 0xfe, "EOF after the batch");
    }
    assert_eq!(seen, (1..=10).collect::<Vec<u64>>());
    drop(client);
    tokio::task::spawn_blocking(move || drop(proxy))
        .await
        .unwrap();
}

#[tokio::test]
async fn clients_asking_for_another_auth_plugin_are_switched_to_native_password() {
    use hscale_wire::auth::native_scramble;
    use hscale_wire::packets::{parse_auth_switch, BackendHello};
    use hscale_wire::stream::PacketStream;
    use hscale_wire::CapabilityFlags;
    let mut config = cluster().config();
    config.users[0].password = "pw".into();
    let proxy = tokio::task::spawn_blocking(move || Proxy::start(config))
        .await
        .unwrap();
    let socket = tokio::net::TcpStream::connect(("127.0.0.1", proxy.port))
        .await
        .unwrap();
    let mut stream = PacketStream::new(socket, 1 << 20);
    stream.read_packet().await.unwrap().unwrap();
    let mut hello = Vec::new();
    BackendHello {
        capabilities: CapabilityFlags::CLIENT_PROTOCOL_41
            | CapabilityFlags::CLIENT_SECURE_CONNECTION
            | CapabilityFlags::CLIENT_PLUGIN_AUTH,
        collation: 45,
        user: "root",
        auth_response: &[7; 32],
        database: None,
        auth_plugin: "caching_sha2_password",
    }
    .write(&mut hello);
    stream.send_packet(1, &hello).await.unwrap();
    let switch = stream.read_packet().await.unwrap().unwrap();
    let (plugin, nonce) = parse_auth_switch(&switch.payload).expect("an auth switch request");
    assert_eq!(plugin, "mysql_native_password");
    stream
        .send_packet(switch.seq + 1, &native_scramble(&nonce, "pw"))
        .await
        .unwrap();
    let ok = stream.read_packet().await.unwrap().unwrap();
    assert_eq!(
        ok.payload[0],
        0x00,
        "{:?}",
        String::from_utf8_lossy(&ok.payload)
    );
    assert_eq!(ok.seq, 4);
    drop(stream);
    tokio::task::spawn_blocking(move || drop(proxy))
        .await
        .unwrap();
}

#[tokio::test]
async fn long_data_statement_reset_and_set_option_pass_through() {
    use hscale_testkit::raw::RawClient;
    let db = cluster().database("protocol_long_data");
    let proxy = tokio::task::spawn_blocking(Proxy::for_cluster)
        .await
        .unwrap();
    let mut client = RawClient::login(proxy.port, "root", "", Some(&db)).await;
    let mut prepare = vec![0x16];
    prepare.extend_from_slice(b"SELECT CONCAT(?, '!')");
    // OK, one parameter definition + EOF, one column definition + EOF.
    let prepared = client.command(&prepare, 5).await;
    assert_eq!(prepared[0][0], 0x00);
    let stmt = [
        prepared[0][1],
        prepared[0][2],
        prepared[0][3],
        prepared[0][4],
    ];
    for chunk in [&b"long "[..], b"data"] {
        let mut long_data = vec![0x18];
        long_data.extend_from_slice(&stmt);
        long_data.extend_from_slice(&0u16.to_le_bytes());
        long_data.extend_from_slice(chunk);
        client.command(&long_data, 0).await;
    }
    let mut execute = vec![0x17];
    execute.extend_from_slice(&stmt);
    // No cursor, one iteration, null bitmap, new-params-bound, type VAR_STRING; no value (sent as long data).
    execute.extend_from_slice(&[0x00, 1, 0, 0, 0, 0x00, 0x01, 0xfd, 0x00]);
    let result = client.command(&execute, 5).await;
    let row = &result[3];
    assert_eq!(&row[2..], b"\x0along data!", "{row:?}");
    let mut reset = vec![0x1a];
    reset.extend_from_slice(&stmt);
    assert_eq!(client.command(&reset, 1).await[0][0], 0x00);
    // COM_SET_OPTION(MULTI_STATEMENTS_OFF) answers with EOF in the classic protocol.
    assert_eq!(client.command(&[0x1b, 1, 0], 1).await[0][0], 0xfe);
    let mut close = vec![0x19];
    close.extend_from_slice(&stmt);
    client.command(&close, 0).await;
    assert_eq!(client.command(&[0x0e], 1).await[0][0], 0x00);
    drop(client);
    tokio::task::spawn_blocking(move || drop(proxy))
        .await
        .unwrap();
}

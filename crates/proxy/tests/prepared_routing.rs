//! Prepared statements on a partitioned table, through the Rust driver's
//! binary protocol: routed by their parameters, checked against an oracle
//! (the same statements on one plain table of one server).

use hscale::config::Transactions;
use hscale_testkit::raw::{payloads, RawClient};
use hscale_testkit::{cluster, Proxy};
use mysql::prelude::Queryable;
use mysql::{Conn, Row, Value};

const TABLE: &str =
    "(id INT UNSIGNED PRIMARY KEY, nickname VARCHAR(64) NOT NULL, created DATE, score DOUBLE)";

/// `users` partitioned by MOD(2) of id (odd ids in `users_odd` on backend
/// 2, even ones in `users_default` on backend 1) and `oracle`, a plain table
/// of the same columns, through one proxy.
fn setup(name: &str) -> (Proxy, String) {
    let db = cluster().database(name);
    let mut direct = cluster().direct(1, Some(&db));
    direct
        .query_drop(format!("CREATE TABLE users {TABLE}"))
        .unwrap();
    direct
        .query_drop(format!("CREATE TABLE oracle {TABLE}"))
        .unwrap();
    let mut config = cluster().config();
    config.proxy.transactions = Transactions::Multi;
    let proxy = Proxy::start(config);
    let mut c = proxy.connect(Some(&db));
    c.query_drop("HSCALE SETUP_TABLE('users', 'id', 'users_default', 1, 'MOD(2)')")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('users', 'odd', 1, 2)")
        .unwrap();
    (proxy, db)
}

/// Runs the same prepared statement on `users` and on `oracle`; their rows
/// (sorted) and affected rows must be the same.
fn both(c: &mut Conn, sql: &str, params: Vec<Value>) -> Vec<Row> {
    let mut answers = Vec::new();
    let mut answers_columns = Vec::new();
    for table in ["users", "oracle"] {
        let stmt = c.prep(sql.replace("users", table)).unwrap();
        let columns: Vec<(String, mysql::consts::ColumnType)> = stmt
            .columns()
            .iter()
            .map(|col| (col.name_str().into_owned(), col.column_type()))
            .collect();
        answers_columns.push(columns);
        let mut rows: Vec<Row> = c.exec(&stmt, params.clone()).unwrap();
        rows.sort_by_key(|r| format!("{:?}", r.clone().unwrap()));
        answers.push((rows, c.affected_rows()));
    }
    let (oracle, oracle_affected) = answers.pop().unwrap();
    let (users, users_affected) = answers.pop().unwrap();
    let values =
        |rows: &[Row]| -> Vec<Vec<Value>> { rows.iter().map(|r| r.clone().unwrap()).collect() };
    assert_eq!(values(&users), values(&oracle), "{sql} {params:?}");
    assert_eq!(users_affected, oracle_affected, "{sql} {params:?}");
    assert_eq!(answers_columns[0], answers_columns[1], "{sql}");
    users
}

/// Ids in a physical table, straight from its backend.
fn ids(backend: usize, db: &str, table: &str) -> Vec<u32> {
    cluster()
        .direct(backend, Some(db))
        .query(format!("SELECT id FROM {table} ORDER BY id"))
        .unwrap()
}

#[test]
fn prepared_statements_route_by_their_parameters_and_agree_with_one_table() {
    let (proxy, db) = setup("prepared_routing_oracle");
    let mut c = proxy.connect(Some(&db));
    let insert = "INSERT INTO users (id, nickname, created, score) VALUES (?, ?, ?, ?)";
    for id in 1..=40u32 {
        let created = Value::Date(2020, 1 + (id % 12) as u8, 1 + (id % 28) as u8, 0, 0, 0, 0);
        let score = match id % 5 {
            0 => Value::NULL,
            _ => Value::Double(f64::from(id) / 4.0),
        };
        both(
            c_ref(&mut c),
            insert,
            vec![id.into(), format!("user{id}").into(), created, score],
        );
    }
    // Rows of one INSERT go to each their partition, with their parameters.
    both(
        &mut c,
        "INSERT INTO users (id, nickname, created, score) VALUES (?, ?, NULL, 1), (?, 'fixed', ?, ?), (?, ?, NULL, NULL)",
        vec![41.into(), "a".into(), 42.into(), Value::Date(2021, 2, 3, 0, 0, 0, 0), Value::NULL, 43.into(), "c".into()],
    );
    assert_eq!(ids(2, &db, "users_odd").len(), 22);
    assert!(ids(2, &db, "users_odd").iter().all(|id| id % 2 == 1));
    assert!(ids(1, &db, "users_default").iter().all(|id| id % 2 == 0));

    let point = "SELECT id, nickname, created, score FROM users WHERE id = ?";
    for id in [1u32, 2, 17, 40, 43, 99] {
        let rows = both(&mut c, point, vec![id.into()]);
        assert_eq!(rows.len(), usize::from(id <= 43), "id {id}");
    }
    // A string parameter for the integer column routes as MariaDB compares it.
    both(&mut c, point, vec!["7".into()]);
    both(&mut c, point, vec![Value::Int(-3)]);
    both(&mut c, point, vec![Value::NULL]);
    let listed = both(
        &mut c,
        "SELECT id, nickname FROM users WHERE id IN (?, ?, ?) AND nickname <> ?",
        vec![3.into(), 4.into(), 5.into(), "user4".into()],
    );
    assert_eq!(listed.len(), 2);
    both(
        &mut c,
        "SELECT id, score FROM users WHERE score > ?",
        vec![Value::Double(5.0)],
    );
    both(
        &mut c,
        "UPDATE users SET nickname = ? WHERE id = ?",
        vec!["renamed".into(), 9.into()],
    );
    both(
        &mut c,
        "UPDATE users SET score = score + ? WHERE id IN (?, ?)",
        vec![1.into(), 10.into(), 11.into()],
    );
    both(
        &mut c,
        "DELETE FROM users WHERE id IN (?, ?, ?)",
        vec![12.into(), 13.into(), 14.into()],
    );
    both(&mut c, "DELETE FROM users WHERE id = ?", vec![15.into()]);
    // An aggregate within one partition, then merged over two.
    let count = c
        .prep("SELECT COUNT(*) FROM users WHERE id IN (?, ?)")
        .unwrap();
    let one: Option<i64> = c.exec_first(&count, (1, 3)).unwrap();
    assert_eq!(one, Some(2));
    let two: Option<i64> = c.exec_first(&count, (1, 2)).unwrap();
    assert_eq!(two, Some(2));
    // The whole table, row for row.
    both(
        &mut c,
        "SELECT id, nickname, created, score FROM users WHERE ? = 1",
        vec![1.into()],
    );
    // Nothing holds a connection for the session (background work of the
    // proxy, such as reading the dictionary, may for a moment: waited out).
    let pool = proxy.shared.main_pool();
    let pinned = || pool.open_connections() - pool.idle_connections();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while pinned() > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(pinned(), 0, "no connection pinned");
}

fn c_ref(c: &mut Conn) -> &mut Conn {
    c
}

#[test]
fn a_prepared_statement_follows_its_rows_when_a_partition_moves() {
    let (proxy, db) = setup("prepared_routing_moves");
    let mut c = proxy.connect(Some(&db));
    let insert = c
        .prep("INSERT INTO users (id, nickname) VALUES (?, ?)")
        .unwrap();
    let select = c.prep("SELECT nickname FROM users WHERE id = ?").unwrap();
    for id in 1..=6u32 {
        c.exec_drop(&insert, (id, format!("n{id}"))).unwrap();
    }
    let name: Option<String> = c.exec_first(&select, (3,)).unwrap();
    assert_eq!(name.as_deref(), Some("n3"));
    // Odd rows move back to the default table; the statements are planned again.
    c.query_drop("HSCALE DROP_PARTITION('users', 'odd')")
        .unwrap();
    let gone: Option<String> = cluster()
        .direct(2, Some(&db))
        .query_first("SHOW TABLES LIKE 'users_odd'")
        .unwrap();
    assert_eq!(gone, None);
    let name: Option<String> = c.exec_first(&select, (3,)).unwrap();
    assert_eq!(name.as_deref(), Some("n3"));
    c.exec_drop(&insert, (7, "n7")).unwrap();
    assert_eq!(ids(1, &db, "users_default"), [1, 2, 3, 4, 5, 6, 7]);
}

/// sysbench prepares BEGIN and COMMIT: the transaction they open and end
/// is the one every backend it reaches takes part in, as for text.
#[test]
fn prepared_begin_commit_and_rollback_span_every_backend_reached() {
    let (proxy, db) = setup("prepared_routing_transactions");
    let mut c = proxy.connect(Some(&db));
    let mut other = proxy.connect(Some(&db));
    let begin = c.prep("BEGIN").unwrap();
    let start = c.prep("START TRANSACTION").unwrap();
    let commit = c.prep("COMMIT").unwrap();
    let rollback = c.prep("ROLLBACK").unwrap();
    let select = c.prep("SELECT id FROM users WHERE id IN (?, ?)").unwrap();
    let insert = c
        .prep("INSERT INTO users (id, nickname) VALUES (?, 'n')")
        .unwrap();

    c.exec_drop(&begin, ()).unwrap();
    c.exec_drop(&insert, (1,)).unwrap();
    c.exec_drop(&insert, (2,)).unwrap();
    c.exec_drop(&rollback, ()).unwrap();
    assert!(ids(1, &db, "users_default").is_empty(), "rolled back");
    assert!(ids(2, &db, "users_odd").is_empty(), "rolled back");

    // Reads on either backend keep the snapshot their first read took.
    c.exec_drop(&start, ()).unwrap();
    let seen: Vec<u32> = c.exec(&select, (3, 4)).unwrap();
    assert!(seen.is_empty());
    other
        .query_drop("INSERT INTO users (id, nickname) VALUES (3, 'o'), (4, 'o')")
        .unwrap();
    let seen: Vec<u32> = c.exec(&select, (3, 4)).unwrap();
    assert!(seen.is_empty(), "one snapshot per backend: {seen:?}");
    c.exec_drop(&insert, (5,)).unwrap();
    c.exec_drop(&insert, (6,)).unwrap();
    c.exec_drop(&commit, ()).unwrap();
    assert_eq!(ids(1, &db, "users_default"), [4, 6]);
    assert_eq!(ids(2, &db, "users_odd"), [3, 5]);
    let mut seen: Vec<u32> = c.exec(&select, (3, 4)).unwrap();
    seen.sort();
    assert_eq!(seen, [3, 4]);

    let savepoint = c.prep("SAVEPOINT s").unwrap();
    let back = c.prep("ROLLBACK TO SAVEPOINT s").unwrap();
    c.exec_drop(&begin, ()).unwrap();
    c.exec_drop(&insert, (8,)).unwrap();
    c.exec_drop(&savepoint, ()).unwrap();
    c.exec_drop(&insert, (7,)).unwrap();
    c.exec_drop(&insert, (10,)).unwrap();
    c.exec_drop(&back, ()).unwrap();
    c.exec_drop(&commit, ()).unwrap();
    assert_eq!(ids(1, &db, "users_default"), [4, 6, 8]);
    assert_eq!(ids(2, &db, "users_odd"), [3, 5]);

    // SET autocommit = 1 commits what autocommit = 0 left open, everywhere.
    let autocommit_off = c.prep("SET autocommit = 0").unwrap();
    let autocommit_on = c.prep("SET autocommit = 1").unwrap();
    c.exec_drop(&autocommit_off, ()).unwrap();
    c.exec_drop(&insert, (9,)).unwrap();
    c.exec_drop(&insert, (12,)).unwrap();
    c.exec_drop(&autocommit_on, ()).unwrap();
    assert_eq!(ids(1, &db, "users_default"), [4, 6, 8, 12]);
    assert_eq!(ids(2, &db, "users_odd"), [3, 5, 9]);
}
#[tokio::test]
async fn long_data_and_cursors_on_a_routed_statement() {
    let (proxy, db) = tokio::task::spawn_blocking(|| setup("prepared_routing_raw"))
        .await
        .unwrap();
    let mut client = RawClient::login(proxy.port, "root", "", Some(&db)).await;
    let values: Vec<String> = (1..=5).map(|i| format!("({i}, 'n{i}')")).collect();
    let mut insert = vec![0x03];
    insert.extend_from_slice(
        format!(
            "INSERT INTO users (id, nickname) VALUES {}",
            values.join(", ")
        )
        .as_bytes(),
    );
    assert_eq!(client.command(&insert, 1).await[0][0], 0x00);
    // OK, one parameter + EOF, one column + EOF.
    let mut prepare = vec![0x16];
    prepare.extend_from_slice(b"SELECT nickname FROM users WHERE id = ?");
    let answer = client.command(&prepare, 5).await;
    assert_eq!(
        answer[0][0],
        0x00,
        "{:?}",
        String::from_utf8_lossy(&answer[0])
    );
    let stmt: [u8; 4] = answer[0][1..5].try_into().unwrap();
    let execute = |flags: u8, id: i64| {
        let mut execute = vec![0x17];
        execute.extend_from_slice(&stmt);
        execute.extend_from_slice(&[flags, 1, 0, 0, 0, 0x00, 0x01, 0x08, 0x00]);
        execute.extend_from_slice(&id.to_le_bytes());
        execute
    };
    // A cursor on the partition of id 3, read by FETCH.
    let opened = client.command(&execute(0x01, 3), 3).await;
    assert_eq!(
        opened.len(),
        3,
        "column count, definition, EOF with a cursor"
    );
    let mut fetch = vec![0x1c];
    fetch.extend_from_slice(&stmt);
    fetch.extend_from_slice(&10u32.to_le_bytes());
    let rows = client.command(&fetch, 2).await;
    assert_eq!(&rows[0][rows[0].len() - 2..], b"n3");
    // Long data for a statement routed by its parameters: refused at EXECUTE.
    let mut long_data = vec![0x18];
    long_data.extend_from_slice(&stmt);
    long_data.extend_from_slice(&[0, 0]);
    long_data.extend_from_slice(b"5");
    client.command(&long_data, 0).await;
    let error = client.command(&execute(0x00, 5), 1).await;
    assert_eq!(error[0][0], 0xff);
    assert_eq!(u16::from_le_bytes([error[0][1], error[0][2]]), 1235);
    // Then the statement runs again.
    let answer = client
        .command_bytes(
            &execute(0x00, 5),
            hscale_wire::scan::Expect::ResultSets,
            false,
        )
        .await;
    let packets = payloads(&answer);
    assert_eq!(&packets[3][packets[3].len() - 2..], b"n5");
    drop(client);
    tokio::task::spawn_blocking(move || drop(proxy))
        .await
        .unwrap();
}

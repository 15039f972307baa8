//! The driver matrix for the Rust drivers, the `mysql` crate and
//! mysql_async (tests/compat/drivers has the others), each with its default
//! options: a URL of host, port and database, so `prefer_socket` is on and
//! statements with parameters are prepared on the server. Through hscale in
//! its default configuration (two-phase commit), on a table partitioned
//! over two backends: a multi-row INSERT over both, a transaction over both
//! committed through the driver's API, bound parameters, one rolled back, a
//! duplicate key on the second backend inside a transaction, a SAVEPOINT
//! and ROLLBACK TO over both; read back, checked on the backends, and no
//! XA branch left. And mysql_async's pool after its connections were killed
//! (its own `should_reconnect` test failed through hscale: 1927).

use hscale_testkit::{cluster, Proxy};
use mysql::prelude::Queryable;
use mysql_async::prelude::Queryable as _;

const EXPECTED: [i32; 8] = [1, 2, 3, 4, 5, 6, 11, 12];

/// `name` partitioned by MOD(2) of id, odd ids on backend 2.
fn matrix_table(proxy: &Proxy, db: &str, name: &str) {
    let mut admin = proxy.connect(Some(db));
    admin
        .query_drop(format!(
            "CREATE TABLE {name} (id INT PRIMARY KEY, owner VARCHAR(20), amount INT)"
        ))
        .unwrap();
    admin
        .query_drop(format!(
            "HSCALE SETUP_TABLE('{name}', 'id', '{name}_default', 1, 'MOD(2)')"
        ))
        .unwrap();
    admin
        .query_drop(format!("HSCALE ADD_PARTITION('{name}', 'odd', 1, 2)"))
        .unwrap();
}

/// Each id where it routes, once, and no prepared branch on either backend.
fn check_backends(db: &str, name: &str) {
    let even: Vec<i32> = EXPECTED.iter().copied().filter(|i| i % 2 == 0).collect();
    let odd: Vec<i32> = EXPECTED.iter().copied().filter(|i| i % 2 == 1).collect();
    let on = |backend: usize, table: String| -> Vec<i32> {
        cluster()
            .direct(backend, Some(db))
            .query(format!("SELECT id FROM {table} ORDER BY id"))
            .unwrap()
    };
    assert_eq!(on(1, format!("{name}_default")), even);
    assert_eq!(on(2, format!("{name}_odd")), odd);
    for backend in 1..=2 {
        let branches: Vec<mysql::Row> =
            cluster().direct(backend, None).query("XA RECOVER").unwrap();
        assert!(branches.is_empty(), "backend {backend}: {branches:?}");
    }
}

fn url(proxy: &Proxy, db: &str) -> String {
    format!("mysql://root@127.0.0.1:{}/{db}", proxy.port)
}

#[test]
fn the_mysql_crate_with_its_defaults() {
    let db = cluster().database("drivers_mysql");
    let proxy = Proxy::for_cluster();
    matrix_table(&proxy, &db, "m");
    let opts = mysql::Opts::from_url(&url(&proxy, &db)).unwrap();
    let mut conn = mysql::Conn::new(opts).unwrap();
    let insert = "INSERT INTO m VALUES (?, ?, ?)";
    let tx_opts = mysql::TxOpts::default;

    conn.query_drop("INSERT INTO m VALUES (1, 'a', 10), (2, 'b', 20)")
        .unwrap();
    let mut tx = conn.start_transaction(tx_opts()).unwrap();
    tx.query_drop("INSERT INTO m VALUES (3, 'c', 30)").unwrap();
    tx.query_drop("INSERT INTO m VALUES (4, 'd', 40)").unwrap();
    tx.commit().unwrap();
    let mut tx = conn.start_transaction(tx_opts()).unwrap();
    tx.exec_drop(insert, (5, "e", 50)).unwrap();
    tx.exec_drop(insert, (6, "f", 60)).unwrap();
    tx.commit().unwrap();
    let mut tx = conn.start_transaction(tx_opts()).unwrap();
    tx.exec_drop(insert, (7, "g", 70)).unwrap();
    tx.exec_drop(insert, (8, "h", 80)).unwrap();
    tx.rollback().unwrap();
    let mut tx = conn.start_transaction(tx_opts()).unwrap();
    tx.exec_drop(insert, (9, "i", 90)).unwrap();
    tx.exec_drop(insert, (10, "j", 100)).unwrap();
    match tx.exec_drop(insert, (1, "dup", 0)) {
        Err(mysql::Error::MySqlError(e)) => assert_eq!(e.code, 1062, "{e}"),
        other => panic!("the duplicate key: {other:?}"),
    }
    tx.rollback().unwrap();
    let mut tx = conn.start_transaction(tx_opts()).unwrap();
    tx.exec_drop(insert, (11, "k", 110)).unwrap();
    tx.exec_drop(insert, (12, "l", 120)).unwrap();
    tx.query_drop("SAVEPOINT s").unwrap();
    tx.exec_drop(insert, (13, "m", 130)).unwrap();
    tx.exec_drop(insert, (14, "n", 140)).unwrap();
    tx.query_drop("ROLLBACK TO SAVEPOINT s").unwrap();
    tx.commit().unwrap();

    let ids: Vec<i32> = conn.query("SELECT id FROM m ORDER BY id").unwrap();
    assert_eq!(ids, EXPECTED);
    let branches: Vec<mysql::Row> = conn.query("XA RECOVER").unwrap();
    assert!(branches.is_empty());
    check_backends(&db, "m");
}

#[tokio::test]
async fn mysql_async_with_its_defaults() {
    let db = cluster().database("drivers_mysql_async");
    let proxy = tokio::task::spawn_blocking(Proxy::for_cluster)
        .await
        .unwrap();
    let (proxy, db) = tokio::task::spawn_blocking(move || {
        matrix_table(&proxy, &db, "m");
        (proxy, db)
    })
    .await
    .unwrap();
    let mut conn = mysql_async::Conn::from_url(url(&proxy, &db)).await.unwrap();
    let insert = "INSERT INTO m VALUES (?, ?, ?)";
    let tx_opts = mysql_async::TxOpts::default;

    conn.query_drop("INSERT INTO m VALUES (1, 'a', 10), (2, 'b', 20)")
        .await
        .unwrap();
    let mut tx = conn.start_transaction(tx_opts()).await.unwrap();
    tx.query_drop("INSERT INTO m VALUES (3, 'c', 30)")
        .await
        .unwrap();
    tx.query_drop("INSERT INTO m VALUES (4, 'd', 40)")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let mut tx = conn.start_transaction(tx_opts()).await.unwrap();
    tx.exec_drop(insert, (5, "e", 50)).await.unwrap();
    tx.exec_drop(insert, (6, "f", 60)).await.unwrap();
    tx.commit().await.unwrap();
    let mut tx = conn.start_transaction(tx_opts()).await.unwrap();
    tx.exec_drop(insert, (7, "g", 70)).await.unwrap();
    tx.exec_drop(insert, (8, "h", 80)).await.unwrap();
    tx.rollback().await.unwrap();
    let mut tx = conn.start_transaction(tx_opts()).await.unwrap();
    tx.exec_drop(insert, (9, "i", 90)).await.unwrap();
    tx.exec_drop(insert, (10, "j", 100)).await.unwrap();
    match tx.exec_drop(insert, (1, "dup", 0)).await {
        Err(mysql_async::Error::Server(e)) => assert_eq!(e.code, 1062, "{e}"),
        other => panic!("the duplicate key: {other:?}"),
    }
    tx.rollback().await.unwrap();
    let mut tx = conn.start_transaction(tx_opts()).await.unwrap();
    tx.exec_drop(insert, (11, "k", 110)).await.unwrap();
    tx.exec_drop(insert, (12, "l", 120)).await.unwrap();
    tx.query_drop("SAVEPOINT s").await.unwrap();
    tx.exec_drop(insert, (13, "m", 130)).await.unwrap();
    tx.exec_drop(insert, (14, "n", 140)).await.unwrap();
    tx.query_drop("ROLLBACK TO SAVEPOINT s").await.unwrap();
    tx.commit().await.unwrap();

    let ids: Vec<i32> = conn.query("SELECT id FROM m ORDER BY id").await.unwrap();
    assert_eq!(ids, EXPECTED);
    let branches: Vec<mysql_async::Row> = conn.query("XA RECOVER").await.unwrap();
    assert!(branches.is_empty());
    conn.disconnect().await.unwrap();
    tokio::task::spawn_blocking(move || check_backends(&db, "m"))
        .await
        .unwrap();
    drop(proxy);
}

/// mysql_async's `should_reconnect`: a pool's idle connections killed by
/// another client; the pool sees them closed and hands out live ones.
#[tokio::test]
async fn mysql_async_pool_reconnects_after_its_connections_were_killed() {
    let proxy = tokio::task::spawn_blocking(Proxy::for_cluster)
        .await
        .unwrap();
    let url = format!("mysql://root@127.0.0.1:{}", proxy.port);
    let mut master = mysql_async::Conn::from_url(url.as_str()).await.unwrap();
    let pool = mysql_async::Pool::new(url.as_str());
    let mut conns = Vec::new();
    for _ in 0..5 {
        let mut conn = pool.get_conn().await.unwrap();
        conn.ping().await.unwrap();
        conns.push(conn);
    }
    let ids: Vec<u32> = conns.iter().map(|c| c.id()).collect();
    drop(conns);
    for id in ids {
        master.query_drop(format!("KILL {id}")).await.unwrap();
    }
    for _ in 0..5 {
        let mut conn = pool.get_conn().await.unwrap();
        conn.ping().await.unwrap();
        let one: Option<i32> = conn.query_first("SELECT 1").await.unwrap();
        assert_eq!(one, Some(1));
    }
    pool.disconnect().await.unwrap();
    master.disconnect().await.unwrap();
    drop(proxy);
}

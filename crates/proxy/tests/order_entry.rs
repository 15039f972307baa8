//! An order-entry application, unmodified, sharded (issue 55): its tables
//! partitioned by warehouse, MOD(2) over two backends, its items a
//! reference table, its foreign keys kept — run through hscale by its own
//! SQL against the same application on one plain server.

use std::time::{Duration, Instant};

use hscale_testkit::order_entry::{self, Outcome, Scale, Terminal, BY_WAREHOUSE, CHECKS, SHARED};
use hscale_testkit::{cluster, Proxy};
use mysql::prelude::Queryable;
use mysql::Conn;

/// The application's tables, empty, in `db` on backend 1, and through
/// `proxy` partitioned and shared as the user set them up.
fn sharded(proxy: &Proxy, db: &str) -> Conn {
    order_entry::create(&mut cluster().direct(1, Some(db))).unwrap();
    let mut app = proxy.connect(Some(db));
    order_entry::shard(&mut app).unwrap();
    app
}

fn plain(db: &str) -> Conn {
    let mut oracle = cluster().direct(1, Some(db));
    order_entry::create(&mut oracle).unwrap();
    oracle
}

/// Every row of every table, in key order.
fn contents(conn: &mut Conn) -> Vec<(String, Vec<Vec<mysql::Value>>)> {
    let mut tables: Vec<&str> = BY_WAREHOUSE.iter().map(|(table, _)| *table).collect();
    tables.push(SHARED);
    tables
        .into_iter()
        .map(|table| {
            let columns: Vec<String> = conn
                .query(format!(
                    "SELECT column_name FROM information_schema.columns \
                     WHERE table_schema = DATABASE() AND table_name = '{table}' ORDER BY ordinal_position"
                ))
                .unwrap();
            let order: Vec<String> = (1..=columns.len()).map(|i| i.to_string()).collect();
            let rows: Vec<mysql::Row> = conn
                .query(format!("SELECT * FROM {table} ORDER BY {}", order.join(", ")))
                .unwrap();
            (table.to_string(), rows.into_iter().map(mysql::Row::unwrap).collect())
        })
        .collect()
}

/// The same transactions, one at a time, through hscale and on one server:
/// every answer the application reads, every outcome, every table's rows
/// and every consistency check the same. New orders over two warehouses'
/// stock, payments of another warehouse's customers, deliveries, the stock
/// level's join and the checks' correlated subqueries all reach both
/// backends.
#[test]
fn the_application_answers_through_hscale_as_on_one_server() {
    let db = cluster().database("order_entry");
    let oracle_db = cluster().database("order_entry_oracle");
    let proxy = Proxy::for_cluster();
    let mut app = sharded(&proxy, &db);
    let mut oracle = plain(&oracle_db);
    let scale = Scale::TEST;
    order_entry::load(&mut app, scale).unwrap();
    order_entry::load(&mut oracle, scale).unwrap();
    let before = order_entry::check(&mut app).unwrap();
    assert_eq!(order_entry::violations(&before), Vec::<String>::new());
    assert_eq!(before, order_entry::check(&mut oracle).unwrap());
    // The partitions hold the rows of their warehouses.
    let odd: u64 = cluster()
        .direct(2, Some(&db))
        .query_first("SELECT COUNT(DISTINCT s_w_id) FROM stock_odd WHERE s_w_id % 2 = 1")
        .unwrap()
        .unwrap();
    assert_eq!(odd, u64::from(scale.warehouses / 2));

    let seed = hscale_testkit::seed("ORDER_ENTRY_SEED");
    let mut terminal = Terminal::new(seed, scale);
    let mut rolled_back = 0;
    for n in 0..400 {
        let t = terminal.next_transaction();
        let (mut through, mut direct) = (String::new(), String::new());
        let outcome = order_entry::run(&mut app, &t, &mut through)
            .unwrap_or_else(|e| panic!("transaction {n} {t:?} through hscale: {e}"));
        let expected = order_entry::run(&mut oracle, &t, &mut direct).unwrap();
        assert_eq!(
            (outcome, &through),
            (expected, &direct),
            "transaction {n} {t:?} answered otherwise (seed {seed})"
        );
        rolled_back += usize::from(outcome == Outcome::RolledBack);
    }
    println!("{rolled_back} of 400 transactions rolled back by the application");
    let after = order_entry::check(&mut app).unwrap();
    assert_eq!(order_entry::violations(&after), Vec::<String>::new());
    for ((name, ..), (through, direct)) in CHECKS
        .iter()
        .zip(after.iter().zip(&order_entry::check(&mut oracle).unwrap()))
    {
        assert_eq!(through, direct, "check {name:?} (seed {seed})");
    }
    for ((table, through), (_, direct)) in contents(&mut app).into_iter().zip(contents(&mut oracle))
    {
        let differ = through.iter().zip(&direct).find(|(a, b)| a != b);
        assert!(
            through.len() == direct.len() && differ.is_none(),
            "{table}: {} rows through hscale, {} on one server; first difference {differ:?} (seed {seed})",
            through.len(),
            direct.len()
        );
    }
}

/// Eight clients at once, each its own transactions: the only errors are
/// deadlocks and lock waits the application retries, none waits for
/// `innodb_lock_wait_timeout`, and every consistency check holds after —
/// read through hscale and on each backend's partitions directly.
#[test]
fn eight_clients_keep_the_application_consistent() {
    let db = cluster().database("order_entry_concurrent");
    let proxy = Proxy::for_cluster();
    let mut app = sharded(&proxy, &db);
    let scale = Scale::TEST;
    order_entry::load(&mut app, scale).unwrap();
    let seed = hscale_testkit::seed("ORDER_ENTRY_SEED");
    let clients: Vec<_> = (0..8)
        .map(|client| {
            let mut conn = proxy.connect(Some(&db));
            std::thread::spawn(move || {
                let mut terminal = Terminal::new(seed + client, scale);
                let (mut retries, mut slowest) = (0, Duration::ZERO);
                for _ in 0..60 {
                    let t = terminal.next_transaction();
                    loop {
                        let started = Instant::now();
                        let ran = order_entry::run(&mut conn, &t, &mut String::new());
                        slowest = slowest.max(started.elapsed());
                        match ran {
                            Ok(_) => break,
                            Err(e) if order_entry::retried(&e) => retries += 1,
                            Err(e) => panic!("{t:?}: {e} (seed {seed})"),
                        }
                    }
                }
                (retries, slowest)
            })
        })
        .collect();
    let mut retries = 0;
    for client in clients {
        let (retried, slowest) = client.join().unwrap();
        retries += retried;
        assert!(
            slowest < Duration::from_secs(10),
            "a transaction took {slowest:?}: a lock wait through two backends was not ended"
        );
    }
    println!("{retries} transactions retried after a deadlock or lock wait");
    let checked = order_entry::check(&mut app).unwrap();
    assert_eq!(order_entry::violations(&checked), Vec::<String>::new());
    // New orders: as many through hscale as the partitions hold.
    let through: u64 = app
        .query_first("SELECT COUNT(*) FROM orders")
        .unwrap()
        .unwrap();
    let on_backends: u64 = [(1, "orders_default"), (2, "orders_odd")]
        .iter()
        .map(|(backend, table)| {
            cluster()
                .direct(*backend, Some(&db))
                .query_first::<u64, _>(format!("SELECT COUNT(*) FROM {table}"))
                .unwrap()
                .unwrap()
        })
        .sum();
    assert_eq!(through, on_backends);
    assert!(through > u64::from(scale.warehouses * scale.districts * scale.orders));
}

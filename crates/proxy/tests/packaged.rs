//! Servers as MariaDB comes out of the package: no binary log (issue 54).
//! HSCALE's own flow, SETUP_TABLE then ADD_PARTITION then load, works; a
//! split or move with rows moves them in its fence (its table waits) up to
//! `[moves] offline_max_rows`, and above it is refused naming what to turn
//! on, changing nothing. Rows are checked on the backends directly.

use std::time::{Duration, Instant};

use hscale_testkit::{cluster_as_packaged, Proxy};
use mysql::prelude::Queryable;
use mysql::{Conn, Row};

fn cluster() -> &'static hscale_testkit::Cluster {
    cluster_as_packaged()
}

fn count(conn: &mut Conn, sql: &str) -> u64 {
    conn.query_first(sql).unwrap().unwrap()
}

fn tables_on(backend: usize, db: &str) -> Vec<String> {
    cluster()
        .direct(backend, Some(db))
        .query("SHOW TABLES")
        .unwrap()
}

/// `t` by MOD(2) of id, its default table on backend 1, with `rows` rows
/// (ids 1..=rows) loaded directly.
fn table_with_rows(proxy: &Proxy, name: &str, rows: u64) -> (String, Conn) {
    let db = cluster().database(name);
    let mut direct = cluster().direct(1, Some(&db));
    direct
        .query_drop("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20))")
        .unwrap();
    if rows > 0 {
        direct
            .query_drop(format!(
                "INSERT INTO t SELECT seq, CONCAT('v', seq) FROM seq_1_to_{rows}"
            ))
            .unwrap();
    }
    let mut admin = proxy.connect(Some(&db));
    admin
        .query_drop("HSCALE SETUP_TABLE('t', 'id', 't_default', 1, 'MOD(2)')")
        .unwrap();
    (db, admin)
}

#[test]
fn the_servers_write_no_binary_log() {
    let log_bin: u64 = count(&mut cluster().direct(1, None), "SELECT @@log_bin");
    assert_eq!(log_bin, 0);
}

/// The issue's flow: before, ADD_PARTITION answered 1235 "backend 1 has no
/// binary log" on a table without a single row.
#[test]
fn partitions_are_added_to_an_empty_table_then_loaded() {
    let proxy = Proxy::start(cluster().config());
    let (db, mut admin) = table_with_rows(&proxy, "packaged_empty", 0);
    let moved = admin
        .query_iter("HSCALE ADD_PARTITION('t', 'odd', 1, 2)")
        .unwrap()
        .affected_rows();
    assert_eq!(moved, 0);
    admin
        .query_drop("INSERT INTO t SELECT seq, 'x' FROM seq_1_to_100")
        .unwrap_or_else(|_| {
            // INSERT ... SELECT over partitions may be refused: load in rows.
            let values: Vec<String> = (1..=100).map(|i| format!("({i}, 'x')")).collect();
            admin
                .query_drop(format!("INSERT INTO t VALUES {}", values.join(", ")))
                .unwrap();
        });
    assert_eq!(count(&mut admin, "SELECT COUNT(*) FROM t"), 100);
    let mut one = cluster().direct(1, Some(&db));
    let mut two = cluster().direct(2, Some(&db));
    assert_eq!(count(&mut one, "SELECT COUNT(*) FROM t_default"), 50);
    assert_eq!(
        count(&mut one, "SELECT COUNT(*) FROM t_default WHERE id % 2 = 1"),
        0
    );
    assert_eq!(
        count(&mut two, "SELECT COUNT(*) FROM t_odd WHERE id % 2 = 1"),
        50
    );
    assert_eq!(tables_on(2, &db), ["t_odd"]);
}

/// A split of 1,000 rows, written through hscale all along: the writers
/// wait while the rows move in the fence, and every acknowledged write is
/// there once, where its id routes.
#[test]
fn a_split_moves_its_rows_in_the_fence_while_clients_write() {
    let proxy = Proxy::start(cluster().config());
    let (db, mut admin) = table_with_rows(&proxy, "packaged_split", 2_000);
    let writer = {
        let mut conn = proxy.connect(Some(&db));
        std::thread::spawn(move || {
            let mut written = Vec::new();
            let started = Instant::now();
            let mut id = 10_001;
            while started.elapsed() < Duration::from_secs(3) {
                conn.query_drop(format!("INSERT INTO t VALUES ({id}, 'w')"))
                    .unwrap();
                conn.query_drop(format!("UPDATE t SET v = 'u' WHERE id = {}", id - 10_000))
                    .unwrap();
                written.push(id);
                id += 1;
            }
            written
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let moved = admin
        .query_iter("HSCALE ADD_PARTITION('t', 'odd', 1, 2)")
        .unwrap()
        .affected_rows();
    let written = writer.join().unwrap();
    assert!(!written.is_empty());
    assert!(
        moved >= 1_000,
        "the odd rows of the 2,000 and those written: {moved}"
    );
    let expected_odd = 1_000 + written.iter().filter(|id| *id % 2 == 1).count() as u64;
    let mut one = cluster().direct(1, Some(&db));
    let mut two = cluster().direct(2, Some(&db));
    assert_eq!(count(&mut two, "SELECT COUNT(*) FROM t_odd"), expected_odd);
    assert_eq!(
        count(&mut two, "SELECT COUNT(*) FROM t_odd WHERE id % 2 = 0"),
        0
    );
    assert_eq!(
        count(&mut one, "SELECT COUNT(*) FROM t_default"),
        2_000 + written.len() as u64 - expected_odd
    );
    assert_eq!(
        count(&mut one, "SELECT COUNT(*) FROM t_default WHERE id % 2 = 1"),
        0
    );
    let total = 2_000 + written.len() as u64;
    assert_eq!(count(&mut admin, "SELECT COUNT(*) FROM t"), total);
    let updated = count(&mut admin, "SELECT COUNT(*) FROM t WHERE v = 'u'");
    let existed = written.len().min(2_000) as u64;
    assert_eq!(updated, existed, "every acknowledged update");
}

/// 20,000 rows of the value: refused with 1235 naming the binary log and
/// the limit, and nothing changed. A higher limit lets it run.
#[test]
fn a_split_above_offline_max_rows_is_refused_naming_the_fix() {
    let proxy = Proxy::start(cluster().config());
    let (db, mut admin) = table_with_rows(&proxy, "packaged_refused", 40_000);
    let refused = admin
        .query_drop("HSCALE ADD_PARTITION('t', 'odd', 1, 2)")
        .unwrap_err();
    let mysql::Error::MySqlError(e) = refused else {
        panic!("{refused:?}");
    };
    assert_eq!(e.code, 1235, "{}", e.message);
    for named in [
        "log_bin",
        "binlog_format=ROW",
        "20000 rows",
        "offline_max_rows (10000)",
    ] {
        assert!(e.message.contains(named), "{named}: {}", e.message);
    }
    assert!(tables_on(2, &db).is_empty());
    assert_eq!(tables_on(1, &db), ["t_default"]);
    let partitions: Vec<String> = admin
        .query_map("HSCALE SHOW_PARTITIONS('t')", |row: Row| {
            row.get::<String, _>("partition").unwrap()
        })
        .unwrap();
    assert_eq!(partitions, ["(default)"]);
    assert_eq!(count(&mut admin, "SELECT COUNT(*) FROM t"), 40_000);

    let mut config = cluster().config();
    config.moves.offline_max_rows = 20_000;
    let proxy = Proxy::start(config);
    let mut admin = proxy.connect(Some(&db));
    let moved = admin
        .query_iter("HSCALE ADD_PARTITION('t', 'odd', 1, 2)")
        .unwrap()
        .affected_rows();
    assert_eq!(moved, 20_000);
    let mut two = cluster().direct(2, Some(&db));
    assert_eq!(count(&mut two, "SELECT COUNT(*) FROM t_odd"), 20_000);
}

/// MOVE_PARTITION of a partition with rows, and DROP_PARTITION's own
/// fallback: the rows end where the dictionary says, once.
#[test]
fn a_partition_moves_and_is_dropped_without_a_binary_log() {
    let proxy = Proxy::start(cluster().config());
    let (db, mut admin) = table_with_rows(&proxy, "packaged_move", 300);
    admin
        .query_drop("HSCALE ADD_PARTITION('t', 'odd', 1, 1)")
        .unwrap();
    let job: u64 = admin
        .query_first("HSCALE MOVE_PARTITION('t', 'odd', 2)")
        .unwrap()
        .unwrap();
    let started = Instant::now();
    loop {
        let rows: Vec<Row> = admin.query("HSCALE SHOW_MOVES").unwrap();
        let row = rows
            .into_iter()
            .find(|r| r.get::<u64, _>("job") == Some(job))
            .expect("the job is listed");
        let phase: String = row.get("phase").unwrap();
        if phase == "done" {
            break;
        }
        let error: Option<String> = row.get("last_error").unwrap();
        assert!(
            phase != "failed" && phase != "cancelled",
            "{phase}: {error:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(60), "still {phase}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut two = cluster().direct(2, Some(&db));
    assert_eq!(count(&mut two, "SELECT COUNT(*) FROM t_odd"), 150);
    assert_eq!(
        count(&mut admin, "SELECT COUNT(*) FROM t WHERE id % 2 = 1"),
        150
    );
    admin
        .query_drop("UPDATE t SET v = 'moved' WHERE id = 7")
        .unwrap();
    assert_eq!(
        count(&mut two, "SELECT COUNT(*) FROM t_odd WHERE v = 'moved'"),
        1,
        "writes go to the new place"
    );
    let dropped = admin
        .query_iter("HSCALE DROP_PARTITION('t', 'odd')")
        .unwrap()
        .affected_rows();
    assert_eq!(dropped, 150);
    let mut one = cluster().direct(1, Some(&db));
    assert_eq!(count(&mut one, "SELECT COUNT(*) FROM t_default"), 300);
    assert_eq!(count(&mut admin, "SELECT COUNT(*) FROM t"), 300);
}

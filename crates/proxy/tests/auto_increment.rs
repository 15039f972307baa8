//! AUTO_INCREMENT columns of partitioned tables: ids unique over every
//! partition and every hscale instance, reported as MariaDB reports them.

use hscale::config::Transactions;
use hscale_testkit::{cluster, Proxy};
use mysql::prelude::Queryable;

/// `items` partitioned by MOD(2) of its AUTO_INCREMENT id (odd ids on
/// backend 2), with `before` rows already in it; two instances.
fn setup(name: &str, before: u32) -> (Proxy, Proxy, String) {
    let db = cluster().database(name);
    let mut direct = cluster().direct(1, Some(&db));
    direct
        .query_drop("CREATE TABLE items (id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY, label VARCHAR(32) NOT NULL)")
        .unwrap();
    for i in 0..before {
        direct
            .query_drop(format!("INSERT INTO items (label) VALUES ('old{i}')"))
            .unwrap();
    }
    let config = || {
        let mut config = cluster().config();
        config.proxy.transactions = Transactions::Multi;
        config
    };
    let first = Proxy::start(config());
    let second = Proxy::start(config());
    let mut c = first.connect(Some(&db));
    c.query_drop("HSCALE SETUP_TABLE('items', 'id', 'items_default', 1, 'MOD(2)')")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('items', 'odd', 1, 2)")
        .unwrap();
    (first, second, db)
}

/// Every id of both physical tables.
fn all_ids(db: &str) -> Vec<u64> {
    let mut ids: Vec<u64> = cluster()
        .direct(1, Some(db))
        .query("SELECT id FROM items_default")
        .unwrap();
    let odd: Vec<u64> = cluster()
        .direct(2, Some(db))
        .query("SELECT id FROM items_odd")
        .unwrap();
    assert!(odd.iter().all(|id| id % 2 == 1), "odd ids on backend 2");
    ids.extend(odd);
    ids.sort();
    ids
}

#[test]
fn ids_are_unique_across_partitions_and_instances() {
    let (first, second, db) = setup("auto_two_instances", 3);
    let mut clients = Vec::new();
    for proxy in [&first, &second] {
        for _ in 0..3 {
            clients.push(proxy.connect(Some(&db)));
        }
    }
    let threads: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(n, mut c)| {
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                for i in 0..40 {
                    match i % 4 {
                        // Two rows: the OK reports the first, as MariaDB does.
                        0 => {
                            c.query_drop(format!(
                                "INSERT INTO items (label) VALUES ('c{n}r{i}a'), ('c{n}r{i}b')"
                            ))
                            .unwrap();
                            let id = c.last_insert_id();
                            mine.extend([id, id + 1]);
                        }
                        1 => {
                            c.query_drop(format!("INSERT INTO items SET label = 'c{n}r{i}'"))
                                .unwrap();
                            mine.push(c.last_insert_id());
                        }
                        2 => {
                            c.query_drop(format!("INSERT INTO items VALUES (NULL, 'c{n}r{i}')"))
                                .unwrap();
                            mine.push(c.last_insert_id());
                        }
                        // Prepared: hscale binds the id.
                        _ => {
                            c.exec_drop(
                                "INSERT INTO items (label, id) VALUES (?, 0)",
                                (format!("c{n}r{i}"),),
                            )
                            .unwrap();
                            mine.push(c.last_insert_id());
                        }
                    }
                    // The first id of the last INSERT.
                    let first = match i % 4 {
                        0 => mine[mine.len() - 2],
                        _ => mine[mine.len() - 1],
                    };
                    let last: Option<u64> = c.query_first("SELECT LAST_INSERT_ID()").unwrap();
                    assert_eq!(last, Some(first), "client {n}, insert {i}");
                }
                mine
            })
        })
        .collect();
    let mut handed: Vec<u64> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    handed.sort();
    let ids = all_ids(&db);
    assert_eq!(ids.len(), 3 + 6 * 50, "every row stored once");
    let mut unique = ids.clone();
    unique.dedup();
    assert_eq!(unique.len(), ids.len(), "no id twice");
    // The ids the clients were told are the rows' ids, and new ones come
    // after the rows the table had.
    assert!(handed
        .iter()
        .all(|id| ids.binary_search(id).is_ok() && *id > 3));
    let mut c = first.connect(Some(&db));
    let label: Option<String> = c
        .query_first(format!("SELECT label FROM items WHERE id = {}", handed[0]))
        .unwrap();
    assert!(label.is_some_and(|l| l.starts_with('c')));
}

#[test]
fn explicit_ids_move_the_sequence_past_them() {
    let (first, second, db) = setup("auto_explicit", 0);
    let mut a = first.connect(Some(&db));
    let mut b = second.connect(Some(&db));
    a.query_drop("INSERT INTO items (label) VALUES ('a')")
        .unwrap();
    let from_a = a.last_insert_id();
    a.query_drop("INSERT INTO items (id, label) VALUES (500000, 'given')")
        .unwrap();
    // As on MariaDB: the OK reports the id given, LAST_INSERT_ID() the one generated.
    assert_eq!(a.last_insert_id(), 500000);
    let last: Option<u64> = a.query_first("SELECT LAST_INSERT_ID()").unwrap();
    assert_eq!(last, Some(from_a));
    // The other instance's first block starts after it.
    b.query_drop("INSERT INTO items (label) VALUES ('b')")
        .unwrap();
    assert!(b.last_insert_id() > 500000, "{}", b.last_insert_id());
    // This instance's ids grow past it: its block ended there.
    a.query_drop("INSERT INTO items (label) VALUES ('a2')")
        .unwrap();
    let a2 = a.last_insert_id();
    assert!(a2 > b.last_insert_id(), "{a2}");
    // An id given within the block is skipped.
    a.query_drop(format!(
        "INSERT INTO items (id, label) VALUES ({}, 'near')",
        a2 + 1
    ))
    .unwrap();
    assert_eq!(all_ids(&db).len(), 5);
    // Prepared INSERTs that leave the ids to the server: the client sees its
    // own parameters only, hscale binds the ids.
    let two = a.prep("INSERT INTO items (label) VALUES (?), (?)").unwrap();
    assert_eq!(two.num_params(), 2);
    a.exec_drop(&two, ("p1", "p2")).unwrap();
    let first = a.last_insert_id();
    assert_eq!(first, a2 + 2, "after the id skipped");
    let last: Option<u64> = a.query_first("SELECT LAST_INSERT_ID()").unwrap();
    assert_eq!(last, Some(first));
    let none = a.prep("INSERT INTO items (label) VALUES ('p3')").unwrap();
    assert_eq!(none.num_params(), 0);
    a.exec_drop(&none, ()).unwrap();
    assert_eq!(a.last_insert_id(), first + 2);
    let labels: Vec<(u64, String)> = a
        .query(format!(
            "SELECT id, label FROM items WHERE id IN ({first}, {}, {})",
            first + 1,
            first + 2
        ))
        .unwrap();
    let mut labels: Vec<String> = labels.into_iter().map(|(_, l)| l).collect();
    labels.sort();
    assert_eq!(labels, ["p1", "p2", "p3"]);
    a.exec_drop("INSERT INTO items (id, label) VALUES (?, ?)", (7, "p"))
        .unwrap();
    assert!(all_ids(&db).contains(&7));
    assert_eq!(all_ids(&db).len(), 9);
    // An id given as a parameter moves the sequence too, and ids of this
    // instance keep growing past it.
    a.exec_drop(
        "INSERT INTO items (id, label) VALUES (?, ?)",
        (900_000, "far"),
    )
    .unwrap();
    let last: Option<u64> = a.query_first("SELECT LAST_INSERT_ID()").unwrap();
    assert_eq!(
        last,
        Some(first + 2),
        "ids given leave LAST_INSERT_ID() as it was"
    );
    a.query_drop("INSERT INTO items (label) VALUES ('after')")
        .unwrap();
    assert!(a.last_insert_id() > 900_000, "{}", a.last_insert_id());
}

/// An id left to the server by DEFAULT, or by a parameter bound to NULL or
/// 0, would come from the partition table's own count, which the other
/// partitions repeat: hscale hands it out instead. Under
/// NO_AUTO_VALUE_ON_ZERO (mysqldump sets it) a 0 is the row's id.
/// LOAD DATA gives its rows' ids: the sequence moves past the highest, in
/// every instance; a line that leaves its id to the server is refused.
#[test]
fn loaded_ids_move_the_sequence_past_them() {
    let (first, second, db) = setup("auto_load", 2);
    let mut a = first.connect(Some(&db));
    let file: String = (700..710).map(|id| format!("{id}\tloaded{id}\n")).collect();
    a.set_local_infile_handler(Some(mysql::LocalInfileHandler::new(move |_, out| {
        std::io::Write::write_all(out, file.as_bytes())
    })));
    a.query_drop("LOAD DATA LOCAL INFILE 'items' INTO TABLE items")
        .unwrap();
    assert_eq!(a.affected_rows(), 10);
    let mut b = second.connect(Some(&db));
    b.query_drop("INSERT INTO items (label) VALUES ('after')")
        .unwrap();
    assert!(b.last_insert_id() > 709, "{}", b.last_insert_id());
    let ids = all_ids(&db);
    assert_eq!(ids.len(), 13);
    assert!(ids.contains(&700) && ids.contains(&709));
    a.set_local_infile_handler(Some(mysql::LocalInfileHandler::new(|_, out| {
        std::io::Write::write_all(out, b"\\N\tno id\n")
    })));
    match a.query_drop("LOAD DATA LOCAL INFILE 'items' INTO TABLE items") {
        Err(mysql::Error::MySqlError(e)) => {
            assert_eq!(e.code, 1235);
            assert!(e.message.contains("gives no id"), "{}", e.message);
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(all_ids(&db).len(), 13);
}

#[test]
fn ids_left_to_the_server_in_any_form_come_from_the_sequence() {
    let (first, _second, db) = setup("auto_any_form", 0);
    let mut direct = cluster().direct(1, Some(&db));
    // Partitioned by another column than its id: the server would not refuse
    // the same id in two partitions.
    direct
        .query_drop(
            "CREATE TABLE people (id INT AUTO_INCREMENT PRIMARY KEY, nick VARCHAR(32) NOT NULL)",
        )
        .unwrap();
    let mut c = first.connect(Some(&db));
    c.query_drop("HSCALE SETUP_TABLE('people', 'nick', 'people_default', 1, 'PREFIX(1)')")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('people', 'm', 'm', 2)")
        .unwrap();
    let mut told = Vec::new();
    for nick in ["ann", "max"] {
        c.query_drop(format!("INSERT INTO people VALUES (DEFAULT, '{nick}')"))
            .unwrap();
        told.push(c.last_insert_id());
    }
    let insert = c
        .prep("INSERT INTO people (id, nick) VALUES (?, ?)")
        .unwrap();
    for (id, nick) in [
        (mysql::Value::NULL, "bob"),
        (mysql::Value::NULL, "mia"),
        (mysql::Value::Int(0), "cid"),
        (mysql::Value::Bytes(b"0".to_vec()), "mo"),
    ] {
        c.exec_drop(&insert, (id, nick)).unwrap();
        let id = c.last_insert_id();
        let last: Option<u64> = c.query_first("SELECT LAST_INSERT_ID()").unwrap();
        assert_eq!(last, Some(id), "{nick}");
        told.push(id);
    }
    let mut stored: Vec<(u64, String)> = cluster()
        .direct(1, Some(&db))
        .query("SELECT id, nick FROM people_default")
        .unwrap();
    stored.extend(
        cluster()
            .direct(2, Some(&db))
            .query::<(u64, String), _>("SELECT id, nick FROM people_m")
            .unwrap(),
    );
    stored.sort();
    let ids: Vec<u64> = stored.iter().map(|(id, _)| *id).collect();
    told.sort();
    assert_eq!(
        ids, told,
        "each row has the id its client was told: {stored:?}"
    );
    let mut unique = ids.clone();
    unique.dedup();
    assert_eq!(unique.len(), 6, "no id twice: {stored:?}");
    // Partitioned by the id: a row whose id hscale binds is placed by it
    // (odd ids on backend 2, which `all_ids` checks).
    let items = c
        .prep("INSERT INTO items (id, label) VALUES (?, ?)")
        .unwrap();
    for label in ["n1", "n2"] {
        c.exec_drop(&items, (mysql::Value::NULL, label)).unwrap();
    }
    assert_eq!(all_ids(&db).len(), 2);
    // What hscale cannot read as a number is refused, not left to the
    // server to turn into 0.
    for refused in [
        c.query_drop("INSERT INTO people VALUES (@unset, 'eve')"),
        c.exec_drop(&insert, ("abc", "eve")),
        // An id moved past the sequence would be handed out again.
        c.query_drop("UPDATE people p SET p.id = 1000 WHERE nick = 'ann'"),
    ] {
        match refused {
            Err(mysql::Error::MySqlError(e)) => {
                assert_eq!(e.code, 1235);
                assert!(
                    e.message.contains("AUTO_INCREMENT column `id`"),
                    "{}",
                    e.message
                );
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    // mysqldump's header, then its rows: 0 stays 0, as it does on MariaDB.
    c.query_drop("/*!40101 SET @OLD_SQL_MODE=@@SQL_MODE, SQL_MODE='NO_AUTO_VALUE_ON_ZERO' */")
        .unwrap();
    c.query_drop("INSERT INTO items VALUES (0, 'zero')")
        .unwrap();
    c.exec_drop(&insert, (0, "zed")).unwrap();
    c.exec_drop(&insert, (mysql::Value::NULL, "null")).unwrap();
    let zero: Option<String> = c
        .query_first("SELECT label FROM items WHERE id = 0")
        .unwrap();
    assert_eq!(zero.as_deref(), Some("zero"));
    let zed: Vec<u64> = c
        .query("SELECT id FROM people WHERE nick IN ('zed', 'null') ORDER BY nick")
        .unwrap();
    assert_eq!(zed.len(), 2);
    assert!(zed[0] > 0 && zed[1] == 0, "NULL still gets an id: {zed:?}");
}

/// A one-row INSERT ... ON DUPLICATE KEY UPDATE reports ids as MariaDB
/// does: the OK's id and LAST_INSERT_ID() name the same rows as on one
/// plain table (the oracle), whether the row went in, was updated or left
/// alone, also for `id = LAST_INSERT_ID(id)`, which is how clients learn
/// the id of the row that was there. An ODKU that would set the id
/// past hscale's sequence is refused.
#[test]
fn duplicate_key_updates_report_ids_as_one_table_does() {
    let db = cluster().database("auto_upsert");
    let proxy = Proxy::for_cluster();
    let mut c = proxy.connect(Some(&db));
    let create = "CREATE TABLE tags (id BIGINT AUTO_INCREMENT PRIMARY KEY, name VARCHAR(32) NOT NULL, hits INT NOT NULL, UNIQUE KEY (name))";
    cluster().direct(1, Some(&db)).query_drop(create).unwrap();
    c.query_drop("HSCALE SETUP_TABLE('tags', 'name', 'tags_default', 1, 'PREFIX(1)')")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('tags', 'm', 'm', 2)")
        .unwrap();
    let mut oracle = cluster().direct(1, Some(&db));
    oracle.query_drop(create.replace("tags", "oracle")).unwrap();
    let statements = [
        "INSERT INTO tags (name, hits) VALUES ('anna', 1)",
        "INSERT INTO tags (name, hits) VALUES ('martin', 1), ('mia', 1)",
        "INSERT INTO tags (name, hits) VALUES ('martin', 1) ON DUPLICATE KEY UPDATE hits = hits + 1",
        "INSERT INTO tags (name, hits) VALUES ('anna', 1) ON DUPLICATE KEY UPDATE id = LAST_INSERT_ID(id), hits = hits + 1",
        "INSERT INTO tags (name, hits) VALUES ('mia', 1) ON DUPLICATE KEY UPDATE hits = hits",
        "INSERT INTO tags (name, hits) VALUES ('zoe', 1) ON DUPLICATE KEY UPDATE id = LAST_INSERT_ID(id)",
        "INSERT INTO tags (name, hits) VALUES ('mia', 1) ON DUPLICATE KEY UPDATE id = LAST_INSERT_ID(id)",
        "INSERT INTO tags (name, hits) VALUES ('max', 1) ON DUPLICATE KEY UPDATE hits = hits + 1",
        "INSERT INTO tags (name, hits) VALUES ('max', 1) ON DUPLICATE KEY UPDATE hits = hits + 1",
        "INSERT INTO tags (name, hits) VALUES ('anna', 1) ON DUPLICATE KEY UPDATE hits = hits + 1",
        "INSERT INTO tags (name, hits) VALUES ('mira', 1) ON DUPLICATE KEY UPDATE hits = hits + 1",
        "INSERT INTO tags (name, hits) VALUES ('martin', 1) ON DUPLICATE KEY UPDATE hits = hits + 1",
        "INSERT INTO tags (name, hits) VALUES ('mo', 1), ('mel', 1) ON DUPLICATE KEY UPDATE hits = hits + 1",
    ];
    // Ids differ between the two; the rows they name must not.
    let named = |conn: &mut mysql::Conn, table: &str, id: u64| -> Option<String> {
        conn.query_first(format!("SELECT name FROM {table} WHERE id = {id}"))
            .unwrap()
    };
    let mut seen = Vec::new();
    for (conn, table) in [(&mut c, "tags"), (&mut oracle, "oracle")] {
        let mut answers = Vec::new();
        for statement in statements {
            conn.query_drop(statement.replace("tags", table)).unwrap();
            let ok = (conn.last_insert_id(), conn.affected_rows());
            let last: u64 = conn
                .query_first("SELECT LAST_INSERT_ID()")
                .unwrap()
                .unwrap();
            answers.push((
                statement,
                named(conn, table, ok.0),
                ok.1,
                named(conn, table, last),
            ));
        }
        // Prepared, with the id bound to NULL: hscale binds its own.
        conn.exec_drop(
            format!("INSERT INTO {table} (id, name, hits) VALUES (?, ?, 1) ON DUPLICATE KEY UPDATE id = LAST_INSERT_ID(id)"),
            (None::<u64>, "anna"),
        )
        .unwrap();
        let last: u64 = conn
            .query_first("SELECT LAST_INSERT_ID()")
            .unwrap()
            .unwrap();
        answers.push((
            "prepared",
            named(conn, table, conn.last_insert_id()),
            conn.affected_rows(),
            named(conn, table, last),
        ));
        // A counter kept in LAST_INSERT_ID(expr).
        conn.query_drop(format!("INSERT INTO {table} SET name = 'mia', hits = 1 ON DUPLICATE KEY UPDATE hits = LAST_INSERT_ID(hits + 10)"))
            .unwrap();
        let reported = conn.last_insert_id();
        let counter: u64 = conn
            .query_first(format!("SELECT hits FROM {table} WHERE name = 'mia'"))
            .unwrap()
            .unwrap();
        let last: u64 = conn
            .query_first("SELECT LAST_INSERT_ID()")
            .unwrap()
            .unwrap();
        assert_eq!((reported, last), (counter, counter), "{table}");
        let hits: Vec<(String, u32)> = conn
            .query(format!("SELECT name, hits FROM {table} ORDER BY name"))
            .unwrap();
        seen.push((answers, hits));
    }
    let (through, direct) = (&seen[0], &seen[1]);
    for (hscale, oracle) in through.0.iter().zip(&direct.0) {
        assert_eq!(
            hscale, oracle,
            "(statement, OK id's row, affected, LAST_INSERT_ID()'s row)"
        );
    }
    assert_eq!(through.1, direct.1);
    match c.query_drop(
        "INSERT INTO tags (name, hits) VALUES ('max', 1) ON DUPLICATE KEY UPDATE id = 1000000",
    ) {
        Err(mysql::Error::MySqlError(e)) => {
            assert_eq!(e.code, 1235, "{}", e.message);
            assert!(
                e.message.contains("AUTO_INCREMENT column `id`"),
                "{}",
                e.message
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

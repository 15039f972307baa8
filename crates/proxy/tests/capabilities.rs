//! hscale's own statements never depend on the client's capabilities
//! (issue 54): a backend connection carries the client's capabilities that
//! change what the server sends (`FORMAT_CAPABILITIES`), so every path where
//! hscale composes statements of its own runs on connections opened with
//! each set that changes them: multi-statements on and off, DEPRECATE_EOF,
//! FOUND_ROWS, LOCAL_FILES, and all at once. The paths: a write over two
//! backends in autocommit (XA branches opened before their statement) and in
//! a transaction (the two-phase commit's decision and COMMIT), a rollback
//! over both, a scan whose partitions on one backend go as one united query,
//! an aggregate merged over backends, a join of two partitioned tables
//! (looked up across backends), warnings gathered from several backends and
//! read back, and XA RECOVER. Each answer is compared with what MariaDB
//! answers for the same statement on plain tables, to a client with the same
//! capabilities. Recovery runs on hscale's service connections
//! (`ConnKey::service`), whatever a client asked for; crates/proxy/tests/
//! recovery.rs covers it.

use hscale_testkit::raw::{answer, Answer, RawClient};
use hscale_testkit::{cluster, xa_prepared, Proxy};
use hscale_wire::CapabilityFlags as Caps;
use mysql::prelude::Queryable;

const SETS: &[(&str, Caps)] = &[
    ("no capability", Caps::empty()),
    (
        "multi-statements",
        Caps::CLIENT_MULTI_STATEMENTS.union(Caps::CLIENT_MULTI_RESULTS),
    ),
    ("deprecate-EOF", Caps::CLIENT_DEPRECATE_EOF),
    ("found-rows", Caps::CLIENT_FOUND_ROWS),
    ("local-files", Caps::CLIENT_LOCAL_FILES),
    (
        "all of them",
        Caps::CLIENT_MULTI_STATEMENTS
            .union(Caps::CLIENT_MULTI_RESULTS)
            .union(Caps::CLIENT_DEPRECATE_EOF)
            .union(Caps::CLIENT_FOUND_ROWS)
            .union(Caps::CLIENT_LOCAL_FILES),
    ),
];

const STATEMENTS: &[&str] = &[
    // Over every partition, autocommitted: a branch on each backend.
    "INSERT INTO t VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd'), (5, 'e'), (6, 'f')",
    "INSERT INTO u VALUES (1, 10), (2, 20), (3, 30), (4, 40)",
    // A transaction over both backends: the decision, then COMMIT.
    "BEGIN",
    "UPDATE t SET v = 'x' WHERE id IN (1, 2, 3)",
    // Changes nothing: FOUND_ROWS counts the rows it matched.
    "UPDATE t SET v = 'x' WHERE id IN (1, 2, 3)",
    "COMMIT",
    "BEGIN",
    "INSERT INTO t VALUES (7, 'g')",
    "INSERT INTO t VALUES (8, 'h')",
    "ROLLBACK",
    // Two partitions on backend 2: one united query there.
    "SELECT id, v FROM t ORDER BY id",
    "SELECT COUNT(*), SUM(id), MAX(v) FROM t",
    "SELECT t.id, u.w FROM t JOIN u ON u.id = t.id WHERE u.w > 10 ORDER BY t.id",
    // A warning per row, from every backend, then read back.
    "SELECT id, CAST(CONCAT(id, 'x') AS SIGNED) FROM t ORDER BY id",
    "SHOW WARNINGS",
    "XA RECOVER",
];

/// `t` by MOD(3) of id, remainder 0 on backend 1 (the default table), 1 and
/// 2 on backend 2; `u` by MOD(2), odd on backend 2.
fn partitioned_tables(proxy: &Proxy, db: &str) {
    let mut admin = proxy.connect(Some(db));
    for sql in [
        "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))",
        "CREATE TABLE u (id INT PRIMARY KEY, w INT)",
        "HSCALE SETUP_TABLE('t', 'id', 't_default', 1, 'MOD(3)')",
        "HSCALE ADD_PARTITION('t', 'one', 1, 2)",
        "HSCALE ADD_PARTITION('t', 'two', 2, 2)",
        "HSCALE SETUP_TABLE('u', 'id', 'u_default', 1, 'MOD(2)')",
        "HSCALE ADD_PARTITION('u', 'odd', 1, 2)",
    ] {
        admin.query_drop(sql).unwrap();
    }
}

async fn answers(port: u16, db: &str, caps: Caps) -> Vec<Answer> {
    let mut client = RawClient::login_with(port, "root", "", Some(db), caps).await;
    let deprecate_eof = caps.contains(Caps::CLIENT_DEPRECATE_EOF);
    let mut answers = Vec::new();
    for sql in STATEMENTS {
        let frames = client.query_bytes(sql, deprecate_eof).await;
        answers.push(answer(&frames, deprecate_eof));
    }
    answers
}

#[tokio::test]
async fn every_composed_statement_runs_with_every_capability_set() {
    let proxy = tokio::task::spawn_blocking(Proxy::for_cluster)
        .await
        .unwrap();
    let proxy = std::sync::Arc::new(proxy);
    for (i, (name, caps)) in SETS.iter().enumerate() {
        let (db, oracle) = (format!("caps_{i}"), format!("caps_oracle_{i}"));
        let setup = {
            let (proxy, db, oracle) = (proxy.clone(), db.clone(), oracle.clone());
            move || {
                let db = cluster().database(&db);
                let oracle = cluster().database(&oracle);
                partitioned_tables(&proxy, &db);
                let mut direct = cluster().direct(1, Some(&oracle));
                direct
                    .query_drop("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))")
                    .unwrap();
                direct
                    .query_drop("CREATE TABLE u (id INT PRIMARY KEY, w INT)")
                    .unwrap();
                (db, oracle)
            }
        };
        let (db, oracle) = tokio::task::spawn_blocking(setup).await.unwrap();
        let through = answers(proxy.port, &db, *caps).await;
        let direct = answers(cluster().port(1), &oracle, *caps).await;
        for ((sql, got), want) in STATEMENTS.iter().zip(&through).zip(&direct) {
            // Warnings come in the order rows were read, which is the
            // plan's: a partition's after another's through hscale.
            let (got, want) = match *sql == "SHOW WARNINGS" {
                true => (sorted(got), sorted(want)),
                false => (got.clone(), want.clone()),
            };
            assert_eq!(got, want, "{name}: {sql}");
        }
        // The oracle's answers are the ones the statements are about.
        assert!(matches!(direct[0], Answer::Ok { affected_rows: 6 }));
        let found = caps.contains(Caps::CLIENT_FOUND_ROWS);
        assert_eq!(
            direct[4],
            Answer::Ok {
                affected_rows: if found { 3 } else { 0 }
            }
        );
        assert!(matches!(&direct[14], Answer::Rows(rows) if rows.len() == 6));
        let db_check = db.clone();
        tokio::task::spawn_blocking(move || {
            let ids = |backend: usize, table: &str| -> Vec<i32> {
                cluster()
                    .direct(backend, Some(&db_check))
                    .query(format!("SELECT id FROM {table} ORDER BY id"))
                    .unwrap()
            };
            assert_eq!(ids(1, "t_default"), [3, 6]);
            assert_eq!(ids(2, "t_one"), [1, 4]);
            assert_eq!(ids(2, "t_two"), [2, 5]);
            for backend in 1..=2 {
                assert!(
                    xa_prepared(backend).iter().all(|x| !x.contains(':')),
                    "no branch of hscale's left prepared"
                );
            }
        })
        .await
        .unwrap();
    }
}

fn sorted(answer: &Answer) -> Answer {
    match answer {
        Answer::Rows(rows) => {
            let mut rows = rows.clone();
            rows.sort();
            Answer::Rows(rows)
        }
        other => other.clone(),
    }
}

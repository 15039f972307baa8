//! Joins and derived tables answered from copies hold no more than a
//! budget in hscale: the copied rows go to the main backend as they come,
//! held in memory only up to a bound and then in a temporary file. A client
//! that leaves mid-join leaves no temporary table behind. Alone in its
//! binary, so that its RSS is the proxy's.
//!
//! HSCALE_FEDERATED_ROWS sets the rows of each table (300k by default; the
//! issue's 1M x 1M is `HSCALE_FEDERATED_ROWS=1000000`).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hscale_testkit::{cluster, rss_kib, PeakRss, Proxy};
use mysql::prelude::Queryable;

fn rows() -> u64 {
    std::env::var("HSCALE_FEDERATED_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300_000)
}

/// Tables `a` and `b`, each partitioned by MOD(2) of `id` over both
/// backends and filled straight on them, joined by `k`, which no partition
/// column is: every row of `a` has one partner in `b`.
fn setup(db: &str, rows: u64) -> (Proxy, String) {
    let proxy = Proxy::for_cluster();
    let db = cluster().database(db);
    let mut c = proxy.connect(Some(&db));
    for table in ["a", "b"] {
        cluster()
            .direct(1, Some(&db))
            .query_drop(format!(
                "CREATE TABLE {table} (id INT PRIMARY KEY, k INT NOT NULL, pad CHAR(100) NOT NULL, KEY (k))"
            ))
            .unwrap();
        c.query_drop(format!(
            "HSCALE SETUP_TABLE('{table}', 'id', '{table}_default', 1, 'MOD(2)')"
        ))
        .unwrap();
        c.query_drop(format!("HSCALE ADD_PARTITION('{table}', 'p1', 1, 2)"))
            .unwrap();
        for (backend, physical, parity) in [(1, "default", 0), (2, "p1", 1)] {
            cluster()
                .direct(backend, Some(&db))
                .query_drop(format!(
                    "INSERT INTO {table}_{physical} SELECT seq, (seq * 7919) % {rows}, \
                     LPAD(seq, 100, 'x') FROM seq_1_to_{rows} WHERE seq % 2 = {parity}"
                ))
                .unwrap();
        }
    }
    (proxy, db)
}

fn client(proxy: &Proxy, db: &str, sql: &str) -> std::process::Child {
    Command::new("mariadb")
        .args([
            "-h127.0.0.1",
            &format!("-P{}", proxy.port),
            "-uroot",
            "--batch",
            "--skip-column-names",
            db,
            "-e",
            sql,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mariadb client")
}

#[test]
fn large_copies_hold_bounded_memory_and_a_client_that_leaves_leaves_none() {
    let rows = rows();
    let (proxy, db) = setup("federated_memory", rows);
    let peak = PeakRss::start();
    let run = |sql: &str| {
        let started = Instant::now();
        let output = client(&proxy, &db, sql).wait_with_output().unwrap();
        let answer = String::from_utf8_lossy(&output.stdout).trim().to_string();
        assert!(
            output.status.success(),
            "{sql}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        println!(
            "{sql}: {answer} in {:?}, RSS {} MiB",
            started.elapsed(),
            rss_kib() / 1024
        );
        answer
    };
    // Every row of `a` meets its partner: k is a permutation of the ids.
    let joined =
        run("SELECT COUNT(*), SUM(LENGTH(a.pad) + LENGTH(b.pad)) FROM a JOIN b ON a.k = b.k");
    assert_eq!(joined, format!("{rows}\t{}", rows * 200));
    let derived = run("SELECT COUNT(*), MAX(n) FROM (SELECT k, COUNT(*) n FROM a GROUP BY k) d");
    assert_eq!(derived, format!("{rows}\t1"));
    let grown_mib = peak.grown_mib();
    println!("proxy RSS grew by {grown_mib} MiB copying 2 x {rows} rows of ~110 bytes");
    assert!(grown_mib < 100, "RSS grew by {grown_mib} MiB");

    // A client that leaves mid-join (while the copies are read, written,
    // or the join runs) leaves nothing behind on any connection hscale
    // pools: a copy left there would stand in for its table, and the next
    // statement copying that table on the connection would fail (1050).
    for wait_ms in [150, 600, 1500] {
        let mut leaving = client(
            &proxy,
            &db,
            "SELECT a.id, b.id FROM a JOIN b ON a.k = b.k ORDER BY a.id",
        );
        std::thread::sleep(Duration::from_millis(wait_ms));
        leaving.kill().unwrap();
        leaving.wait().unwrap();
        // Clients at once take every connection the pool has to the main
        // backend: each copies both tables on its own.
        let answers: Vec<u64> = std::thread::scope(|scope| {
            let joins: Vec<_> = (0..6)
                .map(|_| {
                    scope.spawn(|| {
                        let mut c = proxy.connect(Some(&db));
                        c.query_first::<u64, _>(
                            "SELECT COUNT(*) FROM a JOIN b ON a.k = b.k WHERE a.id <= 1000",
                        )
                        .unwrap()
                        .unwrap()
                    })
                })
                .collect();
            joins.into_iter().map(|j| j.join().unwrap()).collect()
        });
        assert_eq!(answers, [1000; 6], "after a client left at {wait_ms} ms");
    }
}

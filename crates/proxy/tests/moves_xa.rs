//! Moves under two-phase transactions (issue 53): bank transfers between
//! accounts on two backends commit with XA while a partition moves, splits,
//! is added or dropped, through several instances; an instance dies between
//! its PREPARE and its decision, and the instance running the move is
//! killed at a random moment. Money is neither made nor lost, every
//! acknowledged transfer is there once, checked on the backends directly,
//! and no branch is left prepared.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hscale_testkit::{cluster, xa_prepared, Proxy, Serve};
use mysql::prelude::Queryable;
use mysql::Conn;
use rand::{Rng, SeedableRng};

const ACCOUNTS: i64 = 3000;
const OPENING: i64 = 1000;

/// A transfer as one transaction; whether it committed, `None` where the
/// connection went away at its COMMIT (its outcome is recovery's).
fn transfer(conn: &mut Conn, from: i64, to: i64, amount: i64) -> Option<bool> {
    let statements = [
        format!("UPDATE accounts SET balance = balance - {amount} WHERE id = {from}"),
        format!("UPDATE accounts SET balance = balance + {amount} WHERE id = {to}"),
    ];
    let before = conn
        .query_drop("BEGIN")
        .and_then(|_| statements.iter().try_for_each(|sql| conn.query_drop(sql)));
    if let Err(e) = before {
        if matches!(e, mysql::Error::MySqlError(_)) {
            let _ = conn.query_drop("ROLLBACK");
            return Some(false);
        }
        return None;
    }
    match conn.query_drop("COMMIT") {
        Ok(()) => Some(true),
        Err(mysql::Error::MySqlError(e)) => panic!("a COMMIT refused: {e}"),
        Err(_) => None,
    }
}

/// What the clients saw committed: each account's change.
#[derive(Default)]
struct Ledger {
    changes: BTreeMap<i64, i64>,
    transfers: usize,
}

impl Ledger {
    fn record(&mut self, from: i64, to: i64, amount: i64) {
        *self.changes.entry(from).or_default() -= amount;
        *self.changes.entry(to).or_default() += amount;
        self.transfers += 1;
    }

    fn join(&mut self, other: Ledger) {
        for (id, change) in other.changes {
            *self.changes.entry(id).or_default() += change;
        }
        self.transfers += other.transfers;
    }
}

/// A client transferring between random accounts until `stop`.
fn transfers(mut conn: Conn, seed: u64, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Ledger> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    std::thread::spawn(move || {
        let mut ledger = Ledger::default();
        while !stop.load(Ordering::Relaxed) {
            let (from, to) = (
                rng.random_range(1..=ACCOUNTS),
                rng.random_range(1..=ACCOUNTS),
            );
            let amount = rng.random_range(1..100);
            if from == to {
                continue;
            }
            match transfer(&mut conn, from, to, amount) {
                Some(true) => ledger.record(from, to, amount),
                Some(false) => {}
                None => panic!("a client of a live instance lost its connection"),
            }
        }
        ledger
    })
}

/// What a run does, and the statement of its job: the rows go to the
/// backend of the transfers' other branch, or to the third backend.
fn work_of(rng: &mut impl Rng) -> (&'static str, &'static str) {
    const WORKS: [(&str, &str); 7] = [
        ("add", "HSCALE ADD_PARTITION('accounts', 'p3', 3, 2)"),
        (
            "add to a third",
            "HSCALE ADD_PARTITION('accounts', 'p3', 3, 3)",
        ),
        (
            "split",
            "HSCALE SPLIT_PARTITION('accounts', 'p1', 'p2', 2, 1)",
        ),
        ("move", "HSCALE MOVE_PARTITION('accounts', 'p1', 1)"),
        (
            "move to a third",
            "HSCALE MOVE_PARTITION('accounts', 'p1', 3)",
        ),
        (
            "move default",
            "HSCALE MOVE_PARTITION('accounts', '(default)', 2)",
        ),
        ("drop", "HSCALE DROP_PARTITION('accounts', 'p1')"),
    ];
    WORKS[rng.random_range(0..WORKS.len())]
}

#[test]
fn transfers_over_two_backends_lose_and_invent_nothing_while_partitions_move() {
    // A third backend, which no transfer writes before a job moves rows
    // there.
    hscale_testkit::cluster_of(3);
    hscale_testkit::seeded_runs("XA_MOVE", 5, xa_move_run);
}

/// One run; what it did.
fn xa_move_run(run: u64, seed: u64) -> String {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (work, job_sql) = work_of(&mut rng);
    let failpoint = ["xa_after_prepare", "xa_after_decision"][rng.random_range(0..2)];
    let kill_mover_after = rng
        .random_bool(0.5)
        .then(|| Duration::from_millis(rng.random_range(0..2500)));
    let context = format!(
        "seed {seed} (HSCALE_XA_MOVE_SEED={seed} HSCALE_XA_MOVE_RUNS=1), {work}, {failpoint}, mover killed after {kill_mover_after:?}"
    );
    println!("run {run}: {context}");
    let db = cluster().database(&format!("moves_xa_{run}"));
    cluster()
        .direct(1, Some(&db))
        .query_drop("CREATE TABLE accounts (id INT PRIMARY KEY, balance BIGINT NOT NULL)")
        .unwrap();
    // Values 0 and 3 in the default table on backend 1, 1 and 2 in p1 on
    // backend 2: most transfers write both backends.
    let (first, second) = (Proxy::for_cluster(), Proxy::for_cluster());
    let mut admin = first.connect(Some(&db));
    for sql in [
        "HSCALE SETUP_TABLE('accounts', 'id', 'accounts_default', 1, 'MOD(4)')",
        "HSCALE ADD_PARTITION('accounts', 'p1', 1, 2)",
        "HSCALE ADD_PARTITION('accounts', 'p1', 2, 2)",
    ] {
        admin.query_drop(sql).unwrap();
    }
    hscale_testkit::open_accounts(&mut admin, ACCOUNTS, OPENING);
    let mut main = cluster().direct(1, None);
    let earlier = hscale_testkit::last_job(&mut main, &db).map_or(0, |(id, _, _)| id);

    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..4u64)
        .map(|c| {
            let proxy = if c % 2 == 0 { &first } else { &second };
            transfers(proxy.connect(Some(&db)), seed ^ (c + 1), Arc::clone(&stop))
        })
        .collect();

    let mover = Serve::start(
        env!("CARGO_BIN_EXE_hscale"),
        &format!("moves_xa_mover_{run}"),
        "",
        "[moves]\nrows_per_s = 3000\n",
        "hscale",
    );
    let mut on_mover = mover.connect(&db);
    let job_client = std::thread::spawn(move || on_mover.query_drop(job_sql));
    let started = Instant::now();
    while hscale_testkit::last_job(&mut main, &db).is_none_or(|(id, _, _)| id <= earlier) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no job: {context}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }

    // An instance that dies at its first two-phase commit, between its
    // PREPARE and its decision or just after the decision.
    let mut victim = Serve::start(
        env!("CARGO_BIN_EXE_hscale"),
        &format!("moves_xa_victim_{run}"),
        failpoint,
        "",
        "hscale",
    );
    let mut on_victim = victim.connect(&db);
    let mut victims_transfer = None;
    let mut victim_ledger = Ledger::default();
    let mut mover = Some(mover);
    let killing = Instant::now();
    loop {
        if let Some(after) = kill_mover_after {
            if killing.elapsed() >= after {
                if let Some(mut mover) = mover.take() {
                    mover.kill();
                }
            }
        }
        let ended = hscale_testkit::last_job(&mut main, &db)
            .is_some_and(|(_, phase, _)| matches!(phase.as_str(), "done" | "failed" | "cancelled"));
        if ended {
            break;
        }
        if victims_transfer.is_none() {
            // From the default table (value 0) to p1 (value 1): two backends
            // while neither has moved onto the other's.
            let from = rng.random_range(0..ACCOUNTS / 4) * 4 + 4;
            let to = rng.random_range(0..ACCOUNTS / 4) * 4 + 1;
            match transfer(&mut on_victim, from, to, 7) {
                Some(true) => victim_ledger.record(from, to, 7),
                Some(false) => {}
                None => victims_transfer = Some((from, to)),
            }
        } else {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            killing.elapsed() < Duration::from_secs(180),
            "the job does not end: {:?}, {context}",
            hscale_testkit::last_job(&mut main, &db)
        );
    }
    let (job, phase, error) = hscale_testkit::last_job(&mut main, &db).unwrap();
    assert_eq!(phase, "done", "job {job}: {error:?}, {context}");
    drop(mover);
    let _ = job_client.join();
    stop.store(true, Ordering::Relaxed);
    let mut ledger = Ledger::default();
    for client in clients {
        ledger.join(client.join().unwrap());
    }
    ledger.join(victim_ledger);
    assert!(
        victim.has_ended() || victims_transfer.is_none(),
        "{context}"
    );
    // Recovery ends the dead instance's branch as its decision says.
    let deadline = Instant::now() + Duration::from_secs(30);
    while (1..=3).any(|b| !xa_prepared(b).is_empty()) {
        assert!(
            Instant::now() < deadline,
            "branches left prepared: {:?}, {context}",
            (1..=3).map(xa_prepared).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    if let Some((from, to)) = victims_transfer {
        if failpoint == "xa_after_decision" {
            ledger.record(from, to, 7);
        }
    }
    drop(victim);

    let through: Vec<(i64, i64)> = admin
        .query("SELECT id, balance FROM accounts ORDER BY id")
        .unwrap();
    let total: i64 = through.iter().map(|(_, b)| b).sum();
    assert_eq!(total, ACCOUNTS * OPENING, "money made or lost: {context}");
    let expected: Vec<(i64, i64)> = (1..=ACCOUNTS)
        .map(|id| (id, OPENING + ledger.changes.get(&id).copied().unwrap_or(0)))
        .collect();
    let differ: Vec<_> = through
        .iter()
        .zip(&expected)
        .filter(|(got, want)| got != want)
        .take(10)
        .collect();
    assert!(
        differ.is_empty(),
        "balances (got, acknowledged): {differ:?}, {context}"
    );
    assert_eq!(through.len(), expected.len(), "{context}");
    // On the backends: every account in one physical table, as acknowledged.
    let mut physical = BTreeMap::new();
    for backend in 1..=3 {
        let mut conn = cluster().direct(backend, Some(&db));
        let tables: Vec<String> = conn.query("SHOW TABLES LIKE 'accounts%'").unwrap();
        for table in tables {
            let rows: Vec<(i64, i64)> = conn
                .query(format!("SELECT id, balance FROM `{table}`"))
                .unwrap();
            for (id, balance) in rows {
                let twice = physical.insert(id, (balance, table.clone()));
                assert!(
                    twice.is_none(),
                    "account {id} in two tables: {twice:?} and {table}, {context}"
                );
            }
        }
    }
    let on_backends: Vec<(i64, i64)> = physical.iter().map(|(id, (b, _))| (*id, *b)).collect();
    assert_eq!(on_backends, expected, "{context}");
    format!(
        "{work}/{failpoint}/mover killed: {}/victim died: {}: {} transfers",
        kill_mover_after.is_some(),
        victims_transfer.is_some(),
        ledger.transfers
    )
}

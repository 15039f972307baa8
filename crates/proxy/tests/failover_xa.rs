//! Failover under two-phase transfers (issue 57): bank transfers between
//! accounts on two backends, each a replica set of three (GTID,
//! semi-synchronous), through two `hscale serve` instances, one of them
//! pausing in every two-phase commit (after its PREPARE, or after its
//! decision) so that the kill lands inside commits. One backend's primary
//! is killed (SIGKILL) at a seeded moment; one instance promotes the most
//! advanced replica. Then, checked on the backends directly:
//! money is neither made nor lost, every acknowledged transfer is there
//! exactly once and every refused one is not, no XA branch stays prepared,
//! and the old primary, restarted, is fenced and never written. In some
//! runs a partition moves off or onto backend 2 meanwhile: the move waits
//! for the new writer, starts its copy again there, and ends. In others
//! the primary killed is backend 1's, the dictionary's: the decisions,
//! leases and recovery fail over with it.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hscale_testkit::replicas::ReplicaSet;
use hscale_testkit::{wait_for, Serve};
use mysql::prelude::Queryable;
use mysql::Conn;
use rand::{Rng, SeedableRng};

/// Two chunks of a move's copy per partition.
const ACCOUNTS: i64 = 4000;
const OPENING: i64 = 1000;
const PASSWORD: &str = "app-pw";
/// The COMMIT errors whose outcome is unknown: hscale's, where recovery
/// commits everywhere or nowhere, and the server's lost connection (a
/// transaction on one backend whose COMMIT went out and whose answer died
/// with the server: semi-sync may have carried it to the new writer).
const ER_OUTCOME_UNKNOWN: u16 = 1180;
const CR_SERVER_LOST: u16 = 2013;

/// What one client saw of its transfers: each one's id, accounts and
/// amount, by outcome.
#[derive(Default)]
struct Outcomes {
    acknowledged: Vec<Transfer>,
    /// Each acknowledged transfer's start and end.
    timed: Vec<(Instant, Instant)>,
    /// With the error each got.
    refused: Vec<(Transfer, String)>,
    /// COMMIT answered 1180: recovery commits it everywhere or nowhere.
    unknown: Vec<Transfer>,
    /// Errors other than deadlocks, by message.
    errors: Vec<String>,
}

#[derive(Clone, Copy, Debug)]
struct Transfer {
    id: u64,
    from: i64,
    to: i64,
    amount: i64,
}

impl Transfer {
    /// Whether it writes `backend`: even ids, accounts and transfers, are
    /// on backend 1, odd ones on backend 2 (but while a move takes them
    /// elsewhere).
    fn writes(&self, backend: u32) -> bool {
        let odd = u32::from(backend == 2);
        [self.from, self.to, self.id as i64]
            .iter()
            .any(|id| id.rem_euclid(2) as u32 == odd)
    }
}

enum Outcome {
    Committed,
    Refused(String),
    Unknown,
}

/// One transfer as one transaction that also records its id (partitioned
/// like the accounts: on either backend).
fn transfer(conn: &mut Conn, t: Transfer) -> Outcome {
    let statements = [
        format!(
            "UPDATE accounts SET balance = balance - {} WHERE id = {}",
            t.amount, t.from
        ),
        format!(
            "UPDATE accounts SET balance = balance + {} WHERE id = {}",
            t.amount, t.to
        ),
        format!("INSERT INTO transfers VALUES ({}, {})", t.id, t.amount),
    ];
    let before = conn
        .query_drop("BEGIN")
        .and_then(|_| statements.iter().try_for_each(|sql| conn.query_drop(sql)));
    if let Err(e) = before {
        let _ = conn.query_drop("ROLLBACK");
        return Outcome::Refused(e.to_string());
    }
    match conn.query_drop("COMMIT") {
        Ok(()) => Outcome::Committed,
        Err(mysql::Error::MySqlError(e))
            if e.code == ER_OUTCOME_UNKNOWN || e.code == CR_SERVER_LOST =>
        {
            Outcome::Unknown
        }
        Err(e) => Outcome::Refused(e.to_string()),
    }
}

/// A client transferring between random accounts until `stop`; `done`
/// counts the acknowledged transfers of every client.
fn transfers(
    mut conn: Conn,
    client: u64,
    seed: u64,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) -> std::thread::JoinHandle<Outcomes> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    std::thread::spawn(move || {
        let mut outcomes = Outcomes::default();
        let mut id = client * 1_000_000;
        while !stop.load(Ordering::Relaxed) {
            let (from, to) = (
                rng.random_range(1..=ACCOUNTS),
                rng.random_range(1..=ACCOUNTS),
            );
            if from == to {
                continue;
            }
            id += 1;
            let t = Transfer {
                id,
                from,
                to,
                amount: rng.random_range(1..100),
            };
            let started = Instant::now();
            match transfer(&mut conn, t) {
                Outcome::Committed => {
                    outcomes.acknowledged.push(t);
                    outcomes.timed.push((started, Instant::now()));
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Outcome::Unknown => outcomes.unknown.push(t),
                Outcome::Refused(e) => {
                    if !e.contains("ERROR 1213") {
                        outcomes.errors.push(e.clone());
                    }
                    outcomes.refused.push((t, e));
                }
            }
        }
        outcomes
    })
}

/// A setting the benchmark (bench/replicas.sh) gives as hscale's defaults;
/// the test's own value is shorter, to run fast.
fn setting(var: &str, test_value: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(test_value)
}

/// The configuration of one instance over the two replica sets, backends
/// 1 (the dictionary's) and 2, each failing over by itself a second after
/// its writer goes (`HSCALE_FAILOVER_AFTER_MS`), their hosts checked every
/// 50 ms (`HSCALE_MONITOR_MS`), the dictionary's lease 2 s
/// (`HSCALE_LEASE_MS`).
fn instance_config(sets: &[ReplicaSet; 2], db: &str, port: u16) -> String {
    let monitor_ms = setting("HSCALE_MONITOR_MS", 50);
    let failover_after_ms = setting("HSCALE_FAILOVER_AFTER_MS", 1000);
    let lease_ms = setting("HSCALE_LEASE_MS", 2000);
    let backends: String = (1u32..)
        .zip(sets)
        .map(|(id, set)| {
            let replicas: Vec<String> = (1..set.servers.len())
                .map(|h| format!("\"{}\"", set.address(h)))
                .collect();
            format!(
                r#"[[backends]]
id = {id}
address = "{primary}"
replicas = [{replicas}]
user = "root"
failover = "auto"
failover_after_ms = {failover_after_ms}
failover_wait_ms = 20000

"#,
                primary = set.address(0),
                replicas = replicas.join(", "),
            )
        })
        .collect();
    format!(
        r#"[proxy]
listen = "127.0.0.1:{port}"
connect_timeout_ms = 1000
monitor_ms = {monitor_ms}

[[users]]
name = "root"
password = ""
admin = true

[[users]]
name = "{db}"
password = "{PASSWORD}"

{backends}[moves]
rows_per_s = 1000

[dictionary]
schema = "hscale"
refresh_ms = 50
lease_ms = {lease_ms}

[log]
level = "warn"
"#
    )
}

/// The rows of the physical tables named `prefix%` in `db` on a server.
fn physical(conn: &mut Conn, db: &str, prefix: &str) -> Vec<(i64, i64)> {
    conn.query_drop(format!("USE `{db}`")).unwrap();
    let tables: Vec<String> = conn.query(format!("SHOW TABLES LIKE '{prefix}%'")).unwrap();
    tables
        .iter()
        .flat_map(|table| {
            conn.query::<(i64, i64), _>(format!("SELECT * FROM `{table}`"))
                .unwrap()
        })
        .collect()
}

fn prepared(conn: &mut Conn) -> Vec<String> {
    let rows: Vec<(u32, u32, u32, Vec<u8>)> = conn.query("XA RECOVER").unwrap();
    rows.into_iter()
        .map(|(_, _, _, data)| String::from_utf8_lossy(&data).into_owned())
        .collect()
}

/// A backend's roles as an instance lists them.
fn roles(instance: &Serve, backend: u32, db: &str) -> Vec<String> {
    let rows: Vec<mysql::Row> = instance.connect(db).query("HSCALE SHOW_BACKENDS").unwrap();
    rows.into_iter()
        .filter(|r| r.get::<u32, _>("backend") == Some(backend))
        .map(|r| r.get("role").unwrap())
        .collect()
}

#[test]
fn transfers_over_a_failover_lose_nothing_acknowledged_and_leave_no_branch_prepared() {
    hscale_testkit::seeded_runs("FAILOVER", 2, failover_run);
}

/// One run; what it saw.
fn failover_run(run: u64, seed: u64) -> String {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let failpoint = ["xa_after_prepare:200", "xa_after_decision:200"][rng.random_range(0..2)];
    let kill_after: u64 = rng.random_range(5..60);
    // Backend 1's primary is the dictionary's.
    let victim: u32 = [1, 2, 2][rng.random_range(0..3)];
    // Backend 2's part may carry the decision (a plain part, with the
    // grant), else every part is an XA branch and the dictionary has it.
    let carried = rng.random_bool(0.5);
    // Moves keep their jobs in the dictionary, read here from backend 1's
    // primary, which lives in these runs.
    let moving = [
        None,
        Some("HSCALE MOVE_PARTITION('accounts', 'p1', 1)"),
        Some("HSCALE MOVE_PARTITION('accounts', '(default)', 2)"),
    ][rng.random_range(0..3)]
    .filter(|_| victim == 2);
    let context = format!(
        "seed {seed} (HSCALE_FAILOVER_SEED={seed} HSCALE_FAILOVER_RUNS=1), {failpoint}, backend {victim}'s primary killed after {kill_after} transfers, decision carried on backend 2: {carried}, {moving:?}"
    );
    println!("run {run}: {context}");
    let db = format!("failover_xa_{run}");
    let mut sets = [
        ReplicaSet::start(&format!("{db}_1"), 3),
        ReplicaSet::start(&format!("{db}_2"), 3),
    ];
    for set in &sets {
        set.direct(0, None)
            .query_drop(format!("CREATE DATABASE `{db}`"))
            .unwrap();
        set.account(&db, PASSWORD, &db);
    }
    // The default tables' backend.
    let mut first = sets[0].direct(0, Some(&db));
    for table in [
        "accounts (id INT PRIMARY KEY, balance BIGINT NOT NULL)",
        "transfers (id BIGINT PRIMARY KEY, amount INT NOT NULL)",
    ] {
        first.query_drop(format!("CREATE TABLE {table}")).unwrap();
    }

    let binary = env!("CARGO_BIN_EXE_hscale");
    let pausing = Serve::with_config(binary, &format!("{db}_a"), failpoint, |port| {
        instance_config(&sets, &db, port)
    });
    let plain = Serve::with_config(binary, &format!("{db}_b"), "", |port| {
        instance_config(&sets, &db, port)
    });
    let mut admin = plain.connect(&db);
    for table in ["accounts", "transfers"] {
        // Even ids on backend 1, odd ones on backend 2.
        for sql in [
            format!("HSCALE SETUP_TABLE('{table}', 'id', '{table}_default', 1, 'MOD(2)')"),
            format!("HSCALE ADD_PARTITION('{table}', 'p1', 1, 2)"),
        ] {
            admin.query_drop(sql).unwrap();
        }
    }
    hscale_testkit::open_accounts(&mut admin, ACCOUNTS, OPENING);
    for instance in [&pausing, &plain] {
        for backend in [1, 2] {
            wait_for("the replica sets' roles", Duration::from_secs(20), || {
                (roles(instance, backend, &db) == ["writer", "replica", "replica"]).then_some(())
            });
        }
    }
    if carried {
        // Recovery makes the table on its first pass.
        let mut second = sets[1].direct(0, None);
        wait_for("the decisions table", Duration::from_secs(20), || {
            let tables: Vec<String> = second
                .query("SHOW TABLES FROM hscale LIKE 'xa_decisions'")
                .ok()?;
            (!tables.is_empty()).then_some(())
        });
        for host in ["localhost", "127.0.0.1"] {
            second
                .query_drop(format!(
                    "GRANT INSERT ON hscale.xa_decisions TO '{db}'@'{host}'"
                ))
                .unwrap();
        }
        for host in 1..3 {
            sets[1].catch_up(host, 0);
        }
    }

    let mut dictionary = sets[0].direct(0, None);
    let job = moving.map(|sql| {
        let mut on_plain = plain.connect(&db);
        let job = std::thread::spawn(move || on_plain.query_drop(sql));
        wait_for("the move's job", Duration::from_secs(30), || {
            hscale_testkit::last_job(&mut dictionary, &db)
        });
        job
    });
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..4u64)
        .map(|c| {
            let instance = if c % 2 == 0 { &pausing } else { &plain };
            let conn = instance.connect_as(&db, PASSWORD, &db);
            transfers(conn, c + 1, seed ^ (c + 1), stop.clone(), done.clone())
        })
        .collect();
    if job.is_some() {
        // Into the copy: its checkpoint holds positions in the source's
        // binary log.
        wait_for("the move's first chunk", Duration::from_secs(60), || {
            let copied: Option<u64> = dictionary
                .exec_first(
                    "SELECT rows_copied FROM hscale.moves WHERE db = ? ORDER BY id DESC LIMIT 1",
                    (&db,),
                )
                .unwrap();
            copied.filter(|&rows| rows > 0)
        });
    }
    let before = done.load(Ordering::Relaxed);
    wait_for("transfers before the kill", Duration::from_secs(60), || {
        (done.load(Ordering::Relaxed) >= before + kill_after).then_some(())
    });
    let killed = Instant::now();
    let phase_at_kill = job
        .as_ref()
        .and_then(|_| hscale_testkit::last_job(&mut dictionary, &db))
        .map(|(_, phase, _)| phase);
    let lost = &mut sets[victim as usize - 1];
    lost.servers[0].kill();
    let (writer, seen_after) = wait_for("a promoted replica", Duration::from_secs(30), || {
        let roles = roles(&plain, victim, &db);
        let writer = roles
            .iter()
            .position(|r| r == "writer")
            .filter(|&w| w != 0)?;
        Some((writer, killed.elapsed()))
    });
    // The writers now, by backend.
    let writers = match victim {
        1 => [writer, 0],
        _ => [0, writer],
    };
    let on_writer = |backend: usize, db: Option<&str>| sets[backend].direct(writers[backend], db);
    // The lost writer's prepared branches, replicated: recovery's to end.
    let inherited = prepared(&mut on_writer(victim as usize - 1, None)).len();
    let at_failover = done.load(Ordering::Relaxed);
    wait_for(
        "transfers after the failover",
        Duration::from_secs(60),
        || (done.load(Ordering::Relaxed) >= at_failover + 20).then_some(()),
    );
    if let Some(job) = job {
        let answered = job.join().unwrap();
        let (id, phase, error) = wait_for("the move's end", Duration::from_secs(60), || {
            hscale_testkit::last_job(&mut dictionary, &db)
                .filter(|(_, phase, _)| matches!(phase.as_str(), "done" | "failed" | "cancelled"))
        });
        assert_eq!(
            phase, "done",
            "job {id}: {error:?}, answered {answered:?}, {context}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    let mut all = Outcomes::default();
    for client in clients {
        let outcomes = client.join().unwrap();
        all.acknowledged.extend(outcomes.acknowledged);
        all.timed.extend(outcomes.timed);
        all.refused.extend(outcomes.refused);
        all.unknown.extend(outcomes.unknown);
        all.errors.extend(outcomes.errors);
    }

    // Writes to the failed backend resume with its new writer: the first
    // transfer there begun after the kill; and on the other backend alone
    // none waited meanwhile (but where it needs the dictionary, on
    // backend 1).
    let timed = || all.acknowledged.iter().zip(&all.timed);
    let resumed = timed()
        .filter(|(t, (start, _))| *start >= killed && t.writes(victim))
        .map(|(_, (_, end))| *end - killed)
        .min()
        .expect("a transfer on the failed backend after the kill");
    let elsewhere = timed()
        .filter(|(t, (start, end))| {
            !t.writes(victim) && *end >= killed && *start <= killed + resumed
        })
        .map(|(_, (start, end))| *end - *start)
        .max();
    println!(
        "failover: resumed_ms={} other_backend_longest_ms={}",
        resumed.as_millis(),
        elsewhere.map_or(0, |e| e.as_millis())
    );

    // Recovery resolves every branch, the lost primary's on the new writer,
    // and the replicas follow.
    wait_for("no branch prepared", Duration::from_secs(30), || {
        let mut left = prepared(&mut on_writer(0, None));
        left.extend(prepared(&mut on_writer(1, None)));
        left.is_empty().then_some(())
    });
    for (backend, set) in sets.iter().enumerate() {
        let alive = (0..3).filter(|&h| !(backend + 1 == victim as usize && h == 0));
        for host in alive.filter(|&h| h != writers[backend]) {
            set.catch_up(host, writers[backend]);
            assert!(
                prepared(&mut set.direct(host, None)).is_empty(),
                "a branch prepared on backend {} host {host}: {context}",
                backend + 1
            );
        }
    }

    // On the backends' writers directly: the transfers that committed,
    // each once.
    let on_both = |prefix: &str| {
        let mut rows = physical(&mut on_writer(0, None), &db, prefix);
        rows.extend(physical(&mut on_writer(1, None), &db, prefix));
        rows
    };
    let recorded = on_both("transfers");
    let committed: HashSet<u64> = recorded.iter().map(|&(id, _)| id as u64).collect();
    assert_eq!(
        committed.len(),
        recorded.len(),
        "a transfer twice: {context}"
    );
    let lost: Vec<u64> = all
        .acknowledged
        .iter()
        .map(|t| t.id)
        .filter(|id| !committed.contains(id))
        .collect();
    assert!(
        lost.is_empty(),
        "acknowledged and lost: {lost:?}, {context}"
    );
    let invented: Vec<&(Transfer, String)> = all
        .refused
        .iter()
        .filter(|(t, _)| committed.contains(&t.id))
        .collect();
    assert!(
        invented.is_empty(),
        "refused and committed: {invented:?}, {context}"
    );
    // Balances are exactly the committed transfers' sums.
    let mut expected: BTreeMap<i64, i64> = (1..=ACCOUNTS).map(|id| (id, OPENING)).collect();
    let known = all
        .acknowledged
        .iter()
        .chain(&all.unknown)
        .chain(all.refused.iter().map(|(t, _)| t));
    for t in known.filter(|t| committed.contains(&t.id)) {
        *expected.get_mut(&t.from).unwrap() -= t.amount;
        *expected.get_mut(&t.to).unwrap() += t.amount;
    }
    let balances = on_both("accounts");
    let count = balances.len();
    let balances: BTreeMap<i64, i64> = balances.into_iter().collect();
    assert_eq!(count, balances.len(), "an account in two tables: {context}");
    assert_eq!(
        balances.values().sum::<i64>(),
        ACCOUNTS * OPENING,
        "money made or lost: {context}"
    );
    assert_eq!(balances, expected, "balances: {context}");
    assert!(
        all.errors.iter().all(|e| e.contains("ERROR 2013")),
        "failed otherwise than lost with the server: {:?}, {context}",
        all.errors
    );

    // The old primary comes back writable: fenced, made read-only, and no
    // transfer reaches it.
    let lost = &mut sets[victim as usize - 1];
    lost.servers[0].restart().unwrap();
    let position = |set: &ReplicaSet| -> String {
        set.direct(0, None)
            .query_first("SELECT @@global.gtid_binlog_pos")
            .unwrap()
            .unwrap()
    };
    let left_at = position(lost);
    wait_for("the old primary read-only", Duration::from_secs(30), || {
        let read_only: u8 = lost
            .direct(0, None)
            .query_first("SELECT @@read_only")
            .ok()??;
        (read_only == 1).then_some(())
    });
    let mut after = plain.connect_as(&db, PASSWORD, &db);
    for id in 0..10 {
        after
            .query_drop(format!(
                "INSERT INTO transfers VALUES ({}, 0)",
                9_000_000 + id
            ))
            .unwrap();
    }
    assert_eq!(
        position(lost),
        left_at,
        "the old primary was written: {context}"
    );
    format!(
        "{failpoint}/backend {victim} failed/carried: {carried}/{moving:?} at {phase_at_kill:?}: writer {writer} seen {seen_after:?} after the kill, writes resumed after {resumed:?} (the other backend alone: {elsewhere:?} at most), with {inherited} branches prepared; {} acknowledged, {} refused, {} unknown ({} committed)",
        all.acknowledged.len(),
        all.refused.len(),
        all.unknown.len(),
        all.unknown.iter().filter(|t| committed.contains(&t.id)).count()
    )
}

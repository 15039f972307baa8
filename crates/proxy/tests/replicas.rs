//! Backends that are replica sets (docs/replicas.md): three MariaDB servers
//! with GTID replication, the writer the one host whose read_only is off.
//! hscale follows a failover made elsewhere, refuses writes while two hosts
//! are writable, holds statements while none is, and sends the reads of a
//! user who asks to replicas that are in step.

use std::time::Duration;

use hscale::config::{Config, Reads, UserConfig};
use hscale_testkit::replicas::ReplicaSet;
use hscale_testkit::{cluster, error_of, wait_for, Proxy};
use mysql::prelude::Queryable;
use mysql::Conn;

/// Backend 1 is the shared cluster's first server (the dictionary's); backend
/// 2 the replica set, whose database `db` holds `t`, partitioned with its
/// default table there; a user named as the database (no SUPER: read_only
/// refuses its writes) logs in through hscale.
fn proxy_over(set: &ReplicaSet, db: &str, failover_wait_ms: u64, reads: Reads) -> Proxy {
    proxy_with(set, db, failover_wait_ms, reads, |_| {})
}

/// `proxy_over`, with `more` done to backend 2's configuration.
fn proxy_with(
    set: &ReplicaSet,
    db: &str,
    failover_wait_ms: u64,
    reads: Reads,
    more: impl FnOnce(&mut hscale::config::BackendConfig),
) -> Proxy {
    prepare(set, db);
    let proxy = Proxy::start(config_for(set, db, failover_wait_ms, reads, more));
    let mut admin = proxy.connect(Some(db));
    admin
        .query_drop("HSCALE SETUP_TABLE('t', 'id', 't_default', 2, 'MOD(2)')")
        .unwrap();
    proxy
}

/// The database `db` with `t` on the set and the cluster, and its user on
/// both.
fn prepare(set: &ReplicaSet, db: &str) {
    cluster().database(db);
    cluster().account(db, "app-pw", db, None);
    let mut primary = set.direct(0, None);
    primary
        .query_drop(format!("CREATE DATABASE `{db}`"))
        .unwrap();
    primary
        .query_drop(format!(
            "CREATE TABLE `{db}`.t (id INT PRIMARY KEY, v INT NOT NULL)"
        ))
        .unwrap();
    set.account(db, "app-pw", db);
}

/// The configuration of an instance over the cluster's first server and
/// the set.
fn config_for(
    set: &ReplicaSet,
    db: &str,
    failover_wait_ms: u64,
    reads: Reads,
    more: impl FnOnce(&mut hscale::config::BackendConfig),
) -> Config {
    let mut config: Config = cluster().config();
    // A dictionary of the test's own: each test's set is its backend 2, and
    // instances that share a dictionary take its switchovers and fences,
    // which name backends by id, for their own backend 2's.
    config.dictionary.schema = format!("hscale_{db}");
    config.backends.truncate(1);
    let mut backend = set.backend(2);
    backend.failover_wait_ms = failover_wait_ms;
    more(&mut backend);
    config.backends.push(backend);
    config.proxy.monitor_ms = 50;
    config.users.push(UserConfig {
        name: db.into(),
        password: "app-pw".into(),
        reads,
        max_lag_ms: 5000,
        ..Default::default()
    });
    config
}

/// A replica set of three named `db`, hscale over it, and the writer and
/// replicas seen.
fn started(db: &str, failover_wait_ms: u64, reads: Reads) -> (ReplicaSet, Proxy) {
    let set = ReplicaSet::start(db, 3);
    let proxy = proxy_over(&set, db, failover_wait_ms, reads);
    wait_for_roles(&proxy, &set, ["writer", "replica", "replica"]);
    (set, proxy)
}

fn app(proxy: &Proxy, db: &str) -> Conn {
    hscale_testkit::connect(proxy.port, db, "app-pw", Some(db))
}

/// Backend 2's hosts and roles as HSCALE SHOW_BACKENDS lists them.
fn roles(proxy: &Proxy) -> Vec<(String, String)> {
    let rows: Vec<mysql::Row> = proxy.connect(None).query("HSCALE SHOW_BACKENDS").unwrap();
    rows.into_iter()
        .filter(|r| r.get::<u32, _>("backend") == Some(2))
        .map(|r| (r.get("host").unwrap(), r.get("role").unwrap()))
        .collect()
}
/// HSCALE SWITCHOVER through `admin`; its row. Asked again while it is
/// refused before anything changed because an instance did not hold the
/// backend's statements within the hold's second: on a loaded machine
/// (a `make test` beside two busy loops and a build) that refusal is the
/// command's answer, and what the tests check is what a switchover that
/// happens does. The refused one lifted its hold: the writer is found
/// again before the next.
fn switchover(admin: &mut Conn, backend: u32, host: &str) -> Vec<mysql::Row> {
    let command = format!("HSCALE SWITCHOVER({backend}, '{host}')");
    for _ in 0..5 {
        match admin.query(&command) {
            Err(mysql::Error::MySqlError(e)) if e.message.contains("nothing was switched") => {
                eprintln!("{command}: {}; asked again", e.message);
                wait_for("the writer found again", Duration::from_secs(20), || {
                    let rows: Vec<mysql::Row> = admin.query("HSCALE SHOW_BACKENDS").ok()?;
                    rows.iter()
                        .any(|r| {
                            r.get::<u32, _>("backend") == Some(backend)
                                && r.get::<String, _>("role").as_deref() == Some("writer")
                        })
                        .then_some(())
                });
            }
            answer => return answer.unwrap(),
        }
    }
    panic!("{command} refused five times");
}

/// Waits until hscale sees `expected` as backend 2's roles, host by host.
fn wait_for_roles(proxy: &Proxy, set: &ReplicaSet, expected: [&str; 3]) {
    let want: Vec<(String, String)> = expected
        .iter()
        .enumerate()
        .map(|(h, role)| (set.address(h), role.to_string()))
        .collect();
    wait_for(
        &format!("roles {expected:?}"),
        Duration::from_secs(20),
        || (roles(proxy) == want).then_some(()),
    );
}

fn count(conn: &mut Conn, db: &str) -> u64 {
    conn.query_first(format!("SELECT COUNT(*) FROM `{db}`.t_default"))
        .unwrap()
        .unwrap()
}

fn insert(conn: &mut Conn, ids: std::ops::Range<u32>) {
    for id in ids {
        conn.exec_drop("INSERT INTO t VALUES (?, ?)", (id, id * 10))
            .unwrap();
    }
}

#[test]
fn writes_follow_a_read_only_flip_made_elsewhere_and_never_reach_the_old_primary() {
    let db = "replicas_flip";
    let (set, proxy) = started(db, 5000, Reads::Primary);
    let mut app = app(&proxy, db);
    insert(&mut app, 0..10);
    assert_eq!(count(&mut set.direct(0, None), db), 10);

    // A transaction open on the old primary when the writer changes.
    let mut open = self::app(&proxy, db);
    open.query_drop("BEGIN").unwrap();
    open.query_drop("INSERT INTO t VALUES (100, 0)").unwrap();

    // A failover tool's switchover: the primary read-only, host 1 caught
    // up and writable, host 2 following it; host 0 left alone.
    set.set_read_only(0, true);
    set.catch_up(1, 0);
    set.promote(1);
    set.replicate(2, 1);
    wait_for_roles(&proxy, &set, ["read-only", "writer", "replica"]);

    insert(&mut app, 10..20);
    set.catch_up(2, 1);
    assert_eq!(count(&mut set.direct(1, None), db), 20, "on the new writer");
    assert_eq!(count(&mut set.direct(2, None), db), 20, "on its replica");
    let old = count(&mut set.direct(0, None), db);
    assert_eq!(old, 10, "the old primary was written after the flip");

    let (_, message) = error_of(&mut open, "INSERT INTO t VALUES (102, 0)");
    assert!(message.contains("writer changed"), "{message}");
    let lost: u64 = set
        .direct(1, None)
        .query_first(format!(
            "SELECT COUNT(*) FROM `{db}`.t_default WHERE id >= 100"
        ))
        .unwrap()
        .unwrap();
    assert_eq!(
        lost, 0,
        "the open transaction's write reached the new writer"
    );
    // Its session goes on: a new statement runs on the new writer.
    insert(&mut open, 200..201);
    assert_eq!(count(&mut set.direct(1, None), db), 21);
}

#[test]
fn two_writable_hosts_get_no_write_and_statements_wait_for_a_writer() {
    let db = "replicas_split";
    let (set, proxy) = started(db, 3000, Reads::Primary);
    let mut app = app(&proxy, db);
    insert(&mut app, 0..5);

    // Split brain: host 2 writable too.
    set.set_read_only(2, false);
    wait_for_roles(&proxy, &set, ["split brain", "replica", "split brain"]);
    let (code, message) = error_of(&mut app, "INSERT INTO t VALUES (50, 0)");
    assert_eq!(code, 1290, "{message}");
    assert!(
        message.contains(&set.address(0)) && message.contains(&set.address(2)),
        "{message}"
    );
    set.set_read_only(2, true);
    set.catch_up(1, 0);
    set.catch_up(2, 0);
    for host in 0..3 {
        assert_eq!(count(&mut set.direct(host, None), db), 5, "host {host}");
    }
    wait_for_roles(&proxy, &set, ["writer", "replica", "replica"]);

    // No writer: a statement waits for one and runs once there is one;
    // backend 1's statements do not wait.
    set.set_read_only(0, true);
    wait_for_roles(&proxy, &set, ["read-only", "replica", "replica"]);
    let port = proxy.port;
    let (sending, sent) = std::sync::mpsc::channel();
    let waiting = std::thread::spawn(move || {
        let mut app =
            hscale_testkit::connect(port, "replicas_split", "app-pw", Some("replicas_split"));
        sending.send(()).unwrap();
        app.query_drop("INSERT INTO t VALUES (60, 0)")
    });
    // A statement that needed backend 2 would fail after failover_wait_ms.
    let mut main = proxy.connect(Some(db));
    main.query_drop("SELECT 1").unwrap();
    sent.recv().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(!waiting.is_finished(), "it ended without a writer");
    set.set_read_only(0, false);
    waiting.join().unwrap().unwrap();
    assert_eq!(count(&mut set.direct(0, None), db), 6);

    // Past failover_wait_ms without a writer: a clear error.
    set.set_read_only(0, true);
    wait_for_roles(&proxy, &set, ["read-only", "replica", "replica"]);
    let (code, message) = error_of(&mut app, "INSERT INTO t VALUES (70, 0)");
    assert_eq!(code, 1429, "{message}");
    assert!(message.contains("backend 2 has no writer"), "{message}");
}

/// The ids of the rows whose id is `id` or one of the markers only a
/// replica has (1001 on host 1, 1002 on host 2).
fn own_and_markers(conn: &mut Conn, id: u32) -> Vec<u32> {
    conn.exec(
        "SELECT id FROM t WHERE id = ? OR id > 1000 ORDER BY id",
        (id,),
    )
    .unwrap()
}

/// Backend 2's hosts and whether each replicates, by SHOW_BACKENDS.
fn replicating(proxy: &Proxy) -> Vec<Option<String>> {
    let rows: Vec<mysql::Row> = proxy.connect(None).query("HSCALE SHOW_BACKENDS").unwrap();
    rows.into_iter()
        .filter(|r| r.get::<u32, _>("backend") == Some(2))
        .map(|r| r.get("replicating").unwrap())
        .collect()
}

fn wait_for_replicating(proxy: &Proxy, expected: [Option<&str>; 3]) {
    let want: Vec<Option<String>> = expected.iter().map(|e| e.map(str::to_string)).collect();
    wait_for(
        &format!("replicating {expected:?}"),
        Duration::from_secs(20),
        || (replicating(proxy) == want).then_some(()),
    );
}

#[test]
fn reads_go_to_replicas_in_step_and_see_the_sessions_own_writes() {
    let db = "replicas_reads";
    let (set, proxy) = started(db, 5000, Reads::Replicas);
    let mut reader = app(&proxy, db);
    insert(&mut reader, 0..10);
    // A row only each replica has: which host answered a read.
    for host in 1..3 {
        set.catch_up(host, 0);
        let mut conn = set.direct(host, Some(db));
        conn.query_drop("SET SESSION sql_log_bin = 0").unwrap();
        conn.exec_drop("INSERT INTO t_default VALUES (?, ?)", (1000 + host, 0))
            .unwrap();
    }
    let mut primary = proxy.connect(Some(db));
    assert_eq!(
        own_and_markers(&mut primary, 0),
        [0],
        "root reads the writer"
    );
    for _ in 0..10 {
        let ids = own_and_markers(&mut reader, 0);
        assert!(ids == [0, 1001] || ids == [0, 1002], "{ids:?}");
    }

    // A comment decides for its statement, text or prepared, whatever the
    // user's `reads`.
    let hinted = |hint: &str| {
        format!("SELECT /* hscale:{hint} */ id FROM t WHERE id = 0 OR id > 1000 ORDER BY id")
    };
    for _ in 0..5 {
        for ids in [
            primary.query::<u32, _>(hinted("replica")).unwrap(),
            primary.exec::<u32, _, _>(hinted("replica"), ()).unwrap(),
        ] {
            assert!(ids == [0, 1001] || ids == [0, 1002], "{ids:?}");
        }
        assert_eq!(reader.query::<u32, _>(hinted("primary")).unwrap(), [0]);
        assert_eq!(
            reader.exec::<u32, _, _>(hinted("primary"), ()).unwrap(),
            [0]
        );
    }

    // What may not go to a replica stays on the writer.
    let locking: Vec<u32> = reader
        .query("SELECT id FROM t WHERE id > 1000 FOR UPDATE")
        .unwrap();
    assert!(locking.is_empty(), "a locking read went to a replica");
    reader.query_drop("BEGIN").unwrap();
    assert_eq!(
        own_and_markers(&mut reader, 0),
        [0],
        "a read in a transaction"
    );
    reader.query_drop("COMMIT").unwrap();

    // A scan over replicas equals the writer's.
    let all = "SELECT id, v FROM t WHERE id < 1000 ORDER BY id";
    let on_replicas: Vec<(u32, u32)> = reader.query(all).unwrap();
    let on_writer: Vec<(u32, u32)> = primary.query(all).unwrap();
    assert_eq!(on_replicas, on_writer);

    // Each read right after the session's own write sees it: on a replica
    // that applied it, else on the writer, also when the replicas apply
    // a second late (MASTER_DELAY) while their lag stays within bounds.
    let mut on_a_replica = 0;
    for id in 100..120 {
        insert(&mut reader, id..id + 1);
        let ids = own_and_markers(&mut reader, id);
        assert_eq!(ids[0], id, "the session's own write is missing: {ids:?}");
        on_a_replica += usize::from(ids.len() > 1);
    }
    println!("{on_a_replica} of 20 reads after a write answered by a replica");
    let delay = |seconds: u32| {
        for host in 1..3 {
            let mut conn = set.direct(host, None);
            conn.query_drop("STOP SLAVE").unwrap();
            conn.query_drop(format!("CHANGE MASTER TO MASTER_DELAY = {seconds}"))
                .unwrap();
            conn.query_drop("START SLAVE").unwrap();
        }
    };
    delay(1);
    wait_for_replicating(&proxy, [None, Some("Yes"), Some("Yes")]);
    for id in 200..210 {
        insert(&mut reader, id..id + 1);
        let ids = own_and_markers(&mut reader, id);
        assert_eq!(ids, [id], "read on a replica that had not applied it");
    }
    delay(0);
    for host in 1..3 {
        set.catch_up(host, 0);
    }

    // A replica whose SQL thread stopped is skipped; with none in step,
    // the writer answers.
    set.direct(2, None)
        .query_drop("STOP SLAVE SQL_THREAD")
        .unwrap();
    wait_for_replicating(&proxy, [None, Some("Yes"), Some("No")]);
    for _ in 0..10 {
        assert_eq!(own_and_markers(&mut reader, 0), [0, 1001]);
    }
    set.direct(1, None)
        .query_drop("STOP SLAVE SQL_THREAD")
        .unwrap();
    wait_for_replicating(&proxy, [None, Some("No"), Some("No")]);
    assert_eq!(own_and_markers(&mut reader, 0), [0]);
}

#[test]
fn a_switchover_under_writes_fails_no_statement_and_loses_no_write() {
    let db = "replicas_switch";
    let (set, proxy) = started(db, 10_000, Reads::Primary);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers = insert_until(proxy.port, db, &[(db, "app-pw"); 2], &stop);
    let written = |host: usize| count(&mut set.direct(host, None), db);
    wait_for("writes on the primary", Duration::from_secs(30), || {
        (written(0) >= 50).then_some(())
    });
    // Round the set: 0 -> 1 -> 2 -> 0 ...
    let switchovers: usize = std::env::var("HSCALE_SWITCHOVERS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2);
    let mut pauses_ms = Vec::new();
    let mut writer = 0;
    for _ in 0..switchovers {
        // The replicas follow the writer, both threads running: a
        // switchover takes no host that does not.
        wait_for(
            "the replicas following the writer",
            Duration::from_secs(20),
            || {
                let rows: Vec<mysql::Row> =
                    proxy.connect(None).query("HSCALE SHOW_BACKENDS").unwrap();
                let following = rows
                    .iter()
                    .filter(|r| r.get::<u32, _>("backend") == Some(2))
                    .filter(|r| r.get::<String, _>("host") != Some(set.address(writer)))
                    .all(|r| {
                        r.get::<Option<String>, _>("replicates_from").flatten()
                            == Some(set.address(writer))
                            && r.get::<Option<String>, _>("replicating")
                                .flatten()
                                .as_deref()
                                == Some("Yes")
                    });
                following.then_some(())
            },
        );
        let next = (writer + 1) % 3;
        let switched = switchover(&mut proxy.connect(None), 2, &set.address(next));
        pauses_ms.push(switched[0].get::<u64, _>("pause_ms").unwrap());
        let before = written(next);
        wait_for("writes on the new writer", Duration::from_secs(30), || {
            (written(next) >= before + 50).then_some(())
        });
        writer = next;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut acknowledged = Vec::new();
    for writer in writers {
        let (ids, errors) = writer.join().unwrap();
        assert!(errors.is_empty(), "statements failed: {errors:?}");
        acknowledged.extend(ids);
    }
    println!(
        "switchover: pause_ms={pauses_ms:?} longest_gap_ms={} inserts={}",
        longest_gap(&acknowledged).as_millis(),
        acknowledged.len()
    );
    let acknowledged = acknowledged.len() as u64;
    assert_eq!(
        written(writer),
        acknowledged,
        "every acknowledged insert, once"
    );
    let mut roles = ["replica"; 3];
    roles[writer] = "writer";
    wait_for_roles(&proxy, &set, roles);
    for host in (0..3).filter(|&h| h != writer) {
        set.catch_up(host, writer);
        assert_eq!(
            written(host),
            acknowledged,
            "host {host} follows the new writer"
        );
    }
}

#[test]
fn a_switchover_holds_every_instances_statements_so_none_reaches_the_old_writer() {
    let db = "replicas_two";
    let (set, first) = started(db, 10_000, Reads::Primary);
    let second = Proxy::start(config_for(&set, db, 10_000, Reads::Primary, |_| {}));
    wait_for_roles(&second, &set, ["writer", "replica", "replica"]);
    // Through the other instance: an account read_only refuses, and one
    // it does not stop (SUPER), whose writes would stay on the old writer.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers = insert_until(second.port, db, &[(db, "app-pw"), ("root", "")], &stop);
    let written = |host: usize| count(&mut set.direct(host, None), db);
    wait_for("writes on the primary", Duration::from_secs(30), || {
        (written(0) >= 100).then_some(())
    });
    let switched = switchover(&mut first.connect(None), 2, &set.address(1));
    let pause_ms: u64 = switched[0].get("pause_ms").unwrap();
    let before = written(1);
    wait_for("writes on the new writer", Duration::from_secs(30), || {
        (written(1) >= before + 100).then_some(())
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut inserted = Vec::new();
    for writer in writers {
        let (ids, errors) = writer.join().unwrap();
        assert!(errors.is_empty(), "statements failed: {errors:?}");
        inserted.extend(ids);
    }
    let acknowledged = inserted.len() as u64;
    println!(
        "switchover through another instance: pause_ms={pause_ms} longest_gap_ms={} inserts={acknowledged}",
        longest_gap(&inserted).as_millis()
    );
    assert_eq!(
        written(1),
        acknowledged,
        "every acknowledged insert, once, on the new writer"
    );
    for host in [0, 2] {
        set.catch_up(host, 1);
        assert_eq!(
            written(host),
            acknowledged,
            "host {host} follows the new writer"
        );
    }
}

/// What clients saw: the longest time without an acknowledged insert, the
/// switchovers' pauses included.
fn longest_gap(acknowledged: &[(u32, std::time::Instant)]) -> Duration {
    let mut at: Vec<std::time::Instant> = acknowledged.iter().map(|&(_, at)| at).collect();
    at.sort();
    at.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default()
}

/// Autocommitted inserts of a client per account of `writers` (user and
/// password) until `stop`: each one's acknowledged ids, with when, and its
/// errors.
type Inserted = (Vec<(u32, std::time::Instant)>, Vec<String>);

fn insert_until(
    port: u16,
    db: &'static str,
    writers: &[(&'static str, &'static str)],
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<std::thread::JoinHandle<Inserted>> {
    (0u32..)
        .zip(writers.iter().copied())
        .map(|(w, (user, password))| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut conn = hscale_testkit::connect(port, user, password, Some(db));
                let (mut acknowledged, mut errors) = (Vec::new(), Vec::new());
                let mut id = w * 1_000_000;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    match conn.exec_drop("INSERT INTO t VALUES (?, 0)", (id,)) {
                        Ok(()) => acknowledged.push((id, std::time::Instant::now())),
                        Err(e) => errors.push(e.to_string()),
                    }
                    id += 1;
                }
                (acknowledged, errors)
            })
        })
        .collect()
}

#[test]
fn a_killed_writer_is_replaced_by_the_most_advanced_replica_and_no_acknowledged_write_is_lost() {
    let db = "replicas_auto";
    let mut set = ReplicaSet::start(db, 3);
    let proxy = proxy_with(&set, db, 20_000, Reads::Primary, |backend| {
        backend.failover = hscale::config::Failover::Auto;
        backend.failover_after_ms = 1000;
    });
    wait_for_roles(&proxy, &set, ["writer", "replica", "replica"]);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers = insert_until(proxy.port, db, &[(db, "app-pw"); 2], &stop);
    let written = |set: &ReplicaSet, host: usize| count(&mut set.direct(host, None), db);
    wait_for("writes on the primary", Duration::from_secs(30), || {
        (written(&set, 0) >= 50).then_some(())
    });
    let killed = std::time::Instant::now();
    set.servers[0].kill();
    let (new_writer, seen) = wait_for("a promoted replica", Duration::from_secs(30), || {
        let seen: Vec<String> = roles(&proxy).into_iter().map(|(_, role)| role).collect();
        let writer = seen
            .iter()
            .position(|r| r == "writer")
            .filter(|&w| w != 0)?;
        Some((writer, seen))
    });
    let before = written(&set, new_writer);
    wait_for("writes on the new writer", Duration::from_secs(30), || {
        (written(&set, new_writer) >= before + 50).then_some(())
    });
    println!(
        "writes resumed {:?} after the kill; roles {seen:?}",
        killed.elapsed()
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut acknowledged = Vec::new();
    for writer in writers {
        let (ids, errors) = writer.join().unwrap();
        let ids = ids.into_iter().map(|(id, _)| id);
        // Statements on their way when the server died, or on connections
        // it had (before hscale saw them closed), are lost with their
        // answers (2013); none fails for want of a writer.
        assert!(
            errors.iter().all(|e| e.contains("ERROR 2013")),
            "failed otherwise than lost with the server: {errors:?}"
        );
        acknowledged.extend(ids);
    }
    let on_new_writer: Vec<u32> = set
        .direct(new_writer, Some(db))
        .query("SELECT id FROM t_default")
        .unwrap();
    let on_new_writer: std::collections::HashSet<u32> = on_new_writer.into_iter().collect();
    let lost: Vec<u32> = acknowledged
        .iter()
        .copied()
        .filter(|id| !on_new_writer.contains(id))
        .collect();
    assert!(lost.is_empty(), "acknowledged and lost: {lost:?}");

    // The old primary comes back writable (as MariaDB starts): fenced,
    // made read-only, never written.
    let left_behind = written_on_restart(&mut set);
    wait_for(
        "the old primary fenced and read-only",
        Duration::from_secs(30),
        || {
            let roles = roles(&proxy);
            let read_only: u8 = set
                .direct(0, None)
                .query_first("SELECT @@read_only")
                .ok()??;
            (roles[0].1 == "fenced" && read_only == 1).then_some(())
        },
    );
    insert(&mut app(&proxy, db), 5_000_000..5_000_010);
    assert_eq!(written(&set, 0), left_behind, "the fenced host was written");

    // An instance started later reads the fence from the dictionary: the
    // old primary, writable again, is no second writer for it.
    drop(proxy);
    set.set_read_only(0, false);
    let later = Proxy::start(config_for(&set, db, 20_000, Reads::Primary, |backend| {
        backend.failover = hscale::config::Failover::Auto;
    }));
    wait_for("the fence read", Duration::from_secs(20), || {
        let roles: Vec<String> = roles(&later).into_iter().map(|(_, role)| role).collect();
        (roles[0] == "fenced" && roles[new_writer] == "writer").then_some(())
    });
    insert(&mut app(&later, db), 6_000_000..6_000_010);
    assert_eq!(written(&set, 0), left_behind, "the fenced host was written");
}

/// Restarts the killed host 0 and counts its rows.
fn written_on_restart(set: &mut ReplicaSet) -> u64 {
    set.servers[0].restart().unwrap();
    let db = "replicas_auto";
    count(&mut set.direct(0, None), db)
}

/// A number from sysbench's report: the rate on the line that starts with
/// `label` (`queries: 12345 (1234.56 per sec.)`).
fn per_second(report: &str, label: &str) -> f64 {
    report
        .lines()
        .find(|l| l.trim_start().starts_with(label))
        .and_then(|l| l.split('(').nth(1))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {label} rate in:\n{report}"))
}

/// Not a test: `bench/replicas.sh` runs it (`--ignored`) for its numbers.
/// sysbench oltp_read_only, autocommitted (`--skip_trx`), against the
/// primary directly, then through hscale as a user whose reads go to the
/// primary and as one whose reads go to the two replicas, side by side;
/// `HSCALE_READS_SECONDS` each (10), `HSCALE_READS_THREADS` clients (8).
#[test]
#[ignore]
fn oltp_read_only_over_replicas() {
    let seconds = std::env::var("HSCALE_READS_SECONDS").unwrap_or_else(|_| "10".into());
    let threads = std::env::var("HSCALE_READS_THREADS").unwrap_or_else(|_| "8".into());
    let db = "replicas_reads_bench";
    let set = ReplicaSet::start(db, 3);
    let mut primary = set.direct(0, None);
    primary
        .query_drop(format!("CREATE DATABASE `{db}`"))
        .unwrap();
    set.account(db, "app-pw", db);
    set.account("reader", "app-pw", db);
    let run = |port: u16, user: &str, command: &str| {
        let args = [
            "oltp_read_only".to_string(),
            "--db-driver=mysql".into(),
            "--mysql-host=127.0.0.1".into(),
            format!("--mysql-port={port}"),
            format!("--mysql-user={user}"),
            format!(
                "--mysql-password={}",
                if user == "root" { "" } else { "app-pw" }
            ),
            format!("--mysql-db={db}"),
            "--tables=4".into(),
            "--table-size=10000".into(),
            "--skip_trx=on".into(),
            format!("--threads={threads}"),
            format!("--time={seconds}"),
            command.into(),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        hscale_testkit::run_program("sysbench", &args)
    };
    run(set.servers[0].port, "root", "prepare");
    for replica in 1..3 {
        set.catch_up(replica, 0);
    }
    // The replica set is the only backend: sysbench's tables are plain
    // tables there.
    let mut config: Config = cluster().config();
    config.backends = vec![set.backend(1)];
    config.proxy.monitor_ms = 100;
    for (name, reads) in [(db, Reads::Primary), ("reader", Reads::Replicas)] {
        config.users.push(UserConfig {
            name: name.into(),
            password: "app-pw".into(),
            reads,
            max_lag_ms: 5000,
            ..Default::default()
        });
    }
    let proxy = Proxy::start(config);
    wait_for("the replicas in step", Duration::from_secs(20), || {
        let rows: Vec<mysql::Row> = proxy.connect(None).query("HSCALE SHOW_BACKENDS").unwrap();
        let replicas = rows
            .iter()
            .filter(|r| r.get::<String, _>("role").as_deref() == Some("replica"))
            .count();
        (replicas == 2).then_some(())
    });
    let direct = per_second(&run(set.servers[0].port, "root", "run"), "queries:");
    let on_primary = per_second(&run(proxy.port, db, "run"), "queries:");
    let selects = || -> Vec<u64> {
        (0..3)
            .map(|host| {
                let row: Option<(String, u64)> = set
                    .direct(host, None)
                    .query_first("SHOW GLOBAL STATUS LIKE 'Com_select'")
                    .unwrap();
                row.unwrap().1
            })
            .collect()
    };
    let before = selects();
    let on_replicas = per_second(&run(proxy.port, "reader", "run"), "queries:");
    let answered: Vec<u64> = selects().iter().zip(&before).map(|(a, b)| a - b).collect();
    assert!(
        answered[1] + answered[2] > answered[0],
        "the replicas answered fewer SELECTs than the primary: {answered:?}"
    );
    println!(
        "reads: direct_qps={direct:.0} primary_qps={on_primary:.0} replicas_qps={on_replicas:.0} replicas_to_primary={:.2} selects_by_host={answered:?}",
        on_replicas / on_primary
    );
}

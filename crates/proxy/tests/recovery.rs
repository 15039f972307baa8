//! A partition move cut short: the next instance that starts finishes or
//! undoes it, and no row is lost or left twice. First each state a dead
//! instance can leave, made by hand; then a real proxy stopped in the middle
//! of ADD_PARTITION.

use hscale_testkit::{cluster, Proxy};
use mysql::prelude::Queryable;
use mysql::Conn;

const USERS: &str =
    "CREATE TABLE users (id INT UNSIGNED PRIMARY KEY, nickname VARCHAR(64) NOT NULL)";

/// Every proxy that starts finishes what any test left in the dictionary:
/// one test at a time, so that none recovers another's state at the wrong
/// moment (before the statement it leaves "in flight" was sent).
fn alone() -> std::sync::MutexGuard<'static, ()> {
    static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ALONE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn count(conn: &mut Conn, table: &str) -> u64 {
    conn.query_first(format!("SELECT COUNT(*) FROM {table}"))
        .unwrap()
        .unwrap()
}

/// Rows of `users` through hscale (COUNT(*) over partitions needs a merge).
fn rows_through(proxy: &Proxy, db: &str) -> usize {
    let ids: Vec<u32> = proxy
        .connect(Some(db))
        .query("SELECT id FROM users")
        .unwrap();
    ids.len()
}

fn states(db: &str) -> Vec<String> {
    cluster()
        .direct(1, None)
        .exec(
            "SELECT state FROM hscale.partitions WHERE db = ? ORDER BY partition_value",
            (db,),
        )
        .unwrap()
}

/// Sets the state of the partition entries of `db` and bumps the version, as
/// a dying instance would have left them.
fn leave_state(db: &str, state: &str) {
    let mut main = cluster().direct(1, None);
    main.exec_drop(
        "UPDATE hscale.partitions SET state = ? WHERE db = ?",
        (state, db),
    )
    .unwrap();
    main.query_drop("UPDATE hscale.version SET version = version + 1")
        .unwrap();
}

/// users by MOD(2) of id, 10 rows, partition `odd` on backend 1 beside the
/// default table, all active.
fn partitioned(db: &str) -> (String, Conn) {
    let db = cluster().database(db);
    let mut direct = cluster().direct(1, Some(&db));
    direct.query_drop(USERS).unwrap();
    for id in 1..=10 {
        direct
            .exec_drop("INSERT INTO users VALUES (?, ?)", (id, format!("n{id}")))
            .unwrap();
    }
    let proxy = Proxy::for_cluster();
    let mut c = proxy.connect(Some(&db));
    c.query_drop("HSCALE SETUP_TABLE('users', 'id', 'users_default', 1, 'MOD(2)')")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('users', 'odd', 1, 1)")
        .unwrap();
    (db, direct)
}

#[test]
fn each_interrupted_state_is_finished_or_undone_at_the_next_start() {
    let _alone = alone();
    // copying: the default table holds the odd rows, the partition has copies.
    let (db, mut d) = partitioned("recover_copying");
    d.query_drop("INSERT INTO users_default SELECT * FROM users_odd")
        .unwrap();
    leave_state(&db, "copying");
    let proxy = Proxy::for_cluster();
    assert_eq!(
        (count(&mut d, "users_default"), count(&mut d, "users_odd")),
        (10, 0),
        "copying is undone"
    );
    assert!(states(&db).is_empty());
    assert_eq!(rows_through(&proxy, &db), 10);
    drop(proxy);

    // cleaning: the partition holds the odd rows, the default table has copies.
    let (db, mut d) = partitioned("recover_cleaning");
    d.query_drop("INSERT INTO users_default SELECT * FROM users_odd")
        .unwrap();
    leave_state(&db, "cleaning");
    let proxy = Proxy::for_cluster();
    assert_eq!(
        (count(&mut d, "users_default"), count(&mut d, "users_odd")),
        (5, 5),
        "cleaning is finished"
    );
    assert_eq!(states(&db), ["active"]);
    assert_eq!(rows_through(&proxy, &db), 10);
    drop(proxy);

    // draining: DROP_PARTITION had copied rows back; undone.
    let (db, mut d) = partitioned("recover_draining");
    d.query_drop("INSERT INTO users_default SELECT * FROM users_odd")
        .unwrap();
    leave_state(&db, "draining");
    let proxy = Proxy::for_cluster();
    assert_eq!(
        (count(&mut d, "users_default"), count(&mut d, "users_odd")),
        (5, 5),
        "draining is undone"
    );
    assert_eq!(states(&db), ["active"]);
    drop(proxy);

    // dropping: the default table holds every row again; the partition goes.
    let (db, mut d) = partitioned("recover_dropping");
    d.query_drop("INSERT INTO users_default SELECT * FROM users_odd")
        .unwrap();
    leave_state(&db, "dropping");
    let proxy = Proxy::for_cluster();
    assert_eq!(count(&mut d, "users_default"), 10);
    let left: Vec<String> = d.query("SHOW TABLES LIKE 'users_odd'").unwrap();
    assert!(left.is_empty(), "dropping is finished");
    assert!(states(&db).is_empty());
    assert_eq!(rows_through(&proxy, &db), 10);
}

#[test]
fn a_proxy_stopped_during_add_partition_loses_and_duplicates_nothing() {
    let _alone = alone();
    let db = cluster().database("recover_killed");
    let mut d = cluster().direct(1, Some(&db));
    d.query_drop(USERS).unwrap();
    d.query_drop("INSERT INTO users SELECT seq, CONCAT('n', seq) FROM seq_1_to_20000")
        .unwrap();
    let first = Proxy::for_cluster();
    let mut c = first.connect(Some(&db));
    c.query_drop("HSCALE SETUP_TABLE('users', 'id', 'users_default', 1, 'MOD(2)')")
        .unwrap();
    let port = first.port;
    let name = db.clone();
    let admin = std::thread::spawn(move || {
        let mut c = hscale_testkit::connect(port, "root", "", Some(&name));
        c.query_drop("HSCALE ADD_PARTITION('users', 'odd', 1, 2)")
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    // Stops the proxy where it is: its tasks end at their next await.
    drop(first);
    let _ = admin.join();
    let interrupted = states(&db);
    let second = Proxy::for_cluster();
    // The split survives the instance that ran it: the second takes it
    // over once its owner's heartbeat is older than the lease.
    wait_for_moves(&db);
    let mut d2 = cluster().direct(2, Some(&db));
    let in_default = count(&mut d, "users_default");
    let odd: Vec<String> = d2.query("SHOW TABLES LIKE 'users_odd'").unwrap();
    let in_partition = if odd.is_empty() {
        0
    } else {
        count(&mut d2, "users_odd")
    };
    assert_eq!(
        in_default + in_partition,
        20000,
        "every row once, after {interrupted:?}"
    );
    assert!(
        states(&db).iter().all(|s| s == "active"),
        "{:?}",
        states(&db)
    );
    let mut c = second.connect(Some(&db));
    let odd_rows: u64 = c
        .query_first("SELECT COUNT(*) FROM users WHERE id IN (1, 3, 19999)")
        .unwrap()
        .unwrap();
    assert_eq!(odd_rows, 3);
    assert_eq!(rows_through(&second, &db), 20000);
}

#[test]
fn a_setup_table_stopped_before_its_rename_is_finished_at_the_next_start() {
    let _alone = alone();
    let db = cluster().database("recover_setup");
    let mut d = cluster().direct(1, Some(&db));
    d.query_drop(USERS).unwrap();
    d.query_drop("INSERT INTO users VALUES (1, 'a'), (2, 'b')")
        .unwrap();
    // A first proxy creates the dictionary's schema.
    drop(Proxy::for_cluster());
    // What SETUP_TABLE had written when it stopped: the entry, not the rename.
    let mut main = cluster().direct(1, None);
    main.exec_drop(
        "INSERT INTO hscale.tables (db, name, column_name, column_position, column_kind, hash_function, default_table, default_backend) VALUES (?, 'users', 'id', 1, 'integer', 'MOD(2)', 'users_default', 1)",
        (&db,),
    )
    .unwrap();
    main.query_drop("UPDATE hscale.version SET version = version + 1")
        .unwrap();
    let proxy = Proxy::for_cluster();
    assert_eq!(count(&mut d, "users_default"), 2);
    let left: Vec<String> = d.query("SHOW TABLES LIKE 'users'").unwrap();
    assert!(left.is_empty(), "renamed");
    assert_eq!(rows_through(&proxy, &db), 2);
}

/// Records a schema change of `db`.users as an instance that died after its
/// first step would have left it; `before`, the second table's definition
/// recorded before its step was sent, if it got that far.
fn leave_schema_change(
    db: &str,
    steps: [&str; 2],
    effect: &str,
    renamed_to: Option<&str>,
    before: Option<String>,
) {
    let mut main = cluster().direct(1, None);
    for (step, (table, sql)) in ["users_default", "users_odd"].iter().zip(steps).enumerate() {
        main.exec_drop(
            "INSERT INTO hscale.schema_changes VALUES (?, 'users', ?, 1, ?, ?, ?, ?, ?, ?, ?)",
            (
                db,
                step,
                table,
                (step == 1).then_some("odd"),
                sql,
                step == 0,
                effect,
                renamed_to,
                if step == 1 { before.clone() } else { None },
            ),
        )
        .unwrap();
    }
    main.query_drop("UPDATE hscale.version SET version = version + 1")
        .unwrap();
}

#[test]
fn a_schema_change_stopped_after_its_first_partition_is_finished_at_the_next_start() {
    let _alone = alone();
    let (db, mut d) = partitioned("recover_alter");
    d.query_drop("ALTER TABLE users_default ADD COLUMN age INT")
        .unwrap();
    leave_schema_change(
        &db,
        [
            "ALTER TABLE `users_default` ADD COLUMN age INT",
            "ALTER TABLE `users_odd` ADD COLUMN age INT",
        ],
        "unchanged",
        None,
        None,
    );
    let proxy = Proxy::for_cluster();
    let ages: Vec<Option<u32>> = proxy
        .connect(Some(&db))
        .query("SELECT age FROM users WHERE id = 3")
        .unwrap();
    assert_eq!(ages, [None], "the column reached the partition");
    let left: u64 = d
        .query_first("SELECT COUNT(*) FROM hscale.schema_changes")
        .unwrap()
        .unwrap();
    assert_eq!(left, 0);
    drop(proxy);

    let (db, mut d) = partitioned("recover_rename");
    d.query_drop("RENAME TABLE users_default TO people_default")
        .unwrap();
    leave_schema_change(
        &db,
        [
            "RENAME TABLE `users_default` TO `people_default`",
            "RENAME TABLE `users_odd` TO `people_odd`",
        ],
        "renamed",
        Some("people"),
        None,
    );
    let proxy = Proxy::for_cluster();
    let mut tables: Vec<String> = d.query("SHOW TABLES").unwrap();
    tables.sort();
    assert_eq!(tables, ["people_default", "people_odd"]);
    let ids: Vec<u32> = proxy
        .connect(Some(&db))
        .query("SELECT id FROM people WHERE id IN (3, 4)")
        .unwrap();
    assert_eq!(ids.len(), 2);
}

/// The definition SHOW CREATE TABLE gives, as hscale records it.
fn definition(conn: &mut Conn, table: &str) -> String {
    let (_, created): (String, String) = conn
        .query_first(format!("SHOW CREATE TABLE {table}"))
        .unwrap()
        .unwrap();
    created
}

fn indexes_on_nickname(conn: &mut Conn, table: &str) -> Vec<String> {
    let mut names: Vec<String> = conn
        .exec(
            "SELECT INDEX_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = 'nickname'",
            (table,),
        )
        .unwrap();
    names.sort();
    names
}

const ADD_INDEX_STEP: &str = "ALTER TABLE `users_odd` ADD INDEX (nickname)";

/// `ADD INDEX (nickname)` on users, left by an instance that died after the
/// first step, with the second table's definition recorded before its step.
fn index_change_left(name: &str) -> (String, Conn) {
    let (db, mut d) = partitioned(name);
    let before = definition(&mut d, "users_odd");
    d.query_drop("ALTER TABLE users_default ADD INDEX (nickname)")
        .unwrap();
    leave_schema_change(
        &db,
        [
            "ALTER TABLE `users_default` ADD INDEX (nickname)",
            ADD_INDEX_STEP,
        ],
        "unchanged",
        None,
        Some(before),
    );
    (db, d)
}

/// `ADD INDEX (nickname)` run twice makes a second index (`nickname_2`):
/// the step that was on its way when hscale died must not run again once it
/// took effect, nor race the dead instance's statement still running.
#[test]
fn the_step_running_when_hscale_stopped_runs_once() {
    let _alone = alone();
    let mut holder = cluster().direct(1, None);
    let (db, mut d) = index_change_left("recover_in_flight");
    // The dead instance's statement, still waiting on the server (for a
    // table lock) when the next instance starts.
    holder.query_drop(format!("USE {db}")).unwrap();
    holder.query_drop("LOCK TABLES users_odd WRITE").unwrap();
    let sent = std::thread::spawn({
        let db = db.clone();
        move || cluster().direct(1, Some(&db)).query_drop(ADD_INDEX_STEP)
    });
    while d
        .exec_first::<u64, _, _>(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO = ?",
            (ADD_INDEX_STEP,),
        )
        .unwrap()
        == Some(0)
    {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let release = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(1500));
        holder.query_drop("UNLOCK TABLES").unwrap();
    });
    let proxy = Proxy::for_cluster();
    release.join().unwrap();
    sent.join()
        .unwrap()
        .expect("the dead instance's statement ran");
    assert_eq!(indexes_on_nickname(&mut d, "users_odd"), ["nickname"]);
    assert_eq!(indexes_on_nickname(&mut d, "users_default"), ["nickname"]);
    let left: u64 = d
        .query_first("SELECT COUNT(*) FROM hscale.schema_changes")
        .unwrap()
        .unwrap();
    assert_eq!(left, 0, "the change is finished");
    let ids: Vec<u32> = proxy
        .connect(Some(&db))
        .query("SELECT id FROM users WHERE nickname = 'n3'")
        .unwrap();
    assert_eq!(ids, [3]);
    drop(proxy);

    // Recorded but never sent: the definition is as recorded, so it runs.
    let (_, mut d) = index_change_left("recover_unsent");
    let _proxy = Proxy::for_cluster();
    assert_eq!(indexes_on_nickname(&mut d, "users_odd"), ["nickname"]);
}

/// Waits until no move of `db`'s tables is running.
fn wait_for_moves(db: &str) {
    let mut main = cluster().direct(1, None);
    let started = std::time::Instant::now();
    loop {
        let running: u64 = main
            .exec_first(
                "SELECT COUNT(*) FROM hscale.moves WHERE db = ? AND phase NOT IN ('done', 'failed', 'cancelled')",
                (db,),
            )
            .unwrap()
            .unwrap();
        if running == 0 {
            return;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(120),
            "a move of {db} is still running"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

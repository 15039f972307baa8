//! Routing one-liners: SQL in, physical tables and rewritten SQL out.

use hscale_merge::Place;
use hscale_planner::{
    plan, Action, AutoColumn, ClientCharset, ColumnKind, Combine, Context, Dictionary, Format,
    HashFunction, Listing, Maintained, Merge, NameColumn, PartitionEntry, PartitionState,
    PartitionedTable, PhysicalId, PlanCache, Quoting, Route, SchemaEffect, SessionChange,
    TableDefinition, TableName,
};

/// `app.users` by PREFIX(3) of nickname (column 2): default on backend 1,
/// nick1 ('mar') on backend 2, nick2 ('pet', 'pau') on backend 1.
/// `app.orders` by MOD(4) of user_id (column 1), default on 1, p1 (1) on 2.
fn dictionary() -> Dictionary {
    let entry = |name: &str, value: &str, backend| PartitionEntry {
        name: name.into(),
        value: value.into(),
        backend,
        state: PartitionState::Active,
    };
    let table = |name: &str| TableName {
        db: "app".into(),
        name: name.into(),
    };
    Dictionary::new(
        1,
        vec![
            PartitionedTable::new(
                TableDefinition {
                    table: table("users"),
                    column: "nickname".into(),
                    column_position: 2,
                    kind: ColumnKind::Text,
                    function: HashFunction::Prefix(3),
                    default_table: "users_default".into(),
                    default_backend: 1,
                    auto_column: None,
                    folding: Default::default(),
                },
                vec![
                    entry("nick1", "mar", 2),
                    entry("nick2", "pet", 1),
                    entry("nick2", "pau", 1),
                ],
            ),
            PartitionedTable::new(
                TableDefinition {
                    table: table("orders"),
                    column: "user_id".into(),
                    column_position: 1,
                    kind: ColumnKind::Integer,
                    function: HashFunction::Mod(4),
                    default_table: "orders_default".into(),
                    default_backend: 1,
                    auto_column: None,
                    folding: Default::default(),
                },
                vec![entry("p1", "1", 2)],
            ),
        ],
    )
}

/// `app.events` partitioned on its integer column `id`.
fn events(
    function: HashFunction,
    default_backend: u32,
    entries: Vec<PartitionEntry>,
) -> PartitionedTable {
    PartitionedTable::new(
        TableDefinition {
            table: TableName {
                db: "app".into(),
                name: "events".into(),
            },
            column: "id".into(),
            column_position: 1,
            kind: ColumnKind::Integer,
            function,
            default_table: "events_default".into(),
            default_backend,
            auto_column: None,
            folding: Default::default(),
        },
        entries,
    )
}

/// A session in `db` whose main backend is 1.
fn context<'a>(dictionary: &'a Dictionary, db: &'a str) -> Context<'a> {
    Context {
        db: Some(db),
        quoting: Quoting::BACKSLASH_ESCAPES,
        no_auto_value_on_zero: false,
        tables_locked: false,
        charset: ClientCharset::Utf8,
        dictionary,
        main_backend: 1,
        passed_fences: &[],
    }
}

#[test]
fn load_data_local_runs_on_each_partition_table_with_the_clients_format() {
    let Action::Load(load) = plan_of(
        "LOAD DATA LOCAL INFILE '/tmp/u.csv' REPLACE INTO TABLE app.users CHARACTER SET utf8mb4 \
         FIELDS TERMINATED BY ',' OPTIONALLY ENCLOSED BY '\"' LINES TERMINATED BY '\\r\\n' \
         IGNORE 1 LINES (@skip, id, nickname) SET label = UPPER(@skip)",
    ) else {
        panic!("expected a load");
    };
    assert_eq!(load.ignore_lines, 1);
    assert!(load.replace);
    assert_eq!(
        load.format,
        Format {
            field_end: b",".to_vec(),
            enclosed: Some(b'"'),
            escape: Some(b'\\'),
            line_end: b"\r\n".to_vec(),
        }
    );
    let target = hscale_planner::Target::new("app", 2, "users_nick1", Some("nick1"));
    // hscale skips the ignored line: the backends get the others.
    assert_eq!(
        load.statement(&target),
        "LOAD DATA LOCAL INFILE '/tmp/u.csv' REPLACE INTO TABLE `app`.`users_nick1` CHARACTER SET \
         utf8mb4 FIELDS TERMINATED BY ',' OPTIONALLY ENCLOSED BY '\"' LINES TERMINATED BY \
         '\\r\\n'  (@skip, id, nickname) SET label = UPPER(@skip)"
    );
    // The partition column is the list's third field.
    let wanted = load.wanted();
    let read = |line: &[u8]| load.format.read_line(line, true, &wanted, 3).unwrap();
    let placed = load.place(&read(b"x,7,\"MARtin\"\r\n"), 2).unwrap();
    assert_eq!(placed.target, target);
    assert!(load
        .place(&read(b"x,7\r\n"), 3)
        .unwrap_err()
        .to_string()
        .contains("line 3"));
    assert!(load
        .place(&read(b"x,7,NULL\r\n"), 4)
        .unwrap_err()
        .to_string()
        .contains("NULL"));

    // Without a column list the partition column is the table's second.
    let Action::Load(load) = plan_of("load data local infile 'u' into table users") else {
        panic!("expected a load");
    };
    let placed = load.place(
        &load
            .format
            .read_line(b"1\tpeter\n", true, &load.wanted(), 3)
            .unwrap(),
        1,
    );
    assert_eq!(placed.unwrap().target.table.as_ref(), "users_nick2");
    let ascii_only = load.place(
        &load
            .format
            .read_line("1\tmäx".as_bytes(), true, &[1], 3)
            .unwrap(),
        1,
    );
    assert!(ascii_only
        .unwrap_err()
        .to_string()
        .contains("CHARACTER SET utf8mb4"));
}

#[test]
fn load_data_reads_every_spelling_of_its_character_set() {
    for spelling in ["CHARACTER SET", "CHAR SET", "CHARSET"] {
        let sql = format!("LOAD DATA LOCAL INFILE 'u' INTO TABLE users {spelling} 'utf8mb4'");
        let Action::Load(load) = plan_of(&sql) else {
            panic!("{sql}: expected a load");
        };
        let line = load
            .format
            .read_line("1\tmarié\n".as_bytes(), true, &load.wanted(), 3)
            .unwrap();
        let placed = load.place(&line, 1).unwrap();
        assert_eq!(placed.target.table.as_ref(), "users_nick1", "{sql}");

        let sql = format!("LOAD DATA LOCAL INFILE 'u' INTO TABLE users {spelling} sjis");
        let said = refusal(&sql);
        assert!(said.contains("CHARACTER SET sjis"), "{sql}: {said}");
    }
}

#[test]
fn load_data_moves_the_id_sequence_past_the_ids_it_gives() {
    let dictionary = with_auto_increment();
    let ctx = context(&dictionary, "app");
    let planned = |sql: &str| plan(sql.as_bytes(), &ctx, &mut PlanCache::default()).action;
    let Action::Load(load) = planned("LOAD DATA LOCAL INFILE 'i' INTO TABLE items") else {
        panic!("expected a load");
    };
    let place = |line: &[u8]| {
        load.place(
            &load
                .format
                .read_line(line, true, &load.wanted(), 2)
                .unwrap(),
            1,
        )
    };
    let placed = place(b"41\tx\n").unwrap();
    assert_eq!(
        (placed.id, placed.target.table.as_ref()),
        (Some(41), "items_p1")
    );
    assert!(place(b"\\N\tx\n")
        .unwrap_err()
        .to_string()
        .contains("gives no id"));
    assert!(place(b"0\tx\n")
        .unwrap_err()
        .to_string()
        .contains("gives no id"));
    match planned("LOAD DATA LOCAL INFILE 'i' INTO TABLE items (label)") {
        Action::Refuse(refusal) => assert!(refusal.reason.contains("give every row its id")),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn plan_of(sql: &str) -> Action {
    let dictionary = dictionary();
    let ctx = context(&dictionary, "app");
    plan(sql.as_bytes(), &ctx, &mut PlanCache::default()).action
}

fn route(sql: &str) -> Route {
    match plan_of(sql) {
        Action::Route(route) => route,
        other => panic!("{sql}: expected a route, got {other:?}"),
    }
}

/// (backend, SQL) of each step.
fn steps(sql: &str) -> Vec<(u32, String)> {
    route(sql)
        .steps
        .into_iter()
        .map(|s| (s.target.backend, s.sql))
        .collect()
}

fn refusal(sql: &str) -> String {
    match plan_of(sql) {
        Action::Refuse(r) => r.reason,
        other => panic!("{sql}: expected a refusal, got {other:?}"),
    }
}

/// A SELECT the partitions cannot answer alone: the copies it runs on.
fn federation(sql: &str) -> hscale_planner::Federation {
    match plan_of(sql) {
        Action::Federate(f) => *f,
        other => panic!("{sql}: expected copies, got {other:?}"),
    }
}

#[test]
fn routes_point_select_to_one_partition() {
    assert_eq!(
        steps("SELECT * FROM users WHERE nickname = 'Martin'"),
        [(
            2,
            "SELECT * FROM `users_nick1` AS `users` WHERE nickname = 'Martin'".into()
        )]
    );
    assert_eq!(
        steps("SELECT * FROM users WHERE nickname = 'zoe'"),
        [(
            1,
            "SELECT * FROM `users_default` AS `users` WHERE nickname = 'zoe'".into()
        )]
    );
    assert_eq!(
        route("SELECT * FROM users WHERE 'paula' = nickname").merge,
        Merge::Single
    );
}

#[test]
fn keeps_qualifiers_aliases_backticks_databases_comments_and_hints() {
    assert_eq!(
        steps("SELECT users.id FROM app.`users` WHERE users.nickname='mar' /* c */"),
        [(
            2,
            "SELECT users.id FROM app.`users_nick1` AS `users` WHERE users.nickname='mar' /* c */"
                .into()
        )]
    );
    assert_eq!(
        steps("SELECT /*+ NO_ICP(u) */ u.id FROM users u WHERE u.nickname IN ('peter')"),
        [(
            1,
            "SELECT /*+ NO_ICP(u) */ u.id FROM `users_nick2` u WHERE u.nickname IN ('peter')"
                .into()
        )]
    );
    assert_eq!(
        steps("SELECT app.users.id FROM users WHERE nickname='Mar'"),
        [(
            2,
            "SELECT `users`.id FROM `users_nick1` AS `users` WHERE nickname='Mar'".into()
        )]
    );
}

#[test]
fn in_lists_go_to_each_partition_once_and_concatenate() {
    let r = route("SELECT id FROM users WHERE nickname IN ('martin', 'marvin', 'paula', 'zoe')");
    let tables: Vec<&str> = r.steps.iter().map(|s| &*s.target.table).collect();
    assert_eq!(tables, ["users_nick1", "users_nick2", "users_default"]);
    assert_eq!(r.merge, Merge::Rows(Default::default()));
}

#[test]
fn a_where_without_the_partition_column_scans_every_partition() {
    let r = route("SELECT * FROM users WHERE id > 3 OR nickname = 'mar'");
    let tables: Vec<&str> = r.steps.iter().map(|s| &*s.target.table).collect();
    assert_eq!(tables, ["users_default", "users_nick1", "users_nick2"]);
    let r = route("SELECT * FROM users WHERE id = 3 AND (nickname = 'mar')");
    assert_eq!(r.steps.len(), 1);
}

#[test]
fn scans_that_need_a_merge_hscale_lacks_run_on_copies() {
    for (sql, what) in [
        (
            "SELECT 1 + SUM(id) / COUNT(*) FROM users",
            "a division inside",
        ),
        ("SELECT AVG(id) * 2 FROM users", "AVG() inside"),
        ("SELECT MOD(COUNT(*), 2) FROM users", "of aggregates"),
        ("SELECT COUNT(DISTINCT id) FROM users", "DISTINCT"),
        (
            "SELECT id FROM users GROUP BY id HAVING COUNT(*) > 1",
            "HAVING",
        ),
        (
            "SELECT id FROM users GROUP BY id ORDER BY nickname",
            "which the select list does not have",
        ),
        ("SELECT *, COUNT(*) FROM users", "*"),
        ("SELECT id FROM users LIMIT 1 + 1", "LIMIT"),
        ("SELECT * FROM users ORDER BY 3", "position of `*`"),
        ("SELECT id FROM users ORDER BY id NULLS FIRST", "NULLS"),
    ] {
        let reason = federation(sql).reason;
        assert!(reason.contains(what), "{sql}: {reason}");
    }
    // One partition answers them all itself.
    assert_eq!(
        route("SELECT COUNT(*) FROM users WHERE nickname = 'mar' ORDER BY 1 LIMIT 1")
            .steps
            .len(),
        1
    );
}

#[test]
fn groups_and_aggregates_send_their_parts_and_sort_by_the_group() {
    let r = route(
        "SELECT grp, COUNT(*), MIN(nickname), AVG(id) FROM users WHERE id > 1 GROUP BY grp LIMIT 3",
    );
    let spec = match &r.merge {
        Merge::Rows(spec) => *spec.clone(),
        other => panic!("{other:?}"),
    };
    use hscale_merge::Combine;
    assert_eq!(
        spec.groups,
        Some(vec![
            Combine::First,
            Combine::Count,
            Combine::Min {
                weight: 0,
                collation: 1
            },
            Combine::Avg { sum: 2, count: 3 },
        ])
    );
    // The group key is a selected column: read there, not sent twice.
    assert_eq!(
        (spec.keys[0].value, spec.hidden, spec.limit),
        (Place::Visible(0), 6, Some(3))
    );
    assert_eq!(
        r.steps[0].sql,
        "SELECT grp, COUNT(*), MIN(nickname), AVG(id) , WEIGHT_STRING(MIN(nickname)) AS `__hscale_0`, \
         COLLATION(MIN(nickname)) AS `__hscale_1`, SUM(id) AS `__hscale_2`, COUNT(id) AS `__hscale_3`, \
         WEIGHT_STRING((grp)) AS `__hscale_4`, COLLATION((grp)) AS `__hscale_5` \
         FROM `users_default` AS `users` WHERE id > 1 GROUP BY grp ORDER BY 1 LIMIT 3"
    );
    // DISTINCT: a group per distinct row, grouped by its columns on each
    // partition (the added columns must not make rows distinct), by
    // position: a literal's text would be a position, an alias's a column.
    let r = route("SELECT DISTINCT nickname FROM users");
    assert_eq!(
        r.steps[0].sql,
        "SELECT  nickname , WEIGHT_STRING((nickname)) AS `__hscale_0`, \
         COLLATION((nickname)) AS `__hscale_1` FROM `users_default` AS `users` GROUP BY 1 \
         ORDER BY 1"
    );
    first_step_is("SELECT DISTINCT 56, - 11 AS grp, grp FROM users", |sql| {
        sql.ends_with("GROUP BY 1, 2, 3 ORDER BY 1, 2, 3")
    });
    // Over the GROUP BY's own keys DISTINCT is the groups; over others it
    // is refused, never a second GROUP BY.
    first_step_is("SELECT DISTINCT grp FROM users GROUP BY grp", |sql| {
        sql.ends_with("GROUP BY grp ORDER BY 1")
    });
    assert!(matches!(
        plan_of("SELECT DISTINCT nickname FROM users GROUP BY grp"),
        Action::Federate(f) if f.reason.contains("DISTINCT over a GROUP BY")
    ));
    // A key that is not selected, or past a `*`, goes as a copy.
    first_step_is(
        "SELECT id FROM users GROUP BY grp ORDER BY grp LIMIT 1",
        |sql| sql.contains("(grp) AS `__hscale_0`"),
    );
    first_step_is(
        "SELECT *, LOWER(nickname) AS l FROM users ORDER BY LOWER(nickname)",
        |sql| sql.contains("(LOWER(nickname)) AS `__hscale_0`"),
    );
}

/// Asserts what the first step's statement of `sql` is like.
fn first_step_is(sql: &str, holds: impl Fn(&str) -> bool) {
    let step = &route(sql).steps[0].sql;
    assert!(holds(step), "{sql}: {step}");
}

#[test]
fn order_by_and_limit_over_several_partitions_send_keys_and_raise_the_limit() {
    let r = route(
        "SELECT id, nickname AS nick FROM users WHERE id > 1 ORDER BY nick DESC, 1 LIMIT 5, 10",
    );
    let spec = match &r.merge {
        Merge::Rows(spec) => *spec.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!((spec.offset, spec.limit, spec.hidden), (5, Some(10), 4));
    assert!(spec.keys[0].descending && !spec.keys[1].descending);
    let second = spec.keys[1];
    assert_eq!(
        (second.value, second.weight, second.collation),
        (Place::Visible(0), 2, 3)
    );
    assert_eq!(
        r.steps[0].sql,
        "SELECT id, nickname AS nick , \
         WEIGHT_STRING((nickname)) AS `__hscale_0`, COLLATION((nickname)) AS `__hscale_1`, \
         WEIGHT_STRING((id)) AS `__hscale_2`, \
         COLLATION((id)) AS `__hscale_3` FROM `users_default` AS `users` \
         WHERE id > 1 ORDER BY nick DESC, 1 LIMIT 15"
    );
    let r = route("SELECT * FROM users /* c */ LIMIT 3 OFFSET 2");
    assert_eq!(
        r.merge,
        Merge::Rows(Box::new(hscale_merge::Spec {
            offset: 2,
            limit: Some(3),
            ..Default::default()
        }))
    );
    assert_eq!(
        r.steps[1].sql,
        "SELECT * FROM `users_nick1` AS `users` /* c */ LIMIT 5"
    );
    // On one partition the statement stays as the client wrote it.
    assert_eq!(
        steps("SELECT id FROM users WHERE nickname = 'mar' ORDER BY id LIMIT 2, 1"),
        [(
            2,
            "SELECT id FROM `users_nick1` AS `users` WHERE nickname = 'mar' ORDER BY id LIMIT 2, 1"
                .into()
        )]
    );
}

#[test]
fn splits_a_multi_row_insert_by_partition() {
    assert_eq!(
        steps("INSERT INTO users (id, nickname) VALUES (1, 'martin'), (2, 'zoe'), (3,'Marvin') ON DUPLICATE KEY UPDATE id = id"),
        [
            (2, "INSERT INTO `users_nick1` (id, nickname) VALUES (1, 'martin'), (3,'Marvin') ON DUPLICATE KEY UPDATE id = id".into()),
            (1, "INSERT INTO `users_default` (id, nickname) VALUES (2, 'zoe') ON DUPLICATE KEY UPDATE id = id".into()),
        ]
    );
    assert_eq!(
        steps("REPLACE INTO orders VALUES (5, 'x')"),
        [(2, "REPLACE INTO `orders_p1` VALUES (5, 'x')".into())]
    );
    assert_eq!(
        steps("INSERT INTO users SET id = 9, nickname = 'peter'"),
        [(
            1,
            "INSERT INTO `users_nick2` SET id = 9, nickname = 'peter'".into()
        )]
    );
}

#[test]
fn updates_and_deletes_route_by_where_and_sum_affected_rows_when_scanning() {
    assert_eq!(
        steps("UPDATE users SET id = id + 1 WHERE nickname = 'martin'"),
        [(
            2,
            "UPDATE `users_nick1` AS `users` SET id = id + 1 WHERE nickname = 'martin'".into()
        )]
    );
    assert_eq!(
        steps("DELETE FROM users WHERE users.nickname = 'pa'"),
        [(
            1,
            "DELETE FROM `users_default` WHERE `users_default`.nickname = 'pa'".into()
        )]
    );
    let r = route("DELETE FROM orders WHERE id > 10");
    assert_eq!(
        (r.steps.len(), r.merge, r.writes),
        (2, Merge::AffectedRows, true)
    );
}

#[test]
fn refuses_what_partitions_cannot_answer() {
    for (sql, reason) in [
        (
            "INSERT INTO users (id) VALUES (1)",
            "without the partition column",
        ),
        (
            "INSERT INTO users (id, nickname) VALUES (1, CONCAT('a', 'b'))",
            "literal",
        ),
        (
            "UPDATE users SET nickname = 'x' WHERE id = 1",
            "changes the partition column",
        ),
        ("INSERT INTO users SELECT * FROM t", "INSERT ... SELECT"),
        ("DROP TABLE users, plain", "with other tables"),
        (
            "ALTER TABLE users DROP COLUMN nickname",
            "partition column `nickname`",
        ),
        (
            "ALTER TABLE users CHANGE nickname nick TEXT",
            "partition column",
        ),
        ("ALTER TABLE users RENAME TO people", "use RENAME TABLE"),
        ("RENAME TABLE users TO a, plain TO b", "several tables"),
        (
            "RENAME TABLE plain TO orders",
            "name of a partitioned table",
        ),
        ("RENAME TABLE users TO other.users", "another database"),
        ("SELECT 1; SELECT * FROM users", "several statements"),
        ("SELECT * FROM users PROCEDURE ANALYSE()", "cannot parse"),
        (
            "LOAD DATA INFILE '/tmp/u.csv' INTO TABLE users",
            "use LOAD DATA LOCAL INFILE",
        ),
        (
            "load xml local infile 'u.xml' into table app.users",
            "LOAD XML into a partitioned table",
        ),
        (
            "LOAD DATA LOCAL INFILE 'u' INTO TABLE users; SELECT 1",
            "among other statements",
        ),
        (
            "LOAD DATA LOCAL INFILE 'u' INTO TABLE users (id, @n) SET nickname = @n",
            "sets the column `nickname`",
        ),
        (
            "LOAD DATA LOCAL INFILE 'u' INTO TABLE users (id, label)",
            "lacks the partition column `nickname`",
        ),
        (
            "LOAD DATA LOCAL INFILE 'u' INTO TABLE users LINES STARTING BY 'x'",
            "STARTING BY",
        ),
        (
            "LOAD DATA LOCAL INFILE 'u' INTO TABLE users FIELDS TERMINATED BY ''",
            "fixed-width",
        ),
        (
            "LOAD DATA LOCAL INFILE 'u' INTO TABLE users CHARACTER SET sjis",
            "CHARACTER SET sjis",
        ),
        ("HANDLER users OPEN", "HANDLER on a partitioned table"),
    ] {
        let said = refusal(sql);
        assert!(said.contains(reason), "{sql}: {said}");
    }
}

#[test]
fn selects_the_partitions_cannot_answer_run_on_copies() {
    for (sql, reason) in [
        (
            "SELECT * FROM orders WHERE user_id = 'abc'",
            "not a value of the integer",
        ),
        (
            "SELECT * FROM users JOIN orders ON users.id = orders.user_id",
            "not co-located: `app`.`users` (text column, PREFIX(3)) and `app`.`orders` (integer column, MOD(4)) are not partitioned alike",
        ),
        (
            "SELECT * FROM users WHERE nickname = 'mar' UNION SELECT * FROM t",
            "UNION",
        ),
        (
            "SELECT * FROM t WHERE id IN (SELECT id FROM users)",
            "subquery",
        ),
        (
            "SELECT * FROM users JOIN plain ON plain.id = users.id WHERE nickname = 'mar'",
            "not partitioned",
        ),
    ] {
        let said = federation(sql).reason;
        assert!(said.contains(reason), "{sql}: {said}");
    }
    // What no copy helps with stays refused.
    for (sql, reason) in [
        ("SELECT * FROM users PROCEDURE ANALYSE()", "cannot parse"),
        (
            "SELECT * FROM users JOIN orders ON users.id = orders.user_id FOR UPDATE",
            "a locking read",
        ),
    ] {
        let said = refusal(sql);
        assert!(said.contains(reason), "{sql}: {said}");
    }
}

#[test]
fn insert_select_runs_where_both_sides_live() {
    // Rows of partitions into a plain table, which lives on the main backend.
    assert_eq!(
        steps("INSERT INTO archive SELECT * FROM users WHERE nickname = 'pet'"),
        [(
            1,
            "INSERT INTO archive SELECT * FROM `users_nick2` AS `users` WHERE nickname = 'pet'"
                .into()
        )]
    );
    let two =
        route("INSERT INTO archive (id) SELECT id FROM users WHERE nickname IN ('pet', 'zoe')");
    assert_eq!(two.merge, Merge::AffectedRows);
    assert!(two.writes);
    assert_eq!(two.backends(), [1]);
    // Rows whose partition column the SELECT fixes go to that partition.
    assert_eq!(
        steps("INSERT INTO users (id, nickname) SELECT id, 'peter' FROM t"),
        [(
            1,
            "INSERT INTO `users_nick2` (id, nickname) SELECT id, 'peter' FROM t".into()
        )]
    );
    for (sql, reason) in [
        ("INSERT INTO archive SELECT * FROM users", "backend 2"),
        (
            "INSERT INTO archive SELECT COUNT(*) FROM users",
            "over several partitions",
        ),
        (
            "INSERT INTO users (id, nickname) SELECT id, 'martin' FROM t",
            "backend 2",
        ),
        (
            "INSERT INTO users (id, nickname) SELECT id, name FROM t",
            "not a literal",
        ),
        (
            "INSERT INTO archive VALUES ((SELECT MAX(id) FROM users))",
            "subquery",
        ),
    ] {
        let said = refusal(sql);
        assert!(said.contains(reason), "{sql}: {said}");
    }
}

/// (backend, SQL) of each step of a schema change, and its effect.
fn schema_steps(sql: &str) -> (Vec<(u32, String)>, SchemaEffect) {
    match plan_of(sql) {
        Action::Schema(change) => (
            change
                .steps
                .into_iter()
                .map(|s| (s.target.backend, s.sql))
                .collect(),
            change.effect,
        ),
        other => panic!("{sql}: expected a schema change, got {other:?}"),
    }
}

#[test]
fn schema_statements_run_on_every_physical_table() {
    let (steps, effect) = schema_steps("ALTER TABLE app.`users` ADD COLUMN age INT /* c */");
    assert_eq!(
        steps,
        [
            (
                1,
                "ALTER TABLE app.`users_default` ADD COLUMN age INT /* c */".into()
            ),
            (
                2,
                "ALTER TABLE app.`users_nick1` ADD COLUMN age INT /* c */".into()
            ),
            (
                1,
                "ALTER TABLE app.`users_nick2` ADD COLUMN age INT /* c */".into()
            ),
        ]
    );
    assert_eq!(effect, SchemaEffect::Unchanged);
    let (steps, _) = schema_steps("TRUNCATE orders");
    assert_eq!(
        steps,
        [
            (1, "TRUNCATE `orders_default`".into()),
            (2, "TRUNCATE `orders_p1`".into())
        ]
    );
    let (steps, _) = schema_steps("DROP INDEX by_age ON users");
    assert_eq!(steps[1], (2, "DROP INDEX by_age ON `users_nick1`".into()));
    let (steps, effect) = schema_steps("DROP TABLE IF EXISTS orders");
    assert_eq!(
        steps,
        [
            (1, "DROP TABLE IF EXISTS `app`.`orders_default`".into()),
            (2, "DROP TABLE IF EXISTS `app`.`orders_p1`".into())
        ]
    );
    assert_eq!(effect, SchemaEffect::Dropped);
    let (steps, effect) = schema_steps("RENAME TABLE users TO people");
    assert_eq!(
        steps,
        [
            (
                1,
                "RENAME TABLE `app`.`users_default` TO `app`.`people_default`".into()
            ),
            (
                2,
                "RENAME TABLE `app`.`users_nick1` TO `app`.`people_nick1`".into()
            ),
            (
                1,
                "RENAME TABLE `app`.`users_nick2` TO `app`.`people_nick2`".into()
            ),
        ]
    );
    assert_eq!(
        effect,
        SchemaEffect::Renamed(TableName {
            db: "app".into(),
            name: "people".into()
        })
    );
    assert!(matches!(
        plan_of("CREATE TABLE IF NOT EXISTS users (id INT)"),
        Action::Exists { quiet: true, .. }
    ));
    assert!(matches!(
        plan_of("DROP TEMPORARY TABLE users"),
        Action::Main
    ));
}

#[test]
fn joins_with_plain_tables_run_where_those_live() {
    assert_eq!(
        steps("SELECT * FROM users JOIN plain p ON p.id = users.id WHERE nickname = 'paul'"),
        [(1, "SELECT * FROM `users_nick2` AS `users` JOIN plain p ON p.id = users.id WHERE nickname = 'paul'".into())]
    );
}

#[test]
fn statements_on_other_tables_are_not_routed() {
    for sql in [
        "SELECT users FROM stats",
        "SELECT * FROM other.users",
        "SELECT 1",
        "INSERT INTO log VALUES ('users')",
    ] {
        assert!(matches!(plan_of(sql), Action::Main), "{sql}");
    }
}

#[test]
fn several_statements_read_back_what_their_sets_and_use_change() {
    let change = |sql: &str| {
        let dictionary = dictionary();
        let ctx = context(&dictionary, "app");
        plan(sql.as_bytes(), &ctx, &mut PlanCache::default()).change
    };
    let read_back = |keys: &[&str], database| SessionChange::ReadBack {
        keys: keys.iter().map(|k| k.to_string()).collect(),
        database,
    };
    assert_eq!(
        change("SET time_zone = '+05:00'; SELECT 1"),
        read_back(&["time_zone"], false)
    );
    assert_eq!(
        change(
            "SELECT ';'; SET @z = 1; set SESSION sql_mode = '', time_zone = @z; SET autocommit = 0"
        ),
        read_back(&["sql_mode", "time_zone"], false)
    );
    assert_eq!(
        change("SET NAMES latin1; USE other"),
        read_back(
            &[
                "character_set_client",
                "character_set_connection",
                "character_set_results",
                "collation_connection"
            ],
            true
        )
    );
    assert_eq!(change("DO 1; DROP DATABASE other"), read_back(&[], true));
    assert_eq!(
        change("SELECT 1; /* USE other; */ SELECT 2"),
        SessionChange::Nothing
    );
    assert_eq!(
        change("SET GLOBAL max_connections = 10; SELECT 1"),
        SessionChange::Nothing
    );
    // Alone, a SET is replayed as written unless a user variable gives its value.
    assert_eq!(
        change("SET time_zone = '+05:00'"),
        SessionChange::Setting(vec!["time_zone".into()], "SET time_zone = '+05:00'".into())
    );
    assert_eq!(
        change("SET time_zone = @z"),
        read_back(&["time_zone"], false)
    );
}

#[test]
fn a_locked_table_makes_statements_wait() {
    let mut dict = dictionary();
    let mut users = dict.table("app", "users").unwrap().clone();
    users.entries[0].state = PartitionState::Copying;
    let users = PartitionedTable::new(users.definition(), users.entries.clone());
    dict = Dictionary::new(2, vec![users]);
    let ctx = context(&dict, "app");
    let action = plan(
        b"SELECT * FROM users WHERE nickname = 'zoe'",
        &ctx,
        &mut PlanCache::default(),
    )
    .action;
    assert!(matches!(action, Action::Wait(t) if t.name == "users"));
}

#[test]
fn a_cached_shape_serves_only_the_snapshot_it_was_planned_in() {
    let sql = b"SELECT * FROM users WHERE nickname = 'zoe'";
    let unlocked = dictionary();
    let mut cache = PlanCache::default();
    for _ in 0..2 {
        let action = plan(sql, &context(&unlocked, "app"), &mut cache).action;
        assert!(matches!(action, Action::Route(_)), "{action:?}");
    }
    assert_eq!(cache.hits(), 1);
    // The admin lock reads the dictionary again: the same version, a table
    // locked since. The cached shape (and the table it keeps) must not serve.
    let mut users = unlocked.table("app", "users").unwrap().clone();
    users.entries[0].state = PartitionState::Copying;
    let locked = Dictionary::new(
        unlocked.version,
        vec![PartitionedTable::new(
            users.definition(),
            users.entries.clone(),
        )],
    );
    let action = plan(sql, &context(&locked, "app"), &mut cache).action;
    assert!(
        matches!(&action, Action::Wait(t) if t.name == "users"),
        "{action:?}"
    );
    assert_eq!(cache.hits(), 1);
}

#[test]
fn describe_answers_for_the_default_table() {
    assert_eq!(steps("DESC users"), [(1, "DESC `users_default`".into())]);
    assert_eq!(
        steps("SHOW COLUMNS FROM app.users"),
        [(1, "SHOW COLUMNS FROM app.`users_default`".into())]
    );
}

#[test]
fn an_unparsable_statement_passes_through_where_no_partitioned_table_could_be_meant() {
    let dictionary = dictionary();
    let in_db = |db| context(&dictionary, db);
    let sql = b"SELECT users FROM stats PROCEDURE ANALYSE()";
    let mut cache = PlanCache::default();
    assert!(matches!(
        plan(sql, &in_db("shop"), &mut cache).action,
        Action::Main
    ));
    assert!(matches!(
        plan(sql, &in_db("app"), &mut cache).action,
        Action::Refuse(_)
    ));
}

/// A warm cache answers exactly as planning from scratch, for statements of
/// one shape with other literals, other comments and other spacing: scans
/// too, whose merges are the cache's when no literal shapes them.
#[test]
fn a_cached_shape_plans_like_a_fresh_parse() {
    let dictionary = dictionary();
    let ctx = context(&dictionary, "app");
    let mut warm = PlanCache::default();
    let names = ["Martin", "zoe", "pa''ul", "PETER", "ma\\'r", "x"];
    let cached = [
        "SELECT id, nickname FROM users WHERE nickname = '{a}' /* {n} */",
        "SELECT u.id FROM app.users u WHERE u.nickname IN ('{a}', '{b}')",
        "UPDATE users SET id = {n} WHERE nickname = '{a}' AND id > -{n}",
        "DELETE FROM users WHERE users.nickname = '{b}'",
        "SELECT * FROM orders WHERE user_id = -{n}",
        "SELECT * FROM orders WHERE user_id IN ({n}, {m}) AND total > 1.5",
        "SELECT COUNT(*) FROM orders WHERE user_id = {m}",
        "SELECT users FROM stats WHERE x = {n}",
        "INSERT INTO archive (id) SELECT id FROM users WHERE nickname IN ('{a}', '{b}')",
        "INSERT INTO users (id, nickname) VALUES ({n}, '{a}')",
        "INSERT INTO orders VALUES (-{m}, {n}) /* {n} */",
        "REPLACE INTO app.users SET id = {n}, nickname = '{b}'",
        "SELECT total FROM orders WHERE user_id BETWEEN {n} AND {n} + {m} ORDER BY total DESC",
        "SELECT DISTINCT total FROM orders WHERE user_id IN ({n}, {m}) ORDER BY total",
        "SELECT user_id, SUM(total) FROM orders WHERE total > {n} GROUP BY user_id",
        "SELECT * FROM orders WHERE user_id = {n} ORDER BY total LIMIT {m}",
        "INSERT INTO users (id, nickname) VALUES ({n}, '{a}'), ({m}, '{b}'), ({n}, 'x{a}')",
        "INSERT INTO orders VALUES (-{m}, {n}), ({n}, {m}) /* {n} */",
        "INSERT INTO app.users (nickname, id) VALUES ('{b}', {m}),('{a}', {n}) ON DUPLICATE KEY UPDATE id = id + {m}",
    ];
    // Literals that shape the merge of several partitions: planned anew
    // each time, and as a fresh parse plans them.
    let planned = [
        "SELECT * FROM orders WHERE total > 0 ORDER BY total LIMIT {n}, {m}",
        "SELECT user_id, SUM(total) FROM orders GROUP BY user_id HAVING SUM(total) > {m}",
        "SELECT id, total FROM orders ORDER BY {k}",
        "SELECT SUM(total) * {n} FROM orders WHERE user_id IN ({n}, {m})",
    ];
    for round in 0..40usize {
        for shape in cached.iter().chain(&planned) {
            let sql = shape
                .replace("{a}", names[round % names.len()])
                .replace("{b}", names[(round * 7 + 3) % names.len()])
                .replace("{n}", &(round * 13).to_string())
                .replace("{m}", &(round * 5 + 1).to_string())
                .replace("{k}", &(round % 2 + 1).to_string());
            let fresh = plan(sql.as_bytes(), &ctx, &mut PlanCache::default()).action;
            let cached = plan(sql.as_bytes(), &ctx, &mut warm).action;
            assert_eq!(format!("{cached:?}"), format!("{fresh:?}"), "{sql}");
        }
    }
    // The others hit too where their literals pick one partition.
    assert!(
        warm.hits() >= 39 * cached.len() as u64,
        "hits: {}",
        warm.hits()
    );
}

/// `app.items` by MOD(2) of its AUTO_INCREMENT `id` (column 1), p1 (1) on backend 2.
fn with_auto_increment() -> Dictionary {
    let table = PartitionedTable::new(
        TableDefinition {
            table: TableName {
                db: "app".into(),
                name: "items".into(),
            },
            column: "id".into(),
            column_position: 1,
            kind: ColumnKind::Integer,
            function: HashFunction::Mod(2),
            default_table: "items_default".into(),
            default_backend: 1,
            auto_column: Some(AutoColumn {
                name: "id".into(),
                position: 1,
            }),
            folding: Default::default(),
        },
        vec![PartitionEntry {
            name: "p1".into(),
            value: "1".into(),
            backend: 2,
            state: PartitionState::Active,
        }],
    );
    Dictionary::new(1, vec![table])
}

#[test]
fn inserts_that_leave_ids_to_the_server_get_hscales_ids_written_in() {
    let dictionary = with_auto_increment();
    let ctx = context(&dictionary, "app");
    let planned = |sql: &str| plan(sql.as_bytes(), &ctx, &mut PlanCache::default()).action;
    let filled = |sql: &str, first: u64| match planned(sql) {
        Action::Generate(generate) => (generate.count, generate.fill(sql, first).unwrap()),
        other => panic!("{sql}: expected ids to generate, got {other:?}"),
    };
    assert_eq!(
        filled("INSERT INTO items (label) VALUES ('a'), ('b' )", 7),
        (
            2,
            "INSERT INTO items (label, `id`) VALUES ('a', 7), ('b' , 8)".into()
        )
    );
    assert_eq!(
        filled(
            "INSERT INTO items VALUES (NULL, 'a'), (5, 'b'), (0, 'c')",
            10
        ),
        (
            2,
            "INSERT INTO items VALUES (10, 'a'), (5, 'b'), (11, 'c')".into()
        )
    );
    assert_eq!(
        filled("INSERT INTO items SET label = 'x'", 3),
        (1, "INSERT INTO items SET label = 'x', `id` = 3".into())
    );
    // With the ids written in, the rows are placed by them, and the highest
    // id given is what the sequence must move past.
    let Action::Route(route) = planned("INSERT INTO items VALUES (10, 'a'), (5, 'b'), (11, 'c')")
    else {
        panic!("expected a route");
    };
    assert_eq!(route.steps.len(), 2);
    assert_eq!(route.highest_id, Some(11));
    let refused = match planned("INSERT INTO items (label) SELECT name FROM other") {
        Action::Refuse(refusal) => refusal.reason,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert!(refused.contains("AUTO_INCREMENT"), "{refused}");
}

/// MariaDB stores a value for an AUTO_INCREMENT column rounded to an
/// integer, and picks the id where it is NULL, DEFAULT or 0 (a 0 is kept
/// under NO_AUTO_VALUE_ON_ZERO): hscale follows it, and refuses what it
/// cannot read as a number, which the server might turn into 0.
#[test]
fn ids_are_read_as_mariadb_stores_them() {
    let dictionary = with_auto_increment();
    let default = context(&dictionary, "app");
    let zero_kept = Context {
        no_auto_value_on_zero: true,
        ..context(&dictionary, "app")
    };
    let planned =
        |ctx: &Context, sql: &str| plan(sql.as_bytes(), ctx, &mut PlanCache::default()).action;
    let filled = |ctx: &Context, sql: &str| match planned(ctx, sql) {
        Action::Generate(generate) => generate.fill(sql, 20).unwrap(),
        other => panic!("{sql}: expected ids to generate, got {other:?}"),
    };
    assert_eq!(
        filled(
            &default,
            "INSERT INTO items VALUES (DEFAULT, 'a'), ('0', 'b'), (0.4, 'c'), (-0, 'd')"
        ),
        "INSERT INTO items VALUES (20, 'a'), (21, 'b'), (22, 'c'), (23, 'd')"
    );
    assert_eq!(
        filled(&default, "INSERT INTO items SET id = default, label = 'x'"),
        "INSERT INTO items SET id = 20, label = 'x'"
    );
    let highest = |ctx: &Context, sql: &str| match planned(ctx, sql) {
        Action::Route(route) => route.highest_id,
        other => panic!("{sql}: expected a route, got {other:?}"),
    };
    assert_eq!(
        highest(&default, "INSERT INTO items VALUES ('42', 'a'), (7, 'b')"),
        Some(42)
    );
    assert_eq!(
        highest(&default, "INSERT INTO items VALUES (-4, 'a')"),
        None
    );
    // Under NO_AUTO_VALUE_ON_ZERO a 0 is a row's id, as mysqldump's output
    // needs; NULL and DEFAULT still ask for one.
    assert_eq!(
        highest(&zero_kept, "INSERT INTO items VALUES (0, 'a')"),
        None
    );
    assert_eq!(
        filled(
            &zero_kept,
            "INSERT INTO items VALUES (0, 'a'), (NULL, 'b'), (DEFAULT, 'c')"
        ),
        "INSERT INTO items VALUES (0, 'a'), (20, 'b'), (21, 'c')"
    );
    for sql in [
        "INSERT INTO items VALUES (@next, 'a')",
        "INSERT INTO items VALUES ('abc', 'a')",
        "INSERT INTO items SET id = 1 + 1, label = 'a'",
    ] {
        match planned(&default, sql) {
            Action::Refuse(refusal) => assert!(
                refusal.reason.contains("AUTO_INCREMENT column `id`"),
                "{sql}: {}",
                refusal.reason
            ),
            other => panic!("{sql}: expected a refusal, got {other:?}"),
        }
    }
}

/// `orders` of `dictionary()` with `items` partitioned alike (co-located)
/// and `payments` partitioned alike but with p1 on another backend.
fn joined_dictionary() -> Dictionary {
    let base = dictionary();
    let orders = base.table("app", "orders").unwrap().clone();
    let like_orders = |name: &str, p1_backend: u32| {
        let mut definition = orders.definition();
        definition.table.name = name.into();
        definition.default_table = format!("{name}_default");
        let mut entries = orders.entries.clone();
        entries[0].backend = p1_backend;
        PartitionedTable::new(definition, entries)
    };
    let mut tables: Vec<PartitionedTable> = base.tables().into_iter().cloned().collect();
    tables.push(like_orders("items", 2));
    tables.push(like_orders("payments", 1));
    Dictionary::new(1, tables)
}

fn joined_plan(sql: &str, cache: &mut PlanCache) -> Action {
    let dictionary = joined_dictionary();
    let ctx = context(&dictionary, "app");
    plan(sql.as_bytes(), &ctx, cache).action
}

fn joined_steps(sql: &str) -> Vec<(u32, String)> {
    match joined_plan(sql, &mut PlanCache::default()) {
        Action::Route(route) => route
            .steps
            .into_iter()
            .map(|s| (s.target.backend, s.sql))
            .collect(),
        other => panic!("{sql}: expected a route, got {other:?}"),
    }
}

#[test]
fn joins_of_co_located_tables_run_partition_by_partition() {
    assert_eq!(
        joined_steps(
            "SELECT o.user_id, i.sku FROM orders o JOIN items i ON o.user_id = i.user_id WHERE o.user_id = 5"
        ),
        [(2, "SELECT o.user_id, i.sku FROM `orders_p1` o JOIN `items_p1` i ON o.user_id = i.user_id WHERE o.user_id = 5".into())]
    );
    // The joined table's column picks the partitions too: its values equal
    // the routed table's.
    assert_eq!(
        joined_steps(
            "SELECT * FROM orders LEFT JOIN items ON orders.user_id = items.user_id WHERE items.user_id IN (2, 6)"
        ),
        [(1, "SELECT * FROM `orders_default` AS `orders` LEFT JOIN `items_default` AS `items` ON orders.user_id = items.user_id WHERE items.user_id IN (2, 6)".into())]
    );
    // Every pair of partitions, each on the backend that holds both.
    assert_eq!(
        joined_steps("SELECT * FROM orders o, items i WHERE i.user_id = o.user_id AND o.total > 3"),
        [
            (1, "SELECT * FROM `orders_default` o, `items_default` i WHERE i.user_id = o.user_id AND o.total > 3".into()),
            (2, "SELECT * FROM `orders_p1` o, `items_p1` i WHERE i.user_id = o.user_id AND o.total > 3".into()),
        ]
    );
    // A table joined to itself is co-located with itself.
    assert_eq!(
        joined_steps("SELECT a.total FROM orders a JOIN orders b ON a.user_id = b.user_id AND a.id < b.id WHERE a.user_id = 1"),
        [(2, "SELECT a.total FROM `orders_p1` a JOIN `orders_p1` b ON a.user_id = b.user_id AND a.id < b.id WHERE a.user_id = 1".into())]
    );
    // Three tables, linked through the second.
    assert_eq!(
        joined_steps("SELECT COUNT(*) FROM orders o JOIN items i ON i.user_id = o.user_id JOIN orders x ON x.user_id = i.user_id WHERE o.user_id = 4").len(),
        1
    );
}

/// A subquery correlated on the partition column of a co-located table
/// reads, for each row around it, rows of the same partition only: it runs
/// inside each partition as written, whatever it computes (EXISTS, NOT IN,
/// a scalar aggregate), at any depth.
#[test]
fn correlated_subqueries_on_the_partition_column_run_inside_each_partition() {
    assert_eq!(
        joined_steps(
            "SELECT o.id FROM orders o WHERE EXISTS (SELECT 1 FROM items i WHERE i.user_id = o.user_id AND i.sku = 'a') AND o.user_id = 5"
        ),
        [(2, "SELECT o.id FROM `orders_p1` o WHERE EXISTS (SELECT 1 FROM `items_p1` i WHERE i.user_id = o.user_id AND i.sku = 'a') AND o.user_id = 5".into())]
    );
    assert_eq!(
        joined_steps(
            "SELECT o.id, (SELECT COUNT(*) FROM items i WHERE i.user_id = o.user_id) AS n FROM orders o"
        ),
        [
            (1, "SELECT o.id, (SELECT COUNT(*) FROM `items_default` i WHERE i.user_id = o.user_id) AS n FROM `orders_default` o".into()),
            (2, "SELECT o.id, (SELECT COUNT(*) FROM `items_p1` i WHERE i.user_id = o.user_id) AS n FROM `orders_p1` o".into()),
        ]
    );
    assert_eq!(
        joined_steps(
            "SELECT id FROM orders WHERE id NOT IN (SELECT items.id FROM items WHERE items.user_id = orders.user_id) AND orders.user_id = 1"
        ),
        [(2, "SELECT id FROM `orders_p1` AS `orders` WHERE id NOT IN (SELECT items.id FROM `items_p1` AS `items` WHERE items.user_id = orders.user_id) AND orders.user_id = 1".into())]
    );
    // Without an alias, the item is named by its text, as MariaDB would
    // name it: the rewrite's table names are not in the column's name.
    assert_eq!(
        joined_steps(
            "SELECT o.id, (SELECT COUNT(*) FROM items i WHERE i.user_id = o.user_id) FROM orders o WHERE o.user_id = 5"
        ),
        [(2, "SELECT o.id, (SELECT COUNT(*) FROM `items_p1` i WHERE i.user_id = o.user_id) AS `(SELECT COUNT(*) FROM items i WHERE i.user_id = o.user_id)` FROM `orders_p1` o WHERE o.user_id = 5".into())]
    );
    // An aggregate of the rows around a subquery aggregates the outer
    // statement (MariaDB's rule): over several partitions, a merge.
    assert!(matches!(
        joined_plan(
            "SELECT (SELECT SUM(o.total) FROM items i WHERE i.user_id = o.user_id LIMIT 1) FROM orders o",
            &mut PlanCache::default()
        ),
        Action::Federate(_)
    ));
    // Two levels: the inner subquery is correlated with the outer one.
    assert_eq!(
        joined_steps(
            "SELECT o.id FROM orders o WHERE EXISTS (SELECT 1 FROM items i WHERE i.user_id = o.user_id AND EXISTS (SELECT 1 FROM orders x WHERE x.user_id = i.user_id AND x.id <> o.id)) AND o.user_id = 5"
        )
        .len(),
        1
    );
}

/// Tables partitioned alike by columns of their own names, their columns
/// known (as the dictionary reads those of default tables on the main
/// backend): an order-entry application's warehouses and districts.
fn warehouses(district_columns: Option<&[&str]>) -> Dictionary {
    let base = dictionary();
    let orders = base.table("app", "orders").unwrap().clone();
    let like = |name: &str, column: &str, columns: Option<&[&str]>| {
        let mut definition = orders.definition();
        definition.table.name = name.into();
        definition.column = column.into();
        definition.default_table = format!("{name}_default");
        let mut table = PartitionedTable::new(definition, orders.entries.clone());
        table.columns = columns.map(|c| c.iter().map(|c| c.to_string()).collect());
        table
    };
    Dictionary::new(
        1,
        vec![
            like("warehouse", "w_id", Some(&["w_id", "w_ytd"])),
            like("district", "d_w_id", district_columns),
        ],
    )
}

/// Unqualified columns of a correlated subquery are told apart by the
/// tables' columns, as MariaDB resolves them (the subquery's own tables
/// first): a subquery correlated on the partition columns runs inside each
/// partition, its select item named by its text; where a column could be
/// another table's, or the columns are not known, the statement runs on
/// copies.
#[test]
fn unqualified_correlations_are_resolved_by_the_tables_columns() {
    let district = ["d_w_id", "d_id", "d_ytd"];
    let steps = |dictionary: &Dictionary, sql: &str, cache: &mut PlanCache| {
        let ctx = context(dictionary, "app");
        match plan(sql.as_bytes(), &ctx, cache).action {
            Action::Route(route) => {
                Some(route.steps.into_iter().map(|s| s.sql).collect::<Vec<_>>())
            }
            Action::Federate(_) => None,
            other => panic!("{sql}: {other:?}"),
        }
    };
    let known = warehouses(Some(&district));
    let sql = |n: u32| {
        format!("SELECT w_id, (SELECT SUM(d_ytd) + {n} FROM district WHERE d_w_id = w_id AND d_id > 0) FROM warehouse ORDER BY w_id")
    };
    let mut cache = PlanCache::default();
    for n in [1, 2] {
        let routed = steps(&known, &sql(n), &mut cache).expect("a route");
        assert_eq!(routed.len(), 2, "{routed:?}");
        let name = format!(
            "AS `(SELECT SUM(d_ytd) + {n} FROM district WHERE d_w_id = w_id AND d_id > 0)`"
        );
        assert!(
            routed[0].contains("FROM `district_default` AS `district`"),
            "{}",
            routed[0]
        );
        assert!(routed[0].contains(&name), "{}", routed[0]);
    }
    // Unknown columns of the subquery's table: `w_id` may be its own.
    assert_eq!(
        steps(&warehouses(None), &sql(1), &mut PlanCache::default()),
        None
    );
    // The subquery's table has a `w_id` of its own: not the warehouse's.
    let shadowing = warehouses(Some(&["d_w_id", "d_id", "d_ytd", "w_id"]));
    assert_eq!(steps(&shadowing, &sql(1), &mut PlanCache::default()), None);
    // An aggregate of the warehouse's column aggregates the outer rows.
    let outer = "SELECT w_id, (SELECT SUM(w_ytd) FROM district WHERE d_w_id = w_id) FROM warehouse";
    assert_eq!(steps(&known, outer, &mut PlanCache::default()), None);
    // A subquery in a subquery: the scopes between are not followed.
    let nested = "SELECT w_id FROM warehouse WHERE EXISTS (SELECT 1 FROM district WHERE d_w_id = w_id AND EXISTS (SELECT 1 FROM warehouse AS x WHERE x.w_id = d_w_id))";
    assert_eq!(steps(&known, nested, &mut PlanCache::default()), None);
}

#[test]
fn joins_that_cannot_run_per_partition_run_on_copies() {
    let refused = |sql: &str| match joined_plan(sql, &mut PlanCache::default()) {
        Action::Refuse(r) if !sql.starts_with("SELECT") => r.reason,
        Action::Federate(f) if sql.starts_with("SELECT") => f.reason,
        other => panic!("{sql}: expected copies of a SELECT, else a refusal, got {other:?}"),
    };
    for (sql, reason) in [
        (
            "SELECT * FROM orders o JOIN payments p ON o.user_id = p.user_id",
            "not co-located: `app`.`orders` has partition p1 for value '1' on backend 2 and `app`.`payments` has not",
        ),
        (
            "SELECT * FROM orders o JOIN items i ON o.id = i.user_id",
            "does not equate the partition columns of `app`.`orders` (`user_id`) and `app`.`items` (`user_id`)",
        ),
        (
            "SELECT * FROM orders o JOIN items i ON o.user_id = i.user_id OR o.id = i.id",
            "does not equate",
        ),
        (
            "SELECT * FROM orders o JOIN items i ON o.user_id = i.user_id JOIN items j ON j.id = o.id",
            "does not equate",
        ),
        (
            "SELECT * FROM orders WHERE user_id IN (SELECT user_id FROM items)",
            "a subquery on `app`.`items` whose WHERE does not equate its partition column `user_id`",
        ),
        // Correlated on another column: the rows it reads are anywhere.
        (
            "SELECT * FROM orders o WHERE EXISTS (SELECT 1 FROM items i WHERE i.id = o.id)",
            "a subquery on `app`.`items` whose WHERE",
        ),
        // Unqualified, `user_id` is the subquery's own column.
        (
            "SELECT * FROM orders o WHERE EXISTS (SELECT 1 FROM items i WHERE user_id = o.user_id)",
            "a subquery on `app`.`items` whose WHERE",
        ),
        // Under an OR the equality does not hold for every row read.
        (
            "SELECT * FROM orders o WHERE EXISTS (SELECT 1 FROM items i WHERE i.user_id = o.user_id OR i.id = 1)",
            "a subquery on `app`.`items` whose WHERE",
        ),
        // `o` inside is not the `o` around it.
        (
            "SELECT * FROM orders o WHERE EXISTS (SELECT 1 FROM items o WHERE o.user_id = o.user_id)",
            "a subquery naming a partitioned table as a table around it is named",
        ),
        // A derived table is no correlated subquery.
        (
            "SELECT * FROM orders o JOIN (SELECT * FROM items) d ON d.user_id = o.user_id",
            "inside a subquery",
        ),
        (
            "SELECT * FROM orders o WHERE EXISTS (SELECT 1 FROM payments p WHERE p.user_id = o.user_id)",
            "not co-located",
        ),
        (
            "UPDATE orders o JOIN items i ON o.user_id = i.user_id SET o.total = 1",
            "a statement other than SELECT or INSERT ... SELECT that names partitioned tables more than once",
        ),
    ] {
        let got = refused(sql);
        assert!(got.contains(reason), "{sql}: {got}");
    }
}

#[test]
fn a_cached_join_renders_like_a_fresh_one_and_waits_for_a_locked_joined_table() {
    let mut cache = PlanCache::default();
    let sql = |n: u32| {
        format!(
            "SELECT * FROM orders o JOIN items i ON o.user_id = i.user_id WHERE o.user_id = {n}"
        )
    };
    let joined = joined_dictionary();
    let ctx = context(&joined, "app");
    let first = plan(sql(5).as_bytes(), &ctx, &mut cache).action;
    let again = plan(sql(2).as_bytes(), &ctx, &mut cache).action;
    assert_eq!(cache.hits(), 1);
    let (Action::Route(first), Action::Route(again)) = (first, again) else {
        panic!("expected routes");
    };
    assert_eq!(first.steps[0].sql, "SELECT * FROM `orders_p1` o JOIN `items_p1` i ON o.user_id = i.user_id WHERE o.user_id = 5");
    assert_eq!(again.steps[0].sql, "SELECT * FROM `orders_default` o JOIN `items_default` i ON o.user_id = i.user_id WHERE o.user_id = 2");

    let mut dictionary = joined_dictionary();
    let mut items = dictionary.table("app", "items").unwrap().clone();
    items.entries[0].state = PartitionState::Copying;
    let items = PartitionedTable::new(items.definition(), items.entries.clone());
    let mut tables: Vec<PartitionedTable> = dictionary
        .tables()
        .into_iter()
        .filter(|t| t.table.name != "items")
        .cloned()
        .collect();
    tables.push(items);
    dictionary = Dictionary::new(1, tables);
    let ctx = context(&dictionary, "app");
    // Another snapshot of the same version: planned anew, and waits.
    let action = plan(sql(5).as_bytes(), &ctx, &mut cache).action;
    assert!(
        matches!(&action, Action::Wait(t) if t.name == "items"),
        "{action:?}"
    );
    let action = plan(sql(5).as_bytes(), &ctx, &mut PlanCache::default()).action;
    assert!(
        matches!(&action, Action::Wait(t) if t.name == "items"),
        "{action:?}"
    );
}

#[test]
fn a_between_of_integers_goes_to_the_partitions_of_its_values() {
    let mut tables: Vec<PartitionedTable> = dictionary().tables().into_iter().cloned().collect();
    let entry = |name: &str, value: &str, backend| PartitionEntry {
        name: name.into(),
        value: value.into(),
        backend,
        state: PartitionState::Active,
    };
    // `events` by DIV(100) of id: 100-199 on backend 2, 200-299 on 1.
    tables.push(events(
        HashFunction::Div(100),
        1,
        vec![entry("p1", "1", 2), entry("p2", "2", 1)],
    ));
    let dictionary = Dictionary::new(1, tables);
    let ctx = context(&dictionary, "app");
    let mut cache = PlanCache::default();
    let mut tables_of = |sql: &str| match plan(sql.as_bytes(), &ctx, &mut cache).action {
        Action::Route(route) => route
            .steps
            .iter()
            .map(|s| s.target.table.to_string())
            .collect::<Vec<_>>(),
        other => panic!("{sql}: expected a route, got {other:?}"),
    };
    assert_eq!(
        tables_of("SELECT * FROM events WHERE id BETWEEN 120 AND 180"),
        ["events_p1"]
    );
    // The same shape from the cache, other literals.
    assert_eq!(
        tables_of("SELECT * FROM events WHERE id BETWEEN 150 AND 260"),
        ["events_p1", "events_p2"]
    );
    assert_eq!(
        tables_of("SELECT * FROM events WHERE id BETWEEN -5 AND 40"),
        ["events_default"]
    );
    assert_eq!(
        tables_of("SELECT * FROM events WHERE id BETWEEN 300 AND 100"),
        ["events_default"]
    );
    assert_eq!(
        tables_of("SELECT * FROM events WHERE id BETWEEN NULL AND 100"),
        ["events_default"]
    );
    // More values than are listed, fractions, strings of other columns,
    // NOT BETWEEN: every partition.
    for sql in [
        "SELECT * FROM events WHERE id BETWEEN 0 AND 100000",
        "SELECT * FROM events WHERE id BETWEEN 150.5 AND 160",
        "SELECT * FROM events WHERE id NOT BETWEEN 120 AND 180",
        "SELECT * FROM events WHERE id + 0 BETWEEN 120 AND 180",
    ] {
        assert_eq!(tables_of(sql).len(), 3, "{sql}");
    }
    // An equality beats a range.
    assert_eq!(
        tables_of("SELECT * FROM events WHERE id BETWEEN 0 AND 300 AND id = 250"),
        ["events_p2"]
    );
    // Not an integer column: PREFIX ranges are not listed.
    assert_eq!(
        route("SELECT * FROM users WHERE nickname BETWEEN 'mar' AND 'mar'")
            .steps
            .len(),
        3
    );
    // MOD(4): a short range lists its values.
    assert_eq!(
        steps("SELECT * FROM orders WHERE user_id BETWEEN 5 AND 5"),
        [(
            2,
            "SELECT * FROM `orders_p1` AS `orders` WHERE user_id BETWEEN 5 AND 5".into()
        )]
    );
}

#[test]
fn information_schema_asks_the_backend_of_a_default_table_off_the_main_backend() {
    let dictionary = Dictionary::new(1, vec![events(HashFunction::Mod(2), 2, Vec::new())]);
    let listing = |sql: &str| match plan(
        sql.as_bytes(),
        &context(&dictionary, "app"),
        &mut PlanCache::default(),
    )
    .action
    {
        Action::Listing(listing) => listing,
        other => panic!("{sql}: expected a listing, got {other:?}"),
    };
    let asked = |sql: &str| -> Vec<(u32, String, bool)> {
        listing(sql)
            .elsewhere
            .into_iter()
            .map(|e| (e.backend, e.sql, e.probe))
            .collect()
    };
    assert_eq!(
        asked("SELECT column_name FROM information_schema.columns c WHERE c.table_name = 'events' ORDER BY ordinal_position"),
        [(
            2,
            "SELECT column_name FROM information_schema.columns c WHERE (c.table_name IN ('events', 'events_default')) AND (`c`.TABLE_SCHEMA, `c`.TABLE_NAME) IN ((CONVERT(X'617070' USING utf8mb4), CONVERT(X'6576656e74735f64656661756c74' USING utf8mb4))) ORDER BY ordinal_position".into(),
            false
        )]
    );
    assert_eq!(
        asked("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = 'app' GROUP BY ENGINE"),
        [(
            2,
            "SELECT 1 FROM information_schema.TABLES WHERE (TABLE_SCHEMA = 'app') AND (`TABLES`.TABLE_SCHEMA, `TABLES`.TABLE_NAME) IN ((CONVERT(X'617070' USING utf8mb4), CONVERT(X'6576656e74735f64656661756c74' USING utf8mb4))) LIMIT 1".into(),
            true
        )]
    );
    // Shapes whose rows cannot be told apart by table stay on the main backend.
    assert!(asked("SELECT * FROM information_schema.SCHEMATA").is_empty());
    assert!(asked("SELECT t.TABLE_NAME FROM information_schema.TABLES t JOIN information_schema.COLUMNS c USING (TABLE_NAME)").is_empty());
}

/// Text hscale would route by, rewrite or replay must read as the server
/// reads it: a latin1 'é' is not UTF-8, and UTF-8 bytes in a latin1 session
/// are other characters to the server than to hscale.
#[test]
fn statements_hscale_cannot_read_as_the_server_does_are_refused() {
    let dictionary = dictionary();
    let plan_in = |charset, sql: &[u8]| {
        let ctx = Context {
            charset,
            ..context(&dictionary, "app")
        };
        plan(sql, &ctx, &mut PlanCache::default())
    };
    let latin1_insert = b"INSERT INTO users VALUES (1, 'mar\xe9')";
    let utf8_insert = "INSERT INTO users VALUES (1, 'maré')".as_bytes();
    for (charset, sql) in [
        (ClientCharset::Utf8, &latin1_insert[..]),
        (ClientCharset::Other, &latin1_insert[..]),
        (ClientCharset::Other, utf8_insert),
        (ClientCharset::Other, b"USE caf\xe9"),
        (ClientCharset::Other, b"HSCALE LOOKUP('users', 'caf\xe9')"),
    ] {
        match plan_in(charset, sql).action {
            Action::Refuse(refusal) => assert!(refusal.reason.contains("not UTF-8")),
            other => panic!("{}: {other:?}", String::from_utf8_lossy(sql)),
        }
    }
    // What reads the same in both: ASCII in any session, UTF-8 in a UTF-8 one.
    assert!(matches!(
        plan_in(ClientCharset::Other, b"INSERT INTO users VALUES (1, 'mar')").action,
        Action::Route(_)
    ));
    assert!(matches!(
        plan_in(ClientCharset::Utf8, utf8_insert).action,
        Action::Route(_)
    ));
    // Bytes hscale only passes on are not its to read.
    let plain = plan_in(ClientCharset::Other, b"SELECT 'caf\xe9' FROM plain_table");
    assert!(matches!(plain.action, Action::Main) && plain.binds.is_none());
    // A SET it cannot read stays on the connection whose server read it.
    let set = plan_in(ClientCharset::Other, b"SET sql_mode = 'caf\xe9'");
    assert!(matches!(set.action, Action::Main) && set.binds.is_some());
}

/// Under sql_mode ANSI_QUOTES `"..."` is an identifier: the table is found
/// and routed, and a double-quoted word is a column, not a value to route by.
#[test]
fn ansi_quotes_read_double_quoted_words_as_identifiers() {
    let dictionary = dictionary();
    let default = context(&dictionary, "app");
    let ansi = Context {
        quoting: Quoting {
            ansi_quotes: true,
            ..Quoting::BACKSLASH_ESCAPES
        },
        ..context(&dictionary, "app")
    };
    // One cache for both: the same text must not share a plan across modes.
    let mut cache = PlanCache::default();
    let mut steps_in = |ctx: &Context, sql: &str| match plan(sql.as_bytes(), ctx, &mut cache).action
    {
        Action::Route(route) => route
            .steps
            .into_iter()
            .map(|s| (s.target.backend, s.sql))
            .collect::<Vec<_>>(),
        other => panic!("{sql}: expected a route, got {other:?}"),
    };
    assert_eq!(
        steps_in(
            &ansi,
            r#"SELECT "id" FROM "users" WHERE "nickname" = 'martin'"#
        ),
        [(
            2,
            "SELECT `id` FROM `users_nick1` AS `users` WHERE `nickname` = 'martin'".into()
        )]
    );
    let by_string = r#"SELECT id FROM users WHERE nickname = "martin""#;
    assert_eq!(steps_in(&default, by_string).len(), 1);
    for _ in 0..2 {
        // nickname = the column martin: every partition is asked.
        assert_eq!(steps_in(&ansi, by_string).len(), 3);
    }
    assert_eq!(steps_in(&default, by_string).len(), 1);
    // Without ANSI_QUOTES "users" is a string, and names no table.
    assert!(matches!(
        plan(br#"SELECT "users""#, &default, &mut cache).action,
        Action::Main
    ));
    // An identifier that cannot be requoted with backticks is refused.
    assert!(matches!(
        plan(br#"SELECT "a`b" FROM users"#, &ansi, &mut cache).action,
        Action::Refuse(_)
    ));
}

/// LOCK TABLES of a partitioned table locks each of its physical tables on
/// its backend, also under the logical name routed SELECTs read it by; a
/// table that is not partitioned stays on the main backend as written.
#[test]
fn lock_tables_lock_each_partition_on_its_backend() {
    let dictionary = dictionary();
    let ctx = context(&dictionary, "app");
    let locks = |sql: &str| match plan(sql.as_bytes(), &ctx, &mut PlanCache::default()).action {
        Action::LockTables(locks) => locks.per_backend,
        other => panic!("{sql}: {other:?}"),
    };
    // mariadb-dump's form.
    assert_eq!(
        locks("LOCK TABLES `notes` READ /*!32311 LOCAL */,`users` READ /*!32311 LOCAL */"),
        [
            (
                1,
                "LOCK TABLES `notes` READ /*!32311 LOCAL */, \
                 `app`.`users_default` READ /*!32311 LOCAL */, \
                 `app`.`users_nick2` READ /*!32311 LOCAL */"
                    .to_string()
            ),
            (
                2,
                "LOCK TABLES `app`.`users_nick1` READ /*!32311 LOCAL */".to_string()
            ),
        ]
    );
    // While the session holds them, statements name each partition table
    // as it is locked, not by an alias.
    let locked = Context {
        tables_locked: true,
        ..context(&dictionary, "app")
    };
    let Action::Route(route) = plan(
        b"SELECT users.id FROM users WHERE nickname = 'martin'",
        &locked,
        &mut PlanCache::default(),
    )
    .action
    else {
        panic!("expected a route");
    };
    assert_eq!(
        route.steps[0].sql,
        "SELECT `users_nick1`.id FROM `users_nick1` WHERE nickname = 'martin'"
    );
    // An alias the client chose is the one name the tables are locked by.
    assert_eq!(
        locks("lock table app.orders AS o LOW_PRIORITY WRITE;"),
        [
            (
                1,
                "LOCK TABLES `app`.`orders_default` AS o LOW_PRIORITY WRITE".to_string()
            ),
            (
                2,
                "LOCK TABLES `app`.`orders_p1` AS o LOW_PRIORITY WRITE".to_string()
            ),
        ]
    );
    match plan(
        b"LOCK TABLES users AS u READ",
        &ctx,
        &mut PlanCache::default(),
    )
    .action
    {
        Action::Refuse(refusal) => {
            assert!(refusal.reason.contains("backend 1"), "{}", refusal.reason)
        }
        other => panic!("{other:?}"),
    }
    let refused = plan(
        b"LOCK TABLES users READ; SELECT 1",
        &ctx,
        &mut PlanCache::default(),
    );
    assert!(
        matches!(refused.action, Action::Refuse(_)),
        "{:?}",
        refused.action
    );
}

/// ANALYZE, CHECK, OPTIMIZE, REPAIR and CHECKSUM TABLE run on each
/// backend's physical tables of a partitioned table, the other tables on
/// the main backend as written; the answer names the logical tables.
#[test]
fn table_maintenance_runs_on_each_backends_partitions() {
    let listing = |sql: &str| match plan_of(sql) {
        Action::Listing(listing) => *listing,
        other => panic!("{sql}: {other:?}"),
    };
    let statements = |listing: &Listing| {
        let mut all = vec![(listing.backend, listing.sql.clone().unwrap())];
        all.extend(listing.elsewhere.iter().map(|e| (e.backend, e.sql.clone())));
        all
    };
    let check = listing("CHECK TABLE notes, `users` FOR UPGRADE;");
    assert_eq!(
        statements(&check),
        [
            (
                1,
                "CHECK TABLE notes, `app`.`users_default`, `app`.`users_nick2` FOR UPGRADE".into()
            ),
            (2, "CHECK TABLE `app`.`users_nick1` FOR UPGRADE".into()),
        ]
    );
    assert_eq!(check.column, NameColumn::Qualified(0));
    assert_eq!(
        check.combine,
        Combine::Maintenance {
            tables: vec![
                Maintained {
                    qualified: "app.notes".into(),
                    partitioned: false
                },
                Maintained {
                    qualified: "app.users".into(),
                    partitioned: true
                },
            ],
            checksum: false,
        }
    );
    assert_eq!(
        statements(&listing(
            "analyze no_write_to_binlog table app.orders persistent for columns (a, b) indexes ()"
        )),
        [
            (
                1,
                "analyze no_write_to_binlog table `app`.`orders_default` persistent for columns (a, b) indexes ()".into()
            ),
            (
                2,
                "analyze no_write_to_binlog table `app`.`orders_p1` persistent for columns (a, b) indexes ()".into()
            ),
        ]
    );
    let checksum = listing("CHECKSUM TABLE orders QUICK");
    assert!(matches!(
        checksum.combine,
        Combine::Maintenance { checksum: true, .. }
    ));
    // No table on the main backend: the first backend with tables answers
    // first.
    let Action::Listing(only) = plan(
        b"OPTIMIZE TABLE users",
        &Context {
            main_backend: 3,
            passed_fences: &[],
            ..context(&dictionary(), "app")
        },
        &mut PlanCache::default(),
    )
    .action
    else {
        panic!("expected a listing");
    };
    assert_eq!(
        statements(&only),
        [
            (
                1,
                "OPTIMIZE TABLE `app`.`users_default`, `app`.`users_nick2`".into()
            ),
            (2, "OPTIMIZE TABLE `app`.`users_nick1`".into()),
        ]
    );
    // ANALYZE of a query is no table maintenance.
    assert!(matches!(
        plan_of("ANALYZE SELECT * FROM users"),
        Action::Refuse(_) | Action::Route(_)
    ));
}

/// An ON DUPLICATE KEY UPDATE that sets the AUTO_INCREMENT id past what
/// hscale handed out would see that id handed out again to another
/// partition's row: refused, but for the forms that keep the row's id.
#[test]
fn duplicate_key_updates_keep_ids_within_the_sequence() {
    let dictionary = Dictionary::new(
        1,
        vec![PartitionedTable::new(
            TableDefinition {
                table: TableName {
                    db: "app".into(),
                    name: "posts".into(),
                },
                column: "author".into(),
                column_position: 2,
                kind: ColumnKind::Integer,
                function: HashFunction::Mod(2),
                default_table: "posts_default".into(),
                default_backend: 1,
                auto_column: Some(AutoColumn {
                    name: "id".into(),
                    position: 1,
                }),
                folding: Default::default(),
            },
            Vec::new(),
        )],
    );
    let ctx = context(&dictionary, "app");
    let planned = |sql: &str| plan(sql.as_bytes(), &ctx, &mut PlanCache::default()).action;
    let insert = "INSERT INTO posts (id, author, body) VALUES (5, 1, 'x') ON DUPLICATE KEY UPDATE ";
    for kept in [
        "id = LAST_INSERT_ID(id), body = 'y'",
        "posts.id = last_insert_id(posts.id)",
        "id = VALUES(id)",
        "`id` = (`id`)",
        "body = VALUES(body)",
    ] {
        let sql = format!("{insert}{kept}");
        assert!(matches!(planned(&sql), Action::Route(_)), "{sql}");
    }
    for set in [
        "id = 1000000",
        "id = id + 1",
        "body = 'y', posts.id = LAST_INSERT_ID()",
        "id = VALUES(author)",
    ] {
        let sql = format!("{insert}{set}");
        match planned(&sql) {
            Action::Refuse(refusal) => assert!(
                refusal
                    .reason
                    .contains("sets the AUTO_INCREMENT column `id`"),
                "{sql}: {}",
                refusal.reason
            ),
            other => panic!("{sql}: expected a refusal, got {other:?}"),
        }
    }
}

#[test]
fn a_fenced_partition_holds_its_own_statements_and_no_others() {
    let dictionary = dictionary();
    let users = dictionary.table("app", "users").unwrap();
    let mut entries = users.entries.clone();
    for entry in entries.iter_mut().filter(|e| e.name == "nick1") {
        entry.state = PartitionState::Fenced;
    }
    let fenced = Dictionary::new(2, vec![PartitionedTable::new(users.definition(), entries)]);
    let ctx = context(&fenced, "app");
    let action = |sql: &str| plan(sql.as_bytes(), &ctx, &mut PlanCache::default()).action;
    assert!(matches!(
        action("SELECT * FROM users WHERE nickname = 'martin'"),
        Action::Wait(_)
    ));
    assert!(matches!(
        action("UPDATE users SET id = 1 WHERE nickname = 'marek'"),
        Action::Wait(_)
    ));
    // A full scan runs on the fenced partition too.
    assert!(matches!(action("SELECT * FROM users"), Action::Wait(_)));
    // Other partitions and the default are not held.
    assert!(matches!(
        action("SELECT * FROM users WHERE nickname = 'peter'"),
        Action::Route(_)
    ));
    assert!(matches!(
        action("INSERT INTO users VALUES (1, 'zoe')"),
        Action::Route(_)
    ));
    // A transaction that ran on the fenced partition finishes there (its
    // instance acknowledges the fence once it has); one that ran on
    // another partition only, or on another backend's table of the same
    // name, waits like any statement.
    let nick1 = PhysicalId::of("app", 2, "users_nick1");
    let elsewhere = [
        PhysicalId::of("app", 1, "users_nick2"),
        PhysicalId::of("app", 1, "users_nick1"),
        PhysicalId::of("other", 2, "users_nick1"),
    ];
    let martin = |passed: &[PhysicalId]| {
        let open = Context {
            passed_fences: passed,
            ..context(&fenced, "app")
        };
        plan(
            b"SELECT * FROM users WHERE nickname = 'martin'",
            &open,
            &mut PlanCache::default(),
        )
        .action
    };
    assert!(matches!(martin(&[nick1]), Action::Route(_)));
    assert!(matches!(martin(&elsewhere), Action::Wait(_)));
    assert_eq!(fenced.fenced_tables(), vec![nick1]);
}

#[test]
fn a_fenced_default_holds_the_values_it_serves_and_no_partition() {
    let dictionary = dictionary();
    let users = dictionary.table("app", "users").unwrap();
    let mut table = PartitionedTable::new(users.definition(), users.entries.clone());
    table.fence_default();
    assert!(table.fenced() && !table.locked());
    let fenced = Dictionary::new(2, vec![table]);
    let ctx = context(&fenced, "app");
    let action = |sql: &str| plan(sql.as_bytes(), &ctx, &mut PlanCache::default()).action;
    // 'zoe' has no partition: the default serves it.
    assert!(matches!(
        action("INSERT INTO users VALUES (1, 'zoe')"),
        Action::Wait(_)
    ));
    assert!(matches!(action("SELECT * FROM users"), Action::Wait(_)));
    assert!(matches!(
        action("SELECT * FROM users WHERE nickname = 'peter'"),
        Action::Route(_)
    ));
}

/// A copy's table, its conditions, and the column, earlier copy and its
/// column that narrow it.
type CopyPlan = (String, Vec<String>, Option<(String, usize, String)>);

/// Each copy of a federation, in order.
fn copies(sql: &str) -> Vec<CopyPlan> {
    federation(sql)
        .copies
        .into_iter()
        .map(|c| {
            let reduce = c.reduce.map(|r| (r.column, r.from, r.from_column));
            (c.table.name, c.filters, reduce)
        })
        .collect()
}

#[test]
fn copies_read_only_what_the_statement_may_need() {
    // The condition on users alone goes with its copy, which comes first;
    // orders then reads the rows of the users it found.
    assert_eq!(
        copies("SELECT u.nickname, o.total FROM orders o JOIN users u ON o.user_id = u.id WHERE u.id = 5 AND o.total > u.id"),
        [
            ("users".into(), vec!["u.id = 5".into()], None),
            (
                "orders".into(),
                vec![],
                Some(("user_id".into(), 0, "id".into()))
            ),
        ]
    );
    // A left join's inner table takes its ON's conditions, not the WHERE's,
    // and narrows nothing on the outer side.
    assert_eq!(
        copies("SELECT * FROM users u LEFT JOIN orders o ON o.user_id = u.id AND o.total > 3 WHERE o.total IS NULL AND u.nickname LIKE 'a%'"),
        [
            ("users".into(), vec!["u.nickname LIKE 'a%'".into()], None),
            (
                "orders".into(),
                vec!["o.total > 3".into()],
                Some(("user_id".into(), 0, "id".into()))
            ),
        ]
    );
    // A right join: the table before it may come as NULLs.
    assert_eq!(
        copies("SELECT * FROM orders o RIGHT JOIN users u ON o.user_id = u.id WHERE o.total > 3")
            [0]
        .1,
        Vec::<String>::new()
    );
    // Named twice: one copy for both references, whole.
    assert_eq!(
        copies("SELECT * FROM users a JOIN users b ON a.nickname = b.id WHERE a.id = 1"),
        [("users".into(), vec![], None)]
    );
    // Unqualified columns are the table's only in the top-level query;
    // in a subquery they may be the outer query's.
    assert_eq!(
        copies("SELECT id FROM users WHERE nickname = 'x' AND id IN (SELECT user_id FROM orders WHERE total > 1)"),
        [
            ("users".into(), vec!["nickname = 'x'".into()], None),
            ("orders".into(), vec![], None),
        ]
    );
    // Conditions whose value may differ on another server stay behind.
    assert_eq!(
        copies("SELECT * FROM users u JOIN orders o ON o.user_id = u.id WHERE u.id > RAND() AND o.total > @x AND LOWER(u.nickname) = 'a'")
            .into_iter()
            .map(|c| c.1)
            .collect::<Vec<_>>(),
        [vec!["LOWER(u.nickname) = 'a'".to_string()], vec![]]
    );
}

#[test]
fn a_selective_join_of_two_tables_is_a_lookup_join() {
    let lookup = federation(
        "SELECT u.nickname, o.total AS t FROM users u JOIN orders o ON o.user_id = u.id WHERE u.id = 5",
    )
    .lookup
    .expect("a lookup join");
    assert_eq!(
        lookup.outer,
        "SELECT `u`.`nickname`, `u`.`id` FROM `app`.`users` AS `u` WHERE (u.id = 5)"
    );
    assert_eq!(
        lookup.inner_read(&["5".into(), "9".into()]),
        "SELECT `o`.`total` AS `t`, `o`.`user_id` FROM `app`.`orders` AS `o` WHERE `o`.`user_id` IN (5, 9)"
    );
    assert_eq!(lookup.columns, [(false, 0), (true, 0)]);
    assert!(!lookup.keeps_outer);
    // A left join keeps the first table's rows; its ON narrows the second.
    let left = federation(
        "SELECT u.nickname, o.total FROM users u LEFT JOIN orders o ON o.user_id = u.id AND o.total > 3 WHERE u.id = 5",
    )
    .lookup
    .expect("a lookup join");
    assert!(left.keeps_outer);
    assert!(left
        .inner_read(&["5".into()])
        .ends_with("WHERE (o.total > 3) AND `o`.`user_id` IN (5)"));
    // Anything more than columns of an inner join under one table's
    // conditions runs on copies.
    for sql in [
        "SELECT u.nickname, o.total FROM users u JOIN orders o ON o.user_id = u.id",
        "SELECT u.nickname, o.total FROM orders o RIGHT JOIN users u ON o.user_id = u.id WHERE u.id = 5",
        "SELECT u.nickname, o.total FROM users u LEFT JOIN orders o ON o.user_id = u.id WHERE o.id = 5",
        "SELECT u.nickname, o.total + 1 FROM users u JOIN orders o ON o.user_id = u.id WHERE u.id = 5",
        "SELECT u.nickname FROM users u JOIN orders o ON o.user_id = u.id WHERE u.id = 5 ORDER BY 1",
        "SELECT u.nickname FROM users u JOIN orders o ON o.user_id = u.id WHERE u.id = 5 AND o.total > u.id",
        "SELECT DISTINCT u.nickname FROM users u JOIN orders o ON o.user_id = u.id WHERE u.id = 5",
        "SELECT * FROM users u JOIN orders o ON o.user_id = u.id WHERE u.id = 5",
    ] {
        assert_eq!(federation(sql).lookup, None, "{sql}");
    }
}

#[test]
fn placeholders_take_literals_outside_strings_and_comments() {
    let sql = b"SELECT '?', `?` FROM t WHERE a = ? /* ? */ AND b IN (?, ?)";
    let literals = ["1".to_string(), "'x'".to_string(), "NULL".to_string()];
    assert_eq!(
        hscale_planner::with_literals(sql, Quoting::default(), &literals).unwrap(),
        b"SELECT '?', `?` FROM t WHERE a = 1 /* ? */ AND b IN ('x', NULL)"
    );
    assert_eq!(
        hscale_planner::with_literals(sql, Quoting::default(), &literals[..1]),
        None
    );
}

#[test]
fn reads_of_reference_tables_alone_may_run_on_any_backend_that_holds_them_all() {
    let reference = |name: &str, backends: Vec<u32>| hscale_planner::ReferenceTable {
        table: TableName {
            db: "app".into(),
            name: name.into(),
        },
        backends,
        ready: true,
    };
    let dictionary = dictionary().with_references(vec![
        reference("items", vec![1, 2, 3]),
        reference("regions", vec![1, 2]),
    ]);
    let ctx = context(&dictionary, "app");
    let action = |sql: &str| plan(sql.as_bytes(), &ctx, &mut PlanCache::default()).action;
    for (sql, backends) in [
        ("SELECT * FROM items WHERE id = 1", vec![1, 2, 3]),
        ("SELECT * FROM items WHERE id = 1 FOR UPDATE", vec![1, 2, 3]),
        (
            "SELECT i.name FROM items i JOIN regions r ON r.id = i.region",
            vec![1, 2],
        ),
    ] {
        match action(sql) {
            Action::ReferenceRead(found) => assert_eq!(found.as_slice(), backends, "{sql}"),
            other => panic!("{sql}: {other:?}"),
        }
    }
    // What leaves state on its connection, reads a table only the main
    // backend has, or writes: the main backend's (a write: every copy).
    for sql in [
        "SELECT * FROM items, plain WHERE plain.id = items.id",
        "SELECT name INTO @name FROM items WHERE id = 1",
        "SELECT @n := name FROM items WHERE id = 1",
        "SELECT GET_LOCK('x', 0) FROM items",
    ] {
        assert!(
            matches!(action(sql), Action::Main),
            "{sql}: {:?}",
            action(sql)
        );
    }
    assert!(matches!(
        action("UPDATE items SET name = 'x'"),
        Action::Route(_)
    ));
}

#[test]
fn insert_select_between_co_located_tables_writes_each_partition_from_its_neighbour() {
    let dictionary = Dictionary::new(
        1,
        vec![
            by_warehouse("orders", "o_w_id"),
            by_warehouse("new_orders", "no_w_id"),
        ],
    );
    let ctx = context(&dictionary, "app");
    let steps = |sql: &str| match plan(sql.as_bytes(), &ctx, &mut PlanCache::default()).action {
        Action::Route(route) => route
            .steps
            .iter()
            .map(|s| (s.target.backend, s.sql.clone()))
            .collect::<Vec<_>>(),
        other => panic!("{sql}: {other:?}"),
    };
    assert_eq!(
        steps("INSERT INTO new_orders (no_o_id, no_d_id, no_w_id) SELECT o_id, o_d_id, o_w_id FROM orders WHERE o_id > 3 AND o_w_id = 3"),
        [(2, "INSERT INTO `new_orders_odd` (no_o_id, no_d_id, no_w_id) SELECT o_id, o_d_id, o_w_id FROM `orders_odd` AS `orders` WHERE o_id > 3 AND o_w_id = 3".to_string())]
    );
    assert_eq!(
        steps("INSERT INTO new_orders SELECT o.o_w_id, o.o_id, 1 FROM orders o"),
        [
            (1, "INSERT INTO `new_orders_default` SELECT o.o_w_id, o.o_id, 1 FROM `orders_default` o".to_string()),
            (2, "INSERT INTO `new_orders_odd` SELECT o.o_w_id, o.o_id, 1 FROM `orders_odd` o".to_string()),
        ]
    );
    // Its partition column from anything but a partition column, a
    // merge over partitions, its own rows: refused.
    for sql in [
        "INSERT INTO new_orders SELECT o_id, o_id, 1 FROM orders",
        "INSERT INTO new_orders SELECT 3, o_id, 1 FROM orders WHERE o_w_id = 3",
        "INSERT INTO new_orders SELECT o_w_id, o_id, 1 FROM orders ORDER BY o_id LIMIT 3",
    ] {
        let action = plan(sql.as_bytes(), &ctx, &mut PlanCache::default()).action;
        assert!(matches!(action, Action::Refuse(_)), "{sql}: {action:?}");
    }
}

#[test]
fn tables_whose_partition_columns_equal_the_same_literal_join_inside_one_partition() {
    let dictionary = Dictionary::new(
        1,
        vec![
            by_warehouse("order_line", "ol_w_id"),
            by_warehouse("stock", "s_w_id"),
        ],
    );
    let ctx = context(&dictionary, "app");
    // One cache for all: a statement of the same shape with other
    // literals must not take the first one's plan.
    let mut cache = PlanCache::default();
    let mut action = |sql: &str| plan(sql.as_bytes(), &ctx, &mut cache).action;
    let stock_level = |w: u32, s: u32| {
        format!(
            "SELECT COUNT(DISTINCT s_i_id) FROM order_line, stock WHERE ol_w_id = {w} AND ol_d_id = 3 \
             AND ol_o_id < 3010 AND ol_o_id >= 2990 AND s_w_id = {s} AND s_i_id = ol_i_id AND s_quantity < 15"
        )
    };
    for _ in 0..2 {
        match action(&stock_level(1, 1)) {
            Action::Route(route) => {
                assert_eq!(route.steps.len(), 1);
                assert_eq!(route.steps[0].target.backend, 2);
                assert!(
                    route.steps[0]
                        .sql
                        .contains("FROM `order_line_odd` AS `order_line`, `stock_odd` AS `stock`"),
                    "{}",
                    route.steps[0].sql
                );
            }
            other => panic!("{other:?}"),
        }
        // Other warehouses: not one partition's join.
        assert!(
            matches!(action(&stock_level(1, 2)), Action::Federate(_)),
            "{:?}",
            action(&stock_level(1, 2))
        );
    }
}

/// `app.<name>` by MOD(2) of its integer column `column` (the first): even
/// values in the default table on backend 1, odd ones in `odd` on backend 2.
fn by_warehouse(name: &str, column: &str) -> PartitionedTable {
    PartitionedTable::new(
        TableDefinition {
            table: TableName {
                db: "app".into(),
                name: name.into(),
            },
            column: column.into(),
            column_position: 1,
            kind: ColumnKind::Integer,
            function: HashFunction::Mod(2),
            default_table: format!("{name}_default"),
            default_backend: 1,
            auto_column: None,
            folding: Default::default(),
        },
        vec![PartitionEntry {
            name: "odd".into(),
            value: "1".into(),
            backend: 2,
            state: PartitionState::Active,
        }],
    )
}

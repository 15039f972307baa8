//! Prepared statements on partitioned tables: planned once into a template,
//! routed at each execution by the bound values.

use hscale_planner::{
    plan_prepared, Action, ClientCharset, ColumnKind, Context, Dictionary, HashFunction, Merge,
    PartitionEntry, PartitionState, PartitionedTable, Quoting, Routing, TableDefinition, TableName,
    Template, Value,
};

/// `app.orders` by MOD(4) of user_id (column 1): default on backend 1, p1
/// (value 1) on backend 2, p2 (value 2) on backend 1; `app.lines` by its
/// user_id alike.
fn dictionary(version: u64) -> Dictionary {
    let entry = |name: &str, value: &str, backend| PartitionEntry {
        name: name.into(),
        value: value.into(),
        backend,
        state: PartitionState::Active,
    };
    let table = |name: &str| {
        PartitionedTable::new(
            TableDefinition {
                table: TableName {
                    db: "app".into(),
                    name: name.into(),
                },
                column: "user_id".into(),
                column_position: 1,
                kind: ColumnKind::Integer,
                function: HashFunction::Mod(4),
                default_table: format!("{name}_default"),
                default_backend: 1,
                auto_column: None,
                folding: Default::default(),
            },
            vec![entry("p1", "1", 2), entry("p2", "2", 1)],
        )
    };
    Dictionary::new(version, vec![table("orders"), table("lines")])
}

fn template(sql: &str) -> Template {
    let dictionary = dictionary(1);
    let ctx = Context {
        db: Some("app"),
        quoting: Quoting::BACKSLASH_ESCAPES,
        no_auto_value_on_zero: false,
        tables_locked: false,
        charset: ClientCharset::Utf8,
        dictionary: &dictionary,
        main_backend: 1,
        passed_fences: &[],
    };
    match plan_prepared(sql.as_bytes(), &ctx).action {
        Action::Template(template) => *template,
        other => panic!("{sql}: expected a template, got {other:?}"),
    }
}

/// Each run's backend, text and parameters (`None`: all).
type Runs = Vec<(u32, String, Option<Vec<usize>>)>;

/// The runs for these parameter values, and how they merge.
fn execute(template: &Template, params: &[Value<'static>]) -> (Runs, Merge) {
    let routing = template.route(&dictionary(1), 1, |i| {
        params
            .get(i)
            .cloned()
            .ok_or_else(|| hscale_planner::PlanError::Refuse(format!("no parameter {i}")))
    });
    let Routing::Run(execution) = routing else {
        panic!("expected an execution, got {routing:?}");
    };
    let runs = execution
        .runs
        .iter()
        .map(|run| {
            let text = template.text(run).unwrap();
            (run.target.backend, text, template.params(run, params.len()))
        })
        .collect();
    (runs, execution.merge)
}

fn number(n: i64) -> Value<'static> {
    Value::Number(n.to_string().into())
}

#[test]
fn a_point_select_goes_to_the_partition_of_its_parameter() {
    let t = template("SELECT * FROM orders WHERE user_id = ? AND note = ?");
    assert!(t.by_parameters());
    let text =
        |table: &str| format!("SELECT * FROM `{table}` AS `orders` WHERE user_id = ? AND note = ?");
    let (runs, merge) = execute(&t, &[number(5), Value::String("x".into())]);
    assert_eq!(runs, [(2, text("orders_p1"), None)]);
    assert_eq!(merge, Merge::Single);
    let (runs, _) = execute(&t, &[number(7), Value::Null]);
    assert_eq!(runs, [(1, text("orders_default"), None)]);
    // The parameter the partition column is compared to, not the first one.
    let t = template("SELECT * FROM orders WHERE note = ? AND ? = user_id");
    let (runs, _) = execute(&t, &[Value::String("x".into()), number(2)]);
    assert_eq!(runs[0].0, 1);
    assert!(runs[0].1.contains("`orders_p2`"), "{runs:?}");
}

#[test]
fn in_lists_of_parameters_reach_each_partition_once() {
    let t = template("SELECT id FROM orders WHERE user_id IN (?, ?, ?)");
    let (runs, merge) = execute(&t, &[number(1), number(5), number(3)]);
    let backends: Vec<u32> = runs.iter().map(|r| r.0).collect();
    assert_eq!(backends, [2, 1]);
    assert_eq!(merge, Merge::Rows(Default::default()));
    // A merge only when the values do span partitions.
    let t = template("SELECT COUNT(*) FROM orders WHERE user_id IN (?, ?)");
    let (runs, merge) = execute(&t, &[number(1), number(5)]);
    assert_eq!((runs.len(), merge), (1, Merge::Single));
    let (runs, merge) = execute(&t, &[number(1), number(2)]);
    assert_eq!(runs.len(), 2);
    let Merge::Rows(spec) = merge else {
        panic!("{merge:?}")
    };
    assert_eq!(spec.groups, Some(vec![hscale_merge::Combine::Count]));
    // What a merge cannot do with parameters is refused when it must merge.
    let refused = |sql: &str, values: [i64; 3]| {
        let t = template(sql);
        match t.route(&dictionary(1), 1, |i| Ok(number(values[i]))) {
            Routing::Refuse(r) => r.reason,
            other => panic!("{sql}: {other:?}"),
        }
    };
    let limit = "SELECT id FROM orders WHERE user_id IN (?, ?) LIMIT ?";
    assert!(refused(limit, [1, 2, 5]).contains("LIMIT"));
    assert_eq!(
        execute(&template(limit), &[number(1), number(5), number(5)])
            .0
            .len(),
        1
    );
    let max = "SELECT MAX(user_id + ?) FROM orders";
    assert!(refused(max, [1, 0, 0]).contains("parameter"));
}

#[test]
fn updates_and_deletes_route_by_the_parameter_in_their_where() {
    let t = template("UPDATE orders SET note = ? WHERE user_id = ?");
    let (runs, _) = execute(&t, &[Value::String("n".into()), number(9)]);
    assert_eq!(
        runs,
        [(
            2,
            "UPDATE `orders_p1` AS `orders` SET note = ? WHERE user_id = ?".into(),
            None
        )]
    );
    let t = template("DELETE FROM orders WHERE user_id IN (?, ?)");
    let (runs, merge) = execute(&t, &[number(2), number(6)]);
    assert_eq!(runs.len(), 1);
    assert_eq!(merge, Merge::Single);
    let (runs, merge) = execute(&t, &[number(1), number(2)]);
    assert_eq!(runs.len(), 2);
    assert_eq!(merge, Merge::AffectedRows);
}

#[test]
fn an_insert_places_each_row_by_its_parameter_and_takes_that_rows_parameters() {
    let t = template("INSERT INTO orders (user_id, note) VALUES (?, ?), (?, 'b'), (?, ?) ON DUPLICATE KEY UPDATE note = ?");
    let params = [
        number(1),
        Value::String("a".into()),
        number(4),
        number(5),
        Value::String("c".into()),
        Value::String("d".into()),
    ];
    let (runs, merge) = execute(&t, &params);
    assert_eq!(merge, Merge::AffectedRows);
    assert_eq!(
        runs,
        [
            (
                2,
                "INSERT INTO `orders_p1` (user_id, note) VALUES (?, ?), (?, ?) ON DUPLICATE KEY UPDATE note = ?".into(),
                Some(vec![0, 1, 3, 4, 5])
            ),
            (
                1,
                "INSERT INTO `orders_default` (user_id, note) VALUES (?, 'b') ON DUPLICATE KEY UPDATE note = ?".into(),
                Some(vec![2, 5])
            ),
        ]
    );
    // Rows that all go to one partition keep the text and every parameter.
    let (runs, merge) = execute(
        &t,
        &[
            number(1),
            number(1),
            number(5),
            number(9),
            number(0),
            number(0),
        ],
    );
    assert_eq!(merge, Merge::Single);
    assert_eq!(runs[0].2, None);
    assert!(runs[0].1.contains("(?, ?), (?, 'b'), (?, ?)"));
    // One row: the shaped form.
    let t = template("INSERT INTO orders SET note = ?, user_id = ?");
    let (runs, _) = execute(&t, &[Value::String("a".into()), number(2)]);
    assert_eq!(
        runs[0].1,
        "INSERT INTO `orders_p2` SET note = ?, user_id = ?"
    );
}

#[test]
fn literals_in_a_prepared_statement_route_as_in_a_query() {
    let t = template("SELECT * FROM orders WHERE user_id = 5 AND note = ?");
    assert!(!t.by_parameters());
    let (runs, _) = execute(&t, &[Value::String("x".into())]);
    assert_eq!(runs[0].0, 2);
    let t = template("SELECT * FROM orders WHERE note = ?");
    assert_eq!(execute(&t, &[Value::Null]).0.len(), 3);
}

#[test]
fn a_changed_dictionary_or_a_bad_value_never_routes_on_an_old_plan() {
    let t = template("SELECT * FROM orders WHERE user_id = ?");
    let routing = t.route(&dictionary(2), 1, |_| Ok(number(1)));
    assert!(matches!(routing, Routing::Replan), "{routing:?}");
    let routing = t.route(&dictionary(1), 1, |_| Ok(Value::String("abc".into())));
    assert!(matches!(routing, Routing::Refuse(_)), "{routing:?}");
    let routing = t.route(&dictionary(1), 1, |_| Err("no value".into()));
    assert!(matches!(routing, Routing::Refuse(r) if r.reason == "no value"));
}

#[test]
fn user_variables_keep_a_prepared_statement_on_the_main_backend() {
    let t = template("SELECT @x FROM orders WHERE user_id = ?");
    assert_eq!(execute(&t, &[number(2)]).0[0].0, 1);
    let routing = t.route(&dictionary(1), 1, |_| Ok(number(1)));
    assert!(matches!(routing, Routing::Refuse(r) if r.reason.contains("user variables")));
}

#[test]
fn a_range_of_parameters_reaches_the_partitions_of_its_values() {
    let t = template("SELECT SUM(total) FROM orders WHERE user_id BETWEEN ? AND ?");
    let backends = |low, high| {
        let (runs, _) = execute(&t, &[number(low), number(high)]);
        runs.into_iter()
            .map(|(b, sql, _)| (b, sql.contains("orders_p1")))
            .collect::<Vec<_>>()
    };
    // MOD(4): 5 is p1's, on backend 2.
    assert_eq!(backends(5, 5), [(2, true)]);
    // 2 and 3: p2 and the default, both on backend 1, each a partition.
    assert_eq!(backends(2, 3).len(), 2);
    // An empty range: one table answers it.
    assert_eq!(backends(9, 4).len(), 1);
    // Every value: every partition.
    assert_eq!(backends(0, 1000).len(), 3);
}

/// Tables whose partition columns equal two parameters run as one join
/// where the two values lie in one partition (5 and 1 both in p1), the
/// partitions of the first value's; elsewhere the execution is refused
/// (the proxy answers it from copies).
#[test]
fn a_join_pinned_by_two_parameters_runs_in_their_partition_when_they_share_one() {
    let t = template(
        "SELECT COUNT(*) FROM orders o, lines l WHERE o.user_id = ? AND l.user_id = ? AND l.order_id = o.id",
    );
    let text = |suffix: &str| {
        format!(
            "SELECT COUNT(*) FROM `orders_{suffix}` o, `lines_{suffix}` l WHERE o.user_id = ? AND l.user_id = ? AND l.order_id = o.id"
        )
    };
    for (a, b, backend, suffix) in [
        (1, 1, 2, "p1"),
        (5, 1, 2, "p1"),
        (2, 6, 1, "p2"),
        (3, 7, 1, "default"),
    ] {
        let (runs, merge) = execute(&t, &[number(a), number(b)]);
        assert_eq!(runs, [(backend, text(suffix), None)], "{a}, {b}");
        assert_eq!(merge, Merge::Single);
    }
    for (a, b) in [(1, 2), (2, 3), (0, 1)] {
        let routing = t.route(&dictionary(1), 1, |i| Ok(number([a, b][i])));
        assert!(
            matches!(&routing, Routing::Refuse(r) if r.reason.contains("different partitions")),
            "{a}, {b}: {routing:?}"
        );
    }
    // A literal and a parameter: the parameter's value is checked alike.
    let t =
        template("SELECT COUNT(*) FROM orders o, lines l WHERE o.user_id = 1 AND l.user_id = ?");
    assert_eq!(execute(&t, &[number(9)]).0[0].0, 2);
    let routing = t.route(&dictionary(1), 1, |_| Ok(number(2)));
    assert!(matches!(routing, Routing::Refuse(_)), "{routing:?}");
    // Tables joined on their partition columns need no check.
    let t = template(
        "SELECT COUNT(*) FROM orders o, lines l WHERE o.user_id = ? AND l.user_id = ? AND l.user_id = o.user_id",
    );
    assert!(matches!(
        t.route(&dictionary(1), 1, |i| Ok(number([1, 2][i]))),
        Routing::Run(_)
    ));
}

//! The admin commands that only read: SHOW_PARTITIONS, SHOW_TABLES, LOOKUP,
//! STATUS, SHOW_BACKENDS and EXPLAIN. They answer from this instance's memory and touch no
//! backend.

use hscale_planner::{plan, Action, ClientCharset, Context, TableName, Value};
use hscale_wire::resultset::ColumnType::{Integer, Text};

use super::{AdminAnswer, AdminError, Caller};
use crate::error::ProxyError;
use crate::shared::Cluster;

fn some(value: impl ToString) -> Option<String> {
    Some(value.to_string())
}

pub fn partitions(shared: &Cluster, table: &TableName) -> Result<AdminAnswer, ProxyError> {
    let dictionary = shared.dictionary.snapshot();
    let t = super::partitioned(&dictionary, table)?;
    let mut rows = vec![vec![
        some("(default)"),
        None,
        some(t.default_backend),
        some(&t.default_table),
        some("active"),
    ]];
    for e in &t.entries {
        rows.push(vec![
            some(&e.name),
            some(&e.value),
            some(e.backend),
            some(t.partition_table(&e.name)),
            some(e.state.name()),
        ]);
    }
    Ok(AdminAnswer::Rows {
        columns: vec![
            ("partition", Text),
            ("value", Text),
            ("backend", Integer),
            ("table", Text),
            ("state", Text),
        ],
        rows,
    })
}

pub fn tables(shared: &Cluster) -> AdminAnswer {
    let dictionary = shared.dictionary.snapshot();
    let rows = dictionary
        .tables()
        .into_iter()
        .map(|t| {
            vec![
                some(&t.table.db),
                some(&t.table.name),
                some(&t.column),
                some(&t.function),
                some(&t.default_table),
                some(t.default_backend),
                some(t.entries.len()),
            ]
        })
        .chain(dictionary.references().into_iter().map(|r| {
            // A copy on each backend; its function says so.
            let function = match r.ready {
                true => "REFERENCE",
                false => "REFERENCE (writes wait)",
            };
            vec![
                some(&r.table.db),
                some(&r.table.name),
                None,
                some(function),
                some(&r.table.name),
                some(r.backends.first().copied().unwrap_or_default()),
                some(r.backends.len()),
            ]
        }))
        .collect();
    AdminAnswer::Rows {
        columns: vec![
            ("database", Text),
            ("table", Text),
            ("column", Text),
            ("function", Text),
            ("default_table", Text),
            ("default_backend", Integer),
            ("partition_values", Integer),
        ],
        rows,
    }
}

pub fn lookup(
    shared: &Cluster,
    table: &TableName,
    value: &Value,
) -> Result<AdminAnswer, ProxyError> {
    let dictionary = shared.dictionary.snapshot();
    let t = super::partitioned(&dictionary, table)?;
    let partition_value = t
        .function
        .apply(t.kind, &t.folding, value)
        .map_err(AdminError::from)?;
    let target = t.target_for(value).map_err(AdminError::from)?;
    Ok(AdminAnswer::Rows {
        columns: vec![
            ("partition_value", Text),
            ("partition", Text),
            ("backend", Integer),
            ("table", Text),
        ],
        rows: vec![vec![
            some(partition_value),
            some(target.partition.as_deref().unwrap_or("(default)")),
            some(target.backend),
            some(target.table),
        ]],
    })
}

pub fn status(shared: &crate::shared::Shared) -> AdminAnswer {
    let dictionary = shared.dictionary.snapshot();
    let counters = &shared.counters;
    let relaxed = std::sync::atomic::Ordering::Relaxed;
    let mut rows = vec![
        (
            "uptime_seconds",
            shared.started.elapsed().as_secs().to_string(),
        ),
        ("questions", counters.questions.total().to_string()),
        ("routed_statements", counters.routed.total().to_string()),
        (
            "lookup_joins",
            counters.lookup_joins.load(relaxed).to_string(),
        ),
        (
            "copied_statements",
            counters.copied.load(relaxed).to_string(),
        ),
        ("deadlocks", counters.deadlocks.load(relaxed).to_string()),
        (
            "client_connections",
            counters.clients.load(relaxed).to_string(),
        ),
        (
            "moved_clients",
            shared.balance.moved.load(relaxed).to_string(),
        ),
        ("dictionary_version", dictionary.version.to_string()),
        (
            "dictionary_fresh",
            u8::from(shared.dictionary.fresh()).to_string(),
        ),
        ("partitioned_tables", dictionary.tables().len().to_string()),
        ("instance", shared.dictionary.instance.clone()),
        (
            "xa_committed",
            shared.xa.committed.load(relaxed).to_string(),
        ),
        (
            "xa_unresolved_branches",
            shared.xa.unresolved.load(relaxed).to_string(),
        ),
    ];
    let pools: Vec<(String, String)> = shared
        .pools
        .iter()
        .map(|p| {
            (
                format!("backend_{}_connections", p.id()),
                p.open_connections().to_string(),
            )
        })
        .collect();
    let mut all: Vec<Vec<Option<String>>> = rows
        .drain(..)
        .map(|(name, value)| vec![some(name), some(value)])
        .collect();
    all.extend(
        pools
            .into_iter()
            .map(|(name, value)| vec![some(name), some(value)]),
    );
    AdminAnswer::Rows {
        columns: vec![("name", Text), ("value", Text)],
        rows: all,
    }
}

/// Every host of every backend as the monitor last saw it.
pub fn backends(shared: &Cluster) -> AdminAnswer {
    let mut rows = Vec::new();
    for pool in &shared.pools {
        for host in pool.replicas().view(pool.id()) {
            let seen = &host.health;
            let replication = seen.replication.as_ref();
            let yes_no = |b: bool| some(if b { "Yes" } else { "No" });
            rows.push(vec![
                some(host.backend),
                some(&host.address),
                some(host.role),
                yes_no(seen.reachable),
                seen.checked
                    .filter(|_| seen.reachable)
                    .map(|_| u8::from(seen.read_only).to_string()),
                Some(seen.gtid_binlog.clone()).filter(|g| !g.is_empty()),
                Some(seen.gtid_slave.clone()).filter(|g| !g.is_empty()),
                replication.map(|r| r.source.clone()),
                replication.and_then(|r| yes_no(r.io_running && r.sql_running)),
                replication
                    .and_then(|r| r.lag_s)
                    .map(|s| (s * 1000).to_string()),
                seen.checked.map(|at| at.elapsed().as_millis().to_string()),
                (host.role == "writer").then(|| pool.open_connections().to_string()),
                seen.error.clone(),
            ]);
        }
    }
    AdminAnswer::Rows {
        columns: vec![
            ("backend", Integer),
            ("host", Text),
            ("role", Text),
            ("reachable", Text),
            ("read_only", Integer),
            ("gtid_binlog_pos", Text),
            ("gtid_slave_pos", Text),
            ("replicates_from", Text),
            ("replicating", Text),
            ("lag_ms", Integer),
            ("checked_ms_ago", Integer),
            ("connections", Integer),
            ("error", Text),
        ],
        rows,
    }
}

/// Where a statement would go and the SQL each backend would get.
pub fn explain(
    shared: &Cluster,
    caller: &Caller,
    statement: &str,
) -> Result<AdminAnswer, ProxyError> {
    let dictionary = shared.dictionary.snapshot();
    let ctx = Context {
        db: caller.db,
        quoting: caller.quoting,
        no_auto_value_on_zero: caller.no_auto_value_on_zero,
        tables_locked: false,
        // The admin command around the statement was read as UTF-8.
        charset: ClientCharset::Utf8,
        dictionary: &dictionary,
        main_backend: shared.main_backend(),
        passed_fences: &[],
    };
    let mut cache = hscale_planner::PlanCache::default();
    let steps = |steps: &[hscale_planner::Step]| {
        steps
            .iter()
            .map(|s| {
                let partition = s.target.partition.as_deref().unwrap_or("(default)");
                explain_row(partition, s.target.backend, Some(&s.target.table), &s.sql)
            })
            .collect()
    };
    let rows = match plan(statement.as_bytes(), &ctx, &mut cache).action {
        Action::Route(route) => steps(&route.steps),
        Action::Schema(change) => steps(&change.steps),
        Action::LockTables(locks) => locks
            .per_backend
            .iter()
            .map(|(backend, sql)| explain_row("(LOCK TABLES)", *backend, None, sql))
            .collect(),
        // One of them: where the client's transaction already is.
        Action::ReferenceRead(backends) => backends
            .iter()
            .map(|backend| explain_row("(any copy)", *backend, None, statement))
            .collect(),
        Action::Main | Action::Transaction(_) => vec![explain_row(
            "(not partitioned)",
            shared.main_backend(),
            None,
            statement,
        )],
        Action::Wait(table) => {
            return Err(
                AdminError::Invalid(format!("{table} is locked by a partition move")).into(),
            )
        }
        Action::Refuse(refusal) => return Err(ProxyError::Unroutable(refusal)),
        Action::Exists { table, .. } => return Err(AdminError::AlreadyPartitioned { table }.into()),
        Action::Listing(listing) => listing_rows(&listing, statement),
        Action::Admin | Action::Kill(_) | Action::XaRecover => {
            vec![explain_row(
                "(hscale)",
                shared.main_backend(),
                None,
                statement,
            )]
        }
        Action::Dynamic(dynamic) => {
            let what = match &dynamic {
                hscale_planner::Dynamic::Run(text) => format!("(runs) {text}"),
                other => format!("{other:?}"),
            };
            vec![explain_row(
                "(dynamic SQL)",
                shared.main_backend(),
                None,
                &what,
            )]
        }
        Action::Load(load) => load_rows(&load),
        Action::Template(_) => unreachable!("only plan_prepared makes templates"),
        Action::Federate(federation) => {
            federation_rows(&federation, shared.main_backend(), statement)
        }
        Action::Generate(generate) => vec![explain_row(
            "(AUTO_INCREMENT ids first)",
            shared.main_backend(),
            None,
            &format!("{} ids of {}", generate.count, generate.table),
        )],
    };
    Ok(AdminAnswer::Rows {
        columns: vec![
            ("partition", Text),
            ("backend", Integer),
            ("table", Text),
            ("sql", Text),
        ],
        rows,
    })
}

/// EXPLAIN ROUTE's rows for a statement no partition answers alone: the
/// lookup join's reads, where it is one, then the copies and the statement
/// on them.
fn federation_rows(
    federation: &hscale_planner::Federation,
    main: u32,
    statement: &str,
) -> Vec<Vec<Option<String>>> {
    let lookup = federation.lookup.iter().flat_map(|lookup| {
        let keys = ["<keys of the rows above>".to_string()];
        [
            explain_row("(lookup join)", main, None, &lookup.outer),
            explain_row("(lookup join)", main, None, &lookup.inner_read(&keys)),
        ]
    });
    let copy_label = match federation.lookup {
        Some(_) => "(copy, if the lookup cannot)",
        None => "(copy)",
    };
    let copies = federation.copies.iter().map(|copy| {
        let mut what = format!("copy of {}", copy.table);
        if !copy.filters.is_empty() {
            what.push_str(&format!(" WHERE {}", copy.filters.join(" AND ")));
        }
        if let Some(reduce) = &copy.reduce {
            let from = &federation.copies[reduce.from].table;
            what.push_str(&format!(
                ", `{}` among the values of {from}.`{}`",
                reduce.column, reduce.from_column
            ));
        }
        explain_row(copy_label, main, Some(&copy.table.name), &what)
    });
    let answer = explain_row("(on the copies)", main, None, statement);
    lookup
        .chain(copies)
        .chain(std::iter::once(answer))
        .collect()
}

/// EXPLAIN ROUTE's rows for LOAD DATA: the statement each partition's
/// rows go to.
fn load_rows(load: &hscale_planner::Load) -> Vec<Vec<Option<String>>> {
    (load.table.all_targets().iter())
        .map(|target| {
            let partition = target.partition.as_deref().unwrap_or("(default)");
            let sql = load.statement(target);
            explain_row(partition, target.backend, Some(&target.table), &sql)
        })
        .collect()
}

/// EXPLAIN ROUTE's rows for a listing: its backend's, then each other's.
fn listing_rows(listing: &hscale_planner::Listing, statement: &str) -> Vec<Vec<Option<String>>> {
    let first = explain_row(
        "(listing)",
        listing.backend,
        None,
        listing.sql.as_deref().unwrap_or(statement),
    );
    let elsewhere = (listing.elsewhere.iter())
        .map(|other| explain_row("(listing)", other.backend, None, &other.sql));
    std::iter::once(first).chain(elsewhere).collect()
}

/// One row of EXPLAIN ROUTE: where a statement goes and what it runs there.
fn explain_row(
    partition: &str,
    backend: u32,
    table: Option<&str>,
    sql: &str,
) -> Vec<Option<String>> {
    vec![
        some(partition),
        some(backend),
        table.map(str::to_string),
        some(sql),
    ]
}

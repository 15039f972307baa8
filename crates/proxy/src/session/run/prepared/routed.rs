//! EXECUTE of a statement on a partitioned table: routed by its parameters'
//! values each time, run on the partitions they pick (with ids hscale binds
//! where an INSERT leaves them to the server), or on copies of the tables
//! where the partitions' answers cannot be merged.

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use hscale_planner::PlanError;
use hscale_planner::{
    plan_copies, with_literals, Action, ClientCharset, Context, Execution, Merge, Routing, Value,
};
use hscale_wire::command;
use hscale_wire::execute::{without_cursor, Param, Parameters, Source};

use super::prepare::plan_template;
use super::{execute_on, literal, routed_mut, wrong_arguments, Routed, ROUTED_TEXTS};
use crate::error::ProxyError;
use crate::exec::{Command, StatementKey};
use crate::session::client::Client;
use crate::session::run::federate::Then;
use crate::session::scatter::Generated;
use crate::session::Backends;
use crate::session::Memo;
use crate::shared::Shared;

pub(super) fn unreadable() -> String {
    "a value of the partition column that is not UTF-8 (hscale reads it as utf8mb4: SET NAMES utf8mb4)"
        .to_string()
}

/// A parameter as the partition column's value, read as the server reads it
/// (`ClientCharset::reads`) or not at all.
pub(super) fn param_value(param: Param<'_>, charset: ClientCharset) -> Result<Value<'_>, String> {
    Ok(match param {
        Param::Null => Value::Null,
        Param::Int(n) => Value::Number(n.to_string().into()),
        Param::UInt(n) => Value::Number(n.to_string().into()),
        Param::Double(d) => Value::Number(d.to_string().into()),
        Param::Bytes(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) if charset.reads(bytes) => Value::String(Cow::Borrowed(text)),
            _ => return Err(unreadable()),
        },
        Param::Temporal(text) => Value::String(text.into()),
    })
}

/// The copies an execution of a prepared SELECT runs on, planned from
/// its text with this execution's values in place of its `?`: each copy
/// then reads only the rows those values allow. `None` where a value
/// cannot be written as a literal (long data, text hscale cannot read).
pub(super) fn copies_with_values(
    shared: &Arc<Shared>,
    client: &Client,
    backends: &Backends,
    statement: &StatementKey,
    rest: &[u8],
    count: usize,
    reason: &str,
) -> Option<hscale_planner::Federation> {
    let params = Parameters::parse(rest, count).ok()?;
    let literals = (0..count)
        .map(|i| literal(params.get(i).ok()?, client.charset))
        .collect::<Option<Vec<String>>>()?;
    let text = with_literals(statement.sql(), backends.quoting, &literals)?;
    let dictionary = shared.dictionary.planned_by(&backends.handle.on);
    let ctx = Context {
        db: statement.db(),
        ..crate::session::run::context(client, backends, &dictionary)
    };
    match plan_copies(&text, &ctx, reason.to_string()) {
        Action::Federate(federation) => Some(*federation),
        _ => None,
    }
}

/// EXECUTE of a statement on a partitioned table: on the partitions its
/// parameters' values pick, each with the text and parameters that are its.
pub(super) async fn execute_routed(
    shared: &Arc<Shared>,
    client: &mut Client,
    memo: &mut Memo,
    backends: &mut Backends,
    id: u32,
    rest: &[u8],
) -> Result<(), ProxyError> {
    let routed = routed_mut(memo, id).expect("checked");
    let table = routed.template.table().clone();
    if std::mem::take(&mut routed.long_data) {
        return Err(ProxyError::Unroutable(hscale_planner::Refusal {
            table: Some(table),
            reason: "long data (COM_STMT_SEND_LONG_DATA) for a prepared statement on a partitioned table".into(),
        }));
    }
    let count = usize::from(memo.statements.by_id[&id].params);
    let parameters = Parameters::parse(rest, count).map_err(|_| wrong_arguments())?;
    let charset = client.charset;
    let value = |k: usize| {
        parameters
            .get(k)
            .ok()
            .and_then(|p| param_value(p, charset).ok())
    };
    let no_auto_value_on_zero = backends.no_auto_value_on_zero;
    let template = &routed_mut(memo, id).expect("checked").template;
    let given = template.highest_id(value);
    // AUTO_INCREMENT ids hscale binds where the INSERT leaves them to
    // the server: each parameter the client's (`Some(k)`) or an id.
    let ids = template
        .ids_to_bind(value, no_auto_value_on_zero)
        .map_err(ProxyError::Unroutable)?;
    let added = template.id_params().len();
    let (rest, generated) = match ids.len() {
        0 => (Cow::Borrowed(rest), None),
        n => {
            let layout: Vec<Option<usize>> = (0..count + added)
                .map(|i| {
                    template
                        .client_param(i)
                        .filter(|_| ids.binary_search(&i).is_err())
                })
                .collect();
            let first = shared.sequences.take(shared, &table, n as u64).await?;
            let mut next_id = first;
            let sources: Vec<Source> = layout
                .iter()
                .map(|param| match *param {
                    Some(k) => Source::Client(k),
                    None => {
                        next_id += 1;
                        Source::Id(next_id - 1)
                    }
                })
                .collect();
            let generated = Generated {
                first,
                upsert: routed_mut(memo, id).expect("checked").template.upsert(),
            };
            (
                Cow::Owned(parameters.rebuild(&sources, true)),
                Some(generated),
            )
        }
    };
    let count = count + added;
    let params = Parameters::parse(&rest, count).map_err(|_| wrong_arguments())?;
    if let Some(given) = given {
        // Before the INSERT runs: nothing may be sent after its answer.
        shared.sequences.given(shared, &table, given).await?;
    }
    let before = backends.state.last_insert_id;
    let ran = run_routed(
        shared, client, memo, backends, id, count, &rest, &params, generated, &table,
    )
    .await;
    if given.is_some() && generated.is_none() {
        // Ids given are in the OK, but LAST_INSERT_ID() keeps its value.
        backends.state.last_insert_id = before;
    }
    ran
}

/// One run of an EXECUTE: the backend, the statement there, its
/// parameters.
type RunOn<'p> = (u32, StatementKey, Cow<'p, [u8]>);

/// Where an EXECUTE of a routed statement goes, and its runs there.
async fn run_routed(
    shared: &Arc<Shared>,
    client: &mut Client,
    memo: &mut Memo,
    backends: &mut Backends,
    id: u32,
    count: usize,
    rest: &[u8],
    params: &Parameters<'_>,
    generated: Option<Generated>,
    table: &hscale_planner::TableName,
) -> Result<(), ProxyError> {
    let refusal = |error: PlanError| ProxyError::Unroutable(error.refusal(Some(table.clone())));
    let routing = route(
        shared, client, memo, backends, id, count, rest, params, table,
    );
    let Some(execution) = routing.await? else {
        // Answered from copies of the tables.
        return Ok(());
    };
    shared.counters.routed.add(1);
    let routed = routed_mut(memo, id).expect("checked");
    let mut runs = runs_of(routed, &execution, count, rest, params).map_err(refusal)?;
    if let ([(backend, statement, rest)], None) = (runs.as_slice(), generated) {
        let slot = backends.slot_of(*backend)?;
        execute_on(
            shared,
            client,
            memo,
            backends,
            slot,
            id,
            statement.clone(),
            rest,
        )
        .await?;
        routed_mut(memo, id).expect("checked").last = Some(statement.clone());
        return Ok(());
    }
    let prepared = &memo.statements.by_id[&id];
    let needs = prepared.needs;
    if let Some(reason) = prepared.binds {
        let slot = backends.slot_of(runs[0].0)?;
        backends.slots[slot].binding.sticky.get_or_insert(reason);
    }
    let mut slots = Vec::with_capacity(runs.len());
    for (backend, ..) in &runs {
        slots.push(backends.slot_of(*backend)?);
    }
    if execution.writes {
        backends.check_writers(&slots)?;
    }
    let mut probes = Vec::new();
    if generated.is_none() && backends.must_unite(&slots) {
        let routed = routed_mut(memo, id).expect("checked");
        if let Some(united) = routed
            .template
            .united(&execution.runs, &execution.merge, count)
        {
            let db = routed.db.clone();
            runs.clear();
            slots.clear();
            for united in united.map_err(refusal)? {
                let statement = StatementKey::new(db.as_deref(), united.sql.as_bytes());
                let which = united.params.unwrap_or_default();
                slots.push(backends.slot_of(united.backend)?);
                probes.push(united.probe.map(Bytes::from));
                runs.push((
                    united.backend,
                    statement,
                    Cow::Owned(params.select(&which, false)),
                ));
            }
        }
    }
    let commands: Vec<Command> = runs
        .iter()
        .map(|(_, statement, rest)| Command::Statement {
            statement,
            client_id: id,
            code: command::STMT_EXECUTE,
            rest,
        })
        .collect();
    // With ids hscale bound, the OK reports the first.
    let merge = match generated {
        Some(_) => Merge::AffectedRows,
        None => execution.merge,
    };
    crate::session::scatter::run_merged(
        shared, client, memo, backends, merge, &slots, &commands, needs, generated, probes,
    )
    .await
}

/// The partitions an EXECUTE's parameters pick, once no move or schema
/// change holds its table and the dictionary is fresh; `None` where the
/// statement was answered from copies of the tables instead (partitions
/// whose answers hscale cannot merge).
async fn route(
    shared: &Arc<Shared>,
    client: &mut Client,
    memo: &mut Memo,
    backends: &mut Backends,
    id: u32,
    count: usize,
    rest: &[u8],
    params: &Parameters<'_>,
    table: &hscale_planner::TableName,
) -> Result<Option<Execution>, ProxyError> {
    let refusal = |error: PlanError| ProxyError::Unroutable(error.refusal(Some(table.clone())));
    let main_backend = shared.main_backend();
    let charset = client.charset;
    let (mut waited_since, mut dictionary_since) = (None, None);
    loop {
        let dictionary = shared.dictionary.planned_by(&backends.handle.on);
        let fresh = backends.handle.on.planned_fresh();
        let passed = backends.transaction_tables.clone();
        let routed = routed_mut(memo, id).expect("checked");
        let routing = routed
            .template
            .route_in(&dictionary, main_backend, &passed, |i| {
                params
                    .get(i)
                    .map_err(|e| e.to_string())
                    .and_then(|param| param_value(param, charset))
                    .map_err(PlanError::Refuse)
            });
        match routing {
            Routing::Run(_) if !fresh => {
                if !backends.wait_for_dictionary(&mut dictionary_since).await {
                    return Err(ProxyError::DictionaryStale);
                }
            }
            Routing::Run(execution) => {
                let tables = &mut backends.statement_tables;
                tables.clear();
                tables.extend(execution.runs.iter().map(|run| run.target.physical));
                backends.handle.on.runs_on(tables);
                return Ok(Some(execution));
            }
            Routing::Wait(table) => backends.wait_for_lock(&table, &mut waited_since).await?,
            // Partitions whose answers hscale cannot merge: this
            // execution runs on copies of the tables.
            Routing::Refuse(refusal) if !routed.template.writes() => {
                let (sql, db) = (routed.sql.clone(), routed.db.clone());
                let statement = StatementKey::new(db.as_deref(), &sql);
                let reason = refusal.reason.clone();
                let federation = match copies_with_values(
                    shared, client, backends, &statement, rest, count, &reason,
                ) {
                    Some(federation) => federation,
                    None => {
                        let ctx = Context {
                            db: db.as_deref(),
                            ..crate::session::run::context(client, backends, &dictionary)
                        };
                        match plan_copies(&sql, &ctx, reason) {
                            Action::Federate(federation) => *federation,
                            _ => return Err(ProxyError::Unroutable(refusal)),
                        }
                    }
                };
                let then = Then::Execute {
                    id,
                    statement,
                    rest,
                };
                crate::session::run::federate::run(
                    shared,
                    client,
                    memo,
                    backends,
                    &federation,
                    then,
                )
                .await?;
                return Ok(None);
            }
            Routing::Refuse(refusal) => return Err(ProxyError::Unroutable(refusal)),
            Routing::Replan => {
                let (sql, db) = (routed.sql.clone(), routed.db.clone());
                let plan = plan_template(client, backends, &sql, db.as_deref());
                let routed = routed_mut(memo, id).expect("checked");
                match plan.action {
                    Action::Template(template) => {
                        routed.template = *template;
                        routed.texts.clear();
                    }
                    Action::Wait(table) => backends.wait_for_lock(&table, &mut waited_since).await?,
                    Action::Refuse(refusal) => return Err(ProxyError::Unroutable(refusal)),
                    _ => return Err(refusal(
                        "a prepared statement whose table is no longer partitioned as when it was prepared (prepare it again)".into(),
                    )),
                }
            }
        }
    }
}

/// Each run's statement (its text kept for the next EXECUTE) and
/// parameters. Rows of several partitions come as one result set: no
/// cursor.
fn runs_of<'p>(
    routed: &mut Routed,
    execution: &Execution,
    count: usize,
    rest: &'p [u8],
    params: &Parameters<'_>,
) -> Result<Vec<RunOn<'p>>, PlanError> {
    let several = execution.runs.len() > 1;
    let mut runs = Vec::with_capacity(execution.runs.len());
    for run in &execution.runs {
        let statement = match routed.texts.iter().find(|(r, _)| r == run) {
            Some((_, statement)) => statement.clone(),
            None => {
                let text = routed.template.text(run)?;
                let statement = StatementKey::new(routed.db.as_deref(), text.as_bytes());
                if routed.texts.len() >= ROUTED_TEXTS {
                    routed.texts.clear();
                }
                routed.texts.push((run.clone(), statement.clone()));
                statement
            }
        };
        let rest = match routed.template.params(run, count) {
            Some(which) => Cow::Owned(params.select(&which, !several)),
            None if several => Cow::Owned(without_cursor(rest)),
            None => Cow::Borrowed(rest),
        };
        runs.push((run.target.backend, statement, rest));
    }
    Ok(runs)
}

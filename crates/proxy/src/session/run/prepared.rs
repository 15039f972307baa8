//! Prepared statements owned by hscale (COM_STMT_*). The client gets hscale's
//! ids; a statement is prepared lazily, by database and text, on whichever
//! backend connection runs it (`backend::Statements`), so preparing pins no
//! connection. A connection is held only while a statement has a cursor open
//! on it or long data sent to it (`Binding::open_statements`).

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use hscale_planner::PlanError;
use hscale_planner::{
    plan_copies, plan_prepared, with_literals, Action, ClientCharset, Context, Kind, Merge, Plan,
    Routing, Run, SessionChange, Template, TxEffect, Value,
};
use hscale_wire::command;
use hscale_wire::execute::{without_cursor, Param, Parameters, Source};
use hscale_wire::scan::{Completion, Expect};
use hscale_wire::{StatusFlags, WireError};
use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use super::federate::Then;
use crate::error::ProxyError;
use crate::exec::{Command, StatementKey};
use crate::session::client::Client;
use crate::session::scatter::Generated;
use crate::session::slots::Needs;
use crate::session::Backends;
use crate::session::Memo;
use crate::shared::Shared;

/// One of the client's prepared statements.
#[derive(Debug)]
pub(in crate::session) struct Prepared {
    statement: StatementKey,
    params: u16,
    /// The parameter types the client last bound (two bytes each). They are
    /// sent with every execution: the backend statement that runs it may
    /// never have seen them.
    types: Option<Bytes>,
    /// What running it does to the session, as for the same text in COM_QUERY.
    binds: Option<&'static str>,
    change: SessionChange,
    needs: Needs,
    kind: Kind,
    /// BEGIN, COMMIT, ROLLBACK or a savepoint: run as its text would be.
    controls: bool,
    tx_effect: TxEffect,
    /// On a partitioned table: routed by its parameters at each execution.
    routed: Option<Box<Routed>>,
    /// No partition answers it alone: each execution runs on the main
    /// backend over copies of its tables (`Session::federate`).
    federation: Option<Box<hscale_planner::Federation>>,
    /// A read of reference tables alone, and the backends that hold them:
    /// executed where the transaction is (`Action::ReferenceRead`).
    reference_read: Option<SmallVec<[u32; 4]>>,
}

impl Prepared {
    /// The backend statement that commands after EXECUTE (FETCH, RESET,
    /// CLOSE) concern: the one that ran last.
    fn backend_key(&self) -> &StatementKey {
        self.routed
            .as_ref()
            .and_then(|r| r.last.as_ref())
            .unwrap_or(&self.statement)
    }
}

/// A prepared statement on a partitioned table, planned once.
#[derive(Debug)]
struct Routed {
    template: Template,
    /// The session's database at PREPARE, where its table names are.
    db: Option<String>,
    /// The text, planned again if the dictionary changes.
    sql: Bytes,
    /// What each run prepares on its backend, made once per run.
    texts: Vec<(Run, StatementKey)>,
    /// The client sent long data, refused at EXECUTE: only then is it known
    /// which partition should have had it.
    long_data: bool,
    /// The statement that ran last, which holds the cursor if one is open.
    last: Option<StatementKey>,
}

/// Texts kept per routed statement: one per partition, or per set of rows
/// of a multi-row INSERT, of which there can be many.
const ROUTED_TEXTS: usize = 32;

/// A client's prepared statements, by hscale's ids.
#[derive(Debug, Default)]
pub(in crate::session) struct ClientStatements {
    by_id: FxHashMap<u32, Prepared>,
    last_id: u32,
}

impl ClientStatements {
    /// COM_RESET_CONNECTION and COM_CHANGE_USER close every statement.
    pub fn clear(&mut self) {
        self.by_id.clear();
    }

    fn next_id(&mut self) -> u32 {
        self.last_id = self.last_id.wrapping_add(1).max(1);
        self.last_id
    }
}

impl crate::session::Backends {
    /// The slot whose connection holds the statement's cursor or long data.
    fn open_slot(&self, id: u32) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.binding.open_statements.contains(&id))
    }

    /// After a statement command ran on `slot`: whether the statement now
    /// has a cursor open or long data waiting there.
    pub(in crate::session) fn track_statement(
        &mut self,
        slot: usize,
        id: u32,
        code: u8,
        completion: &Completion,
    ) {
        use command::*;
        let status = StatusFlags::from_bits_truncate(completion.status.unwrap_or(0));
        let open = match code {
            STMT_EXECUTE => {
                !completion.error && status.contains(StatusFlags::SERVER_STATUS_CURSOR_EXISTS)
            }
            STMT_FETCH => {
                !completion.error && !status.contains(StatusFlags::SERVER_STATUS_LAST_ROW_SENT)
            }
            STMT_SEND_LONG_DATA => true,
            _ => false,
        };
        let statements = &mut self.slots[slot].binding.open_statements;
        match open {
            true => statements.insert(id),
            false => statements.remove(&id),
        };
    }
}

const ER_STMT_HAS_NO_OPEN_CURSOR: u16 = 1421;
const ER_WRONG_ARGUMENTS: u16 = 1210;

/// MariaDB's answer to parameters it cannot read.
fn wrong_arguments() -> ProxyError {
    ProxyError::Refused(hscale_wire::packets::ErrorPacket::new(
        ER_WRONG_ARGUMENTS,
        "HY000",
        "Incorrect arguments to mysqld_stmt_execute",
    ))
}

fn unreadable() -> String {
    "a value of the partition column that is not UTF-8 (hscale reads it as utf8mb4: SET NAMES utf8mb4)"
        .to_string()
}

/// A parameter as the partition column's value, read as the server reads it
/// (`ClientCharset::reads`) or not at all.
fn param_value(param: Param<'_>, charset: ClientCharset) -> Result<Value<'_>, String> {
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

/// A parameter's value as SQL that reads as the same value: a double in
/// exponent form (a DOUBLE literal, not a DECIMAL one), text in hex.
fn literal(param: Param<'_>, charset: ClientCharset) -> Option<String> {
    Some(match param {
        Param::Null => "NULL".into(),
        Param::Int(n) => n.to_string(),
        Param::UInt(n) => n.to_string(),
        Param::Double(d) if d.is_finite() => format!("{d:e}"),
        Param::Double(_) => return None,
        Param::Bytes(bytes) if charset.reads(bytes) => {
            hscale_planner::text_literal(std::str::from_utf8(bytes).ok()?)
        }
        Param::Bytes(_) => return None,
        Param::Temporal(text) => hscale_planner::text_literal(&text),
    })
}

/// What follows the statement id in COM_STMT_EXECUTE, with the parameter
/// types the client bound last time when it sends none now; types it sends
/// are remembered.
fn with_types<'a>(
    prepared: &mut Prepared,
    payload: &'a Bytes,
) -> Result<Cow<'a, [u8]>, ProxyError> {
    let malformed = || {
        ProxyError::Client(WireError::Malformed {
            what: "COM_STMT_EXECUTE",
        })
    };
    let rest = payload.get(5..).ok_or_else(malformed)?;
    let params = usize::from(prepared.params);
    if params == 0 {
        return Ok(Cow::Borrowed(rest));
    }
    // flags (1), iteration count (4), NULL bitmap, "new params bound" (1).
    let bound_at = 5 + params.div_ceil(8);
    let bound = *rest.get(bound_at).ok_or_else(malformed)?;
    let types_at = bound_at + 1;
    if bound == 1 {
        let types = payload.slice_ref(
            rest.get(types_at..types_at + 2 * params)
                .ok_or_else(malformed)?,
        );
        prepared.types = Some(types);
        return Ok(Cow::Borrowed(rest));
    }
    let Some(types) = &prepared.types else {
        // The server answers this one as it would directly.
        return Ok(Cow::Borrowed(rest));
    };
    let mut with = Vec::with_capacity(rest.len() + types.len());
    with.extend_from_slice(&rest[..bound_at]);
    with.push(1);
    with.extend_from_slice(types);
    with.extend_from_slice(&rest[types_at..]);
    Ok(Cow::Owned(with))
}

/// COM_STMT_PREPARE: prepared on a backend to answer the client with the
/// statement's parameters and columns (on the main backend, or for a
/// partitioned table on its default partition's), and kept in that
/// connection's cache; the connection goes back to the pool.
pub(in crate::session) async fn prepare(
    shared: &Arc<Shared>,
    client: &mut Client,
    memo: &mut Memo,
    backends: &mut Backends,
    payload: Bytes,
) -> Result<(), ProxyError> {
    let payload = crate::session::with_own_values(shared, client, backends, payload);
    let sql = payload.slice(1..);
    let db = backends.state.db.clone();
    let plan = super::plan_waiting(client, memo, backends, |client, _, backends| {
        plan_template(client, backends, &sql, db.as_deref())
    })
    .await?;
    let refuse = |table, reason: &str| {
        Err(ProxyError::Unroutable(hscale_planner::Refusal {
            table,
            reason: reason.into(),
        }))
    };
    let refuse_schema = |table| {
        refuse(
            Some(table),
            "prepared schema statements on a partitioned table (send it as a query)",
        )
    };
    let controls = matches!(plan.action, Action::Transaction(_));
    let mut federation = None;
    let mut reference_read = None;
    let (statement, slot, routed) = match plan.action {
        Action::Federate(federated) => {
            federation = Some(federated);
            (StatementKey::new(db.as_deref(), &sql), shared.main, None)
        }
        // Where it will run: preparing on the main backend would open
        // the transaction there.
        Action::ReferenceRead(copies_on) => {
            let slot = backends.slot_with_copies(&copies_on).unwrap_or(shared.main);
            reference_read = Some(copies_on);
            (StatementKey::new(db.as_deref(), &sql), slot, None)
        }
        Action::Main | Action::Transaction(_) | Action::Admin | Action::Kill(_) => {
            (StatementKey::new(db.as_deref(), &sql), shared.main, None)
        }
        Action::Template(template) => {
            let run = template.describing_run();
            let text = template
                .text(&run)
                .map_err(|e| ProxyError::Unroutable(e.refusal(Some(template.table().clone()))))?;
            let statement = StatementKey::new(db.as_deref(), text.as_bytes());
            let slot = backends.slot_of(run.target.backend)?;
            let routed = Routed {
                template: *template,
                db: db.clone(),
                sql,
                texts: vec![(run, statement.clone())],
                long_data: false,
                last: None,
            };
            (statement, slot, Some(Box::new(routed)))
        }
        Action::Refuse(refusal) => return Err(ProxyError::Unroutable(refusal)),
        Action::Listing(_) => return refuse(
            None,
            "prepared statements (COM_STMT_PREPARE) that list tables or maintain them while tables are partitioned (send it as a query)",
        ),
        Action::LockTables(_) => {
            return refuse(None, "LOCK TABLES as a prepared statement (send it as a query)")
        }
        Action::Load(load) => {
            return refuse(
                Some(load.table.table.clone()),
                "LOAD DATA as a prepared statement (send it as a query)",
            )
        }
        Action::Schema(change) => return refuse_schema(change.table),
        Action::Exists { table, .. } => return refuse_schema(table),
        // The server prepares none of them either.
        Action::Dynamic(_) | Action::XaRecover => {
            return refuse(
                None,
                "dynamic SQL and XA RECOVER as prepared statements (send them as a query)",
            )
        }
        Action::Route(_) | Action::Wait(_) | Action::Generate(_) => {
            unreachable!("plan_prepared makes templates, plan_waiting waits")
        }
    };
    let id = memo.statements.next_id();
    let hidden = routed
        .as_ref()
        .map(|r| r.template.id_params().to_vec())
        .unwrap_or_default();
    let command = Command::Prepare {
        statement: &statement,
        id,
        hidden: &hidden,
    };
    let completion = match &federation {
        // Prepared where its copies stand, empty, for its columns.
        Some(federation) => {
            let then = Then::Prepare { command };
            super::federate::run(shared, client, memo, backends, federation, then)
                .await?
                .unwrap_or_default()
        }
        None => {
            // Preparing opens no part of the transaction there.
            let needs = Needs {
                reach: hscale_transaction::Reach {
                    outside: true,
                    ..Default::default()
                },
                ..Needs::default()
            };
            backends
                .execute_command(
                    client,
                    slot,
                    command,
                    Some(Expect::Prepare),
                    needs,
                    SessionChange::Nothing,
                )
                .await?
        }
    };
    if !completion.error {
        let prepared = Prepared {
            statement,
            params: completion.params.saturating_sub(hidden.len() as u16),
            types: None,
            binds: plan.binds,
            change: plan.change,
            needs: Needs::of(&plan.summary).with_effect(plan.tx_effect),
            kind: plan.summary.kind,
            controls,
            tx_effect: plan.tx_effect,
            routed,
            federation,
            reference_read,
        };
        memo.statements.by_id.insert(id, prepared);
    }
    Ok(())
}

/// Plans a statement being prepared, in the database it was prepared in.
fn plan_template(client: &Client, backends: &Backends, sql: &[u8], db: Option<&str>) -> Plan {
    let dictionary = backends.shared.dictionary.planned_by(&backends.handle.on);
    let ctx = Context {
        db,
        ..super::context(client, backends, &dictionary)
    };
    plan_prepared(sql, &ctx)
}

pub(in crate::session) async fn statement_command(
    shared: &Arc<Shared>,
    client: &mut Client,
    memo: &mut Memo,
    backends: &mut Backends,
    code: u8,
    payload: Bytes,
) -> Result<(), ProxyError> {
    use command::*;
    let id = payload
        .get(1..5)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or(ProxyError::Client(WireError::Malformed {
            what: "statement command",
        }))?;
    let unknown = |command| ProxyError::UnknownStatement {
        stmt_id: id,
        command,
    };
    if !memo.statements.by_id.contains_key(&id) {
        return match code {
            STMT_EXECUTE => Err(unknown("mysqld_stmt_execute")),
            STMT_FETCH => Err(unknown("mysqld_stmt_fetch")),
            STMT_RESET => Err(unknown("mysqld_stmt_reset")),
            // No answer to give: MariaDB ignores these too.
            _ => Ok(()),
        };
    }
    match code {
        STMT_EXECUTE => execute_statement(shared, client, memo, backends, id, &payload).await,
        STMT_SEND_LONG_DATA if routed_mut(memo, id).is_some() => {
            routed_mut(memo, id).expect("checked").long_data = true;
            Ok(())
        }
        STMT_SEND_LONG_DATA => {
            let slot = backends.open_slot(id).unwrap_or(shared.main);
            run_statement(client, memo, backends, slot, id, code, &payload[5..], None)
                .await
                .map(drop)
        }
        STMT_FETCH => match backends.open_slot(id) {
            Some(slot) => run_statement(
                client,
                memo,
                backends,
                slot,
                id,
                code,
                &payload[5..],
                Some(Expect::Rows),
            )
            .await
            .map(drop),
            None => Err(ProxyError::Refused(hscale_wire::packets::ErrorPacket::new(
                ER_STMT_HAS_NO_OPEN_CURSOR,
                "HY000",
                format!("The statement ({id}) has no open cursor."),
            ))),
        },
        STMT_RESET => {
            if let Some(routed) = routed_mut(memo, id) {
                routed.long_data = false;
            }
            match backends.open_slot(id) {
                Some(slot) => run_statement(
                    client,
                    memo,
                    backends,
                    slot,
                    id,
                    code,
                    &[],
                    Some(Expect::Single),
                )
                .await
                .map(drop),
                // Nothing of it lives on a backend connection.
                None => backends.send_ok(client).await,
            }
        }
        _ => {
            if let Some(slot) = backends.open_slot(id) {
                close_open_statement(client, memo, backends, slot, id).await?;
            }
            memo.statements.by_id.remove(&id);
            Ok(())
        }
    }
}

fn routed_mut(memo: &mut Memo, id: u32) -> Option<&mut Routed> {
    memo.statements.by_id.get_mut(&id)?.routed.as_deref_mut()
}

/// COM_STMT_EXECUTE, on the connection that holds the statement's cursor
/// or long data, else the main backend's, or for a statement on a
/// partitioned table where its parameters route it; its effects on the
/// session are those of the same text in COM_QUERY.
async fn execute_statement(
    shared: &Arc<Shared>,
    client: &mut Client,
    memo: &mut Memo,
    backends: &mut Backends,
    id: u32,
    payload: &Bytes,
) -> Result<(), ProxyError> {
    let main = shared.main;
    let prepared = memo.statements.by_id.get_mut(&id).expect("checked");
    let rest = with_types(prepared, payload)?;
    // BEGIN, COMMIT, ROLLBACK and savepoints concern every backend the
    // transaction reaches (sysbench prepares them): they run as their
    // text would.
    let sql = prepared.statement.sql();
    if prepared.controls {
        let mut text = Vec::with_capacity(1 + sql.len());
        text.push(command::QUERY);
        text.extend_from_slice(sql);
        return super::query(shared, client, memo, backends, text.into()).await;
    }
    if routed_mut(memo, id).is_some() {
        // A new execution closes the cursor of the last one, wherever it is.
        if let Some(slot) = backends.open_slot(id) {
            close_open_statement(client, memo, backends, slot, id).await?;
        }
        return execute_routed(shared, client, memo, backends, id, &rest).await;
    }
    let on_copies = match &memo.statements.by_id[&id].reference_read {
        Some(copies_on) => backends.slot_with_copies(copies_on),
        None => None,
    };
    let slot = backends.open_slot(id).or(on_copies).unwrap_or(main);
    let statement = memo.statements.by_id[&id].statement.clone();
    if let Some(federation) = memo.statements.by_id[&id].federation.clone() {
        let count = usize::from(memo.statements.by_id[&id].params);
        let federation = copies_with_values(
            shared,
            client,
            backends,
            &statement,
            &rest,
            count,
            &federation.reason,
        )
        .unwrap_or(*federation);
        let then = Then::Execute {
            id,
            statement,
            rest: &rest,
        };
        return super::federate::run(shared, client, memo, backends, &federation, then)
            .await
            .map(drop);
    }
    execute_on(shared, client, memo, backends, slot, id, statement, &rest).await
}

/// The copies an execution of a prepared SELECT runs on, planned from
/// its text with this execution's values in place of its `?`: each copy
/// then reads only the rows those values allow. `None` where a value
/// cannot be written as a literal (long data, text hscale cannot read).
fn copies_with_values(
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
        ..super::context(client, backends, &dictionary)
    };
    match plan_copies(&text, &ctx, reason.to_string()) {
        Action::Federate(federation) => Some(*federation),
        _ => None,
    }
}

/// EXECUTE of one backend statement on one slot.
pub(in crate::session) async fn execute_on(
    shared: &Arc<Shared>,
    client: &mut Client,
    memo: &mut Memo,
    backends: &mut Backends,
    slot: usize,
    id: u32,
    statement: StatementKey,
    rest: &[u8],
) -> Result<(), ProxyError> {
    let prepared = &memo.statements.by_id[&id];
    let (binds, change, needs, tx_effect, writes) = (
        prepared.binds,
        prepared.change.clone(),
        match prepared.routed {
            Some(_) => prepared.needs.routed(),
            None => prepared.needs,
        },
        prepared.tx_effect,
        prepared.kind.writes()
            || prepared
                .routed
                .as_ref()
                .is_some_and(|r| r.template.writes()),
    );
    if let Some(reason) = binds {
        backends.slots[slot].binding.sticky.get_or_insert(reason);
    }
    if writes {
        backends.check_writers(&[slot])?;
    }
    super::transaction::commit_before(shared, backends, slot, tx_effect, statement.sql()).await?;
    if matches!(tx_effect, TxEffect::Hides(_) | TxEffect::ClientXa) {
        backends.tx.runs_unseen(slot);
    }
    let command = Command::Statement {
        statement: &statement,
        client_id: id,
        code: command::STMT_EXECUTE,
        rest,
    };
    backends
        .execute_command(
            client,
            slot,
            command,
            Some(Expect::ResultSets),
            needs,
            change,
        )
        .await?;
    if writes {
        backends.tx.wrote(slot);
    }
    Ok(())
}

/// EXECUTE of a statement on a partitioned table: on the partitions its
/// parameters' values pick, each with the text and parameters that are its.
async fn execute_routed(
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
    let main_backend = shared.main_backend();
    let charset = client.charset;
    let (mut waited_since, mut dictionary_since) = (None, None);
    let execution = loop {
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
                break execution;
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
                            ..super::context(client, backends, &dictionary)
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
                return super::federate::run(shared, client, memo, backends, &federation, then)
                    .await
                    .map(drop);
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
    };
    shared.counters.routed.add(1);
    let several = execution.runs.len() > 1;
    let routed = routed_mut(memo, id).expect("checked");
    let mut runs = Vec::with_capacity(execution.runs.len());
    for run in &execution.runs {
        let statement = match routed.texts.iter().find(|(r, _)| r == run) {
            Some((_, statement)) => statement.clone(),
            None => {
                let text = routed.template.text(run).map_err(refusal)?;
                let statement = StatementKey::new(routed.db.as_deref(), text.as_bytes());
                if routed.texts.len() >= ROUTED_TEXTS {
                    routed.texts.clear();
                }
                routed.texts.push((run.clone(), statement.clone()));
                statement
            }
        };
        // Rows of several partitions come as one result set: no cursor.
        let rest = match routed.template.params(run, count) {
            Some(which) => Cow::Owned(params.select(&which, !several)),
            None if several => Cow::Owned(without_cursor(rest)),
            None => Cow::Borrowed(rest),
        };
        runs.push((run.target.backend, statement, rest));
    }
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

pub(in crate::session) async fn run_statement(
    client: &mut Client,
    memo: &mut Memo,
    backends: &mut Backends,
    slot: usize,
    id: u32,
    code: u8,
    rest: &[u8],
    expect: Option<Expect>,
) -> Result<Completion, ProxyError> {
    let statement = memo.statements.by_id[&id].backend_key().clone();
    let command = Command::Statement {
        statement: &statement,
        client_id: id,
        code,
        rest,
    };
    backends
        .execute_command(
            client,
            slot,
            command,
            expect,
            Needs::default(),
            SessionChange::Nothing,
        )
        .await
}

/// COM_STMT_CLOSE of a statement with a cursor or long data: the backend
/// statement stays prepared for the next client, reset.
async fn close_open_statement(
    client: &mut Client,
    memo: &mut Memo,
    backends: &mut Backends,
    slot: usize,
    id: u32,
) -> Result<(), ProxyError> {
    backends.slots[slot].binding.open_statements.remove(&id);
    let Some(mut conn) = backends.slots[slot].held.take() else {
        return Ok(());
    };
    let key = memo.statements.by_id[&id].backend_key().clone();
    let reset = async {
        let backend_id = conn.statement_id(&key.key, key.db_len).await?;
        if let Ok(backend_id) = backend_id {
            let mut payload = vec![command::STMT_RESET];
            payload.extend_from_slice(&backend_id.to_le_bytes());
            conn.run(&payload, Expect::Single).await?.ok();
        }
        Ok::<_, crate::backend::BackendError>(())
    };
    match reset.await {
        Ok(()) => backends.checkin(slot, conn),
        Err(e) => {
            backends.forget_connection_state(slot);
            tracing::debug!(
                connection_id = client.connection_id,
                "closing a cursor: {e}"
            );
        }
    }
    Ok(())
}

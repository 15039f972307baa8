//! Prepared statements owned by hscale (COM_STMT_*). The client gets hscale's
//! ids; a statement is prepared lazily, by database and text, on whichever
//! backend connection runs it (`backend::Statements`), so preparing pins no
//! connection. A connection is held only while a statement has a cursor open
//! on it or long data sent to it (`Binding::open_statements`).

mod prepare;
mod routed;

pub(in crate::session) use prepare::prepare;
use routed::{copies_with_values, execute_routed};

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use hscale_planner::{ClientCharset, Kind, Run, SessionChange, Template, TxEffect};
use hscale_wire::command;
use hscale_wire::execute::Param;
use hscale_wire::scan::{Completion, Expect};
use hscale_wire::{StatusFlags, WireError};
use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use super::federate::Then;
use crate::error::ProxyError;
use crate::exec::{Command, StatementKey};
use crate::session::client::Client;
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
    /// backend over copies of its tables (`run::federate`).
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

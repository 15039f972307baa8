//! Prepared statements owned by hscale (COM_STMT_*). The client gets hscale's
//! ids; a statement is prepared lazily, by database and text, on whichever
//! backend connection runs it (`backend::Statements`), so preparing pins no
//! connection. A connection is held only while a statement has a cursor open
//! on it or long data sent to it (`Binding::open_statements`).

use std::borrow::Cow;

use bytes::Bytes;
use hscale_planner::{Action, Kind, SessionChange};
use hscale_wire::scan::{Completion, Expect};
use hscale_wire::{StatusFlags, WireError};
use rustc_hash::FxHashMap;

use super::slots::Needs;
use super::Session;
use crate::error::ProxyError;
use crate::exec::{Command, StatementKey};

/// One of the client's prepared statements.
#[derive(Debug)]
pub(super) struct Prepared {
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
}

/// A client's prepared statements, by hscale's ids.
#[derive(Debug, Default)]
pub(super) struct ClientStatements {
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

impl Session {
    /// COM_STMT_PREPARE: prepared on the main backend to answer the client
    /// with the statement's parameters and columns, and kept in that
    /// connection's cache; the connection goes back to the pool.
    pub(super) async fn prepare(&mut self, payload: Bytes) -> Result<(), ProxyError> {
        let plan = self.plan(&payload[1..]);
        let table = match plan.action {
            Action::Route(route) => Some(hscale_planner::TableName::clone(&route.table)),
            Action::Wait(table) | Action::Exists { table, .. } => Some(table),
            Action::Schema(change) => Some(change.table),
            Action::Refuse(refusal) => refusal.table,
            Action::Main | Action::Admin | Action::Kill(_) | Action::Listing(_) => None,
        };
        if let Some(table) = table {
            return Err(ProxyError::Unroutable(hscale_planner::Refusal {
                table: Some(table),
                reason: "prepared statements (COM_STMT_PREPARE) on a partitioned table".into(),
            }));
        }
        let payload = self.with_own_connection_id(payload);
        let statement = StatementKey::new(self.state.db.as_deref(), &payload[1..]);
        let id = self.statements.next_id();
        let main = self.shared.main;
        let command = Command::Prepare {
            statement: &statement,
            id,
        };
        let completion = self
            .execute_command(
                main,
                command,
                Some(Expect::Prepare),
                Needs::default(),
                SessionChange::Nothing,
            )
            .await?;
        if !completion.error {
            let prepared = Prepared {
                statement,
                params: completion.params,
                types: None,
                binds: plan.binds,
                change: plan.change,
                needs: Needs {
                    last_insert_id: plan.summary.last_insert_id,
                    previous_connection: plan.summary.reads_previous_statement,
                },
                kind: plan.summary.kind,
            };
            self.statements.by_id.insert(id, prepared);
        }
        Ok(())
    }

    pub(super) async fn statement_command(
        &mut self,
        code: u8,
        payload: Bytes,
    ) -> Result<(), ProxyError> {
        use super::command::*;
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
        if !self.statements.by_id.contains_key(&id) {
            return match code {
                STMT_EXECUTE => Err(unknown("mysqld_stmt_execute")),
                STMT_FETCH => Err(unknown("mysqld_stmt_fetch")),
                STMT_RESET => Err(unknown("mysqld_stmt_reset")),
                // No answer to give: MariaDB ignores these too.
                _ => Ok(()),
            };
        }
        match code {
            STMT_EXECUTE => self.execute_statement(id, &payload).await,
            STMT_SEND_LONG_DATA => {
                let slot = self.open_slot(id).unwrap_or(self.shared.main);
                self.run_statement(slot, id, code, &payload[5..], None)
                    .await
                    .map(drop)
            }
            STMT_FETCH => match self.open_slot(id) {
                Some(slot) => self
                    .run_statement(slot, id, code, &payload[5..], Some(Expect::Rows))
                    .await
                    .map(drop),
                None => Err(ProxyError::Refused(hscale_wire::packets::ErrorPacket::new(
                    ER_STMT_HAS_NO_OPEN_CURSOR,
                    "HY000",
                    format!("The statement ({id}) has no open cursor."),
                ))),
            },
            STMT_RESET => match self.open_slot(id) {
                Some(slot) => self
                    .run_statement(slot, id, code, &[], Some(Expect::Single))
                    .await
                    .map(drop),
                // Nothing of it lives on a backend connection.
                None => self.send_ok().await,
            },
            _ => {
                if let Some(slot) = self.open_slot(id) {
                    self.close_open_statement(slot, id).await?;
                }
                self.statements.by_id.remove(&id);
                Ok(())
            }
        }
    }

    /// COM_STMT_EXECUTE, on the connection that holds the statement's cursor
    /// or long data, else the main backend's; its effects on the session are
    /// those of the same text in COM_QUERY.
    async fn execute_statement(&mut self, id: u32, payload: &Bytes) -> Result<(), ProxyError> {
        let main = self.shared.main;
        let slot = self.open_slot(id).unwrap_or(main);
        let prepared = self.statements.by_id.get_mut(&id).expect("checked");
        let rest = with_types(prepared, payload)?;
        let (binds, change, needs, kind) = (
            prepared.binds,
            prepared.change.clone(),
            prepared.needs,
            prepared.kind,
        );
        if matches!(kind, Kind::Commit | Kind::Rollback)
            && self
                .slots
                .iter()
                .enumerate()
                .any(|(i, s)| i != slot && s.binding.transaction)
        {
            return Err(ProxyError::Unroutable(hscale_planner::Refusal {
                table: None,
                reason: "a prepared COMMIT or ROLLBACK of a transaction on several backends (send it as a query)".into(),
            }));
        }
        if let Some(reason) = binds {
            self.slots[slot].binding.sticky.get_or_insert(reason);
        }
        if kind.writes() {
            self.check_writers(&[slot])?;
        }
        let statement = self.statements.by_id[&id].statement.clone();
        let command = Command::Statement {
            statement: &statement,
            client_id: id,
            code: super::command::STMT_EXECUTE,
            rest: &rest,
        };
        self.execute_command(slot, command, Some(Expect::ResultSets), needs, change)
            .await?;
        if kind.writes() && self.slots[slot].binding.transaction {
            self.slots[slot].binding.wrote = true;
        }
        Ok(())
    }

    async fn run_statement(
        &mut self,
        slot: usize,
        id: u32,
        code: u8,
        rest: &[u8],
        expect: Option<Expect>,
    ) -> Result<Completion, ProxyError> {
        let statement = self.statements.by_id[&id].statement.clone();
        let command = Command::Statement {
            statement: &statement,
            client_id: id,
            code,
            rest,
        };
        self.execute_command(
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
    async fn close_open_statement(&mut self, slot: usize, id: u32) -> Result<(), ProxyError> {
        self.slots[slot].binding.open_statements.remove(&id);
        let Some(mut conn) = self.slots[slot].held.take() else {
            return Ok(());
        };
        let key = self.statements.by_id[&id].statement.clone();
        let reset = async {
            let backend_id = conn.statement_id(&key.key, key.db_len).await?;
            if let Ok(backend_id) = backend_id {
                let mut payload = vec![super::command::STMT_RESET];
                payload.extend_from_slice(&backend_id.to_le_bytes());
                conn.run(&payload, Expect::Single).await?.ok();
            }
            Ok::<_, crate::backend::BackendError>(())
        };
        match reset.await {
            Ok(()) => self.checkin(slot, conn),
            Err(e) => {
                self.forget_connection_state(slot);
                tracing::debug!(connection_id = self.connection_id, "closing a cursor: {e}");
            }
        }
        Ok(())
    }

    /// The slot whose connection holds the statement's cursor or long data.
    fn open_slot(&self, id: u32) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.binding.open_statements.contains(&id))
    }

    /// After a statement command ran on `slot`: whether the statement now
    /// has a cursor open or long data waiting there.
    pub(super) fn track_statement(
        &mut self,
        slot: usize,
        id: u32,
        code: u8,
        completion: &Completion,
    ) {
        use super::command::*;
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

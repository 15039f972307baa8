//! A session's backend connections: one slot per backend, each holding at
//! most one connection and the reasons it is held (`Binding`). Running one
//! command on a slot — checkout, state replay, relay, checkin — lives here.

mod read_back;
mod replica;

use std::collections::{HashMap, HashSet};

use hscale_planner::{Autocommit, Kind, ReadsHint, SessionChange, Summary, TxEffect};
use hscale_transaction::{Opening, Reach, ServerStatus};
use hscale_wire::command;
use hscale_wire::scan::{Completion, Expect};
use hscale_wire::StatusFlags;

use super::backends::no_backslash_escapes;
use super::client::Client;
use super::state::{breaks_connection, zero_row_count, UNKNOWN_SETTINGS};
use crate::backend::{BackendConn, Bucket, ConnMark, Lease};
use crate::error::ProxyError;
use crate::exec::{send, Command, RelayError};

/// Why a client keeps its connection to one backend between statements.
#[derive(Debug, Default)]
pub(super) struct Binding {
    /// State only that connection holds (temporary tables, user variables,
    /// locks, ...): kept until the client leaves or resets.
    pub sticky: Option<&'static str>,
    /// hscale's prepared statements with a cursor open or long data sent on
    /// this connection, by the client's id.
    pub open_statements: HashSet<u32>,
    /// The session's previous statement ran here and left warnings that
    /// SHOW WARNINGS must find. One slot at most.
    pub diagnostics: bool,
}

/// `transaction`: the connection holds a part of the client's transaction
/// (`Transaction::holds`).
impl Binding {
    pub fn holds(&self, transaction: bool) -> bool {
        self.pins(transaction) || self.diagnostics
    }

    /// Holds for more than the last statement's warnings, which the next
    /// statement replaces anyway.
    pub fn pins(&self, transaction: bool) -> bool {
        self.sticky.is_some() || transaction || !self.open_statements.is_empty()
    }

    /// Whether the connection may serve another client once this one leaves.
    fn reusable(&self, transaction: bool) -> bool {
        self.sticky.is_none() && !transaction && self.open_statements.is_empty()
    }
}

/// One backend as a session sees it.
pub(super) struct Slot {
    pub bucket: Bucket,
    pub held: Option<Box<BackendConn>>,
    pub binding: Binding,
    /// The connection this session returned to the pool last, as it was
    /// then: the pool hands it back if no one used it since.
    pub returned: Option<ConnMark>,
    /// Something other than a read ran on the backend's writer since a
    /// replica was last seen to have applied it: the next read on a
    /// replica waits for the writer's position first (read-your-writes).
    pub wrote: bool,
}

/// Session state that a statement changed on `slot`'s connection and that
/// only the server can tell (`SessionChange::ReadBack`).
#[derive(Debug)]
pub(super) struct Unread {
    slot: usize,
    keys: Vec<String>,
    database: bool,
    /// The connection's settings before a statement that may change any of
    /// them (CALL): those that differ now are read back too.
    since: Option<Variables>,
}

impl Unread {
    /// Only what CALLs may have changed: another CALL on the same connection
    /// may run first.
    pub fn waits_for_calls(&self) -> bool {
        self.keys.is_empty() && !self.database && self.since.is_some()
    }
}

/// A connection's settings (`SETTINGS`) by name.
pub(super) type Variables = HashMap<String, Value>;

type Value = Option<Vec<u8>>;

/// The settings a CALL's read-back listed on `slot`, and the session's
/// settings `fingerprint` once what changed was recorded: while no SET
/// changes the fingerprint, the settings a CALL starts from, without
/// listing them again.
#[derive(Debug)]
pub(super) struct SettingsListed {
    slot: usize,
    fingerprint: u64,
    variables: Variables,
}

/// The connection that ran the session's previous command, which ROW_COUNT()
/// and FOUND_ROWS() read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Previous {
    /// Nothing ran for this client yet.
    Nothing,
    On {
        slot: usize,
        mark: ConnMark,
        /// It left warnings or an error, which only that connection has.
        messages: bool,
    },
    /// The previous statement ran on several connections: no one count.
    /// `messages`: it left warnings or an error, which no one connection
    /// keeps whole (`Backends::gathered` has them); otherwise `slot`'s
    /// connections have none.
    Scattered { messages: bool, slot: usize },
}

/// What a command needs of the connection it runs on, beyond the session's state.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Needs {
    /// LAST_INSERT_ID() as this session last set it.
    pub last_insert_id: bool,
    /// The connection that ran the session's previous command, untouched since
    /// (ROW_COUNT(), FOUND_ROWS()).
    pub previous_connection: bool,
    /// SHOW WARNINGS and the like: must not replace the diagnostics it reads.
    pub diagnostics: bool,
    /// The command only reads: a deferred BEGIN may ride with it. Were that
    /// BEGIN to fail, the read ran outside the transaction and changed nothing.
    pub reads_only: bool,
    /// A read that a replica may answer when the user reads from replicas
    /// outside a transaction: it neither locks, nor writes, nor reads the
    /// state of one connection.
    pub replica_ok: bool,
    /// The statement's comment says where its read goes.
    pub reads_hint: Option<ReadsHint>,
    /// hscale wrote a partition's physical table into the statement: its
    /// answer's columns are given the partitioned table's name
    /// (`ColumnNames`).
    pub logical_columns: bool,
    /// What it does to the transaction on the backend it reaches.
    pub reach: Reach,
}

impl Needs {
    pub fn of(summary: &Summary) -> Needs {
        Needs {
            last_insert_id: summary.last_insert_id,
            previous_connection: summary.reads_previous_statement,
            diagnostics: summary.reads_diagnostics,
            reads_only: summary.kind == Kind::Select,
            replica_ok: summary.kind == Kind::Select
                && !summary.binds_connection()
                && !summary.last_insert_id
                && !summary.reads_previous_statement
                && !summary.multi_statement
                && !summary.locks_or_writes,
            reads_hint: summary.reads_hint,
            logical_columns: false,
            reach: Reach {
                // SET and USE begin no transaction with autocommit off (a
                // `SET TRANSACTION` for the next one must find none begun).
                may_begin: !matches!(
                    summary.kind,
                    Kind::Set | Kind::Use | Kind::Kill | Kind::Admin | Kind::Empty
                ),
                ..Reach::default()
            },
        }
    }

    /// With what the statement does to the transaction in progress.
    pub fn with_effect(self, effect: TxEffect) -> Needs {
        let ends_transaction = match effect {
            TxEffect::CommitsFirst | TxEffect::ClientXa => true,
            TxEffect::SetsAutocommit { to, .. } => to == Autocommit::On,
            TxEffect::None | TxEffect::Hides(_) => false,
        };
        Needs {
            reach: Reach {
                ends_transaction,
                plain_branch: matches!(effect, TxEffect::Hides(_)),
                ..self.reach
            },
            ..self
        }
    }

    /// The needs of a statement hscale routed to a partition.
    pub fn routed(self) -> Needs {
        Needs {
            logical_columns: true,
            ..self
        }
    }
}

impl super::Backends {
    /// Runs the client's command on a backend connection and forwards its answer.
    pub(super) async fn execute(
        &mut self,
        client: &mut Client,
        slot: usize,
        payload: &[u8],
        expect: Option<Expect>,
        needs: Needs,
        change: SessionChange,
    ) -> Result<Completion, ProxyError> {
        self.execute_command(client, slot, Command::Raw(payload), expect, needs, change)
            .await
    }

    /// Runs one command on a backend connection and forwards its answer.
    pub(super) async fn execute_command(
        &mut self,
        client: &mut Client,
        slot: usize,
        command: Command<'_>,
        expect: Option<Expect>,
        needs: Needs,
        change: SessionChange,
    ) -> Result<Completion, ProxyError> {
        let mut lease = self.checkout(slot, needs).await?;
        let names = &self.shared.dictionary;
        let columns = needs.logical_columns.then_some(&mut client.column_names);
        let sent = send(
            &mut client.stream,
            &mut lease.conn,
            command,
            expect,
            names,
            columns,
        );
        let completion = match sent.await {
            Ok(completion) => completion,
            // Never sent again elsewhere: once the command's bytes went out the
            // server may have run it, and a write must not run twice. A dead
            // idle connection is found before anything is written (`Pool`).
            Err(RelayError::Backend { source, answered }) => {
                let backend = lease.conn.backend;
                self.forget_connection_state(slot);
                let error = crate::backend::BackendError::Lost { backend, source };
                return Err(if answered {
                    ProxyError::BackendMidAnswer { source: error }
                } else {
                    ProxyError::Backend(error)
                });
            }
            Err(RelayError::Client(e)) => return Err(ProxyError::Client(e)),
        };
        match change {
            // Also after an error: the statements before it ran.
            SessionChange::ReadBack { keys, database } => {
                self.read_back_later(slot, keys, database)
            }
            change if !completion.error => self.record(client, change, &mut lease.conn),
            _ => {}
        }
        if let Command::Statement {
            code, client_id, ..
        } = command
        {
            self.track_statement(slot, client_id, code, &completion);
        }
        let read_messages = needs.diagnostics
            && (self.slots[slot].binding.diagnostics
                || matches!(self.previous, Previous::On { slot: s, messages: true, .. } if s == slot));
        // They stay on the connection: reset before another client uses it.
        self.slots[slot].binding.diagnostics |= read_messages;
        self.finish_command(slot, lease, &completion);
        if let Previous::On { messages, .. } = &mut self.previous {
            // SHOW WARNINGS leaves the messages it read in place; the
            // connection goes back, and another read takes it out again.
            *messages |= read_messages;
        }
        Ok(completion)
    }
}

impl super::Backends {
    /// After a command: bindings from what the server said, the previous
    /// connection's mark, and the connection kept or returned.
    pub(super) fn finish_command(
        &mut self,
        slot: usize,
        mut lease: Lease,
        completion: &Completion,
    ) {
        // MySQL keeps warnings until a statement that uses a table: a connection
        // that had any must not show them to the next client.
        let diagnostics_left = self.slots[slot].binding.diagnostics || leaves_messages(completion);
        // Only a connection that took the session's latest settings tells
        // the session's autocommit (one that ended a branch may not have).
        let current = lease.conn.settings == self.state.fingerprint();
        self.after(slot, completion, current);
        if diagnostics_left && !self.holds(slot) {
            lease.conn.settings = UNKNOWN_SETTINGS;
        }
        self.previous = Previous::On {
            slot,
            mark: lease.conn.mark(),
            messages: leaves_messages(completion),
        };
        self.checkin(slot, lease.conn);
    }

    /// Updates bindings from what the server said about the session;
    /// `current`: the connection had the session's latest settings.
    fn after(&mut self, slot: usize, completion: &Completion, current: bool) {
        self.take_status(slot, completion.status, current);
        if completion.error {
            self.tx.failed(slot);
        }
        // Not for an error: the client has it from the error packet, and a
        // client that stops after one would keep a connection from the pool.
        self.slots[slot].binding.diagnostics = completion.warnings > 0;
        if completion.last_insert_id != 0 {
            self.state.last_insert_id = completion.last_insert_id;
        }
        // This statement's diagnostics replace those another backend's
        // connection was kept for.
        for other in (0..self.slots.len()).filter(|&other| other != slot) {
            if self.slots[other].binding.diagnostics {
                self.slots[other].binding.diagnostics = false;
                self.release_unheld(other);
            }
        }
    }

    /// What a backend's status says of the session on it; `current`: the
    /// connection had the session's latest settings.
    pub(super) fn take_status(&mut self, slot: usize, status: Option<u16>, current: bool) {
        let status = status.map(|status| {
            let status = StatusFlags::from_bits_truncate(status);
            self.quoting.no_backslash_escapes = no_backslash_escapes(status);
            ServerStatus {
                in_transaction: status.contains(StatusFlags::SERVER_STATUS_IN_TRANS),
                autocommit: status.contains(StatusFlags::SERVER_STATUS_AUTOCOMMIT),
                settings_current: current,
            }
        });
        self.tx.observe(slot, status);
    }

    /// The connection on `slot` stays with the client.
    pub(super) fn holds(&self, slot: usize) -> bool {
        self.slots[slot].binding.holds(self.tx.holds(slot))
    }

    /// Gives a held connection back once nothing holds it. Its diagnostics
    /// are not the next client's: it is reset first.
    pub(super) fn release_unheld(&mut self, slot: usize) {
        if self.holds(slot) {
            return;
        }
        if let Some(mut conn) = self.slots[slot].held.take() {
            conn.settings = UNKNOWN_SETTINGS;
            self.shared.pools[slot].release_to(&self.slots[slot].bucket, conn);
            if self.slots.iter().all(|s| s.held.is_none()) {
                self.handle.set_idle();
            }
        }
    }

    /// The held connection, or one from the pool brought to the session's
    /// state; inside a transaction that other backends already joined, the
    /// transaction is opened here too.
    pub(super) async fn checkout(
        &mut self,
        slot: usize,
        needs: Needs,
    ) -> Result<Lease, ProxyError> {
        // Nothing ran for this client yet: it must see a new connection's count.
        let like_new = needs.previous_connection
            && self.slots[slot].held.is_none()
            && self.previous == Previous::Nothing;
        if self.tx.asks_recordable(slot) {
            let bucket = self.slots[slot].bucket.clone();
            let recordable = crate::xa::may_record(&self.shared, slot, &bucket).await;
            self.tx.set_recordable(slot, recordable);
        }
        let opening = self.tx.opening(slot, needs.reach)?;
        self.let_go_of_a_replica(slot)?;
        let held = self.slots[slot].held.is_some();
        let mut lease = match self.slots[slot].held.take() {
            Some(conn) => Lease { conn },
            None => match self.previous {
                Previous::On {
                    slot: s,
                    mark,
                    messages,
                } if needs.previous_connection && s == slot => {
                    match self.take_previous(slot, mark) {
                        Some(lease) => lease,
                        // A pooled connection has no messages either.
                        None if needs.diagnostics && !messages => {
                            let bucket = &self.slots[slot].bucket;
                            self.shared.pools[slot].acquire(bucket, None).await?
                        }
                        None => return Err(ProxyError::PreviousStatementElsewhere),
                    }
                }
                Previous::Scattered { .. } if needs.previous_connection && !needs.diagnostics => {
                    return Err(ProxyError::PreviousStatementScattered)
                }
                // Boxed, and only for a user who reads replicas: every
                // statement's future stays the size it was without them.
                _ if self.may_read_a_replica(needs, &opening) => {
                    match Box::pin(self.replica_for(slot, needs, &opening)).await {
                        Some(lease) => lease,
                        None => self.writer_lease(slot, needs).await?,
                    }
                }
                _ => self.writer_lease(slot, needs).await?,
            },
        };
        // A replica's thread ids are not the writer's: KILL and the deadlock
        // detector, which act on the writer, must not take one for another.
        if self.shared.pools[slot].is_current(&lease.conn) {
            self.handle
                .set_running(lease.conn.backend, lease.conn.thread_id);
            self.handle.hold(lease.conn.backend, lease.conn.thread_id);
        }
        let xa = opening == Opening::XaStart;
        let queued = opening == Opening::QueuedBegin;
        let begin = match opening {
            Opening::Nothing => None,
            Opening::QueuedBegin => Some(command::query("BEGIN").into()),
            Opening::Begin(begin) => Some(begin),
            Opening::XaStart => {
                let shared = self.shared.clone();
                let decided_on = self.tx.plain_part();
                let running = self
                    .tx
                    .running_or(|| crate::xa::begin(&shared.cluster, decided_on));
                let xid = running.xid(self.shared.pools[slot].id());
                let start = hscale_transaction::statements::start(&xid);
                Some(command::query(&start).into())
            }
        };
        let prepared = async {
            self.state
                .apply(&mut lease.conn, needs.last_insert_id, held)
                .await?;
            if like_new {
                zero_row_count(&mut lease.conn).await?;
            }
            if let Some(begin) = begin.as_deref() {
                match needs.reads_only || queued {
                    true => lease.conn.queue_command(begin),
                    false => super::state::run_command(&mut lease.conn, begin).await?,
                }
                self.tx.opened(slot, xa);
            }
            Ok(())
        };
        if let Err(e) = prepared.await {
            if breaks_connection(&e) {
                self.forget_connection_state(slot);
            } else {
                self.checkin(slot, lease.conn);
            }
            return Err(e);
        }
        Ok(lease)
    }

    /// The connection that ran the session's previous command, if no one used it
    /// since. Only this session ran anything on it, so it holds the session's
    /// settings even if it was marked unknown for other clients' sake.
    fn take_previous(&mut self, slot: usize, mark: ConnMark) -> Option<Lease> {
        let mut conn = self.shared.pools[slot].take_marked(&self.slots[slot].bucket, mark)?;
        conn.settings = self.state.fingerprint();
        Some(Lease { conn })
    }

    pub(super) fn checkin(&mut self, slot: usize, conn: Box<BackendConn>) {
        let holds = self.holds(slot);
        let s = &mut self.slots[slot];
        if holds && s.held.is_none() {
            s.held = Some(conn);
        } else if holds {
            // A scan's second connection to this backend: the session keeps
            // one; this one's diagnostics are not the next client's.
            let mut conn = conn;
            conn.settings = UNKNOWN_SETTINGS;
            self.shared.pools[slot].release_to(&s.bucket, conn);
        } else {
            if self.slots.iter().all(|s| s.held.is_none()) {
                self.handle.set_idle();
            }
            self.slots[slot].returned = Some(conn.mark());
            self.shared.pools[slot].release_to(&self.slots[slot].bucket, conn);
        }
    }

    /// The connection that held the session's server-side state is gone.
    pub(super) fn forget_connection_state(&mut self, slot: usize) {
        self.tx.lost(slot);
        self.handle.set_idle();
        self.slots[slot].held = None;
        self.slots[slot].binding = Binding::default();
    }

    /// Connections that hold state of this client are closed, not pooled.
    pub(super) fn release_all(&mut self) {
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if let Some(mut conn) = slot.held.take() {
                if slot.binding.reusable(self.tx.holds(i)) {
                    if slot.binding.diagnostics {
                        conn.settings = UNKNOWN_SETTINGS;
                    }
                    self.shared.pools[i].release_to(&slot.bucket, conn);
                }
            }
            slot.binding = Binding::default();
        }
    }
}

/// Warnings or an error: what SHOW WARNINGS would list.
fn leaves_messages(completion: &Completion) -> bool {
    completion.warnings > 0 || completion.error
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_is_held_for_any_reason_and_reused_only_without_server_state() {
        let mut b = Binding::default();
        assert!(!b.holds(false) && b.reusable(false));
        b.diagnostics = true;
        assert!(b.holds(false) && b.reusable(false));
        b.diagnostics = false;
        assert!(
            b.holds(true) && !b.reusable(true),
            "a part of a transaction"
        );
        b.open_statements.insert(1);
        assert!(b.holds(false) && !b.reusable(false));
        b.open_statements.clear();
        b.sticky = Some("user variables");
        assert!(b.holds(false) && !b.reusable(false));
    }
}

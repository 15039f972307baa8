//! `Backends`, and what it does alone: what needs neither the client's
//! memo nor its socket is its own; what answers the client takes
//! `&mut Client`.

use std::sync::Arc;

use hscale_planner::dictionary::TableNames;
use hscale_planner::{sql_mode_has, summarize, Kind, PhysicalId, Quoting};
use hscale_transaction::Transaction;
use hscale_wire::command;
use hscale_wire::StatusFlags;
use smallvec::SmallVec;

use super::client::Client;
use super::messages;
use super::slots;
use super::slots::{Binding, Needs, Previous, Slot};
use super::state::SessionState;
use crate::backend::ConnKey;
use crate::error::ProxyError;
use crate::shared::{SessionHandle, Shared};

/// The session's side on the backends: its connections, the state it
/// replays on them, what the last command left on them, and the
/// transaction over them.
pub(super) struct Backends {
    pub(super) shared: Arc<Shared>,
    /// What other sessions and the deadlock detector see of this one.
    pub(super) handle: Arc<SessionHandle>,
    pub(super) state: SessionState,
    /// One per backend, in the order of `Shared::pools`.
    pub(super) slots: Vec<Slot>,
    /// The connection that ran the session's last command, as it was after it.
    pub(super) previous: Previous,
    /// The messages of the last statement that ran on several connections,
    /// read from each (`None`: not known).
    pub(super) gathered: Option<messages::Gathered>,
    /// The partitions' tables the open transaction ran on: a move's fence
    /// lets its statements there through (`Context::passed_fences`).
    pub(super) transaction_tables: SmallVec<[PhysicalId; 4]>,
    /// Those the running command's statement was routed to.
    pub(super) statement_tables: SmallVec<[PhysicalId; 4]>,
    /// A statement may have changed wait_timeout or sql_mode: hscale asks
    /// the server for their values before the next command.
    pub(super) session_variables_changed: bool,
    /// Session state that statements changed on a connection in ways only
    /// the server can tell, read back before the next command that does
    /// not read the statement before.
    pub(super) unread: Vec<slots::Unread>,
    pub(super) settings_listed: Option<slots::SettingsListed>,
    /// The transaction in progress, over the backends it reached.
    pub(super) tx: Transaction<crate::xa::Running>,
    /// How the server reads a backslash in this session's strings, as the
    /// status of its last answer said (sql_mode NO_BACKSLASH_ESCAPES); and
    /// whether `"` quotes identifiers (ANSI_QUOTES, read back).
    pub(super) quoting: Quoting,
    /// sql_mode NO_AUTO_VALUE_ON_ZERO: a 0 given for an AUTO_INCREMENT
    /// column is kept, not replaced by an id.
    pub(super) no_auto_value_on_zero: bool,
    /// Where the user's reads go.
    pub(super) reads: crate::shared::ReplicaReads,
}

impl Backends {
    /// What a session does before it waits for its client's next command:
    /// tells the deadlock detector which connections it holds, reads the
    /// session's variables back where a statement changed them (before the
    /// wait, so that a new wait_timeout bounds it; not while the client may
    /// still ask for the statement's warnings, which the read would clear),
    /// and ends the statement's hold on the tables it ran on.
    pub(super) async fn between_commands(&mut self) {
        if !self.tx.reached_any() {
            // Its transaction ended before the detector's kill came.
            self.handle.take_deadlocked();
        }
        self.handle.set_holding(
            self.slots
                .iter()
                .filter_map(|s| s.held.as_ref().map(|c| (c.backend, c.thread_id))),
        );
        let warnings = self.slots.iter().any(|s| s.binding.diagnostics);
        if self.session_variables_changed && !warnings {
            self.session_variables_changed = false;
            self.read_session_variables().await;
        }
        let in_transaction = self.tx.reached_any();
        self.handle.on.ended(
            in_transaction,
            &self.statement_tables,
            &mut self.transaction_tables,
        );
        self.statement_tables.clear();
    }
}

impl Backends {
    /// A new session's side on the backends: a slot per backend, in the
    /// pool bucket of connections made with `key`, nothing held yet.
    pub(super) fn new(shared: Arc<Shared>, handle: Arc<SessionHandle>, key: ConnKey) -> Backends {
        let backend_ids = shared.pools.iter().map(|pool| pool.id()).collect();
        let tx = Transaction::new(shared.transactions, backend_ids, shared.main);
        let slots = shared
            .pools
            .iter()
            .map(|pool| Slot {
                bucket: pool.bucket(key),
                held: None,
                binding: Binding::default(),
                returned: None,
                wrote: false,
            })
            .collect();
        Backends {
            shared,
            handle,
            state: SessionState::default(),
            slots,
            previous: Previous::Nothing,
            gathered: None,
            transaction_tables: SmallVec::new(),
            statement_tables: SmallVec::new(),
            session_variables_changed: false,
            unread: Vec::new(),
            settings_listed: None,
            tx,
            quoting: Quoting::default(),
            no_auto_value_on_zero: false,
            reads: Default::default(),
        }
    }
}

impl Backends {
    /// After a SET of wait_timeout or sql_mode: their values as the server
    /// reads them (an expression, a clamp to the allowed range, ANSI's
    /// modes spelt out).
    pub(super) async fn read_session_variables(&mut self) {
        let main = self.shared.main;
        let Ok(mut lease) = self.checkout(main, Needs::default()).await else {
            return;
        };
        let sql = "SELECT @@session.wait_timeout, @@session.sql_mode";
        if let Ok(Ok(rows)) = lease.conn.query(sql).await {
            let text = |i: usize| {
                let value = rows.first()?.get(i)?.as_ref()?;
                std::str::from_utf8(value).ok()
            };
            if let Some(seconds) = text(0).and_then(|v| v.parse().ok()) {
                self.handle.set_wait_timeout(seconds);
            }
            if let Some(sql_mode) = text(1) {
                self.follow_sql_mode(sql_mode);
            }
        }
        self.checkin(main, lease.conn);
    }

    pub(super) async fn send_ok(&mut self, client: &mut Client) -> Result<(), ProxyError> {
        let status = self.status_flags();
        Ok(client.send_ok(status).await?)
    }
}

impl Backends {
    /// The session's database, and the pool bucket that goes with having one.
    pub(super) fn set_database(&mut self, client: &mut Client, db: Option<String>) {
        if self.state.db.is_some() != db.is_some() {
            self.set_buckets(client, db.is_some());
        }
        self.state.db = db;
    }

    pub(super) fn set_buckets(&mut self, client: &mut Client, has_db: bool) {
        let account = self.shared.accounts.of_user(&client.user);
        let key = ConnKey::for_client(client.capabilities, client.collation, has_db, account);
        for (slot, pool) in self.slots.iter_mut().zip(&self.shared.pools) {
            slot.bucket = pool.bucket(key);
        }
    }
}

impl Backends {
    /// A new session's sql_mode: the main backend's global one, and the
    /// backslashes its greeting announced.
    pub(super) fn start_sql_mode(&mut self) {
        let shared = self.shared.clone();
        self.quoting.no_backslash_escapes = no_backslash_escapes(shared.new_session_status);
        self.follow_sql_mode(&shared.new_session_sql_mode);
    }

    /// The modes of `sql_mode` that change how hscale reads and plans
    /// statements. NO_BACKSLASH_ESCAPES comes with every answer's status.
    pub(super) fn follow_sql_mode(&mut self, sql_mode: &str) {
        self.quoting.ansi_quotes = sql_mode_has(sql_mode, "ANSI_QUOTES");
        self.no_auto_value_on_zero = sql_mode_has(sql_mode, "NO_AUTO_VALUE_ON_ZERO");
    }

    /// Whether the command reads what the statement before left on its
    /// connection (warnings, ROW_COUNT(), FOUND_ROWS()), which a query of
    /// hscale's own there would replace.
    /// Whether what the previous statements left unread may wait past this
    /// command: one that reads what they left (warnings, ROW_COUNT()), which
    /// the read would replace, or a CALL after a CALL, which runs on the same
    /// connection and whose changes the same later read finds.
    pub(super) fn reads_back_later(&self, payload: &[u8]) -> bool {
        let Some((&command::QUERY, sql)) = payload.split_first() else {
            return false;
        };
        let summary = summarize(sql, self.quoting, &TableNames::default());
        let only_calls_unread = !self.session_variables_changed
            && self.unread.iter().all(slots::Unread::waits_for_calls);
        summary.reads_previous_statement
            || (only_calls_unread && summary.kind == Kind::Call && !summary.multi_statement)
    }

    /// The status flags of an answer hscale writes itself.
    pub(super) fn status_flags(&self) -> u16 {
        let mut status = StatusFlags::empty();
        match self.tx.in_transaction() {
            true => status |= StatusFlags::SERVER_STATUS_IN_TRANS,
            false => status |= StatusFlags::SERVER_STATUS_AUTOCOMMIT,
        }
        if self.quoting.no_backslash_escapes {
            status |= StatusFlags::SERVER_STATUS_NO_BACKSLASH_ESCAPES;
        }
        status.bits()
    }
}

pub(super) fn no_backslash_escapes(status: StatusFlags) -> bool {
    status.contains(StatusFlags::SERVER_STATUS_NO_BACKSLASH_ESCAPES)
}

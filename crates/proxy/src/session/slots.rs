//! A session's backend connections: one slot per backend, each holding at
//! most one connection and the reasons it is held (`Binding`). Running one
//! command on a slot — checkout, state replay, relay, checkin — lives here.

use std::collections::{HashMap, HashSet};

use hscale_planner::{
    client_charset_after, Autocommit, Kind, ReadsHint, SessionChange, Summary, TxEffect,
};
use hscale_transaction::{Opening, Reach, ServerStatus};
use hscale_wire::command;
use hscale_wire::scan::{Completion, Expect};
use hscale_wire::StatusFlags;

use super::backends::no_backslash_escapes;
use super::client::Client;
use super::may_change_session_variables;
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

/// The session variables that change what a statement answers or does, in
/// MariaDB and MySQL alike: the ones a CALL, which may set any of them out
/// of hscale's sight, is checked for. (Listing every variable from
/// information_schema costs the server a millisecond, 40 times an empty
/// procedure's CALL.)
const SETTINGS: [&str; 34] = [
    "auto_increment_increment",
    "auto_increment_offset",
    "character_set_client",
    "character_set_connection",
    "character_set_results",
    "collation_connection",
    "completion_type",
    "default_storage_engine",
    "default_tmp_storage_engine",
    "default_week_format",
    "div_precision_increment",
    "explicit_defaults_for_timestamp",
    "foreign_key_checks",
    "group_concat_max_len",
    "innodb_lock_wait_timeout",
    "lc_messages",
    "lc_time_names",
    "lock_wait_timeout",
    "max_error_count",
    "max_join_size",
    "max_sort_length",
    "sql_auto_is_null",
    "sql_big_selects",
    "sql_buffer_result",
    "sql_mode",
    "sql_notes",
    "sql_quote_show_create",
    "sql_safe_updates",
    "sql_select_limit",
    "sql_warnings",
    "time_zone",
    "unique_checks",
    "updatable_views_with_limit",
    "wait_timeout",
];

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
    /// keeps whole (`Session::gathered` has them); otherwise `slot`'s
    /// connections have none.
    Scattered { messages: bool, slot: usize },
}

/// How long a read on a replica waits for the replica to apply the
/// session's own writes before the writer answers it instead.
const REPLICA_WAIT_S: f64 = 0.05;

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
    /// Reads back what `read_back_later` noted and records it as the
    /// session's, so that every other connection takes it.
    pub(super) async fn read_back(&mut self, client: &mut Client) {
        for Unread {
            slot,
            mut keys,
            database,
            since,
        } in std::mem::take(&mut self.unread)
        {
            // Gone with its connection, which the server ended (or the client reset).
            let Some(mut conn) = self.slots[slot].held.take() else {
                continue;
            };
            let mut values: Vec<(String, Value)> = Vec::new();
            let mut listed = None;
            if let Some(before) = since {
                match session_variables(&mut conn).await {
                    Some(mut now) => {
                        listed = Some(now.clone());
                        for key in changed_settings(&before, &now) {
                            keys.retain(|k| *k != key);
                            let value = now.remove(&key).flatten();
                            values.push((key, value));
                        }
                    }
                    None => tracing::warn!(
                        connection_id = client.connection_id,
                        "could not read session variables; what a CALL set stays on backend {}",
                        conn.backend
                    ),
                }
            }
            if !keys.is_empty() || database {
                match read_values(&mut conn, &keys, database).await {
                    Some((db, read)) => {
                        if let Some(db) = db {
                            conn.key.has_db = db.is_some();
                            conn.db = db.clone();
                            self.set_database(client, db);
                        }
                        values.extend(read);
                    }
                    None => tracing::warn!(
                        connection_id = client.connection_id,
                        "could not read back session state; it stays on backend {}",
                        conn.backend
                    ),
                }
            }
            if !values.is_empty() {
                values.sort_by(|a, b| a.0.cmp(&b.0));
                let keys = values.iter().map(|(key, _)| key.clone()).collect();
                let setting = setting_of(&values);
                self.record(client, SessionChange::Setting(keys, setting), &mut conn);
            }
            if let Some(variables) = listed {
                self.settings_listed = Some(SettingsListed {
                    slot,
                    fingerprint: self.state.fingerprint(),
                    variables,
                });
            }
            self.slots[slot].held = Some(conn);
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

    /// Records what a successful statement changed, on the session and on the
    /// connection that ran it.
    fn record(&mut self, client: &mut Client, change: SessionChange, conn: &mut BackendConn) {
        match change {
            SessionChange::Nothing => {}
            SessionChange::Database(db) => {
                conn.key.has_db = true;
                conn.db = Some(db.clone());
                self.set_database(client, Some(db));
            }
            SessionChange::DroppedDatabase(db) => {
                if conn.db.as_deref() == Some(db.as_str()) {
                    conn.key.has_db = false;
                    conn.db = None;
                }
                if self.state.db.as_deref() == Some(db.as_str()) {
                    self.set_database(client, None);
                }
            }
            SessionChange::ReadBack { .. } => unreachable!("read back later"),
            SessionChange::Setting(keys, sql) => {
                self.session_variables_changed |= may_change_session_variables(sql.as_bytes());
                if keys
                    .iter()
                    .any(|k| k == "names" || k == "character_set_client")
                {
                    client.charset =
                        client_charset_after(&sql, self.quoting).unwrap_or(client.charset);
                }
                self.state.record_setting(keys, sql);
                conn.settings = self.state.fingerprint();
            }
        }
    }
}

impl super::Backends {
    fn read_back_later(&mut self, slot: usize, keys: Vec<String>, database: bool) {
        self.note_unread(slot, keys, database, None);
    }

    /// Before the client's next command, the session variables of `slot`
    /// that differ from `before` become the session's, as a SET would.
    pub(super) fn read_back_changes_later(&mut self, slot: usize, before: Variables) {
        self.note_unread(slot, Vec::new(), false, Some(before));
    }

    fn note_unread(
        &mut self,
        slot: usize,
        keys: Vec<String>,
        database: bool,
        since: Option<Variables>,
    ) {
        // The state is read from this connection: the session keeps it.
        let binding = &mut self.slots[slot].binding;
        binding
            .sticky
            .get_or_insert("session state hscale reads back");
        match self.unread.iter_mut().find(|u| u.slot == slot) {
            Some(unread) => {
                unread.keys.extend(keys);
                unread.keys.sort();
                unread.keys.dedup();
                unread.database |= database;
                // The earliest snapshot: what changed since it all counts.
                unread.since = unread.since.take().or(since);
            }
            None => self.unread.push(Unread {
                slot,
                keys,
                database,
                since,
            }),
        }
    }
}

impl super::Backends {
    /// Reads `slot`'s session variables, to compare with what a statement
    /// that may set any of them leaves (`read_back_changes_later`). `None`
    /// where the server would not list them.
    pub(super) async fn session_variables_before(
        &mut self,
        slot: usize,
        needs: Needs,
    ) -> Result<Option<Variables>, ProxyError> {
        let earlier = self
            .unread
            .iter()
            .any(|u| u.slot == slot && u.since.is_some());
        if earlier {
            // An earlier CALL's listing, not yet compared, still stands.
            return Ok(None);
        }
        if let Some(listed) = &self.settings_listed {
            if listed.slot == slot && listed.fingerprint == self.state.fingerprint() {
                return Ok(Some(listed.variables.clone()));
            }
        }
        let mut lease = self.checkout(slot, needs).await?;
        let variables = session_variables(&mut lease.conn).await;
        self.checkin(slot, lease.conn);
        Ok(variables)
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

    /// A held connection that no longer goes to the backend's writer: a
    /// replica's, whose read is over, goes back to its pool; one to an old
    /// writer is an error, since the session's state there (a transaction,
    /// locks, variables) stays with it.
    fn let_go_of_a_replica(&mut self, slot: usize) -> Result<(), ProxyError> {
        let pool = &self.shared.pools[slot];
        let Some(conn) = self.slots[slot].held.take_if(|conn| !pool.is_current(conn)) else {
            return Ok(());
        };
        if pool.reader_of(&conn).is_some() {
            pool.release(conn);
            return Ok(());
        }
        self.forget_connection_state(slot);
        Err(crate::backend::BackendError::WriterChanged {
            backend: conn.backend,
        }
        .into())
    }

    /// A connection to the writer from the pool, the session's own if no
    /// one used it since.
    async fn writer_lease(&mut self, slot: usize, needs: Needs) -> Result<Lease, ProxyError> {
        self.slots[slot].wrote |= !needs.reads_only;
        let s = &self.slots[slot];
        Ok(self.shared.pools[slot]
            .acquire(&s.bucket, s.returned)
            .await?)
    }

    fn may_read_a_replica(&self, needs: Needs, opening: &Opening) -> bool {
        let wanted = match needs.reads_hint {
            Some(ReadsHint::Replica) => true,
            Some(ReadsHint::Primary) => false,
            None => self.reads.by_default,
        };
        wanted && needs.replica_ok && *opening == Opening::Nothing
    }

    /// A connection to a replica for a read that may go there, one that
    /// applied what the session wrote through the writer; `None`: the
    /// writer answers.
    async fn replica_for(&mut self, slot: usize, needs: Needs, opening: &Opening) -> Option<Lease> {
        let max_lag = self.reads.max_lag;
        if !self.may_read_a_replica(needs, opening) {
            return None;
        }
        let pool = self.shared.pools[slot].clone();
        let wanted = match self.slots[slot].wrote {
            true => Some(self.writer_position(slot).await?),
            false => None,
        };
        let (reader, applied) = pool.reader(max_lag, wanted.as_deref())?;
        let key = self.slots[slot].bucket.key;
        let mut lease = reader.acquire(&reader.bucket(key), None).await.ok()?;
        if let Some(wanted) = wanted.filter(|_| !applied) {
            // A short wait: the writer answers sooner than a replica far behind.
            let wait = format!("SELECT MASTER_GTID_WAIT('{wanted}', {REPLICA_WAIT_S})");
            let reached = matches!(lease.conn.query(&wait).await, Ok(Ok(rows))
                if rows.first().and_then(|r| r.first()).cloned().flatten().as_deref() == Some(b"0"));
            if !reached {
                reader.release(lease.conn);
                return None;
            }
        }
        self.slots[slot].wrote = false;
        Some(lease)
    }

    /// The writer's GTID position now: what a replica must have applied to
    /// show this session its own writes.
    async fn writer_position(&mut self, slot: usize) -> Option<String> {
        let pool = &self.shared.pools[slot];
        let s = &self.slots[slot];
        let mut lease = pool.acquire(&s.bucket, s.returned).await.ok()?;
        let position = match lease.conn.query("SELECT @@global.gtid_binlog_pos").await {
            Ok(Ok(rows)) => rows.first()?.first()?.clone(),
            _ => None,
        };
        pool.release_to(&s.bucket, lease.conn);
        position.map(|p| String::from_utf8_lossy(&p).into_owned())
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

/// The values `keys` and, with `database`, DATABASE() have on `conn`:
/// `None` where the server would not say. Keys are read one at a time
/// where reading them together fails (a SET that named an unknown
/// variable failed, but the statements before it ran).
async fn read_values(
    conn: &mut BackendConn,
    keys: &[String],
    database: bool,
) -> Option<(Option<Option<String>>, Vec<(String, Value)>)> {
    let plain =
        |k: &String| !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    let keys: Vec<&String> = keys.iter().filter(|k| plain(k)).collect();
    let mut columns: Vec<String> = keys.iter().map(|k| format!("@@session.{k}")).collect();
    if database {
        columns.push("DATABASE()".into());
    }
    let row = match conn.query(&format!("SELECT {}", columns.join(", "))).await {
        Ok(Ok(rows)) => rows.into_iter().next()?,
        Ok(Err(_)) => {
            let mut row = Vec::with_capacity(columns.len());
            for column in &columns {
                let one = conn.query(&format!("SELECT {column}")).await.ok()?;
                row.push(
                    one.ok()
                        .and_then(|rows| rows.into_iter().next()?.into_iter().next()?),
                );
            }
            row
        }
        Err(_) => return None,
    };
    let mut values = row.into_iter();
    let settings = keys
        .iter()
        .zip(values.by_ref())
        .map(|(key, value)| (key.to_string(), value))
        .collect();
    let db = database.then(|| {
        values
            .next()
            .flatten()
            .map(|v| String::from_utf8_lossy(&v).into_owned())
    });
    Some((db, settings))
}

type Value = Option<Vec<u8>>;

async fn session_variables(conn: &mut BackendConn) -> Option<Variables> {
    let keys = SETTINGS.map(String::from);
    let (_, values) = read_values(conn, &keys, false).await?;
    Some(values.into_iter().collect())
}

/// The settings whose values differ between two listings of one connection.
fn changed_settings(before: &Variables, now: &Variables) -> Vec<String> {
    now.iter()
        .filter(|(name, value)| before.get(*name) != Some(value))
        .map(|(name, _)| name.clone())
        .collect()
}

/// `SET @@session.k = v, ...`: what reproduces the values read on another
/// connection. Words stay words and numbers numbers, so that hscale reads
/// a character set back as it reads `SET NAMES`; anything else is written
/// in hex, which reads the same under every sql_mode and character set.
fn setting_of(values: &[(String, Value)]) -> String {
    let items = values.iter().map(|(key, value)| {
        let value = match value {
            None => "NULL".to_string(),
            Some(v)
                if !v.is_empty()
                    && v.iter()
                        .all(|b| b.is_ascii_digit() || *b == b'-' || *b == b'.') =>
            {
                String::from_utf8_lossy(v).into_owned()
            }
            Some(v)
                if v.iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b',')) =>
            {
                format!("'{}'", String::from_utf8_lossy(v))
            }
            Some(v) => format!(
                "X'{}'",
                v.iter().map(|b| format!("{b:02x}")).collect::<String>()
            ),
        };
        format!("@@session.{key} = {value}")
    });
    format!("SET {}", items.collect::<Vec<_>>().join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_that_changed_are_those_whose_values_differ() {
        let listing = |pairs: &[(&str, &str)]| -> Variables {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), Some(v.as_bytes().to_vec())))
                .collect()
        };
        let before = listing(&[("time_zone", "SYSTEM"), ("sql_mode", "ANSI_QUOTES")]);
        let mut now = listing(&[("time_zone", "+05:00"), ("sql_mode", "ANSI_QUOTES")]);
        assert_eq!(changed_settings(&before, &now), ["time_zone"]);
        now.insert("sql_mode".into(), None);
        let mut changed = changed_settings(&before, &now);
        changed.sort();
        assert_eq!(changed, ["sql_mode", "time_zone"]);
        assert!(changed_settings(&now, &now).is_empty());
    }

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

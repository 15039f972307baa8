//! One client connection: login, then a loop that reads a command, picks a
//! backend connection for it, executes it, and keeps or returns the connection.
//! Multiplexing rules (when a client keeps its backend connection) are in
//! `Binding`; docs/multiplexing.md explains them to users.

mod handshake;
mod kill;
mod state;

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use hscale_planner::{
    parse_kill, parse_set, replace_connection_id, summarize, target_database, Kill, KillScope,
    Kind, Quoting, SetItem,
};
use hscale_wire::packets::ChangeUser;
use hscale_wire::scan::{Completion, Expect};
use hscale_wire::stream::PacketStream;
use hscale_wire::{CapabilityFlags, StatusFlags, WireError};
use tokio::net::TcpStream;

use crate::backend::{BackendConn, Bucket, ConnKey, ConnMark, Lease};
use crate::error::{Disposition, ProxyError};
use crate::exec::{relay, RelayError};
use crate::shared::{SessionHandle, Shared};
use state::{breaks_connection, SessionState, StateChange, UNKNOWN_SETTINGS};

const MAX_CLIENT_PACKET: usize = 1 << 30;

mod command {
    pub const QUIT: u8 = 0x01;
    pub const INIT_DB: u8 = 0x02;
    pub const QUERY: u8 = 0x03;
    pub const FIELD_LIST: u8 = 0x04;
    pub const STATISTICS: u8 = 0x09;
    pub const PROCESS_KILL: u8 = 0x0c;
    pub const PING: u8 = 0x0e;
    pub const CHANGE_USER: u8 = 0x11;
    pub const STMT_PREPARE: u8 = 0x16;
    pub const STMT_EXECUTE: u8 = 0x17;
    pub const STMT_SEND_LONG_DATA: u8 = 0x18;
    pub const STMT_CLOSE: u8 = 0x19;
    pub const STMT_RESET: u8 = 0x1a;
    pub const SET_OPTION: u8 = 0x1b;
    pub const STMT_FETCH: u8 = 0x1c;
    pub const RESET_CONNECTION: u8 = 0x1f;
}

/// Why a client keeps its backend connection between statements.
#[derive(Debug, Default)]
struct Binding {
    /// State only that connection holds (temporary tables, user variables,
    /// locks, ...): kept until the client leaves or resets.
    sticky: Option<&'static str>,
    /// A transaction is open, or autocommit is off.
    transaction: bool,
    /// Server-side prepared statements, by id.
    prepared: HashSet<u32>,
    /// The last statement left warnings that SHOW WARNINGS must find.
    warnings: bool,
}

impl Binding {
    fn holds(&self) -> bool {
        self.sticky.is_some() || self.transaction || !self.prepared.is_empty() || self.warnings
    }
}

/// What a command needs of the connection it runs on, beyond the session's state.
#[derive(Debug, Clone, Copy, Default)]
struct Needs {
    /// LAST_INSERT_ID() as this session last set it.
    last_insert_id: bool,
    /// The connection that ran the session's previous command, untouched since
    /// (ROW_COUNT(), FOUND_ROWS()).
    previous_connection: bool,
}

pub struct Session {
    shared: Arc<Shared>,
    handle: Arc<SessionHandle>,
    client: PacketStream<TcpStream>,
    connection_id: u32,
    user: String,
    admin: bool,
    capabilities: CapabilityFlags,
    collation: u8,
    nonce: [u8; 20],
    state: SessionState,
    bucket: Bucket,
    held: Option<Box<BackendConn>>,
    binding: Binding,
    /// The connection that ran the session's last command, as it was after it.
    previous: Option<ConnMark>,
    /// How the server reads a backslash in this session's strings, as the
    /// status of its last answer said (sql_mode NO_BACKSLASH_ESCAPES).
    quoting: Quoting,
}

impl Session {
    /// Serves one client until it quits or its connection fails.
    pub async fn serve(shared: Arc<Shared>, socket: TcpStream) {
        let _ = socket.set_nodelay(true);
        let peer = socket.peer_addr().ok();
        let connection_id = shared.next_connection_id();
        let mut client = PacketStream::new(socket, MAX_CLIENT_PACKET);
        let login = match handshake::login(&mut client, &shared, connection_id).await {
            Ok(login) => login,
            Err((e, seq)) => {
                tracing::info!(connection_id, ?peer, "login failed: {e}");
                let _ = reply_error(&mut client, &e, seq).await;
                return;
            }
        };
        tracing::info!(connection_id, ?peer, user = %login.user, db = ?login.database, "client connected");
        let pool = shared.main_pool().clone();
        let key = ConnKey::for_client(
            login.capabilities,
            login.collation,
            login.database.is_some(),
        );
        let admin = shared.users.get(&login.user).is_some_and(|u| u.admin);
        let mut session = Session {
            handle: shared.sessions.register(connection_id, &login.user),
            admin,
            bucket: pool.bucket(key),
            shared,
            client,
            connection_id,
            user: login.user,
            capabilities: login.capabilities,
            collation: login.collation,
            nonce: login.nonce,
            state: SessionState::default(),
            held: None,
            binding: Binding::default(),
            previous: None,
            quoting: Quoting::default(),
        };
        session.quoting = session.new_session_quoting();
        let result = session.start(login.database, login.next_seq).await;
        if let Err(e) = result {
            tracing::info!(connection_id, "login failed: {e}");
            let _ = reply_error(&mut session.client, &e, login.next_seq).await;
            return;
        }
        if let Err(e) = session.command_loop().await {
            tracing::debug!(connection_id, "connection ends: {e}");
        }
        session.finish();
        tracing::info!(connection_id, "client disconnected");
    }

    /// Checks the requested database exists (as MySQL does at login) and says OK.
    async fn start(&mut self, database: Option<String>, seq: u8) -> Result<(), ProxyError> {
        if let Some(db) = database {
            self.state.db = Some(db);
            let lease = self.checkout(Needs::default()).await?;
            self.checkin(lease.conn);
        }
        self.client
            .send_packet(
                seq,
                &handshake::ok_packet(self.shared.new_session_status.bits()),
            )
            .await?;
        Ok(())
    }

    async fn command_loop(&mut self) -> Result<(), ProxyError> {
        loop {
            let packet = tokio::select! {
                packet = self.client.read_packet() => packet?,
                _ = self.handle.killed() => None,
            };
            let Some(packet) = packet else {
                return Ok(());
            };
            if packet.first_seq != 0 {
                return Err(ProxyError::Client(WireError::OutOfOrder {
                    expected: 0,
                    got: packet.first_seq,
                }));
            }
            let Some(&code) = packet.payload.first() else {
                return Err(ProxyError::Client(WireError::Malformed {
                    what: "empty command",
                }));
            };
            if code == command::QUIT {
                return Ok(());
            }
            self.shared.counters.questions.add(1);
            if let Err(e) = self.dispatch(code, packet.payload).await {
                let (_, disposition) = e.to_client();
                tracing::debug!(connection_id = self.connection_id, "command failed: {e}");
                reply_error(&mut self.client, &e, 1).await?;
                if disposition != Disposition::Reply {
                    return Err(e);
                }
            }
        }
    }

    async fn dispatch(&mut self, code: u8, payload: Bytes) -> Result<(), ProxyError> {
        match code {
            command::QUERY => self.query(payload).await,
            command::INIT_DB => {
                let db = String::from_utf8_lossy(&payload[1..]).into_owned();
                let change = StateChange::Database(db);
                self.execute(&payload, Some(Expect::Single), Needs::default(), change)
                    .await
                    .map(drop)
            }
            command::FIELD_LIST => self
                .execute(
                    &payload,
                    Some(Expect::Rows),
                    Needs::default(),
                    StateChange::Nothing,
                )
                .await
                .map(drop),
            command::PING => self.send_ok().await,
            command::STATISTICS => {
                let stats = self.shared.statistics();
                self.client.send_packet(1, stats.as_bytes()).await?;
                Ok(())
            }
            command::STMT_PREPARE => {
                let payload = self.with_own_connection_id(payload);
                self.execute(
                    &payload,
                    Some(Expect::Prepare),
                    Needs::default(),
                    StateChange::Nothing,
                )
                .await
                .map(drop)
            }
            command::STMT_EXECUTE
            | command::STMT_FETCH
            | command::STMT_RESET
            | command::STMT_SEND_LONG_DATA
            | command::STMT_CLOSE => self.statement_command(code, payload).await,
            command::SET_OPTION => {
                self.binding.sticky = Some("COM_SET_OPTION");
                self.execute(
                    &payload,
                    Some(Expect::Single),
                    Needs::default(),
                    StateChange::Nothing,
                )
                .await
                .map(drop)
            }
            command::RESET_CONNECTION => {
                self.reset();
                self.send_ok().await
            }
            command::CHANGE_USER => self.change_user(payload).await,
            command::PROCESS_KILL => {
                let id = payload
                    .get(1..5)
                    .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                let kill = Kill::Thread {
                    scope: KillScope::Connection,
                    id: u64::from(id),
                };
                self.kill(kill).await
            }
            code => Err(ProxyError::UnknownCommand { code }),
        }
    }

    async fn query(&mut self, payload: Bytes) -> Result<(), ProxyError> {
        let sql = &payload[1..];
        let summary = summarize(sql, self.quoting);
        if summary.binds_connection() {
            self.binding
                .sticky
                .get_or_insert("session state only the backend connection holds");
        }
        if summary.multi_statement_binds() {
            self.binding
                .sticky
                .get_or_insert("several statements in one query");
        }
        if summary.kind == Kind::Kill {
            // hscale answers KILL itself, so it cannot be one of several statements.
            if summary.multi_statement {
                return Err(ProxyError::NotSupported {
                    what: "KILL with other statements in one query",
                });
            }
            return self.kill(parse_kill(&String::from_utf8_lossy(sql))).await;
        }
        let change = match summary.kind {
            Kind::Set => match parse_set(&String::from_utf8_lossy(sql), self.quoting) {
                SetItem::Replayable(keys) => {
                    StateChange::Setting(keys, String::from_utf8_lossy(sql).into_owned())
                }
                SetItem::NoSessionState => StateChange::Nothing,
                SetItem::BindsConnection => {
                    self.binding
                        .sticky
                        .get_or_insert("SET that cannot be replayed");
                    StateChange::Nothing
                }
            },
            Kind::Use => target_database(sql).map_or(StateChange::Nothing, StateChange::Database),
            Kind::DropDatabase => {
                target_database(sql).map_or(StateChange::Nothing, StateChange::DroppedDatabase)
            }
            _ => StateChange::Nothing,
        };
        tracing::trace!(connection_id = self.connection_id, sql = %String::from_utf8_lossy(sql), "query");
        let needs = Needs {
            last_insert_id: summary.last_insert_id,
            previous_connection: summary.reads_previous_statement,
        };
        let payload = match summary.connection_id {
            true => self.with_own_connection_id(payload),
            false => payload,
        };
        self.execute(&payload, Some(Expect::ResultSets), needs, change)
            .await
            .map(drop)
    }

    /// The command with CONNECTION_ID() replaced by the id the client was
    /// greeted with: its backend connection has another.
    fn with_own_connection_id(&self, payload: Bytes) -> Bytes {
        match replace_connection_id(&payload[1..], self.connection_id, self.quoting) {
            Some(sql) => [&payload[..1], &sql].concat().into(),
            None => payload,
        }
    }

    async fn statement_command(&mut self, code: u8, payload: Bytes) -> Result<(), ProxyError> {
        let stmt_id = payload
            .get(1..5)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or(ProxyError::Client(WireError::Malformed {
                what: "statement command",
            }))?;
        if !self.binding.prepared.contains(&stmt_id) || self.held.is_none() {
            let command = match code {
                command::STMT_EXECUTE => "mysqld_stmt_execute",
                command::STMT_FETCH => "mysqld_stmt_fetch",
                command::STMT_RESET => "mysqld_stmt_reset",
                _ => return Ok(()),
            };
            return Err(ProxyError::UnknownStatement { stmt_id, command });
        }
        let expect = match code {
            command::STMT_EXECUTE => Some(Expect::ResultSets),
            command::STMT_FETCH => Some(Expect::Rows),
            command::STMT_RESET => Some(Expect::Single),
            _ => None,
        };
        if code == command::STMT_CLOSE {
            self.binding.prepared.remove(&stmt_id);
        }
        self.execute(&payload, expect, Needs::default(), StateChange::Nothing)
            .await
            .map(drop)
    }

    /// Runs one command on a backend connection and forwards its answer.
    async fn execute(
        &mut self,
        payload: &[u8],
        expect: Option<Expect>,
        needs: Needs,
        change: StateChange,
    ) -> Result<Completion, ProxyError> {
        let mut lease = self.checkout(needs).await?;
        let mut retried = false;
        let completion = loop {
            match relay(&mut self.client, &mut lease.conn, payload, expect).await {
                Ok(completion) => break completion,
                Err(RelayError::Backend { source, answered }) => {
                    let backend = lease.conn.backend;
                    // A reused connection that died while idle (a backend restart)
                    // fails before answering: one retry on a new connection is safe
                    // because nothing was executed on the dead one. Not when the
                    // statement reads what ran on the dead one.
                    if !answered
                        && !lease.fresh
                        && !retried
                        && !self.binding.holds()
                        && !needs.previous_connection
                    {
                        retried = true;
                        tracing::info!(backend, "idle backend connection was closed; reconnecting");
                        drop(lease);
                        lease = self.shared.main_pool().acquire_new(&self.bucket).await?;
                        self.state
                            .apply(&mut lease.conn, needs.last_insert_id)
                            .await?;
                        continue;
                    }
                    self.forget_connection_state();
                    let error = crate::backend::BackendError::Lost { backend, source };
                    return Err(if answered {
                        ProxyError::BackendMidAnswer { source: error }
                    } else {
                        ProxyError::Backend(error)
                    });
                }
                Err(RelayError::Client(e)) => return Err(ProxyError::Client(e)),
            }
        };
        // MySQL keeps warnings until a statement that uses a table: a connection
        // that had any must not show them to the next client.
        let diagnostics_left = self.binding.warnings || completion.warnings > 0;
        if !completion.error {
            self.record(change, &mut lease.conn);
        }
        self.after(&completion);
        if diagnostics_left && !self.binding.holds() {
            lease.conn.settings = UNKNOWN_SETTINGS;
        }
        self.previous = Some(lease.conn.mark());
        self.checkin(lease.conn);
        Ok(completion)
    }

    /// Updates bindings from what the server said about the session.
    fn after(&mut self, completion: &Completion) {
        if let Some(status) = completion.status {
            let status = StatusFlags::from_bits_truncate(status);
            self.binding.transaction = status.contains(StatusFlags::SERVER_STATUS_IN_TRANS)
                || !status.contains(StatusFlags::SERVER_STATUS_AUTOCOMMIT);
            self.quoting = quoting(status);
        }
        self.binding.warnings = completion.warnings > 0;
        if completion.last_insert_id != 0 {
            self.state.last_insert_id = completion.last_insert_id;
        }
        if let Some(id) = completion.statement_id.filter(|_| !completion.error) {
            self.binding.prepared.insert(id);
        }
    }

    /// The held connection, or one from the pool brought to the session's state.
    async fn checkout(&mut self, needs: Needs) -> Result<Lease, ProxyError> {
        // Nothing ran for this client yet: it must see a new connection's count.
        let like_new = needs.previous_connection && self.held.is_none() && self.previous.is_none();
        let mut lease = match self.held.take() {
            Some(conn) => Lease { conn, fresh: false },
            None => match self.previous.filter(|_| needs.previous_connection) {
                Some(mark) => self.take_previous(mark)?,
                None => self.shared.main_pool().acquire(&self.bucket).await?,
            },
        };
        self.handle
            .set_running(lease.conn.backend, lease.conn.thread_id);
        let prepared = async {
            self.state
                .apply(&mut lease.conn, needs.last_insert_id)
                .await?;
            if like_new {
                state::zero_row_count(&mut lease.conn).await?;
            }
            Ok(())
        };
        if let Err(e) = prepared.await {
            if breaks_connection(&e) {
                self.forget_connection_state();
            } else {
                self.checkin(lease.conn);
            }
            return Err(e);
        }
        Ok(lease)
    }

    /// The connection that ran the session's previous command, if no one used it
    /// since. Only this session ran anything on it, so it holds the session's
    /// settings even if it was marked unknown for other clients' sake.
    fn take_previous(&mut self, mark: ConnMark) -> Result<Lease, ProxyError> {
        let mut conn = self
            .shared
            .main_pool()
            .take_marked(&self.bucket, mark)
            .ok_or(ProxyError::PreviousStatementElsewhere)?;
        conn.settings = self.state.fingerprint();
        Ok(Lease { conn, fresh: false })
    }

    fn checkin(&mut self, conn: Box<BackendConn>) {
        if self.binding.holds() {
            self.held = Some(conn);
        } else {
            self.handle.set_idle();
            self.shared.main_pool().release_to(&self.bucket, conn);
        }
    }

    /// The connection that held the session's server-side state is gone.
    fn forget_connection_state(&mut self) {
        self.handle.set_idle();
        self.held = None;
        self.binding = Binding::default();
    }

    /// Records what a successful statement changed, on the session and on the
    /// connection that ran it.
    fn record(&mut self, change: StateChange, conn: &mut BackendConn) {
        match change {
            StateChange::Nothing => {}
            StateChange::Database(db) => {
                conn.key.has_db = true;
                conn.db = Some(db.clone());
                self.set_database(Some(db));
            }
            StateChange::DroppedDatabase(db) => {
                if conn.db.as_deref() == Some(db.as_str()) {
                    conn.key.has_db = false;
                    conn.db = None;
                }
                if self.state.db.as_deref() == Some(db.as_str()) {
                    self.set_database(None);
                }
            }
            StateChange::Setting(keys, sql) => {
                self.state.record_setting(keys, sql);
                conn.settings = self.state.fingerprint();
            }
        }
    }

    /// The session's database, and the pool bucket that goes with having one.
    fn set_database(&mut self, db: Option<String>) {
        if self.state.db.is_some() != db.is_some() {
            let key = ConnKey::for_client(self.capabilities, self.collation, db.is_some());
            self.bucket = self.shared.main_pool().bucket(key);
        }
        self.state.db = db;
    }

    /// COM_RESET_CONNECTION: server-side state goes with the connection that held it.
    fn reset(&mut self) {
        self.held = None;
        self.previous = None;
        self.binding = Binding::default();
        self.state.clear_settings();
        self.state.last_insert_id = 0;
        self.quoting = self.new_session_quoting();
    }

    fn new_session_quoting(&self) -> Quoting {
        quoting(self.shared.new_session_status)
    }

    async fn change_user(&mut self, payload: Bytes) -> Result<(), ProxyError> {
        let request = ChangeUser::parse(&payload)?;
        let attempt = handshake::Attempt {
            user: &request.user,
            plugin: request.auth_plugin.as_deref(),
            answer: request.auth_response.clone(),
            seq: 1,
        };
        let shared = self.shared.clone();
        let seq =
            match handshake::authenticate(&mut self.client, &shared, &self.nonce, attempt).await {
                Ok(seq) => seq,
                Err((error, seq)) => {
                    // Denied, like MySQL: the error (with the sequence id the exchange
                    // reached), then the connection closes.
                    reply_error(&mut self.client, &error, seq).await?;
                    return Err(ProxyError::Client(WireError::Closed));
                }
            };
        self.reset();
        self.user = request.user;
        self.admin = shared.users.get(&self.user).is_some_and(|u| u.admin);
        self.handle.set_user(&self.user);
        if let Some(collation) = request.collation {
            self.collation = collation as u8;
        }
        self.state.db = None;
        self.bucket = self.shared.main_pool().bucket(ConnKey::for_client(
            self.capabilities,
            self.collation,
            false,
        ));
        if let Some(db) = request.database {
            self.set_database(Some(db));
            let lease = self.checkout(Needs::default()).await?;
            self.checkin(lease.conn);
        }
        tracing::info!(connection_id = self.connection_id, user = %self.user, "changed user");
        self.client
            .send_packet(
                seq,
                &handshake::ok_packet(self.shared.new_session_status.bits()),
            )
            .await?;
        Ok(())
    }

    async fn send_ok(&mut self) -> Result<(), ProxyError> {
        let mut status = StatusFlags::empty();
        if !self.binding.transaction {
            status |= StatusFlags::SERVER_STATUS_AUTOCOMMIT;
        }
        if self.quoting == Quoting::NoBackslashEscapes {
            status |= StatusFlags::SERVER_STATUS_NO_BACKSLASH_ESCAPES;
        }
        self.client
            .send_packet(1, &handshake::ok_packet(status.bits()))
            .await?;
        Ok(())
    }

    /// Connections that hold state of this client are closed, not pooled.
    fn finish(&mut self) {
        self.shared.sessions.remove(self.connection_id);
        if let Some(mut conn) = self.held.take() {
            if self.binding.sticky.is_none()
                && !self.binding.transaction
                && self.binding.prepared.is_empty()
            {
                if self.binding.warnings {
                    conn.settings = UNKNOWN_SETTINGS;
                }
                self.shared.main_pool().release_to(&self.bucket, conn);
            }
        }
    }
}

async fn reply_error(
    client: &mut PacketStream<TcpStream>,
    error: &ProxyError,
    seq: u8,
) -> Result<(), WireError> {
    let (packet, _) = error.to_client();
    if let Some(packet) = packet {
        let mut payload = Vec::with_capacity(packet.message.len() + 9);
        packet.write(&mut payload);
        client.send_packet(seq, &payload).await?;
    }
    Ok(())
}

fn quoting(status: StatusFlags) -> Quoting {
    if status.contains(StatusFlags::SERVER_STATUS_NO_BACKSLASH_ESCAPES) {
        Quoting::NoBackslashEscapes
    } else {
        Quoting::BackslashEscapes
    }
}

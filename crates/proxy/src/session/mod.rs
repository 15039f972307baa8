//! One client connection: login, then a loop that reads a command, plans it,
//! executes it on the backends it needs, and keeps or returns the connections.
//! Multiplexing rules (when a client keeps a backend connection) are in
//! `slots::Binding`; docs/multiplexing.md explains them to users.

mod atomic;
mod backends;
mod client;
mod handshake;
mod messages;
mod probed;
mod run;
mod savepoint;
mod scatter;
mod slots;
mod state;
#[cfg(test)]
mod tests;

pub(crate) use run::kill::kill_backend_thread;

use std::sync::Arc;

use bytes::Bytes;
use hscale_planner::{
    replace_own_values, ClientCharset, Kill, KillScope, OwnValues, PlanCache, Refusal,
    SessionChange,
};
use hscale_wire::command;
use hscale_wire::packets::ChangeUser;
use hscale_wire::scan::Expect;
use hscale_wire::stream::PacketStream;
use hscale_wire::{CapabilityFlags, WireError};
use tokio::net::TcpStream;

use crate::backend::ConnKey;
use crate::error::{Disposition, ProxyError};
use crate::shared::Shared;
use crate::tls::ClientStream;
use backends::Backends;
use client::{reply_error, Client};
use run::prepared::ClientStatements;
use slots::{Binding, Needs, Previous};

/// The largest packet a client may send before it logged in: a login answer
/// with its connection attributes is well under this, and a stranger must
/// not make hscale hold more.
pub(crate) const MAX_LOGIN_PACKET: usize = 8 << 10;

pub struct Session {
    shared: Arc<Shared>,
    client: Client,
    memo: Memo,
    backends: Backends,
}

/// What a session keeps to answer its client's next statements faster, or
/// as they were answered before.
#[derive(Default)]
struct Memo {
    /// Shapes of this client's statements on partitioned tables.
    plans: PlanCache,
    /// The client's prepared statements.
    statements: ClientStatements,
    /// Statements the client prepared with PREPARE ... FROM text that
    /// hscale routes or guards.
    sql_statements: run::dynamic::SqlStatements,
    /// What probes found for unions of partitions, per statement shape.
    probed_columns: probed::ProbedColumns,
    /// Definitions of tables copied for statements answered from copies.
    definitions: run::federate::Definitions,
}

/// How a session's time on a worker ended.
pub enum Served {
    /// The client quit or its connection failed.
    Ended,
    /// Between statements, to the worker named: its socket detached
    /// (`ClientSocket::Moving`), nothing of its own in flight.
    Moving(Box<Session>, usize),
}

/// Why the command loop returned without an error.
enum Leave {
    Quit,
    MoveTo(usize),
}

impl Session {
    /// Serves one client until it quits or its connection fails.
    pub async fn serve(shared: Arc<Shared>, socket: TcpStream) -> Served {
        let _ = socket.set_nodelay(true);
        let peer = socket.peer_addr().ok();
        let Ok(reached) = socket.local_addr() else {
            return Served::Ended;
        };
        let connection_id = shared.next_connection_id();
        let client = PacketStream::new(ClientStream::new(socket), MAX_LOGIN_PACKET);
        let login = handshake::login(client, &shared, connection_id);
        let (mut client, login) = match tokio::time::timeout(shared.login_timeout, login).await {
            Ok((Some(client), Ok(login))) => (client, login),
            Ok((client, Err((e, seq)))) => {
                tracing::info!(connection_id, ?peer, "login failed: {e}");
                if let Some(mut client) = client {
                    let _ = reply_error(&mut client, &e, seq).await;
                }
                return Served::Ended;
            }
            Ok((None, Ok(_))) => unreachable!("a login keeps its stream"),
            Err(_) => {
                tracing::info!(
                    connection_id,
                    ?peer,
                    "closed: no login within login_timeout_ms"
                );
                return Served::Ended;
            }
        };
        client.set_max_packet(shared.max_allowed_packet);
        tracing::info!(connection_id, ?peer, user = %login.user, db = ?login.database, "client connected");
        let key = ConnKey::for_client(
            login.capabilities,
            login.collation,
            login.database.is_some(),
            shared.accounts.of_user(&login.user),
        );
        let user = shared.users.get(&login.user);
        let admin = user.is_some_and(|u| u.admin);
        let reads = user.map(|u| u.reads).unwrap_or_default();
        let handle = shared.sessions.register(connection_id, &login.user);
        let mut session = Box::new(Session {
            shared: Arc::clone(&shared),
            client: Client {
                stream: client,
                connection_id,
                reached,
                user: login.user,
                admin,
                capabilities: login.capabilities,
                collation: login.collation,
                nonce: login.nonce,
                charset: ClientCharset::of_collation(login.collation),
                reply_seq: 1,
                stays: false,
                column_names: Default::default(),
            },
            memo: Memo::default(),
            backends: Backends::new(shared, handle, key),
        });
        session.backends.reads = reads;
        session.backends.start_sql_mode();
        session.set_default_wait_timeout();
        let result = session.start(login.database, login.next_seq).await;
        if let Err(e) = result {
            tracing::info!(connection_id, "login failed: {e}");
            let _ = session.client.reply_error(&e, login.next_seq).await;
            session.finish();
            return Served::Ended;
        }
        Session::run(session).await
    }

    /// Goes on serving a client that moved here from another worker.
    pub async fn resume(mut session: Box<Session>) -> Served {
        if let Err(e) = session.client.stream.get_mut().attach() {
            tracing::warn!(
                connection_id = session.client.connection_id,
                "a moved client cannot be served here: {e}"
            );
            session.finish();
            return Served::Ended;
        }
        Session::run(session).await
    }

    /// Serves commands until the client leaves, or moves to another worker.
    async fn run(mut session: Box<Session>) -> Served {
        let connection_id = session.client.connection_id;
        loop {
            match session.command_loop().await {
                Ok(Leave::MoveTo(worker)) => match session.client.stream.get_mut().detach() {
                    Ok(()) => {
                        tracing::debug!(connection_id, worker, "client moves to another worker");
                        return Served::Moving(session, worker);
                    }
                    Err(e) => {
                        tracing::warn!(connection_id, "a client cannot leave its worker: {e}");
                        session.client.stays = true;
                    }
                },
                Ok(Leave::Quit) => break,
                Err(e) => {
                    tracing::debug!(connection_id, "connection ends: {e}");
                    break;
                }
            }
        }
        session.finish();
        let handle = session.backends.handle.clone();
        // Closes the client's socket: a KILL waiting for it may answer.
        drop(session);
        handle.set_ended();
        tracing::info!(connection_id, "client disconnected");
        Served::Ended
    }

    /// Whether the session may leave this worker now: between statements,
    /// with nothing registered with this worker's reactor but the client's
    /// socket (no connection held, no transaction, no state still to read
    /// from a connection) and its answer sent whole.
    fn may_move(&self) -> bool {
        !self.client.stays
            && self.client.is_flushed()
            && !self.backends.tx.in_transaction()
            && !self.backends.tx.reached_any()
            && !self.backends.tx.unsettled()
            && self.backends.unread.is_empty()
            && !self.backends.session_variables_changed
            && self.backends.slots.iter().all(|slot| slot.held.is_none())
            && !matches!(
                self.backends.previous,
                Previous::On { messages: true, .. } | Previous::Scattered { messages: true, .. }
            )
    }

    /// Checks the requested database exists (as MySQL does at login) and says OK.
    async fn start(&mut self, database: Option<String>, seq: u8) -> Result<(), ProxyError> {
        if let Some(db) = database {
            self.may_use_database(&db)?;
            self.backends.state.db = Some(db);
            let main = self.shared.main;
            let lease = self.backends.checkout(main, Needs::default()).await?;
            self.backends.checkin(main, lease.conn);
        }
        self.client
            .send_packet(
                seq,
                &handshake::ok_packet(self.shared.new_session_status.bits()),
            )
            .await?;
        Ok(())
    }

    async fn command_loop(&mut self) -> Result<Leave, ProxyError> {
        // A session that just arrived serves a command before it may leave
        // again: two workers asking at once must not pass it back and forth.
        let mut served_here = false;
        loop {
            if self.backends.tx.unsettled() {
                run::transaction::settle_transaction(
                    &self.shared,
                    &mut self.client,
                    &mut self.backends,
                )
                .await;
            }
            self.backends.between_commands().await;
            if served_here && self.shared.balance.asked() && self.may_move() {
                if let Some(worker) = self.shared.balance.claim() {
                    return Ok(Leave::MoveTo(worker));
                }
            }
            self.backends
                .handle
                .set_waiting(self.shared.idle_clock_ms());
            let payload = tokio::select! {
                payload = self.client.next_command() => payload?,
                _ = self.backends.handle.killed() => None,
            };
            self.backends.handle.set_busy();
            let Some(payload) = payload else {
                return Ok(Leave::Quit);
            };
            let code = payload[0];
            if code == command::QUIT {
                return Ok(Leave::Quit);
            }
            let behind =
                self.backends.session_variables_changed || !self.backends.unread.is_empty();
            if behind && !self.backends.reads_back_later(&payload) {
                self.backends.read_back(&mut self.client).await;
                if self.backends.session_variables_changed {
                    self.backends.session_variables_changed = false;
                    self.backends.read_session_variables().await;
                }
            }
            self.shared.counters.questions.add(1);
            self.client.reply_seq = 1;
            served_here = true;
            if let Err(e) = self.dispatch(code, payload).await {
                // The detector killed the connection the statement waited on.
                let e = match e {
                    ProxyError::Backend(_) if self.backends.handle.take_deadlocked() => {
                        ProxyError::Deadlock
                    }
                    e => e,
                };
                if self.backends.handle.was_killed() && !matches!(e, ProxyError::ConnectionKilled) {
                    // Killed by another connection while the command ran.
                    return Err(e);
                }
                let (_, disposition) = e.to_client();
                tracing::debug!(
                    connection_id = self.client.connection_id,
                    "command failed: {e}"
                );
                let seq = self.client.reply_seq;
                self.client.reply_error(&e, seq).await?;
                if disposition != Disposition::Reply {
                    return Err(e);
                }
            }
        }
    }

    async fn dispatch(&mut self, code: u8, payload: Bytes) -> Result<(), ProxyError> {
        let main = self.shared.main;
        let forward = |expect| (Some(expect), Needs::default(), SessionChange::Nothing);
        let (expect, needs, change) = match code {
            command::QUERY => {
                return run::query(
                    &self.shared,
                    &mut self.client,
                    &mut self.memo,
                    &mut self.backends,
                    payload,
                )
                .await
            }
            command::INIT_DB => {
                // The name is replayed on every connection the session takes.
                let db = match std::str::from_utf8(&payload[1..]) {
                    Ok(db) if self.client.charset.reads(db.as_bytes()) => db.to_string(),
                    _ => return Err(ProxyError::Unroutable(Refusal::unreadable())),
                };
                self.may_use_database(&db)?;
                (
                    Some(Expect::Single),
                    Needs::default(),
                    SessionChange::Database(db),
                )
            }
            command::FIELD_LIST => {
                return run::listing::field_list(
                    &self.shared,
                    &mut self.client,
                    &mut self.backends,
                    payload,
                )
                .await
            }
            command::PING => return self.backends.send_ok(&mut self.client).await,
            command::STATISTICS => {
                let stats = self.shared.statistics();
                self.client.send_packet(1, stats.as_bytes()).await?;
                return Ok(());
            }
            command::STMT_PREPARE => {
                return run::prepared::prepare(
                    &self.shared,
                    &mut self.client,
                    &mut self.memo,
                    &mut self.backends,
                    payload,
                )
                .await
            }
            command::STMT_EXECUTE
            | command::STMT_FETCH
            | command::STMT_RESET
            | command::STMT_SEND_LONG_DATA
            | command::STMT_CLOSE => {
                return run::prepared::statement_command(
                    &self.shared,
                    &mut self.client,
                    &mut self.memo,
                    &mut self.backends,
                    code,
                    payload,
                )
                .await
            }
            command::SET_OPTION => {
                self.backends.slots[main].binding.sticky = Some("COM_SET_OPTION");
                forward(Expect::Single)
            }
            command::RESET_CONNECTION => {
                self.reset();
                return self.backends.send_ok(&mut self.client).await;
            }
            command::CHANGE_USER => return self.change_user(payload).await,
            command::PROCESS_KILL => {
                let id = payload
                    .get(1..5)
                    .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                let kill = Kill::Thread {
                    scope: KillScope::Connection,
                    id: u64::from(id),
                };
                return run::kill::run(&self.shared, &mut self.client, &self.backends, kill).await;
            }
            code => return Err(ProxyError::UnknownCommand { code }),
        };
        self.backends
            .execute(&mut self.client, main, &payload, expect, needs, change)
            .await
            .map(drop)
    }

    /// COM_RESET_CONNECTION: server-side state goes with the connection that held it.
    fn reset(&mut self) {
        for slot in &mut self.backends.slots {
            slot.held = None;
            slot.binding = Binding::default();
        }
        self.backends.previous = Previous::Nothing;
        // Their connections went: the servers ended the transaction.
        self.backends.tx.reset();
        self.backends.unread.clear();
        self.backends.settings_listed = None;
        self.memo.statements.clear();
        self.memo.sql_statements.clear();
        self.backends.state.clear_settings();
        self.backends.state.last_insert_id = 0;
        self.backends.start_sql_mode();
        self.client.charset = ClientCharset::of_collation(self.client.collation);
        self.set_default_wait_timeout();
    }

    /// A new session's wait_timeout: the server's interactive_timeout for
    /// clients that say they are interactive, as MariaDB does.
    fn set_default_wait_timeout(&mut self) {
        let (wait, interactive) = self.shared.wait_timeouts;
        let interactive_client = self
            .client
            .capabilities
            .contains(CapabilityFlags::CLIENT_INTERACTIVE);
        self.backends
            .handle
            .set_wait_timeout(if interactive_client {
                interactive
            } else {
                wait
            });
    }

    /// hscale's schema is the admins' alone: in it, its tables would be
    /// named without the schema's name, which statements are checked for.
    fn may_use_database(&self, db: &str) -> Result<(), ProxyError> {
        match self.client.admin || !db.eq_ignore_ascii_case(&self.shared.dictionary.schema) {
            true => Ok(()),
            false => Err(ProxyError::Guarded {
                user: self.client.user.clone(),
            }),
        }
    }

    async fn change_user(&mut self, payload: Bytes) -> Result<(), ProxyError> {
        let request = ChangeUser::parse(&payload)?;
        let attempt = handshake::Attempt {
            user: &request.user,
            plugin: request.auth_plugin.as_deref(),
            answer: request.auth_response.clone(),
            seq: 1,
            secure: self.client.stream.get_ref().is_tls(),
        };
        let shared = self.shared.clone();
        let seq = match handshake::authenticate(
            &mut self.client.stream,
            &shared,
            &self.client.nonce,
            attempt,
        )
        .await
        {
            Ok(seq) => seq,
            Err((error, seq)) => {
                // Denied, like MySQL: the error (with the sequence id the exchange
                // reached), then the connection closes.
                self.client.reply_error(&error, seq).await?;
                return Err(ProxyError::Client(WireError::Closed));
            }
        };
        self.reset();
        self.client.user = request.user;
        let user = shared.users.get(&self.client.user);
        self.client.admin = user.is_some_and(|u| u.admin);
        self.backends.reads = user.map(|u| u.reads).unwrap_or_default();
        self.backends.handle.set_user(&self.client.user);
        if let Some(collation) = request.collation {
            self.client.collation = collation as u8;
            self.client.charset = ClientCharset::of_collation(self.client.collation);
        }
        self.backends.state.db = None;
        self.backends.set_buckets(&mut self.client, false);
        if let Some(db) = request.database {
            self.may_use_database(&db)?;
            self.backends.set_database(&mut self.client, Some(db));
            let main = self.shared.main;
            let lease = self.backends.checkout(main, Needs::default()).await?;
            self.backends.checkin(main, lease.conn);
        }
        tracing::info!(connection_id = self.client.connection_id, user = %self.client.user, "changed user");
        self.client
            .send_packet(
                seq,
                &handshake::ok_packet(self.shared.new_session_status.bits()),
            )
            .await?;
        Ok(())
    }

    /// Connections that hold state of this client are closed, not pooled.
    fn finish(&mut self) {
        self.shared.sessions.remove(self.client.connection_id);
        self.backends.release_all();
    }
}

/// Whether a SET (or several statements) may change a session variable
/// hscale follows: wait_timeout (its idle limit) or sql_mode (ANSI_QUOTES).
/// Read back rather than parsed: `SET sql_mode = @saved` and expressions
/// say nothing until the server evaluates them.
fn may_change_session_variables(sql: &[u8]) -> bool {
    let mentions = |word: &[u8]| {
        sql.windows(word.len())
            .any(|w| w.eq_ignore_ascii_case(word))
    };
    mentions(b"wait_timeout") || mentions(b"sql_mode")
}

/// The command with CONNECTION_ID() and the variables naming the server
/// replaced by what the client's connection to hscale answers: its backend
/// connection has another id, on another server.
fn with_own_values(
    shared: &Arc<Shared>,
    client: &Client,
    backends: &Backends,
    payload: Bytes,
) -> Bytes {
    let own = OwnValues {
        connection_id: client.connection_id,
        port: client.reached.port(),
        address: client.reached.ip(),
        hostname: &shared.hostname,
    };
    match replace_own_values(&payload[1..], &own, backends.quoting) {
        Some(sql) => [&payload[..1], &sql].concat().into(),
        None => payload,
    }
}

//! One connection from hscale to a backend: login, and the commands hscale runs
//! on it for itself (replaying a client's session state).

mod prepare;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hscale_wire::auth::{Secret, NATIVE_PASSWORD};
use hscale_wire::command;
use hscale_wire::frame::{read_lenenc, FrameHeader, HEADER_LEN};
use hscale_wire::packets::{
    parse_auth_switch, BackendHello, ErrorPacket, ServerGreeting, ERR_HEADER,
};
use hscale_wire::resultset::{column_names, is_result_end, parse_text_row};
use hscale_wire::scan::{Completion, Expect, Progress, ResponseScanner};
use hscale_wire::stream::PacketStream;
use hscale_wire::{CapabilityFlags, StatusFlags, WireError};
use tokio::sync::OwnedSemaphorePermit;

use super::accounts::{AccountId, SERVICE};
use super::{BackendError, BackendStream, Statements};
use crate::config::BackendConfig;
use crate::spool::Spool;

/// Client capabilities that change the bytes a server sends back, and so must be
/// the same on the backend connection as on the client's.
pub const FORMAT_CAPABILITIES: CapabilityFlags = CapabilityFlags::CLIENT_FOUND_ROWS
    .union(CapabilityFlags::CLIENT_LOCAL_FILES)
    .union(CapabilityFlags::CLIENT_IGNORE_SPACE)
    .union(CapabilityFlags::CLIENT_DEPRECATE_EOF)
    .union(CapabilityFlags::CLIENT_MULTI_STATEMENTS)
    .union(CapabilityFlags::CLIENT_MULTI_RESULTS)
    .union(CapabilityFlags::CLIENT_PS_MULTI_RESULTS);

/// Always on towards backends.
const BASE_CAPABILITIES: CapabilityFlags = CapabilityFlags::CLIENT_LONG_PASSWORD
    .union(CapabilityFlags::CLIENT_LONG_FLAG)
    .union(CapabilityFlags::CLIENT_PROTOCOL_41)
    .union(CapabilityFlags::CLIENT_TRANSACTIONS)
    .union(CapabilityFlags::CLIENT_SECURE_CONNECTION)
    .union(CapabilityFlags::CLIENT_PLUGIN_AUTH);

/// The largest packet hscale reads from a backend: MariaDB's largest.
pub const MAX_PACKET: usize = 1 << 30;

/// Which clients may share a backend connection: those whose answers the server
/// formats alike (capabilities, character set) and that agree on having a
/// current database at all, since a database cannot be unselected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnKey {
    pub capabilities: CapabilityFlags,
    pub collation: u8,
    pub has_db: bool,
    /// The account the connection is logged in as: a client's statements
    /// run with its user's grants, never another's.
    pub account: AccountId,
}

impl ConnKey {
    pub fn for_client(
        client: CapabilityFlags,
        collation: u8,
        has_db: bool,
        account: AccountId,
    ) -> ConnKey {
        ConnKey {
            capabilities: client & FORMAT_CAPABILITIES,
            collation,
            has_db,
            account,
        }
    }

    /// hscale's own connections: its service account, no client's format.
    pub fn service() -> ConnKey {
        ConnKey::for_client(CapabilityFlags::empty(), 45, false, SERVICE)
    }
}

pub struct BackendConn {
    pub backend: u32,
    pub stream: PacketStream<BackendStream>,
    pub key: ConnKey,
    /// The current database, as hscale last set it.
    pub db: Option<String>,
    /// Fingerprint of the session settings replayed since the last reset; 0: none.
    pub settings: u64,
    /// What LAST_INSERT_ID() returns on this connection (`UNKNOWN_ID`: not
    /// known, set before it is read).
    pub last_insert_id: u64,
    pub idle_since: Instant,
    pub server_version: String,
    /// The status the server greeted this connection with.
    pub greeting_status: StatusFlags,
    /// The server's id for this connection (its CONNECTION_ID()).
    pub thread_id: u32,
    /// Statements prepared on this connection, by database and text.
    pub statements: Statements,
    /// The worker that opened it (`cores::current`): its socket is
    /// registered with that worker's reactor, and it idles in its list.
    pub core: usize,
    /// The backend's writer it was opened to (`ReplicaSet::generation`):
    /// once another host is the writer, it is never used again.
    pub generation: u64,
    serial: u64,
    commands: u64,
    /// Commands written ahead of the next one, whose answers `send_command`
    /// reads before that command's: a deferred BEGIN rides with the
    /// transaction's first read instead of costing a round trip.
    queued: u8,
    _permit: OwnedSemaphorePermit,
}

/// What a new connection logs in with: where, as whom, over TLS or not.
pub struct Login<'a> {
    pub config: &'a BackendConfig,
    /// The host of the backend's replica set it connects to.
    pub address: &'a str,
    pub account: (&'a str, &'a Secret),
    pub tls: Option<&'a crate::tls::ToBackend>,
}

/// A connection, and how many commands it had run at one moment: if both still
/// match later, no one ran anything on it in between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnMark {
    pub serial: u64,
    pub commands: u64,
}

static NEXT_SERIAL: AtomicU64 = AtomicU64::new(1);

impl BackendConn {
    pub async fn connect(
        login: Login<'_>,
        key: ConnKey,
        timeout: Duration,
        permit: OwnedSemaphorePermit,
    ) -> Result<Box<BackendConn>, BackendError> {
        let (backend, address) = (login.config.id, login.address);
        match tokio::time::timeout(timeout, Self::login(login, key, permit)).await {
            Ok(result) => result,
            Err(_) => Err(BackendError::ConnectTimeout {
                backend,
                address: address.to_string(),
                timeout_ms: timeout.as_millis() as u64,
            }),
        }
    }

    async fn login(
        login: Login<'_>,
        key: ConnKey,
        permit: OwnedSemaphorePermit,
    ) -> Result<Box<BackendConn>, BackendError> {
        let Login {
            config,
            address,
            account: (user, secret),
            tls,
        } = login;
        let backend = config.id;
        let lost = |source: WireError| BackendError::Lost { backend, source };
        let socket =
            BackendStream::connect(address)
                .await
                .map_err(|source| BackendError::Connect {
                    backend,
                    address: address.to_string(),
                    source,
                })?;
        let mut stream = PacketStream::new(socket, MAX_PACKET);
        let greeting = stream
            .read_packet()
            .await
            .map_err(lost)?
            .ok_or(lost(WireError::Closed))?;
        if greeting.payload.first() == Some(&ERR_HEADER) {
            let error = ErrorPacket::parse(&greeting.payload).map_err(lost)?;
            return Err(BackendError::Login { backend, error });
        }
        let server = ServerGreeting::parse(&greeting.payload).map_err(lost)?;
        let mut capabilities = BASE_CAPABILITIES | key.capabilities;
        capabilities &= server.capabilities | CapabilityFlags::CLIENT_LONG_PASSWORD;
        let mut seq = greeting.seq.wrapping_add(1);
        if let Some(tls) = tls {
            if !server.capabilities.contains(CapabilityFlags::CLIENT_SSL) {
                return Err(BackendError::Tls {
                    backend,
                    reason: "the server does not offer TLS (no ssl_cert configured?)".into(),
                });
            }
            capabilities |= CapabilityFlags::CLIENT_SSL;
            stream = tls
                .switch(stream, seq, capabilities, key.collation, backend)
                .await?;
            seq = seq.wrapping_add(1);
        }
        let answer = secret.scramble(&server.nonce);
        let mut hello = Vec::with_capacity(128);
        BackendHello {
            capabilities,
            collation: key.collation,
            user,
            auth_response: &answer,
            database: None,
            auth_plugin: NATIVE_PASSWORD,
        }
        .write(&mut hello);
        stream.send_packet(seq, &hello).await.map_err(lost)?;
        accepted(&mut stream, secret, backend, &server.auth_plugin).await?;
        // Boxed: a connection changes hands (pool, lease, session) several times
        // per statement, and moving a pointer is cheaper than moving the struct.
        Ok(Box::new(BackendConn {
            backend,
            stream,
            key,
            db: None,
            settings: 0,
            last_insert_id: 0,
            idle_since: Instant::now(),
            server_version: server.server_version,
            greeting_status: server.status,
            thread_id: server.connection_id,
            core: crate::cores::current(),
            generation: 0,
            serial: NEXT_SERIAL.fetch_add(1, Ordering::Relaxed),
            commands: 0,
            queued: 0,
            statements: Statements::new(config.prepared_statements),
            _permit: permit,
        }))
    }

    pub fn mark(&self) -> ConnMark {
        ConnMark {
            serial: self.serial,
            commands: self.commands,
        }
    }

    /// Starts a command; every command goes through here so that `mark` counts
    /// it. The answers of commands queued ahead of it are read first: a failed
    /// one fails this command's connection, whose answer then never reaches
    /// anyone.
    pub async fn send_command(&mut self, payload: &[u8]) -> Result<(), WireError> {
        self.commands += 1;
        self.stream.send_packet(0, payload).await?;
        while self.queued > 0 {
            self.queued -= 1;
            let completion = self.read_reply(Expect::ResultSets, None, |_, _| {}).await?;
            if completion.error {
                return Err(WireError::Io(std::io::Error::other(
                    "a command queued ahead of the statement (the transaction's BEGIN) failed",
                )));
            }
        }
        Ok(())
    }

    /// Writes a command that is sent with the next one (`send_command`); its
    /// answer must be an OK or an error.
    pub fn queue_command(&mut self, payload: &[u8]) {
        self.commands += 1;
        self.queued += 1;
        self.stream.queue_packet(0, payload);
    }

    /// Runs a command whose answer hscale reads itself. The outer error is the
    /// connection failing; the inner one is the server refusing the command.
    pub async fn run(
        &mut self,
        command: &[u8],
        expect: Expect,
    ) -> Result<Result<Completion, ErrorPacket>, BackendError> {
        self.run_with_file(command, expect, None).await
    }

    /// `run`, with `file` the answer to the server's request for a LOCAL
    /// INFILE (LOAD DATA LOCAL INFILE).
    pub async fn run_with_file(
        &mut self,
        command: &[u8],
        expect: Expect,
        file: Option<&Spool>,
    ) -> Result<Result<Completion, ErrorPacket>, BackendError> {
        let mut refusal = None;
        let completion = self
            .read_answer(command, expect, file, |bytes, done| {
                if done.is_some_and(|c| c.error) {
                    refusal = last_packet(bytes).and_then(|p| ErrorPacket::parse(p).ok());
                }
            })
            .await?;
        Ok(match refusal {
            Some(error) => Err(error),
            None => Ok(completion),
        })
    }

    /// Sends `command` and reads its whole answer, handing `seen` the bytes
    /// as they are read (with the completion, for the last of them).
    async fn read_answer(
        &mut self,
        command: &[u8],
        expect: Expect,
        file: Option<&Spool>,
        seen: impl FnMut(&[u8], Option<&Completion>),
    ) -> Result<Completion, BackendError> {
        let backend = self.backend;
        let lost = |source: WireError| BackendError::Lost { backend, source };
        self.send_command(command).await.map_err(lost)?;
        self.read_reply(expect, file, seen).await.map_err(lost)
    }

    /// Reads one command's whole answer; a request for a LOCAL INFILE is
    /// answered with `file`, or fails the connection without one.
    async fn read_reply(
        &mut self,
        expect: Expect,
        file: Option<&Spool>,
        mut seen: impl FnMut(&[u8], Option<&Completion>),
    ) -> Result<Completion, WireError> {
        let deprecate_eof = self
            .key
            .capabilities
            .contains(CapabilityFlags::CLIENT_DEPRECATE_EOF);
        let mut scanner = ResponseScanner::new(expect, deprecate_eof);
        loop {
            let progress = scanner.scan(self.stream.buffered())?;
            let (n, done) = match progress {
                Progress::More(n) => (n, None),
                Progress::Done(n, completion) => (n, Some(completion)),
                Progress::Column { .. } => unreachable!("this scanner passes columns"),
                Progress::LocalInfile(n) => {
                    let Some(file) = file else {
                        return Err(WireError::Malformed {
                            what: "unexpected LOCAL INFILE request",
                        });
                    };
                    // The file's packets follow the request's sequence number.
                    let seq = self.stream.buffered()[HEADER_LEN - 1].wrapping_add(1);
                    self.stream.consume(n);
                    self.send_file(file, seq).await?;
                    continue;
                }
            };
            seen(&self.stream.buffered()[..n], done.as_ref());
            self.stream.consume(n);
            if let Some(completion) = done {
                if completion.last_insert_id != 0 {
                    self.last_insert_id = completion.last_insert_id;
                }
                return Ok(completion);
            }
            if self.stream.fill().await? == 0 {
                return Err(WireError::Closed);
            }
        }
    }

    /// The file of a LOCAL INFILE request, in packets, and the empty packet
    /// that ends it.
    async fn send_file(&mut self, file: &Spool, mut seq: u8) -> Result<(), WireError> {
        let mut chunk = vec![0; FILE_CHUNK];
        let mut offset = 0;
        loop {
            let n = file.read_at(offset, &mut chunk).map_err(WireError::Io)?;
            if n == 0 {
                break;
            }
            seq = self.stream.send_packet(seq, &chunk[..n]).await?;
            offset += n as u64;
        }
        self.stream.send_packet(seq, &[]).await?;
        Ok(())
    }
}

/// The size of the packets a LOCAL INFILE is sent in.
const FILE_CHUNK: usize = 64 * 1024;

/// `last_insert_id` of a connection where an INSERT gave ids itself: its OK
/// reports them, but LAST_INSERT_ID() there did not change.
pub const UNKNOWN_ID: u64 = u64::MAX;

/// Reads the server's answers to hscale's login until it accepts it (an
/// auth switch to mysql_native_password answered on the way); its refusal,
/// or another plugin, is the error.
async fn accepted(
    stream: &mut PacketStream<BackendStream>,
    secret: &Secret,
    backend: u32,
    server_plugin: &str,
) -> Result<(), BackendError> {
    let lost = |source: WireError| BackendError::Lost { backend, source };
    loop {
        let reply = stream
            .read_packet()
            .await
            .map_err(lost)?
            .ok_or(lost(WireError::Closed))?;
        match reply.payload.first() {
            Some(0x00) => return Ok(()),
            Some(&ERR_HEADER) => {
                let error = ErrorPacket::parse(&reply.payload).map_err(lost)?;
                return Err(BackendError::Login { backend, error });
            }
            Some(0xfe) => {
                let (plugin, nonce) =
                    parse_auth_switch(&reply.payload).ok_or(lost(WireError::Malformed {
                        what: "auth switch",
                    }))?;
                if plugin != NATIVE_PASSWORD {
                    return Err(BackendError::AuthPlugin { backend, plugin });
                }
                let answer = secret.scramble(&nonce);
                stream
                    .send_packet(reply.seq.wrapping_add(1), &answer)
                    .await
                    .map_err(lost)?;
            }
            _ => {
                return Err(BackendError::AuthPlugin {
                    backend,
                    plugin: server_plugin.to_string(),
                });
            }
        }
    }
}

/// The payload of the last frame in `buf`, which holds whole frames.
fn last_packet(buf: &[u8]) -> Option<&[u8]> {
    let mut pos = 0;
    let mut last = None;
    while let Some(h) = FrameHeader::parse(&buf[pos..]) {
        let end = pos + HEADER_LEN + h.len;
        last = buf.get(pos + HEADER_LEN..end);
        pos = end;
    }
    last
}

/// The rows of a query hscale runs for itself, values as the server sent
/// them in the text protocol (`None`: NULL).
pub type Rows = Vec<Vec<hscale_wire::resultset::TextValue>>;

impl BackendConn {
    /// Runs a query whose rows hscale reads itself (dictionary, admin
    /// commands): small answers only. The outer error is the connection
    /// failing; the inner one is the server refusing the query.
    pub async fn query(&mut self, sql: &str) -> Result<Result<Rows, ErrorPacket>, BackendError> {
        Ok(self.query_named(sql).await?.map(|(_, rows)| rows))
    }

    /// `query`, with the names of the columns (SHOW statements whose
    /// columns differ between server versions are read by name).
    pub async fn query_named(
        &mut self,
        sql: &str,
    ) -> Result<Result<(Vec<String>, Rows), ErrorPacket>, BackendError> {
        let backend = self.backend;
        let lost = |source: WireError| BackendError::Lost { backend, source };
        let mut command = Vec::with_capacity(sql.len() + 1);
        command.push(command::QUERY);
        command.extend_from_slice(sql.as_bytes());
        self.send_command(&command).await.map_err(lost)?;
        let deprecate_eof = self
            .key
            .capabilities
            .contains(CapabilityFlags::CLIENT_DEPRECATE_EOF);
        let stream = &mut self.stream;
        let first = next_packet(stream, backend).await?;
        match first.payload.first() {
            Some(&ERR_HEADER) => return Ok(Err(ErrorPacket::parse(&first.payload).map_err(lost)?)),
            Some(0x00) => return Ok(Ok((Vec::new(), Vec::new()))),
            _ => {}
        }
        let malformed = || lost(WireError::Malformed { what: "result set" });
        let (columns, _) = read_lenenc(&first.payload).ok_or_else(malformed)?;
        let mut names = Vec::with_capacity(columns as usize);
        for _ in 0..columns {
            let definition = next_packet(stream, backend).await?;
            let (name, _) = column_names(&definition.payload).ok_or_else(malformed)?;
            names.push(String::from_utf8_lossy(name).into_owned());
        }
        if !deprecate_eof {
            next_packet(stream, backend).await?;
        }
        let mut rows = Vec::new();
        loop {
            let packet = next_packet(stream, backend).await?;
            if packet.payload.first() == Some(&ERR_HEADER) {
                return Ok(Err(ErrorPacket::parse(&packet.payload).map_err(lost)?));
            }
            if is_result_end(&packet.payload, deprecate_eof) {
                return Ok(Ok((names, rows)));
            }
            let values = parse_text_row(&packet.payload, columns as usize).ok_or_else(malformed)?;
            rows.push(values);
        }
    }
}

async fn next_packet(
    stream: &mut PacketStream<BackendStream>,
    backend: u32,
) -> Result<hscale_wire::stream::Packet, BackendError> {
    let lost = |source: WireError| BackendError::Lost { backend, source };
    stream
        .read_packet()
        .await
        .map_err(lost)?
        .ok_or(lost(WireError::Closed))
}

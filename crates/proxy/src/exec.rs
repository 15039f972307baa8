//! Execution on backend connections: a command's answer forwarded as it
//! arrives, frame by frame, never decoding rows; and the rows of one partition
//! of a concatenated result set. A slow client stops hscale reading the
//! backend, so memory stays bounded.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use bytes::Bytes;
use hscale_wire::frame::{read_lenenc, write_packet, FrameHeader, HEADER_LEN};
use hscale_wire::packets::{eof_status, ErrorPacket, OkInfo, ERR_HEADER, OK_HEADER};
use hscale_wire::resultset::is_result_end;
use hscale_wire::scan::{Completion, Expect, Progress, ResponseScanner};
use hscale_wire::stream::PacketStream;
use hscale_wire::{CapabilityFlags, WireError};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::backend::{BackendConn, BackendError};
use crate::dictionary::{ColumnNames, DictionaryHandle};

/// Where a relay failed, which decides what can be saved.
#[derive(Debug)]
pub enum RelayError {
    /// The backend failed; `answered` tells whether part of the answer reached
    /// the client (then the client connection cannot go on either).
    Backend { source: WireError, answered: bool },
    /// The client went away or broke the protocol; the backend connection is
    /// mid-answer and must be closed.
    Client(WireError),
}

/// What a session sends to a backend connection for one client command.
#[derive(Debug, Clone, Copy)]
pub enum Command<'a> {
    /// The command as it is.
    Raw(&'a [u8]),
    /// A command on one of hscale's prepared statements: sent with the id the
    /// connection has for the statement, prepared there first if need be.
    /// `rest` is what follows the id.
    Statement {
        statement: &'a StatementKey,
        /// hscale's id, which the client knows it by.
        client_id: u32,
        code: u8,
        rest: &'a [u8],
    },
    /// COM_STMT_PREPARE, answered to the client with hscale's id for it,
    /// without the parameters in `hidden`, which hscale binds.
    Prepare {
        statement: &'a StatementKey,
        id: u32,
        hidden: &'a [usize],
    },
}

/// What backend connections know a prepared statement by: its database, a
/// zero byte, its text.
#[derive(Debug, Clone)]
pub struct StatementKey {
    pub key: Bytes,
    pub db_len: usize,
}

impl StatementKey {
    pub fn new(db: Option<&str>, sql: &[u8]) -> StatementKey {
        let db = db.unwrap_or("");
        let mut key = Vec::with_capacity(db.len() + 1 + sql.len());
        key.extend_from_slice(db.as_bytes());
        key.push(0);
        key.extend_from_slice(sql);
        StatementKey {
            key: key.into(),
            db_len: db.len(),
        }
    }

    pub fn sql(&self) -> &[u8] {
        &self.key[self.db_len + 1..]
    }

    /// The database it was prepared in; `None` for none.
    pub fn db(&self) -> Option<&str> {
        std::str::from_utf8(&self.key[..self.db_len])
            .ok()
            .filter(|db| !db.is_empty())
    }
}

/// Sends `command` on `conn` and forwards the whole answer to `client`;
/// with `columns`, its columns named by the logical tables of `names`.
pub async fn send<C: AsyncRead + AsyncWrite + Unpin>(
    client: &mut PacketStream<C>,
    conn: &mut BackendConn,
    command: Command<'_>,
    expect: Option<Expect>,
    names: &DictionaryHandle,
    columns: Option<&mut ColumnNames>,
) -> Result<Completion, RelayError> {
    let lost = |e| lost(e, false);
    match command {
        Command::Prepare {
            statement,
            id,
            hidden,
        } => {
            let deprecate_eof = conn
                .key
                .capabilities
                .contains(CapabilityFlags::CLIENT_DEPRECATE_EOF);
            let answer = conn.prepare(statement.sql()).await.map_err(lost)?;
            let completion = answer.completion;
            if let Some(backend_id) = answer.id() {
                conn.remember(statement.key.clone(), backend_id)
                    .await
                    .map_err(lost)?;
            }
            client
                .write_raw(&answer.for_client(id, hidden, deprecate_eof, names))
                .await
                .map_err(RelayError::Client)?;
            Ok(completion)
        }
        _ => match command_payload(conn, command).await.map_err(lost)? {
            Ok(payload) => relay(client, conn, &payload, expect, names, columns).await,
            Err(refusal) => answer_error(client, &refusal).await,
        },
    }
}

/// The bytes `conn` gets for a command: a statement command carries the id
/// the connection has for the statement, prepared there first if need be
/// (the server's refusal of that PREPARE is the command's answer).
pub async fn command_payload<'c>(
    conn: &mut BackendConn,
    command: Command<'c>,
) -> Result<Result<Cow<'c, [u8]>, ErrorPacket>, BackendError> {
    match command {
        Command::Raw(payload) => Ok(Ok(Cow::Borrowed(payload))),
        Command::Statement {
            statement,
            code,
            rest,
            ..
        } => {
            let id = match conn.statement_id(&statement.key, statement.db_len).await? {
                Ok(id) => id,
                Err(refusal) => return Ok(Err(refusal)),
            };
            let mut payload = Vec::with_capacity(5 + rest.len());
            payload.push(code);
            payload.extend_from_slice(&id.to_le_bytes());
            payload.extend_from_slice(rest);
            Ok(Ok(Cow::Owned(payload)))
        }
        Command::Prepare { statement, .. } => {
            let mut payload = Vec::with_capacity(1 + statement.sql().len());
            payload.push(hscale_wire::command::STMT_PREPARE);
            payload.extend_from_slice(statement.sql());
            Ok(Ok(Cow::Owned(payload)))
        }
    }
}

/// A backend connection that failed while hscale prepared a command on it.
fn lost(error: BackendError, answered: bool) -> RelayError {
    let source = match error {
        BackendError::Lost { source, .. } => source,
        other => WireError::Io(std::io::Error::other(other.to_string())),
    };
    RelayError::Backend { source, answered }
}

/// The server's refusal of a command hscale sent on the client's behalf,
/// as the client's answer.
async fn answer_error<C: AsyncRead + AsyncWrite + Unpin>(
    client: &mut PacketStream<C>,
    error: &ErrorPacket,
) -> Result<Completion, RelayError> {
    let mut payload = Vec::with_capacity(error.message.len() + 9);
    error.write(&mut payload);
    client
        .send_packet(1, &payload)
        .await
        .map_err(RelayError::Client)?;
    Ok(Completion {
        error: true,
        ..Completion::default()
    })
}

/// Sends `payload` as a new command on `conn` and forwards the whole answer to
/// `client`. No answer is expected when `expect` is `None`. With `columns`,
/// column definitions that name a physical table are replaced
/// (`DictionaryHandle::logical_column`, remembered there); the rest passes
/// as it came.
pub async fn relay<C: AsyncRead + AsyncWrite + Unpin>(
    client: &mut PacketStream<C>,
    conn: &mut BackendConn,
    payload: &[u8],
    expect: Option<Expect>,
    names: &DictionaryHandle,
    mut columns: Option<&mut ColumnNames>,
) -> Result<Completion, RelayError> {
    let backend_failed = |source, answered| RelayError::Backend { source, answered };
    conn.send_command(payload)
        .await
        .map_err(|e| backend_failed(e, false))?;
    let Some(expect) = expect else {
        return Ok(Completion::default());
    };
    let deprecate_eof = conn
        .key
        .capabilities
        .contains(CapabilityFlags::CLIENT_DEPRECATE_EOF);
    let mut scanner = ResponseScanner::new(expect, deprecate_eof);
    if let Some(columns) = columns.as_mut() {
        if columns.start(names) {
            scanner = scanner.stopping_at_columns();
        }
    }
    let mut answered = false;
    // Bytes scanned and passed, still in the read buffer: forwarded with
    // what follows them.
    let mut passed = 0;
    loop {
        let progress = scanner
            .scan(&conn.stream.buffered()[passed..])
            .map_err(|e| backend_failed(e, answered))?;
        let (n, done) = match progress {
            Progress::More(n) => (passed + n, None),
            Progress::Done(n, completion) => (passed + n, Some(completion)),
            Progress::Column { at, end } => {
                let (at, end) = (passed + at, passed + end);
                let buffered = conn.stream.buffered();
                let columns = columns.as_mut().expect("stops only with columns to name");
                match columns.logical(names, &buffered[at + HEADER_LEN..end]) {
                    Some(renamed) => {
                        let out = client.write_buffer();
                        out.extend_from_slice(&buffered[..at]);
                        write_packet(buffered[at + 3], renamed, out);
                        conn.stream.consume(end);
                        passed = 0;
                        answered = true;
                    }
                    None => passed = end,
                }
                continue;
            }
            Progress::LocalInfile(n) => {
                forward(client, &conn.stream.buffered()[..passed + n])
                    .await
                    .map_err(RelayError::Client)?;
                conn.stream.consume(passed + n);
                passed = 0;
                answered = true;
                relay_local_file(client, conn).await?;
                continue;
            }
        };
        passed = 0;
        if n > 0 {
            forward(client, &conn.stream.buffered()[..n])
                .await
                .map_err(RelayError::Client)?;
            conn.stream.consume(n);
            answered = true;
        }
        if let Some(completion) = done {
            if completion.last_insert_id != 0 {
                conn.last_insert_id = completion.last_insert_id;
            }
            return Ok(completion);
        }
        match conn.stream.fill().await {
            Ok(0) => return Err(backend_failed(WireError::Closed, answered)),
            Ok(_) => {}
            Err(e) => return Err(backend_failed(e, answered)),
        }
    }
}

/// Writes `bytes` after what is queued for the client, in one write.
async fn forward<C: AsyncRead + AsyncWrite + Unpin>(
    client: &mut PacketStream<C>,
    bytes: &[u8],
) -> Result<(), WireError> {
    match client.write_buffer().is_empty() {
        true => client.write_raw(bytes).await,
        false => {
            client.write_buffer().extend_from_slice(bytes);
            client.flush().await
        }
    }
}

/// LOAD DATA LOCAL INFILE: the client streams the file as packets ending with an
/// empty one; they go to the backend as they are.
async fn relay_local_file<C: AsyncRead + AsyncWrite + Unpin>(
    client: &mut PacketStream<C>,
    conn: &mut BackendConn,
) -> Result<(), RelayError> {
    let mut skip = 0usize;
    let mut continuing = false;
    loop {
        let buf = client.buffered();
        let mut pos = 0;
        let mut finished = false;
        while pos < buf.len() {
            if skip > 0 {
                let take = skip.min(buf.len() - pos);
                pos += take;
                skip -= take;
                continue;
            }
            let Some(header) = FrameHeader::parse(&buf[pos..]) else {
                break;
            };
            pos += HEADER_LEN;
            skip = header.len;
            let last = header.len == 0 && !continuing;
            continuing = header.continues();
            if last {
                finished = true;
                break;
            }
        }
        if pos > 0 {
            conn.stream
                .write_raw(&client.buffered()[..pos])
                .await
                .map_err(|source| RelayError::Backend {
                    source,
                    answered: true,
                })?;
            client.consume(pos);
        }
        if finished {
            return Ok(());
        }
        match client.fill().await {
            Ok(0) => return Err(RelayError::Client(WireError::Closed)),
            Ok(_) => {}
            Err(e) => return Err(RelayError::Client(e)),
        }
    }
}

/// Rows are written to the client in batches of about this many bytes.
pub const FLUSH_AT: usize = 64 * 1024;

async fn next_packet(conn: &mut BackendConn, answered: bool) -> Result<Bytes, RelayError> {
    let failed = |source| RelayError::Backend { source, answered };
    match conn.stream.read_packet().await {
        Ok(Some(packet)) => Ok(packet.payload),
        Ok(None) => Err(failed(WireError::Closed)),
        Err(e) => Err(failed(e)),
    }
}

pub fn end_completion(packet: &[u8], deprecate_eof: bool) -> Completion {
    let (status, warnings) = match deprecate_eof {
        true => OkInfo::parse(packet).map_or((0, 0), |ok| (ok.status, ok.warnings)),
        false => (
            eof_status(packet).unwrap_or(0),
            packet
                .get(1..3)
                .map_or(0, |w| u16::from_le_bytes([w[0], w[1]])),
        ),
    };
    Completion {
        status: Some(status),
        warnings,
        ..Completion::default()
    }
}

/// A small answer read whole, for hscale to correct before the client sees
/// it (SHOW TABLES).
#[derive(Debug)]
pub enum Answer {
    /// A result set: column count and definitions (and their EOF), rows, end.
    Rows {
        header: Vec<Bytes>,
        rows: Vec<Bytes>,
        end: Bytes,
    },
    /// An OK or ERR packet.
    Packet(Bytes),
}

pub async fn read_answer(conn: &mut BackendConn, payload: &[u8]) -> Result<Answer, RelayError> {
    let failed = |source| RelayError::Backend {
        source,
        answered: false,
    };
    conn.send_command(payload).await.map_err(failed)?;
    let deprecate_eof = conn
        .key
        .capabilities
        .contains(CapabilityFlags::CLIENT_DEPRECATE_EOF);
    let first = next_packet(conn, false).await?;
    let columns = match first.first() {
        Some(&ERR_HEADER | &OK_HEADER) => return Ok(Answer::Packet(first)),
        _ => {
            read_lenenc(&first)
                .ok_or(failed(WireError::Malformed {
                    what: "column count",
                }))?
                .0
        }
    };
    let mut header = vec![first];
    for _ in 0..columns + u64::from(!deprecate_eof) {
        header.push(next_packet(conn, false).await?);
    }
    let mut rows = Vec::new();
    loop {
        let packet = next_packet(conn, false).await?;
        if packet.first() == Some(&ERR_HEADER) {
            return Ok(Answer::Packet(packet));
        }
        if is_result_end(&packet, deprecate_eof) {
            return Ok(Answer::Rows {
                header,
                rows,
                end: packet,
            });
        }
        rows.push(packet);
    }
}

/// Runs futures at once, each to its end; their outputs in their order.
pub async fn all_at_once<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut running: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = running.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in running.iter_mut().zip(&mut outputs) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => pending = true,
                }
            }
        }
        match pending {
            true => Poll::Pending,
            false => Poll::Ready(()),
        }
    })
    .await;
    outputs
        .into_iter()
        .map(|o| o.expect("every future ended"))
        .collect()
}

//! Single-target execution: send the client's command to one backend connection
//! and forward the answer as it arrives, frame by frame, never decoding rows.
//! A slow client stops hscale reading the backend, so memory stays bounded.

use hscale_wire::frame::{write_lenenc_bytes, write_packet, FrameHeader, HEADER_LEN};
use hscale_wire::scan::{Completion, Expect, Progress, ResponseScanner};
use hscale_wire::stream::PacketStream;
use hscale_wire::{CapabilityFlags, WireError};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::backend::BackendConn;

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

/// Sends `payload` as a new command on `conn` and forwards the whole answer to
/// `client`. No answer is expected when `expect` is `None`.
pub async fn relay<C: AsyncRead + AsyncWrite + Unpin>(
    client: &mut PacketStream<C>,
    conn: &mut BackendConn,
    payload: &[u8],
    expect: Option<Expect>,
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
    let mut answered = false;
    loop {
        let progress = scanner
            .scan(conn.stream.buffered())
            .map_err(|e| backend_failed(e, answered))?;
        let (n, done) = match progress {
            Progress::More(n) => (n, None),
            Progress::Done(n, completion) => (n, Some(completion)),
            Progress::LocalInfile(n) => {
                client
                    .write_raw(&conn.stream.buffered()[..n])
                    .await
                    .map_err(RelayError::Client)?;
                conn.stream.consume(n);
                answered = true;
                relay_local_file(client, conn).await?;
                continue;
            }
        };
        if n > 0 {
            client
                .write_raw(&conn.stream.buffered()[..n])
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

/// How the answer reaches the client.
#[derive(Debug, Clone, Copy)]
pub enum Forward<'a> {
    /// Frame by frame as it arrives.
    AsIs,
    /// The answer is one row of one column, and its value is replaced: the
    /// client sees the server's own column metadata around a value only hscale
    /// knows. The answer is small, so it is read whole first.
    ReplacingValue(&'a [u8]),
}

/// `relay`, with the answer forwarded as `forward` says.
pub async fn relay_forwarding<C: AsyncRead + AsyncWrite + Unpin>(
    client: &mut PacketStream<C>,
    conn: &mut BackendConn,
    payload: &[u8],
    expect: Option<Expect>,
    forward: Forward<'_>,
) -> Result<Completion, RelayError> {
    let Forward::ReplacingValue(value) = forward else {
        return relay(client, conn, payload, expect).await;
    };
    let capture = tokio::io::join(tokio::io::empty(), Vec::new());
    let mut capture = PacketStream::new(capture, usize::MAX);
    let completion = relay(&mut capture, conn, payload, expect).await?;
    let deprecate_eof = conn
        .key
        .capabilities
        .contains(CapabilityFlags::CLIENT_DEPRECATE_EOF);
    let answer = replace_single_value(capture.get_ref().writer(), value, deprecate_eof);
    client
        .write_raw(&answer)
        .await
        .map_err(RelayError::Client)?;
    Ok(completion)
}

/// The frames of a one-row, one-column result set with the row's value
/// replaced; anything else (an error, say) unchanged.
fn replace_single_value(frames: &[u8], value: &[u8], deprecate_eof: bool) -> Vec<u8> {
    let row_index = if deprecate_eof { 2 } else { 3 };
    let mut out = Vec::with_capacity(frames.len() + value.len());
    let mut pos = 0;
    let mut index = 0;
    let mut single_column = false;
    while let Some(header) = FrameHeader::parse(&frames[pos..]) {
        let Some(payload) = frames.get(pos + HEADER_LEN..pos + HEADER_LEN + header.len) else {
            break;
        };
        if index == 0 {
            single_column = payload == [1];
        }
        if index == row_index && single_column {
            let mut row = Vec::with_capacity(value.len() + 9);
            write_lenenc_bytes(value, &mut row);
            write_packet(header.seq, &row, &mut out);
        } else {
            out.extend_from_slice(&frames[pos..pos + HEADER_LEN + header.len]);
        }
        pos += HEADER_LEN + header.len;
        index += 1;
    }
    out.extend_from_slice(&frames[pos..]);
    out
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

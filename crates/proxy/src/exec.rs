//! Single-target execution: send the client's command to one backend connection
//! and forward the answer as it arrives, frame by frame, never decoding rows.
//! A slow client stops hscale reading the backend, so memory stays bounded.

use hscale_wire::frame::{FrameHeader, HEADER_LEN};
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

//! The client's side of a session: its socket, what describes the client
//! (who it is, what it asked for at login, how its text reads) and the
//! replies hscale writes to it itself.

use bytes::Bytes;
use hscale_planner::ClientCharset;
use hscale_wire::stream::{Packet, PacketStream};
use hscale_wire::{CapabilityFlags, WireError};

use crate::error::ProxyError;
use crate::tls::ClientStream;

pub(super) struct Client {
    pub stream: PacketStream<ClientStream>,
    pub connection_id: u32,
    /// hscale's address as the client reached it: what `@@port` answers.
    pub reached: std::net::SocketAddr,
    pub user: String,
    pub admin: bool,
    pub capabilities: CapabilityFlags,
    pub collation: u8,
    /// The login's scramble, which COM_CHANGE_USER's password answers.
    pub nonce: [u8; 20],
    /// The character set the client writes its statements in: from the
    /// handshake, then SET NAMES and friends.
    pub charset: ClientCharset,
    /// The sequence number of the command's answer: 1, unless the client
    /// sent more than the command (a LOCAL INFILE's packets).
    pub reply_seq: u8,
    /// Its socket could not leave this worker once: it stays.
    pub stays: bool,
    /// What this client gets for the column definitions it saw lately.
    pub column_names: crate::dictionary::ColumnNames,
}

impl Client {
    pub async fn read_packet(&mut self) -> Result<Option<Packet>, WireError> {
        self.stream.read_packet().await
    }

    /// The client's next command, at least its code; `None` once it
    /// closed its connection. A packet over max_allowed_packet gets the
    /// server's answer, then ends the session.
    pub async fn next_command(&mut self) -> Result<Option<Bytes>, ProxyError> {
        let packet = match self.read_packet().await {
            Ok(packet) => packet,
            Err(e) => {
                if let WireError::PacketTooLarge { size, .. } = e {
                    let e = ProxyError::Client(e);
                    let _ = self.reply_error(&e, 1).await;
                    self.discard_the_rest(size).await;
                    return Err(e);
                }
                return Err(ProxyError::Client(e));
            }
        };
        let Some(packet) = packet else {
            return Ok(None);
        };
        if packet.first_seq != 0 {
            return Err(ProxyError::Client(WireError::OutOfOrder {
                expected: 0,
                got: packet.first_seq,
            }));
        }
        if packet.payload.is_empty() {
            return Err(ProxyError::Client(WireError::Malformed {
                what: "empty command",
            }));
        }
        Ok(Some(packet.payload))
    }

    pub async fn send_packet(&mut self, seq: u8, payload: &[u8]) -> Result<u8, WireError> {
        self.stream.send_packet(seq, payload).await
    }

    /// Queues a packet to go with the next flush; the next sequence number.
    pub fn queue_packet(&mut self, seq: u8, payload: &[u8]) -> u8 {
        self.stream.queue_packet(seq, payload)
    }

    pub async fn flush(&mut self) -> Result<(), WireError> {
        self.stream.flush().await
    }

    pub fn is_flushed(&self) -> bool {
        self.stream.is_flushed()
    }

    pub fn write_buffer(&mut self) -> &mut Vec<u8> {
        self.stream.write_buffer()
    }

    /// An OK of hscale's own, with the session's `status` flags.
    pub async fn send_ok(&mut self, status: u16) -> Result<(), WireError> {
        self.stream
            .send_packet(1, &super::handshake::ok_packet(status))
            .await
            .map(drop)
    }

    pub fn deprecate_eof(&self) -> bool {
        self.capabilities
            .contains(CapabilityFlags::CLIENT_DEPRECATE_EOF)
    }

    /// The error packet of `error`, where the client gets one.
    pub async fn reply_error(&mut self, error: &ProxyError, seq: u8) -> Result<(), WireError> {
        reply_error(&mut self.stream, error, seq).await
    }

    /// Reads and drops what the client still sends of a packet hscale
    /// refused, for at most a second: closed with unread bytes, the socket
    /// would be reset, and the reset could reach the client before the
    /// error that explains it.
    pub async fn discard_the_rest(&mut self, mut announced: usize) {
        let client = &mut self.stream;
        let discard = async {
            while announced > 0 {
                let n = client.buffered().len();
                client.consume(n);
                announced = announced.saturating_sub(n);
                if !matches!(client.fill().await, Ok(1..)) {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), discard).await;
    }
}

/// The error packet of `error` on a stream no session holds yet (a login).
pub(super) async fn reply_error(
    stream: &mut PacketStream<ClientStream>,
    error: &ProxyError,
    seq: u8,
) -> Result<(), WireError> {
    let (packet, _) = error.to_client();
    if let Some(packet) = packet {
        let mut payload = Vec::with_capacity(packet.message.len() + 9);
        packet.write(&mut payload);
        stream.send_packet(seq, &payload).await?;
    }
    Ok(())
}

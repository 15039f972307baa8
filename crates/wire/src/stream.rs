//! The thin tokio layer: a byte stream with a read buffer that yields whole
//! packets, and a write buffer flushed in one call.

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::frame::{write_packet, FrameHeader, HEADER_LEN};
use crate::WireError;

const READ_CHUNK: usize = 64 * 1024;

/// One logical packet: its payload and the sequence ids of its first and last frame.
#[derive(Debug)]
pub struct Packet {
    pub first_seq: u8,
    pub seq: u8,
    pub payload: Bytes,
}

pub struct PacketStream<S> {
    stream: S,
    rbuf: BytesMut,
    wbuf: Vec<u8>,
    max_packet: usize,
}

impl<S: AsyncRead + AsyncWrite + Unpin> PacketStream<S> {
    pub fn new(stream: S, max_packet: usize) -> PacketStream<S> {
        PacketStream {
            stream,
            rbuf: BytesMut::with_capacity(READ_CHUNK),
            wbuf: Vec::with_capacity(4096),
            max_packet,
        }
    }

    /// The largest logical packet `read_packet` accepts from now on.
    pub fn set_max_packet(&mut self, max_packet: usize) {
        self.max_packet = max_packet;
    }

    /// The stream and what was read from it but not consumed: a TLS
    /// handshake that follows an SSLRequest may have arrived with it.
    pub fn into_parts(self) -> (S, BytesMut) {
        debug_assert!(self.wbuf.is_empty(), "unsent bytes");
        (self.stream, self.rbuf)
    }

    pub fn get_ref(&self) -> &S {
        &self.stream
    }

    /// The stream itself, what was read and not consumed staying here.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.stream
    }

    /// Reads one whole packet. `Ok(None)`: the peer closed between packets.
    pub async fn read_packet(&mut self) -> Result<Option<Packet>, WireError> {
        let mut assembled: Option<BytesMut> = None;
        let mut first_seq = None;
        loop {
            let header = loop {
                if let Some(h) = FrameHeader::parse(&self.rbuf) {
                    let so_far = assembled.as_ref().map_or(0, |a| a.len()) + h.len;
                    if so_far > self.max_packet {
                        return Err(WireError::PacketTooLarge {
                            size: so_far,
                            limit: self.max_packet,
                        });
                    }
                    if self.rbuf.len() >= HEADER_LEN + h.len {
                        break h;
                    }
                    // Room for the frame, but never more than doubling what
                    // arrived: a peer announcing a large packet and sending a
                    // few bytes must not make hscale reserve the announced size.
                    let missing = HEADER_LEN + h.len - self.rbuf.len();
                    self.rbuf
                        .reserve(missing.min(self.rbuf.len().max(READ_CHUNK)));
                }
                if self.fill().await? == 0 {
                    if self.rbuf.is_empty() && assembled.is_none() {
                        return Ok(None);
                    }
                    return Err(WireError::Closed);
                }
            };
            let first_seq = *first_seq.get_or_insert(header.seq);
            let mut frame = self.rbuf.split_to(HEADER_LEN + header.len);
            frame.advance(HEADER_LEN);
            match (&mut assembled, header.continues()) {
                (None, false) => {
                    return Ok(Some(Packet {
                        first_seq,
                        seq: header.seq,
                        payload: frame.freeze(),
                    }))
                }
                (None, true) => assembled = Some(frame),
                (Some(acc), more) => {
                    acc.extend_from_slice(&frame);
                    if !more {
                        let payload = assembled.take().unwrap_or_default().freeze();
                        return Ok(Some(Packet {
                            first_seq,
                            seq: header.seq,
                            payload,
                        }));
                    }
                }
            }
        }
    }

    /// Reads more bytes into the buffer; 0 means the peer closed.
    pub async fn fill(&mut self) -> Result<usize, WireError> {
        if self.rbuf.is_empty() {
            // Start again at the front of the allocation (free: nothing to move,
            // and skipped while a packet still shares it). Otherwise every read
            // lands on lines further into the 64 KiB, and each connection's
            // buffer cycles through the cache instead of staying in it.
            let _ = self.rbuf.try_reclaim(READ_CHUNK);
        }
        if self.rbuf.capacity() - self.rbuf.len() < 4096 {
            self.rbuf.reserve(READ_CHUNK);
        }
        Ok(self.stream.read_buf(&mut self.rbuf).await?)
    }

    /// Bytes read but not yet consumed.
    pub fn buffered(&self) -> &[u8] {
        &self.rbuf
    }

    pub fn consume(&mut self, n: usize) {
        self.rbuf.advance(n);
    }

    /// Queues a packet; nothing is sent before `flush`.
    pub fn queue_packet(&mut self, seq: u8, payload: &[u8]) -> u8 {
        write_packet(seq, payload, &mut self.wbuf)
    }

    /// Whether everything queued was written to the stream.
    pub fn is_flushed(&self) -> bool {
        self.wbuf.is_empty()
    }

    /// The write buffer, for callers that frame packets themselves.
    pub fn write_buffer(&mut self) -> &mut Vec<u8> {
        &mut self.wbuf
    }

    pub async fn flush(&mut self) -> Result<(), WireError> {
        if !self.wbuf.is_empty() {
            self.stream.write_all(&self.wbuf).await?;
            self.wbuf.clear();
            // A TLS stream may hold records its socket had no room for yet;
            // a socket's flush is free.
            self.stream.flush().await?;
        }
        Ok(())
    }

    pub async fn send_packet(&mut self, seq: u8, payload: &[u8]) -> Result<u8, WireError> {
        let next = self.queue_packet(seq, payload);
        self.flush().await?;
        Ok(next)
    }

    /// Writes bytes that are already framed, bypassing the write buffer.
    pub async fn write_raw(&mut self, bytes: &[u8]) -> Result<(), WireError> {
        self.flush().await?;
        self.stream.write_all(bytes).await?;
        self.stream.flush().await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::MAX_FRAME_PAYLOAD;

    #[tokio::test]
    async fn reassembles_a_packet_split_over_frames() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let payload: Vec<u8> = (0..MAX_FRAME_PAYLOAD + 100).map(|i| i as u8).collect();
        let expected = payload.clone();
        let writer = tokio::spawn(async move {
            let mut w = PacketStream::new(a, 1 << 30);
            w.send_packet(0, &payload).await.unwrap();
            w.send_packet(0, b"tail").await.unwrap();
        });
        let mut r = PacketStream::new(b, 1 << 30);
        let p = r.read_packet().await.unwrap().unwrap();
        assert_eq!(p.seq, 1);
        assert_eq!(&p.payload[..], &expected[..]);
        let p = r.read_packet().await.unwrap().unwrap();
        assert_eq!(&p.payload[..], b"tail");
        writer.await.unwrap();
        assert!(r.read_packet().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn each_read_after_a_drained_buffer_starts_at_its_front() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let mut w = PacketStream::new(a, 1 << 20);
        let mut r = PacketStream::new(b, 1 << 20);
        let mut at = Vec::new();
        for payload in [&b"first"[..], b"second", b"third"] {
            w.send_packet(0, payload).await.unwrap();
            let p = r.read_packet().await.unwrap().unwrap();
            assert_eq!(&p.payload[..], payload);
            at.push(p.payload.as_ptr());
        }
        assert!(at.windows(2).all(|w| w[0] == w[1]), "{at:?}");
    }

    #[tokio::test]
    async fn rejects_packets_over_the_limit() {
        let (a, b) = tokio::io::duplex(1 << 16);
        tokio::spawn(async move {
            let mut w = PacketStream::new(a, 1 << 30);
            let _ = w.send_packet(0, &[0u8; 2000]).await;
        });
        let mut r = PacketStream::new(b, 1000);
        assert!(matches!(
            r.read_packet().await,
            Err(WireError::PacketTooLarge { .. })
        ));
    }

    #[tokio::test]
    async fn a_packet_announced_large_reserves_no_more_than_what_arrived_allows() {
        let (mut a, b) = tokio::io::duplex(1 << 16);
        let mut header = vec![0xff, 0xff, 0xff, 0];
        header.extend_from_slice(&[0u8; 100]);
        tokio::io::AsyncWriteExt::write_all(&mut a, &header)
            .await
            .unwrap();
        let mut r = PacketStream::new(b, 1 << 30);
        let read = tokio::time::timeout(std::time::Duration::from_millis(100), r.read_packet());
        assert!(read.await.is_err(), "the packet is not whole: it waits");
        assert!(r.rbuf.capacity() <= 2 * READ_CHUNK, "{}", r.rbuf.capacity());
        drop(a);
    }
}

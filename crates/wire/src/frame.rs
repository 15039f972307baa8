//! Framing: every MySQL packet travels as frames of at most 16 MiB - 1 bytes,
//! each with a 3-byte length and a 1-byte sequence id.

pub const HEADER_LEN: usize = 4;
/// A frame this long announces that the packet continues in the next frame.
pub const MAX_FRAME_PAYLOAD: usize = 0xff_ffff;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub len: usize,
    pub seq: u8,
}

impl FrameHeader {
    pub fn parse(buf: &[u8]) -> Option<FrameHeader> {
        let h = buf.get(..HEADER_LEN)?;
        Some(FrameHeader {
            len: usize::from(h[0]) | usize::from(h[1]) << 8 | usize::from(h[2]) << 16,
            seq: h[3],
        })
    }

    pub fn continues(&self) -> bool {
        self.len == MAX_FRAME_PAYLOAD
    }
}

/// Appends `payload` as frames starting at `seq` and returns the next sequence id.
/// A payload that is an exact multiple of the frame size ends with an empty frame,
/// as the protocol demands.
pub fn write_packet(mut seq: u8, payload: &[u8], dst: &mut Vec<u8>) -> u8 {
    let mut rest = payload;
    loop {
        let n = rest.len().min(MAX_FRAME_PAYLOAD);
        dst.extend_from_slice(&[n as u8, (n >> 8) as u8, (n >> 16) as u8, seq]);
        dst.extend_from_slice(&rest[..n]);
        seq = seq.wrapping_add(1);
        rest = &rest[n..];
        if n < MAX_FRAME_PAYLOAD {
            return seq;
        }
    }
}

/// Writes a packet whose payload is produced by `fill`, without an intermediate
/// buffer when it fits in one frame.
pub fn write_packet_with(seq: u8, dst: &mut Vec<u8>, fill: impl FnOnce(&mut Vec<u8>)) -> u8 {
    let start = dst.len();
    dst.extend_from_slice(&[0, 0, 0, seq]);
    fill(dst);
    let len = dst.len() - start - HEADER_LEN;
    if len < MAX_FRAME_PAYLOAD {
        dst[start..start + 3].copy_from_slice(&[len as u8, (len >> 8) as u8, (len >> 16) as u8]);
        return seq.wrapping_add(1);
    }
    let payload = dst.split_off(start + HEADER_LEN);
    dst.truncate(start);
    write_packet(seq, &payload, dst)
}

/// Reads a length-encoded integer; returns the value and the bytes it took.
pub fn read_lenenc(buf: &[u8]) -> Option<(u64, usize)> {
    let first = *buf.first()?;
    let width = match first {
        0xfc => 2,
        0xfd => 3,
        0xfe => 8,
        0xfb | 0xff => return None,
        v => return Some((u64::from(v), 1)),
    };
    let bytes = buf.get(1..1 + width)?;
    let value = bytes
        .iter()
        .rev()
        .fold(0u64, |acc, b| acc << 8 | u64::from(*b));
    Some((value, 1 + width))
}

pub fn write_lenenc(value: u64, dst: &mut Vec<u8>) {
    match value {
        0..=0xfa => dst.push(value as u8),
        0xfb..=0xffff => {
            dst.push(0xfc);
            dst.extend_from_slice(&(value as u16).to_le_bytes());
        }
        0x1_0000..=0xff_ffff => {
            dst.push(0xfd);
            dst.extend_from_slice(&(value as u32).to_le_bytes()[..3]);
        }
        _ => {
            dst.push(0xfe);
            dst.extend_from_slice(&value.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_packet_is_one_frame() {
        let mut out = Vec::new();
        let next = write_packet(3, b"abc", &mut out);
        assert_eq!(out, [3, 0, 0, 3, b'a', b'b', b'c']);
        assert_eq!(next, 4);
    }

    #[test]
    fn exact_multiple_of_frame_size_ends_with_empty_frame() {
        let payload = vec![7u8; MAX_FRAME_PAYLOAD];
        let mut out = Vec::new();
        let next = write_packet(0, &payload, &mut out);
        assert_eq!(next, 2);
        assert_eq!(out.len(), MAX_FRAME_PAYLOAD + 2 * HEADER_LEN);
        assert_eq!(&out[out.len() - 4..], &[0, 0, 0, 1]);
    }

    #[test]
    fn write_packet_with_splits_large_payloads_like_write_packet() {
        let payload = vec![1u8; MAX_FRAME_PAYLOAD + 10];
        let mut a = Vec::new();
        let mut b = Vec::new();
        write_packet(5, &payload, &mut a);
        write_packet_with(5, &mut b, |d| d.extend_from_slice(&payload));
        assert_eq!(a, b);
    }

    #[test]
    fn lenenc_round_trips_every_width() {
        for v in [
            0u64,
            250,
            251,
            0xffff,
            0x1_0000,
            0xff_ffff,
            0x100_0000,
            u64::MAX,
        ] {
            let mut out = Vec::new();
            write_lenenc(v, &mut out);
            assert_eq!(read_lenenc(&out), Some((v, out.len())));
        }
    }
}

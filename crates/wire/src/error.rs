//! Errors of the wire layer.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    #[error("packet out of order: expected sequence id {expected}, got {got}")]
    OutOfOrder { expected: u8, got: u8 },
    #[error("packet of {size} bytes exceeds the limit of {limit} bytes")]
    PacketTooLarge { size: usize, limit: usize },
    #[error("malformed {what} packet")]
    Malformed { what: &'static str },
    #[error("connection closed by peer")]
    Closed,
}

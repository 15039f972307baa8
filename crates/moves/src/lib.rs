//! hscale's online partition moves as pure logic (DESIGN.md §5, docs/moves.md):
//! how a moved table is read in key chunks, compared by checksum, and kept
//! up to date from the source's binary log. The proxy's `online` module does
//! the I/O and keeps the job in the dictionary.

pub mod apply;
pub mod binlog;
pub mod columns;
pub mod follow;
pub mod foreign_keys;
pub mod position;
pub mod split;
pub mod table;
pub mod xa;

pub use apply::{EveryRow, PendingChanges, RowFilter};
pub use binlog::{binlog_refusal, Decoded, Decoder, RowChange, Watched};
pub use columns::{Column, ValueEncoding};
pub use follow::{Follower, PartView, Step};
pub use position::BinlogPosition;
pub use split::{Routing, ValuesFilter};
pub use table::{Checksum, MovedTable, TextValue};
pub use xa::{Group, Undecided, Xid};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MoveError {
    /// The table or the server cannot be moved this way; nothing was done.
    #[error("{0}")]
    Unsupported(String),
    /// The table has no key that names its rows: it cannot be copied
    /// while it changes.
    #[error("{0}")]
    NoKey(String),
    /// The binary log could not be read.
    #[error("binlog: {0}")]
    Binlog(String),
    /// Another instance took the job over: this one stops and undoes
    /// nothing.
    #[error("move {job} was taken over by another instance")]
    Superseded { job: u64 },
    /// CANCEL_MOVE asked the job to stop before its switch.
    #[error("move {job} was cancelled")]
    Cancelled { job: u64 },
    /// A move's job stopped; it undid what it had done.
    #[error("move {job} failed: {reason}")]
    Failed { job: u64, reason: String },
}

fn ident(name: &str) -> String {
    hscale_planner::quote_identifier(name)
}

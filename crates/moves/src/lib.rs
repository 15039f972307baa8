//! hscale's online partition moves as pure logic (DESIGN.md §5, docs/moves.md):
//! how a moved table is read in key chunks, compared by checksum, and kept
//! up to date from the source's binary log. The proxy's `moves` module does
//! the I/O and keeps the job in the dictionary.

pub mod apply;
pub mod binlog;
pub mod columns;
pub mod position;
pub mod table;

pub use apply::{EveryRow, RowFilter};
pub use binlog::{Decoded, Decoder, RowChange, Watched};
pub use columns::{Column, ColumnKind};
pub use position::BinlogPosition;
pub use table::{MovedTable, TextValue};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MoveError {
    /// The table or the server cannot be moved this way; nothing was done.
    #[error("{0}")]
    Unsupported(String),
    /// The binary log could not be read.
    #[error("binlog: {0}")]
    Binlog(String),
}

fn ident(name: &str) -> String {
    hscale_planner::quote_identifier(name)
}

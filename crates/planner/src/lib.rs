//! Statement analysis for hscale: from SQL text and session to what execution
//! needs. Pure logic, no I/O. For now the lexer that classifies statements and
//! finds what ties a client to one backend connection.

pub mod connection_id;
pub mod kill;
pub mod lexer;
pub mod set;

pub use connection_id::replace_connection_id;
pub use kill::{parse_kill, Kill, KillScope};
pub use lexer::{summarize, target_database, Kind, Quoting, Summary};
pub use set::{parse_set, SetItem};

//! Merging the answers of several partitions into the one result set a single
//! table would give, without I/O: the proxy pushes what each partition sends
//! (its column definitions, its rows, its end) and pops the rows the client
//! gets, and the merger says which partition it must hear from next. Rows stay
//! the backends' packets; only the columns a merge compares are read. The one
//! merge that must hold many rows (ORDER BY over combined groups) holds at most
//! a memory budget and spills the rest to temporary files (`Budget`).

mod aggregate;
mod copy;
mod kept;
mod merger;
mod order;
mod rows;

pub use aggregate::{Arithmetic, Calc, Combine, CompareOp, Having};
pub use copy::{hex_literal, Inserts, INSERT_BYTES};
pub use kept::Budget;
pub use merger::{hidden_name, MergeError, Merger, Next, Place, Reorder, SortKey, Spec};
pub use order::{Collation, Collations};
pub use rows::Encoding;

//! Statement analysis for hscale: from SQL text, session and dictionary
//! snapshot to a `Plan`. Pure logic, no I/O; sqlparser's types never leave it.

pub mod admin;
mod auto;
mod cache;
pub mod collation;
pub mod dictionary;
mod dynamic;
pub mod error;
mod federate;
pub mod hashing;
pub mod kill;
pub mod lexer;
mod literal;
mod load;
mod lock;
mod maintenance;
mod messages;
pub mod own_values;
pub mod plan;
mod rewrite;
mod route;
mod scan;
mod schema;
pub mod set;
mod shape;
mod show;
mod template;
mod transaction;
mod united;

pub use auto::{Generate, Upsert};
pub use cache::{columns_fingerprint, PlanCache};
pub use collation::{Folding, WeightTable};
pub use dictionary::{
    partition_table, AutoColumn, Dictionary, PartitionEntry, PartitionState, PartitionedTable,
    PhysicalId, ReferenceTable, TableDefinition, TableName, Target,
};
pub use dynamic::{Dynamic, Using, XA_FORMAT_ID};
pub use error::PlanError;
pub use federate::{
    drop_temporaries, Column, Federation, Lookup, Reduce, Reference, TableCopy, Temporary, Used,
    MOST_KEYS, MOST_LOOKUP_ROWS,
};
pub use hashing::{ColumnKind, HashError, HashFunction, Value};
pub use kill::{parse_kill, Kill, KillScope};
pub use lexer::{
    placeholders, sql_mode_has, summarize, target_database, with_literals, Kind, Quoting,
    ReadsHint, Summary,
};
pub use load::{Field, Format, Line, Load, Placed};
pub use lock::TableLocks;
pub use messages::{messages_read, Counted, MessagesRead};
pub use own_values::{is_server_variable, replace_own_values, OwnValues};
pub use plan::{
    plan, plan_copies, plan_prepared, Action, ClientCharset, Context, Merge, Plan, Refusal, Route,
    SchemaChange, SchemaEffect, SessionChange, Step,
};
pub use rewrite::{quote_identifier, text_literal};
pub use set::{
    assigns_user_variable, autocommit_after, client_charset_after, parse_set, Autocommit, SetItem,
};
pub use show::{Combine, Elsewhere, Listing, Maintained, NameColumn, Physical, QueryOrder};
pub use template::{Execution, Routing, Run, Template};
pub use transaction::{SavepointOp, TxControl, TxEffect};
pub use united::United;

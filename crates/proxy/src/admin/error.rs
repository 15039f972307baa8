//! What an admin command refuses, apart from the commands themselves: the
//! crate's error type wraps it without depending on them.

use hscale_planner::admin::AdminSyntax;
use hscale_planner::{HashError, TableName};

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("{0}")]
    Syntax(#[from] AdminSyntax),
    #[error("No database selected: name the table as 'db.table' or USE a database")]
    NoDatabase,
    #[error("{table} is not a partitioned table")]
    NotPartitioned { table: TableName },
    #[error("{table} is partitioned already")]
    AlreadyPartitioned { table: TableName },
    #[error("table {table} does not exist on backend {backend}")]
    NoSuchTable { table: TableName, backend: u32 },
    #[error("table {table} has no column `{column}`")]
    NoSuchColumn { table: TableName, column: String },
    #[error("table `{db}`.`{name}` exists already on backend {backend}")]
    TableExists {
        db: String,
        name: String,
        backend: u32,
    },
    #[error("{0}")]
    Hash(#[from] HashError),
    #[error("{0}")]
    Invalid(String),
    #[error("another admin command holds the dictionary lock")]
    Busy,
}

//! Why the planner did not plan a statement the way one of its paths
//! tried: the one error type of the planner's paths, turned into what the
//! client sees in one place (`PlanError::refusal`).

use std::fmt;

use crate::dictionary::TableName;
use crate::plan::Refusal;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanError {
    /// hscale cannot run the statement over partitions, for this reason
    /// (a phrase naming what it cannot run: "UPDATE ... FROM"). A SELECT
    /// may still be answered from copies; anything else is refused.
    Refuse(String),
    /// Not this path's statement: another path plans it (an INSERT placed
    /// row by row, DESCRIBE, statements of other kinds).
    NotHandled,
}

impl PlanError {
    pub fn refuse(reason: impl Into<String>) -> PlanError {
        PlanError::Refuse(reason.into())
    }

    /// The refusal the client gets for a statement on `table`.
    pub fn refusal(self, table: Option<TableName>) -> Refusal {
        Refusal {
            table,
            reason: self.to_string(),
        }
    }
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::Refuse(reason) => f.write_str(reason),
            PlanError::NotHandled => f.write_str("a statement no path of hscale's plans"),
        }
    }
}

impl From<String> for PlanError {
    fn from(reason: String) -> PlanError {
        PlanError::Refuse(reason)
    }
}

impl From<&str> for PlanError {
    fn from(reason: &str) -> PlanError {
        PlanError::Refuse(reason.to_string())
    }
}

//! AUTO_INCREMENT columns of partitioned tables: each partition table would
//! count on its own and hand out the same ids, so hscale hands them out from
//! a sequence in the dictionary. An INSERT that leaves the column to the
//! server (omits it, or gives NULL or 0) is planned in two passes: this one
//! says how many ids it needs and where they go in the text; the proxy takes
//! them and plans the statement again with its ids written in. A prepared
//! INSERT gets a parameter where each id goes, which hscale binds at each
//! execution.

use std::ops::Range;

use crate::dictionary::TableName;
use crate::rewrite::{quote_identifier, Splices};

/// The ids an INSERT needs before it can be routed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generate {
    pub table: TableName,
    /// Rows that get an id, in text order: the first gets the first id.
    pub count: u64,
    fills: Vec<Fill>,
}

/// Where one row's id goes: `at` (a NULL or 0, or an empty range where the
/// value is added) becomes `before` and the id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fill {
    pub at: Range<usize>,
    pub before: String,
    /// Whether this is a row's id (rather than the column list's new name).
    pub id: bool,
}

impl Fill {
    /// A row whose value is replaced by its id.
    pub fn value(at: Range<usize>) -> Fill {
        Fill {
            at,
            before: String::new(),
            id: true,
        }
    }

    /// A row whose id is added at `at`, after `before`.
    pub fn added(at: usize, before: String) -> Fill {
        Fill {
            at: at..at,
            before,
            id: true,
        }
    }

    /// The column's name added to the column list at `at`.
    pub fn column(at: usize, name: &str) -> Fill {
        Fill {
            at: at..at,
            before: format!(", {}", quote_identifier(name)),
            id: false,
        }
    }
}

impl Generate {
    pub(crate) fn new(table: TableName, fills: Vec<Fill>) -> Option<Generate> {
        let count = fills.iter().filter(|f| f.id).count() as u64;
        (count > 0).then_some(Generate {
            table,
            count,
            fills,
        })
    }

    /// The statement with ids `first`, `first + 1`, ... written in.
    pub fn fill(&self, sql: &str, first: u64) -> Option<String> {
        let mut id = first;
        self.fill_with(sql, || {
            id += 1;
            (id - 1).to_string()
        })
    }

    /// A statement being prepared, with a parameter where each id goes; and
    /// the indices those parameters have among all of its parameters, given
    /// where the statement's own `?` are (`params`).
    pub(crate) fn fill_params(&self, sql: &str, params: &[usize]) -> Option<(String, Vec<usize>)> {
        let ids = self
            .fills
            .iter()
            .filter(|f| f.id)
            .enumerate()
            .map(|(k, fill)| params.partition_point(|&p| p < fill.at.start) + k)
            .collect();
        Some((self.fill_with(sql, || "?".into())?, ids))
    }

    fn fill_with(&self, sql: &str, mut id: impl FnMut() -> String) -> Option<String> {
        let mut splices = Splices::default();
        for fill in &self.fills {
            let mut text = fill.before.clone();
            if fill.id {
                text.push_str(&id());
            }
            splices.replace(fill.at.clone(), text);
        }
        splices.apply(sql)
    }
}

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
use crate::hashing::Value;
use crate::rewrite::{quote_identifier, Splices};

/// What an AUTO_INCREMENT column makes of a value given for it, as MariaDB
/// stores it (rounded to an integer): `None` for a value that is not a
/// number, which hscale cannot tell apart from 0.
pub(crate) fn id_value(value: &Value, no_auto_value_on_zero: bool) -> Option<IdValue> {
    let text = match value {
        Value::Null => return Some(IdValue::Generated),
        Value::Number(text) | Value::String(text) => text.trim(),
    };
    let number = match text.parse::<u64>() {
        Ok(id) => id as f64,
        Err(_) => text.parse::<f64>().ok().filter(|n| n.is_finite())?.round(),
    };
    Some(if number == 0.0 && !no_auto_value_on_zero {
        IdValue::Generated
    } else if number > 0.0 {
        // Exact where the text is an integer: f64 loses ids past 2^53.
        IdValue::Given(text.parse::<u64>().unwrap_or(number as u64))
    } else {
        IdValue::Kept
    })
}

/// Why hscale refuses a value of AUTO_INCREMENT column `column` that is not a
/// number, NULL or DEFAULT: it could not tell whether the server would pick
/// the id (from the partition table's own count, which other partitions
/// repeat) or how far to move the sequence.
pub(crate) fn not_an_id(column: &str) -> crate::PlanError {
    crate::PlanError::Refuse(format!(
        "a value of the AUTO_INCREMENT column `{column}` other than a number, NULL or DEFAULT (hscale hands out its ids)"
    ))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdValue {
    /// NULL, or 0 (without sql_mode NO_AUTO_VALUE_ON_ZERO): the server would
    /// pick the id, so hscale gives one instead.
    Generated,
    /// An id the sequence moves past.
    Given(u64),
    /// Stored as it is, below every id the sequence hands out: a negative
    /// number, or 0 under NO_AUTO_VALUE_ON_ZERO.
    Kept,
}

/// The ids an INSERT needs before it can be routed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generate {
    pub table: TableName,
    /// Rows that get an id, in text order: the first gets the first id.
    pub count: u64,
    pub upsert: Option<Upsert>,
    fills: Vec<Fill>,
}

/// A one-row INSERT ... ON DUPLICATE KEY UPDATE. When hscale writes its id
/// in, only the answer tells whether the row went in: the server's OK then
/// carries that id; after an update, the updated row's id (or 0 if nothing
/// changed), and LAST_INSERT_ID() keeps its value unless the update called
/// LAST_INSERT_ID(expr), as `id = LAST_INSERT_ID(id)` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Upsert {
    pub sets_last_insert_id: bool,
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
            upsert: None,
            fills,
        })
    }

    pub(crate) fn with_upsert(self, upsert: Option<Upsert>) -> Generate {
        Generate { upsert, ..self }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_values_rounded_to_integers() {
        let of = |text: &str| id_value(&Value::String(text.into()), false);
        assert_eq!(of("99.5"), Some(IdValue::Given(100)));
        assert_eq!(of(" 7 "), Some(IdValue::Given(7)));
        assert_eq!(of("1e3"), Some(IdValue::Given(1000)));
        assert_eq!(of("18446744073709551615"), Some(IdValue::Given(u64::MAX)));
        assert_eq!(of("0.4"), Some(IdValue::Generated));
        assert_eq!(of("-0.4"), Some(IdValue::Generated));
        assert_eq!(of("-3"), Some(IdValue::Kept));
        assert_eq!(of("abc"), None);
        assert_eq!(of(""), None);
        assert_eq!(id_value(&Value::Null, true), Some(IdValue::Generated));
        assert_eq!(
            id_value(&Value::Number("0".into()), true),
            Some(IdValue::Kept)
        );
    }
}

//! What the applier writes on the destination for the source's row changes.
//! Every change sets a row to its after image (REPLACE) or removes it by
//! its key (DELETE), so applying a change twice, or over a row a later
//! chunk copied, ends where the source ended: the copy and the applier need
//! not agree on where one stops and the other starts, only apply in order.

use std::collections::BTreeMap;

use mysql_common::binlog::value::BinlogValue;

use crate::binlog::{Image, RowChange};
use crate::table::{MovedTable, TextValue};
use crate::MoveError;

/// A statement grows to about this many bytes before the next starts.
const STATEMENT_BYTES: usize = 1 << 20;

/// Which rows of the source's table a move takes (a split takes some).
pub trait RowFilter: Send + Sync {
    /// A row of a binlog image.
    fn takes(&self, row: &[BinlogValue]) -> bool;
    /// A row as the copy reads it.
    fn takes_text(&self, row: &[TextValue]) -> bool;
}

/// A move of a whole table takes every row.
pub struct EveryRow;

impl RowFilter for EveryRow {
    fn takes(&self, _: &[BinlogValue]) -> bool {
        true
    }

    fn takes_text(&self, _: &[TextValue]) -> bool {
        true
    }
}

/// Rows the applier holds before it writes them: a few source transactions'
/// worth.
const PENDING_ROWS: usize = 5000;

/// The changes of a run of source transactions, as where each row ends: the
/// applier writes them in one transaction of its own, where nothing in
/// between is seen, so a row changed ten times is written once. Removals
/// are written first, so that a unique value one row gives up is free for
/// the row that takes it (the rows' last images are the source's state,
/// which its unique keys allow).
#[derive(Default)]
pub struct PendingChanges {
    /// By the row's key condition (`k` = v AND ...): its last image as a
    /// VALUES tuple, or `None` where it was removed.
    rows: BTreeMap<String, Option<String>>,
    bytes: usize,
}

impl PendingChanges {
    /// Takes in one rows event's changes, the rows the filter takes.
    pub fn absorb(
        &mut self,
        table: &MovedTable,
        changes: &[RowChange],
        filter: &dyn RowFilter,
    ) -> Result<(), MoveError> {
        for change in changes {
            match change {
                RowChange::Insert(row) => {
                    if filter.takes(row) {
                        self.replace(table, row)?;
                    }
                }
                RowChange::Delete(row) => {
                    if filter.takes(row) {
                        self.delete(table, row)?;
                    }
                }
                RowChange::Update { before, after } => {
                    let key_changed = table.key.iter().any(|&i| before[i] != after[i]);
                    let (was, is) = (filter.takes(before), filter.takes(after));
                    if was && (key_changed || !is) {
                        self.delete(table, before)?;
                    }
                    if is {
                        self.replace(table, after)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Enough held to write now.
    pub fn is_full(&self) -> bool {
        self.rows.len() >= PENDING_ROWS || self.bytes >= STATEMENT_BYTES
    }

    /// The statements that bring the destination to the rows held (the
    /// removals, then the rows), each about `STATEMENT_BYTES` at most; the
    /// rows are let go.
    pub fn take_statements(&mut self, table: &MovedTable) -> Vec<String> {
        let rows = std::mem::take(&mut self.rows);
        self.bytes = 0;
        let mut statements = Vec::new();
        let removed = rows.iter().filter(|(_, row)| row.is_none());
        let delete = format!("DELETE FROM {} WHERE ", table.destination);
        gather(
            &mut statements,
            &delete,
            " OR ",
            removed.map(|(key, _)| key),
        );
        let replace = format!("REPLACE INTO {} VALUES ", table.destination);
        let written = rows.values().flatten();
        gather(&mut statements, &replace, ", ", written);
        statements
    }

    fn replace(&mut self, table: &MovedTable, row: &Image) -> Result<(), MoveError> {
        let mut values = String::from("(");
        for (i, (column, value)) in table.columns.iter().zip(row).enumerate() {
            if i > 0 {
                values.push_str(", ");
            }
            column.binlog_literal(value, &mut values)?;
        }
        values.push(')');
        let key = key_condition(table, row)?;
        self.hold(key, Some(values));
        Ok(())
    }

    fn delete(&mut self, table: &MovedTable, row: &Image) -> Result<(), MoveError> {
        let key = key_condition(table, row)?;
        self.hold(key, None);
        Ok(())
    }

    /// A row's key condition and where it ends (`None`: removed).
    pub fn hold(&mut self, key: String, row: Option<String>) {
        self.bytes += key.len() + row.as_ref().map_or(0, String::len);
        self.rows.insert(key, row);
    }

    /// About how much it holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Its rows, each as it ends, let go.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = (String, Option<String>)> {
        self.bytes = 0;
        std::mem::take(&mut self.rows).into_iter()
    }
}

/// `(k1 = v1 AND k2 = v2)`: a row's key as a condition.
fn key_condition(table: &MovedTable, row: &Image) -> Result<String, MoveError> {
    let mut condition = String::from("(");
    for (n, &i) in table.key.iter().enumerate() {
        if n > 0 {
            condition.push_str(" AND ");
        }
        let column = &table.columns[i];
        condition.push_str(&crate::ident(&column.name));
        condition.push_str(" = ");
        column.binlog_literal(&row[i], &mut condition)?;
    }
    condition.push(')');
    Ok(condition)
}

/// `head` followed by `items` joined by `separator`, in statements of
/// about `STATEMENT_BYTES` at most.
fn gather<'a>(
    statements: &mut Vec<String>,
    head: &str,
    separator: &str,
    items: impl Iterator<Item = &'a String>,
) {
    let mut current = String::new();
    for item in items {
        if current.is_empty() {
            current.push_str(head);
        } else {
            current.push_str(separator);
        }
        current.push_str(item);
        if current.len() >= STATEMENT_BYTES {
            statements.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        statements.push(current);
    }
}

impl MovedTable {
    /// The statements that make the destination follow `changes` (as the
    /// applier writes them, `PendingChanges`).
    pub fn apply_statements(
        &self,
        changes: &[RowChange],
        filter: &dyn RowFilter,
    ) -> Result<Vec<String>, MoveError> {
        let mut pending = PendingChanges::default();
        pending.absorb(self, changes, filter)?;
        Ok(pending.take_statements(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::columns::Column;
    use mysql_common::value::Value;

    fn table() -> MovedTable {
        MovedTable {
            source: "`d`.`t`".into(),
            destination: "`d`.`t2`".into(),
            columns: vec![
                Column::classify("id", "int", "int(11)", None).unwrap(),
                Column::classify("v", "varchar", "varchar(9)", Some("utf8mb4")).unwrap(),
            ],
            key: vec![0],
        }
    }

    fn row(id: i64, v: &str) -> Image {
        vec![
            BinlogValue::Value(Value::Int(id)),
            BinlogValue::Value(Value::Bytes(v.as_bytes().to_vec())),
        ]
    }

    struct Even;
    impl RowFilter for Even {
        fn takes(&self, row: &[BinlogValue]) -> bool {
            matches!(row[0], BinlogValue::Value(Value::Int(i)) if i % 2 == 0)
        }

        fn takes_text(&self, row: &[TextValue]) -> bool {
            row[0]
                .as_deref()
                .is_some_and(|v| v.ends_with(b"0") || v.ends_with(b"2"))
        }
    }

    #[test]
    fn each_row_is_written_as_it_ends_removals_first() {
        let changes = [
            RowChange::Insert(row(1, "a")),
            RowChange::Insert(row(2, "b")),
            RowChange::Delete(row(1, "a")),
            RowChange::Update {
                before: row(2, "b"),
                after: row(2, "c"),
            },
            RowChange::Update {
                before: row(2, "c"),
                after: row(4, "c"),
            },
        ];
        let sql = table().apply_statements(&changes, &EveryRow).unwrap();
        assert_eq!(
            sql,
            [
                "DELETE FROM `d`.`t2` WHERE (`id` = 1) OR (`id` = 2)",
                "REPLACE INTO `d`.`t2` VALUES (4, _utf8mb4 X'63')",
            ]
        );
    }

    #[test]
    fn a_split_writes_only_the_rows_it_takes_and_removes_those_that_leave() {
        let changes = [
            RowChange::Insert(row(1, "odd")),
            RowChange::Insert(row(2, "even")),
            // Leaves the taken set: removed from the destination.
            RowChange::Update {
                before: row(2, "even"),
                after: row(3, "even"),
            },
            RowChange::Delete(row(5, "odd")),
        ];
        let sql = table().apply_statements(&changes, &Even).unwrap();
        assert_eq!(sql, ["DELETE FROM `d`.`t2` WHERE (`id` = 2)"]);
    }

    #[test]
    fn a_row_removed_and_written_again_is_written_once_as_it_ends() {
        let changes = [
            RowChange::Delete(row(7, "a")),
            RowChange::Insert(row(7, "b")),
            RowChange::Update {
                before: row(7, "b"),
                after: row(7, "c"),
            },
            RowChange::Insert(row(8, "d")),
        ];
        let mut pending = PendingChanges::default();
        let t = table();
        pending.absorb(&t, &changes[..2], &EveryRow).unwrap();
        pending.absorb(&t, &changes[2..], &EveryRow).unwrap();
        assert!(!pending.is_full());
        assert_eq!(
            pending.take_statements(&t),
            ["REPLACE INTO `d`.`t2` VALUES (7, _utf8mb4 X'63'), (8, _utf8mb4 X'64')"]
        );
        assert!(
            pending.take_statements(&t).is_empty(),
            "the rows were let go"
        );
    }
}

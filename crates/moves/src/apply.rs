//! What the applier writes on the destination for the source's row changes.
//! Every change sets a row to its after image (REPLACE) or removes it by
//! its key (DELETE), so applying a change twice, or over a row a later
//! chunk copied, ends where the source ended: the copy and the applier need
//! not agree on where one stops and the other starts, only apply in order.

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

#[derive(PartialEq)]
enum Pending {
    None,
    Replace,
    Delete,
}

/// Builds the destination's statements for a run of changes, in order.
struct Batch<'t> {
    table: &'t MovedTable,
    statements: Vec<String>,
    current: String,
    pending: Pending,
}

impl Batch<'_> {
    fn replace(&mut self, row: &Image) -> Result<(), MoveError> {
        self.switch(Pending::Replace);
        if self.current.is_empty() {
            self.current = format!("REPLACE INTO {} VALUES ", self.table.destination);
        } else {
            self.current.push_str(", ");
        }
        self.current.push('(');
        for (i, (column, value)) in self.table.columns.iter().zip(row).enumerate() {
            if i > 0 {
                self.current.push_str(", ");
            }
            column.binlog_literal(value, &mut self.current)?;
        }
        self.current.push(')');
        self.flush_if_long();
        Ok(())
    }

    fn delete(&mut self, row: &Image) -> Result<(), MoveError> {
        self.switch(Pending::Delete);
        if self.current.is_empty() {
            self.current = format!("DELETE FROM {} WHERE ", self.table.destination);
        } else {
            self.current.push_str(" OR ");
        }
        self.current.push('(');
        for (n, &i) in self.table.key.iter().enumerate() {
            if n > 0 {
                self.current.push_str(" AND ");
            }
            let column = &self.table.columns[i];
            self.current.push_str(&crate::ident(&column.name));
            self.current.push_str(" = ");
            column.binlog_literal(&row[i], &mut self.current)?;
        }
        self.current.push(')');
        self.flush_if_long();
        Ok(())
    }

    /// Changes of one kind share a statement; a change of the other kind
    /// ends it, so that the order between them holds.
    fn switch(&mut self, next: Pending) {
        if self.pending != next {
            self.flush();
            self.pending = next;
        }
    }

    fn flush_if_long(&mut self) {
        if self.current.len() >= STATEMENT_BYTES {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if !self.current.is_empty() {
            self.statements.push(std::mem::take(&mut self.current));
        }
    }
}

impl MovedTable {
    /// The statements that make the destination follow `changes`; a row
    /// the filter does not take is removed if it was there, never written.
    pub fn apply_statements(
        &self,
        changes: &[RowChange],
        filter: &dyn RowFilter,
    ) -> Result<Vec<String>, MoveError> {
        let mut batch = Batch {
            table: self,
            statements: Vec::new(),
            current: String::new(),
            pending: Pending::None,
        };
        for change in changes {
            match change {
                RowChange::Insert(row) => {
                    if filter.takes(row) {
                        batch.replace(row)?;
                    }
                }
                RowChange::Delete(row) => {
                    if filter.takes(row) {
                        batch.delete(row)?;
                    }
                }
                RowChange::Update { before, after } => {
                    let key_changed = self.key.iter().any(|&i| before[i] != after[i]);
                    let (was, is) = (filter.takes(before), filter.takes(after));
                    if was && (key_changed || !is) {
                        batch.delete(before)?;
                    }
                    if is {
                        batch.replace(after)?;
                    }
                }
            }
        }
        batch.flush();
        Ok(batch.statements)
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
    fn changes_keep_their_order_and_share_statements_of_one_kind() {
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
                "REPLACE INTO `d`.`t2` VALUES (1, _utf8mb4 X'61'), (2, _utf8mb4 X'62')",
                "DELETE FROM `d`.`t2` WHERE (`id` = 1)",
                "REPLACE INTO `d`.`t2` VALUES (2, _utf8mb4 X'63')",
                "DELETE FROM `d`.`t2` WHERE (`id` = 2)",
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
        assert_eq!(
            sql,
            [
                "REPLACE INTO `d`.`t2` VALUES (2, _utf8mb4 X'6576656e')",
                "DELETE FROM `d`.`t2` WHERE (`id` = 2)",
            ]
        );
    }
}

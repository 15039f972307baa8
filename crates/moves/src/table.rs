//! A moved table: its columns and key, and the statements that copy it in
//! key order chunks and compare a chunk on both sides.

use hscale_planner::quote_identifier;

use crate::columns::{Column, ValueEncoding};
use crate::MoveError;

/// A value of a text-protocol row (`None`: NULL), as the copy reads them.
pub type TextValue = Option<Vec<u8>>;

#[derive(Debug, Clone)]
pub struct MovedTable {
    /// `db`.`table` where the rows are.
    pub source: String,
    /// `db`.`table` where they go.
    pub destination: String,
    pub columns: Vec<Column>,
    /// Positions in `columns` of the key that orders chunks and names rows.
    pub key: Vec<usize>,
}

/// A chunk's count and checksum on one side. The checksum is an XOR of
/// each row's CRC, so the sums of the parts a split writes add up to the
/// source's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Checksum {
    pub rows: u64,
    pub crc: u64,
}

impl Checksum {
    /// From the row `checksum_query` answers.
    pub fn parse(row: &[TextValue]) -> Option<Checksum> {
        let number = |i: usize| -> Option<u64> {
            std::str::from_utf8(row.get(i)?.as_deref()?)
                .ok()?
                .parse()
                .ok()
        };
        Some(Checksum {
            rows: number(0)?,
            crc: number(1)?,
        })
    }

    /// Both parts together.
    pub fn and(self, other: Checksum) -> Checksum {
        Checksum {
            rows: self.rows + other.rows,
            crc: self.crc ^ other.crc,
        }
    }
}

/// A key comparison: rows after a key, or up to and including one.
#[derive(Clone, Copy)]
enum Side {
    After,
    UpTo,
}

impl MovedTable {
    /// Checks that the key can order and name rows: a float's text does not
    /// name its value.
    pub fn new(
        source: String,
        destination: String,
        columns: Vec<Column>,
        key: Vec<usize>,
    ) -> Result<MovedTable, MoveError> {
        if key.is_empty() {
            return Err(MoveError::NoKey(format!(
                "{source} has neither a primary key nor a unique key of NOT NULL columns"
            )));
        }
        if let Some(float) = key
            .iter()
            .map(|&i| &columns[i])
            .find(|c| c.kind == ValueEncoding::Float)
        {
            return Err(MoveError::Unsupported(format!(
                "{source}'s key has the FLOAT or DOUBLE column `{}`",
                float.name
            )));
        }
        Ok(MovedTable {
            source,
            destination,
            columns,
            key,
        })
    }

    /// The same table read, written to `destination` (`db`.`table`).
    pub fn to(&self, destination: String) -> MovedTable {
        MovedTable {
            destination,
            ..self.clone()
        }
    }

    /// What the copy selects of a column: a FLOAT as the DOUBLE it is
    /// exactly, whose text reads back to the same value (a FLOAT's own text
    /// has six digits).
    fn selected(column: &Column) -> String {
        let name = quote_identifier(&column.name);
        match column.kind {
            ValueEncoding::Float => format!("CAST({name} AS DOUBLE)"),
            _ => name,
        }
    }

    fn key_order(&self) -> String {
        let names: Vec<String> = self
            .key
            .iter()
            .map(|&i| quote_identifier(&self.columns[i].name))
            .collect();
        names.join(", ")
    }

    /// The key of a copied row.
    pub fn key_of(&self, row: &[TextValue]) -> Vec<TextValue> {
        self.key.iter().map(|&i| row[i].clone()).collect()
    }

    /// `(k1 > v1) OR (k1 = v1 AND k2 > v2) ...`, or with `<` and a last `<=`:
    /// written out, so that the server reads it as index ranges.
    fn compare(&self, key: &[TextValue], side: Side) -> String {
        let mut alternatives = Vec::with_capacity(key.len());
        for last in 0..self.key.len() {
            let mut terms = Vec::with_capacity(last + 1);
            for (n, &i) in self.key[..=last].iter().enumerate() {
                let column = &self.columns[i];
                let op = match (n == last, side) {
                    (false, _) => "=",
                    (true, Side::After) => ">",
                    (true, Side::UpTo) if last + 1 == self.key.len() => "<=",
                    (true, Side::UpTo) => "<",
                };
                let mut term = format!("{} {op} ", quote_identifier(&column.name));
                column.text_literal(key[n].as_deref(), &mut term);
                terms.push(term);
            }
            alternatives.push(format!("({})", terms.join(" AND ")));
        }
        format!("({})", alternatives.join(" OR "))
    }

    fn range(&self, after: Option<&[TextValue]>, up_to: Option<&[TextValue]>) -> String {
        let mut conditions = Vec::new();
        if let Some(after) = after {
            conditions.push(self.compare(after, Side::After));
        }
        if let Some(up_to) = up_to {
            conditions.push(self.compare(up_to, Side::UpTo));
        }
        match conditions.is_empty() {
            true => String::new(),
            false => format!(" WHERE {}", conditions.join(" AND ")),
        }
    }

    /// The next chunk of the source: `rows` rows after the key `after`.
    pub fn chunk_query(&self, after: Option<&[TextValue]>, rows: usize) -> String {
        let columns: Vec<String> = self.columns.iter().map(Self::selected).collect();
        format!(
            "SELECT {} FROM {}{} ORDER BY {} LIMIT {rows}",
            columns.join(", "),
            self.source,
            self.range(after, None),
            self.key_order()
        )
    }

    /// Writes copied rows; a row the applier wrote first is replaced by the
    /// copy, which the applier then brings forward again.
    pub fn copy_statement<'r>(
        &self,
        rows: impl IntoIterator<Item = &'r Vec<TextValue>>,
    ) -> Option<String> {
        let mut rows = rows.into_iter().peekable();
        rows.peek()?;
        let mut sql = format!("REPLACE INTO {} VALUES ", self.destination);
        for (r, row) in rows.enumerate() {
            if r > 0 {
                sql.push_str(", ");
            }
            sql.push('(');
            for (i, (column, value)) in self.columns.iter().zip(row).enumerate() {
                if i > 0 {
                    sql.push_str(", ");
                }
                column.text_literal(value.as_deref(), &mut sql);
            }
            sql.push(')');
        }
        Some(sql)
    }

    /// Count and checksum of the rows after `after` up to `up_to`, on the
    /// source or the destination: `(count, checksum)` as one row.
    pub fn checksum_query(
        &self,
        destination: bool,
        after: Option<&[TextValue]>,
        up_to: &[TextValue],
    ) -> String {
        let nulls: Vec<String> = self
            .columns
            .iter()
            .map(|c| format!("ISNULL({})", quote_identifier(&c.name)))
            .collect();
        let values: Vec<String> = self
            .columns
            .iter()
            .map(|c| match c.kind {
                ValueEncoding::Float => Self::selected(c),
                _ => format!("CAST({} AS BINARY)", quote_identifier(&c.name)),
            })
            .collect();
        format!(
            "SELECT COUNT(*), COALESCE(BIT_XOR(CRC32(CONCAT_WS('|', CONCAT({}), {}))), 0) FROM {}{}",
            nulls.join(", "),
            values.join(", "),
            if destination { &self.destination } else { &self.source },
            self.range(after, Some(up_to))
        )
    }

    /// Removes the destination's rows past the last key copied (all of
    /// them, before any): the source had none there when its last chunk
    /// came back empty.
    pub fn clear_after_statement(&self, after: Option<&[TextValue]>) -> String {
        format!(
            "DELETE FROM {}{}",
            self.destination,
            self.range(after, None)
        )
    }

    /// Removes a chunk's rows from the destination, before the chunk is
    /// copied again.
    pub fn clear_statement(&self, after: Option<&[TextValue]>, up_to: &[TextValue]) -> String {
        format!(
            "DELETE FROM {}{}",
            self.destination,
            self.range(after, Some(up_to))
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_column_key() -> MovedTable {
        let columns = vec![
            Column::classify("a", "int", "int(11)", None).unwrap(),
            Column::classify("b", "varchar", "varchar(8)", Some("latin1")).unwrap(),
            Column::classify("f", "float", "float", None).unwrap(),
        ];
        MovedTable::new("`d`.`s`".into(), "`d`.`t`".into(), columns, vec![0, 1]).unwrap()
    }

    #[test]
    fn chunks_follow_the_key_and_read_floats_exactly() {
        let t = two_column_key();
        assert_eq!(
            t.chunk_query(None, 100),
            "SELECT `a`, `b`, CAST(`f` AS DOUBLE) FROM `d`.`s` ORDER BY `a`, `b` LIMIT 100"
        );
        let after = [Some(b"7".to_vec()), Some(b"x".to_vec())];
        assert_eq!(
            t.chunk_query(Some(&after), 2),
            "SELECT `a`, `b`, CAST(`f` AS DOUBLE) FROM `d`.`s` WHERE ((`a` > _binary X'37') OR (`a` = _binary X'37' AND `b` > _latin1 X'78')) ORDER BY `a`, `b` LIMIT 2"
        );
        let up_to = [Some(b"9".to_vec()), Some(b"y".to_vec())];
        assert_eq!(
            t.clear_statement(Some(&after), &up_to),
            "DELETE FROM `d`.`t` WHERE ((`a` > _binary X'37') OR (`a` = _binary X'37' AND `b` > _latin1 X'78')) AND ((`a` < _binary X'39') OR (`a` = _binary X'39' AND `b` <= _latin1 X'79'))"
        );
    }

    #[test]
    fn a_table_without_a_key_or_with_a_float_key_is_refused() {
        let columns = vec![Column::classify("f", "double", "double", None).unwrap()];
        assert!(MovedTable::new("s".into(), "t".into(), columns.clone(), vec![]).is_err());
        assert!(MovedTable::new("s".into(), "t".into(), columns, vec![0]).is_err());
    }
}

//! Rows read from partitions (text protocol), written as INSERTs into the
//! temporary table that stands for their table (`hscale_planner::Temporary`).
//! Every value keeps its bytes: numbers as the digits the server printed,
//! everything else in hex with the character set the server sent it in, so
//! that no value passes through the connection's character set or escaping.

use std::collections::HashSet;

use bytes::Bytes;
use hscale_wire::resultset::text_values;
use mysql_common::collations::{Collation, CollationId};
use mysql_common::constants::ColumnType;
use mysql_common::io::ParseBuf;
use mysql_common::packets::Column;
use mysql_common::proto::MyDeserialize;

use crate::MergeError;

/// How big one INSERT grows before it is sent: well under any server's
/// max_allowed_packet.
pub const INSERT_BYTES: usize = 1 << 20;

/// How one column's values are written.
#[derive(Debug, Clone)]
enum Literal {
    /// Digits as printed (integers, DECIMAL, FLOAT and DOUBLE, YEAR).
    Number,
    /// `_charset X'…'`.
    Hex(String),
}

/// The INSERTs of one copy's rows, a statement at a time.
#[derive(Debug)]
pub struct Inserts {
    head: String,
    literals: Vec<Literal>,
    statement: String,
    rows: u64,
    /// The distinct values of one column, as SQL, while there are few.
    keys: Option<(usize, HashSet<String>)>,
    most_keys: usize,
}

impl Inserts {
    /// `head`: the INSERT up to its first row; `definitions`: the rows'
    /// column definitions; `key`: a column whose distinct values to keep,
    /// up to `most_keys` of them.
    pub fn new(
        head: String,
        definitions: &[Bytes],
        key: Option<usize>,
        most_keys: usize,
    ) -> Result<Inserts, MergeError> {
        let mut literals = Vec::with_capacity(definitions.len());
        for definition in definitions {
            let column = Column::deserialize((), &mut ParseBuf(definition))
                .map_err(|_| MergeError::Malformed("column definition"))?;
            literals.push(literal_of(&column)?);
        }
        Ok(Inserts {
            statement: head.clone(),
            head,
            literals,
            rows: 0,
            keys: key.map(|k| (k, HashSet::new())),
            most_keys,
        })
    }

    /// Adds a row; a full statement once it is big enough to send.
    pub fn row(&mut self, row: &[u8]) -> Result<Option<String>, MergeError> {
        let values = text_values(row, self.literals.len()).ok_or(MergeError::Malformed("row"))?;
        if self.statement.len() > self.head.len() {
            self.statement.push(',');
        }
        self.statement.push('(');
        for (i, (value, literal)) in values.iter().zip(&self.literals).enumerate() {
            if i > 0 {
                self.statement.push(',');
            }
            let start = self.statement.len();
            match value {
                None => self.statement.push_str("NULL"),
                Some(range) => write_literal(literal, &row[range.clone()], &mut self.statement)?,
            }
            if let Some((k, keys)) = &mut self.keys {
                if *k == i && value.is_some() {
                    if keys.len() >= self.most_keys {
                        self.keys = None;
                    } else {
                        keys.insert(self.statement[start..].to_string());
                    }
                }
            }
        }
        self.statement.push(')');
        self.rows += 1;
        Ok((self.statement.len() >= INSERT_BYTES).then(|| self.take()))
    }

    /// The statement of the rows not yet sent, if any.
    pub fn finish(&mut self) -> Option<String> {
        (self.statement.len() > self.head.len()).then(|| self.take())
    }

    fn take(&mut self) -> String {
        std::mem::replace(&mut self.statement, self.head.clone())
    }

    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// The key column's distinct values, as SQL, sorted; `None` when there
    /// were more than allowed (or no key column).
    pub fn keys(&self) -> Option<Vec<String>> {
        let (_, keys) = self.keys.as_ref()?;
        let mut keys: Vec<String> = keys.iter().cloned().collect();
        keys.sort();
        Some(keys)
    }
}

fn literal_of(column: &Column) -> Result<Literal, MergeError> {
    use ColumnType::*;
    Ok(match column.column_type() {
        MYSQL_TYPE_TINY
        | MYSQL_TYPE_SHORT
        | MYSQL_TYPE_LONG
        | MYSQL_TYPE_INT24
        | MYSQL_TYPE_LONGLONG
        | MYSQL_TYPE_DECIMAL
        | MYSQL_TYPE_NEWDECIMAL
        | MYSQL_TYPE_FLOAT
        | MYSQL_TYPE_DOUBLE
        | MYSQL_TYPE_YEAR => Literal::Number,
        _ => {
            let id = column.character_set();
            let collation = Collation::resolve(CollationId::from(id));
            let charset = match (id, collation.charset()) {
                (63, _) => "binary",
                (_, "" | "unknown") => {
                    return Err(MergeError::Malformed("a column's character set"))
                }
                // MySQL's name for what MariaDB 10.11 also calls utf8mb3.
                (_, "utf8") => "utf8mb3",
                (_, known) => known,
            };
            Literal::Hex(charset.to_string())
        }
    })
}

fn write_literal(literal: &Literal, value: &[u8], out: &mut String) -> Result<(), MergeError> {
    match literal {
        Literal::Number => {
            let digits = value
                .iter()
                .all(|b| b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E'));
            let text = std::str::from_utf8(value).ok().filter(|_| digits);
            match text {
                // inf and nan are not numbers MariaDB stores; neither prints them.
                Some(text) if !text.is_empty() => out.push_str(text),
                _ => return Err(MergeError::Malformed("a number")),
            }
        }
        Literal::Hex(charset) => hex_literal(charset, value, out),
    }
    Ok(())
}

/// `_charset X'…'`: the bytes, in the character set, coercible to the
/// collation of the column they are compared with or stored in, and read
/// the same under every sql_mode and connection character set.
pub fn hex_literal(charset: &str, bytes: &[u8], out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.reserve(bytes.len() * 2 + charset.len() + 5);
    out.push('_');
    out.push_str(charset);
    out.push_str(" X'");
    for b in bytes {
        out.push(HEX[usize::from(b >> 4)] as char);
        out.push(HEX[usize::from(b & 15)] as char);
    }
    out.push('\'');
}

#[cfg(test)]
mod tests {
    use super::*;
    use hscale_wire::resultset::write_text_row;

    /// A ColumnDefinition41 packet.
    fn definition(kind: ColumnType, charset: u16) -> Bytes {
        let mut out = Vec::new();
        for part in ["def", "d", "t", "t_p1", "c", "c"] {
            out.push(part.len() as u8);
            out.extend_from_slice(part.as_bytes());
        }
        out.push(0x0c);
        out.extend_from_slice(&charset.to_le_bytes());
        out.extend_from_slice(&255u32.to_le_bytes());
        out.push(kind as u8);
        out.extend_from_slice(&[0, 0, 0, 0, 0]);
        out.into()
    }

    fn row(values: &[Option<&[u8]>]) -> Vec<u8> {
        let mut out = Vec::new();
        write_text_row(values, &mut out);
        out
    }

    #[test]
    fn values_keep_their_bytes_and_character_sets_and_keys_stay_few() {
        let definitions = [
            definition(ColumnType::MYSQL_TYPE_LONG, 63),
            definition(ColumnType::MYSQL_TYPE_VAR_STRING, 45),
            definition(ColumnType::MYSQL_TYPE_BLOB, 63),
        ];
        let mut inserts =
            Inserts::new("INSERT INTO t VALUES ".into(), &definitions, Some(0), 2).unwrap();
        assert_eq!(
            inserts
                .row(&row(&[Some(b"-7"), Some("é'".as_bytes()), None]))
                .unwrap(),
            None
        );
        inserts.row(&row(&[Some(b"8"), None, Some(b"\0")])).unwrap();
        assert_eq!(inserts.keys(), Some(vec!["-7".into(), "8".into()]));
        assert_eq!(
            inserts.finish().unwrap(),
            "INSERT INTO t VALUES (-7,_utf8mb4 X'c3a927',NULL),(8,NULL,_binary X'00')"
        );
        assert_eq!(inserts.finish(), None);
        inserts.row(&row(&[Some(b"9"), None, None])).unwrap();
        assert_eq!(inserts.keys(), None, "a third key is past the two allowed");
        assert_eq!(inserts.rows(), 3);
        assert!(inserts.row(&row(&[Some(b"1;"), None, None])).is_err());
    }
}

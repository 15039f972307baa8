//! Which rows a split takes: those whose partition value, as the router
//! computes it from the partition column, is one of the split's values;
//! the rest stay. The copy reads the column as the text protocol sends it,
//! the applier as a binlog row image holds it: both are brought to the same
//! text in the column's character set, then to the value the router hashes,
//! so that a row lands where the router will look for it.

use std::borrow::Cow;

use hscale_planner::{ColumnKind as RoutedKind, Folding, HashFunction, Value as Routed};
use mysql_common::binlog::value::BinlogValue;
use mysql_common::value::Value;

use crate::apply::RowFilter;
use crate::columns::{Column, ValueEncoding};
use crate::table::TextValue;
use crate::MoveError;

/// How the router maps the partition column's values.
#[derive(Debug, Clone)]
pub struct Routing {
    pub function: HashFunction,
    pub kind: RoutedKind,
    pub folding: Folding,
}

/// Rows whose partition value is (`inside`) or is not one of `values`.
#[derive(Debug, Clone)]
pub struct ValuesFilter {
    position: usize,
    column: Column,
    routing: Routing,
    values: Vec<String>,
    inside: bool,
}

/// A string column's character set, as far as a split reads it.
fn readable_charset(charset: &str) -> bool {
    matches!(
        charset,
        "utf8mb4" | "utf8mb3" | "utf8" | "ascii" | "latin1" | "binary"
    )
}

impl ValuesFilter {
    /// The rows of `values`, of the column `name` among `columns`; refuses
    /// a column whose stored form the router does not hash as it is
    /// (TIMESTAMP follows the session's time zone, ENUM and SET are indexes
    /// in the binlog, BIT is bytes in text).
    pub fn new(
        columns: &[Column],
        name: &str,
        routing: Routing,
        values: Vec<String>,
    ) -> Result<ValuesFilter, MoveError> {
        let position = columns
            .iter()
            .position(|c| c.name.eq_ignore_ascii_case(name))
            .ok_or_else(|| MoveError::Unsupported(format!("no partition column `{name}`")))?;
        let column = columns[position].clone();
        let readable = match &column.kind {
            ValueEncoding::Integer { .. } | ValueEncoding::Decimal | ValueEncoding::Year => true,
            ValueEncoding::Temporal => true,
            ValueEncoding::Text { charset } => readable_charset(charset),
            ValueEncoding::Bytes => routing.kind != RoutedKind::Integer,
            ValueEncoding::Float
            | ValueEncoding::Timestamp
            | ValueEncoding::Enum { .. }
            | ValueEncoding::Set { .. } => false,
        };
        if !readable {
            return Err(MoveError::Unsupported(format!(
                "a split cannot read the partition column `{name}` ({:?}) as the router hashes it",
                column.kind
            )));
        }
        Ok(ValuesFilter {
            position,
            column,
            routing,
            values,
            inside: true,
        })
    }

    /// The rows this filter leaves.
    pub fn rest(&self) -> ValuesFilter {
        ValuesFilter {
            inside: !self.inside,
            ..self.clone()
        }
    }

    /// Whether a row whose partition column holds `text` (the column's
    /// text form in its character set; `None`: NULL) belongs here. A value
    /// the function cannot map (NULL) stays where the router sends it: in
    /// the partition that is split.
    fn takes_value(&self, text: Option<&[u8]>) -> bool {
        let value = match text {
            None => Routed::Null,
            Some(bytes) => {
                let text = self.unicode(bytes);
                match self.routing.kind {
                    RoutedKind::Integer | RoutedKind::Decimal => Routed::Number(text),
                    _ => Routed::String(text),
                }
            }
        };
        let hit = self
            .routing
            .function
            .apply(self.routing.kind, &self.routing.folding, &value)
            .is_ok_and(|p| self.values.iter().any(|v| *v == *p));
        hit == self.inside
    }

    /// The column's bytes as the text a client would have sent.
    fn unicode<'b>(&self, bytes: &'b [u8]) -> Cow<'b, str> {
        match &self.column.kind {
            ValueEncoding::Text { charset } if charset == "latin1" => {
                Cow::Owned(bytes.iter().map(|&b| latin1(b)).collect())
            }
            _ => String::from_utf8_lossy(bytes),
        }
    }
}

impl RowFilter for ValuesFilter {
    fn takes(&self, row: &[BinlogValue]) -> bool {
        let text = text_form(&self.column, &row[self.position]);
        self.takes_value(text.as_deref())
    }

    fn takes_text(&self, row: &[TextValue]) -> bool {
        self.takes_value(row[self.position].as_deref())
    }
}

/// A binlog value as the text protocol sends it (in the column's character
/// set), for the kinds `ValuesFilter::new` lets through.
fn text_form(column: &Column, value: &BinlogValue) -> Option<Vec<u8>> {
    let BinlogValue::Value(value) = value else {
        return None;
    };
    Some(match (value, &column.kind) {
        (Value::NULL, _) => return None,
        (Value::Int(i), ValueEncoding::Integer { unsigned_bytes }) => {
            let wrapped = match unsigned_bytes {
                Some(bytes) if *i < 0 => i128::from(*i) + (1i128 << (8 * u32::from(*bytes))),
                _ => i128::from(*i),
            };
            wrapped.to_string().into_bytes()
        }
        (Value::Int(i), _) => i.to_string().into_bytes(),
        (Value::UInt(u), _) => u.to_string().into_bytes(),
        (Value::Date(y, m, d, h, mi, s, us), _) => {
            format!("{y:04}-{m:02}-{d:02} {h:02}:{mi:02}:{s:02}.{us:06}").into_bytes()
        }
        (Value::Bytes(b), ValueEncoding::Year) if b == b"1900" => b"0".to_vec(),
        (Value::Bytes(b), _) => b.clone(),
        (other, _) => format!("{other:?}").into_bytes(),
    })
}

/// MariaDB's latin1 (cp1252, with its five holes kept as C1 controls).
fn latin1(byte: u8) -> char {
    const HIGH: [u16; 32] = [
        0x20AC, 0x0081, 0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021, 0x02C6, 0x2030, 0x0160,
        0x2039, 0x0152, 0x008D, 0x017D, 0x008F, 0x0090, 0x2018, 0x2019, 0x201C, 0x201D, 0x2022,
        0x2013, 0x2014, 0x02DC, 0x2122, 0x0161, 0x203A, 0x0153, 0x009D, 0x017E, 0x0178,
    ];
    match byte {
        0x80..=0x9F => char::from_u32(u32::from(HIGH[usize::from(byte - 0x80)])).unwrap_or('?'),
        _ => char::from(byte),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn columns() -> Vec<Column> {
        vec![
            Column::classify("id", "bigint", "bigint(20) unsigned", None).unwrap(),
            Column::classify("nick", "varchar", "varchar(20)", Some("latin1")).unwrap(),
            Column::classify("day", "date", "date", None).unwrap(),
        ]
    }

    fn filter(name: &str, function: &str, kind: RoutedKind, values: &[&str]) -> ValuesFilter {
        let routing = Routing {
            function: HashFunction::parse(function).unwrap(),
            kind,
            folding: Folding::Legacy,
        };
        let values = values.iter().map(|v| v.to_string()).collect();
        ValuesFilter::new(&columns(), name, routing, values).unwrap()
    }

    fn binlog_row(id: i64, nick: &[u8], day: (u16, u8, u8)) -> Vec<BinlogValue<'static>> {
        vec![
            BinlogValue::Value(Value::Int(id)),
            BinlogValue::Value(Value::Bytes(nick.to_vec())),
            BinlogValue::Value(Value::Date(day.0, day.1, day.2, 0, 0, 0, 0)),
        ]
    }

    fn text_row(id: &str, nick: &[u8], day: &str) -> Vec<TextValue> {
        vec![
            Some(id.as_bytes().to_vec()),
            Some(nick.to_vec()),
            Some(day.as_bytes().to_vec()),
        ]
    }

    #[test]
    fn both_forms_of_a_row_land_on_the_same_side() {
        let odd = filter("id", "MOD(2)", RoutedKind::Integer, &["1"]);
        // u64::MAX is odd; the binlog carries it as -1.
        assert!(odd.takes(&binlog_row(-1, b"x", (2024, 1, 5))));
        assert!(odd.takes_text(&text_row("18446744073709551615", b"x", "2024-01-05")));
        assert!(!odd.takes(&binlog_row(-2, b"x", (2024, 1, 5))));
        assert!(odd.rest().takes(&binlog_row(-2, b"x", (2024, 1, 5))));
        assert!(!odd.rest().takes_text(&text_row("3", b"x", "2024-01-05")));

        // latin1 0xFC is 'ü', which the legacy folding makes 'u'.
        let nick = filter("nick", "PREFIX(2)", RoutedKind::Text, &["mu"]);
        assert!(nick.takes(&binlog_row(1, b"M\xfcller", (2024, 1, 5))));
        assert!(nick.takes_text(&text_row("1", b"M\xfcller", "2024-01-05")));
        assert!(!nick.takes_text(&text_row("1", b"Ma", "2024-01-05")));

        let month = filter("day", "DATE('%Y%m')", RoutedKind::Temporal, &["202401"]);
        assert!(month.takes(&binlog_row(1, b"x", (2024, 1, 31))));
        assert!(month.takes_text(&text_row("1", b"x", "2024-01-31")));
        assert!(!month.takes(&binlog_row(1, b"x", (2024, 2, 1))));
    }

    #[test]
    fn null_stays_in_the_partition_that_is_split() {
        let odd = filter("id", "MOD(2)", RoutedKind::Integer, &["1"]);
        let mut row = text_row("1", b"x", "2024-01-05");
        row[0] = None;
        assert!(!odd.takes_text(&row));
        assert!(odd.rest().takes_text(&row));
    }

    #[test]
    fn columns_the_router_does_not_hash_as_stored_are_refused() {
        let columns = vec![
            Column::classify("ts", "timestamp", "timestamp", None).unwrap(),
            Column::classify("e", "enum", "enum('a','b')", Some("utf8mb4")).unwrap(),
            Column::classify("g", "varchar", "varchar(9)", Some("sjis")).unwrap(),
        ];
        for name in ["ts", "e", "g"] {
            let routing = Routing {
                function: HashFunction::None,
                kind: RoutedKind::Text,
                folding: Folding::Legacy,
            };
            assert!(ValuesFilter::new(&columns, name, routing, vec!["a".into()]).is_err());
        }
    }

    #[test]
    fn latin1_decodes_as_mariadb_reads_it() {
        assert_eq!(latin1(0x80), '€');
        assert_eq!(latin1(0x81), '\u{81}');
        assert_eq!(latin1(0xE9), 'é');
        assert_eq!(latin1(b'a'), 'a');
    }
}

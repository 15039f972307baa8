//! A moved table's columns and how each value is written back in SQL, from
//! the two forms a move reads rows in: the text protocol (the copy) and
//! binlog row images (the applier). Every literal names its bytes in hex,
//! so no value goes through the connection's character set, and strings
//! carry their column's character set, so that a key compares by the
//! column's own collation and its index serves.

use hscale_merge::hex_literal;
use mysql_common::binlog::value::BinlogValue;
use mysql_common::value::Value;

use crate::MoveError;

/// How a column's values are written back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueEncoding {
    /// An integer; `unsigned_bytes` where it is unsigned (the binlog
    /// carries it signed unless the server logs signedness).
    Integer { unsigned_bytes: Option<u8> },
    /// FLOAT and DOUBLE: the binlog's value is exact; text is not read.
    Float,
    /// DECIMAL: digits as text.
    Decimal,
    /// DATE, DATETIME, TIME.
    Temporal,
    /// TIMESTAMP: seconds since the epoch in the binlog, the session's
    /// time zone in text (a move's connections use UTC).
    Timestamp,
    /// YEAR: the binlog says 1900 for the year 0000.
    Year,
    /// A string in a character set (CHAR, VARCHAR, TEXT, ENUM's names).
    Text { charset: String },
    /// ENUM: its index in the binlog, its name in text.
    Enum { charset: String },
    /// SET: a bitmap in the binlog, its names in text.
    Set { charset: String },
    /// Bytes as they are: BINARY, BLOB, BIT, geometry, INET6, UUID.
    Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    pub kind: ValueEncoding,
}

impl Column {
    /// From information_schema.COLUMNS: DATA_TYPE, COLUMN_TYPE and
    /// CHARACTER_SET_NAME.
    pub fn classify(
        name: &str,
        data_type: &str,
        column_type: &str,
        charset: Option<&str>,
    ) -> Result<Column, MoveError> {
        let unsigned = column_type.to_ascii_lowercase().contains("unsigned");
        let integer = |bytes: u8| ValueEncoding::Integer {
            unsigned_bytes: unsigned.then_some(bytes),
        };
        let text = |charset: Option<&str>| charset.unwrap_or("binary").to_string();
        let kind = match data_type.to_ascii_lowercase().as_str() {
            "tinyint" => integer(1),
            "smallint" => integer(2),
            "mediumint" => integer(3),
            "int" => integer(4),
            "bigint" => integer(8),
            "float" | "double" => ValueEncoding::Float,
            "decimal" => ValueEncoding::Decimal,
            "date" | "datetime" | "time" => ValueEncoding::Temporal,
            "timestamp" => ValueEncoding::Timestamp,
            "year" => ValueEncoding::Year,
            "enum" => ValueEncoding::Enum {
                charset: text(charset),
            },
            "set" => ValueEncoding::Set {
                charset: text(charset),
            },
            "char" | "varchar" | "tinytext" | "text" | "mediumtext" | "longtext" | "json" => {
                match charset {
                    Some(cs) if cs != "binary" => ValueEncoding::Text {
                        charset: cs.to_string(),
                    },
                    _ => ValueEncoding::Bytes,
                }
            }
            "binary" | "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob" | "bit"
            | "geometry" | "point" | "linestring" | "polygon" | "multipoint"
            | "multilinestring" | "multipolygon" | "geometrycollection" | "inet6" | "inet4"
            | "uuid" => ValueEncoding::Bytes,
            other => {
                return Err(MoveError::Unsupported(format!(
                    "column `{name}` is of type {other}, which a move cannot copy"
                )))
            }
        };
        Ok(Column {
            name: name.to_string(),
            kind,
        })
    }

    /// A value as the text protocol sent it (`None`: NULL), as SQL.
    pub fn text_literal(&self, value: Option<&[u8]>, out: &mut String) {
        let Some(bytes) = value else {
            out.push_str("NULL");
            return;
        };
        match &self.kind {
            ValueEncoding::Text { charset }
            | ValueEncoding::Enum { charset }
            | ValueEncoding::Set { charset } => hex_literal(charset, bytes, out),
            // Numbers, dates and times as their text, which the column
            // reads back as it printed it.
            _ => hex_literal("binary", bytes, out),
        }
    }

    /// A value of a binlog row image, as SQL.
    pub fn binlog_literal(&self, value: &BinlogValue, out: &mut String) -> Result<(), MoveError> {
        let value = match value {
            BinlogValue::Value(v) => v,
            _ => {
                return Err(MoveError::Unsupported(format!(
                    "column `{}` holds MySQL's binary JSON, which a move cannot apply",
                    self.name
                )))
            }
        };
        use std::fmt::Write;
        match (value, &self.kind) {
            (Value::NULL, _) => out.push_str("NULL"),
            (Value::Int(i), ValueEncoding::Integer { unsigned_bytes }) => {
                let wrapped = match unsigned_bytes {
                    Some(bytes) if *i < 0 => i128::from(*i) + (1i128 << (8 * u32::from(*bytes))),
                    _ => i128::from(*i),
                };
                let _ = write!(out, "{wrapped}");
            }
            (Value::Int(seconds), ValueEncoding::Timestamp) => {
                timestamp(&seconds.to_string(), out)?;
            }
            (Value::Int(i), _) => {
                let _ = write!(out, "{i}");
            }
            (Value::UInt(u), _) => {
                let _ = write!(out, "{u}");
            }
            // Debug prints the shortest text that reads back as the same
            // number.
            (Value::Float(f), _) => {
                let _ = write!(out, "{f:?}");
            }
            (Value::Double(d), _) => {
                let _ = write!(out, "{d:?}");
            }
            (Value::Date(y, m, d, h, mi, s, us), _) => {
                let _ = write!(out, "'{y:04}-{m:02}-{d:02} {h:02}:{mi:02}:{s:02}.{us:06}'");
            }
            (Value::Time(negative, days, h, m, s, us), _) => {
                let hours = u64::from(*days) * 24 + u64::from(*h);
                let sign = if *negative { "-" } else { "" };
                let _ = write!(out, "'{sign}{hours}:{m:02}:{s:02}.{us:06}'");
            }
            (Value::Bytes(b), ValueEncoding::Timestamp) => {
                timestamp(std::str::from_utf8(b).unwrap_or_default(), out)?;
            }
            (Value::Bytes(b), ValueEncoding::Year) => match b.as_slice() {
                b"1900" => out.push('0'),
                digits => ascii_number(&self.name, digits, out)?,
            },
            (Value::Bytes(b), ValueEncoding::Decimal) => ascii_number(&self.name, b, out)?,
            (Value::Bytes(b), ValueEncoding::Set { .. }) => {
                let bits = b
                    .iter()
                    .rev()
                    .fold(0u64, |bits, byte| (bits << 8) | u64::from(*byte));
                let _ = write!(out, "{bits}");
            }
            (Value::Bytes(b), ValueEncoding::Text { charset }) => hex_literal(charset, b, out),
            (Value::Bytes(b), _) => hex_literal("binary", b, out),
        }
        Ok(())
    }
}

fn ascii_number(column: &str, digits: &[u8], out: &mut String) -> Result<(), MoveError> {
    match std::str::from_utf8(digits) {
        Ok(text)
            if !text.is_empty()
                && text
                    .bytes()
                    .all(|b| b.is_ascii_digit() || b == b'-' || b == b'.') =>
        {
            out.push_str(text);
            Ok(())
        }
        _ => Err(MoveError::Unsupported(format!(
            "column `{column}`: the binlog holds {digits:?}, not a number"
        ))),
    }
}

/// A TIMESTAMP from its seconds since the epoch (`secs[.micros]`); the
/// zero timestamp is the zero date, not the epoch.
fn timestamp(seconds: &str, out: &mut String) -> Result<(), MoveError> {
    if seconds
        .trim_start_matches('0')
        .trim_start_matches('.')
        .trim_matches('0')
        .is_empty()
    {
        out.push_str("'0000-00-00 00:00:00'");
        return Ok(());
    }
    if !seconds.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(MoveError::Unsupported(format!(
            "a TIMESTAMP of {seconds:?} seconds"
        )));
    }
    out.push_str("FROM_UNIXTIME(");
    out.push_str(seconds);
    out.push(')');
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn column(data_type: &str, column_type: &str, charset: Option<&str>) -> Column {
        Column::classify("c", data_type, column_type, charset).unwrap()
    }

    fn binlog(column: &Column, value: Value) -> String {
        let mut out = String::new();
        column
            .binlog_literal(&BinlogValue::Value(value), &mut out)
            .unwrap();
        out
    }

    #[test]
    fn unsigned_integers_the_binlog_carries_signed_are_written_unsigned() {
        let big = column("bigint", "bigint(20) unsigned", None);
        assert_eq!(binlog(&big, Value::Int(-1)), "18446744073709551615");
        let tiny = column("tinyint", "tinyint(3) unsigned", None);
        assert_eq!(binlog(&tiny, Value::Int(-56)), "200");
        let signed = column("int", "int(11)", None);
        assert_eq!(binlog(&signed, Value::Int(-56)), "-56");
    }

    #[test]
    fn temporal_values_keep_their_fraction_and_the_zero_dates() {
        let ts = column("timestamp", "timestamp(6)", None);
        assert_eq!(
            binlog(&ts, Value::Bytes(b"1700000000.000123".to_vec())),
            "FROM_UNIXTIME(1700000000.000123)"
        );
        assert_eq!(
            binlog(&ts, Value::Bytes(b"0".to_vec())),
            "'0000-00-00 00:00:00'"
        );
        assert_eq!(binlog(&ts, Value::Int(0)), "'0000-00-00 00:00:00'");
        let dt = column("datetime", "datetime(6)", None);
        assert_eq!(
            binlog(&dt, Value::Date(2024, 2, 29, 23, 59, 58, 7)),
            "'2024-02-29 23:59:58.000007'"
        );
        let time = column("time", "time", None);
        assert_eq!(
            binlog(&time, Value::Time(true, 34, 22, 59, 59, 0)),
            "'-838:59:59.000000'"
        );
        let year = column("year", "year(4)", None);
        assert_eq!(binlog(&year, Value::Bytes(b"1900".to_vec())), "0");
        assert_eq!(binlog(&year, Value::Bytes(b"2155".to_vec())), "2155");
    }

    #[test]
    fn strings_keep_their_bytes_and_character_set() {
        let text = column("varchar", "varchar(10)", Some("latin1"));
        assert_eq!(
            binlog(&text, Value::Bytes(vec![0xfc, b'x'])),
            "_latin1 X'fc78'"
        );
        let blob = column("blob", "blob", None);
        assert_eq!(
            binlog(&blob, Value::Bytes(vec![0, 0xff])),
            "_binary X'00ff'"
        );
        let set = column("set", "set('a','b','c')", Some("utf8mb4"));
        assert_eq!(binlog(&set, Value::Bytes(vec![5])), "5");
        let mut out = String::new();
        text.text_literal(None, &mut out);
        assert_eq!(out, "NULL");
    }

    #[test]
    fn a_decimal_that_is_not_digits_is_refused_not_written() {
        let dec = column("decimal", "decimal(10,2)", None);
        assert_eq!(binlog(&dec, Value::Bytes(b"-12.50".to_vec())), "-12.50");
        let mut out = String::new();
        assert!(dec
            .binlog_literal(
                &BinlogValue::Value(Value::Bytes(b"1);DROP".to_vec())),
                &mut out
            )
            .is_err());
        assert!(Column::classify("c", "vector", "vector(3)", None).is_err());
    }
}

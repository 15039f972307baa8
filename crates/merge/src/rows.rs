//! Rows as the backends encode them: the text protocol (answers to
//! COM_QUERY) or the binary one (COM_STMT_EXECUTE). The merger reads values
//! in place, cuts hidden columns off and writes the rows it combines, in the
//! encoding the client asked for.

use std::ops::Range;

use hscale_wire::frame::{read_lenenc, write_lenenc};
use hscale_wire::resultset::{text_values, visible_prefix, write_text_row};
use mysql_common::constants::ColumnType;
use mysql_common::packets::Column;
use smallvec::SmallVec;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoding {
    #[default]
    Text,
    Binary,
}

/// Where each value of a row lies: its payload (`None`: NULL), and, binary,
/// where its encoding starts.
pub(crate) struct RowValues {
    pub values: SmallVec<[Option<Range<usize>>; 8]>,
    starts: SmallVec<[usize; 8]>,
}

/// How a binary row encodes a column's value.
enum Width {
    Fixed(usize),
    /// One length byte (DATE, DATETIME, TIMESTAMP, TIME).
    Short,
    Lenenc,
}

fn width(column: &Column) -> Width {
    use ColumnType::*;
    match column.column_type() {
        MYSQL_TYPE_TINY => Width::Fixed(1),
        MYSQL_TYPE_SHORT | MYSQL_TYPE_YEAR => Width::Fixed(2),
        MYSQL_TYPE_INT24 | MYSQL_TYPE_LONG | MYSQL_TYPE_FLOAT => Width::Fixed(4),
        MYSQL_TYPE_LONGLONG | MYSQL_TYPE_DOUBLE => Width::Fixed(8),
        MYSQL_TYPE_DATE
        | MYSQL_TYPE_NEWDATE
        | MYSQL_TYPE_DATETIME
        | MYSQL_TYPE_DATETIME2
        | MYSQL_TYPE_TIMESTAMP
        | MYSQL_TYPE_TIMESTAMP2
        | MYSQL_TYPE_TIME
        | MYSQL_TYPE_TIME2 => Width::Short,
        _ => Width::Lenenc,
    }
}

/// The NULL bitmap of a binary row: after the 0x00 header, two bits offset.
fn bitmap_len(columns: usize) -> usize {
    (columns + 7 + 2) / 8
}

pub(crate) fn values(row: &[u8], columns: &[Column], encoding: Encoding) -> Option<RowValues> {
    match encoding {
        Encoding::Text => Some(RowValues {
            values: text_values(row, columns.len())?,
            starts: SmallVec::new(),
        }),
        Encoding::Binary => {
            let bitmap = row.get(1..1 + bitmap_len(columns.len()))?;
            let mut at = 1 + bitmap.len();
            let mut values = SmallVec::with_capacity(columns.len());
            let mut starts = SmallVec::with_capacity(columns.len());
            for (i, column) in columns.iter().enumerate() {
                starts.push(at);
                let bit = i + 2;
                if bitmap[bit / 8] & (1 << (bit % 8)) != 0 {
                    values.push(None);
                    continue;
                }
                let (start, len) = match width(column) {
                    Width::Fixed(n) => (at, n),
                    Width::Short => (at + 1, usize::from(*row.get(at)?)),
                    Width::Lenenc => {
                        let (len, n) = read_lenenc(row.get(at..)?)?;
                        (at + n, usize::try_from(len).ok()?)
                    }
                };
                let end = start.checked_add(len)?;
                if end > row.len() {
                    return None;
                }
                values.push(Some(start..end));
                at = end;
            }
            Some(RowValues { values, starts })
        }
    }
}

/// The row without its last `hidden` columns.
pub(crate) fn without_hidden(
    row: &bytes::Bytes,
    columns: &[Column],
    hidden: usize,
    encoding: Encoding,
) -> Option<bytes::Bytes> {
    let visible = columns.len() - hidden;
    match encoding {
        Encoding::Text => Some(row.slice(..visible_prefix(row, visible)?)),
        Encoding::Binary => {
            let parsed = values(row, columns, encoding)?;
            let old_bitmap = &row[1..1 + bitmap_len(columns.len())];
            let end = parsed.starts.get(visible).copied().unwrap_or(row.len());
            let mut out = Vec::with_capacity(end);
            out.push(0);
            let mut bitmap = vec![0u8; bitmap_len(visible)];
            bitmap.copy_from_slice(&old_bitmap[..bitmap_len(visible)]);
            // Bits of hidden columns sharing the last byte are cleared.
            for bit in visible + 2..bitmap.len() * 8 {
                bitmap[bit / 8] &= !(1 << (bit % 8));
            }
            out.extend_from_slice(&bitmap);
            let first_value = 1 + old_bitmap.len();
            out.extend_from_slice(row.get(first_value..end)?);
            Some(out.into())
        }
    }
}

/// A row of these values (payloads, `None`: NULL) for these columns.
pub(crate) fn write_row(
    values: &[Option<Vec<u8>>],
    columns: &[Column],
    encoding: Encoding,
) -> Vec<u8> {
    let mut out = Vec::new();
    match encoding {
        Encoding::Text => write_text_row(values, &mut out),
        Encoding::Binary => {
            out.push(0);
            let mut bitmap = vec![0u8; bitmap_len(values.len())];
            for (i, value) in values.iter().enumerate() {
                if value.is_none() {
                    let bit = i + 2;
                    bitmap[bit / 8] |= 1 << (bit % 8);
                }
            }
            out.extend_from_slice(&bitmap);
            for (value, column) in values.iter().zip(columns) {
                let Some(value) = value else { continue };
                match width(column) {
                    Width::Fixed(_) => {}
                    Width::Short => out.push(value.len() as u8),
                    Width::Lenenc => write_lenenc(value.len() as u64, &mut out),
                }
                out.extend_from_slice(value);
            }
        }
    }
    out
}

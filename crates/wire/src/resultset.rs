//! Text-protocol result sets that hscale reads or writes itself: the rows of
//! its own queries (dictionary, admin commands) and the answers of admin
//! commands. Forwarded results never come through here.

use std::ops::Range;

use smallvec::SmallVec;

use crate::frame::{read_lenenc, write_lenenc};
use crate::packets::{write_result_end, EOF_HEADER};

/// utf8mb3_general_ci: admin answers are plain text.
const UTF8_GENERAL_CI: u16 = 33;
const MYSQL_TYPE_VAR_STRING: u8 = 0xfd;
const MYSQL_TYPE_LONGLONG: u8 = 0x08;
const NOT_NULL_FLAG: u16 = 1;
const BINARY_COLLATION: u16 = 63;
const BINARY_FLAG: u16 = 128;

/// A column of a result set hscale writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnType {
    Text,
    Integer,
    /// A session's count as MariaDB types `@@warning_count`: BIGINT
    /// UNSIGNED, nullable.
    Count,
}

/// One value of a text-protocol row: `None` is NULL.
pub type TextValue = Option<Vec<u8>>;

/// NULL in a text-protocol row.
const NULL_VALUE: u8 = 0xfb;

/// The values of a text-protocol row packet, `columns` of them.
pub fn parse_text_row(payload: &[u8], columns: usize) -> Option<Vec<TextValue>> {
    let values = text_values(payload, columns)?;
    Some(
        values
            .into_iter()
            .map(|v| v.map(|range| payload[range].to_vec()))
            .collect(),
    )
}

/// The byte range of each of the first `count` values of a row packet
/// (`None`: NULL), read in place; `None` when the packet is shorter.
pub fn text_values(row: &[u8], count: usize) -> Option<SmallVec<[Option<Range<usize>>; 8]>> {
    let mut values = SmallVec::with_capacity(count);
    let mut at = 0;
    for _ in 0..count {
        let value = next_value(row, at)?;
        at = value.as_ref().map_or(at + 1, |v| v.end);
        values.push(value);
    }
    Some(values)
}

/// How many bytes of a row packet its first `visible` values take: the row
/// without the columns hscale added for itself after them.
pub fn visible_prefix(row: &[u8], visible: usize) -> Option<usize> {
    let mut at = 0;
    for _ in 0..visible {
        at = next_value(row, at)?.map_or(at + 1, |v| v.end);
    }
    Some(at)
}

/// The value starting at `at`: `Some(None)` is NULL.
fn next_value(row: &[u8], at: usize) -> Option<Option<Range<usize>>> {
    if *row.get(at)? == NULL_VALUE {
        return Some(None);
    }
    let (len, n) = read_lenenc(row.get(at..)?)?;
    let start = at + n;
    let end = start.checked_add(usize::try_from(len).ok()?)?;
    (end <= row.len()).then_some(Some(start..end))
}

/// Whether a packet inside a result set ends it (EOF, or OK with header 0xfe
/// under CLIENT_DEPRECATE_EOF). A row starting with 0xfe is longer.
pub fn is_result_end(payload: &[u8], deprecate_eof: bool) -> bool {
    payload.first() == Some(&EOF_HEADER)
        && match deprecate_eof {
            true => payload.len() < 0xff_ffff,
            false => payload.len() < 9,
        }
}

fn write_lenenc_bytes(bytes: &[u8], dst: &mut Vec<u8>) {
    write_lenenc(bytes.len() as u64, dst);
    dst.extend_from_slice(bytes);
}

/// A column definition (Protocol::ColumnDefinition41).
pub fn write_column(name: &str, column_type: ColumnType, dst: &mut Vec<u8>) {
    for part in ["def", "", "", "", name, name] {
        write_lenenc_bytes(part.as_bytes(), dst);
    }
    dst.push(0x0c);
    let (charset, kind, length, flags) = match column_type {
        ColumnType::Text => (UTF8_GENERAL_CI, MYSQL_TYPE_VAR_STRING, 3 * 1024u32, 0),
        ColumnType::Integer => (BINARY_COLLATION, MYSQL_TYPE_LONGLONG, 20, NOT_NULL_FLAG),
        ColumnType::Count => (
            BINARY_COLLATION,
            MYSQL_TYPE_LONGLONG,
            21,
            UNSIGNED_FLAG | BINARY_FLAG,
        ),
    };
    dst.extend_from_slice(&charset.to_le_bytes());
    dst.extend_from_slice(&length.to_le_bytes());
    dst.push(kind);
    dst.extend_from_slice(&flags.to_le_bytes());
    dst.push(0);
    dst.extend_from_slice(&[0, 0]);
}

pub fn write_text_row<V: AsRef<[u8]>>(values: &[Option<V>], dst: &mut Vec<u8>) {
    for value in values {
        match value {
            Some(v) => write_lenenc_bytes(v.as_ref(), dst),
            None => dst.push(0xfb),
        }
    }
}

/// A column's type code and flags, as a binary row needs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BinaryColumn {
    pub code: u8,
    pub unsigned: bool,
}

impl BinaryColumn {
    /// From a column definition.
    pub fn of(definition: &[u8]) -> Option<BinaryColumn> {
        let fixed = column_fixed(definition)?;
        let flags = u16::from_le_bytes([fixed[7], fixed[8]]);
        Some(BinaryColumn {
            code: fixed[6],
            unsigned: flags & UNSIGNED_FLAG != 0,
        })
    }

    /// Whether a text value of this type has one exact binary form: not so
    /// FLOAT and DOUBLE, which the text protocol prints rounded.
    pub fn converts(self) -> bool {
        !matches!(self.code, 4 | 5) && (self.code <= 19 || self.code >= 245)
    }
}

const UNSIGNED_FLAG: u16 = 32;

/// A text row's values as a binary row, COM_STMT_EXECUTE's answer, for
/// `columns`. `None` where a type does not convert (`BinaryColumn::converts`)
/// or a value does not read as its type.
pub fn write_binary_row<V: AsRef<[u8]>>(
    columns: &[BinaryColumn],
    values: &[Option<V>],
    dst: &mut Vec<u8>,
) -> Option<()> {
    if columns.len() != values.len() {
        return None;
    }
    dst.push(0x00);
    // The NULL bitmap: two bits offset.
    let bitmap_at = dst.len();
    dst.resize(bitmap_at + (values.len() + 7 + 2) / 8, 0);
    for (i, (column, value)) in columns.iter().zip(values).enumerate() {
        let Some(value) = value else {
            dst[bitmap_at + (i + 2) / 8] |= 1 << ((i + 2) % 8);
            continue;
        };
        let text = value.as_ref();
        match column.code {
            // TINY, SHORT, YEAR, LONG, INT24, LONGLONG
            1 | 2 | 13 | 3 | 9 | 8 => {
                let size = match column.code {
                    1 => 1,
                    2 | 13 => 2,
                    3 | 9 => 4,
                    _ => 8,
                };
                let number: i128 = std::str::from_utf8(text).ok()?.parse().ok()?;
                let fits = match column.unsigned || column.code == 13 {
                    true => number >= 0 && number < 1i128 << (8 * size),
                    false => {
                        number >= -(1i128 << (8 * size - 1)) && number < 1i128 << (8 * size - 1)
                    }
                };
                if !fits {
                    return None;
                }
                dst.extend_from_slice(&number.to_le_bytes()[..size]);
            }
            // TIMESTAMP, DATE, DATETIME
            7 | 10 | 12 => write_binary_datetime(text, dst)?,
            // TIME
            11 => write_binary_time(text, dst)?,
            code if BinaryColumn {
                code,
                unsigned: false,
            }
            .converts()
                && code != 6 =>
            {
                write_lenenc_bytes(text, dst)
            }
            _ => return None,
        }
    }
    Some(())
}

/// `YYYY-MM-DD[ HH:MM:SS[.ffffff]]` as the binary protocol's date and time:
/// as long as its non-zero parts need (0, 4, 7 or 11 bytes), as MariaDB
/// sends it.
fn write_binary_datetime(text: &[u8], dst: &mut Vec<u8>) -> Option<()> {
    let text = std::str::from_utf8(text).ok()?;
    let (date, time) = match text.split_once(' ') {
        Some((date, time)) => (date, Some(time)),
        None => (text, None),
    };
    let mut date = date.splitn(3, '-');
    let year: u16 = date.next()?.parse().ok()?;
    let month: u8 = date.next()?.parse().ok()?;
    let day: u8 = date.next()?.parse().ok()?;
    let (hour, minute, second, micro) = match time {
        Some(time) => clock(time)?,
        None => (0, 0, 0, 0),
    };
    let hour = u8::try_from(hour).ok()?;
    let length = match (micro != 0, hour != 0 || minute != 0 || second != 0) {
        (true, _) => 11,
        (false, true) => 7,
        (false, false) if year != 0 || month != 0 || day != 0 => 4,
        _ => 0,
    };
    dst.push(length);
    if length >= 4 {
        dst.extend_from_slice(&year.to_le_bytes());
        dst.extend_from_slice(&[month, day]);
    }
    if length >= 7 {
        dst.extend_from_slice(&[hour, minute, second]);
    }
    if length == 11 {
        dst.extend_from_slice(&micro.to_le_bytes());
    }
    Some(())
}

/// `[-]H+:MM:SS[.ffffff]` as the binary protocol's time: sign, days, hours
/// of the day, minutes, seconds, microseconds (0, 8 or 12 bytes).
fn write_binary_time(text: &[u8], dst: &mut Vec<u8>) -> Option<()> {
    let text = std::str::from_utf8(text).ok()?;
    let (negative, time) = match text.strip_prefix('-') {
        Some(time) => (true, time),
        None => (false, text),
    };
    let (hours, minute, second, micro) = clock(time)?;
    let length = match (micro != 0, hours != 0 || minute != 0 || second != 0) {
        (true, _) => 12,
        (false, true) => 8,
        _ => 0,
    };
    dst.push(length);
    if length >= 8 {
        dst.push(u8::from(negative));
        dst.extend_from_slice(&(hours / 24).to_le_bytes());
        dst.extend_from_slice(&[(hours % 24) as u8, minute, second]);
    }
    if length == 12 {
        dst.extend_from_slice(&micro.to_le_bytes());
    }
    Some(())
}

/// `H+:MM:SS[.f{1,6}]`: hours, minutes, seconds, microseconds.
fn clock(text: &str) -> Option<(u32, u8, u8, u32)> {
    let (whole, fraction) = match text.split_once('.') {
        Some((whole, fraction)) => (whole, fraction),
        None => (text, ""),
    };
    let mut parts = whole.splitn(3, ':');
    let hours: u32 = parts.next()?.parse().ok()?;
    let minute: u8 = parts.next()?.parse().ok()?;
    let second: u8 = parts.next()?.parse().ok()?;
    if fraction.len() > 6 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let micro = match fraction.is_empty() {
        true => 0,
        false => format!("{fraction:0<6}").parse().ok()?,
    };
    Some((hours, minute, second, micro))
}

/// Where a column definition's strings lie: catalog, schema, table,
/// org_table, name, org_name.
fn column_strings(payload: &[u8]) -> Option<[Range<usize>; 6]> {
    let mut at = 0;
    let mut strings = [0..0, 0..0, 0..0, 0..0, 0..0, 0..0];
    for string in &mut strings {
        let (len, n) = read_lenenc(payload.get(at..)?)?;
        let start = at + n;
        let end = start.checked_add(usize::try_from(len).ok()?)?;
        payload.get(start..end)?;
        *string = start..end;
        at = end;
    }
    Some(strings)
}

/// The name a column definition gives its column, and the name of the
/// column it was read from (the same unless the query renamed it).
pub fn column_names(payload: &[u8]) -> Option<(&[u8], &[u8])> {
    let [.., name, org_name] = column_strings(payload)?;
    Some((&payload[name], &payload[org_name]))
}

/// The table a column definition says its column was read from; empty for
/// an expression's.
pub fn column_org_table(payload: &[u8]) -> Option<&[u8]> {
    let [_, _, _, org_table, ..] = column_strings(payload)?;
    Some(&payload[org_table])
}

/// Whether two column definitions give a column of one name whose values
/// read alike: character set, length, type, decimals, and the NOT NULL and
/// UNSIGNED flags (what a `UNION ALL` keeps of a table's column; it drops
/// the key flags and the table's names).
pub fn columns_alike(a: &[u8], b: &[u8]) -> bool {
    const NOT_NULL: u16 = 0x0001;
    const UNSIGNED: u16 = 0x0020;
    let kept = |payload: &[u8]| -> Option<([u8; 8], u16)> {
        let fixed = column_fixed(payload)?;
        let flags = u16::from_le_bytes([fixed[7], fixed[8]]) & (NOT_NULL | UNSIGNED);
        let [c0, c1, l0, l1, l2, l3, kind, _, _, decimals] = fixed;
        Some(([c0, c1, l0, l1, l2, l3, kind, decimals], flags))
    };
    column_names(a).map(|n| n.0) == column_names(b).map(|n| n.0)
        && kept(a).is_some_and(|k| Some(k) == kept(b))
}

/// A column definition's character set and type.
pub fn column_types(payload: &[u8]) -> Option<(u16, u8)> {
    let fixed = column_fixed(payload)?;
    Some((u16::from_le_bytes([fixed[0], fixed[1]]), fixed[6]))
}

/// What follows a column definition's strings, after its length (0x0c):
/// character set (2), length (4), type (1), flags (2), decimals (1).
fn column_fixed(payload: &[u8]) -> Option<[u8; 10]> {
    let [.., org_name] = column_strings(payload)?;
    payload
        .get(org_name.end + 1..org_name.end + 11)?
        .try_into()
        .ok()
}

/// A column definition with the names of `names` (catalog to org_name) and
/// what follows them in `types` (character set, length, type, flags,
/// decimals).
pub fn column_with_types(names: &[u8], types: &[u8]) -> Option<Vec<u8>> {
    let [.., names_end] = column_strings(names)?;
    let [.., types_end] = column_strings(types)?;
    Some([&names[..names_end.end], &types[types_end.end..]].concat())
}

/// A column definition whose table names change (`rename_column_table`).
#[derive(Debug)]
pub struct RenamedColumn<'a> {
    payload: &'a [u8],
    /// Where the length prefix of `table` starts, and where what follows
    /// `org_table` starts: the strings lie end to end.
    tables_at: usize,
    rest_at: usize,
    table: &'a [u8],
    org_table: &'a [u8],
}

impl RenamedColumn<'_> {
    /// Appends the definition's new payload.
    pub fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.payload[..self.tables_at]);
        write_lenenc_bytes(self.table, out);
        write_lenenc_bytes(self.org_table, out);
        out.extend_from_slice(&self.payload[self.rest_at..]);
    }

    pub fn to_vec(&self) -> Vec<u8> {
        let mut payload = Vec::with_capacity(self.payload.len() + 16);
        self.write(&mut payload);
        payload
    }
}

/// The column definition with the table it names (its `table` and
/// `org_table`) renamed where `rename(schema, table)` gives another name;
/// `None` when it gives none.
pub fn rename_column_table<'a>(
    payload: &'a [u8],
    mut rename: impl FnMut(&[u8], &[u8]) -> Option<&'a str>,
) -> Option<RenamedColumn<'a>> {
    let [_, schema, table, org_table, ..] = column_strings(payload)?;
    let (tables_at, rest_at) = (schema.end, org_table.end);
    let schema = &payload[schema];
    let (table, org_table) = (&payload[table], &payload[org_table]);
    let new_org_table = match org_table.is_empty() {
        true => None,
        false => rename(schema, org_table),
    };
    // Without an alias both name the same table.
    let new_table = match table == org_table {
        true => new_org_table,
        false => rename(schema, table),
    };
    if new_table.is_none() && new_org_table.is_none() {
        return None;
    }
    Some(RenamedColumn {
        payload,
        tables_at,
        rest_at,
        table: new_table.map_or(table, str::as_bytes),
        org_table: new_org_table.map_or(org_table, str::as_bytes),
    })
}

/// The payloads of a whole result set, in order: column count, columns, the
/// EOF after them (unless `deprecate_eof`), rows, and the end with `status`.
pub fn text_result(
    columns: &[(&str, ColumnType)],
    rows: &[Vec<Option<String>>],
    deprecate_eof: bool,
    status: u16,
) -> Vec<Vec<u8>> {
    let mut packets = Vec::with_capacity(rows.len() + columns.len() + 3);
    let mut count = Vec::new();
    write_lenenc(columns.len() as u64, &mut count);
    packets.push(count);
    for (name, column_type) in columns {
        let mut column = Vec::new();
        write_column(name, *column_type, &mut column);
        packets.push(column);
    }
    if !deprecate_eof {
        let mut eof = Vec::new();
        crate::packets::write_eof(status, 0, &mut eof);
        packets.push(eof);
    }
    for row in rows {
        let mut packet = Vec::new();
        write_text_row(row, &mut packet);
        packets.push(packet);
    }
    let mut end = Vec::new();
    write_result_end(deprecate_eof, status, &mut end);
    packets.push(end);
    packets
}

#[cfg(test)]
mod tests;

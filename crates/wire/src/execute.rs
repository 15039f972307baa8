//! COM_STMT_EXECUTE's parameters: where each value lies, so that hscale can
//! route by a few of them and pass a subset on, decoding only the values it
//! routes by and copying none.

use std::ops::Range;

use mysql_common::constants::ColumnType;

use crate::frame::read_lenenc;
use crate::WireError;

/// flags (1) and iteration count (4), before the NULL bitmap.
const BITMAP_AT: usize = 5;
/// The flag of a parameter type's second byte that makes an integer unsigned.
const UNSIGNED: u8 = 0x80;
/// The flags byte's cursor bits: `CURSOR_TYPE_READ_ONLY` and friends.
const CURSOR_FLAGS: u8 = 0x07;

/// The parameters of one COM_STMT_EXECUTE: `rest` is what follows the
/// statement id.
#[derive(Debug)]
pub struct Parameters<'a> {
    rest: &'a [u8],
    count: usize,
    /// Where the types are: two bytes per parameter.
    types_at: usize,
    /// Where each value is in `rest`; empty for NULL.
    values: Vec<Range<usize>>,
}

/// One parameter's value, as much as routing needs of it.
#[derive(Debug, Clone, PartialEq)]
pub enum Param<'a> {
    Null,
    Int(i64),
    UInt(u64),
    Double(f64),
    /// Strings, decimals, blobs: the bytes the client sent.
    Bytes(&'a [u8]),
    /// DATE, DATETIME, TIMESTAMP, TIME, as MariaDB writes them.
    Temporal(String),
}

impl<'a> Parameters<'a> {
    /// Reads `count` parameters. The types must be bound in this command (the
    /// session puts back the ones the client bound before).
    pub fn parse(rest: &'a [u8], count: usize) -> Result<Parameters<'a>, WireError> {
        let malformed = || WireError::Malformed {
            what: "COM_STMT_EXECUTE parameters",
        };
        if count == 0 {
            return Ok(Parameters {
                rest,
                count,
                types_at: BITMAP_AT,
                values: Vec::new(),
            });
        }
        let bound_at = BITMAP_AT + count.div_ceil(8);
        if *rest.get(bound_at).ok_or_else(malformed)? != 1 {
            return Err(WireError::Malformed {
                what: "COM_STMT_EXECUTE without parameter types",
            });
        }
        let types_at = bound_at + 1;
        let mut at = types_at + 2 * count;
        let types = rest.get(types_at..at).ok_or_else(malformed)?;
        let mut values = Vec::with_capacity(count);
        for (i, kind) in types.chunks_exact(2).enumerate() {
            let null = rest[BITMAP_AT + i / 8] & (1 << (i % 8)) != 0;
            let len = match null {
                true => 0,
                false => {
                    value_len(kind[0], rest.get(at..).unwrap_or_default()).ok_or_else(malformed)?
                }
            };
            let end = at.checked_add(len).filter(|&end| end <= rest.len());
            let end = end.ok_or_else(malformed)?;
            values.push(at..end);
            at = end;
        }
        Ok(Parameters {
            rest,
            count,
            types_at,
            values,
        })
    }

    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The value of parameter `i`.
    pub fn get(&self, i: usize) -> Result<Param<'a>, WireError> {
        let malformed = || WireError::Malformed {
            what: "COM_STMT_EXECUTE parameter",
        };
        let range = self.values.get(i).ok_or_else(malformed)?.clone();
        let kind = self.types_at + 2 * i;
        let (code, flags) = (self.rest[kind], self.rest[kind + 1]);
        let bytes = &self.rest[range];
        if self.rest[BITMAP_AT + i / 8] & (1 << (i % 8)) != 0 {
            return Ok(Param::Null);
        }
        let unsigned = flags & UNSIGNED != 0;
        let int = |n: usize| {
            let mut le = [0u8; 8];
            le[..n].copy_from_slice(&bytes[..n]);
            let sign_extend = !unsigned && bytes[n - 1] & 0x80 != 0;
            if sign_extend {
                le[n..].fill(0xff);
            }
            match unsigned {
                true => Param::UInt(u64::from_le_bytes(le)),
                false => Param::Int(i64::from_le_bytes(le)),
            }
        };
        let column = ColumnType::try_from(code).map_err(|_| malformed())?;
        Ok(match column {
            ColumnType::MYSQL_TYPE_TINY => int(1),
            ColumnType::MYSQL_TYPE_SHORT | ColumnType::MYSQL_TYPE_YEAR => int(2),
            ColumnType::MYSQL_TYPE_LONG | ColumnType::MYSQL_TYPE_INT24 => int(4),
            ColumnType::MYSQL_TYPE_LONGLONG => int(8),
            ColumnType::MYSQL_TYPE_FLOAT => Param::Double(f64::from(f32::from_le_bytes(
                bytes.try_into().map_err(|_| malformed())?,
            ))),
            ColumnType::MYSQL_TYPE_DOUBLE => Param::Double(f64::from_le_bytes(
                bytes.try_into().map_err(|_| malformed())?,
            )),
            ColumnType::MYSQL_TYPE_DATE
            | ColumnType::MYSQL_TYPE_NEWDATE
            | ColumnType::MYSQL_TYPE_DATETIME
            | ColumnType::MYSQL_TYPE_TIMESTAMP => Param::Temporal(datetime(&bytes[1..])),
            ColumnType::MYSQL_TYPE_TIME => Param::Temporal(time(&bytes[1..])),
            ColumnType::MYSQL_TYPE_NULL => Param::Null,
            _ => {
                let (len, width) = read_lenenc(bytes).ok_or_else(malformed)?;
                Param::Bytes(&bytes[width..width + len as usize])
            }
        })
    }

    /// What follows the statement id for a statement that has only the
    /// parameters `which` (in that order) of this one, types bound.
    pub fn select(&self, which: &[usize], keep_cursor: bool) -> Vec<u8> {
        let sources: Vec<Source> = which.iter().map(|&i| Source::Client(i)).collect();
        self.rebuild(&sources, keep_cursor)
    }

    /// What follows the statement id for a statement whose parameters are
    /// `sources`, types bound.
    pub fn rebuild(&self, sources: &[Source], keep_cursor: bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.rest.len() + 10 * sources.len());
        out.extend_from_slice(&self.rest[..BITMAP_AT]);
        if !keep_cursor {
            out[0] &= !CURSOR_FLAGS;
        }
        if sources.is_empty() {
            return out;
        }
        out.resize(BITMAP_AT + sources.len().div_ceil(8), 0);
        for (n, source) in sources.iter().enumerate() {
            let null = match *source {
                Source::Client(i) => self.rest[BITMAP_AT + i / 8] & (1 << (i % 8)) != 0,
                Source::Id(_) => false,
            };
            if null {
                out[BITMAP_AT + n / 8] |= 1 << (n % 8);
            }
        }
        out.push(1);
        for source in sources {
            match *source {
                Source::Client(i) => {
                    let kind = self.types_at + 2 * i;
                    out.extend_from_slice(&self.rest[kind..kind + 2]);
                }
                Source::Id(_) => {
                    out.extend_from_slice(&[ColumnType::MYSQL_TYPE_LONGLONG as u8, UNSIGNED])
                }
            }
        }
        for source in sources {
            match *source {
                Source::Client(i) => out.extend_from_slice(&self.rest[self.values[i].clone()]),
                Source::Id(id) => out.extend_from_slice(&id.to_le_bytes()),
            }
        }
        out
    }
}

/// Where a parameter of a rebuilt command comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The client's parameter of this index.
    Client(usize),
    /// An id hscale binds (BIGINT UNSIGNED).
    Id(u64),
}

/// The same command with no cursor asked for: rows of several partitions
/// come as one result set.
pub fn without_cursor(rest: &[u8]) -> Vec<u8> {
    let mut out = rest.to_vec();
    if let Some(flags) = out.first_mut() {
        *flags &= !CURSOR_FLAGS;
    }
    out
}

/// How many bytes a value of type `code` takes at the start of `at`.
fn value_len(code: u8, at: &[u8]) -> Option<usize> {
    let column = ColumnType::try_from(code).ok()?;
    Some(match column {
        ColumnType::MYSQL_TYPE_NULL => 0,
        ColumnType::MYSQL_TYPE_TINY => 1,
        ColumnType::MYSQL_TYPE_SHORT | ColumnType::MYSQL_TYPE_YEAR => 2,
        ColumnType::MYSQL_TYPE_LONG
        | ColumnType::MYSQL_TYPE_INT24
        | ColumnType::MYSQL_TYPE_FLOAT => 4,
        ColumnType::MYSQL_TYPE_LONGLONG | ColumnType::MYSQL_TYPE_DOUBLE => 8,
        ColumnType::MYSQL_TYPE_DATE
        | ColumnType::MYSQL_TYPE_NEWDATE
        | ColumnType::MYSQL_TYPE_DATETIME
        | ColumnType::MYSQL_TYPE_TIMESTAMP
        | ColumnType::MYSQL_TYPE_TIME => 1 + usize::from(*at.first()?),
        ColumnType::MYSQL_TYPE_DECIMAL
        | ColumnType::MYSQL_TYPE_NEWDECIMAL
        | ColumnType::MYSQL_TYPE_VARCHAR
        | ColumnType::MYSQL_TYPE_BIT
        | ColumnType::MYSQL_TYPE_JSON
        | ColumnType::MYSQL_TYPE_ENUM
        | ColumnType::MYSQL_TYPE_SET
        | ColumnType::MYSQL_TYPE_TINY_BLOB
        | ColumnType::MYSQL_TYPE_MEDIUM_BLOB
        | ColumnType::MYSQL_TYPE_LONG_BLOB
        | ColumnType::MYSQL_TYPE_BLOB
        | ColumnType::MYSQL_TYPE_VAR_STRING
        | ColumnType::MYSQL_TYPE_STRING
        | ColumnType::MYSQL_TYPE_GEOMETRY => {
            let (len, width) = read_lenenc(at)?;
            width.checked_add(usize::try_from(len).ok()?)?
        }
        _ => return None,
    })
}

/// A binary DATE/DATETIME (after its length byte): `YYYY-MM-DD[ HH:MM:SS[.ffffff]]`.
fn datetime(b: &[u8]) -> String {
    let at = |i: usize| b.get(i).copied().unwrap_or(0);
    let year = u16::from_le_bytes([at(0), at(1)]);
    let mut out = format!("{year:04}-{:02}-{:02}", at(2), at(3));
    if b.len() >= 7 {
        out.push_str(&format!(" {:02}:{:02}:{:02}", at(4), at(5), at(6)));
    }
    if b.len() >= 11 {
        let micros = u32::from_le_bytes([at(7), at(8), at(9), at(10)]);
        out.push_str(&format!(".{micros:06}"));
    }
    out
}

/// A binary TIME (after its length byte): `[-]HHH:MM:SS[.ffffff]`.
fn time(b: &[u8]) -> String {
    let at = |i: usize| b.get(i).copied().unwrap_or(0);
    let negative = at(0) == 1;
    let days = u32::from_le_bytes([at(1), at(2), at(3), at(4)]);
    let hours = days * 24 + u32::from(at(5));
    let mut out = format!(
        "{}{hours:02}:{:02}:{:02}",
        if negative { "-" } else { "" },
        at(6),
        at(7)
    );
    if b.len() >= 12 {
        let micros = u32::from_le_bytes([at(8), at(9), at(10), at(11)]);
        out.push_str(&format!(".{micros:06}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// flags 1 (cursor), one iteration, then the bitmap, bound, types, values.
    fn command(nulls: u8, types: &[[u8; 2]], values: &[&[u8]]) -> Vec<u8> {
        let mut rest = vec![1, 1, 0, 0, 0, nulls, 1];
        for t in types {
            rest.extend_from_slice(t);
        }
        for v in values {
            rest.extend_from_slice(v);
        }
        rest
    }

    #[test]
    fn values_are_read_by_their_types_and_nulls_by_the_bitmap() {
        let rest = command(
            0b0100,
            &[[8, 0], [0xfd, 0], [6, 0], [3, 0x80], [12, 0], [1, 0]],
            &[
                &(-5i64).to_le_bytes(),
                b"\x03abc",
                &u32::MAX.to_le_bytes(),
                &[7, 0xe8, 0x07, 2, 29, 13, 4, 5],
                &[0xff],
            ],
        );
        let params = Parameters::parse(&rest, 6).unwrap();
        assert_eq!(params.get(0).unwrap(), Param::Int(-5));
        assert_eq!(params.get(1).unwrap(), Param::Bytes(b"abc"));
        assert_eq!(params.get(2).unwrap(), Param::Null);
        assert_eq!(params.get(3).unwrap(), Param::UInt(u64::from(u32::MAX)));
        assert_eq!(
            params.get(4).unwrap(),
            Param::Temporal("2024-02-29 13:04:05".into())
        );
        assert_eq!(params.get(5).unwrap(), Param::Int(-1));
    }

    #[test]
    fn a_subset_keeps_its_values_types_and_nulls_and_drops_the_cursor() {
        let rest = command(0b0010, &[[1, 0], [6, 0], [0xfe, 0]], &[&[9], b"\x02hi"]);
        let params = Parameters::parse(&rest, 3).unwrap();
        let subset = params.select(&[1, 2], false);
        assert_eq!(subset[0], 0, "no cursor");
        let again = Parameters::parse(&subset, 2).unwrap();
        assert_eq!(again.get(0).unwrap(), Param::Null);
        assert_eq!(again.get(1).unwrap(), Param::Bytes(b"hi"));
        assert_eq!(without_cursor(&rest)[1..], rest[1..]);
        let with_id = params.rebuild(&[Source::Id(7), Source::Client(0)], true);
        let again = Parameters::parse(&with_id, 2).unwrap();
        assert_eq!(again.get(0).unwrap(), Param::UInt(7));
        assert_eq!(again.get(1).unwrap(), Param::Int(9));
    }

    #[test]
    fn truncated_or_unknown_values_are_malformed_not_a_panic() {
        let rest = command(0, &[[8, 0]], &[&[1, 2, 3]]);
        assert!(Parameters::parse(&rest, 1).is_err());
        let rest = command(0, &[[0x42, 0]], &[&[1]]);
        assert!(Parameters::parse(&rest, 1).is_err());
        let rest = command(0, &[[0xfd, 0]], &[&[0xfc, 0xff]]);
        assert!(Parameters::parse(&rest, 1).is_err());
        assert!(Parameters::parse(&[0, 1, 0, 0, 0, 0, 0], 1).is_err());
        assert!(Parameters::parse(&[], 3).is_err());
    }
}

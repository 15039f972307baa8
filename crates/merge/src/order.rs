//! Comparing the values of one ORDER BY key the way MariaDB orders them: by
//! the type of the column that holds them. Numbers compare as numbers
//! (DECIMAL exactly), temporal values by time, binary strings by bytes, and
//! strings with a collation by the weights MariaDB itself computed for them
//! (`WEIGHT_STRING`, a column the partition sends along), padded with the
//! weight of a space where the collation ignores trailing spaces. Column
//! definitions name the connection's collation, not the value's, so the
//! partition sends the value's collation along too (`COLLATION()`).

use std::cmp::Ordering;
use std::collections::HashMap;

use mysql_common::constants::{ColumnFlags, ColumnType};
use mysql_common::packets::Column;

use crate::merger::MergeError;
use crate::rows::Encoding;

/// The binary pseudo-collation: bytes compare as bytes.
const BINARY: u16 = 63;

/// What hscale needs of a collation to compare its weights.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collation {
    /// The weight of one space (`WEIGHT_STRING(' ')`).
    pub space: Vec<u8>,
    /// PAD SPACE: trailing spaces do not count (NO PAD collations: they do).
    pub pad: bool,
}

/// The collations of the backends, by name (the proxy reads them once).
pub type Collations = HashMap<String, Collation>;

/// How the values of one key column compare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyOrder {
    Integer {
        unsigned: bool,
    },
    Decimal,
    Float,
    /// TIME: signed, more than 24 hours.
    Time,
    /// DATE, DATETIME, TIMESTAMP: as text, a fixed layout per column.
    Temporal,
    /// Binary strings and BIT.
    Bytes,
    /// The weight column's bytes, in this collation (`None`: named by the
    /// first row whose value is not NULL).
    Weights(Option<Collation>),
}

impl KeyOrder {
    pub(crate) fn of(column: &Column) -> Result<KeyOrder, MergeError> {
        use ColumnType::*;
        let unsupported = |what: &str| Err(MergeError::Unsupported(format!("ORDER BY {what}")));
        let flags = column.flags();
        if flags.intersects(ColumnFlags::ENUM_FLAG | ColumnFlags::SET_FLAG) {
            return unsupported("an ENUM or SET column across partitions");
        }
        Ok(match column.column_type() {
            MYSQL_TYPE_TINY | MYSQL_TYPE_SHORT | MYSQL_TYPE_INT24 | MYSQL_TYPE_LONG
            | MYSQL_TYPE_LONGLONG | MYSQL_TYPE_YEAR => KeyOrder::Integer {
                unsigned: flags.contains(ColumnFlags::UNSIGNED_FLAG),
            },
            MYSQL_TYPE_DECIMAL | MYSQL_TYPE_NEWDECIMAL => KeyOrder::Decimal,
            MYSQL_TYPE_FLOAT | MYSQL_TYPE_DOUBLE => KeyOrder::Float,
            MYSQL_TYPE_TIME | MYSQL_TYPE_TIME2 => KeyOrder::Time,
            MYSQL_TYPE_DATE
            | MYSQL_TYPE_NEWDATE
            | MYSQL_TYPE_DATETIME
            | MYSQL_TYPE_DATETIME2
            | MYSQL_TYPE_TIMESTAMP
            | MYSQL_TYPE_TIMESTAMP2 => KeyOrder::Temporal,
            MYSQL_TYPE_BIT | MYSQL_TYPE_NULL => KeyOrder::Bytes,
            MYSQL_TYPE_VARCHAR
            | MYSQL_TYPE_VAR_STRING
            | MYSQL_TYPE_STRING
            | MYSQL_TYPE_TINY_BLOB
            | MYSQL_TYPE_MEDIUM_BLOB
            | MYSQL_TYPE_LONG_BLOB
            | MYSQL_TYPE_BLOB
            | MYSQL_TYPE_JSON => match column.character_set() {
                BINARY => KeyOrder::Bytes,
                _ => KeyOrder::Weights(None),
            },
            other => return unsupported(&format!("a column of type {other:?}")),
        })
    }

    /// Whether this key compares the weight column rather than the value.
    pub(crate) fn by_weight(&self) -> bool {
        matches!(self, KeyOrder::Weights(_))
    }

    /// Learns the collation of a weighed key from a row's `COLLATION()`.
    pub(crate) fn learn(&mut self, name: &[u8], collations: &Collations) -> Result<(), MergeError> {
        if let KeyOrder::Weights(learnt @ None) = self {
            let name = String::from_utf8_lossy(name);
            match collations.get(name.as_ref()) {
                Some(collation) => *learnt = Some(collation.clone()),
                None => {
                    return Err(MergeError::Unsupported(format!(
                        "ORDER BY a string of collation {name}, unknown to hscale"
                    )))
                }
            }
        }
        Ok(())
    }

    /// Two non-NULL values (or weights) of this key, as `encoding` writes
    /// them.
    pub(crate) fn compare(
        &self,
        a: &[u8],
        b: &[u8],
        encoding: Encoding,
    ) -> Result<Ordering, MergeError> {
        let (x, y) = (self.decode(a, encoding)?, self.decode(b, encoding)?);
        Ok(self.compare_decoded((x, a), (y, b)))
    }

    /// What of a value a comparison needs, read once: a row waiting in the
    /// merge is compared with every other partition's.
    pub(crate) fn decode(&self, v: &[u8], encoding: Encoding) -> Result<Decoded, MergeError> {
        let bad = |what: &'static str| MergeError::Malformed(what);
        let binary = encoding == Encoding::Binary;
        Ok(match self {
            KeyOrder::Integer { unsigned } if binary => {
                Decoded::Number(binary_integer(v, *unsigned).ok_or(bad("an integer"))?)
            }
            KeyOrder::Integer { .. } => Decoded::Number(
                std::str::from_utf8(v)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .ok_or(bad("an integer"))?,
            ),
            KeyOrder::Float => Decoded::Float(
                match (binary, v.len()) {
                    (true, 4) => v.try_into().ok().map(|b| f64::from(f32::from_le_bytes(b))),
                    (true, 8) => v.try_into().ok().map(f64::from_le_bytes),
                    (true, _) => None,
                    (false, _) => std::str::from_utf8(v).ok().and_then(|s| s.parse().ok()),
                }
                .ok_or(bad("a float"))?,
            ),
            KeyOrder::Time if binary => Decoded::Number(binary_time(v).ok_or(bad("a time"))?),
            KeyOrder::Time => Decoded::Number(time_micros(v).ok_or(bad("a time"))?),
            KeyOrder::Temporal if binary => {
                Decoded::Number(binary_datetime(v).ok_or(bad("a date"))?)
            }
            KeyOrder::Decimal => {
                decimal_parts(v).ok_or(bad("a decimal"))?;
                Decoded::Bytes
            }
            _ => Decoded::Bytes,
        })
    }

    /// Two decoded values, with their bytes.
    pub(crate) fn compare_decoded(
        &self,
        (x, a): (Decoded, &[u8]),
        (y, b): (Decoded, &[u8]),
    ) -> Ordering {
        match (x, y) {
            (Decoded::Number(x), Decoded::Number(y)) => x.cmp(&y),
            (Decoded::Float(x), Decoded::Float(y)) => x.total_cmp(&y),
            _ => match self {
                KeyOrder::Decimal => compare_decimals(a, b).unwrap_or(Ordering::Equal),
                KeyOrder::Weights(Some(collation)) if collation.pad => {
                    compare_padded(a, b, &collation.space)
                }
                _ => a.cmp(b),
            },
        }
    }
}

/// A key value as comparisons need it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Decoded {
    Number(i128),
    Float(f64),
    /// Compared by its bytes (as the key's order says).
    Bytes,
}

/// A binary-protocol integer of 1, 2, 4 or 8 bytes.
pub(crate) fn binary_integer(v: &[u8], unsigned: bool) -> Option<i128> {
    let mut bytes = [0u8; 8];
    bytes.get_mut(..v.len())?.copy_from_slice(v);
    let raw = u64::from_le_bytes(bytes);
    let bits = 8 * v.len() as u32;
    Some(match unsigned {
        true => i128::from(raw),
        false => {
            // Sign-extend from the value's width.
            let shift = 64 - bits;
            i128::from(((raw << shift) as i64) >> shift)
        }
    })
}

/// A binary-protocol TIME (negative, days, hours, minutes, seconds,
/// microseconds) in microseconds.
fn binary_time(v: &[u8]) -> Option<i128> {
    if v.is_empty() {
        return Some(0);
    }
    let days = i128::from(u32::from_le_bytes(v.get(1..5)?.try_into().ok()?));
    let (h, m, s) = (i128::from(v[5]), i128::from(v[6]), i128::from(v[7]));
    let micros = match v.len() {
        12 => i128::from(u32::from_le_bytes(v[8..12].try_into().ok()?)),
        8 => 0,
        _ => return None,
    };
    let total = (((days * 24 + h) * 60 + m) * 60 + s) * 1_000_000 + micros;
    Some(if v[0] == 1 { -total } else { total })
}

/// A binary-protocol DATE, DATETIME or TIMESTAMP as one comparable number.
fn binary_datetime(v: &[u8]) -> Option<i128> {
    let at = |i: usize| i128::from(v.get(i).copied().unwrap_or(0));
    let year = match v.len() {
        0 => 0,
        4 | 7 | 11 => i128::from(u16::from_le_bytes(v[0..2].try_into().ok()?)),
        _ => return None,
    };
    let micros = match v.len() {
        11 => i128::from(u32::from_le_bytes(v[7..11].try_into().ok()?)),
        _ => 0,
    };
    let seconds = ((((year * 13 + at(2)) * 32 + at(3)) * 24 + at(4)) * 60 + at(5)) * 60 + at(6);
    Some(seconds * 1_000_000 + micros)
}

/// Weights compared as if the shorter went on with spaces: a PAD SPACE
/// collation compares `'a'` and `'a '` equal, and `'a'` above `'a\t'`.
fn compare_padded(a: &[u8], b: &[u8], space: &[u8]) -> Ordering {
    let common = a.len().min(b.len());
    match a[..common].cmp(&b[..common]) {
        Ordering::Equal => {}
        unequal => return unequal,
    }
    let against_spaces = |rest: &[u8]| -> Ordering {
        if space.is_empty() {
            return rest.len().cmp(&0);
        }
        for (i, byte) in rest.iter().enumerate() {
            match byte.cmp(&space[i % space.len()]) {
                Ordering::Equal => {}
                unequal => return unequal,
            }
        }
        // A partial space unit at the end cannot happen with whole weights.
        Ordering::Equal
    };
    match a.len().cmp(&b.len()) {
        Ordering::Equal => Ordering::Equal,
        Ordering::Greater => against_spaces(&a[common..]),
        Ordering::Less => against_spaces(&b[common..]).reverse(),
    }
}

/// Two DECIMAL texts (`-12.340`), exactly: no float in between.
fn compare_decimals(a: &[u8], b: &[u8]) -> Option<Ordering> {
    let (a_negative, a_int, a_frac) = decimal_parts(a)?;
    let (b_negative, b_int, b_frac) = decimal_parts(b)?;
    let a_zero = a_int.is_empty() && a_frac.is_empty();
    let b_zero = b_int.is_empty() && b_frac.is_empty();
    let a_sign = if a_zero {
        0
    } else if a_negative {
        -1
    } else {
        1
    };
    let b_sign = if b_zero {
        0
    } else if b_negative {
        -1
    } else {
        1
    };
    if a_sign != b_sign {
        return Some(a_sign.cmp(&b_sign));
    }
    let magnitude = a_int
        .len()
        .cmp(&b_int.len())
        .then_with(|| a_int.cmp(b_int))
        .then_with(|| a_frac.cmp(b_frac));
    Some(match a_sign {
        -1 => magnitude.reverse(),
        _ => magnitude,
    })
}

/// Sign, integer digits without leading zeros, fraction digits without
/// trailing zeros.
fn decimal_parts(text: &[u8]) -> Option<(bool, &[u8], &[u8])> {
    let (negative, digits) = match text.split_first()? {
        (b'-', rest) => (true, rest),
        (b'+', rest) => (false, rest),
        _ => (false, text),
    };
    let (int, frac) = match digits.iter().position(|&c| c == b'.') {
        Some(dot) => (&digits[..dot], &digits[dot + 1..]),
        None => (digits, &digits[..0]),
    };
    if !int.iter().chain(frac).all(u8::is_ascii_digit) || int.len() + frac.len() == 0 {
        return None;
    }
    let int = &int[int.iter().position(|&c| c != b'0').unwrap_or(int.len())..];
    let frac = &frac[..frac.iter().rposition(|&c| c != b'0').map_or(0, |i| i + 1)];
    Some((negative, int, frac))
}

/// `[-]H:MM:SS[.ffffff]` in microseconds.
fn time_micros(text: &[u8]) -> Option<i128> {
    let text = std::str::from_utf8(text).ok()?;
    let (negative, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (clock, fraction) = text.split_once('.').unwrap_or((text, ""));
    let mut parts = clock.split(':');
    let hours: i128 = parts.next()?.parse().ok()?;
    let minutes: i128 = parts.next()?.parse().ok()?;
    let seconds: i128 = parts.next()?.parse().ok()?;
    if parts.next().is_some() || fraction.len() > 6 {
        return None;
    }
    let micros: i128 = match fraction {
        "" => 0,
        f => format!("{f:0<6}").parse().ok()?,
    };
    let total = ((hours * 60 + minutes) * 60 + seconds) * 1_000_000 + micros;
    Some(if negative { -total } else { total })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_compare_exactly() {
        let less =
            |a: &str, b: &str| compare_decimals(a.as_bytes(), b.as_bytes()) == Some(Ordering::Less);
        let equal = |a: &str, b: &str| {
            compare_decimals(a.as_bytes(), b.as_bytes()) == Some(Ordering::Equal)
        };
        assert!(less("9.99", "10.00"));
        assert!(less("-10.5", "-10.25"));
        assert!(less("-0.01", "0.00"));
        assert!(equal("-0.00", "0.00"));
        assert!(equal("1.50", "1.5"));
        assert!(less(
            "12345678901234567890.000000000000000001",
            "12345678901234567890.000000000000000002"
        ));
        assert!(less("0.1", "1"));
        assert!(compare_decimals(b"1e5", b"1").is_none());
    }

    #[test]
    fn times_compare_past_a_day_and_below_zero() {
        let t = |s: &str| time_micros(s.as_bytes()).unwrap();
        assert!(t("-01:00:00") < t("00:00:00"));
        assert!(t("-838:59:59") < t("-01:00:00"));
        assert!(t("23:59:59.999999") < t("24:00:00"));
        assert!(t("100:00:00") > t("99:59:59.5"));
        assert_eq!(t("00:00:01.5"), 1_500_000);
    }

    #[test]
    fn pad_space_weights_ignore_trailing_spaces_only() {
        // utf8mb4_general_ci: 'a' 0041, space 0020, tab 0009, '!' 0021.
        let space = [0x00, 0x20];
        let cmp = |a: &[u8], b: &[u8]| compare_padded(a, b, &space);
        assert_eq!(cmp(&[0, 0x41], &[0, 0x41, 0, 0x20]), Ordering::Equal);
        assert_eq!(cmp(&[0, 0x41], &[0, 0x41, 0, 0x09]), Ordering::Greater);
        assert_eq!(cmp(&[0, 0x41], &[0, 0x41, 0, 0x21]), Ordering::Less);
        assert_eq!(cmp(&[0, 0x41, 0, 0x09], &[0, 0x41]), Ordering::Less);
        assert_eq!(cmp(&[], &[0, 0x20, 0, 0x20]), Ordering::Equal);
        assert_eq!(cmp(&[0, 0x42], &[0, 0x41, 0, 0x41]), Ordering::Greater);
    }

    #[test]
    fn numbers_compare_as_numbers() {
        let integer = KeyOrder::Integer { unsigned: false };
        for (order, a, b, expected) in [
            (integer.clone(), "9", "10", Ordering::Less),
            (
                integer.clone(),
                "18446744073709551615",
                "-1",
                Ordering::Greater,
            ),
            (KeyOrder::Float, "1e-5", "0.001", Ordering::Less),
            (
                KeyOrder::Temporal,
                "2024-01-02",
                "2024-01-10",
                Ordering::Less,
            ),
        ] {
            assert_eq!(
                order
                    .compare(a.as_bytes(), b.as_bytes(), Encoding::Text)
                    .unwrap(),
                expected,
                "{a} {b}"
            );
        }
        assert!(integer.compare(b"x", b"1", Encoding::Text).is_err());
    }

    #[test]
    fn binary_values_compare_by_what_they_encode() {
        let binary =
            |order: &KeyOrder, a: &[u8], b: &[u8]| order.compare(a, b, Encoding::Binary).unwrap();
        let signed = KeyOrder::Integer { unsigned: false };
        let unsigned = KeyOrder::Integer { unsigned: true };
        assert_eq!(binary(&signed, &[0xff], &[1]), Ordering::Less);
        assert_eq!(binary(&unsigned, &[0xff], &[1]), Ordering::Greater);
        assert_eq!(
            binary(&signed, &(-300i64).to_le_bytes(), &2i64.to_le_bytes()),
            Ordering::Less
        );
        assert_eq!(
            binary(&unsigned, &u64::MAX.to_le_bytes(), &1u64.to_le_bytes()),
            Ordering::Greater
        );
        assert_eq!(
            binary(
                &KeyOrder::Float,
                &(-1.5f64).to_le_bytes(),
                &(0.5f32).to_le_bytes()
            ),
            Ordering::Less
        );
        // 2024-01-02 against 2023-12-31 23:59:59: years are little-endian.
        let date = [0xe8, 0x07, 1, 2];
        let datetime = [0xe7, 0x07, 12, 31, 23, 59, 59];
        assert_eq!(
            binary(&KeyOrder::Temporal, &date, &datetime),
            Ordering::Greater
        );
        // -1 day against 23:00:00.
        let negative = [1, 1, 0, 0, 0, 0, 0, 0];
        let positive = [0, 0, 0, 0, 0, 23, 0, 0];
        assert_eq!(
            binary(&KeyOrder::Time, &negative, &positive),
            Ordering::Less
        );
    }
}

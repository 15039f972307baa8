//! Aggregates over the partial answers of several partitions: each partition
//! aggregates its own rows, and hscale combines one group's partial rows
//! into the row one table would give. COUNT and SUM add up (DECIMAL exactly,
//! in scaled integers), MIN and MAX compare as ORDER BY does, AVG divides the
//! summed SUM by the summed COUNT, which each partition sends alongside, and
//! rounds to the AVG column's scale as MariaDB does.

use std::cmp::Ordering;
use std::ops::Range;

use mysql_common::constants::ColumnType;
use mysql_common::packets::Column;

use crate::merger::MergeError;
use crate::order::{binary_integer, Collations, KeyOrder};
use crate::rows::Encoding;

/// How one column of a grouped answer combines the partitions' values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Combine {
    /// A GROUP BY column, or one whose value any row of the group gives.
    First,
    Count,
    Sum,
    /// MIN or MAX; strings compare by the hidden `WEIGHT_STRING` and
    /// `COLLATION` of the partition's result (positions among the hidden
    /// columns).
    Min {
        weight: usize,
        collation: usize,
    },
    Max {
        weight: usize,
        collation: usize,
    },
    /// AVG: the hidden SUM and COUNT of its argument.
    Avg {
        sum: usize,
        count: usize,
    },
    /// An expression over the group's aggregates: `Spec::calcs[i]`,
    /// computed from other columns once they are combined.
    Calc(usize),
}

/// An expression over a group's combined aggregates (`SUM(a) / COUNT(*)`,
/// `MAX(x) - MIN(x) + 1`), computed as MariaDB computes it: exact numbers
/// exactly, doubles as doubles, NULL when any operand is NULL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Calc {
    /// A hidden column of the combined row (its position among the hidden
    /// ones): an aggregate, or a value the whole group shares.
    Hidden(usize),
    /// A number literal as written (`2`, `1.50`, `1e3`).
    Literal(String),
    Negate(Box<Calc>),
    Binary(Box<Calc>, Arithmetic, Box<Calc>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arithmetic {
    Add,
    Subtract,
    Multiply,
    /// Only outermost: its result is rounded to the column's scale, which
    /// MariaDB decides (`div_precision_increment`) and the column says.
    Divide,
}

/// A value of one group's column as it is being combined.
#[derive(Debug)]
pub(crate) enum Partial {
    /// The first row's bytes (`None`: NULL).
    First(Option<Range<usize>>),
    Count(i128),
    /// `None` until a partition gives a non-NULL value.
    Sum(Option<Number>),
    /// The row (index into the group's rows) of the value kept, the value's
    /// range and the range it compares by (its weight, for a string).
    Extreme(Option<(usize, Range<usize>, Range<usize>)>),
    Avg {
        sum: Option<Number>,
        count: i128,
    },
    /// Computed when the group's other columns are.
    Calc,
}

/// A number as SUM and AVG add it up.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Number {
    /// Digits scaled by 10^scale.
    Exact(i128, u32),
    Float(f64),
}

fn malformed() -> MergeError {
    MergeError::Malformed("an aggregate")
}

fn overflow() -> MergeError {
    MergeError::Unsupported("a SUM or AVG beyond 38 digits across partitions".into())
}

impl Number {
    /// A value as the column's type writes it.
    pub(crate) fn parse(
        value: &[u8],
        column: &Column,
        encoding: Encoding,
    ) -> Result<Number, MergeError> {
        use ColumnType::*;
        let float = matches!(column.column_type(), MYSQL_TYPE_DOUBLE | MYSQL_TYPE_FLOAT);
        let decimal = matches!(
            column.column_type(),
            MYSQL_TYPE_DECIMAL | MYSQL_TYPE_NEWDECIMAL
        );
        if encoding == Encoding::Binary && !decimal {
            return match (float, value.len()) {
                (true, 8) => Ok(Number::Float(f64::from_le_bytes(
                    value.try_into().unwrap_or_default(),
                ))),
                (true, 4) => Ok(Number::Float(f64::from(f32::from_le_bytes(
                    value.try_into().unwrap_or_default(),
                )))),
                (true, _) => Err(malformed()),
                (false, _) => {
                    let unsigned = column
                        .flags()
                        .contains(mysql_common::constants::ColumnFlags::UNSIGNED_FLAG);
                    binary_integer(value, unsigned)
                        .map(|v| Number::Exact(v, 0))
                        .ok_or_else(malformed)
                }
            };
        }
        let text = std::str::from_utf8(value).map_err(|_| malformed())?;
        match float {
            true => text.parse().map(Number::Float).map_err(|_| malformed()),
            false => exact(text).ok_or_else(malformed),
        }
    }

    pub(crate) fn add(self, other: Number) -> Result<Number, MergeError> {
        Ok(match (self, other) {
            (Number::Exact(a, s), Number::Exact(b, t)) => {
                let scale = s.max(t);
                let a = rescale(a, s, scale).ok_or_else(overflow)?;
                let b = rescale(b, t, scale).ok_or_else(overflow)?;
                Number::Exact(a.checked_add(b).ok_or_else(overflow)?, scale)
            }
            // A double with anything is a double, as in MariaDB.
            (a, b) => Number::Float(a.to_f64() + b.to_f64()),
        })
    }

    fn negate(self) -> Number {
        match self {
            Number::Exact(v, s) => Number::Exact(-v, s),
            Number::Float(f) => Number::Float(-f),
        }
    }

    pub(crate) fn multiply(self, other: Number) -> Result<Number, MergeError> {
        Ok(match (self, other) {
            (Number::Exact(a, s), Number::Exact(b, t)) => {
                Number::Exact(a.checked_mul(b).ok_or_else(overflow)?, s + t)
            }
            (a, b) => Number::Float(a.to_f64() * b.to_f64()),
        })
    }

    /// The quotient at `scale`, rounded half away from zero as MariaDB
    /// rounds a DECIMAL division; `None`: division by zero (NULL).
    pub(crate) fn divide_by(self, other: Number, scale: u32) -> Result<Option<Number>, MergeError> {
        Ok(match (self, other) {
            (Number::Exact(_, _), Number::Exact(0, _)) => None,
            (Number::Exact(a, s), Number::Exact(b, t)) => {
                // a / 10^s ÷ b / 10^t at scale + 1 digits: a·10^(t+scale+1) ÷ b·10^s.
                let numerator = rescale(a, 0, t + scale + 1).ok_or_else(overflow)?;
                let denominator = rescale(b, 0, s).ok_or_else(overflow)?;
                let q = numerator / denominator;
                let rounded = match q % 10 {
                    r if r >= 5 => q / 10 + 1,
                    r if r <= -5 => q / 10 - 1,
                    _ => q / 10,
                };
                Some(Number::Exact(rounded, scale))
            }
            (_, b) if b.to_f64() == 0.0 => None,
            (a, b) => Some(Number::Float(a.to_f64() / b.to_f64())),
        })
    }

    fn to_f64(self) -> f64 {
        match self {
            Number::Exact(v, s) => v as f64 / 10f64.powi(s as i32),
            Number::Float(f) => f,
        }
    }

    /// The number as MariaDB sends a column of this type and scale.
    pub(crate) fn write(self, column: &Column, encoding: Encoding) -> Result<Vec<u8>, MergeError> {
        match self {
            Number::Float(f) => Ok(write_float(f, encoding)),
            Number::Exact(v, s) => {
                let scale = u32::from(column.decimals()).min(38);
                let v = rescale(v, s, scale).ok_or_else(overflow)?;
                Ok(write_exact(v, scale).into_bytes())
            }
        }
    }

    /// SUM / COUNT at the scale of the AVG column (`decimals`), rounded half
    /// away from zero; a float stays a float.
    pub(crate) fn divide(
        self,
        count: i128,
        column: &Column,
        encoding: Encoding,
    ) -> Result<Vec<u8>, MergeError> {
        let scale = u32::from(column.decimals()).min(38);
        match self.divide_by(Number::Exact(count, 0), scale)? {
            Some(quotient) => quotient.write(column, encoding),
            None => Err(malformed()),
        }
    }
}

/// `-12.34` as (-1234, 2).
fn exact(text: &str) -> Option<Number> {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    let mut value: i128 = 0;
    for c in int.bytes().chain(frac.bytes()) {
        if !c.is_ascii_digit() {
            return None;
        }
        value = value.checked_mul(10)?.checked_add(i128::from(c - b'0'))?;
    }
    Some(Number::Exact(
        if negative { -value } else { value },
        frac.len() as u32,
    ))
}

fn rescale(v: i128, from: u32, to: u32) -> Option<i128> {
    match to.cmp(&from) {
        Ordering::Equal => Some(v),
        Ordering::Greater => v.checked_mul(10i128.checked_pow(to - from)?),
        // Fewer digits than given cannot happen with one column's values;
        // truncating would be wrong, so refuse.
        Ordering::Less => {
            let divisor = 10i128.checked_pow(from - to)?;
            (v % divisor == 0).then(|| v / divisor)
        }
    }
}

fn write_exact(v: i128, scale: u32) -> String {
    let digits = v.unsigned_abs().to_string();
    let scale = scale as usize;
    let digits = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = digits.split_at(digits.len() - scale);
    let sign = if v < 0 { "-" } else { "" };
    match scale {
        0 => format!("{sign}{int}"),
        _ => format!("{sign}{int}.{frac}"),
    }
}

fn write_float(f: f64, encoding: Encoding) -> Vec<u8> {
    match encoding {
        Encoding::Text => write_double(f).into_bytes(),
        Encoding::Binary => f.to_le_bytes().to_vec(),
    }
}

/// A DOUBLE as MariaDB writes it: the shortest digits that read back the
/// same, fixed-point for exponents from -15 to 14, else `1.5e15`.
pub(crate) fn write_double(f: f64) -> String {
    if f == 0.0 {
        return "0".into();
    }
    let scientific = format!("{f:e}");
    let (mantissa, exponent) = scientific.split_once('e').expect("{:e} has an exponent");
    let exponent: i32 = exponent.parse().expect("an integer exponent");
    match (-15..=14).contains(&exponent) {
        true => format!("{f}"),
        false => format!("{mantissa}e{exponent}"),
    }
}

impl Partial {
    pub(crate) fn start(combine: Combine) -> Partial {
        match combine {
            Combine::First => Partial::First(None),
            Combine::Count => Partial::Count(0),
            Combine::Sum => Partial::Sum(None),
            Combine::Min { .. } | Combine::Max { .. } => Partial::Extreme(None),
            Combine::Avg { .. } => Partial::Avg {
                sum: None,
                count: 0,
            },
            Combine::Calc(_) => Partial::Calc,
        }
    }
}

/// What folding one row into a group needs to know of the columns.
pub(crate) struct Fold<'a> {
    pub columns: &'a [Column],
    pub visible: usize,
    pub collations: &'a Collations,
    pub encoding: Encoding,
}

/// Folds row `index` (its bytes and value ranges) into the group's partials.
pub(crate) fn fold(
    partials: &mut [Partial],
    combines: &[Combine],
    orders: &mut [Option<KeyOrder>],
    rows: &[bytes::Bytes],
    index: usize,
    values: &[Option<Range<usize>>],
    fold: &Fold,
) -> Result<(), MergeError> {
    let row = &rows[index];
    for (column, ((partial, combine), order)) in partials
        .iter_mut()
        .zip(combines)
        .zip(orders.iter_mut())
        .enumerate()
    {
        let value = &values[column];
        let definition = &fold.columns[column];
        match (partial, combine) {
            (Partial::First(first), _) => {
                if index == 0 {
                    *first = value.clone();
                }
            }
            (Partial::Count(total), _) => {
                if let Some(v) = value {
                    let n = count(&row[v.clone()], fold.encoding)?;
                    *total = total.checked_add(n).ok_or_else(overflow)?;
                }
            }
            (Partial::Sum(sum), _) => {
                if let Some(v) = value {
                    let n = Number::parse(&row[v.clone()], definition, fold.encoding)?;
                    *sum = Some(match sum.take() {
                        Some(s) => s.add(n)?,
                        None => n,
                    });
                }
            }
            (
                Partial::Avg { sum, count },
                Combine::Avg {
                    sum: at_sum,
                    count: at_count,
                },
            ) => {
                let hidden_sum = &values[fold.visible + at_sum];
                let hidden_count = &values[fold.visible + at_count];
                if let (Some(s), Some(c)) = (hidden_sum, hidden_count) {
                    let n = Number::parse(
                        &row[s.clone()],
                        &fold.columns[fold.visible + at_sum],
                        fold.encoding,
                    )?;
                    *sum = Some(match sum.take() {
                        Some(total) => total.add(n)?,
                        None => n,
                    });
                    let c = self::count(&row[c.clone()], fold.encoding)?;
                    *count = count.checked_add(c).ok_or_else(overflow)?;
                }
            }
            (
                Partial::Extreme(kept),
                Combine::Min { weight, collation } | Combine::Max { weight, collation },
            ) => {
                let Some(v) = value else { continue };
                let order = match order {
                    Some(order) => order,
                    None => order.insert(KeyOrder::of(definition)?),
                };
                if let Some(name) = &values[fold.visible + collation] {
                    order.learn(&row[name.clone()], fold.collations)?;
                }
                let compared = match order.by_weight() {
                    true => values[fold.visible + weight]
                        .clone()
                        .ok_or_else(malformed)?,
                    false => v.clone(),
                };
                let better = match kept {
                    None => true,
                    Some((at, _, range)) => {
                        let ordering = order.compare(
                            &row[compared.clone()],
                            &rows[*at][range.clone()],
                            fold.encoding,
                        )?;
                        match combine {
                            Combine::Min { .. } => ordering == Ordering::Less,
                            _ => ordering == Ordering::Greater,
                        }
                    }
                };
                if better {
                    *kept = Some((index, v.clone(), compared));
                }
            }
            (Partial::Calc, _) => {}
            _ => return Err(malformed()),
        }
    }
    Ok(())
}

/// A HAVING condition on the combined row: comparisons of its columns with
/// numbers, joined by AND, OR and NOT (SQL's three-valued logic: a NULL
/// compares to unknown, and only a true condition keeps the row).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Having {
    And(Box<Having>, Box<Having>),
    Or(Box<Having>, Box<Having>),
    Not(Box<Having>),
    /// Client's column `column` compared with a number as written in SQL.
    Compare {
        column: usize,
        op: CompareOp,
        number: String,
    },
    IsNull {
        column: usize,
        negated: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareOp {
    Eq,
    NotEq,
    Lt,
    LtEq,
    Gt,
    GtEq,
}

impl Having {
    /// Whether the row's values (payloads, `None`: NULL) satisfy it:
    /// `None` is unknown.
    pub(crate) fn holds(
        &self,
        values: &[Option<Vec<u8>>],
        columns: &[Column],
        encoding: Encoding,
    ) -> Result<Option<bool>, MergeError> {
        Ok(match self {
            Having::And(a, b) | Having::Or(a, b) => {
                let x = a.holds(values, columns, encoding)?;
                let y = b.holds(values, columns, encoding)?;
                // The value that decides alone: false for AND, true for OR.
                let decisive = matches!(self, Having::Or(..));
                match (x, y) {
                    (Some(v), _) | (_, Some(v)) if v == decisive => Some(decisive),
                    (Some(_), Some(_)) => Some(!decisive),
                    _ => None,
                }
            }
            Having::Not(a) => a.holds(values, columns, encoding)?.map(|b| !b),
            Having::IsNull { column, negated } => Some(values[*column].is_none() != *negated),
            Having::Compare { column, op, number } => {
                let Some(value) = &values[*column] else {
                    return Ok(None);
                };
                let value = Number::parse(value, &columns[*column], encoding)?;
                let literal = exact(number)
                    .or_else(|| number.parse().ok().map(Number::Float))
                    .ok_or_else(malformed)?;
                let ordering = value.compare(literal).ok_or_else(malformed)?;
                Some(match op {
                    CompareOp::Eq => ordering == Ordering::Equal,
                    CompareOp::NotEq => ordering != Ordering::Equal,
                    CompareOp::Lt => ordering == Ordering::Less,
                    CompareOp::LtEq => ordering != Ordering::Greater,
                    CompareOp::Gt => ordering == Ordering::Greater,
                    CompareOp::GtEq => ordering != Ordering::Less,
                })
            }
        })
    }
}

impl Number {
    fn compare(self, other: Number) -> Option<Ordering> {
        match (self, other) {
            (Number::Exact(a, s), Number::Exact(b, t)) => {
                let scale = s.max(t);
                Some(rescale(a, s, scale)?.cmp(&rescale(b, t, scale)?))
            }
            (a, b) => a.as_f64().partial_cmp(&b.as_f64()),
        }
    }

    fn as_f64(self) -> f64 {
        match self {
            Number::Float(f) => f,
            Number::Exact(v, s) => v as f64 / 10f64.powi(s as i32),
        }
    }
}

/// The values of a group's row (payloads in `encoding`), before it is written.
pub(crate) fn finish(
    partials: &[Partial],
    rows: &[bytes::Bytes],
    columns: &[Column],
    encoding: Encoding,
) -> Result<Vec<Option<Vec<u8>>>, MergeError> {
    let mut values: Vec<Option<Vec<u8>>> = Vec::with_capacity(partials.len());
    for (partial, column) in partials.iter().zip(columns) {
        values.push(match partial {
            Partial::First(value) => value.clone().map(|v| rows[0][v].to_vec()),
            Partial::Count(n) => Some(match encoding {
                Encoding::Text => n.to_string().into_bytes(),
                Encoding::Binary => (*n as i64).to_le_bytes().to_vec(),
            }),
            Partial::Sum(sum) => sum.map(|s| s.write(column, encoding)).transpose()?,
            Partial::Extreme(kept) => kept.clone().map(|(at, v, _)| rows[at][v].to_vec()),
            Partial::Avg { sum, count } => match (sum, *count) {
                (Some(sum), count) if count > 0 => Some(sum.divide(count, column, encoding)?),
                _ => None,
            },
            Partial::Calc => None,
        });
    }
    Ok(values)
}

/// Computes the `Calc` columns of a finished group from its other values.
pub(crate) fn calculate(
    values: &mut [Option<Vec<u8>>],
    combines: &[Combine],
    calcs: &[Calc],
    columns: &[Column],
    visible: usize,
    encoding: Encoding,
) -> Result<(), MergeError> {
    for (i, combine) in combines.iter().enumerate() {
        let Combine::Calc(k) = combine else { continue };
        let calc = calcs.get(*k).ok_or_else(malformed)?;
        let scale = u32::from(columns[i].decimals()).min(38);
        let operands = Operands {
            values,
            columns,
            visible,
            encoding,
        };
        values[i] = match operands.eval(calc, Some(scale))? {
            Some(n) => Some(write_calculated(n, &columns[i], encoding)?),
            None => None,
        };
    }
    Ok(())
}

struct Operands<'a> {
    values: &'a [Option<Vec<u8>>],
    columns: &'a [Column],
    visible: usize,
    encoding: Encoding,
}

fn unsupported(what: &str) -> MergeError {
    MergeError::Unsupported(format!("{what} in an expression over aggregates"))
}

impl Operands<'_> {
    /// `divide_at`: the scale of an outermost division's result.
    fn eval(&self, calc: &Calc, divide_at: Option<u32>) -> Result<Option<Number>, MergeError> {
        Ok(match calc {
            Calc::Hidden(at) => {
                let i = self.visible + at;
                let column = self.columns.get(i).ok_or_else(malformed)?;
                if !is_number(column) {
                    return Err(unsupported("a value that is not a number"));
                }
                match &self.values[i] {
                    Some(bytes) => Some(Number::parse(bytes, column, self.encoding)?),
                    None => None,
                }
            }
            Calc::Literal(text) => Some(match exact(text) {
                Some(n) => n,
                None => Number::Float(text.parse().map_err(|_| malformed())?),
            }),
            Calc::Negate(inner) => self.eval(inner, None)?.map(Number::negate),
            Calc::Binary(left, op, right) => {
                let (Some(a), Some(b)) = (self.eval(left, None)?, self.eval(right, None)?) else {
                    return Ok(None);
                };
                match op {
                    Arithmetic::Add => Some(a.add(b)?),
                    Arithmetic::Subtract => Some(a.add(b.negate())?),
                    Arithmetic::Multiply => Some(a.multiply(b)?),
                    Arithmetic::Divide => {
                        let scale = divide_at.ok_or_else(|| unsupported("a division inside"))?;
                        a.divide_by(b, scale)?
                    }
                }
            }
        })
    }
}

fn is_number(column: &Column) -> bool {
    use ColumnType::*;
    matches!(
        column.column_type(),
        MYSQL_TYPE_TINY
            | MYSQL_TYPE_SHORT
            | MYSQL_TYPE_INT24
            | MYSQL_TYPE_LONG
            | MYSQL_TYPE_LONGLONG
            | MYSQL_TYPE_FLOAT
            | MYSQL_TYPE_DOUBLE
            | MYSQL_TYPE_DECIMAL
            | MYSQL_TYPE_NEWDECIMAL
    )
}

/// A computed number as a column of the type MariaDB gave the expression.
fn write_calculated(n: Number, column: &Column, encoding: Encoding) -> Result<Vec<u8>, MergeError> {
    use ColumnType::*;
    let width = match column.column_type() {
        MYSQL_TYPE_DOUBLE | MYSQL_TYPE_FLOAT => {
            return Ok(write_float(n.to_f64(), encoding));
        }
        MYSQL_TYPE_DECIMAL | MYSQL_TYPE_NEWDECIMAL => 0,
        MYSQL_TYPE_TINY => 1,
        MYSQL_TYPE_SHORT => 2,
        MYSQL_TYPE_INT24 | MYSQL_TYPE_LONG => 4,
        MYSQL_TYPE_LONGLONG => 8,
        _ => return Err(unsupported("a result that is not a number")),
    };
    if matches!(n, Number::Float(_)) {
        return Err(unsupported("a double whose column is exact"));
    }
    let text = n.write(column, encoding)?;
    match (encoding, width) {
        (Encoding::Binary, 1..) => {
            let v: i128 = std::str::from_utf8(&text)
                .ok()
                .and_then(|t| t.parse().ok())
                .ok_or_else(malformed)?;
            let bytes = (v as i64).to_le_bytes();
            Ok(bytes[..width].to_vec())
        }
        _ => Ok(text),
    }
}

/// A COUNT's value.
fn count(value: &[u8], encoding: Encoding) -> Result<i128, MergeError> {
    match encoding {
        Encoding::Text => std::str::from_utf8(value).ok().and_then(|s| s.parse().ok()),
        Encoding::Binary => binary_integer(value, false),
    }
    .ok_or_else(malformed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_are_written_as_mariadb_writes_them() {
        for (f, text) in [
            (1e20, "1e20"),
            (1.5e-7, "0.00000015"),
            (1.0 / 3.0, "0.3333333333333333"),
            (0.1 + 0.2, "0.30000000000000004"),
            (100000.0, "100000"),
            (1e15, "1e15"),
            (1e14 + 0.5, "100000000000000.5"),
            (-2.5e-5, "-0.000025"),
            (1e-15, "0.000000000000001"),
            (1e-16, "1e-16"),
            (1.5e15, "1.5e15"),
            (-0.0, "0"),
            (1.2345678901234568e16, "1.2345678901234568e16"),
        ] {
            assert_eq!(write_double(f), text, "{f:e}");
        }
    }

    #[test]
    fn decimals_add_and_divide_exactly() {
        let n = |s: &str| exact(s).unwrap();
        let Number::Exact(v, s) = n("1.11").add(n("2.22")).unwrap().add(n("-0.5")).unwrap() else {
            panic!()
        };
        assert_eq!(write_exact(v, s), "2.83");
        assert_eq!(write_exact(-5, 2), "-0.05");
        assert_eq!(write_exact(0, 0), "0");
        assert!(n("99999999999999999999999999999999999999")
            .add(n("99999999999999999999999999999999999999"))
            .is_err());
    }

    #[test]
    fn divisions_round_half_away_from_zero_at_the_columns_scale() {
        let n = |s: &str| exact(s).unwrap();
        let quotient = |a: &str, b: &str, scale| match n(a).divide_by(n(b), scale).unwrap() {
            Some(Number::Exact(v, s)) => write_exact(v, s),
            other => format!("{other:?}"),
        };
        assert_eq!(quotient("2", "3", 4), "0.6667");
        assert_eq!(quotient("-2", "3", 4), "-0.6667");
        assert_eq!(quotient("1", "8", 2), "0.13");
        assert_eq!(quotient("-1", "8", 2), "-0.13");
        assert_eq!(quotient("1.00", "0.3", 6), "3.333333");
        assert_eq!(quotient("7.5", "2.5", 5), "3.00000");
        assert_eq!(quotient("1", "0", 4), "None");
        let Number::Exact(v, s) = n("1.5").multiply(n("-0.25")).unwrap() else {
            panic!()
        };
        assert_eq!(write_exact(v, s), "-0.375");
    }
}

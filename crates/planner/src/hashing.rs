//! Hashing functions: how a value of the partition column maps to the partition
//! value that picks its partition. Values are typed by the column they belong
//! to, and compared the way MariaDB compares them for that column, so that a
//! row is always looked for in the partition it was stored in.

use std::borrow::Cow;
use std::fmt;

use unicode_normalization::char::is_combining_mark;

use crate::collation::Folding;
use unicode_normalization::UnicodeNormalization;

/// What kind of values the partition column holds; decides how a literal is
/// read (MariaDB compares `id = '05'` as a number on an INT column).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnKind {
    Integer,
    /// DECIMAL, FLOAT, DOUBLE: only NONE and HASH partition them.
    Decimal,
    /// CHAR, VARCHAR, TEXT and binary strings.
    Text,
    /// ENUM and SET: a number would name a member's index, so only strings route.
    Enum,
    /// DATE, DATETIME, TIMESTAMP.
    Temporal,
}

impl ColumnKind {
    /// From information_schema.COLUMNS.DATA_TYPE.
    pub fn from_data_type(data_type: &str) -> Option<ColumnKind> {
        let t = data_type.to_ascii_lowercase();
        Some(match t.as_str() {
            "tinyint" | "smallint" | "mediumint" | "int" | "integer" | "bigint" | "year"
            | "bit" => ColumnKind::Integer,
            "decimal" | "numeric" | "float" | "double" | "real" => ColumnKind::Decimal,
            "char" | "varchar" | "tinytext" | "text" | "mediumtext" | "longtext" | "binary"
            | "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob" => ColumnKind::Text,
            "enum" | "set" => ColumnKind::Enum,
            "date" | "datetime" | "timestamp" => ColumnKind::Temporal,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            ColumnKind::Integer => "integer",
            ColumnKind::Decimal => "decimal",
            ColumnKind::Text => "text",
            ColumnKind::Enum => "enum",
            ColumnKind::Temporal => "temporal",
        }
    }

    pub fn parse_name(name: &str) -> Option<ColumnKind> {
        [
            ColumnKind::Integer,
            ColumnKind::Decimal,
            ColumnKind::Text,
            ColumnKind::Enum,
            ColumnKind::Temporal,
        ]
        .into_iter()
        .find(|k| k.name() == name)
    }
}

/// A literal as the client wrote it; borrowed from the statement where its
/// text needs no unescaping, so routing a cached shape copies nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value<'a> {
    /// A number literal, as written (`12`, `-3`, `1.50`, `1e3`).
    Number(Cow<'a, str>),
    String(Cow<'a, str>),
    Null,
}

impl Value<'_> {
    /// The same value, borrowing this one's text.
    pub fn reborrow(&self) -> Value<'_> {
        match self {
            Value::Number(n) => Value::Number(Cow::Borrowed(n)),
            Value::String(s) => Value::String(Cow::Borrowed(s)),
            Value::Null => Value::Null,
        }
    }

    /// The same value, owning its text.
    pub fn into_owned(self) -> Value<'static> {
        match self {
            Value::Number(n) => Value::Number(Cow::Owned(n.into_owned())),
            Value::String(s) => Value::String(Cow::Owned(s.into_owned())),
            Value::Null => Value::Null,
        }
    }
}

/// A hashing function of the dictionary (DESIGN.md §5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashFunction {
    None,
    Mod(u64),
    Div(u64),
    Prefix(usize),
    Date(String),
    Hash(u64),
}

/// Why a value cannot be hashed, or a function cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HashError {
    #[error("'{0}' is not a hashing function: use NONE(), MOD(n), DIV(n), PREFIX(n), DATE('fmt') or HASH(n)")]
    UnknownFunction(String),
    #[error("{function} needs a positive integer argument")]
    BadArgument { function: &'static str },
    #[error("DATE('{0}') is not a valid format: use %Y, %m, %d, %H, %M, %S, %j")]
    BadDateFormat(String),
    #[error("{function} cannot partition a {kind} column")]
    WrongColumn {
        function: &'static str,
        kind: &'static str,
    },
    #[error("'{value}' is not a value of the {kind} partition column")]
    WrongValue { value: String, kind: &'static str },
    #[error("NULL has no partition value")]
    Null,
    #[error("partition value '{value}' can never come out of {function}")]
    Unreachable { value: String, function: String },
}

impl fmt::Display for HashFunction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HashFunction::None => write!(f, "NONE()"),
            HashFunction::Mod(n) => write!(f, "MOD({n})"),
            HashFunction::Div(n) => write!(f, "DIV({n})"),
            HashFunction::Prefix(n) => write!(f, "PREFIX({n})"),
            HashFunction::Date(fmt) => write!(f, "DATE('{}')", fmt.replace('\'', "''")),
            HashFunction::Hash(n) => write!(f, "HASH({n})"),
        }
    }
}

const DATE_SPECIFIERS: &[char] = &['Y', 'm', 'd', 'H', 'M', 'S', 'j', '%'];

impl HashFunction {
    /// Parses `MOD(3)`, `prefix( 3 )`, `DATE('%Y-%m')`, `NONE()`, `NONE`.
    pub fn parse(text: &str) -> Result<HashFunction, HashError> {
        let unknown = || HashError::UnknownFunction(text.to_string());
        let text = text.trim();
        let (name, arg) = match text.find('(') {
            Some(open) => {
                let arg = text[open + 1..].strip_suffix(')').ok_or_else(unknown)?;
                (text[..open].trim(), arg.trim())
            }
            None => (text, ""),
        };
        let count = |function: &'static str| -> Result<u64, HashError> {
            arg.parse::<u64>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or(HashError::BadArgument { function })
        };
        match name.to_ascii_uppercase().as_str() {
            "NONE" if arg.is_empty() => Ok(HashFunction::None),
            "MOD" => Ok(HashFunction::Mod(count("MOD")?)),
            "DIV" => Ok(HashFunction::Div(count("DIV")?)),
            "HASH" => Ok(HashFunction::Hash(count("HASH")?)),
            "PREFIX" => Ok(HashFunction::Prefix(count("PREFIX")? as usize)),
            "DATE" => {
                let quoted = arg
                    .strip_prefix('\'')
                    .and_then(|a| a.strip_suffix('\''))
                    .or_else(|| arg.strip_prefix('"').and_then(|a| a.strip_suffix('"')))
                    .ok_or(HashError::BadDateFormat(arg.to_string()))?;
                let format = quoted.replace("''", "'");
                check_date_format(&format)?;
                Ok(HashFunction::Date(format))
            }
            _ => Err(unknown()),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            HashFunction::None => "NONE()",
            HashFunction::Mod(_) => "MOD",
            HashFunction::Div(_) => "DIV",
            HashFunction::Prefix(_) => "PREFIX",
            HashFunction::Date(_) => "DATE",
            HashFunction::Hash(_) => "HASH",
        }
    }

    /// Whether this function can partition a column of `kind`.
    pub fn check_column(&self, kind: ColumnKind) -> Result<(), HashError> {
        let fits = match self {
            HashFunction::None | HashFunction::Hash(_) => true,
            HashFunction::Mod(_) | HashFunction::Div(_) => kind == ColumnKind::Integer,
            HashFunction::Prefix(_) => kind != ColumnKind::Decimal,
            HashFunction::Date(_) => matches!(kind, ColumnKind::Temporal | ColumnKind::Text),
        };
        match fits {
            true => Ok(()),
            false => Err(HashError::WrongColumn {
                function: self.name(),
                kind: kind.name(),
            }),
        }
    }

    /// The partition value of a column value.
    pub fn apply<'a>(
        &self,
        kind: ColumnKind,
        folding: &Folding,
        value: &'a Value,
    ) -> Result<Cow<'a, str>, HashError> {
        let canonical = canonical(kind, folding, value)?;
        Ok(match self {
            HashFunction::None => return Ok(canonical),
            HashFunction::Mod(n) => (as_integer(&canonical) % i128::from(*n)).to_string(),
            HashFunction::Div(n) => as_integer(&canonical)
                .div_euclid(i128::from(*n))
                .to_string(),
            HashFunction::Prefix(n) => match canonical.char_indices().nth(*n) {
                Some((end, _)) => return Ok(cut(canonical, end)),
                None => return Ok(canonical),
            },
            HashFunction::Date(format) => format_date(format, &canonical, kind)?,
            HashFunction::Hash(n) => {
                (u64::from(crc32fast::hash(canonical.as_bytes())) % n).to_string()
            }
        }
        .into())
    }

    /// Values of an integer column, one for each partition value the
    /// values from `low` to `high` (inclusive) map to, when there are at
    /// most `most`; `None` when there are more, or the function or the ends
    /// do not let them be listed (strings, fractions, PREFIX, DATE).
    pub fn representatives(
        &self,
        kind: ColumnKind,
        low: &Value,
        high: &Value,
        most: usize,
    ) -> Option<Vec<Value<'static>>> {
        if kind != ColumnKind::Integer {
            return None;
        }
        let end = |v: &Value| {
            canonical(kind, &Folding::Legacy, v)
                .ok()?
                .parse::<i128>()
                .ok()
        };
        let (low, high) = (end(low)?, end(high)?);
        // Runs of values that reach every partition value the range does,
        // and the step between values within a run that reach another.
        let no_run = (1, 0);
        let (runs, step) = match self {
            // MOD repeats every n values on each side of zero (its sign
            // follows the value's): n values of each side stand for all.
            HashFunction::Mod(n) => {
                let n = i128::from(*n);
                let run = |from: i128, to: i128| (from, to.min(from.saturating_add(n - 1)));
                ([run(low, high.min(-1)), run(low.max(0), high)], 1)
            }
            // DIV maps each run of n values to one partition value: one of each.
            HashFunction::Div(n) => ([(low, high), no_run], i128::from(*n)),
            HashFunction::None | HashFunction::Hash(_) => ([(low, high), no_run], 1),
            HashFunction::Prefix(_) | HashFunction::Date(_) => return None,
        };
        let mut values = Vec::new();
        for (from, to) in runs {
            let mut v = from;
            while v <= to {
                if values.len() == most {
                    return None;
                }
                values.push(Value::Number(Cow::Owned(v.to_string())));
                v = (v.div_euclid(step) + 1) * step;
            }
        }
        Some(values)
    }

    /// A partition value an admin gave, brought to the form `apply` produces
    /// (`'1'` and `1` are the same for MOD; 'MAR' is 'mar' for PREFIX).
    pub fn partition_value(
        &self,
        kind: ColumnKind,
        folding: &Folding,
        value: &Value,
    ) -> Result<String, HashError> {
        let unreachable = |value: String| HashError::Unreachable {
            value,
            function: self.to_string(),
        };
        let text = match value {
            Value::Null => return Err(HashError::Null),
            Value::Number(s) | Value::String(s) => s.trim().to_string(),
        };
        match self {
            HashFunction::None => canonical(kind, folding, value).map(Cow::into_owned),
            HashFunction::Mod(n) | HashFunction::Hash(n) => match text.parse::<i128>() {
                // MOD of a negative value is negative, as in MariaDB.
                Ok(v) if matches!(self, HashFunction::Mod(_)) && v.abs() < i128::from(*n) => {
                    Ok(v.to_string())
                }
                Ok(v) if (0..i128::from(*n)).contains(&v) => Ok(v.to_string()),
                _ => Err(unreachable(text)),
            },
            HashFunction::Div(_) => text
                .parse::<i128>()
                .map(|v| v.to_string())
                .map_err(|_| unreachable(text)),
            HashFunction::Prefix(n) => {
                let folded = match kind {
                    ColumnKind::Text | ColumnKind::Enum => folding.fold(&text),
                    _ => fold(&text),
                };
                match folded.chars().count() <= *n && !folded.is_empty() {
                    true => Ok(folded.into_owned()),
                    false => Err(unreachable(text)),
                }
            }
            HashFunction::Date(_) => Ok(text),
        }
    }
}

/// The value as the column holds it: integers in decimal, text folded as
/// its collation compares it, dates as `YYYY-MM-DD HH:MM:SS`.
fn canonical<'a>(
    kind: ColumnKind,
    folding: &Folding,
    value: &'a Value,
) -> Result<Cow<'a, str>, HashError> {
    let wrong = |v: &str| HashError::WrongValue {
        value: v.to_string(),
        kind: kind.name(),
    };
    match (kind, value) {
        (_, Value::Null) => Err(HashError::Null),
        (ColumnKind::Integer, Value::Number(n) | Value::String(n)) => {
            let n = n.trim();
            // The common case, a plain decimal integer, is its own canonical form.
            let plain = |n: &str| {
                let digits = n.strip_prefix('-').unwrap_or(n);
                !digits.is_empty()
                    && digits.bytes().all(|b| b.is_ascii_digit())
                    && (digits == "0" || !digits.starts_with('0'))
                    && n != "-0"
                    && digits.len() < 38
            };
            if plain(n) {
                return Ok(Cow::Borrowed(n));
            }
            parse_integer(n)
                .map(|v| Cow::Owned(v.to_string()))
                .ok_or_else(|| wrong(n))
        }
        (ColumnKind::Decimal, Value::Number(n) | Value::String(n)) => canonical_decimal(n.trim())
            .map(Cow::Owned)
            .ok_or_else(|| wrong(n)),
        (ColumnKind::Text, Value::Number(n)) => Ok(Cow::Borrowed(n)),
        (ColumnKind::Text | ColumnKind::Enum, Value::String(s)) => Ok(folding.fold(s)),
        (ColumnKind::Enum, Value::Number(n)) => Err(wrong(n)),
        (ColumnKind::Temporal, Value::String(s)) => canonical_datetime(s)
            .map(Cow::Owned)
            .ok_or_else(|| wrong(s)),
        (ColumnKind::Temporal, Value::Number(n)) => Err(wrong(n)),
    }
}

/// An integer literal; `5.0` is 5 as MariaDB compares it, `5.5` is no integer.
fn parse_integer(text: &str) -> Option<i128> {
    if let Ok(v) = text.parse::<i128>() {
        return Some(v);
    }
    let decimal = canonical_decimal(text)?;
    decimal.parse::<i128>().ok()
}

/// A decimal literal without redundant zeros: `5.50` -> `5.5`, `5.0` -> `5`.
fn canonical_decimal(text: &str) -> Option<String> {
    let (sign, digits) = match text.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", text.strip_prefix('+').unwrap_or(text)),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    let valid = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if !valid(int) || !valid(frac) || (int.is_empty() && frac.is_empty()) {
        return None;
    }
    let int = int.trim_start_matches('0');
    let frac = frac.trim_end_matches('0');
    let int = if int.is_empty() { "0" } else { int };
    let body = match frac.is_empty() {
        true => int.to_string(),
        false => format!("{int}.{frac}"),
    };
    Some(match (sign, body.as_str()) {
        (_, "0") => body,
        _ => format!("{sign}{body}"),
    })
}

fn as_integer(canonical: &str) -> i128 {
    canonical.parse().unwrap_or(0)
}

/// Text as hscale folded it before it read collations (`Folding::Legacy`),
/// as a `_ci` collation compares it: trailing spaces do not count (PAD
/// SPACE), case does not count, accents do not count (utf8mb4_general_ci
/// compares 'é' equal to 'e'). Folding more than the column's collation is
/// safe (equal values still meet in one partition); folding less is not.
pub fn fold(text: &str) -> Cow<'_, str> {
    let text = text.trim_end_matches(' ');
    if text.is_ascii() {
        return match text.bytes().any(|b| b.is_ascii_uppercase()) {
            true => Cow::Owned(text.to_ascii_lowercase()),
            false => Cow::Borrowed(text),
        };
    }
    text.nfd()
        .filter(|c| !is_combining_mark(*c))
        .flat_map(char::to_lowercase)
        .collect()
}

/// The first `end` bytes of a string, borrowed where it was.
fn cut(text: Cow<'_, str>, end: usize) -> Cow<'_, str> {
    match text {
        Cow::Borrowed(s) => Cow::Borrowed(&s[..end]),
        Cow::Owned(mut s) => {
            s.truncate(end);
            Cow::Owned(s)
        }
    }
}

/// `2008-05-06`, `2008-05-06 12:00:01`, `2008-05-06T12:00:01.5` ->
/// `2008-05-06 12:00:01` (fractions dropped: they never change a partition).
fn canonical_datetime(text: &str) -> Option<String> {
    let text = text.trim();
    let date = text.get(..10)?;
    let bytes = date.as_bytes();
    let shape = bytes.iter().enumerate().all(|(i, b)| match i {
        4 | 7 => *b == b'-',
        _ => b.is_ascii_digit(),
    });
    if !shape {
        return None;
    }
    let rest = text[10..].trim_start_matches([' ', 'T']);
    let time = rest.split('.').next().unwrap_or("");
    let mut parts = [0u32; 3];
    if !time.is_empty() {
        for (slot, part) in parts.iter_mut().zip(time.split(':')) {
            *slot = part.parse().ok()?;
        }
    }
    Some(format!(
        "{date} {:02}:{:02}:{:02}",
        parts[0], parts[1], parts[2]
    ))
}

fn check_date_format(format: &str) -> Result<(), HashError> {
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c == '%' && !chars.next().is_some_and(|s| DATE_SPECIFIERS.contains(&s)) {
            return Err(HashError::BadDateFormat(format.to_string()));
        }
    }
    Ok(())
}

fn format_date(format: &str, canonical: &str, kind: ColumnKind) -> Result<String, HashError> {
    let datetime = match kind {
        ColumnKind::Temporal => canonical.to_string(),
        _ => canonical_datetime(canonical).ok_or_else(|| HashError::WrongValue {
            value: canonical.to_string(),
            kind: "date",
        })?,
    };
    let field = |range: std::ops::Range<usize>| &datetime[range];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(field(0..4)),
            Some('m') => out.push_str(field(5..7)),
            Some('d') => out.push_str(field(8..10)),
            Some('H') => out.push_str(field(11..13)),
            Some('M') => out.push_str(field(14..16)),
            Some('S') => out.push_str(field(17..19)),
            Some('j') => out.push_str(&format!("{:03}", day_of_year(&datetime))),
            _ => out.push('%'),
        }
    }
    Ok(out)
}

fn day_of_year(datetime: &str) -> u32 {
    let year: u32 = datetime[0..4].parse().unwrap_or(0);
    let month: usize = datetime[5..7].parse().unwrap_or(1);
    let day: u32 = datetime[8..10].parse().unwrap_or(1);
    let leap = (year.is_multiple_of(4) && !year.is_multiple_of(100)) || year.is_multiple_of(400);
    let days = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    days.iter().take(month.saturating_sub(1)).sum::<u32>() + day
}

#[cfg(test)]
mod tests;

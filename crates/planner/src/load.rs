//! LOAD DATA LOCAL INFILE into a partitioned table. The client sends the
//! file to hscale, which reads its lines as the server would (the
//! statement's FIELDS and LINES), places each by its partition column's
//! value, and has each partition table's backend load that partition's lines,
//! passed on byte for byte: the server reads every value itself, hscale only
//! the ones that place the row.
//!
//! The reading follows MariaDB's `READ_INFO::read_field` (sql_load.cc): a
//! field that starts with the ENCLOSED BY character runs to that character
//! followed by a field or line terminator (two of them are one in the value);
//! any other field runs to the next terminator; the ESCAPED BY character
//! takes the next byte as it is (`\N` alone is NULL, `\n`, `\t`, ... the
//! usual escapes). Formats whose reading differs more (fixed-width rows,
//! LINES STARTING BY, an escape that is also the quote, LOAD XML) are refused.

use std::sync::Arc;

use crate::auto::{id_value, not_an_id, IdValue};
use crate::cache::unquote;
use crate::dictionary::{PartitionedTable, Target};
use crate::error::PlanError;
use crate::hashing::Value;
use crate::lexer::{Token, TokenKind, Tokens};
use crate::plan::{Action, Context, Refusal};
use crate::rewrite::quote_identifier;
use crate::show::{identifier, table_name, word_at};

/// A LOAD DATA LOCAL INFILE into a partitioned table, planned.
#[derive(Debug, Clone, PartialEq)]
pub struct Load {
    pub table: Arc<PartitionedTable>,
    /// The file's name, as the client asked for it: hscale asks the client
    /// for it by that name.
    pub file: String,
    pub format: Format,
    /// IGNORE n LINES: hscale skips them; the backends get the rest.
    pub ignore_lines: u64,
    /// REPLACE: a duplicate replaces its row (the answer's `Deleted`).
    pub replace: bool,
    /// The field that holds the partition column.
    column: usize,
    /// How many fields of a line the server reads: the column list's
    /// length; `None`: the table's columns, which the proxy asks for.
    pub listed: Option<usize>,
    /// The field that holds the AUTO_INCREMENT column hscale hands ids out
    /// for, if the table has one.
    auto: Option<usize>,
    /// CHARACTER SET utf8 or utf8mb4: the file's text reads as UTF-8. In any
    /// other (the database's by default) hscale reads ASCII values only.
    utf8: bool,
    no_auto_value_on_zero: bool,
    /// The statement up to the table's name and after it (without IGNORE n
    /// LINES), each backend's with its partition table's name between.
    before: String,
    after: String,
}

/// How the file's lines and fields are delimited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Format {
    pub field_end: Vec<u8>,
    pub enclosed: Option<u8>,
    pub escape: Option<u8>,
    pub line_end: Vec<u8>,
}

impl Default for Format {
    /// MariaDB's defaults: tab-separated, backslash escapes, one line a row.
    fn default() -> Format {
        Format {
            field_end: b"\t".to_vec(),
            enclosed: None,
            escape: Some(b'\\'),
            line_end: b"\n".to_vec(),
        }
    }
}

/// One line of the file, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// Its length in the buffer, with its terminator.
    pub len: usize,
    /// The values of the fields asked for, by field index; a field the line
    /// does not have is absent.
    pub values: Vec<(usize, Field)>,
}

/// A field's value as the server stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    Null,
    Text(Vec<u8>),
}

/// What placing a line decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub target: Target,
    /// The AUTO_INCREMENT id the line gives, which the sequence moves past.
    pub id: Option<u64>,
}

/// The plan of a LOAD DATA that names a partitioned table: `None` when it
/// names none (or is no LOAD DATA); a refusal for what hscale cannot load.
pub(crate) fn load_data(sql: &str, ctx: &Context) -> Option<Action> {
    let tokens: Vec<Token> = Tokens::new(sql.as_bytes(), ctx.quoting).collect();
    let word = |i: usize| word_at(sql, &tokens, i);
    if word(0).as_deref() != Some("load") {
        return None;
    }
    let xml = match word(1).as_deref() {
        Some("data") => false,
        Some("xml") => true,
        _ => return None,
    };
    let mut at = 2;
    while matches!(word(at).as_deref(), Some("low_priority" | "concurrent")) {
        at += 1;
    }
    let local = word(at).as_deref() == Some("local");
    at += usize::from(local);
    if word(at).as_deref() != Some("infile") {
        return None;
    }
    let file = tokens.get(at + 1).and_then(|t| match t.kind {
        TokenKind::Quoted(q @ (b'\'' | b'"')) => {
            unquote(&sql.as_bytes()[t.start + 1..t.end - 1], q, ctx.quoting)
        }
        _ => None,
    });
    at += 2;
    let replace = word(at).as_deref() == Some("replace");
    if matches!(word(at).as_deref(), Some("replace" | "ignore")) {
        at += 1;
    }
    if word(at).as_deref() != Some("into") || word(at + 1).as_deref() != Some("table") {
        return None;
    }
    at += 2;
    let (name, taken) = table_name(sql, &tokens[at.min(tokens.len())..], ctx);
    let name = name?;
    let table = ctx.dictionary.shared_table(&name.db, &name.name)?;
    let refuse = |reason: &str| {
        Some(Action::Refuse(Refusal {
            table: Some(table.table.clone()),
            reason: reason.into(),
        }))
    };
    if xml {
        return refuse(
            "LOAD XML into a partitioned table: hscale reads the rows it places from LOAD DATA \
             LOCAL INFILE and INSERT only",
        );
    }
    if !local {
        return refuse(
            "LOAD DATA INFILE of a file on the server into a partitioned table: hscale must read \
             the rows to place them (use LOAD DATA LOCAL INFILE, or mariadb-import --local)",
        );
    }
    let Some(file) = file else {
        return refuse("LOAD DATA with a file name hscale cannot read");
    };
    if table.held() {
        return Some(Action::Wait(table.table.clone()));
    }
    let name_span = tokens[at].start..tokens[at + taken - 1].end;
    at += taken;
    let mut parsed = Clauses::default();
    if let Err(reason) = parsed.read(sql, &tokens, at, ctx) {
        return refuse(&reason.to_string());
    }
    let field_of = |column: &str, position: usize| {
        match &parsed.columns {
            None => Ok(Some(position - 1)),
            Some(columns) => Ok(columns
                .iter()
                .position(|c| c.as_deref().is_some_and(|c| c.eq_ignore_ascii_case(column)))),
        }
        .and_then(|field| {
            match parsed.set.iter().any(|s| s.eq_ignore_ascii_case(column)) {
                true => Err(PlanError::Refuse(format!(
            "LOAD DATA that sets the column `{column}` in its SET clause: hscale places rows \
             by the values the file gives"
        ))),
                false => Ok(field),
            }
        })
    };
    let auto = match &table.auto_column {
        None => None,
        Some(auto) => match field_of(&auto.name, auto.position) {
            Ok(Some(field)) => Some(field),
            Ok(None) => {
                return refuse(&format!(
                    "LOAD DATA whose column list lacks the AUTO_INCREMENT column `{}` (hscale \
                     hands out its ids: give every row its id)",
                    auto.name
                ))
            }
            Err(reason) => return refuse(&reason.to_string()),
        },
    };
    let column = match field_of(&table.column, table.column_position) {
        Ok(Some(field)) => field,
        Ok(None) => {
            return refuse(&format!(
                "LOAD DATA whose column list lacks the partition column `{}`",
                table.column
            ))
        }
        Err(reason) => return refuse(&reason.to_string()),
    };
    let mut after = String::with_capacity(sql.len() - name_span.end);
    let mut from = name_span.end;
    if let Some(ignore) = &parsed.ignore_span {
        after.push_str(&sql[from..ignore.start]);
        from = ignore.end;
    }
    after.push_str(&sql[from..]);
    Some(Action::Load(Box::new(Load {
        file,
        listed: parsed.columns.as_ref().map(Vec::len),
        format: parsed.format,
        ignore_lines: parsed.ignore_lines,
        replace,
        column,
        auto,
        utf8: parsed.utf8,
        no_auto_value_on_zero: ctx.no_auto_value_on_zero,
        before: format!(
            "{}{}.",
            &sql[..name_span.start],
            quote_identifier(&table.table.db)
        ),
        after,
        table: table.clone(),
    })))
}

/// The clauses after the table's name.
#[derive(Default)]
struct Clauses {
    format: Format,
    utf8: bool,
    ignore_lines: u64,
    ignore_span: Option<std::ops::Range<usize>>,
    /// The column list: a column's name, or `None` for a user variable.
    columns: Option<Vec<Option<String>>>,
    /// The columns the SET clause assigns.
    set: Vec<String>,
}

impl Clauses {
    fn read(
        &mut self,
        sql: &str,
        tokens: &[Token],
        mut at: usize,
        ctx: &Context,
    ) -> Result<(), PlanError> {
        let word = |i: usize| word_at(sql, tokens, i);
        let string = |i: usize| -> Result<Vec<u8>, PlanError> {
            match tokens.get(i) {
                Some(t) if matches!(t.kind, TokenKind::Quoted(b'\'' | b'"')) => {
                    let TokenKind::Quoted(q) = t.kind else {
                        unreachable!()
                    };
                    unquote(&sql.as_bytes()[t.start + 1..t.end - 1], q, ctx.quoting)
                        .map(String::into_bytes)
                        .ok_or_else(|| PlanError::refuse("LOAD DATA with an unreadable string"))
                }
                _ => Err("LOAD DATA with a clause hscale cannot read".into()),
            }
        };
        if word(at).as_deref() == Some("partition") {
            return Err("LOAD DATA into a partitioned table with a PARTITION clause".into());
        }
        // MariaDB's `charset` rule: CHARACTER SET, CHAR SET or CHARSET.
        let charset_words = match (word(at).as_deref(), word(at + 1).as_deref()) {
            (Some("character" | "char"), Some("set")) => 2,
            (Some("charset"), _) => 1,
            _ => 0,
        };
        if charset_words > 0 {
            at += charset_words;
            let charset = identifier(sql, tokens.get(at).ok_or("LOAD DATA")?, ctx)
                .or_else(|| string(at).ok().map(|s| String::from_utf8_lossy(&s).into()))
                .unwrap_or_default()
                .to_ascii_lowercase();
            self.utf8 = matches!(charset.as_str(), "utf8" | "utf8mb3" | "utf8mb4");
            // Their second bytes can be ASCII: a field's end would be misread.
            if matches!(
                charset.as_str(),
                "big5"
                    | "sjis"
                    | "cp932"
                    | "gbk"
                    | "gb18030"
                    | "ucs2"
                    | "utf16"
                    | "utf16le"
                    | "utf32"
            ) {
                return Err(PlanError::Refuse(format!(
                    "LOAD DATA of a file in CHARACTER SET {charset}, whose bytes hscale cannot \
                     split into fields"
                )));
            }
            at += 1;
        }
        if matches!(word(at).as_deref(), Some("fields" | "columns")) {
            at += 1;
            loop {
                match (word(at).as_deref(), word(at + 1).as_deref()) {
                    (Some("terminated"), Some("by")) => {
                        self.format.field_end = string(at + 2)?;
                        at += 3;
                    }
                    (Some("optionally"), Some("enclosed")) => at += 1,
                    (Some("enclosed"), Some("by")) => {
                        self.format.enclosed = one_byte(&string(at + 2)?, "ENCLOSED BY")?;
                        at += 3;
                    }
                    (Some("escaped"), Some("by")) => {
                        self.format.escape = one_byte(&string(at + 2)?, "ESCAPED BY")?;
                        at += 3;
                    }
                    _ => break,
                }
            }
        }
        if word(at).as_deref() == Some("lines") {
            at += 1;
            loop {
                match (word(at).as_deref(), word(at + 1).as_deref()) {
                    (Some("terminated"), Some("by")) => {
                        self.format.line_end = string(at + 2)?;
                        at += 3;
                    }
                    (Some("starting"), Some("by")) => {
                        if !string(at + 2)?.is_empty() {
                            return Err(
                                "LOAD DATA into a partitioned table with LINES STARTING BY".into(),
                            );
                        }
                        at += 3;
                    }
                    _ => break,
                }
            }
        }
        if self.format.field_end.is_empty() || self.format.line_end.is_empty() {
            return Err(
                "LOAD DATA of fixed-width rows (an empty FIELDS or LINES TERMINATED BY) into a \
                 partitioned table"
                    .into(),
            );
        }
        if self.format.escape.is_some() && self.format.escape == self.format.enclosed {
            return Err("LOAD DATA whose ESCAPED BY and ENCLOSED BY are one character".into());
        }
        if word(at).as_deref() == Some("ignore") {
            let count = tokens
                .get(at + 1)
                .filter(|t| t.kind == TokenKind::Number)
                .and_then(|t| sql[t.start..t.end].parse::<u64>().ok())
                .ok_or("LOAD DATA with an IGNORE clause hscale cannot read")?;
            if !matches!(word(at + 2).as_deref(), Some("lines" | "rows")) {
                return Err("LOAD DATA with an IGNORE clause hscale cannot read".into());
            }
            self.ignore_lines = count;
            self.ignore_span = Some(tokens[at].start..tokens[at + 2].end);
            at += 3;
        }
        if tokens
            .get(at)
            .is_some_and(|t| t.kind == TokenKind::Symbol(b'('))
        {
            let mut columns = Vec::new();
            at += 1;
            loop {
                let token = tokens
                    .get(at)
                    .ok_or("LOAD DATA with an unended column list")?;
                match token.kind {
                    TokenKind::Symbol(b')') if columns.is_empty() => {
                        at += 1;
                        break;
                    }
                    TokenKind::UserVariable => {
                        columns.push(None);
                        at += 2;
                    }
                    _ => {
                        let name = identifier(sql, token, ctx)
                            .ok_or("LOAD DATA with a column list hscale cannot read")?;
                        columns.push(Some(name));
                        at += 1;
                    }
                }
                match tokens.get(at).map(|t| t.kind) {
                    Some(TokenKind::Symbol(b',')) => at += 1,
                    Some(TokenKind::Symbol(b')')) => {
                        at += 1;
                        break;
                    }
                    _ => return Err("LOAD DATA with a column list hscale cannot read".into()),
                }
            }
            self.columns = Some(columns);
        }
        if word(at).as_deref() == Some("set") {
            // Every name before a top-level `=` is assigned.
            let mut depth = 0i32;
            for (i, token) in tokens.iter().enumerate().skip(at + 1) {
                match token.kind {
                    TokenKind::Symbol(b'(') => depth += 1,
                    TokenKind::Symbol(b')') => depth -= 1,
                    TokenKind::Symbol(b'=') if depth == 0 => {
                        if let Some(name) = tokens.get(i - 1).and_then(|t| identifier(sql, t, ctx))
                        {
                            self.set.push(name);
                        }
                    }
                    _ => {}
                }
            }
        } else if let Some(t) = tokens.get(at) {
            if t.kind != TokenKind::Symbol(b';') {
                return Err("LOAD DATA with a clause hscale cannot read".into());
            }
        }
        Ok(())
    }
}

fn one_byte(text: &[u8], clause: &str) -> Result<Option<u8>, PlanError> {
    match text {
        [] => Ok(None),
        [c] => Ok(Some(*c)),
        _ => Err(PlanError::Refuse(format!(
            "LOAD DATA with a {clause} of more than one character"
        ))),
    }
}

impl Load {
    /// The statement the backend of `target` runs.
    pub fn statement(&self, target: &Target) -> String {
        format!(
            "{}{}{}",
            self.before,
            quote_identifier(&target.table),
            self.after
        )
    }

    /// The fields a line's placement reads.
    pub fn wanted(&self) -> Vec<usize> {
        let mut wanted = vec![self.column];
        wanted.extend(self.auto.filter(|&a| a != self.column));
        wanted
    }

    /// Where a line goes, by the values `Format::read_line` read of it;
    /// `number` (1-based) names it in a refusal.
    pub fn place(&self, line: &Line, number: u64) -> Result<Placed, PlanError> {
        let value_of = |field: usize| line.values.iter().find(|(f, _)| *f == field);
        let text = |field: &Field, column: &str| -> Result<Value<'static>, PlanError> {
            match field {
                Field::Null => Ok(Value::Null),
                Field::Text(bytes) if bytes.is_ascii() || self.utf8 => {
                    match std::str::from_utf8(bytes) {
                        Ok(text) => Ok(Value::String(text.to_string().into())),
                        Err(_) => Err(PlanError::Refuse(format!(
                            "line {number} of the file: the value of `{column}` is not UTF-8"
                        ))),
                    }
                }
                Field::Text(_) => Err(PlanError::Refuse(format!(
                    "line {number} of the file: a value of `{column}` that is not ASCII, in a \
                     file whose character set hscale does not know (say CHARACTER SET utf8mb4)"
                ))),
            }
        };
        let id = match (&self.table.auto_column, self.auto) {
            (Some(auto), Some(field)) => {
                let missing = || {
                    PlanError::Refuse(format!(
                        "line {number} of the file gives no id for the AUTO_INCREMENT column \
                         `{}` (hscale hands out its ids: give every row its id)",
                        auto.name
                    ))
                };
                let id = match value_of(field) {
                    Some((_, field)) => text(field, &auto.name)?,
                    None => return Err(missing()),
                };
                match id_value(&id, self.no_auto_value_on_zero) {
                    Some(IdValue::Given(id)) => Some(id),
                    Some(IdValue::Kept) => None,
                    Some(IdValue::Generated) => return Err(missing()),
                    None => {
                        return Err(PlanError::Refuse(format!(
                            "line {number} of the file: {}",
                            not_an_id(&auto.name)
                        )))
                    }
                }
            }
            _ => None,
        };
        let column = &self.table.column;
        let value = match value_of(self.column) {
            Some((_, field)) => text(field, column)?,
            None => {
                return Err(PlanError::Refuse(format!(
                    "line {number} of the file has no value for the partition column `{column}`"
                )))
            }
        };
        // The server could store a NULL of a NOT NULL column as its
        // default, in a partition other than the default one.
        if value == Value::Null {
            return Err(PlanError::Refuse(format!(
                "line {number} of the file: NULL for the partition column `{column}`"
            )));
        }
        let target = self
            .table
            .target_for(&value)
            .map_err(|e| format!("line {number} of the file: {e}"))?;
        Ok(Placed { target, id })
    }
}

impl Format {
    /// Skips one line as the server skips IGNORE n LINES: to the next line
    /// terminator, escapes honoured but quotes not. `None`: `buf` holds no
    /// whole line yet (or nothing, at the end).
    pub fn skip_line(&self, buf: &[u8], at_end: bool) -> Option<usize> {
        if buf.is_empty() {
            return None;
        }
        let mut i = 0;
        while i < buf.len() {
            if Some(buf[i]) == self.escape {
                i += 2;
                continue;
            }
            match terminator(&buf[i..], &self.line_end, at_end) {
                Some(true) => return Some(i + self.line_end.len()),
                Some(false) => i += 1,
                None => return None,
            }
        }
        at_end.then_some(buf.len())
    }

    /// Reads the line at the start of `buf`, keeping the values of the
    /// fields in `wanted`; the server reads `fields` of them (the column
    /// list's, or the table's columns) and skips the rest of the line as an
    /// ignored one. `None`: `buf` holds no whole line yet (`at_end` false),
    /// or no line at all (the end of the file).
    pub fn read_line(
        &self,
        buf: &[u8],
        at_end: bool,
        wanted: &[usize],
        fields: usize,
    ) -> Option<Line> {
        let mut line = Line {
            len: 0,
            values: Vec::new(),
        };
        let mut i = 0;
        let mut field = 0;
        loop {
            if i == buf.len() {
                // The file ends where a field would start: no such field,
                // and no line at all if it is the first.
                return match (at_end, field) {
                    (false, _) | (true, 0) => None,
                    (true, _) => Some(Line { len: i, ..line }),
                };
            }
            let keep = wanted.contains(&field);
            let mut value = Vec::new();
            let mut escaped_n = false;
            let quote = self.enclosed.filter(|&q| buf[i] == q);
            if quote.is_some() {
                i += 1;
            }
            // Where the field ends: at a field terminator (true) or the line's end.
            let more_fields = loop {
                let Some(&c) = buf.get(i) else {
                    if !at_end {
                        return None;
                    }
                    break false;
                };
                if Some(c) == self.escape {
                    let Some(&next) = buf.get(i + 1) else {
                        if !at_end {
                            return None;
                        }
                        value.push(c);
                        i += 1;
                        continue;
                    };
                    value.push(unescape(next));
                    escaped_n |= next == b'N';
                    i += 2;
                    continue;
                }
                match quote {
                    None => {
                        if let Some((len, more_fields)) = self.separator_at(&buf[i..], at_end)? {
                            i += len;
                            break more_fields;
                        }
                    }
                    Some(q) if c == q => {
                        let after = &buf[i + 1..];
                        if after.first() == Some(&q) {
                            value.push(q);
                            i += 2;
                            continue;
                        }
                        if after.is_empty() {
                            if !at_end {
                                return None;
                            }
                            i += 1;
                            break false;
                        }
                        if let Some((len, more_fields)) = self.separator_at(after, at_end)? {
                            i += 1 + len;
                            break more_fields;
                        }
                        // A quote inside the value.
                    }
                    Some(_) => {}
                }
                value.push(c);
                i += 1;
            };
            if keep {
                let null = (escaped_n && value == b"N")
                    || (quote.is_none() && self.enclosed.is_some() && value == b"NULL");
                let value = match null {
                    true => Field::Null,
                    false => Field::Text(value),
                };
                line.values.push((field, value));
            }
            field += 1;
            if !more_fields {
                return Some(Line { len: i, ..line });
            }
            if field == fields {
                let len = match (&buf[i..], at_end) {
                    ([], true) => i,
                    ([], false) => return None,
                    (rest, _) => i + self.skip_line(rest, at_end)?,
                };
                return Some(Line { len, ..line });
            }
        }
    }
}

impl Format {
    /// The separator `buf` starts with: its length and whether a field
    /// follows (a field separator) or the line ends; `Some(None)`: none;
    /// `None`: too few bytes to tell.
    fn separator_at(&self, buf: &[u8], at_end: bool) -> Option<Option<(usize, bool)>> {
        if terminator(buf, &self.line_end, at_end)? {
            return Some(Some((self.line_end.len(), false)));
        }
        if terminator(buf, &self.field_end, at_end)? {
            return Some(Some((self.field_end.len(), true)));
        }
        Some(None)
    }
}

/// Whether `buf` starts with `end`: `None` when it may, but holds too few
/// bytes to tell (and more may come).
fn terminator(buf: &[u8], end: &[u8], at_end: bool) -> Option<bool> {
    if buf.len() >= end.len() {
        return Some(buf.starts_with(end));
    }
    match end.starts_with(buf) && !at_end {
        true => None,
        false => Some(false),
    }
}

/// The byte an escape makes of `c`, as the server reads it.
fn unescape(c: u8) -> u8 {
    match c {
        b'n' => b'\n',
        b't' => b'\t',
        b'r' => b'\r',
        b'b' => 8,
        b'0' => 0,
        b'Z' => 26,
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csv() -> Format {
        Format {
            field_end: b",".to_vec(),
            enclosed: Some(b'"'),
            escape: Some(b'\\'),
            line_end: b"\r\n".to_vec(),
        }
    }

    /// Every line of `file` as (its bytes, the values of `wanted`).
    fn lines(format: &Format, file: &[u8], wanted: &[usize]) -> Vec<(String, Vec<(usize, Field)>)> {
        let mut at = 0;
        let mut out = Vec::new();
        while let Some(line) = format.read_line(&file[at..], true, wanted, 4) {
            out.push((
                String::from_utf8_lossy(&file[at..at + line.len]).into_owned(),
                line.values,
            ));
            at += line.len;
        }
        assert_eq!(at, file.len(), "the whole file is read");
        out
    }

    fn text(s: &str) -> Field {
        Field::Text(s.as_bytes().to_vec())
    }

    #[test]
    fn fields_are_read_as_the_server_reads_them() {
        let read = lines(
            &Format::default(),
            b"1\tmar\\tin\n2\t\\N\n\\N\tx\\\ny\n3",
            &[0, 1],
        );
        assert_eq!(
            read,
            vec![
                (
                    "1\tmar\\tin\n".into(),
                    vec![(0, text("1")), (1, text("mar\tin"))]
                ),
                ("2\t\\N\n".into(), vec![(0, text("2")), (1, Field::Null)]),
                (
                    "\\N\tx\\\ny\n".into(),
                    vec![(0, Field::Null), (1, text("x\ny"))]
                ),
                ("3".into(), vec![(0, text("3"))]),
            ]
        );
    }

    #[test]
    fn quoted_fields_hold_terminators_and_doubled_quotes() {
        let file = b"\"a,b\",\"say \"\"hi\"\"\",NULL,\"NULL\"\r\n\"x\r\ny\",2\r\n\"q\"z\",3\r\n";
        let read = lines(&csv(), file, &[0, 1, 2, 3]);
        assert_eq!(read.len(), 3);
        assert_eq!(
            read[0].1,
            vec![
                (0, text("a,b")),
                (1, text("say \"hi\"")),
                (2, Field::Null),
                (3, text("NULL"))
            ]
        );
        assert_eq!(read[1].1, vec![(0, text("x\r\ny")), (1, text("2"))]);
        // A quote not followed by a terminator is part of the value.
        assert_eq!(read[2].1, vec![(0, text("q\"z")), (1, text("3"))]);
    }

    #[test]
    fn a_line_split_anywhere_reads_the_same_once_whole() {
        let file = b"\"a,\"\"b\",12\r\n7,\"x\r\n\"\r\n";
        let format = csv();
        let whole = lines(&format, file, &[0, 1]);
        let first = whole[0].0.len();
        for cut in 0..first {
            // Until the line is whole, the reader asks for more.
            assert_eq!(
                format.read_line(&file[..cut], false, &[0, 1], 4),
                None,
                "cut at {cut}"
            );
        }
        let line = format.read_line(&file[..first], false, &[0, 1], 4);
        // `12\r\n` may go on: a line ends only once the next byte is known
        // not to continue a terminator, which `\r\n` already is.
        assert_eq!(line.map(|l| l.len), Some(first));
    }

    #[test]
    fn the_end_of_the_file_ends_the_last_line_and_a_field_it_cuts() {
        assert_eq!(lines(&csv(), b"1,2,", &[2]), vec![("1,2,".into(), vec![])]);
        assert_eq!(lines(&csv(), b"", &[0]), vec![]);
        assert_eq!(
            lines(&csv(), b"\r\n", &[0]),
            vec![("\r\n".into(), vec![(0, text(""))])]
        );
        assert_eq!(
            lines(&Format::default(), b"a\\", &[0]),
            vec![("a\\".into(), vec![(0, text("a\\"))])]
        );
    }

    #[test]
    fn fields_past_the_tables_columns_are_skipped_as_an_ignored_line_is() {
        // Checked on MariaDB 10.11: the rest of a line with more fields than
        // columns ends at the next line terminator, quoted or not.
        let format = Format {
            line_end: b"\n".to_vec(),
            ..csv()
        };
        let file = b"2,c,\"d\ne\",f\n3,g\n";
        let mut at = 0;
        let mut read = Vec::new();
        while let Some(line) = format.read_line(&file[at..], true, &[0, 1], 2) {
            read.push(line.values);
            at += line.len;
        }
        assert_eq!(
            read,
            vec![
                vec![(0, text("2")), (1, text("c"))],
                vec![(0, text("e\"")), (1, text("f"))],
                vec![(0, text("3")), (1, text("g"))],
            ]
        );
    }

    #[test]
    fn ignored_lines_end_at_a_terminator_that_is_not_escaped() {
        let format = csv();
        assert_eq!(format.skip_line(b"a\\\r\nb\r\nc", true), Some(7));
        assert_eq!(
            format.skip_line(b"\"a\r\n\"", true),
            Some(4),
            "quotes do not count"
        );
        assert_eq!(format.skip_line(b"abc\r", false), None);
        assert_eq!(format.skip_line(b"abc", true), Some(3));
        assert_eq!(format.skip_line(b"", true), None);
    }
}

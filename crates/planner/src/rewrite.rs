//! Rewriting by splicing at token spans: the statement keeps every byte the
//! client wrote (comments, hints, spacing, quoting) but for the spans replaced.
//! sqlparser reports spans as line and column in characters; `Offsets` turns
//! them into byte offsets of the text that was parsed.

use sqlparser::tokenizer::{Location, Span};

/// Byte offsets of the lines of a text, to turn sqlparser locations into bytes.
pub(crate) struct Offsets<'a> {
    sql: &'a str,
    line_starts: Vec<usize>,
    /// Whether each line is ASCII: a column is then a byte count.
    ascii: Vec<bool>,
    /// The last location found on a line that is not (line index, column,
    /// byte): planning asks for locations mostly in text order, and a walk
    /// from the last one keeps a long line's lookups linear in all (a 512 KB
    /// INSERT asks for thousands).
    last: std::cell::Cell<(usize, usize, usize)>,
}

impl<'a> Offsets<'a> {
    pub fn new(sql: &'a str) -> Offsets<'a> {
        let mut line_starts = vec![0];
        line_starts.extend(sql.match_indices('\n').map(|(i, _)| i + 1));
        let ascii = line_starts
            .iter()
            .enumerate()
            .map(|(i, &start)| {
                let end = line_starts.get(i + 1).copied().unwrap_or(sql.len());
                sql.as_bytes()[start..end].is_ascii()
            })
            .collect();
        Offsets {
            sql,
            line_starts,
            ascii,
            last: std::cell::Cell::new((usize::MAX, 0, 0)),
        }
    }

    /// The byte offset of a location (1-based line and character column).
    pub fn byte(&self, location: Location) -> Option<usize> {
        let index = location.line.checked_sub(1)? as usize;
        let start = *self.line_starts.get(index)?;
        let column = location.column.checked_sub(1)? as usize;
        if self.ascii[index] {
            let end = self
                .line_starts
                .get(index + 1)
                .copied()
                .unwrap_or(self.sql.len());
            return match start + column {
                byte if byte <= end => Some(byte),
                // Past the line's end: counted on in the lines after it.
                _ => self.walk(start, 0, column),
            };
        }
        let (line, from_column, from_byte) = self.last.get();
        let (from_column, from_byte) = match line == index && from_column <= column {
            true => (from_column, from_byte),
            false => (0, start),
        };
        let byte = self.walk(from_byte, from_column, column)?;
        self.last.set((index, column, byte));
        Some(byte)
    }

    /// The byte `column - from_column` characters after `from_byte`; the
    /// text's end when it ends exactly there.
    fn walk(&self, from_byte: usize, from_column: usize, column: usize) -> Option<usize> {
        let rest = &self.sql[from_byte..];
        let ahead = column - from_column;
        match rest.char_indices().nth(ahead) {
            Some((offset, _)) => Some(from_byte + offset),
            None if rest.chars().count() == ahead => Some(self.sql.len()),
            None => None,
        }
    }

    /// The byte range of a span (its end is exclusive).
    pub fn range(&self, span: Span) -> Option<std::ops::Range<usize>> {
        Some(self.byte(span.start)?..self.byte(span.end)?)
    }
}

/// Replacements of byte ranges of one text.
#[derive(Debug, Clone, Default)]
pub(crate) struct Splices {
    edits: Vec<(std::ops::Range<usize>, String)>,
}

impl Splices {
    pub fn is_empty(&self) -> bool {
        self.edits.is_empty()
    }

    pub fn replace(&mut self, range: std::ops::Range<usize>, with: String) {
        self.edits.push((range, with));
    }

    /// The text with every replacement made; `None` if two overlap.
    pub fn apply(&self, sql: &str) -> Option<String> {
        let mut edits: Vec<_> = self.edits.iter().collect();
        if edits.len() > 1 {
            edits.sort_by_key(|(range, _)| range.start);
        }
        let mut out = String::with_capacity(sql.len() + 32);
        let mut at = 0;
        for (range, with) in edits {
            if range.start < at {
                return None;
            }
            out.push_str(sql.get(at..range.start)?);
            out.push_str(with);
            at = range.end;
        }
        out.push_str(sql.get(at..)?);
        Some(out)
    }
}

/// A string literal that reads the same under every sql_mode and character
/// set: the bytes in hex, taken as utf8mb4.
pub fn text_literal(value: &str) -> String {
    let hex: String = value.bytes().map(|b| format!("{b:02x}")).collect();
    format!("CONVERT(X'{hex}' USING utf8mb4)")
}

/// An identifier in backticks, as hscale writes names it generates.
pub fn quote_identifier(name: &str) -> String {
    let mut quoted = String::with_capacity(name.len() + 2);
    push_quoted(name, &mut quoted);
    quoted
}

/// `name` in backquotes, appended to `out`.
pub(crate) fn push_quoted(name: &str, out: &mut String) {
    out.push('`');
    // Every statement routed writes a physical table's name: the common
    // name without a backtick goes in one copy.
    if !name.as_bytes().contains(&b'`') {
        out.push_str(name);
        out.push('`');
        return;
    }
    for (i, part) in name.split('`').enumerate() {
        if i > 0 {
            out.push_str("``");
        }
        out.push_str(part);
    }
    out.push('`');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_count_characters_but_offsets_count_bytes() {
        let sql = "SELECT 'é'\n, näme FROM t";
        let offsets = Offsets::new(sql);
        let at = |line, column| offsets.byte(Location { line, column }).unwrap();
        assert_eq!(&sql[at(1, 8)..], "'é'\n, näme FROM t");
        assert_eq!(&sql[at(2, 3)..at(2, 7)], "näme");
        assert_eq!(at(2, 14), sql.len());
    }

    /// Every location of texts mixing ASCII and longer characters, asked in
    /// text order, backwards and at random, as the plain walk from the
    /// line's start finds it (seeded; the seed is printed).
    #[test]
    fn every_location_is_found_in_any_order() {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        eprintln!("seed {seed}");
        let mut state = seed | 1;
        let mut next = move |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        let pieces = ["a", "é", "\n", "x", "日", "€", " ", "'"];
        for _ in 0..50 {
            let sql: String = (0..next(60)).map(|_| pieces[next(pieces.len())]).collect();
            let walk = |line: usize, column: usize| {
                let start = std::iter::once(0)
                    .chain(sql.match_indices('\n').map(|(i, _)| i + 1))
                    .nth(line - 1)?;
                let rest = &sql[start..];
                match rest.char_indices().nth(column - 1) {
                    Some((offset, _)) => Some(start + offset),
                    None if rest.chars().count() == column - 1 => Some(sql.len()),
                    None => None,
                }
            };
            let lines = sql.matches('\n').count() + 1;
            let mut locations: Vec<(usize, usize)> = (1..=lines)
                .flat_map(|line| (1..=sql.chars().count() + 2).map(move |column| (line, column)))
                .collect();
            let offsets = Offsets::new(&sql);
            for order in 0..3 {
                match order {
                    1 => locations.reverse(),
                    2 => {
                        for i in (1..locations.len()).rev() {
                            locations.swap(i, next(i + 1));
                        }
                    }
                    _ => {}
                }
                for &(line, column) in &locations {
                    let location = Location {
                        line: line as u64,
                        column: column as u64,
                    };
                    assert_eq!(
                        offsets.byte(location),
                        walk(line, column),
                        "seed {seed}: {sql:?} {line}:{column}"
                    );
                }
            }
        }
    }

    #[test]
    fn splices_replace_ranges_in_any_order_and_refuse_overlaps() {
        let mut splices = Splices::default();
        splices.replace(20..25, "`users_1` AS `users`".into());
        splices.replace(7..12, "users".into());
        assert_eq!(
            splices.apply("SELECT users.a FROM users").unwrap(),
            "SELECT users.a FROM `users_1` AS `users`"
        );
        splices.replace(10..15, "x".into());
        assert!(splices.apply("SELECT users.a FROM users").is_none());
        assert_eq!(quote_identifier("a`b"), "`a``b`");
    }
}

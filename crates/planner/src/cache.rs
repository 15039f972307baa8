//! The plan cache: a statement on a partitioned table is parsed once per
//! shape. Its fingerprint is its text with every literal replaced by a
//! placeholder and every comment by a separator, in the session's database; a
//! hit renders the cached shape with the new statement's literals and text,
//! and no parser runs. A cache belongs to one session, so the hot path shares
//! nothing between threads.

use crate::dictionary::PartitionedTable;
use crate::hashing::Value;
use crate::lexer::{Quoting, Token, TokenKind};
use crate::plan::{Action, Context};
use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use crate::shape::{TokenRange, TokenShape};

/// Shapes kept per session; past this the cache starts over.
const CAPACITY: usize = 256;

/// What stands in a fingerprint for a comment (and ends its header), and for
/// a literal.
const COMMENT: u8 = 0;
const LITERAL: u8 = 1;

#[derive(Debug, Default)]
pub struct PlanCache {
    entries: FxHashMap<Vec<u8>, Cached>,
    /// Scratch for the statement at hand: its fingerprint and tokens.
    key: Vec<u8>,
    tokens: Vec<Token>,
    /// The statement at hand has a byte outside its literals that the
    /// fingerprint uses as a placeholder: it is planned without the cache.
    uncacheable: bool,
    hits: u64,
}

#[derive(Debug, Clone)]
enum Cached {
    /// A statement that only seemed to name a partitioned table.
    Main { generation: u64 },
    /// A read of reference tables alone, and where they all are.
    ReferenceRead {
        generation: u64,
        backends: SmallVec<[u32; 4]>,
    },
    /// With the table it routes to, the dictionary snapshot's own.
    Shaped {
        generation: u64,
        table: Arc<PartitionedTable>,
        shape: TokenShape,
    },
}

impl PlanCache {
    /// Plans answered from the cache, for tests and STATUS.
    pub fn hits(&self) -> u64 {
        self.hits
    }

    /// Where the lexer leaves the statement's tokens for `prepare`.
    pub(crate) fn token_sink(&mut self) -> &mut Vec<Token> {
        self.tokens.clear();
        &mut self.tokens
    }

    /// Reads the fingerprint of the statement whose tokens the lexer left in
    /// the scratch space.
    pub(crate) fn prepare(&mut self, sql: &[u8], ctx: &Context) {
        let db = ctx.db.unwrap_or("");
        let flags = u8::from(ctx.tables_locked) << 2;
        self.uncacheable =
            !fingerprint(sql, &self.tokens, db, ctx.quoting, flags, 0, &mut self.key);
    }

    /// The cached plan for the prepared statement, if its shape is known at
    /// this dictionary snapshot and `render` takes it (`None`: plan anew).
    pub(crate) fn lookup(
        &mut self,
        sql: &str,
        ctx: &Context,
        render: impl FnOnce(
            &TokenShape,
            &PartitionedTable,
            &[Value],
            &dyn Fn(&TokenRange) -> Option<Range<usize>>,
        ) -> Option<Action>,
    ) -> Option<Action> {
        if self.uncacheable {
            return None;
        }
        let cached = self.entries.get(&self.key)?;
        let action = match cached {
            Cached::Main { generation } if *generation == ctx.dictionary.generation() => {
                Action::Main
            }
            Cached::ReferenceRead {
                generation,
                backends,
            } if *generation == ctx.dictionary.generation() => {
                Action::ReferenceRead(backends.clone())
            }
            Cached::Shaped {
                generation,
                table,
                shape,
            } if *generation == ctx.dictionary.generation() => {
                let mut values: SmallVec<[Value; 2]> = SmallVec::new();
                for key in shape.keys.iter().flatten() {
                    let token = self.tokens.get(key.at.token()?)?;
                    values.push(value(sql, token, key.negative, ctx.quoting)?);
                }
                let tokens = &self.tokens;
                render(shape, table, &values, &|at: &TokenRange| at.locate(tokens))?
            }
            _ => return None,
        };
        self.hits += 1;
        Some(action)
    }

    /// Keeps what planning the prepared statement found.
    pub(crate) fn store(
        &mut self,
        ctx: &Context,
        action: &Action,
        shape: Option<&crate::shape::ByteShape>,
    ) {
        let generation = ctx.dictionary.generation();
        let cached = match (action, shape) {
            (Action::Main, _) => Cached::Main { generation },
            (Action::ReferenceRead(backends), _) => Cached::ReferenceRead {
                generation,
                backends: backends.clone(),
            },
            _ if self.uncacheable => return,
            (_, Some(shape)) => {
                let table = ctx
                    .dictionary
                    .shared_table(&shape.table.db, &shape.table.name);
                match (table, shape.to_tokens(&self.tokens)) {
                    (Some(table), Some(shape)) => Cached::Shaped {
                        generation,
                        table: table.clone(),
                        shape,
                    },
                    _ => return,
                }
            }
            _ => return,
        };
        if self.entries.len() >= CAPACITY {
            self.entries.clear();
        }
        self.entries.insert(self.key.clone(), cached);
    }
}

/// The fingerprint of `sql` in database `db` for what its answer's columns
/// are, written into `key`: as the plan cache's (`fingerprint`), but the
/// literals before its first FROM, which name and size the columns, are
/// kept. `false` where it could be another statement's. For the column
/// definitions the proxy keeps per statement shape.
pub fn columns_fingerprint(sql: &[u8], db: &str, quoting: Quoting, key: &mut Vec<u8>) -> bool {
    let tokens: SmallVec<[Token; 64]> = crate::lexer::Tokens::new(sql, quoting).collect();
    let mut depth = 0i32;
    let from = tokens.iter().find(|t| match t.kind {
        TokenKind::Symbol(b'(') => {
            depth += 1;
            false
        }
        TokenKind::Symbol(b')') => {
            depth -= 1;
            false
        }
        TokenKind::Word => depth == 0 && sql[t.start..t.end].eq_ignore_ascii_case(b"FROM"),
        _ => false,
    });
    let literals_from = from.map_or(sql.len(), |t| t.start);
    fingerprint(sql, &tokens, db, quoting, 0, literals_from, key)
}

/// Writes the fingerprint of `sql` (lexed into `tokens`) in database `db`,
/// with the session's `flags` beside its quoting, into `key`, literals that
/// start before `literals_from` kept as they are: the text between its literals is copied in runs, whitespace
/// and all, so that a statement costs a copy per literal and comment rather
/// than one per token. Two statements with one fingerprint have the same
/// tokens but for their literals' values, which is what a cached shape needs;
/// per-request comments (sqlcommenter) do not make a new shape. `false`: the
/// statement copies a placeholder byte (in a quoted identifier, or as a
/// stray byte), which could read as another statement's fingerprint.
fn fingerprint(
    sql: &[u8],
    tokens: &[Token],
    db: &str,
    quoting: Quoting,
    flags: u8,
    literals_from: usize,
    key: &mut Vec<u8>,
) -> bool {
    key.clear();
    key.extend_from_slice(db.as_bytes());
    key.push(COMMENT);
    key.push(u8::from(quoting.no_backslash_escapes) | u8::from(quoting.ansi_quotes) << 1 | flags);
    let mut unique = true;
    let mut run = tokens.first().map_or(0, |t| t.start);
    let mut previous_end = run;
    for token in tokens {
        // The lexer leaves out only whitespace and comments.
        let gap = &sql[previous_end..token.start];
        if !gap
            .iter()
            .all(|&c| matches!(c, b' ' | b'\t' | b'\r' | b'\n'))
        {
            key.extend_from_slice(&sql[run..previous_end]);
            key.push(COMMENT);
            run = token.start;
        }
        match literal_kind(token.kind, quoting).filter(|_| token.start >= literals_from) {
            Some(_) => {
                key.extend_from_slice(&sql[run..token.start]);
                key.push(LITERAL);
                run = token.end;
            }
            None => {
                unique &= match token.kind {
                    TokenKind::Symbol(c) => c != COMMENT && c != LITERAL,
                    TokenKind::Quoted(_) => !sql[token.start..token.end]
                        .iter()
                        .any(|&c| c == COMMENT || c == LITERAL),
                    _ => true,
                }
            }
        }
        previous_end = token.end;
    }
    key.extend_from_slice(&sql[run..previous_end]);
    unique
}

/// Literal tokens: numbers and strings (`"..."` is a string unless the
/// sql_mode has ANSI_QUOTES); the fingerprint leaves them out.
pub(crate) fn literal_kind(kind: TokenKind, quoting: Quoting) -> Option<TokenKind> {
    match kind {
        TokenKind::Number => Some(kind),
        TokenKind::Quoted(quote @ (b'\'' | b'"')) if !quoting.quotes_identifier(quote) => {
            Some(kind)
        }
        _ => None,
    }
}

fn value<'a>(sql: &'a str, token: &Token, negative: bool, quoting: Quoting) -> Option<Value<'a>> {
    let text = sql.get(token.start..token.end)?;
    match token.kind {
        TokenKind::Number => {
            let digits = text;
            Some(Value::Number(match negative {
                true => Cow::Owned(format!("-{digits}")),
                false => Cow::Borrowed(digits),
            }))
        }
        TokenKind::Quoted(quote) if !negative => {
            let quote_char = char::from(quote);
            let inner = text.strip_prefix(quote_char)?.strip_suffix(quote_char)?;
            let bytes = inner.as_bytes();
            let escaped =
                bytes.contains(&quote) || (!quoting.no_backslash_escapes && bytes.contains(&b'\\'));
            Some(Value::String(match escaped {
                true => Cow::Owned(unquote(bytes, quote, quoting)?),
                false => Cow::Borrowed(inner),
            }))
        }
        _ => None,
    }
}

/// The text of a quoted string as MySQL reads it.
pub(crate) fn unquote(inner: &[u8], quote: u8, quoting: Quoting) -> Option<String> {
    let mut out = Vec::with_capacity(inner.len());
    let mut i = 0;
    while i < inner.len() {
        let c = inner[i];
        if c == quote && inner.get(i + 1) == Some(&quote) {
            out.push(quote);
            i += 2;
        } else if c == b'\\' && !quoting.no_backslash_escapes {
            let next = *inner.get(i + 1)?;
            match next {
                b'0' => out.push(0),
                b'b' => out.push(8),
                b'n' => out.push(b'\n'),
                b'r' => out.push(b'\r'),
                b't' => out.push(b'\t'),
                b'Z' => out.push(26),
                // LIKE's escapes keep their backslash.
                b'%' | b'_' => out.extend_from_slice(&[b'\\', next]),
                other => out.push(other),
            }
            i += 2;
        } else {
            out.push(c);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lexer::Tokens;
    use std::collections::HashMap;

    /// What a cached shape relies on: statements with one fingerprint lex to
    /// the same tokens, but for their literals' values. Random statements
    /// from pieces that meet in every way (comments between and around
    /// tokens, spacing, literals that touch words, stray placeholder bytes),
    /// grouped by fingerprint.
    #[test]
    fn one_fingerprint_means_the_same_tokens_but_for_literals() {
        const PIECES: &[&str] = &[
            "SELECT", "a", "b", "ab", "1a", "t", ".", ",", "=", "-", "*", "/", "(", ")", "@",
            "@@x", "1", "12", "1.5", "'x'", "'y''z'", "\"q\"", "`a`", "`a\u{1}`", "`\u{0}`",
            "\u{0}", "\u{1}", "", " ", "  ", "\n", "\t", "/* c */", "/*x*/", "/*!1 ", "*/",
            "# c\n", "-- c\n", "--", "\u{c}",
        ];
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        type Lexed = Vec<(bool, Vec<u8>)>;
        let mut seen: HashMap<Vec<u8>, (String, Lexed)> = HashMap::new();
        let (mut key, mut shared) = (Vec::new(), 0);
        for _ in 0..200_000 {
            let sql: String = (0..1 + next(7))
                .map(|_| PIECES[next(PIECES.len())])
                .collect();
            let quoting = Quoting::BACKSLASH_ESCAPES;
            let tokens: Vec<Token> = Tokens::new(sql.as_bytes(), quoting).collect();
            if !fingerprint(sql.as_bytes(), &tokens, "app", quoting, 0, 0, &mut key) {
                continue;
            }
            let lexed: Lexed = tokens
                .iter()
                .map(|t| match literal_kind(t.kind, quoting) {
                    Some(_) => (true, Vec::new()),
                    None => (false, sql.as_bytes()[t.start..t.end].to_vec()),
                })
                .collect();
            match seen.get(&key) {
                Some((first, tokens)) => {
                    assert_eq!(tokens, &lexed, "{first:?} and {sql:?} share a fingerprint");
                    shared += usize::from(first != &sql);
                }
                None => {
                    seen.insert(key.clone(), (sql, lexed));
                }
            }
        }
        // The comparison ran: many statements share one.
        assert!(shared > 10_000, "{shared}");
    }

    /// The select list's literals name and size the answer's columns: two
    /// statements that differ there differ in this fingerprint; two that
    /// differ after FROM (a subquery's FROM in the select list not counted)
    /// share it.
    #[test]
    fn a_columns_fingerprint_keeps_the_select_lists_literals() {
        let key = |sql: &str| {
            let mut key = Vec::new();
            assert!(columns_fingerprint(
                sql.as_bytes(),
                "app",
                Quoting::BACKSLASH_ESCAPES,
                &mut key
            ));
            key
        };
        let range = "SELECT c, 'x' FROM t WHERE id BETWEEN 1 AND 100 ORDER BY c";
        assert_eq!(
            key(range),
            key("SELECT c, 'x' FROM t WHERE id BETWEEN 7 AND 9 ORDER BY c")
        );
        assert_ne!(
            key(range),
            key("SELECT c, 'yz' FROM t WHERE id BETWEEN 1 AND 100 ORDER BY c")
        );
        let nested = "SELECT (SELECT 1 FROM u LIMIT 1), ROUND(k, 2) FROM t WHERE id > 5";
        assert_eq!(
            key(nested),
            key("SELECT (SELECT 1 FROM u LIMIT 1), ROUND(k, 2) FROM t WHERE id > 6")
        );
        assert_ne!(
            key(nested),
            key("SELECT (SELECT 1 FROM u LIMIT 1), ROUND(k, 3) FROM t WHERE id > 5")
        );
        assert_ne!(
            key(nested),
            key("SELECT (SELECT 2 FROM u LIMIT 1), ROUND(k, 2) FROM t WHERE id > 5")
        );
    }

    #[test]
    fn strings_read_as_mysql_reads_them() {
        let q = Quoting::BACKSLASH_ESCAPES;
        assert_eq!(unquote(b"it''s", b'\'', q).unwrap(), "it's");
        assert_eq!(unquote(br"a\'b\\c\n", b'\'', q).unwrap(), "a'b\\c\n");
        assert_eq!(unquote(br"50\%", b'\'', q).unwrap(), "50\\%");
        assert_eq!(
            unquote(br"C:\", b'\'', Quoting::NO_BACKSLASH_ESCAPES).unwrap(),
            "C:\\"
        );
    }
}

//! The plan cache: a statement on a partitioned table is parsed once per
//! shape. Its fingerprint is its tokens with every literal replaced by a
//! placeholder, in the session's database; a hit renders the cached shape with
//! the new statement's literals and text, and no parser runs. A cache belongs
//! to one session, so the hot path shares nothing between threads.

use crate::hashing::Value;
use crate::lexer::{Quoting, Token, TokenKind};
use crate::plan::{Action, Context};
use std::borrow::Cow;
use std::ops::Range;

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use crate::shape::{TokenRange, TokenShape};

/// Shapes kept per session; past this the cache starts over.
const CAPACITY: usize = 256;

#[derive(Debug, Default)]
pub struct PlanCache {
    entries: FxHashMap<Vec<u8>, Cached>,
    /// Scratch for the statement at hand: its fingerprint and token bounds.
    key: Vec<u8>,
    starts: Vec<usize>,
    ends: Vec<usize>,
    tokens: Vec<Token>,
    hits: u64,
}

#[derive(Debug, Clone)]
enum Cached {
    /// A statement that only seemed to name a partitioned table.
    Main {
        version: u64,
    },
    Shaped {
        version: u64,
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
        self.starts.clear();
        self.ends.clear();
        self.key.clear();
        self.key.extend_from_slice(ctx.db.unwrap_or("").as_bytes());
        self.key.push(0);
        self.key.push(
            u8::from(ctx.quoting.no_backslash_escapes) | u8::from(ctx.quoting.ansi_quotes) << 1,
        );
        for token in &self.tokens {
            self.starts.push(token.start);
            self.ends.push(token.end);
            match literal_kind(token.kind, ctx.quoting) {
                Some(_) => self.key.push(b'?'),
                None => self.key.extend_from_slice(&sql[token.start..token.end]),
            }
            self.key.push(0);
        }
    }

    /// The cached plan for the prepared statement, if its shape is known at
    /// this dictionary version and `render` takes it (`None`: plan anew).
    pub(crate) fn lookup(
        &mut self,
        sql: &str,
        ctx: &Context,
        render: impl FnOnce(
            &TokenShape,
            &[Value],
            &dyn Fn(&TokenRange) -> Option<Range<usize>>,
        ) -> Option<Action>,
    ) -> Option<Action> {
        let cached = self.entries.get(&self.key)?;
        let action = match cached {
            Cached::Main { version } if *version == ctx.dictionary.version => Action::Main,
            Cached::Shaped { version, shape } if *version == ctx.dictionary.version => {
                let mut values: SmallVec<[Value; 2]> = SmallVec::new();
                for key in shape.keys.iter().flatten() {
                    let token = self.tokens.get(key.at.token()?)?;
                    values.push(value(sql, token, key.negative, ctx.quoting)?);
                }
                let (starts, ends) = (&self.starts, &self.ends);
                render(shape, &values, &|at: &TokenRange| at.locate(starts, ends))?
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
        let version = ctx.dictionary.version;
        let cached = match (action, shape) {
            (Action::Main, _) => Cached::Main { version },
            (_, Some(shape)) => match shape.to_tokens(&self.starts, &self.ends) {
                Some(shape) => Cached::Shaped { version, shape },
                None => return,
            },
            _ => return,
        };
        if self.entries.len() >= CAPACITY {
            self.entries.clear();
        }
        self.entries.insert(self.key.clone(), cached);
    }
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

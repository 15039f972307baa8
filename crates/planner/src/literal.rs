//! String-valued literals as the server reads them, for the guards that
//! compare what a statement names by value rather than by spelling: a
//! quoted string (adjacent ones concatenate: `'hscale' '.admin'`), with or
//! without a character set introducer (`_utf8mb4'...'`, `N'...'`), hex
//! (`X'6873'`, `0x6873`) and bit (`b'0110'`, `0b0110`) literals.

use crate::cache::unquote;
use crate::dictionary::TableNames;
use crate::lexer::{Quoting, Token, TokenKind, Tokens};

/// The functions whose first argument names a user lock.
const LOCK_FUNCTIONS: [&str; 4] = ["get_lock", "release_lock", "is_used_lock", "is_free_lock"];

/// Whether a statement names one of hscale's own user locks
/// (`TableNames::guards_lock`) by value, or names a lock by something
/// hscale cannot read (a variable, an expression), which could be one.
pub(crate) fn names_guarded_lock(sql: &[u8], quoting: Quoting, names: &TableNames) -> bool {
    let tokens: Vec<Token> = Tokens::new(sql, quoting).collect();
    for (i, token) in tokens.iter().enumerate() {
        let is_call = token.kind == TokenKind::Word
            && tokens
                .get(i + 1)
                .is_some_and(|t| t.kind == TokenKind::Symbol(b'('))
            && LOCK_FUNCTIONS
                .iter()
                .any(|f| sql[token.start..token.end].eq_ignore_ascii_case(f.as_bytes()));
        if !is_call {
            continue;
        }
        let ends = |at: usize| {
            tokens
                .get(at)
                .is_some_and(|t| matches!(t.kind, TokenKind::Symbol(b',' | b')')))
        };
        // A prepared statement's parameter: bound at each execution.
        let parameter = tokens
            .get(i + 2)
            .is_some_and(|t| t.kind == TokenKind::Symbol(b'?'));
        if parameter && ends(i + 3) {
            continue;
        }
        match string_at(sql, &tokens, i + 2, quoting) {
            Some((name, after)) if ends(after) => {
                if names.guards_lock(&name) {
                    return true;
                }
            }
            _ => return true,
        }
    }
    false
}

/// The value of the literal that starts at `tokens[at]`, and the index of
/// the token after it; `None` where no literal starts there (a column, a
/// variable, a function: a value hscale cannot read from the text).
pub(crate) fn string_at(
    sql: &[u8],
    tokens: &[Token],
    at: usize,
    quoting: Quoting,
) -> Option<(Vec<u8>, usize)> {
    let word = |t: &Token| String::from_utf8_lossy(&sql[t.start..t.end]).to_ascii_lowercase();
    let is_string = |t: &Token| matches!(t.kind, TokenKind::Quoted(q) if q == b'\'' || (q == b'"' && !quoting.quotes_identifier(q)));
    let glued = |a: &Token, b: &Token| a.end == b.start;
    let mut at = at;
    let first = tokens.get(at)?;
    // A character set introducer: `_utf8mb4'...'`, `_binary X'..'`.
    if first.kind == TokenKind::Word
        && sql[first.start] == b'_'
        && tokens.get(at + 1).is_some_and(|next| {
            is_string(next) || next.kind == TokenKind::Word && prefixed(&word(next)).is_some()
        })
    {
        at += 1;
    }
    let token = tokens.get(at)?;
    if token.kind == TokenKind::Word {
        let text = word(token);
        // X'..', B'..', N'..': a prefix glued to its quoted digits.
        if let Some(next) = tokens
            .get(at + 1)
            .filter(|n| is_string(n) && glued(token, n))
        {
            let inner = &sql[next.start + 1..next.end.saturating_sub(1).max(next.start + 1)];
            let value = match text.as_str() {
                "x" => hex(inner)?,
                "b" => bits(inner)?,
                "n" => return strings(sql, tokens, at + 1, quoting),
                _ => return None,
            };
            return Some((value, at + 2));
        }
        let value = match prefixed(&text)? {
            (16, digits) => hex_padded(digits)?,
            (_, digits) => bits(digits.as_bytes())?,
        };
        return Some((value, at + 1));
    }
    strings(sql, tokens, at, quoting)
}

/// Adjacent quoted strings from `tokens[at]`, concatenated.
fn strings(
    sql: &[u8],
    tokens: &[Token],
    mut at: usize,
    quoting: Quoting,
) -> Option<(Vec<u8>, usize)> {
    let mut value = Vec::new();
    let mut read = false;
    while let Some(token) = tokens.get(at) {
        let TokenKind::Quoted(quote) = token.kind else {
            break;
        };
        if quoting.quotes_identifier(quote) || quote == b'`' {
            break;
        }
        let quoted = &sql[token.start + 1..token.end];
        let inner = quoted.strip_suffix(&[quote])?;
        value.extend_from_slice(unquote(inner, quote, quoting)?.as_bytes());
        read = true;
        at += 1;
    }
    read.then_some((value, at))
}

/// `0x...` and `0b...` words: their base and digits.
fn prefixed(word: &str) -> Option<(u32, &str)> {
    let digits = |prefix: &str| word.strip_prefix(prefix).filter(|d| !d.is_empty());
    digits("0x")
        .map(|d| (16, d))
        .or_else(|| digits("0b").map(|d| (2, d)))
}

/// Hex digits, an even number of them.
fn hex(digits: &[u8]) -> Option<Vec<u8>> {
    if digits.len() & 1 == 1 {
        return None;
    }
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(std::str::from_utf8(&digits[i..i + 2]).ok()?, 16).ok())
        .collect()
}

/// `0x...`: an odd number of digits has a 0 put before them.
fn hex_padded(digits: &str) -> Option<Vec<u8>> {
    match digits.len() & 1 {
        0 => hex(digits.as_bytes()),
        _ => hex(format!("0{digits}").as_bytes()),
    }
}

/// Binary digits, as bytes from the right.
fn bits(digits: &[u8]) -> Option<Vec<u8>> {
    if digits.iter().any(|d| !matches!(d, b'0' | b'1')) {
        return None;
    }
    let mut bytes = Vec::new();
    for chunk in digits.rchunks(8) {
        let mut byte = 0u8;
        for &d in chunk {
            byte = byte << 1 | (d - b'0');
        }
        bytes.push(byte);
    }
    // A leading zero byte is dropped, as the server reads b'...'.
    while bytes.len() > 1 && bytes.last() == Some(&0) {
        bytes.pop();
    }
    bytes.reverse();
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lexer::Tokens;

    fn value(sql: &str, quoting: Quoting) -> Option<String> {
        let tokens: Vec<Token> = Tokens::new(sql.as_bytes(), quoting).collect();
        string_at(sql.as_bytes(), &tokens, 0, quoting)
            .map(|(v, _)| String::from_utf8_lossy(&v).into_owned())
    }

    #[test]
    fn literals_are_read_by_value_however_they_are_spelled() {
        let q = Quoting::BACKSLASH_ESCAPES;
        for sql in [
            "'hscale.admin'",
            "'hscale' '.admin'",
            "'hscale'\n'.ad' \"min\"",
            "_utf8mb4'hscale.admin'",
            "N'hscale.admin'",
            "X'687363616c652e61646d696e'",
        ] {
            assert_eq!(value(sql, q).as_deref(), Some("hscale.admin"), "{sql}");
        }
        assert_eq!(value("0x68736361", q).as_deref(), Some("hsca"));
        assert_eq!(value("_binary 0x68736361", q).as_deref(), Some("hsca"));
        assert_eq!(value("b'0110100001110011'", q).as_deref(), Some("hs"));
        assert_eq!(value("0b1101000", q).as_deref(), Some("h"));
        assert_eq!(value("'hsc''ale'", q).as_deref(), Some("hsc'ale"));
        assert_eq!(value("'a\\'b'", q).as_deref(), Some("a'b"));
        // Not literals: hscale cannot read their values from the text.
        assert_eq!(value("@name", q), None);
        assert_eq!(value("CONCAT('a', 'b')", q), None);
        assert_eq!(value("`hscale.admin`", q), None);
        // Under ANSI_QUOTES "..." is an identifier.
        let ansi = Quoting {
            ansi_quotes: true,
            ..q
        };
        assert_eq!(value("\"hscale.admin\"", ansi), None);
        assert_eq!(
            value("'hscale' \".admin\"", ansi).as_deref(),
            Some("hscale")
        );
    }
}

//! SHOW WARNINGS and SHOW ERRORS, which hscale answers itself after a
//! statement that ran on several connections (each keeps only its part's
//! messages).

use crate::lexer::{Quoting, TokenKind, Tokens};

/// SHOW WARNINGS or SHOW ERRORS with its LIMIT, as hscale answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessagesRead {
    pub errors_only: bool,
    pub offset: usize,
    pub limit: Option<usize>,
}

/// The statement's operation when it is SHOW WARNINGS or SHOW ERRORS, with
/// or without a LIMIT of numbers.
pub fn messages_read(sql: &[u8], quoting: Quoting) -> Option<MessagesRead> {
    let tokens: Vec<_> = Tokens::new(sql, quoting)
        .filter(|token| token.kind != TokenKind::Symbol(b';'))
        .collect();
    let word = |i: usize, expected: &str| {
        tokens.get(i).is_some_and(|token| {
            token.kind == TokenKind::Word
                && sql[token.start..token.end].eq_ignore_ascii_case(expected.as_bytes())
        })
    };
    let number = |i: usize| {
        let token = tokens.get(i)?;
        match token.kind {
            TokenKind::Number => std::str::from_utf8(&sql[token.start..token.end])
                .ok()?
                .parse::<usize>()
                .ok(),
            _ => None,
        }
    };
    let comma = |i: usize| tokens.get(i).map(|t| t.kind) == Some(TokenKind::Symbol(b','));
    if !word(0, "show") {
        return None;
    }
    let errors_only = match (word(1, "warnings"), word(1, "errors")) {
        (true, _) => false,
        (_, true) => true,
        _ => return None,
    };
    let (offset, limit) = match tokens.len() {
        2 => (0, None),
        4 if word(2, "limit") => (0, Some(number(3)?)),
        6 if word(2, "limit") && comma(4) => (number(3)?, Some(number(5)?)),
        6 if word(2, "limit") && word(4, "offset") => (number(5)?, Some(number(3)?)),
        _ => return None,
    };
    Some(MessagesRead {
        errors_only,
        offset,
        limit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_show_warnings_and_errors_with_their_limits() {
        let messages_read = |sql: &[u8]| messages_read(sql, Quoting::default());
        let read = |errors_only, offset, limit| {
            Some(MessagesRead {
                errors_only,
                offset,
                limit,
            })
        };
        assert_eq!(messages_read(b"SHOW WARNINGS"), read(false, 0, None));
        assert_eq!(messages_read(b"show errors;"), read(true, 0, None));
        assert_eq!(
            messages_read(b"SHOW WARNINGS /* why */"),
            read(false, 0, None)
        );
        assert_eq!(
            messages_read(b"SHOW WARNINGS LIMIT 3"),
            read(false, 0, Some(3))
        );
        assert_eq!(
            messages_read(b"SHOW WARNINGS LIMIT 1,2"),
            read(false, 1, Some(2))
        );
        assert_eq!(
            messages_read(b"SHOW ERRORS LIMIT 1 , 2"),
            read(true, 1, Some(2))
        );
        assert_eq!(
            messages_read(b"SHOW WARNINGS LIMIT 2 OFFSET 1"),
            read(false, 1, Some(2))
        );
        for other in [
            "SHOW COUNT(*) WARNINGS",
            "SHOW WARNINGS LIMIT @n",
            "SHOW WARNINGS LIMIT 1,",
            "SHOW WARNINGS LIMIT 1.5",
            "GET DIAGNOSTICS @n = NUMBER",
            "SHOW TABLES",
        ] {
            assert_eq!(messages_read(other.as_bytes()), None, "{other}");
        }
    }
}

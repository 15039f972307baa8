//! SHOW WARNINGS and SHOW ERRORS, and the counts of their messages, which
//! hscale answers itself after a statement that ran on several connections
//! (each keeps only its part's messages).

use crate::lexer::{Quoting, TokenKind, Tokens};

/// SHOW WARNINGS or SHOW ERRORS with its LIMIT, or a count of the
/// messages, as hscale answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessagesRead {
    pub errors_only: bool,
    pub offset: usize,
    pub limit: Option<usize>,
    /// How many there are, instead of the list.
    pub count: Option<Counted>,
}

/// A count of messages: `SELECT @@warning_count` (or `@@error_count`,
/// with `@@session.` or `@@local.`) or `SHOW COUNT(*) WARNINGS|ERRORS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// Its column is named by the statement's text at these bytes, as
    /// MariaDB names it.
    Selected { start: usize, end: usize },
    /// SHOW COUNT(*): its column is `@@session.warning_count` or
    /// `@@session.error_count`.
    Shown,
}

impl MessagesRead {
    /// The count's column name, for the statement `sql` it was read from.
    pub fn count_column<'s>(&self, sql: &'s [u8]) -> Option<std::borrow::Cow<'s, str>> {
        Some(match self.count? {
            Counted::Selected { start, end } => String::from_utf8_lossy(sql.get(start..end)?),
            Counted::Shown => match self.errors_only {
                true => "@@session.error_count".into(),
                false => "@@session.warning_count".into(),
            },
        })
    }
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
    let symbol = |i: usize, c: u8| tokens.get(i).map(|t| t.kind) == Some(TokenKind::Symbol(c));
    let counted = |errors_only, count| {
        Some(MessagesRead {
            errors_only,
            offset: 0,
            limit: None,
            count: Some(count),
        })
    };
    // The variable's own name: `@@warning_count`, or `@@session` `.` `error_count`.
    let variable = |name: &[u8]| {
        let count = |n: &[u8]| {
            (n.eq_ignore_ascii_case(b"warning_count") || n.eq_ignore_ascii_case(b"error_count"))
                .then(|| n.eq_ignore_ascii_case(b"error_count"))
        };
        match tokens.len() {
            2 => count(name),
            4 if (name.eq_ignore_ascii_case(b"session") || name.eq_ignore_ascii_case(b"local"))
                && symbol(2, b'.')
                && tokens[3].kind == TokenKind::Word =>
            {
                count(&sql[tokens[3].start..tokens[3].end])
            }
            _ => None,
        }
    };
    if word(0, "select") && tokens.get(1)?.kind == TokenKind::SystemVariable {
        let errors_only = variable(&sql[tokens[1].start + 2..tokens[1].end])?;
        let (start, end) = (tokens[1].start, tokens.last()?.end);
        return counted(errors_only, Counted::Selected { start, end });
    }
    if !word(0, "show") {
        return None;
    }
    if tokens.len() == 6
        && word(1, "count")
        && symbol(2, b'(')
        && symbol(3, b'*')
        && symbol(4, b')')
    {
        return match (word(5, "warnings"), word(5, "errors")) {
            (true, _) => counted(false, Counted::Shown),
            (_, true) => counted(true, Counted::Shown),
            _ => None,
        };
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
        count: None,
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
                count: None,
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
            "SHOW WARNINGS LIMIT @n",
            "SHOW WARNINGS LIMIT 1,",
            "SHOW WARNINGS LIMIT 1.5",
            "GET DIAGNOSTICS @n = NUMBER",
            "SHOW TABLES",
            "SELECT @@warning_count + 1",
            "SELECT @@warning_count, @@error_count",
            "SELECT @@global.warning_count",
            "SELECT @@port",
            "SHOW COUNT(*) NOTES",
        ] {
            assert_eq!(messages_read(other.as_bytes()), None, "{other}");
        }
    }

    #[test]
    fn reads_the_counts_of_warnings_and_errors_with_their_column_names() {
        let column = |sql: &str| {
            let read = messages_read(sql.as_bytes(), Quoting::default())?;
            Some((
                read.errors_only,
                read.count_column(sql.as_bytes())?.into_owned(),
            ))
        };
        let counts = |errors_only, name: &str| Some((errors_only, name.to_string()));
        assert_eq!(
            column("SELECT @@warning_count"),
            counts(false, "@@warning_count")
        );
        assert_eq!(
            column("select @@Error_Count;"),
            counts(true, "@@Error_Count")
        );
        assert_eq!(
            column("SELECT @@session.warning_count"),
            counts(false, "@@session.warning_count")
        );
        assert_eq!(
            column("SELECT @@LOCAL.error_count"),
            counts(true, "@@LOCAL.error_count")
        );
        assert_eq!(
            column("SHOW COUNT(*) WARNINGS"),
            counts(false, "@@session.warning_count")
        );
        assert_eq!(
            column("show count ( * ) errors"),
            counts(true, "@@session.error_count")
        );
        assert_eq!(column("SHOW WARNINGS"), None);
    }
}

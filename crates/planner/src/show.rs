//! SHOW [FULL] TABLES in a database with partitioned tables: the logical
//! tables are listed, never their physical tables.

use sqlparser::ast::{ShowStatementFilter, ShowStatementFilterPosition, Statement};
use sqlparser::dialect::MySqlDialect;
use sqlparser::parser::Parser;

use crate::plan::Context;

/// How to correct the main backend's SHOW TABLES answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShowTables {
    pub full: bool,
    /// Physical tables of partitioned tables: left out.
    pub hide: Vec<String>,
    /// Partitioned tables the statement's LIKE matches: added.
    pub add: Vec<String>,
}

/// The correction for a SHOW TABLES, if the database it lists holds
/// partitioned tables and the statement filters at most by LIKE.
pub(crate) fn show_tables(sql: &str, ctx: &Context) -> Option<ShowTables> {
    let head = sql.trim_start().get(..4)?;
    if !head.eq_ignore_ascii_case("show") {
        return None;
    }
    let statements = Parser::parse_sql(&MySqlDialect {}, sql).ok()?;
    let [Statement::ShowTables {
        full, show_options, ..
    }] = statements.as_slice()
    else {
        return None;
    };
    let db = match show_options
        .show_in
        .as_ref()
        .and_then(|i| i.parent_name.as_ref())
    {
        Some(name) => name.to_string().trim_matches('`').to_string(),
        None => ctx.db?.to_string(),
    };
    let pattern = match &show_options.filter_position {
        None => None,
        Some(
            ShowStatementFilterPosition::Infix(ShowStatementFilter::Like(p))
            | ShowStatementFilterPosition::Suffix(ShowStatementFilter::Like(p)),
        ) => Some(p.as_str()),
        Some(_) => return None,
    };
    let tables: Vec<_> = ctx
        .dictionary
        .tables()
        .into_iter()
        .filter(|t| t.table.db == db)
        .collect();
    if tables.is_empty() {
        return None;
    }
    Some(ShowTables {
        full: *full,
        hide: tables
            .iter()
            .flat_map(|t| t.physical_tables())
            .map(|t| t.table)
            .collect(),
        add: tables
            .iter()
            .map(|t| t.table.name.clone())
            .filter(|name| pattern.is_none_or(|p| like(p.as_bytes(), name.as_bytes())))
            .collect(),
    })
}

/// SQL LIKE: `%` any run, `_` one character, `\` escapes.
fn like(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'%', rest)) => (0..=text.len()).any(|i| like(rest, &text[i..])),
        Some((b'_', rest)) => !text.is_empty() && like(rest, &text[1..]),
        Some((b'\\', [c, rest @ ..])) => text.first() == Some(c) && like(rest, &text[1..]),
        Some((c, rest)) => text.first() == Some(c) && like(rest, &text[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::like;

    #[test]
    fn like_matches_as_sql_does() {
        assert!(like(b"us%", b"users"));
        assert!(like(b"%er_", b"users"));
        assert!(!like(b"user", b"users"));
        assert!(like(b"users\\_1", b"users_1"));
        assert!(!like(b"users\\_1", b"usersx1"));
        assert!(like(b"%", b""));
    }
}

//! Metadata statements whose answers name tables: SHOW [FULL] TABLES, SHOW
//! TABLE STATUS, SHOW INDEX, SHOW CREATE TABLE and queries on
//! information_schema. Where partitioned tables are concerned, the plan is a
//! `Listing`: where the statement runs, and how its answer is corrected so
//! that it names logical tables, never physical ones.

use std::ops::ControlFlow;

use sqlparser::ast::{
    visit_expressions_mut, BinaryOperator, Expr, ShowStatementFilter, ShowStatementFilterPosition,
    Statement, Value as SqlValue,
};
use sqlparser::dialect::MySqlDialect;
use sqlparser::parser::Parser;

use crate::cache::unquote;
use crate::dictionary::PartitionedTable;
use crate::lexer::{Token, TokenKind, Tokens};
use crate::plan::Context;
use crate::rewrite::{quote_identifier, text_literal};

/// How to run a metadata statement and correct its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    pub backend: u32,
    /// What that backend gets; `None`: the statement as the client wrote it.
    pub sql: Option<String>,
    /// The column whose values are table names.
    pub column: NameColumn,
    /// The column whose values are their databases, if the answer has one.
    pub schema_column: Option<&'static str>,
    /// Physical tables the answer may name: left out, or named for their
    /// logical table.
    pub physical: Vec<Physical>,
    /// Rows for logical tables (SHOW TABLES): added, then every row sorted by
    /// name.
    pub add: Vec<Vec<Option<String>>>,
    /// A LIKE pattern applied to the corrected names (the backend was asked
    /// without it, since it would not match a physical name).
    pub like: Option<String>,
    /// SHOW CREATE TABLE: the CREATE TABLE statement in the second column
    /// names the logical table.
    pub create_statement: bool,
    /// Rows another backend holds: SHOW TABLE STATUS of a partitioned table
    /// whose default table lives off the listing's backend. Added, named for
    /// their logical table, then every row sorted by name.
    pub elsewhere: Vec<Elsewhere>,
}

/// The row of one logical table that its default table's backend answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Elsewhere {
    pub backend: u32,
    pub sql: String,
    /// The default table the row names.
    pub table: String,
    pub logical: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameColumn {
    Position(usize),
    /// By its column name in the source table (information_schema queries
    /// choose and rename their columns).
    Named(&'static str),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Physical {
    pub db: String,
    pub table: String,
    /// The logical table's name, where the physical table stands for it.
    pub logical: Option<String>,
}

impl Listing {
    /// What becomes of a row naming `table` in `db` (`None`: the database
    /// is not in the answer): `None` leaves it out.
    pub fn correct<'a>(&'a self, db: Option<&[u8]>, table: &'a [u8]) -> Option<&'a [u8]> {
        let physical = self
            .physical
            .iter()
            .find(|p| p.table.as_bytes() == table && db.is_none_or(|db| db == p.db.as_bytes()));
        let name = match physical {
            None => table,
            Some(Physical {
                logical: Some(logical),
                ..
            }) => logical.as_bytes(),
            Some(_) => return None,
        };
        match &self.like {
            Some(pattern) if !like(pattern.as_bytes(), name) => None,
            _ => Some(name),
        }
    }
}

/// The listing of a SHOW statement that concerns partitioned tables.
pub(crate) fn listing(sql: &str, ctx: &Context) -> Option<Listing> {
    let tokens: Vec<Token> = Tokens::new(sql.as_bytes(), ctx.quoting).collect();
    let word = |i: usize| {
        tokens
            .get(i)
            .filter(|t| t.kind == TokenKind::Word)
            .map(|t| sql[t.start..t.end].to_ascii_lowercase())
    };
    if word(0).as_deref() != Some("show") {
        return None;
    }
    match (word(1).as_deref(), word(2).as_deref()) {
        (Some("tables" | "full"), _) => show_tables(sql, ctx),
        (Some("table"), Some("status")) => table_status(sql, &tokens, 3, ctx),
        (Some("index" | "indexes" | "keys"), Some("from" | "in")) => {
            of_table(sql, &tokens, 3, ctx, false)
        }
        (Some("create"), Some("table")) => of_table(sql, &tokens, 3, ctx, true),
        _ => None,
    }
}

/// A query on information_schema (that names no partitioned table): its
/// rows that name physical tables are corrected, and a filter on TABLE_NAME
/// that names a logical table matches its default table too, which stands for
/// it (on the main backend no table has the logical name).
pub(crate) fn information_schema(statements: &[Statement], ctx: &Context) -> Listing {
    let tables = ctx.dictionary.tables();
    let stands_for = |name: &str, pattern: bool| -> Vec<String> {
        let name = name.to_lowercase();
        tables
            .iter()
            .filter(|t| t.default_backend == ctx.main_backend)
            .filter(|t| {
                let logical = t.table.name.to_lowercase();
                match pattern {
                    true => like(name.as_bytes(), logical.as_bytes()),
                    false => name == logical,
                }
            })
            .map(|t| t.default_table.clone())
            .collect()
    };
    let mut statements = statements.to_vec();
    let mut widened = false;
    let _ = visit_expressions_mut(&mut statements, |expr| {
        if let Some(wider) = widen_table_filter(expr, &stands_for) {
            *expr = wider;
            widened = true;
        }
        ControlFlow::<()>::Continue(())
    });
    let sql = widened.then(|| {
        statements
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    });
    Listing {
        backend: ctx.main_backend,
        sql,
        column: NameColumn::Named("TABLE_NAME"),
        schema_column: Some("TABLE_SCHEMA"),
        physical: tables.iter().flat_map(|t| physical(t, ctx)).collect(),
        add: Vec::new(),
        like: None,
        create_statement: false,
        elsewhere: Vec::new(),
    }
}

/// `TABLE_NAME = 'users'` (or `<>`, `IN`, `LIKE`, their negations) where
/// `users` is partitioned, rewritten so that the default tables standing for
/// the names it matches match too (`stands_for(name, is_pattern)`). Other
/// tables the filter matched still match.
fn widen_table_filter(expr: &Expr, stands_for: &dyn Fn(&str, bool) -> Vec<String>) -> Option<Expr> {
    let is_table_name = |e: &Expr| match e {
        Expr::Identifier(ident) => ident.value.eq_ignore_ascii_case("table_name"),
        Expr::CompoundIdentifier(parts) => parts
            .last()
            .is_some_and(|ident| ident.value.eq_ignore_ascii_case("table_name")),
        _ => false,
    };
    let text = |e: &Expr| match e {
        Expr::Value(v) => match &v.value {
            SqlValue::SingleQuotedString(s) | SqlValue::DoubleQuotedString(s) => Some(s.clone()),
            _ => None,
        },
        _ => None,
    };
    let names = |defaults: Vec<String>| -> Vec<Expr> {
        defaults
            .into_iter()
            .map(|name| Expr::value(SqlValue::SingleQuotedString(name)))
            .collect()
    };
    let in_list = |column: &Expr, list: Vec<Expr>, negated: bool| Expr::InList {
        expr: Box::new(column.clone()),
        list,
        negated,
    };
    match expr {
        Expr::BinaryOp { left, op, right }
            if matches!(op, BinaryOperator::Eq | BinaryOperator::NotEq) =>
        {
            let (column, literal) = match (is_table_name(left), is_table_name(right)) {
                (true, _) => (left, right),
                (_, true) => (right, left),
                _ => return None,
            };
            let defaults = names(stands_for(&text(literal)?, false));
            if defaults.is_empty() {
                return None;
            }
            let list = std::iter::once((**literal).clone())
                .chain(defaults)
                .collect();
            Some(in_list(column, list, *op == BinaryOperator::NotEq))
        }
        Expr::InList {
            expr: column,
            list,
            negated,
        } if is_table_name(column) => {
            let defaults: Vec<Expr> = list
                .iter()
                .filter_map(text)
                .flat_map(|name| names(stands_for(&name, false)))
                .collect();
            if defaults.is_empty() {
                return None;
            }
            Some(in_list(
                column,
                list.iter().cloned().chain(defaults).collect(),
                *negated,
            ))
        }
        Expr::Like {
            negated,
            any: false,
            expr: column,
            pattern,
            escape_char: None,
        } if is_table_name(column) => {
            let defaults = names(stands_for(&text(pattern)?, true));
            if defaults.is_empty() {
                return None;
            }
            let (op, negated) = match negated {
                false => (BinaryOperator::Or, false),
                true => (BinaryOperator::And, true),
            };
            Some(Expr::Nested(Box::new(Expr::BinaryOp {
                left: Box::new(expr.clone()),
                op,
                right: Box::new(in_list(column, defaults, negated)),
            })))
        }
        _ => None,
    }
}

/// The physical tables of a partitioned table as the main backend lists
/// them: the default table stands for the logical table.
fn physical(table: &PartitionedTable, ctx: &Context) -> Vec<Physical> {
    table
        .physical_tables()
        .into_iter()
        .map(|target| Physical {
            db: table.table.db.clone(),
            logical: (target.partition.is_none() && target.backend == ctx.main_backend)
                .then(|| table.table.name.clone()),
            table: target.table.to_string(),
        })
        .collect()
}

/// SHOW [FULL] TABLES [{FROM | IN} db] [LIKE 'pattern']: the physical tables
/// left out, the logical ones added (wherever their default table lives).
fn show_tables(sql: &str, ctx: &Context) -> Option<Listing> {
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
    let tables = in_database(ctx, &db)?;
    Some(Listing {
        backend: ctx.main_backend,
        sql: None,
        column: NameColumn::Position(0),
        schema_column: None,
        physical: tables
            .iter()
            .flat_map(|t| t.physical_tables())
            .map(|target| Physical {
                db: db.clone(),
                table: target.table.to_string(),
                logical: None,
            })
            .collect(),
        add: tables
            .iter()
            .map(|t| t.table.name.clone())
            .filter(|name| pattern.is_none_or(|p| like(p.as_bytes(), name.as_bytes())))
            .map(|name| match full {
                true => vec![Some(name), Some("BASE TABLE".into())],
                false => vec![Some(name)],
            })
            .collect(),
        like: None,
        create_statement: false,
        elsewhere: Vec::new(),
    })
}

/// SHOW TABLE STATUS [{FROM | IN} db] [LIKE 'pattern' | WHERE ...]: asked
/// without its LIKE, which hscale applies to the logical names.
fn table_status(sql: &str, tokens: &[Token], from: usize, ctx: &Context) -> Option<Listing> {
    let mut at = from;
    let mut db = ctx.db.map(str::to_string);
    let mut like = None;
    let mut like_range = None;
    while let Some(token) = tokens.get(at) {
        let keyword = (token.kind == TokenKind::Word)
            .then(|| sql[token.start..token.end].to_ascii_lowercase());
        match keyword.as_deref() {
            Some("from" | "in") => {
                db = Some(identifier(sql, tokens.get(at + 1)?, ctx)?);
                at += 2;
            }
            Some("like") => {
                let pattern = tokens.get(at + 1)?;
                let TokenKind::Quoted(quote @ (b'\'' | b'"')) = pattern.kind else {
                    return None;
                };
                like = Some(unquote(
                    sql.as_bytes().get(pattern.start + 1..pattern.end - 1)?,
                    quote,
                    ctx.quoting,
                )?);
                like_range = Some(token.start..pattern.end);
                at += 2;
            }
            _ => break,
        }
    }
    // A WHERE filters the rows from elsewhere too.
    let condition = tokens
        .get(at)
        .filter(|t| sql[t.start..t.end].eq_ignore_ascii_case("where"))
        .map(|t| sql[t.end..].trim().trim_end_matches(';'));
    let db = db?;
    let tables = in_database(ctx, &db)?;
    let elsewhere = tables
        .iter()
        .filter(|t| t.default_backend != ctx.main_backend)
        .filter(|t| {
            like.as_ref()
                .is_none_or(|p| self::like(p.as_bytes(), t.table.name.as_bytes()))
        })
        .map(|t| Elsewhere {
            backend: t.default_backend,
            sql: format!(
                "SHOW TABLE STATUS FROM {} WHERE Name = {}{}",
                quote_identifier(&db),
                text_literal(&t.default_table),
                condition.map_or(String::new(), |c| format!(" AND ({c})"))
            ),
            table: t.default_table.clone(),
            logical: t.table.name.clone(),
        })
        .collect();
    let sql = like_range.map(|range| format!("{}{}", &sql[..range.start], &sql[range.end..]));
    Some(Listing {
        backend: ctx.main_backend,
        sql,
        column: NameColumn::Position(0),
        schema_column: None,
        physical: tables.iter().flat_map(|t| physical(t, ctx)).collect(),
        add: Vec::new(),
        like,
        create_statement: false,
        elsewhere,
    })
}

/// SHOW {INDEX | KEYS} FROM t [FROM db], SHOW CREATE TABLE t: asked of the
/// default table, which has the logical table's definition.
fn of_table(
    sql: &str,
    tokens: &[Token],
    at: usize,
    ctx: &Context,
    create_statement: bool,
) -> Option<Listing> {
    let first = tokens.get(at)?;
    let qualified = tokens.get(at + 1).map(|t| t.kind) == Some(TokenKind::Symbol(b'.'));
    let (mut db, name_token) = match qualified {
        true => (Some(identifier(sql, first, ctx)?), tokens.get(at + 2)?),
        false => (ctx.db.map(str::to_string), first),
    };
    let next = at + if qualified { 3 } else { 1 };
    let from_db = tokens.get(next).is_some_and(|t| {
        t.kind == TokenKind::Word
            && matches!(
                sql[t.start..t.end].to_ascii_lowercase().as_str(),
                "from" | "in"
            )
    });
    if from_db && !create_statement {
        db = Some(identifier(sql, tokens.get(next + 1)?, ctx)?);
    }
    let name = identifier(sql, name_token, ctx)?;
    let table = ctx.dictionary.table(&db?, &name)?;
    let sql = format!(
        "{}{}{}",
        &sql[..name_token.start],
        quote_identifier(&table.default_table),
        &sql[name_token.end..]
    );
    Some(Listing {
        backend: table.default_backend,
        sql: Some(sql),
        column: NameColumn::Position(0),
        schema_column: None,
        physical: vec![Physical {
            db: table.table.db.clone(),
            table: table.default_table.clone(),
            logical: Some(table.table.name.clone()),
        }],
        add: Vec::new(),
        like: None,
        create_statement,
        elsewhere: Vec::new(),
    })
}

/// The partitioned tables of a database, if it has any.
fn in_database<'d>(ctx: &Context<'d>, db: &str) -> Option<Vec<&'d PartitionedTable>> {
    let tables: Vec<_> = ctx
        .dictionary
        .tables()
        .into_iter()
        .filter(|t| t.table.db == db)
        .collect();
    (!tables.is_empty()).then_some(tables)
}

/// An identifier token's name: a word, or a backquoted name.
fn identifier(sql: &str, token: &Token, ctx: &Context) -> Option<String> {
    match token.kind {
        TokenKind::Word => Some(sql[token.start..token.end].to_string()),
        TokenKind::Quoted(b'`') => unquote(
            sql.as_bytes().get(token.start + 1..token.end - 1)?,
            b'`',
            ctx.quoting,
        ),
        _ => None,
    }
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

//! Metadata statements whose answers name tables: SHOW [FULL] TABLES, SHOW
//! TABLE STATUS, SHOW INDEX, SHOW CREATE TABLE and queries on
//! information_schema. Where partitioned tables are concerned, the plan is a
//! `Listing`: where the statement runs, and how its answer is corrected so
//! that it names logical tables, never physical ones.

use std::ops::ControlFlow;

use sqlparser::ast::{
    visit_expressions_mut, BinaryOperator, Expr, GroupByExpr, Ident, LimitClause, ObjectNamePart,
    OrderByExpr, OrderByKind, OrderBySort, Query, SelectItem, SetExpr, ShowStatementFilter,
    ShowStatementFilterPosition, Statement, TableFactor, TableWithJoins, Value as SqlValue,
};
use sqlparser::dialect::MySqlDialect;
use sqlparser::parser::Parser;

use crate::cache::unquote;
use crate::dictionary::{PartitionedTable, TableName};
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
    /// Rows other backends hold: those of partitioned tables whose default
    /// table lives off the listing's backend. Named for their logical table
    /// and combined with the listing's rows as `combine` says.
    pub elsewhere: Vec<Elsewhere>,
    pub combine: Combine,
}

/// What one backend other than the listing's answers: rows of the default
/// tables in `physical`, which stand for their logical tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Elsewhere {
    pub backend: u32,
    pub sql: String,
    pub physical: Vec<Physical>,
    /// `sql` only asks whether the backend has rows the answer would need:
    /// an answer of aggregates or groups cannot take them in, so any row
    /// refuses the statement.
    pub probe: bool,
}

/// How the listing's rows and those from elsewhere make one answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Combine {
    /// Every row sorted by name, as SHOW statements list them.
    SortedByName,
    /// The client's query on information_schema. Rows from one backend keep
    /// its order; rows from several are combined only where the query says
    /// nothing that concatenation would break.
    Query {
        order: QueryOrder,
        limited: bool,
        distinct: bool,
    },
    /// Table maintenance (`crate::maintenance`): rows in the order the
    /// statement names the tables. A partitioned table's partitions answer
    /// alike unless one has something to say, so its rows are kept once
    /// each; CHECKSUM TABLE's checksums, which MariaDB sums over rows, are
    /// summed over its partitions.
    Maintenance {
        tables: Vec<Maintained>,
        checksum: bool,
    },
}

/// A table a maintenance statement names, as its answer names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Maintained {
    /// `db.table`.
    pub qualified: String,
    pub partitioned: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueryOrder {
    Free,
    /// Ascending by the table name column.
    ByName,
    /// Anything else: rows from several backends are refused.
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameColumn {
    Position(usize),
    /// By its column name in the source table (information_schema queries
    /// choose and rename their columns).
    Named(&'static str),
    /// Values `db.table` (the answers of table maintenance).
    Qualified(usize),
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
    let word = |i: usize| word_at(sql, &tokens, i);
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
/// it (no backend has a table of the logical name). Default tables off the
/// main backend are asked of their own backend (`elsewhere_of_query`).
pub(crate) fn information_schema(statements: &[Statement], ctx: &Context) -> Listing {
    let (widened, changed) = widened(statements, ctx, Some(ctx.main_backend));
    let sql = changed.then(|| sql_of(&widened));
    let (elsewhere, combine) = match elsewhere_of_query(statements, ctx) {
        Some(found) => found,
        None => (Vec::new(), Combine::SortedByName),
    };
    Listing {
        backend: ctx.main_backend,
        sql,
        column: NameColumn::Named("TABLE_NAME"),
        schema_column: Some("TABLE_SCHEMA"),
        physical: ctx
            .dictionary
            .tables()
            .iter()
            .flat_map(|t| physical(t, ctx))
            .collect(),
        add: Vec::new(),
        like: None,
        create_statement: false,
        elsewhere,
        combine,
    }
}

/// The statements with their TABLE_NAME filters widened to match the default
/// tables on `backend` (every backend: `None`), and whether any was.
fn widened(
    statements: &[Statement],
    ctx: &Context,
    backend: Option<u32>,
) -> (Vec<Statement>, bool) {
    let tables = ctx.dictionary.tables();
    let stands_for = |name: &str, pattern: bool| -> Vec<String> {
        let name = name.to_lowercase();
        tables
            .iter()
            .filter(|t| backend.is_none_or(|b| t.default_backend == b))
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
    let mut changed = false;
    let _ = visit_expressions_mut(&mut statements, |expr| {
        if let Some(wider) = widen_table_filter(expr, &stands_for) {
            *expr = wider;
            changed = true;
        }
        ControlFlow::<()>::Continue(())
    });
    (statements, changed)
}

fn sql_of(statements: &[Statement]) -> String {
    statements
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// The information_schema tables that list rows per table, by TABLE_SCHEMA
/// and TABLE_NAME.
const PER_TABLE: &[&str] = &[
    "tables",
    "columns",
    "statistics",
    "key_column_usage",
    "table_constraints",
    "partitions",
];

/// For a query on one of the `PER_TABLE` tables, alone in its FROM: the same
/// query on each backend that holds default tables off the main backend,
/// restricted to those tables (an aggregate or grouped query: a probe for
/// rows), and how the answers combine. Other shapes (joins, unions,
/// subqueries in FROM) are answered by the main backend alone.
fn elsewhere_of_query(
    statements: &[Statement],
    ctx: &Context,
) -> Option<(Vec<Elsewhere>, Combine)> {
    let [Statement::Query(query)] = statements else {
        return None;
    };
    let SetExpr::Select(select) = query.body.as_ref() else {
        return None;
    };
    let [TableWithJoins {
        relation: TableFactor::Table { name, alias, .. },
        joins,
    }] = select.from.as_slice()
    else {
        return None;
    };
    let parts: Vec<&Ident> = name.0.iter().filter_map(ObjectNamePart::as_ident).collect();
    let source = match parts.as_slice() {
        [db, table] if db.value.eq_ignore_ascii_case("information_schema") => table,
        [table]
            if ctx
                .db
                .is_some_and(|db| db.eq_ignore_ascii_case("information_schema")) =>
        {
            table
        }
        _ => return None,
    };
    if !joins.is_empty() || !PER_TABLE.contains(&source.value.to_ascii_lowercase().as_str()) {
        return None;
    }
    let qualifier: &Ident = alias.as_ref().map_or(*source, |a| &a.name);
    let grouped = !matches!(&select.group_by, GroupByExpr::Expressions(e, _) if e.is_empty())
        || select.having.is_some()
        || select.projection.iter().any(|item| match item {
            SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => {
                crate::scan::nested_aggregate(e, &crate::scan::no_columns).is_some()
            }
            _ => false,
        });
    let combine = Combine::Query {
        order: query_order(query),
        limited: query.limit_clause.is_some() || query.fetch.is_some(),
        distinct: select.distinct.is_some(),
    };
    let mut backends: Vec<u32> = ctx
        .dictionary
        .tables()
        .iter()
        .map(|t| t.default_backend)
        .filter(|&b| b != ctx.main_backend)
        .collect();
    backends.sort_unstable();
    backends.dedup();
    let widened = match backends.is_empty() {
        true => Vec::new(),
        false => widened(statements, ctx, None).0,
    };
    let elsewhere = backends
        .into_iter()
        .filter_map(|backend| {
            let physical: Vec<Physical> = ctx
                .dictionary
                .tables()
                .iter()
                .filter(|t| t.default_backend == backend)
                .map(|t| Physical {
                    db: t.table.db.clone(),
                    table: t.default_table.clone(),
                    logical: Some(t.table.name.clone()),
                })
                .collect();
            let mut statement = widened[0].clone();
            let Statement::Query(query) = &mut statement else {
                return None;
            };
            let SetExpr::Select(select) = query.body.as_mut() else {
                return None;
            };
            let only = only_tables(&qualifier.value, &physical)?;
            select.selection = Some(match select.selection.take() {
                Some(filter) => Expr::BinaryOp {
                    left: Box::new(Expr::Nested(Box::new(filter))),
                    op: BinaryOperator::And,
                    right: Box::new(only),
                },
                None => only,
            });
            if grouped {
                select.projection = vec![SelectItem::UnnamedExpr(Expr::value(SqlValue::Number(
                    "1".into(),
                    false,
                )))];
                select.group_by = GroupByExpr::Expressions(Vec::new(), Vec::new());
                select.having = None;
                select.distinct = None;
                query.order_by = None;
                query.limit_clause = Some(LimitClause::LimitOffset {
                    limit: Some(Expr::value(SqlValue::Number("1".into(), false))),
                    offset: None,
                    limit_by: Vec::new(),
                });
            }
            Some(Elsewhere {
                backend,
                sql: statement.to_string(),
                physical,
                probe: grouped,
            })
        })
        .collect();
    Some((elsewhere, combine))
}

/// `(q.TABLE_SCHEMA, q.TABLE_NAME) IN (('db', 'table'), ...)`.
fn only_tables(qualifier: &str, tables: &[Physical]) -> Option<Expr> {
    let pairs: Vec<String> = tables
        .iter()
        .map(|t| format!("({}, {})", text_literal(&t.db), text_literal(&t.table)))
        .collect();
    let sql = format!(
        "({q}.TABLE_SCHEMA, {q}.TABLE_NAME) IN ({})",
        pairs.join(", "),
        q = quote_identifier(qualifier)
    );
    Parser::new(&MySqlDialect {})
        .try_with_sql(&sql)
        .ok()?
        .parse_expr()
        .ok()
}

/// How a query on information_schema orders its rows.
fn query_order(query: &Query) -> QueryOrder {
    let Some(order_by) = &query.order_by else {
        return QueryOrder::Free;
    };
    let OrderByKind::Expressions(keys) = &order_by.kind else {
        return QueryOrder::Other;
    };
    let by_name = |key: &OrderByExpr| {
        let ascending = matches!(key.options.sort, None | Some(OrderBySort::Asc));
        let named = match &key.expr {
            Expr::Identifier(ident) => ident.value.eq_ignore_ascii_case("table_name"),
            Expr::CompoundIdentifier(parts) => parts
                .last()
                .is_some_and(|ident| ident.value.eq_ignore_ascii_case("table_name")),
            _ => false,
        };
        ascending && named
    };
    match keys.as_slice() {
        [] => QueryOrder::Free,
        [key] if by_name(key) => QueryOrder::ByName,
        _ => QueryOrder::Other,
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
        combine: Combine::SortedByName,
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
            physical: vec![Physical {
                db: db.clone(),
                table: t.default_table.clone(),
                logical: Some(t.table.name.clone()),
            }],
            probe: false,
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
        combine: Combine::SortedByName,
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
        combine: Combine::SortedByName,
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
/// Token `i`, lowercase, when it is a word.
pub(crate) fn word_at(sql: &str, tokens: &[Token], i: usize) -> Option<String> {
    tokens
        .get(i)
        .filter(|t| t.kind == TokenKind::Word)
        .map(|t| sql[t.start..t.end].to_ascii_lowercase())
}

/// The table that `[db.]table` at the start of `tokens` names, in the
/// session's database, and how many tokens the name takes.
pub(crate) fn table_name(sql: &str, tokens: &[Token], ctx: &Context) -> (Option<TableName>, usize) {
    let dotted = tokens
        .get(1)
        .is_some_and(|t| t.kind == TokenKind::Symbol(b'.'));
    let taken = match dotted {
        true => 3.min(tokens.len()),
        false => 1.min(tokens.len()),
    };
    let names: Option<Vec<String>> = tokens[..taken]
        .iter()
        .step_by(2)
        .map(|t| identifier(sql, t, ctx))
        .collect();
    let table = match names.as_deref() {
        Some([db, table]) if dotted => Some(TableName {
            db: db.clone(),
            name: table.clone(),
        }),
        Some([table]) if !dotted => ctx.db.map(|db| TableName {
            db: db.into(),
            name: table.clone(),
        }),
        _ => None,
    };
    (table, taken)
}

pub(crate) fn identifier(sql: &str, token: &Token, ctx: &Context) -> Option<String> {
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

//! A SELECT that no partition can answer alone — a join of tables that are
//! not co-located, a partitioned table in a subquery or a derived table,
//! UNION, aggregates of DISTINCT, ... — runs where MariaDB evaluates it
//! itself: the rows it may read of each partitioned table are copied into a
//! temporary table of the same name on the main backend, where the
//! statement then runs as the client wrote it. A temporary table hides the
//! base table of its name from its own connection, and nothing else reads
//! it, so every rule of MariaDB's (types, collations, NULLs, the order of
//! evaluation) holds for the answer without hscale evaluating any SQL.
//!
//! The copies read what the statement may need and no more: the columns it
//! names, the rows its conditions on that table alone allow (routed to the
//! partitions they fix, as any statement), and, for a table joined by
//! equality to one copied before it, only the rows whose key is among that
//! copy's keys (`Reduce`).

use std::collections::HashSet;
use std::ops::ControlFlow;
use std::sync::Arc;

use sqlparser::ast::{
    BinaryOperator, Expr, GroupByExpr, Ident, JoinConstraint, JoinOperator, ObjectName,
    ObjectNamePart, Query, Select, SelectItem, SetExpr, Spanned, Statement, TableFactor,
    TableWithJoins, Visit, Visitor,
};
use sqlparser::dialect::MySqlDialect;
use sqlparser::parser::Parser;

use crate::dictionary::{PartitionedTable, TableName, Target};
use crate::error::PlanError;
use crate::plan::{Action, Context, Refusal};
use crate::rewrite::{quote_identifier, Offsets};
use crate::route::{conjuncts, strip_nesting};

/// How many distinct keys of a copy may narrow a later copy's rows
/// (`Reduce`): past it, the later copy reads every row its conditions allow.
pub const MOST_KEYS: usize = 2_000;

/// The copies a statement needs, in the order they are made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Federation {
    pub copies: Vec<TableCopy>,
    /// Why the partitions could not answer it alone.
    pub reason: String,
    /// A join of two tables hscale may answer without copies, tried first.
    pub lookup: Option<Lookup>,
}

/// An inner join of two partitioned tables on one equality of integer
/// columns, selecting columns only, every other condition on one table
/// alone: the outer table's rows are read by its own conditions, the inner
/// table's by those and the outer rows' keys (`key IN (...)`, routed by
/// partition where the key is its partition column), and hscale pairs the
/// rows whose keys are equal. Keys that are not integers, more outer rows
/// than `MOST_KEYS`, more inner rows than `MOST_LOOKUP_ROWS` or any error
/// leave the statement to the copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    /// `SELECT <its selected columns>, <key> FROM ... [WHERE ...]`.
    pub outer: String,
    /// The same, to which the keys' condition is added.
    pub inner: String,
    inner_key: String,
    inner_has_where: bool,
    /// The client's columns in order: (from the inner read, position).
    pub columns: Vec<(bool, usize)>,
    /// A LEFT JOIN: an outer row no inner row matches comes once, with
    /// NULLs for the inner columns (which lose NOT NULL).
    pub keeps_outer: bool,
}

/// How many rows of the inner table a lookup join holds to pair.
pub const MOST_LOOKUP_ROWS: usize = 20_000;

impl Lookup {
    /// The inner read for the outer rows' keys, as SQL.
    pub fn inner_read(&self, keys: &[String]) -> String {
        let glue = match self.inner_has_where {
            true => " AND ",
            false => " WHERE ",
        };
        format!(
            "{}{glue}{} IN ({})",
            self.inner,
            self.inner_key,
            keys.join(", ")
        )
    }
}

/// One partitioned table's rows, copied for the statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableCopy {
    pub table: TableName,
    /// The default table, whose definition the copy takes.
    pub definition: Target,
    /// How the statement names the table, which its conditions qualify
    /// columns by: an alias, or the name as written.
    pub reference: Reference,
    /// Conditions of the statement on this table alone, as written.
    pub filters: Vec<String>,
    /// The columns the statement may read.
    pub used: Used,
    pub reduce: Option<Reduce>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reference {
    Alias(String),
    Name(String),
}

/// Which columns a copy keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Used {
    /// The statement reads whole rows (`*`, NATURAL JOIN).
    All,
    /// Those whose names are among the statement's words (lower case): a
    /// column it names is among them, whatever it qualifies it by.
    Named(Arc<HashSet<String>>),
}

/// Only the rows of this copy whose `column` equals `from_column` of an
/// earlier copy `from`: the statement joins them by that equality, so no
/// other row can take part in its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reduce {
    pub column: String,
    pub from: usize,
    pub from_column: String,
}

/// The temporary table a copy fills, from its default table's definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Temporary {
    pub table: TableName,
    /// In MariaDB's Aria engine, where the table was InnoDB: a temporary
    /// Aria table fills and joins faster (it lives in the server's own
    /// temporary files, no transaction log), and its answers are the same.
    pub create: String,
    /// In the table's own engine: where `create` is refused (no Aria, a key
    /// longer than Aria's 1000 bytes).
    pub create_as_defined: Option<String>,
    pub columns: Vec<Column>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    /// FLOAT prints fewer digits than it holds: read as DOUBLE, which
    /// prints its value exactly and stores back as the same FLOAT.
    pub float: bool,
}

impl Temporary {
    /// The start of an INSERT of copied rows, up to its first row.
    pub fn insert_head(&self) -> String {
        let columns: Vec<String> = self
            .columns
            .iter()
            .map(|c| quote_identifier(&c.name))
            .collect();
        format!(
            "INSERT INTO {}.{} ({}) VALUES ",
            quote_identifier(&self.table.db),
            quote_identifier(&self.table.name),
            columns.join(", ")
        )
    }

    /// The start of an INSERT ... SELECT of rows into the copy.
    pub fn insert_select(&self) -> String {
        let head = self.insert_head();
        head.strip_suffix("VALUES ").unwrap_or(&head).to_string()
    }

    /// Where a column is among the copied ones.
    pub fn position(&self, column: &str) -> Option<usize> {
        self.columns
            .iter()
            .position(|c| c.name.eq_ignore_ascii_case(column))
    }
}

/// Drops the temporary tables of a statement's copies.
pub fn drop_temporaries<'t>(tables: impl IntoIterator<Item = &'t TableName>) -> Option<String> {
    let names: Vec<String> = tables
        .into_iter()
        .map(|t| format!("{}.{}", quote_identifier(&t.db), quote_identifier(&t.name)))
        .collect();
    (!names.is_empty()).then(|| format!("DROP TEMPORARY TABLE IF EXISTS {}", names.join(", ")))
}

impl TableCopy {
    /// The temporary table, from the default table's `SHOW CREATE TABLE`:
    /// its columns the statement may read, plain (a generated column's
    /// values are copied), and its keys on them; no constraints, which the
    /// rows already met, nor partitioning, which temporary tables lack.
    pub fn temporary(&self, definition: &str) -> Result<Temporary, PlanError> {
        let unreadable = || {
            PlanError::Refuse(format!(
                "the definition of {} as SHOW CREATE TABLE gives it",
                self.table
            ))
        };
        let mut lines = definition.lines();
        let first = lines.next().ok_or_else(unreadable)?;
        if !first.starts_with("CREATE TABLE ") || !first.ends_with(" (") {
            return Err(unreadable());
        }
        let mut columns = Vec::new();
        let mut all_columns = Vec::new();
        let mut keys = Vec::new();
        let mut options = None;
        for line in lines.by_ref() {
            if let Some(rest) = line.strip_prefix(')') {
                options = Some(rest.to_string());
                break;
            }
            let element = line.trim().trim_end_matches(',');
            if element.starts_with('`') {
                let (name, rest) = backticked(element).ok_or_else(unreadable)?;
                let wanted = match &self.used {
                    Used::All => true,
                    Used::Named(words) => words.contains(&name.to_lowercase()),
                };
                all_columns.push((name.clone(), rest.to_string()));
                if wanted {
                    columns.push((name, rest.to_string()));
                }
            } else if is_key(element) {
                keys.push(element.to_string());
            }
            // CONSTRAINT (checks, foreign keys) and PERIOD FOR are left out.
        }
        let options = options.ok_or_else(unreadable)?;
        if columns.is_empty() {
            // COUNT(*) of a join: any column counts the rows.
            columns.extend(all_columns.into_iter().take(1));
        }
        let kept: HashSet<String> = columns.iter().map(|(n, _)| n.to_lowercase()).collect();
        let mut elements = Vec::new();
        let mut copied = Vec::new();
        for (name, rest) in &columns {
            let plain = plain_column(rest).ok_or_else(unreadable)?;
            let float = plain
                .trim_start()
                .get(..5)
                .is_some_and(|t| t.eq_ignore_ascii_case("float"));
            elements.push(format!("  {}{plain}", quote_identifier(name)));
            copied.push(Column {
                name: name.clone(),
                float,
            });
        }
        for (index, key) in keys.iter().enumerate() {
            if let Some(key) = kept_key(key, &kept, index).ok_or_else(unreadable)? {
                elements.push(format!("  {key}"));
            }
        }
        // Of the table options, the engine (a memory table would refuse
        // TEXT and BLOB columns) and the default character set and
        // collation, which columns without their own take; not row formats,
        // compression, versioning or PARTITION BY (the lines after), which
        // temporary tables refuse.
        let options = table_options(&options);
        let create = |options: &str| {
            format!(
                "CREATE TEMPORARY TABLE {}.{} (\n{}\n){}",
                quote_identifier(&self.table.db),
                quote_identifier(&self.table.name),
                elements.join(",\n"),
                options
            )
        };
        let in_aria = options.replace(" ENGINE=InnoDB", " ENGINE=Aria");
        let (create, create_as_defined) = match in_aria == options {
            true => (create(&options), None),
            false => (create(&in_aria), Some(create(&options))),
        };
        Ok(Temporary {
            table: self.table.clone(),
            create,
            create_as_defined,
            columns: copied,
        })
    }

    /// The SELECT that reads the copy's rows: planned and routed as any
    /// statement. `keys`: the values of `Reduce`'s earlier copy, as SQL.
    pub fn fetch(&self, temporary: &Temporary, keys: Option<&[String]>) -> String {
        let columns: Vec<String> = temporary
            .columns
            .iter()
            .map(|c| match c.float {
                true => format!("CAST({} AS DOUBLE)", quote_identifier(&c.name)),
                false => quote_identifier(&c.name),
            })
            .collect();
        let from = match &self.reference {
            Reference::Alias(alias) => format!(
                "{}.{} AS {}",
                quote_identifier(&self.table.db),
                quote_identifier(&self.table.name),
                quote_identifier(alias)
            ),
            Reference::Name(name) => name.clone(),
        };
        let mut conditions: Vec<String> = self.filters.iter().map(|f| format!("({f})")).collect();
        if let (Some(reduce), Some(keys)) = (&self.reduce, keys) {
            conditions.push(format!(
                "{} IN ({})",
                quote_identifier(&reduce.column),
                keys.join(", ")
            ));
        }
        let mut sql = format!("SELECT {} FROM {from}", columns.join(", "));
        if !conditions.is_empty() {
            sql.push_str(" WHERE ");
            sql.push_str(&conditions.join(" AND "));
        }
        sql
    }
}

fn table_options(options: &str) -> String {
    let mut kept = String::new();
    for name in ["ENGINE=", "DEFAULT CHARSET=", "COLLATE="] {
        if let Some(at) = options.find(name) {
            let value: String = options[at + name.len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            kept.push_str(&format!(" {name}{value}"));
        }
    }
    kept
}

/// Keys a temporary table can have: not FULLTEXT or SPATIAL ones, which
/// InnoDB refuses there (a MATCH over a copy fails with MariaDB's 1191).
fn is_key(element: &str) -> bool {
    ["PRIMARY KEY", "UNIQUE KEY", "KEY ", "INDEX "]
        .iter()
        .any(|p| element.starts_with(p))
}

/// A backticked name at the start of `text` (doubled backticks inside)
/// and what follows it.
fn backticked(text: &str) -> Option<(String, &str)> {
    let inner = text.strip_prefix('`')?;
    let mut name = String::new();
    let mut chars = inner.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c == '`' {
            if matches!(chars.peek(), Some((_, '`'))) {
                chars.next();
                name.push('`');
                continue;
            }
            return Some((name, &inner[i + 1..]));
        }
        name.push(c);
    }
    None
}

/// A key's columns, each with its text in the key (a prefix length, an
/// order: `` `name`(10) DESC``).
fn key_parts(key: &str) -> Option<Vec<(String, String)>> {
    let open = key.find('(')?;
    let mut rest = &key[open + 1..];
    let mut parts = Vec::new();
    loop {
        rest = rest.trim_start();
        let (name, after) = backticked(rest)?;
        // A prefix length, an order: up to the next column or the end.
        let mut depth = 0;
        let mut end = None;
        for (i, c) in after.char_indices() {
            match c {
                '(' => depth += 1,
                ')' if depth > 0 => depth -= 1,
                ')' => {
                    end = Some((i, false));
                    break;
                }
                ',' if depth == 0 => {
                    end = Some((i, true));
                    break;
                }
                _ => {}
            }
        }
        let (at, more) = end?;
        let text = rest[..rest.len() - after.len() + at].to_string();
        parts.push((name, text));
        if !more {
            return Some(parts);
        }
        rest = &after[at + 1..];
    }
}

/// The key a copy keeps of `key`: all of it where it holds every column;
/// else, a plain key on the columns it holds from the first on (a join or
/// a correlation on them finds its rows by it: a copy of order lines that
/// leaves out their line number still finds an order's lines by its
/// warehouse, district and order id); `None` where it holds not the first.
fn kept_key(key: &str, kept: &HashSet<String>, index: usize) -> Option<Option<String>> {
    let parts = key_parts(key)?;
    let held = parts
        .iter()
        .take_while(|(name, _)| kept.contains(&name.to_lowercase()))
        .count();
    Some(match held {
        0 => None,
        n if n == parts.len() => Some(key.to_string()),
        n => {
            let columns: Vec<&str> = parts[..n].iter().map(|(_, text)| text.as_str()).collect();
            Some(format!(
                "KEY `hscale_prefix_{index}` ({})",
                columns.join(",")
            ))
        }
    })
}

/// A column's definition without what makes it generated: the copy holds
/// the values its rows had.
fn plain_column(rest: &str) -> Option<String> {
    let Some(at) = rest.find(" GENERATED ALWAYS AS (") else {
        return Some(rest.to_string());
    };
    let body = &rest[at + " GENERATED ALWAYS AS ".len()..];
    let end = balanced_end(body)?;
    let after = body[end..].trim_start();
    let after = ["VIRTUAL", "STORED", "PERSISTENT"]
        .iter()
        .find_map(|w| after.strip_prefix(w))
        .unwrap_or(after);
    Some(format!("{}{after}", &rest[..at]))
}

/// The end of the parenthesized expression `text` starts with, quotes
/// read.
fn balanced_end(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        if let Some(q) = quote {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                c if c == q => quote = None,
                _ => {}
            }
            continue;
        }
        match c {
            '\'' | '"' | '`' => quote = Some(c),
            '(' => depth += 1,
            ')' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

/// The federation of a SELECT the partitions cannot answer alone, or the
/// refusal that says why hscale cannot run it there either.
pub(crate) fn federate(
    sql: &str,
    statement: &Statement,
    partitioned: &[(ObjectName, &PartitionedTable)],
    ctx: &Context,
    reason: String,
) -> Action {
    let first = partitioned.first().map(|(_, t)| t.table.clone());
    let refuse = |why: &str| {
        Action::Refuse(Refusal {
            table: first.clone(),
            reason: format!("{reason}, and {why}"),
        })
    };
    let Statement::Query(query) = statement else {
        return refuse("only a SELECT is answered from copies of its tables");
    };
    if ctx.tables_locked {
        return refuse("under LOCK TABLES hscale cannot copy the tables it needs");
    }
    if locks(query) {
        return refuse("a locking read (FOR UPDATE, LOCK IN SHARE MODE) cannot lock copies");
    }
    let mut facts = Facts {
        offsets: Offsets::new(sql),
        sql,
        partitioned,
        depth: 0,
        depth_seen: false,
        words: HashSet::new(),
        whole_rows: false,
        references: Vec::new(),
        equalities: Vec::new(),
    };
    let _ = statement.visit(&mut facts);
    let used = match facts.whole_rows {
        true => Used::All,
        false => Used::Named(Arc::new(std::mem::take(&mut facts.words))),
    };
    // One copy per table; conditions and keys only for a table named once.
    let mut tables: Vec<&PartitionedTable> = Vec::new();
    for (_, table) in partitioned {
        if !tables.iter().any(|t| t.table == table.table) {
            tables.push(table);
        }
    }
    let once = |table: &TableName| {
        facts
            .references
            .iter()
            .filter(|r| &r.table == table)
            .count()
            == 1
            && partitioned
                .iter()
                .filter(|(_, t)| &t.table == table)
                .count()
                == 1
    };
    let mut copies: Vec<TableCopy> = Vec::new();
    let mut left: Vec<&PartitionedTable> = tables.clone();
    while !left.is_empty() {
        // A table an equality ties to one already copied: by its keys.
        let reducible = left.iter().enumerate().find_map(|(i, table)| {
            if !once(&table.table) {
                return None;
            }
            let reference = facts.references.iter().find(|r| r.table == table.table)?;
            facts.equalities.iter().find_map(|e| {
                if e.reduced != reference.id {
                    return None;
                }
                let by = facts.references.iter().find(|r| r.id == e.by)?;
                let from = copies.iter().position(|c| c.table == by.table)?;
                once(&by.table).then(|| {
                    (
                        i,
                        Reduce {
                            column: e.reduced_column.clone(),
                            from,
                            from_column: e.by_column.clone(),
                        },
                    )
                })
            })
        });
        let (i, reduce) = match reducible {
            Some((i, reduce)) => (i, Some(reduce)),
            None => {
                let filtered = left.iter().position(|t| {
                    once(&t.table)
                        && facts
                            .references
                            .iter()
                            .any(|r| r.table == t.table && !r.filters.is_empty())
                });
                (filtered.unwrap_or(0), None)
            }
        };
        let table = left.remove(i);
        let single = once(&table.table);
        let reference = facts
            .references
            .iter()
            .find(|r| r.table == table.table)
            .filter(|_| single);
        copies.push(TableCopy {
            table: table.table.clone(),
            definition: table.default_target(),
            reference: match reference {
                Some(r) => r.naming.clone(),
                None => Reference::Name(format!(
                    "{}.{}",
                    quote_identifier(&table.table.db),
                    quote_identifier(&table.table.name)
                )),
            },
            filters: reference.map(|r| r.filters.clone()).unwrap_or_default(),
            used: used.clone(),
            reduce,
        });
    }
    let lookup = lookup(query, &facts);
    Action::Federate(Box::new(Federation {
        copies,
        reason,
        lookup,
    }))
}

/// The lookup join a SELECT is, if it is one (see `Lookup`).
fn lookup(query: &Query, facts: &Facts) -> Option<Lookup> {
    let SetExpr::Select(select) = query.body.as_ref() else {
        return None;
    };
    let plain_query = query.with.is_none()
        && query.order_by.is_none()
        && query.limit_clause.is_none()
        && query.fetch.is_none()
        && query.locks.is_empty();
    let plain_select = select.distinct.is_none()
        && select.select_modifiers.is_none()
        && select.top.is_none()
        && select.into.is_none()
        && select.having.is_none()
        && select.named_window.is_empty()
        && matches!(&select.group_by, GroupByExpr::Expressions(e, m) if e.is_empty() && m.is_empty());
    if !plain_query || !plain_select || facts.depth_seen || facts.references.len() != 2 {
        return None;
    }
    let [a, b] = facts.references.as_slice() else {
        return None;
    };
    if a.table == b.table {
        return None;
    }
    // Inner joins, or a left join of the first table, of the two alone.
    let mut conjunct_count = select.selection.as_ref().map_or(0, |w| conjuncts(w).len());
    let mut keeps_outer = false;
    match select.from.as_slice() {
        [only] if only.joins.len() == 1 => match &only.joins[0].join_operator {
            JoinOperator::Join(JoinConstraint::On(on))
            | JoinOperator::Inner(JoinConstraint::On(on)) => conjunct_count += conjuncts(on).len(),
            JoinOperator::Left(JoinConstraint::On(on))
            | JoinOperator::LeftOuter(JoinConstraint::On(on)) => {
                conjunct_count += conjuncts(on).len();
                keeps_outer = true;
            }
            _ => return None,
        },
        [x, y] if x.joins.is_empty() && y.joins.is_empty() => {}
        _ => return None,
    }
    // Every condition is the equality or one table's alone.
    if conjunct_count != a.filters.len() + b.filters.len() + 1 {
        return None;
    }
    let (outer, inner) = match (a.filters.is_empty(), b.filters.is_empty()) {
        // A left join reads the table it keeps first.
        (false, _) => (a, b),
        (true, false) if !keeps_outer => (b, a),
        (true, _) => return None,
    };
    let equality = facts
        .equalities
        .iter()
        .find(|e| e.reduced == inner.id && e.by == outer.id)?;
    let qualifier = |r: &TableReference| match &r.naming {
        Reference::Alias(alias) => alias.clone(),
        Reference::Name(name) => name
            .rsplit('.')
            .next()
            .unwrap_or(name)
            .trim_matches('`')
            .to_string(),
    };
    let (outer_q, inner_q) = (qualifier(outer), qualifier(inner));
    let mut outer_columns = Vec::new();
    let mut inner_columns = Vec::new();
    let mut columns = Vec::new();
    for item in &select.projection {
        let (expr, alias) = match item {
            SelectItem::UnnamedExpr(expr) => (expr, None),
            SelectItem::ExprWithAlias { expr, alias } => (expr, Some(alias)),
            _ => return None,
        };
        let Expr::CompoundIdentifier(parts) = expr else {
            return None;
        };
        let [q, column] = parts.as_slice() else {
            return None;
        };
        let mut text = format!(
            "{}.{}",
            quote_identifier(&q.value),
            quote_identifier(&column.value)
        );
        if let Some(alias) = alias {
            text.push_str(&format!(" AS {}", quote_identifier(&alias.value)));
        }
        let (list, from_inner) = match q.value.as_str() {
            v if v == outer_q => (&mut outer_columns, false),
            v if v == inner_q => (&mut inner_columns, true),
            _ => return None,
        };
        columns.push((from_inner, list.len()));
        list.push(text);
    }
    let read = |r: &TableReference, q: &str, list: &[String], key: &str| {
        let from = match &r.naming {
            Reference::Alias(alias) => format!(
                "{}.{} AS {}",
                quote_identifier(&r.table.db),
                quote_identifier(&r.table.name),
                quote_identifier(alias)
            ),
            Reference::Name(name) => name.clone(),
        };
        let key = format!("{}.{}", quote_identifier(q), quote_identifier(key));
        let mut selected = list.to_vec();
        selected.push(key.clone());
        let mut sql = format!("SELECT {} FROM {from}", selected.join(", "));
        if !r.filters.is_empty() {
            let filters: Vec<String> = r.filters.iter().map(|f| format!("({f})")).collect();
            sql.push_str(&format!(" WHERE {}", filters.join(" AND ")));
        }
        (sql, key)
    };
    let (outer_read, _) = read(outer, &outer_q, &outer_columns, &equality.by_column);
    let (inner_read, inner_key) = read(inner, &inner_q, &inner_columns, &equality.reduced_column);
    Some(Lookup {
        outer: outer_read,
        inner: inner_read,
        inner_key,
        inner_has_where: !inner.filters.is_empty(),
        columns,
        keeps_outer,
    })
}

fn locks(query: &Query) -> bool {
    !query.locks.is_empty()
}

/// A reference to a partitioned table in a FROM.
struct TableReference {
    /// Which reference, in the order the statement names them.
    id: usize,
    table: TableName,
    naming: Reference,
    /// Conditions on it alone that every row it gives the statement meets.
    filters: Vec<String>,
}

/// `reduced.reduced_column = by.by_column` holds for every row of the
/// statement's answer that reads `reduced`.
struct Equality {
    reduced: usize,
    reduced_column: String,
    by: usize,
    by_column: String,
}

/// What the statement's blocks say about its partitioned tables.
struct Facts<'a> {
    sql: &'a str,
    offsets: Offsets<'a>,
    partitioned: &'a [(ObjectName, &'a PartitionedTable)],
    /// How deep in subqueries of expressions: an unqualified column there
    /// may be the outer query's.
    depth: usize,
    /// The statement has a subquery in an expression.
    depth_seen: bool,
    words: HashSet<String>,
    whole_rows: bool,
    references: Vec<TableReference>,
    equalities: Vec<Equality>,
}

/// A table of one FROM: where in the FROM, and whether a join may give its
/// columns as NULLs (the inner side of an outer join).
struct Factor<'s> {
    name: &'s ObjectName,
    alias: Option<&'s Ident>,
    nullable: bool,
    /// The ON of the join that brings it in, when a row of it that fails
    /// the ON joins nothing (INNER and LEFT joins).
    matched_on: Option<&'s Expr>,
    /// That join is an inner one: a row of the other side that fails its
    /// ON joins nothing either.
    inner: bool,
}

impl Visitor for Facts<'_> {
    type Break = ();

    fn pre_visit_ident(&mut self, ident: &Ident) -> ControlFlow<()> {
        self.words.insert(ident.value.to_lowercase());
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<()> {
        match expr {
            Expr::Identifier(ident) => {
                self.words.insert(ident.value.to_lowercase());
            }
            Expr::CompoundIdentifier(idents) => {
                for ident in idents {
                    self.words.insert(ident.value.to_lowercase());
                }
            }
            Expr::Subquery(_) | Expr::Exists { .. } | Expr::InSubquery { .. } => {
                self.depth += 1;
                self.depth_seen = true;
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }

    fn post_visit_expr(&mut self, expr: &Expr) -> ControlFlow<()> {
        if matches!(
            expr,
            Expr::Subquery(_) | Expr::Exists { .. } | Expr::InSubquery { .. }
        ) {
            self.depth -= 1;
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_select(&mut self, select: &Select) -> ControlFlow<()> {
        self.block(select);
        ControlFlow::Continue(())
    }
}

impl Facts<'_> {
    fn block(&mut self, select: &Select) {
        if select.projection.iter().any(|item| {
            matches!(
                item,
                SelectItem::Wildcard(_) | SelectItem::QualifiedWildcard(..)
            )
        }) {
            self.whole_rows = true;
        }
        let mut factors = Vec::new();
        for from in &select.from {
            self.factors(from, false, &mut factors);
        }
        // References of this block to partitioned tables, with their ids.
        let mut here: Vec<(usize, &Factor)> = Vec::new();
        for factor in &factors {
            let Some(table) = self
                .partitioned
                .iter()
                .find(|(name, _)| crate::route::same_name(name, factor.name))
                .map(|(_, t)| t.table.clone())
            else {
                continue;
            };
            let id = self.references.len();
            let naming = match factor.alias {
                Some(alias) => Reference::Alias(alias.value.clone()),
                None => Reference::Name(factor.name.to_string()),
            };
            self.references.push(TableReference {
                id,
                table,
                naming,
                filters: Vec::new(),
            });
            here.push((id, factor));
        }
        if here.is_empty() {
            return;
        }
        // Unqualified columns are this table's where it is the block's only
        // one and no outer query has columns.
        let alone = factors.len() == 1 && self.depth == 0;
        let where_conjuncts: Vec<&Expr> = select.selection.iter().flat_map(conjuncts).collect();
        for &(id, factor) in &here {
            let qualifier = qualifier(factor);
            let mut filters = Vec::new();
            let mut candidates: Vec<&Expr> = Vec::new();
            if !factor.nullable {
                candidates.extend(&where_conjuncts);
            }
            if let Some(on) = factor.matched_on {
                candidates.extend(conjuncts(on));
            }
            for conjunct in candidates {
                if self.on_table_alone(conjunct, &qualifier, alone) {
                    if let Some(text) = self.text_of(conjunct) {
                        filters.push(text);
                    }
                }
            }
            self.references[id].filters = filters;
        }
        // Equalities between two of this block's references.
        let column_of = |expr: &Expr| -> Option<(usize, String)> {
            let Expr::CompoundIdentifier(parts) = strip_nesting(expr) else {
                return None;
            };
            let [q, column] = parts.as_slice() else {
                return None;
            };
            let (id, _) = here
                .iter()
                .find(|(_, f)| qualifier(f).iter().any(|name| name == &q.value))?;
            Some((*id, column.value.clone()))
        };
        let mut pairs: Vec<(&Expr, Option<usize>)> =
            where_conjuncts.iter().map(|e| (*e, None)).collect();
        for &(id, factor) in &here {
            if let Some(on) = factor.matched_on {
                pairs.extend(conjuncts(on).into_iter().map(|e| (e, Some(id))));
            }
        }
        for (conjunct, on_of) in pairs {
            let Expr::BinaryOp {
                left,
                op: BinaryOperator::Eq,
                right,
            } = strip_nesting(conjunct)
            else {
                continue;
            };
            let (Some(a), Some(b)) = (column_of(left), column_of(right)) else {
                continue;
            };
            if a.0 == b.0 {
                continue;
            }
            let factor_of = |id: usize| here.iter().find(|(i, _)| *i == id).map(|(_, f)| *f);
            let nullable = |id: usize| factor_of(id).is_some_and(|f| f.nullable);
            let inner = |id: usize| factor_of(id).is_some_and(|f| f.inner);
            for (reduced, by) in [(&a, &b), (&b, &a)] {
                // An ON narrows the table it brings in; WHERE either side
                // where neither may be NULL.
                let holds = match on_of {
                    Some(joined) => {
                        (joined == reduced.0 || inner(joined) && !nullable(reduced.0))
                            && !nullable(by.0)
                    }
                    None => !nullable(reduced.0) && !nullable(by.0),
                };
                if holds {
                    self.equalities.push(Equality {
                        reduced: reduced.0,
                        reduced_column: reduced.1.clone(),
                        by: by.0,
                        by_column: by.1.clone(),
                    });
                }
            }
        }
    }

    fn factors<'s>(&mut self, from: &'s TableWithJoins, nullable: bool, out: &mut Vec<Factor<'s>>) {
        let right_after = |i: usize| {
            from.joins[i..]
                .iter()
                .any(|j| preserves_right(&j.join_operator))
        };
        self.factor(&from.relation, nullable || right_after(0), None, false, out);
        for (i, join) in from.joins.iter().enumerate() {
            let operator = &join.join_operator;
            if matches!(
                operator,
                JoinOperator::Join(JoinConstraint::Natural)
                    | JoinOperator::Inner(JoinConstraint::Natural)
                    | JoinOperator::Left(JoinConstraint::Natural)
                    | JoinOperator::LeftOuter(JoinConstraint::Natural)
                    | JoinOperator::Right(JoinConstraint::Natural)
                    | JoinOperator::RightOuter(JoinConstraint::Natural)
            ) {
                self.whole_rows = true;
            }
            let outer_here = matches!(
                operator,
                JoinOperator::Left(_)
                    | JoinOperator::LeftOuter(_)
                    | JoinOperator::FullOuter(_)
                    | JoinOperator::LeftSemi(_)
                    | JoinOperator::LeftAnti(_)
            );
            let matched_on = match operator {
                JoinOperator::Join(JoinConstraint::On(on))
                | JoinOperator::Inner(JoinConstraint::On(on))
                | JoinOperator::StraightJoin(JoinConstraint::On(on))
                | JoinOperator::Left(JoinConstraint::On(on))
                | JoinOperator::LeftOuter(JoinConstraint::On(on)) => Some(on),
                _ => None,
            };
            let inner = matches!(
                operator,
                JoinOperator::Join(_) | JoinOperator::Inner(_) | JoinOperator::StraightJoin(_)
            );
            let nullable = nullable || outer_here || right_after(i + 1);
            self.factor(&join.relation, nullable, matched_on, inner, out);
        }
    }

    fn factor<'s>(
        &mut self,
        factor: &'s TableFactor,
        nullable: bool,
        matched_on: Option<&'s Expr>,
        inner: bool,
        out: &mut Vec<Factor<'s>>,
    ) {
        match factor {
            TableFactor::Table { name, alias, .. } => out.push(Factor {
                name,
                alias: alias.as_ref().map(|a| &a.name),
                nullable,
                matched_on,
                inner,
            }),
            TableFactor::NestedJoin {
                table_with_joins, ..
            } => {
                // Its tables' ON conditions are the nested joins' own; the
                // outer ON narrows the nest as a whole, not one table.
                let mut inner = Vec::new();
                self.factors(table_with_joins, nullable, &mut inner);
                out.extend(inner);
            }
            // A derived table is a block of its own; its name is no
            // partitioned table's.
            _ => out.push(Factor {
                name: &EMPTY_NAME,
                alias: None,
                nullable,
                matched_on: None,
                inner: false,
            }),
        }
    }

    /// Whether an expression reads only the table `qualifier` names, and
    /// reads the same on a partition as on the main backend: columns,
    /// literals, operators and functions of the arguments alone.
    fn on_table_alone(&self, expr: &Expr, qualifier: &[String], alone: bool) -> bool {
        let mut plain = true;
        let mut columns = 0;
        let _ = sqlparser::ast::visit_expressions(expr, |e: &Expr| {
            match e {
                Expr::Identifier(ident) => {
                    columns += 1;
                    plain &= alone && !ident.value.starts_with('@');
                }
                Expr::CompoundIdentifier(parts) => {
                    columns += 1;
                    plain &= matches!(parts.as_slice(), [q, _] if qualifier.contains(&q.value));
                }
                Expr::Subquery(_)
                | Expr::Exists { .. }
                | Expr::InSubquery { .. }
                | Expr::Collate { .. } => plain = false,
                Expr::Value(v) => {
                    plain &= !matches!(v.value, sqlparser::ast::Value::Placeholder(_));
                }
                Expr::Function(f) => {
                    plain &= f.over.is_none() && deterministic(&f.name);
                }
                _ => {}
            }
            ControlFlow::<()>::Continue(())
        });
        plain && columns > 0
    }

    /// The text of a condition as written, if it reads back as the same.
    fn text_of(&self, expr: &Expr) -> Option<String> {
        let range = self.offsets.range(expr.span())?;
        let text = self.sql.get(range)?;
        let again = Parser::new(&MySqlDialect {})
            .try_with_sql(text)
            .ok()?
            .parse_expr()
            .ok()?;
        (again == *strip_nesting(expr) || again == *expr).then(|| text.to_string())
    }
}

static EMPTY_NAME: ObjectName = ObjectName(Vec::new());

/// The names a table's columns may be qualified by in its block.
fn qualifier(factor: &Factor) -> Vec<String> {
    match factor.alias {
        Some(alias) => vec![alias.value.clone()],
        None => factor
            .name
            .0
            .last()
            .and_then(ObjectNamePart::as_ident)
            .map(|i| vec![i.value.clone()])
            .unwrap_or_default(),
    }
}

/// A RIGHT or FULL join: the tables before it may come as NULLs.
fn preserves_right(operator: &JoinOperator) -> bool {
    matches!(
        operator,
        JoinOperator::Right(_) | JoinOperator::RightOuter(_) | JoinOperator::FullOuter(_)
    )
}

/// Functions whose value depends on their arguments alone, the same on
/// every server of one session's settings.
pub(crate) fn deterministic(name: &ObjectName) -> bool {
    const SAME_EVERYWHERE: &[&str] = &[
        "abs",
        "ceil",
        "ceiling",
        "floor",
        "round",
        "truncate",
        "mod",
        "sign",
        "greatest",
        "least",
        "coalesce",
        "ifnull",
        "nullif",
        "if",
        "isnull",
        "lower",
        "upper",
        "lcase",
        "ucase",
        "length",
        "char_length",
        "character_length",
        "octet_length",
        "concat",
        "concat_ws",
        "substring",
        "substr",
        "left",
        "right",
        "trim",
        "ltrim",
        "rtrim",
        "replace",
        "reverse",
        "locate",
        "instr",
        "lpad",
        "rpad",
        "date",
        "year",
        "month",
        "day",
        "dayofmonth",
        "hour",
        "minute",
        "second",
        "date_format",
        "datediff",
        "to_days",
        "weekday",
        "dayofweek",
        "quarter",
        "hex",
        "unhex",
        "md5",
        "sha1",
        "crc32",
        "ascii",
        "field",
        "find_in_set",
        "strcmp",
    ];
    match name.0.as_slice() {
        [part] => part
            .as_ident()
            .is_some_and(|i| SAME_EVERYWHERE.contains(&i.value.to_lowercase().as_str())),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(used: Used) -> TableCopy {
        TableCopy {
            table: TableName {
                db: "d".into(),
                name: "t".into(),
            },
            definition: Target {
                backend: 1,
                table: "t_default".into(),
                partition: None,
                fenced: false,
                physical: crate::dictionary::PhysicalId::default(),
            },
            reference: Reference::Alias("x".into()),
            filters: vec!["x.g > 1".into()],
            used,
            reduce: Some(Reduce {
                column: "g".into(),
                from: 0,
                from_column: "id".into(),
            }),
        }
    }

    const DEFINITION: &str = "CREATE TABLE `t_default` (
  `id` int(11) NOT NULL,
  `g` int(11) NOT NULL,
  `na``me` varchar(10) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci DEFAULT NULL,
  `f` float DEFAULT NULL,
  `v` int(11) GENERATED ALWAYS AS (`id` + (1)) VIRTUAL,
  PRIMARY KEY (`id`),
  KEY `g` (`g`,`na``me`(3)),
  KEY `f` (`f`),
  FULLTEXT KEY `n` (`na``me`),
  CONSTRAINT `c` CHECK (`g` > -100)
) ENGINE=InnoDB AUTO_INCREMENT=17 DEFAULT CHARSET=latin1 COLLATE=latin1_swedish_ci ROW_FORMAT=COMPRESSED COMMENT='x'
 PARTITION BY HASH (`id`)
PARTITIONS 2";

    #[test]
    fn a_temporary_table_keeps_the_named_columns_plain_and_their_keys() {
        let words: HashSet<String> = ["id", "g", "na`me", "v", "x"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let temporary = copy(Used::Named(Arc::new(words)))
            .temporary(DEFINITION)
            .unwrap();
        assert_eq!(
            temporary.create,
            "CREATE TEMPORARY TABLE `d`.`t` (
  `id` int(11) NOT NULL,
  `g` int(11) NOT NULL,
  `na``me` varchar(10) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci DEFAULT NULL,
  `v` int(11),
  PRIMARY KEY (`id`),
  KEY `g` (`g`,`na``me`(3))
) ENGINE=Aria DEFAULT CHARSET=latin1 COLLATE=latin1_swedish_ci"
        );
        assert!(temporary.create_as_defined.as_deref().is_some_and(
            |c| c.ends_with(") ENGINE=InnoDB DEFAULT CHARSET=latin1 COLLATE=latin1_swedish_ci")
        ));
        assert_eq!(temporary.position("NA`ME"), Some(2));
        assert_eq!(
            temporary.insert_head(),
            "INSERT INTO `d`.`t` (`id`, `g`, `na``me`, `v`) VALUES "
        );
    }

    #[test]
    fn a_copy_keeps_the_leading_columns_it_holds_of_a_key() {
        // Of `(g, na`me(3))` it holds g: a plain key on g; of the primary
        // key it holds nothing, and of `f` nothing.
        let words: HashSet<String> = ["g", "v"].iter().map(|s| s.to_string()).collect();
        let temporary = copy(Used::Named(Arc::new(words)))
            .temporary(DEFINITION)
            .unwrap();
        assert_eq!(
            temporary.create,
            "CREATE TEMPORARY TABLE `d`.`t` (
  `g` int(11) NOT NULL,
  `v` int(11),
  KEY `hscale_prefix_1` (`g`)
) ENGINE=Aria DEFAULT CHARSET=latin1 COLLATE=latin1_swedish_ci"
        );
        let words: HashSet<String> = ["na`me", "id"].iter().map(|s| s.to_string()).collect();
        let temporary = copy(Used::Named(Arc::new(words)))
            .temporary(DEFINITION)
            .unwrap();
        assert!(
            temporary.create.contains("  PRIMARY KEY (`id`)\n"),
            "{}",
            temporary.create
        );
        assert!(
            !temporary.create.contains("KEY `g`"),
            "{}",
            temporary.create
        );
    }

    #[test]
    fn a_fetch_reads_floats_as_doubles_under_the_statements_conditions_and_keys() {
        let c = copy(Used::All);
        let temporary = c.temporary(DEFINITION).unwrap();
        assert_eq!(temporary.columns.len(), 5);
        assert!(temporary.columns[3].float);
        assert_eq!(
            c.fetch(&temporary, Some(&["1".into(), "_binary X'32'".into()])),
            "SELECT `id`, `g`, `na``me`, CAST(`f` AS DOUBLE), `v` FROM `d`.`t` AS `x` \
             WHERE (x.g > 1) AND `g` IN (1, _binary X'32')"
        );
        assert_eq!(
            drop_temporaries([&c.table]).unwrap(),
            "DROP TEMPORARY TABLE IF EXISTS `d`.`t`"
        );
    }
}

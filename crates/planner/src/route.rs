//! Routing a statement that names a partitioned table: which physical tables
//! it must run on, the SQL each one gets, and how the answers combine. What
//! cannot be answered correctly from the partitions is refused with the reason.

use std::ops::{ControlFlow, Range};
use std::sync::Arc;

use sqlparser::ast::{
    visit_expressions, visit_relations, AssignmentTarget, BinaryOperator, Expr, FromTable,
    FunctionArg, FunctionArgExpr, FunctionArguments, Ident, JoinConstraint, JoinOperator,
    ObjectName, ObjectNamePart, OnInsert, Query, Select, SelectItem, SetExpr, Spanned, Statement,
    TableFactor, TableObject, TableWithJoins, UnaryOperator, Value as Literal,
};
use sqlparser::dialect::MySqlDialect;
use sqlparser::parser::Parser;
use sqlparser::tokenizer::Span;

use crate::auto::{id_value, not_an_id, Fill, Generate, IdValue, Upsert};
use crate::dictionary::{PartitionedTable, ReferenceTable, TableName, Target};
use crate::error::PlanError;
use crate::hashing::Value;
use crate::lexer::{Summary, Token, Tokens};
use crate::plan::{Action, Context, Merge, Refusal, Route, Step};
use crate::rewrite::{quote_identifier, Offsets, Splices};
use crate::schema::schema_names;
use crate::shape::{
    apply_edits, bytes, check_others, off_main, ByteShape, Edit, EditText, InsertRows, Key,
    RangeEnd, Shape,
};
use crate::show::word_at;
use crate::template::{Bound, Form, Row, Rows, Template};
use smallvec::SmallVec;

/// The plan of a statement that may name a partitioned table, and the shape
/// the plan cache may keep for statements like it.
pub(crate) struct Routed {
    pub action: Action,
    pub shape: Option<ByteShape>,
}

impl From<Action> for Routed {
    fn from(action: Action) -> Routed {
        Routed {
            action,
            shape: None,
        }
    }
}

/// `params`: when the statement is being prepared, the byte offsets of its
/// `?` placeholders; a route then becomes a `Template`.
pub(crate) fn route(
    sql: &str,
    summary: &Summary,
    ctx: &Context,
    params: Option<&[usize]>,
) -> Routed {
    let refuse = |table: Option<&TableName>, error: PlanError| {
        Routed::from(Action::Refuse(error.refusal(table.cloned())))
    };
    // sqlparser's MySQL dialect reads a backslash as an escape.
    if ctx.quoting.no_backslash_escapes && sql.contains('\\') {
        return refuse(
            None,
            "a backslash in a statement on a partitioned table under NO_BACKSLASH_ESCAPES".into(),
        );
    }
    let statements = match Parser::parse_sql(&MySqlDialect {}, sql) {
        Ok(s) => s,
        Err(e) => {
            return match may_name_partitioned(sql, ctx) {
                Some(table) => {
                    let reason = not_run(sql, ctx).map_or_else(
                        || format!("a statement hscale cannot parse ({e})"),
                        str::to_string,
                    );
                    refuse(Some(&table), reason.into())
                }
                None => Action::Main.into(),
            };
        }
    };
    let mut partitioned = Vec::new();
    let mut references = Vec::new();
    let mut others = 0usize;
    let _ = visit_relations(&statements, |name: &ObjectName| {
        let resolved = resolve(name, ctx);
        let dictionary = ctx.dictionary;
        match resolved
            .as_ref()
            .and_then(|t| dictionary.table(&t.db, &t.name))
        {
            Some(table) => partitioned.push((name.clone(), table)),
            None => match resolved.and_then(|t| dictionary.reference(&t.db, &t.name)) {
                Some(reference) => {
                    // Until every copy is made, only the main backend has it.
                    others += usize::from(!reference.ready);
                    references.push(reference);
                }
                None => others += 1,
            },
        }
        ControlFlow::<()>::Continue(())
    });
    // Schema statements name their tables outside relation positions too.
    for name in statements.iter().flat_map(schema_names) {
        let reference = resolve(name, ctx).and_then(|t| ctx.dictionary.reference(&t.db, &t.name));
        if let Some(reference) = reference {
            if !references.iter().any(|r| r.table == reference.table) {
                references.push(reference);
            }
        }
    }
    if !references.is_empty() {
        let referenced = References {
            references: &references,
            partitioned: !partitioned.is_empty(),
            others,
        };
        if let Some(action) = referenced.statement(&statements, sql, summary, ctx) {
            return action.into();
        }
    }
    let schema_table = statements.iter().flat_map(schema_names).find_map(|name| {
        let table = resolve(name, ctx).and_then(|t| ctx.dictionary.table(&t.db, &t.name))?;
        Some((name.clone(), table))
    });
    let schema = schema_table.is_some();
    let (reference, table, others, joined) = match (schema_table, partitioned.as_slice()) {
        (Some((reference, table)), _) => (reference, table, 0, &[][..]),
        (None, []) if reads_information_schema(&statements, ctx) => {
            return Action::Listing(Box::new(crate::show::information_schema(&statements, ctx)))
                .into()
        }
        (None, []) => {
            return match reference_read(&statements, &references, others) {
                Some(backends) => Action::ReferenceRead(backends),
                None => Action::Main,
            }
            .into()
        }
        (None, [(reference, table), joined @ ..]) => (reference.clone(), *table, others, joined),
    };
    let [statement] = statements.as_slice() else {
        return refuse(Some(&table.table), "several statements in one query".into());
    };
    let mut tables = std::iter::once(table).chain(joined.iter().map(|(_, t)| *t));
    if let Some(locked) = tables.find(|t| t.locked()) {
        return Action::Wait(locked.table.clone()).into();
    }
    // What the partitions cannot answer alone, a SELECT answers from copies
    // of its tables (`federate`).
    let answer_elsewhere = |error: PlanError| -> Routed {
        match statement {
            Statement::Query(_) => {
                crate::federate::federate(sql, statement, &partitioned, ctx, error.to_string())
                    .into()
            }
            _ => refuse(Some(&table.table), error),
        }
    };
    if let Err(reason) = co_located(table, joined, statement) {
        return answer_elsewhere(reason);
    }
    let analysis = Analysis {
        sql,
        statement,
        offsets: Offsets::new(sql),
        table,
        reference,
        others,
        joined,
        ctx,
        params: params.unwrap_or_default(),
        own_shape: Default::default(),
        same_partition: Default::default(),
    };
    if schema {
        return match analysis.schema_change() {
            Ok(action) => action.into(),
            Err(reason) => refuse(Some(&table.table), reason),
        };
    }
    if let Statement::Insert(insert) = statement {
        match analysis.generate(insert) {
            Ok(Some(generate)) => return Action::Generate(generate).into(),
            Ok(None) => {}
            Err(reason) => return refuse(Some(&table.table), reason),
        }
    }
    let shaped: Result<_, PlanError> = match statement {
        Statement::Query(query) => analysis.select(query, summary),
        Statement::Insert(insert) => match (&insert.table, &insert.source) {
            (TableObject::TableName(name), Some(source))
                if same_name(name, &analysis.reference) && !analysis.joined.is_empty() =>
            {
                analysis.insert_co_located(insert, source, summary)
            }
            (TableObject::TableName(name), _) if same_name(name, &analysis.reference) => {
                analysis.values_insert(insert)
            }
            (_, Some(source)) if matches!(source.body.as_ref(), SetExpr::Select(_)) => {
                analysis.insert_from_partitions(source, summary)
            }
            _ => Err(PlanError::Refuse(
                "a partitioned table in a subquery of an INSERT into another table".into(),
            )),
        },
        Statement::Update(update) => analysis.update(update),
        Statement::Delete(delete) => analysis.delete(delete),
        _ => Err(PlanError::NotHandled),
    };
    let form = match shaped {
        Ok((shape, keys)) => Ok(Form::Keys {
            shape,
            keys,
            same_partition: analysis.same_partition.take(),
        }),
        Err(refused @ PlanError::Refuse(_)) if matches!(statement, Statement::Query(_)) => {
            return answer_elsewhere(refused)
        }
        Err(refused @ PlanError::Refuse(_)) => Err(refused),
        Err(PlanError::NotHandled) => match statement {
            Statement::Insert(insert) => analysis.insert(insert),
            Statement::ExplainTable { .. } | Statement::ShowColumns { .. } => {
                analysis.describe().map(Form::Fixed)
            }
            other => Err(PlanError::Refuse(format!(
                "{} statements",
                statement_kind(other)
            ))),
        },
    };
    if params.is_some() {
        return match form {
            Ok(form) => {
                let main_only = main_only(summary);
                let upsert = match statement {
                    Statement::Insert(insert) => analysis.upsert(insert),
                    _ => None,
                };
                let template = Template::new(sql, table, ctx.dictionary.version, main_only, form)
                    .with_upsert(upsert);
                Action::Template(Box::new(template)).into()
            }
            Err(reason) => answer_elsewhere(reason),
        };
    }
    let (routed, shape) = match form {
        Ok(Form::Keys {
            mut shape, keys, ..
        }) => {
            let values: Option<Vec<Value>> = keys
                .into_iter()
                .map(|key| match key {
                    Bound::Literal(value) => Some(value),
                    Bound::Param(_) => None,
                })
                .collect();
            match values {
                Some(values) => (
                    shape.render(sql, table, ctx.main_backend, &values, bytes),
                    Some(shape),
                ),
                // A `?` in a query: the backends answer what is wrong with it.
                None => {
                    shape.keys = None;
                    (shape.render(sql, table, ctx.main_backend, &[], bytes), None)
                }
            }
        }
        Ok(Form::Rows(rows)) => (rows.route(sql, table, ctx.main_backend), None),
        Ok(Form::Fixed(route)) => (Ok(route), None),
        Err(reason) => (Err(reason), None),
    };
    // Its tables' partitions were matched by its literals.
    let shape = shape.filter(|_| !analysis.own_shape.get());
    let action = finish(routed, summary, ctx, &table.table);
    match action {
        Action::Refuse(refusal) if matches!(statement, Statement::Query(_)) => {
            answer_elsewhere(refusal.reason.into())
        }
        action => Routed { action, shape },
    }
}

/// The backends that hold every reference table a plain SELECT reads,
/// where it reads nothing else; the main backend first.
fn reference_read(
    statements: &[Statement],
    references: &[&ReferenceTable],
    others: usize,
) -> Option<SmallVec<[u32; 4]>> {
    let [Statement::Query(query)] = statements else {
        return None;
    };
    // SELECT ... INTO writes variables or files where it runs.
    let plain = matches!(&*query.body, SetExpr::Select(select) if select.into.is_none());
    let (first, rest) = references.split_first()?;
    if !plain || others > 0 || !references.iter().all(|r| r.ready) {
        return None;
    }
    let backends: SmallVec<[u32; 4]> = first
        .backends
        .iter()
        .copied()
        .filter(|b| rest.iter().all(|r| r.backends.contains(b)))
        .collect();
    (backends.len() > 1).then_some(backends)
}

/// What a statement naming reference tables reads besides them.
struct References<'r> {
    references: &'r [&'r ReferenceTable],
    partitioned: bool,
    /// Tables only the main backend has.
    others: usize,
}

impl References<'_> {
    /// A write to a reference table goes to every copy, and so does a schema
    /// statement on one (in turn, under the table lock). `None`: the
    /// statement only reads them, and is planned as any other.
    fn statement(
        &self,
        statements: &[Statement],
        sql: &str,
        summary: &Summary,
        ctx: &Context,
    ) -> Option<Action> {
        let find = |name: &ObjectName| {
            let t = resolve(name, ctx)?;
            self.references.iter().find(|r| r.table == t).copied()
        };
        let refuse = |table: &TableName, reason: &str| {
            Some(Action::Refuse(Refusal {
                table: Some(table.clone()),
                reason: reason.to_string(),
            }))
        };
        let first = &self.references[0].table;
        let [statement] = statements else {
            return refuse(
                first,
                "several statements in one query that name a reference table",
            );
        };
        if let Some(reference) = schema_names(statement).into_iter().find_map(find) {
            if self.partitioned {
                return refuse(
                    &reference.table,
                    "a schema statement naming a reference table and a partitioned table",
                );
            }
            if !reference.ready {
                return Some(Action::Wait(reference.table.clone()));
            }
            return match crate::schema::reference_change(statement, sql, reference, ctx)? {
                Ok(action) => Some(action),
                Err(error) => Some(Action::Refuse(error.refusal(Some(reference.table.clone())))),
            };
        }
        let target = match write_target(statement) {
            WriteTarget::None => return None,
            WriteTarget::Table(name) => name,
            WriteTarget::Several => {
                return refuse(
                    first,
                    "a write naming a reference table that is not one table's",
                )
            }
        };
        let reference = find(target)?;
        let table = &reference.table;
        if !reference.ready {
            return Some(Action::Wait(table.clone()));
        }
        if self.partitioned || self.others > 0 {
            return refuse(
                table,
                "a write to a reference table that reads tables other than reference tables",
            );
        }
        let mut varies = None;
        let _ = visit_expressions(statement, |e: &Expr| {
            if let Expr::Function(f) = e {
                if !crate::federate::deterministic(&f.name) {
                    varies = Some(f.name.to_string());
                }
            }
            ControlFlow::<()>::Continue(())
        });
        if let Some(function) = varies {
            return refuse(
                table,
                &format!(
                    "a write to a reference table with {function}(), whose value may differ between its copies"
                ),
            );
        }
        let steps = reference
            .backends
            .iter()
            .map(|&backend| Step {
                target: Target::new(&table.db, backend, &table.name, None),
                sql: sql.to_string(),
            })
            .collect();
        let route = Route {
            table: Arc::new(table.clone()),
            steps,
            merge: Merge::Copies,
            writes: true,
            highest_id: None,
        };
        Some(finish(Ok(route), summary, ctx, table))
    }
}

enum WriteTarget<'s> {
    /// The statement writes no table.
    None,
    Table(&'s ObjectName),
    /// A multi-table UPDATE or DELETE.
    Several,
}

/// The one table a FROM names, joined to nothing.
fn single_table(from: &[TableWithJoins]) -> Option<&ObjectName> {
    match from {
        [TableWithJoins {
            relation: TableFactor::Table { name, .. },
            joins,
        }] if joins.is_empty() => Some(name),
        _ => None,
    }
}

fn write_target(statement: &Statement) -> WriteTarget<'_> {
    let single = single_table;
    match statement {
        Statement::Insert(insert) => match &insert.table {
            TableObject::TableName(name) => WriteTarget::Table(name),
            _ => WriteTarget::Several,
        },
        Statement::Update(update) if update.from.is_none() => {
            match single(std::slice::from_ref(&update.table)) {
                Some(name) => WriteTarget::Table(name),
                None => WriteTarget::Several,
            }
        }
        Statement::Delete(delete) if delete.tables.is_empty() && delete.using.is_none() => {
            let from = match &delete.from {
                FromTable::WithFromKeyword(from) | FromTable::WithoutKeyword(from) => from,
            };
            match single(from) {
                Some(name) => WriteTarget::Table(name),
                None => WriteTarget::Several,
            }
        }
        Statement::Update(_) | Statement::Delete(_) => WriteTarget::Several,
        Statement::LoadData { table_name, .. } => WriteTarget::Table(table_name),
        _ => WriteTarget::None,
    }
}

/// A SELECT answered from copies of its partitioned tables whatever its
/// shape: a prepared statement whose execution reaches partitions whose
/// answers hscale cannot merge (`reason`).
pub(crate) fn copies(sql: &str, ctx: &Context, reason: String) -> Action {
    let Ok(statements) = Parser::parse_sql(&MySqlDialect {}, sql) else {
        return Action::Refuse(Refusal {
            table: None,
            reason,
        });
    };
    let mut partitioned = Vec::new();
    let _ = visit_relations(&statements, |name: &ObjectName| {
        if let Some(table) = resolve(name, ctx).and_then(|t| ctx.dictionary.table(&t.db, &t.name)) {
            partitioned.push((name.clone(), table));
        }
        ControlFlow::<()>::Continue(())
    });
    match statements.as_slice() {
        [statement] => crate::federate::federate(sql, statement, &partitioned, ctx, reason),
        _ => Action::Refuse(Refusal {
            table: None,
            reason,
        }),
    }
}

/// A statement that names partitioned tables beside the routed one must be
/// a SELECT joining tables co-located with it (`PartitionedTable::co_located`).
fn co_located(
    table: &PartitionedTable,
    joined: &[(ObjectName, &PartitionedTable)],
    statement: &Statement,
) -> Result<(), PlanError> {
    if joined.is_empty() {
        return Ok(());
    }
    if !matches!(statement, Statement::Query(_) | Statement::Insert(_)) {
        return Err(
            "a statement other than SELECT or INSERT ... SELECT that names partitioned tables more than once (only those join co-located partitions)"
                .into(),
        );
    }
    for (_, other) in joined {
        table.co_located(other).map_err(|reason| {
            PlanError::Refuse(format!(
                "a join of partitioned tables that are not co-located: {reason}"
            ))
        })?;
    }
    Ok(())
}

/// A rendered route, or the refusal that names the table.
pub(crate) fn finish(
    routed: Result<Route, PlanError>,
    summary: &Summary,
    ctx: &Context,
    table: &TableName,
) -> Action {
    let refusal = |error: PlanError| Action::Refuse(error.refusal(Some(table.clone())));
    match routed {
        Ok(route) => match check_connection_state(&route, summary, ctx) {
            Ok(()) => Action::Route(route),
            Err(reason) => refusal(reason),
        },
        Err(reason) => refusal(reason),
    }
}

/// Whether a statement reads information_schema, whose tables list physical
/// tables.
fn reads_information_schema(statements: &Vec<Statement>, ctx: &Context) -> bool {
    let is = |db: &str| db.eq_ignore_ascii_case("information_schema");
    let mut found = false;
    let _ = visit_relations(statements, |name: &ObjectName| {
        let parts: Vec<&Ident> = name.0.iter().filter_map(ObjectNamePart::as_ident).collect();
        found |= match parts.as_slice() {
            [_] => ctx.db.is_some_and(is),
            [db, _] => is(&db.value),
            _ => false,
        };
        ControlFlow::<()>::Continue(())
    });
    found
}

/// Statements hscale does not run on a partitioned table, and what to do
/// instead.
fn not_run(sql: &str, ctx: &Context) -> Option<&'static str> {
    let tokens: Vec<Token> = Tokens::new(sql.as_bytes(), ctx.quoting).collect();
    let word = |i: usize| word_at(sql, &tokens, i);
    match (word(0).as_deref(), word(1).as_deref()) {
        (Some("load"), Some("data" | "xml")) => Some(
            "LOAD DATA into a partitioned table among other statements in one query: hscale \
             places each row of a LOAD DATA LOCAL INFILE by its partition value, one \
             statement at a time",
        ),
        (Some("handler"), _) => Some(
            "HANDLER on a partitioned table: a handler walks one physical table \
             (read the table with SELECT)",
        ),
        _ => None,
    }
}

/// For a statement sqlparser cannot read: a partitioned table whose name is
/// one of its words and whose database is the session's or named too. Only
/// such a statement could reach a partitioned table; any other passes through.
fn may_name_partitioned(sql: &str, ctx: &Context) -> Option<TableName> {
    let words: Vec<&str> = sql
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '$'))
        .filter(|w| !w.is_empty())
        .collect();
    let has = |name: &str| words.iter().any(|w| w.eq_ignore_ascii_case(name));
    ctx.dictionary
        .tables()
        .into_iter()
        .find(|t| has(&t.table.name) && (ctx.db == Some(t.table.db.as_str()) || has(&t.table.db)))
        .map(|t| t.table.clone())
}

/// State only the main backend's connection has must not be read elsewhere.
fn check_connection_state(
    route: &Route,
    summary: &Summary,
    ctx: &Context,
) -> Result<(), PlanError> {
    let targets = route.steps.iter().map(|s| &s.target);
    check_main_only(main_only(summary), targets, ctx.main_backend)
}

/// Whether a statement reads what only the main backend's connection has.
fn main_only(summary: &Summary) -> bool {
    summary.user_variables || summary.user_lock || summary.found_rows
}

pub(crate) fn check_main_only<'t>(
    main_only: bool,
    targets: impl IntoIterator<Item = &'t Target>,
    main_backend: u32,
) -> Result<(), PlanError> {
    match off_main(targets, main_backend) {
        Some(far) if main_only => Err(PlanError::Refuse(format!(
            "user variables, user locks and FOUND_ROWS() live on the main backend's connection, and partition {} is on backend {}",
            far.table, far.backend
        ))),
        _ => Ok(()),
    }
}

fn statement_kind(statement: &Statement) -> String {
    let text = statement.to_string();
    text.split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
        .to_uppercase()
}

/// The database and table an object name names, in the session's database.
pub(crate) fn resolve(name: &ObjectName, ctx: &Context) -> Option<TableName> {
    let parts: Vec<&Ident> = name.0.iter().filter_map(ObjectNamePart::as_ident).collect();
    match parts.as_slice() {
        [table] => Some(TableName {
            db: ctx.db?.to_string(),
            name: table.value.clone(),
        }),
        [db, table] => Some(TableName {
            db: db.value.clone(),
            name: table.value.clone(),
        }),
        _ => None,
    }
}

pub(crate) fn same_name(a: &ObjectName, b: &ObjectName) -> bool {
    a == b && spans(a) == spans(b)
}

fn spans(name: &ObjectName) -> Vec<sqlparser::tokenizer::Span> {
    name.0
        .iter()
        .filter_map(ObjectNamePart::as_ident)
        .map(|i| i.span)
        .collect()
}

pub(crate) struct Analysis<'a> {
    pub sql: &'a str,
    pub statement: &'a Statement,
    pub offsets: Offsets<'a>,
    pub table: &'a PartitionedTable,
    /// The partitioned table as the statement names it.
    pub reference: ObjectName,
    /// References to tables that are not partitioned.
    pub others: usize,
    /// Other references to partitioned tables: tables co-located with
    /// `table` (or `table` again) that a SELECT joins to it.
    pub joined: &'a [(ObjectName, &'a PartitionedTable)],
    pub ctx: &'a Context<'a>,
    /// The byte offsets of the `?` placeholders of a statement being prepared.
    pub params: &'a [usize],
    /// The shape holds what only this statement's text has — tables found
    /// co-located by equal literals (`owners`), a select item named by its
    /// text (`item_names`): it serves no other statement.
    pub own_shape: std::cell::Cell<bool>,
    /// Values that must lie in one partition for the statement to run as
    /// planned: parameters a partition column of a joined table equals
    /// (see `owners`).
    pub same_partition: std::cell::RefCell<Vec<(Bound, Bound)>>,
}

/// How the partitioned table is written where it is replaced.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Naming {
    /// `users` becomes `users_nick1` AS `users` (SELECT, UPDATE): qualified
    /// columns and the result's table name stay as the client wrote them.
    Aliased,
    /// `users` becomes `users_nick1`, and so do qualifiers (`users.id`) that
    /// name it (DELETE and INSERT take no alias in MariaDB).
    Renamed,
}

/// A reference to a partitioned table in a statement: how its columns are
/// qualified and how its physical table is written.
pub(crate) struct Owner<'r> {
    pub reference: &'r ObjectName,
    pub table: &'r PartitionedTable,
    pub alias: Option<Ident>,
    pub naming: Option<Naming>,
    /// Joined to the routed table, which picks its partitions.
    pub co_located: bool,
}

impl Analysis<'_> {
    /// The columns of the partitioned table `name` names, where known.
    pub(crate) fn columns_of(&self, name: &ObjectName) -> Option<Arc<[String]>> {
        let table = resolve(name, self.ctx)?;
        self.ctx
            .dictionary
            .table(&table.db, &table.name)?
            .columns
            .clone()
    }

    /// The routed table as the statement names it.
    fn owner(&self, alias: Option<Ident>, naming: Option<Naming>) -> Owner<'_> {
        Owner {
            reference: &self.reference,
            table: self.table,
            alias,
            naming,
            co_located: false,
        }
    }

    /// The routed table and the tables joined to it: tables of the
    /// statement's own FROM, their partition columns equated by `=` at the
    /// top level of the WHERE or of a join's ON; or tables of a subquery in
    /// its WHERE or select list (at any depth) whose own WHERE equates, at
    /// its top level, their partition column with one of a table around it
    /// (`i.order_id = o.order_id`, both qualified). Such a correlated
    /// subquery reads, for each row around it, only rows of the same
    /// partition: it runs inside each partition as written.
    fn owners(&self, select: &Select) -> Result<Vec<Owner<'_>>, PlanError> {
        let subqueries = match self.joined.is_empty() {
            true => Vec::new(),
            false => subqueries_of(select),
        };
        let owner = |reference, table, co_located| -> Result<Owner<'_>, PlanError> {
            let alias = match self.top_level_alias(&select.from, reference) {
                Ok(alias) => alias,
                Err(outside) => subqueries
                    .iter()
                    .find_map(|inner| self.top_level_alias(&inner.from, reference).ok())
                    .ok_or(outside)?,
            };
            let naming = alias.is_none().then_some(self.unaliased_naming());
            Ok(Owner {
                reference,
                table,
                alias,
                naming,
                co_located,
            })
        };
        let mut owners = vec![owner(&self.reference, self.table, false)?];
        for (reference, table) in self.joined {
            owners.push(owner(reference, table, true)?);
        }
        if owners.len() == 1 {
            return Ok(owners);
        }
        let mut equalities = Vec::new();
        if let Some(selection) = &select.selection {
            equalities.extend(conjuncts(selection));
        }
        for join in select.from.iter().flat_map(|t| &t.joins) {
            if let Some(JoinConstraint::On(on)) = join_constraint(&join.join_operator) {
                equalities.extend(conjuncts(on));
            }
        }
        if !subqueries.is_empty() {
            // A qualifier names one reference only where every reference
            // has a name of its own: no subquery shadows a table around it.
            let mut names: Vec<&str> = owners
                .iter()
                .map(|o| {
                    o.alias
                        .as_ref()
                        .map_or(o.table.table.name.as_str(), |a| a.value.as_str())
                })
                .collect();
            names.sort_unstable();
            if names.windows(2).any(|pair| pair[0] == pair[1]) {
                return Err(
                    "a subquery naming a partitioned table as a table around it is named".into(),
                );
            }
            let nested = subqueries
                .iter()
                .any(|inner| !subqueries_of(inner).is_empty());
            for inner in &subqueries {
                let names_one = |e: &Expr| names_one_table(e, inner, select, &owners, nested);
                let correlations = inner.selection.iter().flat_map(|w| conjuncts(w));
                equalities.extend(correlations.filter(|e| {
                    matches!(e, Expr::BinaryOp { left, op: BinaryOperator::Eq, right }
                        if names_one(left) && names_one(right))
                }));
            }
        }
        // Which references the equalities link to the routed table.
        let mut linked = vec![false; owners.len()];
        linked[0] = true;
        let mut pairs: Vec<(usize, usize)> = equalities
            .iter()
            .filter_map(|e| {
                let (left, right) = equality_sides(e)?;
                Some((column_owner(left, &owners)?, column_owner(right, &owners)?))
            })
            .collect();
        // Partition columns equal to literals of one partition: for this
        // statement their rows sit in same-named partitions too. Another
        // statement of the same fingerprint may give other literals: never
        // cached. A parameter's value is known at each execution, which
        // checks that it lies where the other's does (`Form::Keys`).
        let pinned: Vec<(usize, Bound)> = equalities
            .iter()
            .filter_map(|e| {
                let (left, right) = equality_sides(e)?;
                match (column_owner(left, &owners), self.literal_key(right)) {
                    (Some(owner), Some((bound, _))) => Some((owner, bound)),
                    _ => Some((column_owner(right, &owners)?, self.literal_key(left)?.0)),
                }
            })
            .collect();
        let partition_of = |value: &Value| self.table.target_for(value).ok();
        for (i, (a, x)) in pinned.iter().enumerate() {
            for (b, y) in &pinned[i + 1..] {
                if let (Bound::Literal(x), Bound::Literal(y)) = (x, y) {
                    if a != b && partition_of(x).is_some_and(|t| Some(t) == partition_of(y)) {
                        pairs.push((*a, *b));
                        self.own_shape.set(true);
                    }
                }
            }
        }
        let link = |linked: &mut Vec<bool>, pairs: &[(usize, usize)]| {
            while let Some(&(a, b)) = pairs.iter().find(|&&(a, b)| linked[a] != linked[b]) {
                linked[a] = true;
                linked[b] = true;
            }
        };
        link(&mut linked, &pairs);
        // Only where nothing else links a table: a parameter's check may
        // send an execution to copies.
        let by_parameter = |linked: &[bool], i: usize, j: usize| {
            let ((a, x), (b, y)) = (&pinned[i], &pinned[j]);
            let parameter = matches!(x, Bound::Param(_)) || matches!(y, Bound::Param(_));
            parameter && linked[*a] && !linked[*b]
        };
        let all_pairs = || (0..pinned.len()).flat_map(|i| (0..pinned.len()).map(move |j| (i, j)));
        while let Some((i, j)) = all_pairs().find(|&(i, j)| by_parameter(&linked, i, j)) {
            self.same_partition
                .borrow_mut()
                .push((pinned[i].1.clone(), pinned[j].1.clone()));
            linked[pinned[j].0] = true;
            link(&mut linked, &pairs);
        }
        match owners.iter().zip(&linked).find(|(_, linked)| !**linked) {
            None => Ok(owners),
            Some((owner, _)) if self.top_level_alias(&select.from, owner.reference).is_err() => {
                Err(PlanError::Refuse(format!(
                    "a subquery on {} whose WHERE does not equate its partition column `{}` with that of a table around it (with `=`, qualified where hscale cannot tell the table)",
                    owner.table.table, owner.table.column
                )))
            }
            Some((owner, _)) => Err(PlanError::Refuse(format!(
                "a join whose condition does not equate the partition columns of {} (`{}`) and {} (`{}`) with `=`",
                self.table.table, self.table.column, owner.table.table, owner.table.column
            ))),
        }
    }

    fn select(
        &self,
        query: &Query,
        summary: &Summary,
    ) -> Result<(ByteShape, Vec<Bound>), PlanError> {
        if query.with.is_some() {
            return Err("WITH".into());
        }
        let SetExpr::Select(select) = query.body.as_ref() else {
            return Err("UNION, INTERSECT or EXCEPT".into());
        };
        let owners = self.owners(select)?;
        let names = match owners.len() {
            1 => Vec::new(),
            _ => self.item_names(select)?,
        };
        let (many, scan_edits) = match self.scan_merge(query, select, summary) {
            Ok((spec, edits)) => (Ok(Merge::Rows(Box::new(spec))), edits),
            Err(reason) => (
                Err(PlanError::Refuse(format!(
                    "{reason} over several partitions"
                ))),
                Vec::new(),
            ),
        };
        let (mut shape, values) = self.shape(select.selection.as_ref(), &owners, many, false)?;
        if !names.is_empty() {
            shape.edits.extend(names);
            shape.edits.sort_by_key(|e| e.at.start);
            self.own_shape.set(true);
        }
        shape.scan_edits = scan_edits;
        shape.scan_reads_literals = self.merge_reads_literals();
        Ok((shape, values))
    }

    /// Names for the select items without one that hold a subquery: MariaDB
    /// names such a column by its text, which the rewrite changes (the
    /// partition's table in the subquery), so the item gets that text as its
    /// alias (MariaDB cuts both to 255 characters alike).
    fn item_names(&self, select: &Select) -> Result<Vec<Edit<Range<usize>>>, PlanError> {
        let unnamed: Vec<bool> = select
            .projection
            .iter()
            .map(|item| matches!(item, SelectItem::UnnamedExpr(e) if has_subquery(e)))
            .collect();
        if !unnamed.contains(&true) {
            return Ok(Vec::new());
        }
        let items = select_items(self.sql, self.ctx.quoting)
            .filter(|items| items.len() == unnamed.len())
            .ok_or(
                "a subquery as a select item without an alias, in a select list hscale cannot read",
            )?;
        Ok(items
            .into_iter()
            .zip(unnamed)
            .filter(|(_, unnamed)| *unnamed)
            .map(|(item, _)| Edit {
                at: item.end..item.end,
                text: EditText::Fixed(format!(" AS {}", quote_identifier(&self.sql[item]))),
            })
            .collect())
    }

    /// INSERT INTO plain SELECT ... FROM the partitioned table: the SELECT
    /// routed as it would be, each partition's rows inserted where the plain
    /// table lives (which `others` holds to the main backend).
    fn insert_from_partitions(
        &self,
        source: &Query,
        summary: &Summary,
    ) -> Result<(ByteShape, Vec<Bound>), PlanError> {
        let (mut shape, values) = self.select(source, summary)?;
        // Each partition inserts its own rows: nothing may need merging.
        shape.many = match shape.many {
            Ok(Merge::Rows(spec)) if *spec == Default::default() => Ok(Merge::AffectedRows),
            Ok(_) => Err(
                "an INSERT ... SELECT whose SELECT merges partitions (ORDER BY, LIMIT, DISTINCT, \
                 GROUP BY, aggregates) over several partitions"
                    .into(),
            ),
            Err(reason) => Err(reason),
        };
        shape.scan_edits.clear();
        shape.writes = true;
        Ok((shape, values))
    }

    /// INSERT INTO a partitioned table SELECT ... FROM tables co-located
    /// with it: each partition's SELECT inserts into the same partition of
    /// the target, on its backend, where the target's partition column takes
    /// a source's partition column (so every row stays in its partition).
    fn insert_co_located(
        &self,
        insert: &sqlparser::ast::Insert,
        source: &Query,
        summary: &Summary,
    ) -> Result<(ByteShape, Vec<Bound>), PlanError> {
        let target = self.table;
        let refuse = |what: &str| {
            Err(PlanError::Refuse(format!(
                "an INSERT ... SELECT between partitioned tables {what}"
            )))
        };
        if target.auto_column.is_some() {
            return refuse("into a table with an AUTO_INCREMENT column (hscale gives its ids)");
        }
        let [(first, routed), rest @ ..] = self.joined else {
            return refuse("with no partitioned table in its SELECT");
        };
        if rest
            .iter()
            .chain([&(first.clone(), *routed)])
            .any(|(_, t)| t.table == target.table)
        {
            return refuse("that reads the table it writes");
        }
        let SetExpr::Select(select) = source.body.as_ref() else {
            return refuse("whose source is not one SELECT");
        };
        // The value the target's partition column takes in each row.
        let item = self
            .insert_position(insert)
            .and_then(|position| select.projection.get(position));
        let column = match item {
            Some(SelectItem::UnnamedExpr(expr) | SelectItem::ExprWithAlias { expr, .. }) => {
                match expr {
                    Expr::Identifier(ident) => Some(std::slice::from_ref(ident)),
                    Expr::CompoundIdentifier(idents) => Some(idents.as_slice()),
                    _ => None,
                }
            }
            _ => None,
        };
        let partition_column = |idents: &[Ident]| {
            self.joined.iter().any(|(reference, table)| {
                let alias = self.top_level_alias(&select.from, reference).ok().flatten();
                names_column(
                    &idents.iter().collect::<Vec<_>>(),
                    table,
                    &table.column,
                    alias.as_ref(),
                )
            })
        };
        if !column.is_some_and(partition_column) {
            return Err(PlanError::Refuse(format!(
                "an INSERT ... SELECT between partitioned tables where {}'s partition column `{}` does not take a partition column of the tables it reads (its rows could belong to another partition)",
                target.table, target.column
            )));
        }
        let reads = Analysis {
            sql: self.sql,
            statement: self.statement,
            offsets: Offsets::new(self.sql),
            table: routed,
            reference: first.clone(),
            others: self.others,
            joined: rest,
            ctx: self.ctx,
            params: self.params,
            own_shape: Default::default(),
            same_partition: Default::default(),
        };
        // The SELECT's keys pick the partitions (the same in every
        // co-located table); its tables are written as the target's
        // partition's neighbours, the target as the routed table.
        let (mut shape, values) = reads.insert_from_partitions(source, summary)?;
        if reads.own_shape.get() {
            self.own_shape.set(true);
        }
        self.same_partition
            .borrow_mut()
            .extend(reads.same_partition.take());
        let mut edits = Vec::new();
        for mut owner in reads.owners(select)? {
            owner.co_located = true;
            edits.extend(reads.edits_of(&owner)?);
        }
        let written = Owner {
            reference: &self.reference,
            table: target,
            alias: None,
            naming: Some(Naming::Renamed),
            co_located: false,
        };
        edits.extend(self.edits_of(&written)?);
        edits.sort_by_key(|e| e.at.start);
        shape.edits = edits;
        shape.table = Arc::new(target.table.clone());
        shape.joined = self
            .joined
            .iter()
            .map(|(_, t)| Arc::new(t.table.clone()))
            .collect();
        Ok((shape, values))
    }

    /// The shape of a SELECT, UPDATE or DELETE, and the values of its keys.
    fn shape(
        &self,
        selection: Option<&Expr>,
        owners: &[Owner],
        many: Result<Merge, PlanError>,
        writes: bool,
    ) -> Result<(ByteShape, Vec<Bound>), PlanError> {
        let keys = selection.and_then(|w| self.fixed_keys(w, owners));
        let values = keys.iter().flatten().map(|(v, _)| v.clone()).collect();
        let mut edits = Vec::new();
        for owner in owners {
            edits.extend(self.edits_of(owner)?);
        }
        edits.sort_by_key(|e| e.at.start);
        let shape = Shape {
            table: Arc::new(self.table.table.clone()),
            keys: keys.map(|keys| keys.into_iter().map(|(_, k)| k).collect()),
            edits,
            scan_edits: Vec::new(),
            many,
            scan_reads_literals: false,
            writes,
            others: self.others > 0,
            joined: owners
                .iter()
                .filter(|o| o.co_located)
                .map(|o| Arc::new(o.table.table.clone()))
                .collect(),
            rows: None,
        };
        Ok((shape, values))
    }

    fn update(
        &self,
        update: &sqlparser::ast::Update,
    ) -> Result<(ByteShape, Vec<Bound>), PlanError> {
        if update.from.is_some() {
            return Err("UPDATE ... FROM".into());
        }
        let alias = self.top_level_alias(std::slice::from_ref(&update.table), &self.reference)?;
        for assignment in &update.assignments {
            let columns = match &assignment.target {
                AssignmentTarget::ColumnName(name) => vec![name],
                AssignmentTarget::Tuple(names) => names.iter().collect(),
            };
            if columns.iter().any(|c| self.names_column(c, alias.as_ref())) {
                return Err(PlanError::Refuse(format!(
                    "an UPDATE that changes the partition column `{}`",
                    self.table.column
                )));
            }
            // An id set past the sequence would be handed out again later,
            // and another partition would take it.
            if let Some(auto) = &self.table.auto_column {
                if columns
                    .iter()
                    .any(|c| self.names(c, &auto.name, alias.as_ref()))
                {
                    return Err(PlanError::Refuse(format!(
                        "an UPDATE that changes the AUTO_INCREMENT column `{}` (hscale hands out its ids)",
                        auto.name
                    )));
                }
            }
        }
        let many = match update.limit.is_some() || !update.order_by.is_empty() {
            true => Err("UPDATE with ORDER BY or LIMIT over several partitions".into()),
            false => Ok(Merge::AffectedRows),
        };
        let naming = alias.is_none().then_some(self.unaliased_naming());
        let owner = self.owner(alias, naming);
        self.shape(update.selection.as_ref(), &[owner], many, true)
    }

    fn delete(
        &self,
        delete: &sqlparser::ast::Delete,
    ) -> Result<(ByteShape, Vec<Bound>), PlanError> {
        let from = match &delete.from {
            FromTable::WithFromKeyword(from) | FromTable::WithoutKeyword(from) => from,
        };
        if !delete.tables.is_empty() || delete.using.is_some() || from.len() != 1 {
            return Err("multi-table DELETE".into());
        }
        let alias = self.top_level_alias(from, &self.reference)?;
        if alias.is_some() {
            return Err("DELETE with a table alias".into());
        }
        let many = match delete.limit.is_some() || !delete.order_by.is_empty() {
            true => Err("DELETE with ORDER BY or LIMIT over several partitions".into()),
            false => Ok(Merge::AffectedRows),
        };
        let owner = self.owner(None, Some(Naming::Renamed));
        self.shape(delete.selection.as_ref(), &[owner], many, true)
    }

    /// DESC / SHOW COLUMNS: the default table has the logical table's columns.
    fn describe(&self) -> Result<Route, PlanError> {
        let target = self.table.default_target();
        let edits = self.edits(None)?;
        let sql = apply_edits(self.sql, &edits, &target, &mut Splices::default(), bytes)?;
        Ok(Route {
            table: Arc::new(self.table.table.clone()),
            steps: smallvec::smallvec![Step { target, sql }],
            merge: Merge::Rows(Default::default()),
            writes: false,
            highest_id: None,
        })
    }

    /// Where the partition column is among the columns an INSERT lists.
    fn insert_position(&self, insert: &sqlparser::ast::Insert) -> Option<usize> {
        let column = &self.table.column;
        match insert.columns.is_empty() {
            true => self.table.column_position.checked_sub(1),
            false => insert
                .columns
                .iter()
                .position(|c| last_ident(c).is_some_and(|i| i.value.eq_ignore_ascii_case(column))),
        }
    }

    /// Where the AUTO_INCREMENT column is among the values of an INSERT's rows.
    fn auto_index(&self, insert: &sqlparser::ast::Insert) -> Option<usize> {
        let auto = self.table.auto_column.as_ref()?;
        match insert.columns.is_empty() {
            true => auto.position.checked_sub(1),
            false => insert.columns.iter().position(|c| {
                last_ident(c).is_some_and(|i| i.value.eq_ignore_ascii_case(&auto.name))
            }),
        }
    }

    /// The AUTO_INCREMENT column's value in an INSERT ... SET.
    fn auto_assigned<'s>(&self, insert: &'s sqlparser::ast::Insert) -> Option<&'s Expr> {
        let auto = self.table.auto_column.as_ref()?;
        insert
            .assignments
            .iter()
            .find(|a| match &a.target {
                AssignmentTarget::ColumnName(name) => {
                    last_ident(name).is_some_and(|i| i.value.eq_ignore_ascii_case(&auto.name))
                }
                AssignmentTarget::Tuple(_) => false,
            })
            .map(|a| &a.value)
    }

    /// The ids an INSERT leaves to the server, which hscale must give
    /// instead (each partition table would count on its own), and where they
    /// go in the text; `None` when it gives every id itself.
    fn generate(&self, insert: &sqlparser::ast::Insert) -> Result<Option<Generate>, PlanError> {
        let Some(auto) = &self.table.auto_column else {
            return Ok(None);
        };
        let lost = || PlanError::refuse("a row hscale cannot find in the text");
        let range = |expr: &Expr| self.offsets.range(expr.span()).ok_or_else(lost);
        let mut fills = Vec::new();
        if let Some(last) = insert.assignments.last() {
            match self.auto_assigned(insert) {
                Some(value) => {
                    if self.id_value(value)? == Some(IdValue::Generated) {
                        fills.push(Fill::value(self.value_range(value).ok_or_else(lost)?));
                    }
                }
                None => {
                    let name = quote_identifier(&auto.name);
                    fills.push(Fill::added(range(&last.value)?.end, format!(", {name} = ")));
                }
            }
            return Ok(Generate::new(self.table.table.clone(), fills)
                .map(|g| g.with_upsert(self.upsert(insert))));
        }
        let Some(source) = &insert.source else {
            return Ok(None);
        };
        let SetExpr::Values(values) = source.body.as_ref() else {
            return match self.auto_index(insert) {
                Some(_) => Ok(None),
                None => Err(PlanError::Refuse(format!(
                    "INSERT ... SELECT that leaves the AUTO_INCREMENT column `{}` to the server",
                    auto.name
                ))),
            };
        };
        match self.auto_index(insert) {
            Some(index) => {
                for value in values.rows.iter().filter_map(|row| row.content.get(index)) {
                    if self.id_value(value)? == Some(IdValue::Generated) {
                        fills.push(Fill::value(self.value_range(value).ok_or_else(lost)?));
                    }
                }
            }
            None => {
                let last = insert
                    .columns
                    .last()
                    .and_then(last_ident)
                    .ok_or_else(lost)?;
                let end = self.offsets.byte(last.span.end).ok_or_else(lost)?;
                let close = self.sql[end..].find(')').ok_or_else(lost)? + end;
                fills.push(Fill::column(close, &auto.name));
                for row in &values.rows {
                    let close = self
                        .offsets
                        .byte(row.closing_token.0.span.start)
                        .ok_or_else(lost)?;
                    fills.push(Fill::added(close, ", ".into()));
                }
            }
        }
        Ok(Generate::new(self.table.table.clone(), fills)
            .map(|g| g.with_upsert(self.upsert(insert))))
    }

    /// A one-row INSERT ... ON DUPLICATE KEY UPDATE, and whether its update
    /// calls LAST_INSERT_ID(expr).
    pub(crate) fn upsert(&self, insert: &sqlparser::ast::Insert) -> Option<Upsert> {
        let Some(OnInsert::DuplicateKeyUpdate(assignments)) = &insert.on else {
            return None;
        };
        let one_row = match insert.source.as_deref().map(|s| s.body.as_ref()) {
            None => !insert.assignments.is_empty(),
            Some(SetExpr::Values(values)) => values.rows.len() == 1,
            Some(_) => false,
        };
        if !one_row {
            return None;
        }
        let sets_last_insert_id = visit_expressions(assignments, |expr| match expr {
            Expr::Function(f)
                if f.name.to_string().eq_ignore_ascii_case("last_insert_id")
                    && !matches!(&f.args, FunctionArguments::List(l) if l.args.is_empty())
                    && !matches!(f.args, FunctionArguments::None) =>
            {
                ControlFlow::Break(())
            }
            _ => ControlFlow::Continue(()),
        })
        .is_break();
        Some(Upsert {
            sets_last_insert_id,
        })
    }

    /// The partition column's value in an INSERT ... SET.
    fn assigned_value<'s>(&self, insert: &'s sqlparser::ast::Insert) -> Option<&'s Expr> {
        insert
            .assignments
            .iter()
            .find(|a| matches!(&a.target, AssignmentTarget::ColumnName(n) if self.names_column(n, None)))
            .map(|a| &a.value)
    }

    /// An INSERT whose rows give the partition column as literals: a shape
    /// with one key per row, which the plan cache keeps. Anything else (INSERT
    /// ... SELECT, ids hscale hands out, `?` in several rows, what `insert`
    /// refuses) is `PlanError::NotHandled`: planned by `insert`.
    fn values_insert(
        &self,
        insert: &sqlparser::ast::Insert,
    ) -> Result<(ByteShape, Vec<Bound>), PlanError> {
        let unshaped = || PlanError::NotHandled;
        let mysql_on = matches!(insert.on, None | Some(OnInsert::DuplicateKeyUpdate(_)));
        // With an AUTO_INCREMENT column, `insert` notes the highest id given.
        if !mysql_on || self.table.auto_column.is_some() {
            return Err(unshaped());
        }
        self.check_duplicate_update(insert)?;
        let mut found = Vec::new();
        let mut placed = None;
        match (&insert.source, insert.assignments.is_empty()) {
            (None, false) => found.push(self.assigned_value(insert)),
            (Some(source), true) => match (source.body.as_ref(), self.insert_position(insert)) {
                (SetExpr::Values(values), Some(position)) => {
                    let mut spans = Vec::with_capacity(values.rows.len());
                    for row in &values.rows {
                        found.push(row.content.get(position));
                        let span =
                            Span::new(row.opening_token.0.span.start, row.closing_token.0.span.end);
                        spans.push(self.offsets.range(span).ok_or_else(unshaped)?);
                    }
                    if spans.len() > 1 {
                        placed = Some(InsertRows {
                            span: spans[0].start..spans[spans.len() - 1].end,
                            rows: spans,
                        });
                    }
                }
                _ => return Err(unshaped()),
            },
            _ => return Err(unshaped()),
        }
        let (bounds, keys): (Vec<Bound>, Vec<Key<Range<usize>>>) = found
            .into_iter()
            .map(|value| value.and_then(|v| self.literal_key(v)).ok_or_else(unshaped))
            .collect::<Result<Vec<_>, PlanError>>()?
            .into_iter()
            .unzip();
        // A statement being prepared with `?` in its rows splits them with
        // their parameters: `insert`'s rows know which.
        let has_params = |rows: &InsertRows<Range<usize>>| {
            rows.rows
                .iter()
                .any(|at| !self.params_within(at).is_empty())
        };
        if placed.as_ref().is_some_and(has_params) {
            return Err(unshaped());
        }
        let shape = Shape {
            table: Arc::new(self.table.table.clone()),
            keys: Some(keys),
            edits: self.edits(Some(Naming::Renamed))?,
            scan_edits: Vec::new(),
            many: Err("one row in several partitions".into()),
            scan_reads_literals: false,
            writes: true,
            others: self.others > 0,
            joined: Vec::new(),
            rows: placed,
        };
        Ok((shape, bounds))
    }

    /// ON DUPLICATE KEY UPDATE works within the row's partition: it may not
    /// move the row.
    fn check_duplicate_update(&self, insert: &sqlparser::ast::Insert) -> Result<(), PlanError> {
        let Some(OnInsert::DuplicateKeyUpdate(assignments)) = &insert.on else {
            return Ok(());
        };
        let sets = |column: &str, a: &sqlparser::ast::Assignment| match &a.target {
            AssignmentTarget::ColumnName(name) => self.names(name, column, None),
            AssignmentTarget::Tuple(names) => names.iter().any(|n| self.names(n, column, None)),
        };
        if assignments.iter().any(|a| sets(&self.table.column, a)) {
            return Err(PlanError::Refuse(format!(
                "ON DUPLICATE KEY UPDATE that changes the partition column `{}`",
                self.table.column
            )));
        }
        // An id set past the sequence would be handed out again later, and
        // another partition would take it. The row's own id, or the one its
        // VALUES gave (which hscale read), stays within it:
        // `id = LAST_INSERT_ID(id)` is how clients learn an existing row's id.
        let Some(auto) = &self.table.auto_column else {
            return Ok(());
        };
        let keeps_id = |a: &sqlparser::ast::Assignment| {
            matches!(a.target, AssignmentTarget::ColumnName(_))
                && self.is_own_id(&a.value, &auto.name)
        };
        match assignments
            .iter()
            .any(|a| sets(&auto.name, a) && !keeps_id(a))
        {
            true => Err(PlanError::Refuse(format!(
                "ON DUPLICATE KEY UPDATE that sets the AUTO_INCREMENT column `{}` other than to \
                 itself, VALUES({0}) or LAST_INSERT_ID({0}) (hscale hands out its ids)",
                auto.name
            ))),
            false => Ok(()),
        }
    }

    /// `column`, `VALUES(column)` or `LAST_INSERT_ID(column)`.
    fn is_own_id(&self, expr: &Expr, column: &str) -> bool {
        let names_it = |expr: &Expr| match expr {
            Expr::Identifier(ident) => ident.value.eq_ignore_ascii_case(column),
            Expr::CompoundIdentifier(parts) => {
                let parts: Vec<&Ident> = parts.iter().collect();
                names_column(&parts, self.table, column, None)
            }
            _ => false,
        };
        match expr {
            Expr::Nested(inner) => self.is_own_id(inner, column),
            Expr::Function(function) => {
                let name = function.name.to_string();
                let wraps = name.eq_ignore_ascii_case("values")
                    || name.eq_ignore_ascii_case("last_insert_id");
                let FunctionArguments::List(list) = &function.args else {
                    return false;
                };
                match list.args.as_slice() {
                    [FunctionArg::Unnamed(FunctionArgExpr::Expr(arg))] => wraps && names_it(arg),
                    _ => false,
                }
            }
            other => names_it(other),
        }
    }

    /// An INSERT that `values_insert` did not shape: its rows, each
    /// placed by its own key, or an INSERT ... SELECT's one route.
    fn insert(&self, insert: &sqlparser::ast::Insert) -> Result<Form, PlanError> {
        let column = &self.table.column;
        let position = self.insert_position(insert);
        self.check_duplicate_update(insert)?;
        let no_column =
            || PlanError::Refuse(format!("a row without the partition column `{column}`"));
        let edits = self.edits(Some(Naming::Renamed))?;
        let others = self.others > 0;
        if !insert.assignments.is_empty() {
            let value = self.assigned_value(insert).ok_or_else(no_column)?;
            let row = Row {
                at: 0..0,
                key: self.bound(value)?,
                params: 0..0,
            };
            let ids = self.auto_assigned(insert).and_then(|e| self.given_id(e));
            return Ok(Form::Rows(Rows {
                edits,
                span: None,
                rows: vec![row],
                others,
                ids: ids.into_iter().collect(),
            }));
        }
        let source = insert.source.as_ref().ok_or_else(no_column)?;
        let position = position.ok_or_else(no_column)?;
        let values = match source.body.as_ref() {
            SetExpr::Values(values) => values,
            SetExpr::Select(select) => {
                return self.insert_select(select, position).map(Form::Fixed)
            }
            _ => return Err("INSERT ... SELECT with UNION into a partitioned table".into()),
        };
        let auto = self.auto_index(insert);
        let ids = values
            .rows
            .iter()
            .filter_map(|row| row.content.get(auto?).and_then(|e| self.given_id(e)))
            .collect();
        let mut rows = Vec::with_capacity(values.rows.len());
        for row in &values.rows {
            let value = row.content.get(position).ok_or_else(no_column)?;
            let span = Span::new(row.opening_token.0.span.start, row.closing_token.0.span.end);
            let at = self
                .offsets
                .range(span)
                .ok_or("a row hscale cannot find in the text")?;
            rows.push(Row {
                key: self.bound(value)?,
                params: self.params_within(&at),
                at,
            });
        }
        let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
            return Err(no_column());
        };
        let span = Some(first.at.start..last.at.end);
        Ok(Form::Rows(Rows {
            edits,
            span,
            rows,
            others,
            ids,
        }))
    }

    /// INSERT INTO users SELECT ...: every row goes to one partition when the
    /// SELECT gives the partition column as a literal; the SELECT's tables
    /// (not partitioned) must live on that partition's backend.
    fn insert_select(&self, select: &Select, position: usize) -> Result<Route, PlanError> {
        let column = &self.table.column;
        let value = match select.projection.get(position) {
            Some(SelectItem::UnnamedExpr(expr) | SelectItem::ExprWithAlias { expr, .. }) => expr,
            _ => {
                return Err(PlanError::Refuse(format!(
                    "INSERT ... SELECT into a partitioned table whose partition column `{column}` is not a literal of the SELECT"
                )))
            }
        };
        let target = self.literal_target(value).map_err(|_| {
            PlanError::Refuse(format!("INSERT ... SELECT into a partitioned table whose partition column `{column}` is not a literal of the SELECT"))
        })?;
        let edits = self.edits(Some(Naming::Renamed))?;
        let sql = apply_edits(self.sql, &edits, &target, &mut Splices::default(), bytes)?;
        check_others(self.others > 0, [&target], self.ctx.main_backend)?;
        Ok(Route {
            table: Arc::new(self.table.table.clone()),
            steps: smallvec::smallvec![Step { target, sql }],
            merge: Merge::Single,
            writes: true,
            highest_id: None,
        })
    }

    /// The alias of a reference to a partitioned table, which must be a
    /// table of the statement's own FROM (not of a subquery).
    fn top_level_alias(
        &self,
        from: &[TableWithJoins],
        reference: &ObjectName,
    ) -> Result<Option<Ident>, PlanError> {
        let factors = from
            .iter()
            .flat_map(|t| std::iter::once(&t.relation).chain(t.joins.iter().map(|j| &j.relation)));
        for factor in factors {
            if let TableFactor::Table { name, alias, .. } = factor {
                if same_name(name, reference) {
                    return Ok(alias.as_ref().map(|a| a.name.clone()));
                }
            }
        }
        Err("a partitioned table inside a subquery".into())
    }

    fn literal_target(&self, expr: &Expr) -> Result<Target, PlanError> {
        let column = &self.table.column;
        let value = literal(expr).ok_or_else(|| {
            PlanError::Refuse(format!(
                "the partition column `{column}` must be given as a literal"
            ))
        })?;
        self.table.target_for(&value).map_err(|e| {
            PlanError::Refuse(format!("the value of partition column `{column}`: {e}"))
        })
    }

    /// The smallest set of literals a top-level conjunct fixes the column to.
    fn fixed_keys(
        &self,
        selection: &Expr,
        owners: &[Owner],
    ) -> Option<Vec<(Bound, Key<Range<usize>>)>> {
        // The tables' partition columns are equated: a value of any one of
        // them picks the partitions of all.
        let is_column = |expr: &Expr| column_owner(expr, owners).is_some();
        let mut best: Option<Vec<(Bound, Key<Range<usize>>)>> = None;
        for conjunct in conjuncts(selection) {
            let values = match conjunct {
                Expr::BinaryOp {
                    left,
                    op: BinaryOperator::Eq,
                    right,
                } => {
                    let value = match (is_column(left), is_column(right)) {
                        (true, _) => self.literal_key(right),
                        (_, true) => self.literal_key(left),
                        _ => None,
                    };
                    value.map(|v| vec![v])
                }
                Expr::InList {
                    expr,
                    list,
                    negated: false,
                } if is_column(expr) => list.iter().map(|e| self.literal_key(e)).collect(),
                // A range: its partitions when the values between its ends
                // can be listed (`PartitionedTable::targets_between`).
                Expr::Between {
                    expr,
                    negated: false,
                    low,
                    high,
                } if is_column(expr) => [(low, RangeEnd::Low), (high, RangeEnd::High)]
                    .into_iter()
                    .map(|(e, end)| {
                        let (bound, key) = self.literal_key(e)?;
                        Some((
                            bound,
                            Key {
                                end: Some(end),
                                ..key
                            },
                        ))
                    })
                    .collect(),
                _ => None,
            };
            if let Some(values) = values {
                if best.as_ref().is_none_or(|b| values.len() < b.len()) {
                    best = Some(values);
                }
            }
        }
        best
    }

    /// Whether a column reference (`col`, `t.col`, `db.t.col`) is the partition
    /// column of the routed table.
    fn names_column(&self, name: &ObjectName, alias: Option<&Ident>) -> bool {
        self.names(name, &self.table.column, alias)
    }

    /// How a SELECT or UPDATE names a partition table the client wrote
    /// without an alias.
    fn unaliased_naming(&self) -> Naming {
        match self.ctx.tables_locked {
            true => Naming::Renamed,
            false => Naming::Aliased,
        }
    }

    /// Whether `name` is the routed table's column `column`.
    fn names(&self, name: &ObjectName, column: &str, alias: Option<&Ident>) -> bool {
        let parts: Vec<&Ident> = name.0.iter().filter_map(ObjectNamePart::as_ident).collect();
        names_column(&parts, self.table, column, alias)
    }

    /// Where the physical table goes in for the routed table, and where no
    /// alias can stand in for it, for the qualifiers that name it.
    pub(crate) fn edits(
        &self,
        naming: Option<Naming>,
    ) -> Result<Vec<Edit<Range<usize>>>, PlanError> {
        self.edits_of(&self.owner(None, naming))
    }

    /// `edits` for one reference to a partitioned table, in text order.
    fn edits_of(&self, owner: &Owner) -> Result<Vec<Edit<Range<usize>>>, PlanError> {
        let naming = owner.naming;
        let lost = || PlanError::refuse("a table name hscale cannot find in the text");
        let parts: Vec<&Ident> = owner
            .reference
            .0
            .iter()
            .filter_map(ObjectNamePart::as_ident)
            .collect();
        let (Some(first), Some(last)) = (parts.first(), parts.last()) else {
            return Err("an unnamed table".into());
        };
        let range = self
            .offsets
            .range(Span::new(first.span.start, last.span.end))
            .ok_or_else(lost)?;
        let before = match parts.len() {
            2 => self.sql[range.start..self.offsets.byte(last.span.start).ok_or_else(lost)?]
                .to_string(),
            _ => String::new(),
        };
        let table = &owner.table.table;
        let after = match naming {
            Some(Naming::Aliased) => format!(" AS {}", quote_identifier(&table.name)),
            _ => String::new(),
        };
        let text = match owner.co_located {
            false => EditText::Physical { before, after },
            true => EditText::CoLocated {
                table: Arc::new(table.clone()),
                default: Arc::from(owner.table.default_table.as_str()),
                before,
                after,
            },
        };
        let mut edits = vec![Edit { at: range, text }];
        let mut failed = false;
        let _ = visit_expressions(self.statement, |expr: &Expr| {
            if let Expr::CompoundIdentifier(idents) = expr {
                match self.qualifier_edit(idents, table, naming) {
                    Ok(Some(edit)) => edits.push(edit),
                    Ok(None) => {}
                    Err(()) => failed = true,
                }
            }
            ControlFlow::<()>::Continue(())
        });
        // apply_edits writes them in one pass, in text order.
        edits.sort_by_key(|e| e.at.start);
        match failed {
            true => Err("a qualified column hscale cannot find in the text".into()),
            false => Ok(edits),
        }
    }

    fn qualifier_edit(
        &self,
        idents: &[Ident],
        table: &TableName,
        naming: Option<Naming>,
    ) -> Result<Option<Edit<Range<usize>>>, ()> {
        let edit = match (idents, naming) {
            // db.users.col: an alias cannot be qualified by a database.
            ([db, t, _], Some(naming)) if db.value == table.db && t.value == table.name => Edit {
                at: self
                    .offsets
                    .range(Span::new(db.span.start, t.span.end))
                    .ok_or(())?,
                text: match naming {
                    Naming::Aliased => EditText::Fixed(quote_identifier(&table.name)),
                    Naming::Renamed => EditText::Physical {
                        before: format!("{}.", quote_identifier(&table.db)),
                        after: String::new(),
                    },
                },
            },
            ([t, _], Some(Naming::Renamed)) if t.value == table.name => Edit {
                at: self.offsets.range(t.span).ok_or(())?,
                text: EditText::Physical {
                    before: String::new(),
                    after: String::new(),
                },
            },
            _ => return Ok(None),
        };
        Ok(Some(edit))
    }

    /// A literal or a parameter and where it stands (a range no token starts
    /// at when its place is unknown: the shape is then not cached).
    fn literal_key(&self, expr: &Expr) -> Option<(Bound, Key<Range<usize>>)> {
        if let Some((param, at)) = self.placeholder(expr) {
            return Some((
                Bound::Param(param),
                Key {
                    at,
                    negative: false,
                    end: None,
                },
            ));
        }
        let value = literal(expr)?;
        let (inner, negative) = match strip_nesting(expr) {
            Expr::UnaryOp {
                op: UnaryOperator::Minus,
                expr,
            } => (strip_nesting(expr), true),
            other => (other, false),
        };
        let at = match inner {
            Expr::Value(v) => self.offsets.range(v.span).unwrap_or(0..0),
            _ => 0..0,
        };
        Some((
            Bound::Literal(value),
            Key {
                at,
                negative,
                end: None,
            },
        ))
    }

    /// The index of a `?` of a statement being prepared, and its bytes.
    fn placeholder(&self, expr: &Expr) -> Option<(usize, Range<usize>)> {
        let Expr::Value(v) = strip_nesting(expr) else {
            return None;
        };
        if !matches!(v.value, sqlparser::ast::Value::Placeholder(_)) {
            return None;
        }
        let at = self.offsets.range(v.span)?;
        let index = self.params.binary_search(&at.start).ok()?;
        Some((index, at))
    }

    /// An id given for an AUTO_INCREMENT column, which the sequence moves
    /// past: a positive number, or a parameter (read at each execution).
    fn given_id(&self, expr: &Expr) -> Option<Bound> {
        if let Some((param, _)) = self.placeholder(expr) {
            return Some(Bound::Param(param));
        }
        match self.id_value(expr) {
            Ok(Some(IdValue::Given(id))) => {
                Some(Bound::Literal(Value::Number(id.to_string().into())))
            }
            _ => None,
        }
    }

    /// What a row gives its table's AUTO_INCREMENT column: `None` for a
    /// parameter, known only at each execution.
    fn id_value(&self, expr: &Expr) -> Result<Option<IdValue>, PlanError> {
        if self.placeholder(expr).is_some() {
            return Ok(None);
        }
        let default = matches!(strip_nesting(expr), Expr::Identifier(word)
            if word.quote_style.is_none() && word.value.eq_ignore_ascii_case("DEFAULT"));
        if default {
            return Ok(Some(IdValue::Generated));
        }
        literal(expr)
            .and_then(|value| id_value(&value, self.ctx.no_auto_value_on_zero))
            .map(Some)
            .ok_or_else(|| {
                not_an_id(
                    self.table
                        .auto_column
                        .as_ref()
                        .map_or("", |a| a.name.as_str()),
                )
            })
    }

    /// Where a literal or DEFAULT stands in the text, with its signs: a sign
    /// is not within its operand's span, and `-0` replaced by 7 must not
    /// read `-7`. `None` for a sign before parentheses.
    fn value_range(&self, expr: &Expr) -> Option<Range<usize>> {
        match expr {
            Expr::Nested(inner) => self.value_range(inner),
            Expr::Value(v) => self.offsets.range(v.span),
            Expr::Identifier(word) => self.offsets.range(word.span),
            Expr::UnaryOp {
                op: UnaryOperator::Minus | UnaryOperator::Plus,
                expr,
            } => {
                let at = self.value_range(expr)?;
                let before = self.sql[..at.start].trim_end();
                before
                    .ends_with(['-', '+'])
                    .then(|| before.len() - 1..at.end)
            }
            _ => None,
        }
    }

    /// The partition column's value in a row: a literal or a parameter.
    fn bound(&self, expr: &Expr) -> Result<Bound, PlanError> {
        self.literal_key(expr)
            .map(|(bound, _)| bound)
            .ok_or_else(|| {
                PlanError::Refuse(format!(
                    "the partition column `{}` must be given as a literal",
                    self.table.column
                ))
            })
    }

    /// The parameters whose `?` stands within `range`.
    pub(crate) fn params_within(&self, range: &Range<usize>) -> Range<usize> {
        let start = self.params.partition_point(|&p| p < range.start);
        let end = self.params.partition_point(|&p| p < range.end);
        start..end
    }
}

/// Whether a column reference's parts (`col`, `t.col`, `db.t.col`) name
/// `column` of `table`, known in the statement as `alias`.
fn names_column(
    parts: &[&Ident],
    table: &PartitionedTable,
    column: &str,
    alias: Option<&Ident>,
) -> bool {
    let Some((last, qualifier)) = parts.split_last() else {
        return false;
    };
    let name = &table.table;
    last.value.eq_ignore_ascii_case(column)
        && match (qualifier, alias) {
            ([], _) => true,
            ([q], Some(alias)) => q.value == alias.value,
            ([q], None) => q.value == name.name,
            ([db, q], None) => db.value == name.db && q.value == name.name,
            _ => false,
        }
}

/// Which reference's partition column an expression is. An unqualified
/// name belongs to a reference only if no other's partition column has it.
/// The two sides of an `a = b`.
fn equality_sides(expr: &Expr) -> Option<(&Expr, &Expr)> {
    match expr {
        Expr::BinaryOp {
            left,
            op: BinaryOperator::Eq,
            right,
        } => Some((left.as_ref(), right.as_ref())),
        _ => None,
    }
}

fn column_owner(expr: &Expr, owners: &[Owner]) -> Option<usize> {
    let parts: Vec<&Ident> = match strip_nesting(expr) {
        Expr::Identifier(ident) => vec![ident],
        Expr::CompoundIdentifier(idents) => idents.iter().collect(),
        _ => return None,
    };
    let mut found = owners
        .iter()
        .enumerate()
        .filter(|(_, o)| names_column(&parts, o.table, &o.table.column, o.alias.as_ref()))
        .map(|(i, _)| i);
    match (found.next(), found.next()) {
        (Some(i), None) => Some(i),
        _ => None,
    }
}

/// Whether `side` of an equality in subquery `inner` of `outer` names one
/// table's column as MariaDB resolves it: qualified; or unqualified, where
/// hscale knows the columns of every table it could name — the
/// subquery's own FROM first, then the statement's — and the column is
/// the partition column `column_owner` takes it for. Not where a subquery
/// nests in another (a scope between them is not followed).
fn names_one_table(
    side: &Expr,
    inner: &Select,
    outer: &Select,
    owners: &[Owner],
    nested: bool,
) -> bool {
    let ident = match strip_nesting(side) {
        Expr::CompoundIdentifier(_) => return true,
        Expr::Identifier(ident) if !nested => ident,
        _ => return false,
    };
    let Some(owner) = column_owner(side, owners) else {
        return false;
    };
    // The owners of a FROM that have the column; None where a table of it
    // is not partitioned or its columns are not known.
    let having = |from: &[TableWithJoins]| -> Option<Vec<usize>> {
        let factors = from
            .iter()
            .flat_map(|t| std::iter::once(&t.relation).chain(t.joins.iter().map(|j| &j.relation)));
        let mut found = Vec::new();
        for factor in factors {
            let TableFactor::Table { name, .. } = factor else {
                return None;
            };
            let i = owners.iter().position(|o| same_name(o.reference, name))?;
            if owners[i].table.has_column(&ident.value)? {
                found.push(i);
            }
        }
        Some(found)
    };
    let resolved = match having(&inner.from) {
        Some(found) if !found.is_empty() => found,
        Some(_) => match having(&outer.from) {
            Some(found) => found,
            None => return false,
        },
        None => return false,
    };
    resolved == [owner]
}

/// The byte range of each item of the statement's select list (the first
/// SELECT's), from its first token to its last, as MariaDB names an item
/// without an alias; None where the statement does not begin with it.
fn select_items(sql: &str, quoting: crate::lexer::Quoting) -> Option<Vec<Range<usize>>> {
    use crate::lexer::{TokenKind, Tokens};
    const MODIFIERS: [&str; 10] = [
        "all",
        "distinct",
        "distinctrow",
        "high_priority",
        "straight_join",
        "sql_small_result",
        "sql_big_result",
        "sql_buffer_result",
        "sql_cache",
        "sql_no_cache",
    ];
    let bytes = sql.as_bytes();
    let mut tokens = Tokens::new(bytes, quoting).peekable();
    let word = |t: &crate::lexer::Token, w: &str| {
        t.kind == TokenKind::Word && bytes[t.start..t.end].eq_ignore_ascii_case(w.as_bytes())
    };
    if !word(&tokens.next()?, "select") {
        return None;
    }
    while tokens
        .peek()
        .is_some_and(|t| MODIFIERS.iter().any(|m| word(t, m)) || word(t, "sql_calc_found_rows"))
    {
        tokens.next();
    }
    let (mut items, mut depth, mut item): (Vec<Range<usize>>, usize, Option<Range<usize>>) =
        (Vec::new(), 0, None);
    for token in tokens {
        match token.kind {
            TokenKind::Symbol(b'(') => depth += 1,
            TokenKind::Symbol(b')') => depth = depth.checked_sub(1)?,
            TokenKind::Symbol(b',') if depth == 0 => {
                items.push(item.take()?);
                continue;
            }
            TokenKind::Symbol(b';') if depth == 0 => break,
            TokenKind::Word if depth == 0 && (word(&token, "from") || word(&token, "into")) => {
                break
            }
            _ => {}
        }
        let start = item.as_ref().map_or(token.start, |i| i.start);
        item = Some(start..token.end);
    }
    items.push(item?);
    Some(items)
}

/// The plain SELECTs of the subqueries in `select`'s WHERE and select list,
/// and in theirs, at any depth (EXISTS, IN, scalar).
fn subqueries_of(select: &Select) -> Vec<Select> {
    let mut found = Vec::new();
    let mut visit = |expr: &Expr| {
        let query = match expr {
            Expr::Exists { subquery, .. } | Expr::InSubquery { subquery, .. } => subquery,
            Expr::Subquery(query) => query,
            _ => return ControlFlow::<()>::Continue(()),
        };
        // Copied: the visitor lends each expression for its call alone.
        if let SetExpr::Select(inner) = query.body.as_ref() {
            found.push(inner.as_ref().clone());
        }
        ControlFlow::Continue(())
    };
    let _ = visit_expressions(&select.selection, &mut visit);
    let _ = visit_expressions(&select.projection, &mut visit);
    found
}

/// Whether an expression has a subquery in it.
pub(crate) fn has_subquery(expr: &Expr) -> bool {
    visit_expressions(expr, |e: &Expr| match e {
        Expr::Subquery(_) | Expr::Exists { .. } | Expr::InSubquery { .. } => ControlFlow::Break(()),
        _ => ControlFlow::Continue(()),
    })
    .is_break()
}

/// The constraint of a join MariaDB writes with ON.
fn join_constraint(operator: &JoinOperator) -> Option<&JoinConstraint> {
    match operator {
        JoinOperator::Join(c)
        | JoinOperator::Inner(c)
        | JoinOperator::Left(c)
        | JoinOperator::LeftOuter(c)
        | JoinOperator::Right(c)
        | JoinOperator::RightOuter(c)
        | JoinOperator::CrossJoin(c)
        | JoinOperator::StraightJoin(c) => Some(c),
        _ => None,
    }
}

fn last_ident(name: &ObjectName) -> Option<&Ident> {
    name.0.last().and_then(ObjectNamePart::as_ident)
}

pub(crate) fn conjuncts(expr: &Expr) -> Vec<&Expr> {
    match strip_nesting(expr) {
        Expr::BinaryOp {
            left,
            op: BinaryOperator::And,
            right,
        } => {
            let mut all = conjuncts(left);
            all.extend(conjuncts(right));
            all
        }
        other => vec![other],
    }
}

pub(crate) fn strip_nesting(expr: &Expr) -> &Expr {
    match expr {
        Expr::Nested(inner) => strip_nesting(inner),
        other => other,
    }
}

/// A literal's value, as the client wrote it.
fn literal(expr: &Expr) -> Option<Value<'static>> {
    match strip_nesting(expr) {
        Expr::Value(v) => match &v.value {
            Literal::Number(n, _) => Some(Value::Number(n.clone().into())),
            Literal::SingleQuotedString(s) | Literal::DoubleQuotedString(s) => {
                Some(Value::String(s.clone().into()))
            }
            Literal::Boolean(b) => Some(Value::Number(u8::from(*b).to_string().into())),
            Literal::Null => Some(Value::Null),
            _ => None,
        },
        Expr::UnaryOp {
            op: UnaryOperator::Minus,
            expr,
        } => match literal(expr)? {
            Value::Number(n) => Some(Value::Number(format!("-{n}").into())),
            _ => None,
        },
        Expr::UnaryOp {
            op: UnaryOperator::Plus,
            expr,
        } => literal(expr),
        _ => None,
    }
}

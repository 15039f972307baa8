//! A SELECT over several partitions: how their rows merge into the answer
//! one table would give (`hscale_merge::Spec`), and what each partition's
//! statement sends along for it. Every ORDER BY or group key travels after
//! the client's columns with its `WEIGHT_STRING` and `COLLATION`; MIN and MAX
//! carry the same of their result, AVG its SUM and COUNT. Each partition
//! returns at most LIMIT + OFFSET rows, sorted by the keys, so the merge
//! streams: one row per partition, one group at a time.

use std::ops::{ControlFlow, Range};
use std::sync::Arc;

use hscale_merge::{
    hidden_name, Arithmetic, Calc, Combine, CompareOp, Having, Place, Reorder, SortKey, Spec,
};
use sqlparser::ast::{
    visit_expressions, BinaryOperator, Distinct, DuplicateTreatment, Expr, FunctionArg,
    FunctionArgExpr, FunctionArguments, GroupByExpr, LimitClause, ObjectName, OrderBy, OrderByExpr,
    OrderByKind, OrderBySort, Query, Select, SelectItem, SetExpr, Spanned, TableFactor,
    UnaryOperator, Value as Literal, Visit, Visitor,
};

use sqlparser::dialect::MySqlDialect;
use sqlparser::parser::Parser;

use crate::error::PlanError;
use crate::lexer::{Summary, TokenKind, Tokens};
use crate::route::Analysis;
use crate::shape::{Edit, EditText};

/// Aggregate functions: their results over several partitions need a merge.
const AGGREGATES: &[&str] = &[
    "count",
    "sum",
    "min",
    "max",
    "avg",
    "group_concat",
    "std",
    "stddev",
    "stddev_pop",
    "stddev_samp",
    "variance",
    "var_pop",
    "var_samp",
    "bit_and",
    "bit_or",
    "bit_xor",
    "json_arrayagg",
    "json_objectagg",
];

/// An edit at a byte range of the statement.
type ByteEdit = Edit<Range<usize>>;

/// The columns hscale adds after the client's, and their positions.
#[derive(Default)]
struct Hidden {
    text: String,
    count: usize,
}

impl Hidden {
    /// Adds a column; its position among the hidden ones.
    fn add(&mut self, expr: &str) -> usize {
        self.text
            .push_str(&format!(", {expr} AS {}", hidden_name(self.count)));
        self.count += 1;
        self.count - 1
    }

    /// An ORDER BY or group key: its value (the client's column `selected`
    /// when it is one, else a copy), weight and collation.
    fn key(&mut self, text: &str, selected: Option<usize>, descending: bool) -> SortKey {
        SortKey {
            value: match selected {
                Some(i) => Place::Visible(i),
                None => Place::Hidden(self.add(&format!("({text})"))),
            },
            weight: self.add(&format!("WEIGHT_STRING(({text}))")),
            collation: self.add(&format!("COLLATION(({text}))")),
            descending,
        }
    }
}

/// How far before its span an expression's text is looked for.
const MAX_TOKENS_BACK: usize = 16;

impl Analysis<'_> {
    /// The merge of a SELECT's partitions and the edits each partition's
    /// statement gets; `Err`: what hscale cannot merge exactly.
    pub(crate) fn scan_merge(
        &self,
        query: &Query,
        select: &Select,
        summary: &Summary,
    ) -> Result<(Spec, Vec<ByteEdit>), PlanError> {
        if query.fetch.is_some() {
            return Err("FETCH".into());
        }
        if select.into.is_some() {
            return Err("SELECT ... INTO".into());
        }
        if summary.found_rows {
            return Err("SQL_CALC_FOUND_ROWS".into());
        }
        let lost = || PlanError::refuse("a clause hscale cannot find in the text");
        let mut spec = Spec::default();
        let mut hidden = Hidden::default();
        let mut edits = Vec::new();
        let (mut calcs, mut parts) = (Vec::new(), Vec::new());
        let combines = self.combines(select, &mut hidden, &mut calcs, &mut parts)?;
        let distinct = match &select.distinct {
            None | Some(Distinct::All) => false,
            Some(Distinct::Distinct) => true,
            Some(_) => return Err("DISTINCT ON".into()),
        };
        let group_by = match &select.group_by {
            GroupByExpr::Expressions(exprs, modifiers) if modifiers.is_empty() => exprs.as_slice(),
            _ => return Err("GROUP BY ALL or WITH ROLLUP".into()),
        };
        let aggregates = combines.iter().any(|c| *c != Combine::First);
        if distinct && aggregates {
            return Err("DISTINCT with aggregates".into());
        }
        let group_by_texts: Vec<String> = group_by
            .iter()
            .map(|e| self.key_text(e, select))
            .collect::<Result<_, _>>()?;
        // The keys whose equal values make one group, as text.
        let distinct_keys: Vec<String> = match distinct {
            false => Vec::new(),
            true => select
                .projection
                .iter()
                .map(|item| match item {
                    SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => {
                        self.text_of(e)
                    }
                    _ => Err("DISTINCT *".into()),
                })
                .collect::<Result<_, _>>()?,
        };
        let same = |a: &str, b: &str| normalized(a) == normalized(b);
        // DISTINCT over the groups of a GROUP BY: the same rows where it
        // lists the group keys (each group is one row already); over other
        // columns it would fold groups together after the merge.
        let distinct = match (distinct, group_by_texts.is_empty()) {
            (true, false) => {
                let covered = |keys: &[String], by: &[String]| {
                    keys.iter().all(|k| by.iter().any(|b| same(k, b)))
                };
                match covered(&distinct_keys, &group_by_texts)
                    && covered(&group_by_texts, &distinct_keys)
                {
                    true => false,
                    false => return Err("DISTINCT over a GROUP BY of other columns".into()),
                }
            }
            (distinct, _) => distinct,
        };
        let group_keys = match distinct {
            true => distinct_keys,
            false => group_by_texts,
        };
        let grouped = distinct || aggregates || !group_keys.is_empty();
        if grouped && combines.len() < select.projection.len() {
            return Err("* with GROUP BY or aggregates".into());
        }
        // A key that is a selected column is read there rather than sent
        // twice (not past a `*`, which hides where columns are).
        let wildcard = select.projection.iter().any(|item| {
            !matches!(
                item,
                SelectItem::UnnamedExpr(_) | SelectItem::ExprWithAlias { .. }
            )
        });
        let selected = |text: &str| match wildcard {
            true => None,
            false => self.selected_expression(text, select),
        };
        let order = match &query.order_by {
            None => &[][..],
            Some(OrderBy {
                kind: OrderByKind::Expressions(exprs),
                interpolate: None,
            }) => exprs.as_slice(),
            Some(_) => return Err("this ORDER BY".into()),
        };
        let mut order_keys = Vec::new();
        for key in order {
            if key.options.nulls_first.is_some()
                || key.with_fill.is_some()
                || matches!(key.options.sort, Some(OrderBySort::Using(_)))
            {
                return Err("ORDER BY ... NULLS or WITH FILL".into());
            }
            order_keys.push((self.key_text(&key.expr, select)?, descending(key)));
        }
        // A group key read from the select list: DISTINCT's are its columns,
        // by position (a literal, an alias that names a column too).
        let group_selected = |i: usize, text: &str| match distinct {
            true => Some(i),
            false => selected(text),
        };
        if grouped && !group_keys.is_empty() {
            // What goes after the partition's WHERE: DISTINCT becomes GROUP BY
            // its columns, since the columns hscale adds would make rows
            // distinct that the client's columns do not (`'a'` and `'a '`
            // differ in weight); without an ORDER BY, the group keys' order.
            // By position: the text of a literal (`GROUP BY 56`) or of an
            // alias would read as something else there.
            let mut clauses = String::new();
            if distinct {
                let word = self.top_level_word(0, &["distinct"]).ok_or_else(lost)?;
                edits.push(Edit {
                    at: word,
                    text: EditText::Fixed(String::new()),
                });
                let positions: Vec<String> =
                    (1..=group_keys.len()).map(|p| p.to_string()).collect();
                clauses.push_str(&format!(" GROUP BY {}", positions.join(", ")));
            }
            match order_keys.is_empty() {
                // Each partition sorts by the group keys, so that one group's
                // rows meet in the merge.
                true => {
                    for (i, text) in group_keys.iter().enumerate() {
                        spec.keys
                            .push(hidden.key(text, group_selected(i, text), false));
                    }
                    clauses.push_str(&order_by_keys(&spec.keys));
                }
                false => {
                    let covers = order_keys.len() == group_keys.len()
                        && group_keys
                            .iter()
                            .all(|g| order_keys.iter().any(|(o, _)| same(g, o)));
                    match covers {
                        true => {
                            for (text, descending) in &order_keys {
                                let at = group_keys.iter().position(|g| same(g, text));
                                let place = match at {
                                    Some(i) => group_selected(i, text),
                                    None => selected(text),
                                };
                                spec.keys.push(hidden.key(text, place, *descending));
                            }
                        }
                        // ORDER BY an aggregate: the partitions sort by the
                        // group keys, so that groups meet, and hscale sorts
                        // the combined groups, keeping LIMIT + OFFSET of them
                        // (all, without a LIMIT: past its memory budget, in
                        // temporary files).
                        false => {
                            for (text, descending) in &order_keys {
                                let column = self.select_column(text, select).ok_or_else(|| {
                                    PlanError::Refuse(format!(
                                        "ORDER BY `{text}`, which the select list does not have"
                                    ))
                                })?;
                                spec.reorder.push(Reorder {
                                    column,
                                    descending: *descending,
                                    group_key: group_keys.iter().position(|g| same(g, text)),
                                });
                            }
                            for (i, text) in group_keys.iter().enumerate() {
                                spec.keys
                                    .push(hidden.key(text, group_selected(i, text), false));
                            }
                            clauses.push_str(&order_by_keys(&spec.keys));
                            // The client's ORDER BY is hscale's to apply.
                            let order = self.top_level_word(0, &["order"]).ok_or_else(lost)?;
                            let end = self
                                .top_level_word(order.end, &["limit", "for", "lock", "into"])
                                .map_or(self.sql.len(), |w| w.start);
                            edits.push(Edit {
                                at: order.start..end,
                                text: EditText::Fixed(String::new()),
                            });
                        }
                    }
                }
            }
            if !clauses.is_empty() {
                let (at, before_clause) = self.end_of_clauses().ok_or_else(lost)?;
                let text = match before_clause {
                    true => format!("{} ", clauses.trim_start()),
                    false => clauses,
                };
                edits.push(Edit {
                    at: at..at,
                    text: EditText::Fixed(text),
                });
            }
        } else if !grouped {
            for (text, descending) in &order_keys {
                spec.keys
                    .push(hidden.key(text, selected(text), *descending));
            }
        }
        // Aggregates without GROUP BY: one row, whatever its ORDER BY.
        if let Some(having) = &select.having {
            if !grouped {
                return Err("HAVING without GROUP BY or aggregates".into());
            }
            spec.having = Some(Box::new(self.having(having, select)?));
            // Each partition's groups are partial: HAVING applies after the
            // merge, and so must LIMIT (see below).
            let start = self.top_level_word(0, &["having"]).ok_or_else(lost)?.start;
            let (end, _) = self.end_of_clauses().ok_or_else(lost)?;
            edits.push(Edit {
                at: start..end,
                text: EditText::Fixed(String::new()),
            });
        }
        if let Some(clause) = &query.limit_clause {
            let (mut edit, offset, limit) = self.raised_limit(clause)?;
            spec.offset = offset;
            spec.limit = Some(limit);
            // Groups that HAVING drops or hscale sorts again: every group.
            if spec.having.is_some() || !spec.reorder.is_empty() {
                edit.text = EditText::Fixed(String::new());
            }
            edits.push(edit);
        }
        if hidden.count > 0 {
            let from = self.top_level_word(0, &["from"]).ok_or_else(lost)?;
            edits.push(Edit {
                at: from,
                text: EditText::Fixed(format!("{} FROM", hidden.text)),
            });
        }
        spec.hidden = hidden.count;
        spec.groups = grouped.then(|| {
            let mut all = combines;
            // The aggregates expressions read combine as columns of their own.
            if !parts.is_empty() {
                let visible = all.len();
                all.resize(visible + hidden.count, Combine::First);
                for (at, combine) in parts {
                    all[visible + at] = combine;
                }
            }
            all
        });
        spec.calcs = calcs;
        Ok((spec, edits))
    }

    /// How each select item combines over a group: an aggregate by its
    /// function, anything else by its first row. Expressions over aggregates
    /// are refused.
    /// How each select item combines; an expression over aggregates reads
    /// hidden aggregate columns (`parts`: position among the hidden ones and
    /// how it combines) through `calcs`.
    fn combines(
        &self,
        select: &Select,
        hidden: &mut Hidden,
        calcs: &mut Vec<Calc>,
        parts: &mut Vec<(usize, Combine)>,
    ) -> Result<Vec<Combine>, PlanError> {
        let mut combines = Vec::new();
        for item in &select.projection {
            let expr = match item {
                SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => e,
                _ => continue,
            };
            if let Some(combine) = self.aggregate(expr, hidden)? {
                combines.push(combine);
                continue;
            }
            match nested_aggregate(expr, &|name| self.columns_of(name)) {
                Some(name) if name == "window" => {
                    return Err("a window function".into());
                }
                Some(_) => {
                    calcs.push(self.calc(expr, hidden, parts, true)?);
                    combines.push(Combine::Calc(calcs.len() - 1));
                }
                None => combines.push(Combine::First),
            }
        }
        Ok(combines)
    }

    /// An expression over aggregates, computed by hscale from hidden
    /// columns: each aggregate in it, and each part without one (a value
    /// the group shares), is sent along. `outermost`: a division is allowed
    /// there only, where the column's scale says how MariaDB rounds it.
    fn calc(
        &self,
        expr: &Expr,
        hidden: &mut Hidden,
        parts: &mut Vec<(usize, Combine)>,
        outermost: bool,
    ) -> Result<Calc, PlanError> {
        let mut part = |combine, hidden: &mut Hidden| -> Result<Calc, PlanError> {
            let at = hidden.add(&format!("({})", self.text_of(expr)?));
            parts.push((at, combine));
            Ok(Calc::Hidden(at))
        };
        if let Expr::Value(value) = expr {
            if let Literal::Number(number, _) = &value.value {
                return Ok(Calc::Literal(number.clone()));
            }
        }
        if nested_aggregate(expr, &|name| self.columns_of(name)).is_none() {
            return part(Combine::First, hidden);
        }
        match expr {
            Expr::Nested(inner) => self.calc(inner, hidden, parts, outermost),
            Expr::UnaryOp {
                op: UnaryOperator::Minus,
                expr,
            } => Ok(Calc::Negate(Box::new(
                self.calc(expr, hidden, parts, false)?,
            ))),
            Expr::UnaryOp {
                op: UnaryOperator::Plus,
                expr,
            } => self.calc(expr, hidden, parts, outermost),
            Expr::BinaryOp { left, op, right } => {
                let arithmetic = match op {
                    BinaryOperator::Plus => Arithmetic::Add,
                    BinaryOperator::Minus => Arithmetic::Subtract,
                    BinaryOperator::Multiply => Arithmetic::Multiply,
                    BinaryOperator::Divide if outermost => Arithmetic::Divide,
                    BinaryOperator::Divide => {
                        return Err(
                            "a division inside an expression over aggregates (MariaDB rounds it at a scale only the outermost column shows)"
                                .into(),
                        )
                    }
                    other => return Err(PlanError::Refuse(format!("`{other}` over aggregates"))),
                };
                let left = self.calc(left, hidden, parts, false)?;
                let right = self.calc(right, hidden, parts, false)?;
                Ok(Calc::Binary(Box::new(left), arithmetic, Box::new(right)))
            }
            Expr::Function(f) => match self.aggregate(expr, hidden)? {
                Some(Combine::Avg { .. }) => {
                    Err("AVG() inside an expression over aggregates".into())
                }
                Some(combine) => part(combine, hidden),
                None => Err(PlanError::Refuse(format!("{}() of aggregates", f.name))),
            },
            _ => Err("this expression over aggregates".into()),
        }
    }

    /// COUNT, SUM, MIN, MAX or AVG of one argument, as a whole select item.
    fn aggregate(&self, expr: &Expr, hidden: &mut Hidden) -> Result<Option<Combine>, PlanError> {
        let Expr::Function(f) = expr else {
            return Ok(None);
        };
        let name = f.name.to_string().to_ascii_lowercase();
        if !AGGREGATES.contains(&name.as_str()) {
            return Ok(None);
        }
        if f.over.is_some() || f.filter.is_some() || !f.within_group.is_empty() {
            return Err(PlanError::Refuse(format!(
                "{name}() with OVER, FILTER or WITHIN GROUP"
            )));
        }
        let FunctionArguments::List(list) = &f.args else {
            return Err(PlanError::Refuse(format!("{name}() without arguments")));
        };
        if matches!(list.duplicate_treatment, Some(DuplicateTreatment::Distinct)) {
            return Err(PlanError::Refuse(format!("{name}(DISTINCT ...)")));
        }
        let [FunctionArg::Unnamed(arg)] = list.args.as_slice() else {
            return Err(PlanError::Refuse(format!("{name}() of several arguments")));
        };
        if !list.clauses.is_empty() {
            return Err(PlanError::Refuse(format!("{name}() with clauses")));
        }
        let whole = self.text_of(expr)?;
        let repeated = !matches!(name.as_str(), "count" | "sum");
        if repeated && !self.params_within(&self.range_of(expr)).is_empty() {
            return Err(PlanError::Refuse(format!("{name}() of a parameter")));
        }
        Ok(Some(match (name.as_str(), arg) {
            ("count", _) => Combine::Count,
            ("sum", FunctionArgExpr::Expr(_)) => Combine::Sum,
            ("min", FunctionArgExpr::Expr(_)) => Combine::Min {
                weight: hidden.add(&format!("WEIGHT_STRING({whole})")),
                collation: hidden.add(&format!("COLLATION({whole})")),
            },
            ("max", FunctionArgExpr::Expr(_)) => Combine::Max {
                weight: hidden.add(&format!("WEIGHT_STRING({whole})")),
                collation: hidden.add(&format!("COLLATION({whole})")),
            },
            ("avg", FunctionArgExpr::Expr(arg)) => {
                let arg = self.text_of(arg)?;
                Combine::Avg {
                    sum: hidden.add(&format!("SUM({arg})")),
                    count: hidden.add(&format!("COUNT({arg})")),
                }
            }
            _ => return Err(PlanError::Refuse(format!("{name}()"))),
        }))
    }

    /// The select list's column whose expression (or alias) is `text`.
    fn select_column(&self, text: &str, select: &Select) -> Option<usize> {
        let text = normalized(text);
        select.projection.iter().position(|item| match item {
            SelectItem::ExprWithAlias { alias, .. } if normalized(&alias.value) == text => true,
            SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => {
                self.text_of(e).is_ok_and(|t| normalized(&t) == text)
            }
            _ => false,
        })
    }

    /// The select item whose expression is exactly `text` parsed (not
    /// merely alike when case and spaces are ignored: `'A'` is not `'a'`).
    fn selected_expression(&self, text: &str, select: &Select) -> Option<usize> {
        let parsed = Parser::new(&MySqlDialect {})
            .try_with_sql(text)
            .and_then(|mut parser| parser.parse_expr())
            .ok()?;
        select.projection.iter().position(|item| match item {
            SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => *e == parsed,
            _ => false,
        })
    }

    /// HAVING as the merge evaluates it: comparisons of the select list's
    /// columns (by expression or alias) with numbers, AND, OR, NOT, IS NULL.
    fn having(&self, expr: &Expr, select: &Select) -> Result<Having, PlanError> {
        let column = |term: &Expr| -> Result<usize, PlanError> {
            let text = self.text_of(term)?;
            self.select_column(&text, select).ok_or_else(|| {
                PlanError::Refuse(format!(
                    "HAVING on `{text}`, which the select list does not have"
                ))
            })
        };
        let number = |e: &Expr| -> Option<String> {
            match e {
                Expr::Value(v) => match &v.value {
                    Literal::Number(n, _) => Some(n.clone()),
                    _ => None,
                },
                Expr::UnaryOp {
                    op: UnaryOperator::Minus,
                    expr,
                } => match expr.as_ref() {
                    Expr::Value(v) => match &v.value {
                        Literal::Number(n, _) => Some(format!("-{n}")),
                        _ => None,
                    },
                    _ => None,
                },
                _ => None,
            }
        };
        let unsupported =
            || PlanError::refuse("this HAVING (comparisons of selected columns with numbers only)");
        Ok(match expr {
            Expr::Nested(e) => self.having(e, select)?,
            Expr::UnaryOp {
                op: UnaryOperator::Not,
                expr,
            } => Having::Not(Box::new(self.having(expr, select)?)),
            Expr::IsNull(e) => Having::IsNull {
                column: column(e)?,
                negated: false,
            },
            Expr::IsNotNull(e) => Having::IsNull {
                column: column(e)?,
                negated: true,
            },
            Expr::BinaryOp { left, op, right } => {
                let both = || -> Result<_, PlanError> {
                    Ok((
                        Box::new(self.having(left, select)?),
                        Box::new(self.having(right, select)?),
                    ))
                };
                let compare = match op {
                    BinaryOperator::And => {
                        let (a, b) = both()?;
                        return Ok(Having::And(a, b));
                    }
                    BinaryOperator::Or => {
                        let (a, b) = both()?;
                        return Ok(Having::Or(a, b));
                    }
                    BinaryOperator::Eq => CompareOp::Eq,
                    BinaryOperator::NotEq => CompareOp::NotEq,
                    BinaryOperator::Lt => CompareOp::Lt,
                    BinaryOperator::LtEq => CompareOp::LtEq,
                    BinaryOperator::Gt => CompareOp::Gt,
                    BinaryOperator::GtEq => CompareOp::GtEq,
                    _ => return Err(unsupported()),
                };
                match (number(left), number(right)) {
                    (None, Some(n)) => Having::Compare {
                        column: column(left)?,
                        op: compare,
                        number: n,
                    },
                    (Some(n), None) => Having::Compare {
                        column: column(right)?,
                        op: match compare {
                            CompareOp::Lt => CompareOp::Gt,
                            CompareOp::LtEq => CompareOp::GtEq,
                            CompareOp::Gt => CompareOp::Lt,
                            CompareOp::GtEq => CompareOp::LtEq,
                            same => same,
                        },
                        number: n,
                    },
                    _ => return Err(unsupported()),
                }
            }
            _ => return Err(unsupported()),
        })
    }

    /// `LIMIT n OFFSET m` made `LIMIT n+m`: the edit, m and n.
    fn raised_limit(&self, clause: &LimitClause) -> Result<(ByteEdit, u64, u64), PlanError> {
        let lost = || PlanError::refuse("a LIMIT hscale cannot find in the text");
        let number = |e: &Expr| -> Result<u64, PlanError> {
            match e {
                Expr::Value(v) => match &v.value {
                    Literal::Number(n, _) => n.parse().map_err(|_| PlanError::refuse("this LIMIT")),
                    _ => Err("LIMIT with a parameter or expression".into()),
                },
                _ => Err("LIMIT with a parameter or expression".into()),
            }
        };
        let (limit, offset) = match clause {
            LimitClause::LimitOffset {
                limit: Some(limit),
                offset,
                limit_by,
            } if limit_by.is_empty() => (limit, offset.as_ref().map(|o| &o.value)),
            LimitClause::OffsetCommaLimit { offset, limit } => (limit, Some(offset)),
            _ => return Err("this LIMIT".into()),
        };
        let (n, m) = (number(limit)?, offset.map(number).transpose()?.unwrap_or(0));
        let mut end = self.offsets.range(limit.span()).ok_or_else(lost)?;
        if let Some(offset) = offset {
            let o = self.offsets.range(offset.span()).ok_or_else(lost)?;
            end.end = end.end.max(o.end);
        }
        let keyword = self.keyword_before(end.start, "limit").ok_or_else(lost)?;
        let edit = Edit {
            at: keyword.start..end.end,
            text: EditText::Fixed(format!("LIMIT {}", n.saturating_add(m))),
        };
        Ok((edit, m, n))
    }

    /// Where a GROUP BY or ORDER BY hscale adds goes: before the first of
    /// the clauses that follow them at the top level (ORDER BY, LIMIT, FOR
    /// UPDATE, ...), or at the end of the statement. Found by tokens, not by
    /// the AST's spans, which can end inside an expression.
    /// Whether it stands before such a clause comes with the position.
    fn end_of_clauses(&self) -> Option<(usize, bool)> {
        const AFTER: &[&str] = &[
            "order",
            "limit",
            "for",
            "lock",
            "into",
            "window",
            "procedure",
        ];
        let from = self.top_level_word(0, &["from"])?.start;
        if let Some(word) = self.top_level_word(from, AFTER) {
            return Some((word.start, true));
        }
        Tokens::new(self.sql.as_bytes(), self.ctx.quoting)
            .filter(|t| t.kind != TokenKind::Symbol(b';'))
            .map(|t| (t.end, false))
            .last()
    }

    /// Whether a literal stands outside the FROM and WHERE clauses, where the
    /// merge of several partitions is read from (the select list, GROUP BY,
    /// HAVING, ORDER BY, LIMIT): statements that differ only there have one
    /// fingerprint but merge differently.
    pub(crate) fn merge_reads_literals(&self) -> bool {
        let Some(from) = self.top_level_word(0, &["from"]) else {
            return true;
        };
        let after_where = &[
            "group",
            "having",
            "order",
            "limit",
            "window",
            "for",
            "lock",
            "into",
            "procedure",
        ];
        let end = self
            .top_level_word(from.end, after_where)
            .map_or(self.sql.len(), |w| w.start);
        Tokens::new(self.sql.as_bytes(), self.ctx.quoting).any(|t| {
            crate::cache::literal_kind(t.kind, self.ctx.quoting).is_some()
                && !(from.start..end).contains(&t.start)
        })
    }

    /// The first of `words` at or after byte `from` outside parentheses.
    fn top_level_word(&self, from: usize, words: &[&str]) -> Option<Range<usize>> {
        let mut depth = 0i32;
        for t in Tokens::new(&self.sql.as_bytes()[from..], self.ctx.quoting) {
            match t.kind {
                TokenKind::Symbol(b'(') => depth += 1,
                TokenKind::Symbol(b')') => depth -= 1,
                TokenKind::Word if depth == 0 => {
                    let word = &self.sql[from + t.start..from + t.end];
                    if words.iter().any(|w| word.eq_ignore_ascii_case(w)) {
                        return Some(from + t.start..from + t.end);
                    }
                }
                _ => {}
            }
        }
        None
    }

    /// The text of an ORDER BY or GROUP BY key as an expression: a select
    /// item's when it names one by alias or position.
    fn key_text(&self, key: &Expr, select: &Select) -> Result<String, PlanError> {
        fn item_expr(item: &SelectItem) -> Option<&Expr> {
            match item {
                SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => Some(e),
                _ => None,
            }
        }
        let expr = match key {
            Expr::Value(v) => match &v.value {
                Literal::Number(n, _) => {
                    let position: usize =
                        n.parse().map_err(|_| PlanError::refuse("this ORDER BY"))?;
                    position
                        .checked_sub(1)
                        .and_then(|i| select.projection.get(i))
                        .and_then(item_expr)
                        .ok_or("ORDER BY the position of `*` or of no column")?
                }
                _ => key,
            },
            Expr::Identifier(name) => select
                .projection
                .iter()
                .find_map(|item| match item {
                    SelectItem::ExprWithAlias { expr, alias }
                        if alias.value.eq_ignore_ascii_case(&name.value) =>
                    {
                        Some(expr)
                    }
                    _ => None,
                })
                .unwrap_or(key),
            _ => key,
        };
        let text = self.text_of(expr)?;
        if !self.params_within(&self.range_of(expr)).is_empty() {
            return Err("ORDER BY a parameter".into());
        }
        Ok(text)
    }

    fn range_of(&self, expr: &Expr) -> Range<usize> {
        self.offsets
            .range(expr.span())
            .map(|r| self.with_closing_parentheses(r))
            .unwrap_or(0..0)
    }

    /// An expression as the client wrote it, checked by parsing it again:
    /// sqlparser's spans can end inside an expression (`a IS NULL`), and a
    /// merge by a part of a key would be a wrong answer, not an error.
    /// A span that ends too early is grown to where the expression must end:
    /// the next comma, keyword of the clause or closing parenthesis.
    fn text_of(&self, expr: &Expr) -> Result<String, PlanError> {
        // A copy of a subquery would name the tables the statement's
        // rewrite renames in the original only.
        if crate::route::has_subquery(expr) {
            return Err("a subquery in a key or an aggregate's argument".into());
        }
        let range = self.range_of(expr);
        let same = |text: &str| {
            Parser::new(&MySqlDialect {})
                .try_with_sql(text)
                .and_then(|mut parser| parser.parse_expr())
                .is_ok_and(|parsed| parsed == *expr)
        };
        let text = &self.sql[range.clone()];
        if same(text) {
            return Ok(text.to_string());
        }
        // Grown a token at a time up to where it must end; the shortest text
        // that parses back to the expression is it.
        let grown_from = |start: usize, shortest: usize| {
            let limit = self.expression_end(start);
            Tokens::new(&self.sql.as_bytes()[start..limit], self.ctx.quoting)
                .map(|t| &self.sql[start..start + t.end])
                .filter(|grown| grown.len() > shortest)
                .find(|grown| same(grown))
        };
        if let Some(found) = grown_from(range.start, text.len()) {
            return Ok(found.to_string());
        }
        // Spans can start inside an expression too (`TRIM(LOWER(x))` starts
        // at `LOWER`): the nearest earlier token it can start at.
        let starts: Vec<usize> = Tokens::new(&self.sql.as_bytes()[..range.start], self.ctx.quoting)
            .map(|t| t.start)
            .collect();
        starts
            .iter()
            .rev()
            .take(MAX_TOKENS_BACK)
            .find_map(|&start| grown_from(start, 0))
            .map(str::to_string)
            .ok_or_else(|| {
                PlanError::Refuse(format!(
                    "an expression hscale cannot locate in the text (`{text}`)"
                ))
            })
    }

    /// Where an expression starting at `start` must end: before the first
    /// comma, closing parenthesis or clause keyword outside its parentheses.
    fn expression_end(&self, start: usize) -> usize {
        const ENDS: &[&str] = &[
            "asc", "desc", "as", "from", "where", "group", "having", "order", "limit", "for",
            "lock", "into", "window", "with",
        ];
        let mut depth = 0i32;
        for t in Tokens::new(&self.sql.as_bytes()[start..], self.ctx.quoting) {
            let at = start + t.start;
            match t.kind {
                TokenKind::Symbol(b'(') => depth += 1,
                TokenKind::Symbol(b')') if depth == 0 => return at,
                TokenKind::Symbol(b')') => depth -= 1,
                TokenKind::Symbol(b',' | b';') if depth == 0 => return at,
                TokenKind::Word if depth == 0 => {
                    let word = &self.sql[at..start + t.end];
                    if ENDS.iter().any(|w| word.eq_ignore_ascii_case(w)) {
                        return at;
                    }
                }
                _ => {}
            }
        }
        self.sql.len()
    }

    /// sqlparser's span of a function call can end before its closing
    /// parenthesis: the range grown to the parenthesis that balances it.
    pub(crate) fn with_closing_parentheses(&self, range: Range<usize>) -> Range<usize> {
        let mut depth = 0i32;
        let mut end = range.end;
        for token in Tokens::new(&self.sql.as_bytes()[range.start..], self.ctx.quoting) {
            let at = range.start + token.end;
            if at > range.end && depth <= 0 {
                break;
            }
            match token.kind {
                TokenKind::Symbol(b'(') => depth += 1,
                TokenKind::Symbol(b')') => depth -= 1,
                _ => {}
            }
            end = end.max(at);
        }
        range.start..end
    }

    /// The last word token `word` that ends before byte `before`.
    fn keyword_before(&self, before: usize, word: &str) -> Option<Range<usize>> {
        Tokens::new(&self.sql.as_bytes()[..before], self.ctx.quoting)
            .filter(|t| {
                t.kind == TokenKind::Word && self.sql[t.start..t.end].eq_ignore_ascii_case(word)
            })
            .last()
            .map(|t| t.start..t.end)
    }
}

/// ` ORDER BY` the hidden value columns of these keys.
fn order_by_keys(keys: &[SortKey]) -> String {
    let columns: Vec<String> = keys.iter().map(|key| key.value.order_term()).collect();
    format!(" ORDER BY {}", columns.join(", "))
}

fn descending(key: &OrderByExpr) -> bool {
    matches!(key.options.sort, Some(OrderBySort::Desc))
}

/// A key's text compared with another's: case, spaces and backquotes aside.
fn normalized(text: &str) -> String {
    text.chars()
        .filter(|c| !c.is_whitespace() && *c != '`')
        .flat_map(char::to_lowercase)
        .collect()
}

/// The name of an aggregate an expression has inside it, or "window" for a
/// window function, that aggregates the rows of the statement the
/// expression is in. One inside a subquery aggregates the subquery's rows,
/// unless its arguments may name columns of the rows around it (MariaDB
/// then aggregates it in the outer statement): only arguments whose columns
/// are all qualified by a table of the subquery's own FROM leave it there.
///
/// `columns` gives the columns of a table where they are known: an
/// unqualified argument names the subquery's own column where one of its
/// tables has that column (MariaDB looks there first).
pub(crate) fn nested_aggregate(expr: &Expr, columns: &Columns) -> Option<String> {
    let mut finder = AggregateFinder {
        scopes: Vec::new(),
        found: None,
        columns,
    };
    let _ = expr.visit(&mut finder);
    finder.found
}

/// The columns of the table a name names, where they are known.
pub(crate) type Columns<'c> = dyn Fn(&ObjectName) -> Option<Arc<[String]>> + 'c;

/// No table's columns known.
pub(crate) fn no_columns(_: &ObjectName) -> Option<Arc<[String]>> {
    None
}

/// The names a subquery's FROM gives its tables, and their columns where
/// every one's are known.
type Scope = (Vec<String>, Option<Vec<Arc<[String]>>>);

struct AggregateFinder<'c> {
    /// The scope of each subquery the walk is in.
    scopes: Vec<Scope>,
    found: Option<String>,
    columns: &'c Columns<'c>,
}

impl Visitor for AggregateFinder<'_> {
    type Break = ();

    fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<()> {
        let factors: Vec<&TableFactor> = match query.body.as_ref() {
            SetExpr::Select(select) => select
                .from
                .iter()
                .flat_map(|t| {
                    std::iter::once(&t.relation).chain(t.joins.iter().map(|j| &j.relation))
                })
                .collect(),
            _ => Vec::new(),
        };
        let names = factors
            .iter()
            .filter_map(|factor| match factor {
                TableFactor::Table { name, alias, .. } => Some(match alias {
                    Some(alias) => alias.name.value.clone(),
                    None => name.0.last()?.as_ident()?.value.clone(),
                }),
                _ => None,
            })
            .collect();
        let columns = factors
            .iter()
            .map(|factor| match factor {
                TableFactor::Table { name, .. } => (self.columns)(name),
                _ => None,
            })
            .collect();
        self.scopes.push((names, columns));
        ControlFlow::Continue(())
    }

    fn post_visit_query(&mut self, _: &Query) -> ControlFlow<()> {
        self.scopes.pop();
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, e: &Expr) -> ControlFlow<()> {
        let Expr::Function(f) = e else {
            return ControlFlow::Continue(());
        };
        let name = f.name.to_string().to_ascii_lowercase();
        let found = match self.scopes.last() {
            None if f.over.is_some() => Some("window".to_string()),
            None => AGGREGATES.contains(&name.as_str()).then_some(name),
            Some(_) if f.over.is_some() => None,
            Some((own, columns)) => (AGGREGATES.contains(&name.as_str())
                && !only_columns_of(f, own, columns.as_deref()))
            .then_some(name),
        };
        match found {
            Some(found) => {
                self.found = Some(found);
                ControlFlow::Break(())
            }
            None => ControlFlow::Continue(()),
        }
    }
}

/// Whether every column a function's arguments name is qualified by one of
/// `tables`, or unqualified and a column of one of them (`columns`, where
/// all are known).
fn only_columns_of(
    f: &sqlparser::ast::Function,
    tables: &[String],
    columns: Option<&[Arc<[String]>]>,
) -> bool {
    let mut own = true;
    let _ = visit_expressions(&f.args, |e: &Expr| {
        own &= match e {
            Expr::Identifier(ident) => columns.is_some_and(|tables| {
                tables
                    .iter()
                    .any(|table| table.iter().any(|c| c.eq_ignore_ascii_case(&ident.value)))
            }),
            Expr::CompoundIdentifier(parts) => {
                parts.len() == 2 && tables.iter().any(|t| *t == parts[0].value)
            }
            _ => true,
        };
        ControlFlow::<()>::Continue(())
    });
    own
}

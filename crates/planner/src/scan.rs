//! A SELECT over several partitions: how their rows merge into the answer
//! one table would give (`hscale_merge::Spec`), and what each partition's
//! statement sends along for it. Every ORDER BY or group key travels after
//! the client's columns with its `WEIGHT_STRING` and `COLLATION`; MIN and MAX
//! carry the same of their result, AVG its SUM and COUNT. Each partition
//! returns at most LIMIT + OFFSET rows, sorted by the keys, so the merge
//! streams: one row per partition, one group at a time.

use std::ops::{ControlFlow, Range};

use hscale_merge::{Combine, SortKey, Spec};
use sqlparser::ast::{
    visit_expressions, Distinct, DuplicateTreatment, Expr, FunctionArg, FunctionArgExpr,
    FunctionArguments, GroupByExpr, LimitClause, OrderBy, OrderByExpr, OrderByKind, OrderBySort,
    Query, Select, SelectItem, Spanned, Value as Literal,
};

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
            .push_str(&format!(", {expr} AS `__hscale_{}`", self.count));
        self.count += 1;
        self.count - 1
    }

    /// An ORDER BY or group key: its value, weight and collation.
    fn key(&mut self, text: &str, descending: bool) -> SortKey {
        SortKey {
            value: self.add(&format!("({text})")),
            weight: self.add(&format!("WEIGHT_STRING(({text}))")),
            collation: self.add(&format!("COLLATION(({text}))")),
            descending,
        }
    }
}

impl Analysis<'_> {
    /// The merge of a SELECT's partitions and the edits each partition's
    /// statement gets; `Err`: what hscale cannot merge exactly.
    pub(crate) fn scan_merge(
        &self,
        query: &Query,
        select: &Select,
        summary: &Summary,
    ) -> Result<(Spec, Vec<ByteEdit>), String> {
        if query.fetch.is_some() {
            return Err("FETCH".into());
        }
        if select.having.is_some() {
            return Err("HAVING".into());
        }
        if select.into.is_some() {
            return Err("SELECT ... INTO".into());
        }
        if summary.found_rows {
            return Err("SQL_CALC_FOUND_ROWS".into());
        }
        let lost = || "a clause hscale cannot find in the text".to_string();
        let mut spec = Spec::default();
        let mut hidden = Hidden::default();
        let mut edits = Vec::new();
        let combines = self.combines(select, &mut hidden)?;
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
        // The keys whose equal values make one group, as text.
        let group_keys: Vec<String> = match (distinct, group_by.is_empty()) {
            (true, _) => select
                .projection
                .iter()
                .map(|item| match item {
                    SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => {
                        Ok(self.text_of(e))
                    }
                    _ => Err("DISTINCT *".to_string()),
                })
                .collect::<Result<_, _>>()?,
            (false, _) => group_by
                .iter()
                .map(|e| self.key_text(e, select))
                .collect::<Result<_, _>>()?,
        };
        let grouped = distinct || aggregates || !group_keys.is_empty();
        if grouped && combines.len() < select.projection.len() {
            return Err("* with GROUP BY or aggregates".into());
        }
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
        if grouped && !group_keys.is_empty() {
            let same = |a: &str, b: &str| normalized(a) == normalized(b);
            match order_keys.is_empty() {
                // Each partition sorts by the group keys, so that one group's
                // rows meet in the merge.
                true => {
                    for text in &group_keys {
                        spec.keys.push(hidden.key(text, false));
                    }
                    let order_by = format!(
                        " ORDER BY {}",
                        spec.keys
                            .iter()
                            .map(|key| format!("`__hscale_{}`", key.value))
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                    let at = self.end_of_clauses(select).ok_or_else(lost)?;
                    edits.push(Edit {
                        at: at..at,
                        text: EditText::Fixed(order_by),
                    });
                }
                false => {
                    let covers = order_keys.len() == group_keys.len()
                        && group_keys
                            .iter()
                            .all(|g| order_keys.iter().any(|(o, _)| same(g, o)));
                    if !covers {
                        return Err("ORDER BY other than the grouped columns".into());
                    }
                    for (text, descending) in &order_keys {
                        spec.keys.push(hidden.key(text, *descending));
                    }
                }
            }
        } else if !grouped {
            for (text, descending) in &order_keys {
                spec.keys.push(hidden.key(text, *descending));
            }
        }
        // Aggregates without GROUP BY: one row, whatever its ORDER BY.
        if let Some(clause) = &query.limit_clause {
            let (edit, offset, limit) = self.raised_limit(clause)?;
            spec.offset = offset;
            spec.limit = Some(limit);
            edits.push(edit);
        }
        if hidden.count > 0 {
            let last = select.projection.last().ok_or_else(lost)?;
            let last = self.offsets.range(last.span()).ok_or_else(lost)?;
            let after = self.with_closing_parentheses(last).end;
            let from = self.keyword_after(after, "from").ok_or_else(lost)?;
            edits.push(Edit {
                at: from,
                text: EditText::Fixed(format!("{} FROM", hidden.text)),
            });
        }
        spec.hidden = hidden.count;
        spec.groups = grouped.then_some(combines);
        Ok((spec, edits))
    }

    /// How each select item combines over a group: an aggregate by its
    /// function, anything else by its first row. Expressions over aggregates
    /// are refused.
    fn combines(&self, select: &Select, hidden: &mut Hidden) -> Result<Vec<Combine>, String> {
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
            let mut nested = None;
            let _ = visit_expressions(expr, |e: &Expr| {
                if let Expr::Function(f) = e {
                    let name = f.name.to_string().to_ascii_lowercase();
                    if f.over.is_some() || AGGREGATES.contains(&name.as_str()) {
                        nested = Some(name);
                        return ControlFlow::Break(());
                    }
                }
                ControlFlow::Continue(())
            });
            if let Some(name) = nested {
                return Err(format!(
                    "{name}() inside an expression, or a window function"
                ));
            }
            combines.push(Combine::First);
        }
        Ok(combines)
    }

    /// COUNT, SUM, MIN, MAX or AVG of one argument, as a whole select item.
    fn aggregate(&self, expr: &Expr, hidden: &mut Hidden) -> Result<Option<Combine>, String> {
        let Expr::Function(f) = expr else {
            return Ok(None);
        };
        let name = f.name.to_string().to_ascii_lowercase();
        if !AGGREGATES.contains(&name.as_str()) {
            return Ok(None);
        }
        if f.over.is_some() || f.filter.is_some() || !f.within_group.is_empty() {
            return Err(format!("{name}() with OVER, FILTER or WITHIN GROUP"));
        }
        let FunctionArguments::List(list) = &f.args else {
            return Err(format!("{name}() without arguments"));
        };
        if matches!(list.duplicate_treatment, Some(DuplicateTreatment::Distinct)) {
            return Err(format!("{name}(DISTINCT ...)"));
        }
        let [FunctionArg::Unnamed(arg)] = list.args.as_slice() else {
            return Err(format!("{name}() of several arguments"));
        };
        if !list.clauses.is_empty() {
            return Err(format!("{name}() with clauses"));
        }
        let whole = self.text_of(expr);
        let repeated = !matches!(name.as_str(), "count" | "sum");
        if repeated && !self.params_within(&self.range_of(expr)).is_empty() {
            return Err(format!("{name}() of a parameter"));
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
                let arg = self.text_of(arg);
                Combine::Avg {
                    sum: hidden.add(&format!("SUM({arg})")),
                    count: hidden.add(&format!("COUNT({arg})")),
                }
            }
            _ => return Err(format!("{name}()")),
        }))
    }

    /// `LIMIT n OFFSET m` made `LIMIT n+m`: the edit, m and n.
    fn raised_limit(&self, clause: &LimitClause) -> Result<(ByteEdit, u64, u64), String> {
        let lost = || "a LIMIT hscale cannot find in the text".to_string();
        let number = |e: &Expr| -> Result<u64, String> {
            match e {
                Expr::Value(v) => match &v.value {
                    Literal::Number(n, _) => n.parse().map_err(|_| "this LIMIT".to_string()),
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

    /// Where an ORDER BY goes in a SELECT that has none: after its last
    /// clause (WHERE, GROUP BY) or its table.
    fn end_of_clauses(&self, select: &Select) -> Option<usize> {
        let mut ends = Vec::new();
        for table in &select.from {
            ends.push(self.offsets.range(table.span())?);
        }
        if let Some(selection) = &select.selection {
            ends.push(self.offsets.range(selection.span())?);
        }
        if let GroupByExpr::Expressions(exprs, _) = &select.group_by {
            for e in exprs {
                ends.push(self.offsets.range(e.span())?);
            }
        }
        ends.into_iter()
            .map(|r| self.with_closing_parentheses(r).end)
            .max()
    }

    /// The text of an ORDER BY or GROUP BY key as an expression: a select
    /// item's when it names one by alias or position.
    fn key_text(&self, key: &Expr, select: &Select) -> Result<String, String> {
        fn item_expr(item: &SelectItem) -> Option<&Expr> {
            match item {
                SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => Some(e),
                _ => None,
            }
        }
        let expr = match key {
            Expr::Value(v) => match &v.value {
                Literal::Number(n, _) => {
                    let position: usize = n.parse().map_err(|_| "this ORDER BY".to_string())?;
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
        let text = self.text_of(expr);
        if text.is_empty() {
            return Err("a key hscale cannot find in the text".into());
        }
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

    /// An expression as the client wrote it.
    fn text_of(&self, expr: &Expr) -> String {
        self.sql[self.range_of(expr)].to_string()
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

    /// The first word token `word` at or after byte `from`.
    fn keyword_after(&self, from: usize, word: &str) -> Option<Range<usize>> {
        Tokens::new(&self.sql.as_bytes()[from..], self.ctx.quoting)
            .find(|t| {
                t.kind == TokenKind::Word
                    && self.sql[from + t.start..from + t.end].eq_ignore_ascii_case(word)
            })
            .map(|t| from + t.start..from + t.end)
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

//! A routed SELECT, UPDATE or DELETE apart from its literal values: which
//! literals fix the partition column, where the text changes, and how several
//! partitions combine. Rendering a shape with values gives the route; the plan
//! cache keeps shapes so that a statement of a known shape is never parsed.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

use crate::dictionary::{partition_table, Dictionary, PartitionedTable, TableName, Target};
use crate::error::PlanError;
use crate::hashing::Value;
use crate::lexer::Token;
use crate::plan::{Merge, Route, Step};
use crate::rewrite::{push_quoted, Splices};
use crate::template::{Bound, Row, Rows};
use smallvec::SmallVec;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Shape<R> {
    pub table: Arc<TableName>,
    /// The literals that fix the partition column; `None`: every partition.
    pub keys: Option<Vec<Key<R>>>,
    /// Where the text changes.
    pub edits: Vec<Edit<R>>,
    /// Where the text changes too when it runs on several partitions: the
    /// columns a merge compares, LIMIT raised by OFFSET.
    pub scan_edits: Vec<Edit<R>>,
    /// With several partitions: how their answers combine, or why they cannot.
    pub many: Result<Merge, PlanError>,
    /// `many` and `scan_edits` come from clauses that hold literals (a
    /// LIMIT, a constant in the select list, ORDER BY 2): a statement of the
    /// same fingerprint merges differently, so the plan cache serves this
    /// shape only to statements on one partition.
    pub scan_reads_literals: bool,
    pub writes: bool,
    /// The statement names tables that are not partitioned too.
    pub others: bool,
    /// Partitioned tables joined to `table`, co-located with it: each runs
    /// as its table beside `table`'s.
    pub joined: Vec<Arc<TableName>>,
    /// An INSERT of several rows: each key places its row.
    pub rows: Option<InsertRows<R>>,
}

/// The VALUES rows of an INSERT, one per key in order: each partition's text
/// keeps only its own rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InsertRows<R> {
    /// From the first row's `(` to the last row's `)`.
    pub span: R,
    pub rows: Vec<R>,
}

/// A literal of the partition column: where it is, and whether a minus sign
/// stands before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Key<R> {
    pub at: R,
    pub negative: bool,
    /// `None`: the column equals it; else it bounds a range (`BETWEEN`),
    /// whose high end is the next key.
    pub end: Option<RangeEnd>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RangeEnd {
    Low,
    High,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Edit<R> {
    pub at: R,
    pub text: EditText,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EditText {
    /// The partition's physical table name, between these.
    Physical {
        before: String,
        after: String,
    },
    Fixed(String),
    /// The physical table of a table co-located with the routed one that
    /// holds the same partition: `orders_p1` beside `users_p1`.
    CoLocated {
        table: Arc<TableName>,
        default: Arc<str>,
        before: String,
        after: String,
    },
}

/// Positions as byte ranges of one statement's text.
pub(crate) type ByteShape = Shape<Range<usize>>;

/// Positions as token indices: the same for every statement of the same
/// fingerprint, whatever its literals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TokenRange {
    /// These tokens.
    Tokens(Range<usize>),
    /// The empty place where this token starts.
    Before(usize),
    /// The empty place where this token ends.
    After(usize),
}

pub(crate) type TokenShape = Shape<TokenRange>;

/// The statement with the physical table of `target` spliced in; `locate`
/// gives an edit's bytes. Edits are in text order (`Analysis::edits`); with
/// no other splices the text is written in one pass, one allocation.
pub(crate) fn apply_edits<'e, R: 'e>(
    sql: &str,
    edits: impl IntoIterator<Item = &'e Edit<R>> + Clone,
    target: &Target,
    splices: &mut Splices,
    locate: impl Fn(&R) -> Option<Range<usize>>,
) -> Result<String, PlanError> {
    let lost = || PlanError::refuse("a name hscale cannot find in the text");
    if splices.is_empty() {
        let grows: usize = edits.clone().into_iter().map(|e| e.text.len(target)).sum();
        // + 1: the command code `Step::into_command` puts in front.
        let mut out = String::with_capacity(sql.len() + grows + 1);
        let mut at = 0;
        for edit in edits {
            let range = locate(&edit.at).ok_or_else(lost)?;
            out.push_str(sql.get(at..range.start).ok_or("overlapping names")?);
            edit.text.write(target, &mut out);
            at = range.end;
        }
        out.push_str(sql.get(at..).ok_or_else(lost)?);
        return Ok(out);
    }
    for edit in edits {
        let mut text = String::new();
        edit.text.write(target, &mut text);
        let at = locate(&edit.at).ok_or_else(lost)?;
        splices.replace(at, text);
    }
    splices
        .apply(sql)
        .ok_or_else(|| PlanError::refuse("overlapping names"))
}

impl EditText {
    /// The physical table name the edit writes for `target`, with the text
    /// around it; `Err`: a fixed text.
    fn parts<'s>(
        &'s self,
        target: &'s Target,
    ) -> Result<(&'s str, Cow<'s, str>, &'s str), &'s str> {
        match self {
            EditText::Physical { before, after } => {
                Ok((before, Cow::Borrowed(&target.table), after))
            }
            EditText::CoLocated {
                table,
                default,
                before,
                after,
            } => {
                let name = match &target.partition {
                    Some(partition) => Cow::Owned(partition_table(table, partition)),
                    None => Cow::Borrowed(&**default),
                };
                Ok((before, name, after))
            }
            EditText::Fixed(text) => Err(text),
        }
    }

    /// At most how many bytes `write` adds (backquotes doubled or not).
    fn len(&self, target: &Target) -> usize {
        match self.parts(target) {
            Ok((before, name, after)) => before.len() + 2 * name.len() + 2 + after.len(),
            Err(text) => text.len(),
        }
    }

    fn write(&self, target: &Target, out: &mut String) {
        match self.parts(target) {
            Ok((before, name, after)) => {
                out.push_str(before);
                push_quoted(&name, out);
                out.push_str(after);
            }
            Err(text) => out.push_str(text),
        }
    }
}

/// Byte ranges locate themselves.
pub(crate) fn bytes(at: &Range<usize>) -> Option<Range<usize>> {
    Some(at.clone())
}

impl<R> Shape<R> {
    /// The route for these key values (in the order of `keys`); `locate`
    /// gives the bytes of a position in `sql`.
    pub fn render(
        &self,
        sql: &str,
        table: &PartitionedTable,
        main_backend: u32,
        values: &[Value],
        locate: impl Fn(&R) -> Option<Range<usize>>,
    ) -> Result<Route, PlanError> {
        if let Some(rows) = &self.rows {
            return self
                .insert_rows(rows, &locate, values)?
                .route(sql, table, main_backend);
        }
        let (targets, merge) = self.targets(table, main_backend, values)?;
        let edits = self.edits_for(targets.len() > 1, &locate);
        let mut steps = SmallVec::with_capacity(targets.len());
        for target in targets {
            let sql = apply_edits(
                sql,
                edits.iter().copied(),
                &target,
                &mut Splices::default(),
                &locate,
            )?;
            steps.push(Step { target, sql });
        }
        Ok(Route {
            table: self.table.clone(),
            steps,
            merge,
            writes: self.writes,
            highest_id: None,
        })
    }

    /// The rows of an INSERT at this statement's positions, placed by
    /// `values`.
    fn insert_rows(
        &self,
        rows: &InsertRows<R>,
        locate: impl Fn(&R) -> Option<Range<usize>>,
        values: &[Value],
    ) -> Result<Rows, PlanError> {
        let found = |at: &R| locate(at).ok_or("a row hscale cannot find in the text");
        Ok(Rows {
            edits: self
                .edits
                .iter()
                .map(|e| {
                    Ok(Edit {
                        at: found(&e.at)?,
                        text: e.text.clone(),
                    })
                })
                .collect::<Result<_, PlanError>>()?,
            span: Some(found(&rows.span)?),
            rows: rows
                .rows
                .iter()
                .zip(values)
                .map(|(at, value)| {
                    Ok(Row {
                        at: found(at)?,
                        key: Bound::Literal(value.reborrow().into_owned()),
                        params: 0..0,
                    })
                })
                .collect::<Result<_, PlanError>>()?,
            others: self.others,
            ids: Vec::new(),
        })
    }

    /// A table joined to the routed one that a move or a schema change
    /// holds: the statement waits for it.
    pub fn locked_joined<'d>(&self, dictionary: &'d Dictionary) -> Option<&'d TableName> {
        self.joined
            .iter()
            .filter_map(|t| dictionary.table(&t.db, &t.name))
            .find(|t| t.locked())
            .map(|t| &t.table)
    }

    /// The edits of one partition's text, in text order: with the scan's
    /// when it is one of `several`.
    pub fn edits_for(
        &self,
        several: bool,
        locate: impl Fn(&R) -> Option<Range<usize>>,
    ) -> SmallVec<[&Edit<R>; 4]> {
        let mut edits: SmallVec<[&Edit<R>; 4]> = self.edits.iter().collect();
        if several && !self.scan_edits.is_empty() {
            edits.extend(&self.scan_edits);
            // An insertion goes before a replacement that starts where it is.
            edits.sort_by_key(|e| locate(&e.at).map_or((0, 0), |r| (r.start, r.end)));
        }
        edits
    }

    /// The physical tables for these key values, and how their answers combine.
    pub fn targets(
        &self,
        table: &PartitionedTable,
        main_backend: u32,
        values: &[Value],
    ) -> Result<(SmallVec<[Target; 2]>, Merge), PlanError> {
        let targets: SmallVec<[Target; 2]> = match &self.keys {
            None => SmallVec::from_vec(table.all_targets()),
            Some(keys) => {
                let lookup = |e| format!("the value of partition column `{}`: {e}", table.column);
                let mut targets = SmallVec::new();
                let mut add = |target: Target| {
                    if !targets.contains(&target) {
                        targets.push(target);
                    }
                };
                let mut i = 0;
                while i < values.len() {
                    match (keys.get(i).and_then(|k| k.end), values.get(i + 1)) {
                        (Some(RangeEnd::Low), Some(high)) => {
                            match table.targets_between(&values[i], high).map_err(lookup)? {
                                Some(found) => found.into_iter().for_each(&mut add),
                                None => table.all_targets().into_iter().for_each(&mut add),
                            }
                            i += 2;
                        }
                        _ => {
                            add(table.target_for(&values[i]).map_err(lookup)?);
                            i += 1;
                        }
                    }
                }
                targets
            }
        };
        let merge = match targets.len() {
            1 => Merge::Single,
            _ => self.many.clone()?,
        };
        check_others(self.others, &targets, main_backend)?;
        Ok((targets, merge))
    }
}

/// The first target that is not on the main backend.
pub(crate) fn off_main<'t>(
    targets: impl IntoIterator<Item = &'t Target>,
    main_backend: u32,
) -> Option<&'t Target> {
    targets.into_iter().find(|t| t.backend != main_backend)
}

/// Tables that are not partitioned live on the main backend only: a
/// statement that names one runs nowhere else.
pub(crate) fn check_others<'t>(
    others: bool,
    targets: impl IntoIterator<Item = &'t Target>,
    main_backend: u32,
) -> Result<(), PlanError> {
    match off_main(targets, main_backend) {
        Some(far) if others => Err(PlanError::Refuse(format!(
            "a statement that also names tables that are not partitioned runs only on the main backend (backend {main_backend}), and {} is on backend {}",
            far.table, far.backend
        ))),
        _ => Ok(()),
    }
}

impl ByteShape {
    /// The same shape with positions as ranges of token indices, if every
    /// position falls on token boundaries.
    pub fn to_tokens(&self, tokens: &[Token]) -> Option<TokenShape> {
        let starting = |at: usize| tokens.binary_search_by_key(&at, |t| t.start);
        let ending = |at: usize| tokens.binary_search_by_key(&at, |t| t.end);
        let index = |at: &Range<usize>| -> Option<TokenRange> {
            if at.is_empty() {
                // An insertion: where a token starts, or where one ends.
                return match starting(at.start) {
                    Ok(i) => Some(TokenRange::Before(i)),
                    Err(_) => Some(TokenRange::After(ending(at.end).ok()?)),
                };
            }
            let first = starting(at.start).ok()?;
            let last = ending(at.end).ok()?;
            (first <= last).then_some(TokenRange::Tokens(first..last + 1))
        };
        let edits = |edits: &[Edit<Range<usize>>]| {
            edits
                .iter()
                .map(|e| {
                    Some(Edit {
                        at: index(&e.at)?,
                        text: e.text.clone(),
                    })
                })
                .collect::<Option<Vec<_>>>()
        };
        // Scan edits that fall between tokens serve no other statement; one
        // partition's statements do without them.
        let scan_edits = match self.scan_reads_literals {
            true => None,
            false => edits(&self.scan_edits),
        };
        Some(Shape {
            table: self.table.clone(),
            keys: match &self.keys {
                None => None,
                Some(keys) => Some(
                    keys.iter()
                        .map(|k| {
                            let at = index(&k.at).filter(|r| r.token().is_some())?;
                            Some(Key {
                                at,
                                negative: k.negative,
                                end: k.end,
                            })
                        })
                        .collect::<Option<Vec<_>>>()?,
                ),
            },
            edits: edits(&self.edits)?,
            scan_reads_literals: scan_edits.is_none(),
            scan_edits: scan_edits.unwrap_or_default(),
            many: self.many.clone(),
            writes: self.writes,
            others: self.others,
            joined: self.joined.clone(),
            rows: match &self.rows {
                None => None,
                Some(rows) => Some(InsertRows {
                    span: index(&rows.span)?,
                    rows: rows.rows.iter().map(index).collect::<Option<_>>()?,
                }),
            },
        })
    }
}

impl TokenRange {
    /// The bytes of these tokens, for a statement whose token `i` starts at
    /// `starts[i]` and ends at `ends[i]`.
    pub fn locate(&self, tokens: &[Token]) -> Option<Range<usize>> {
        match self {
            TokenRange::Tokens(range) => {
                Some(tokens.get(range.start)?.start..tokens.get(range.end.checked_sub(1)?)?.end)
            }
            TokenRange::Before(i) => tokens.get(*i).map(|t| t.start..t.start),
            TokenRange::After(i) => tokens.get(*i).map(|t| t.end..t.end),
        }
    }

    /// The index of the one token this is, if it is one.
    pub fn token(&self) -> Option<usize> {
        match self {
            TokenRange::Tokens(tokens) if tokens.len() == 1 => Some(tokens.start),
            _ => None,
        }
    }
}

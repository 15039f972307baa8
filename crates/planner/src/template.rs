//! A prepared statement on a partitioned table, planned once at PREPARE:
//! where the partition column's values come from (literals of the text, or
//! parameters), and the text each partition gets. Executing it picks the
//! partitions from the bound values and parses nothing, until the dictionary
//! changes under it.

use std::ops::Range;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::auto::{id_value, not_an_id, IdValue, Upsert};
use crate::dictionary::{Dictionary, PartitionedTable, PhysicalId, TableName, Target};
use crate::error::PlanError;
use crate::hashing::Value;
use crate::plan::{Merge, Refusal, Route, Step};
use crate::rewrite::Splices;
use crate::shape::{apply_edits, bytes, check_others, ByteShape, Edit};

/// Where a value of the partition column comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Bound {
    Literal(Value<'static>),
    /// The statement's parameter of this index (its `?`, counted from 0).
    Param(usize),
}

/// The rows of an INSERT ... VALUES (or the one row of INSERT ... SET), each
/// placed by its partition column's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rows {
    pub edits: Vec<Edit<Range<usize>>>,
    /// From the first row's `(` to the last row's `)`; `None` for one row
    /// that is never cut out (INSERT ... SET).
    pub span: Option<Range<usize>>,
    pub rows: Vec<Row>,
    /// The statement names tables that are not partitioned too.
    pub others: bool,
    /// The ids its rows give an AUTO_INCREMENT column.
    pub ids: Vec<Bound>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Row {
    pub at: Range<usize>,
    pub key: Bound,
    /// The parameters within the row.
    pub params: Range<usize>,
}

/// Rows by the physical table they go to, tables in the order of their first row.
type Placed = SmallVec<[(Target, SmallVec<[u32; 4]>); 2]>;

impl Rows {
    /// Where each row goes; `values` are the rows' keys, in row order.
    fn place(&self, table: &PartitionedTable, values: &[Value]) -> Result<Placed, PlanError> {
        let mut placed: Placed = SmallVec::new();
        for (i, value) in values.iter().enumerate() {
            let target = table.target_for(value).map_err(|e| {
                PlanError::Refuse(format!(
                    "the value of partition column `{}`: {e}",
                    table.column
                ))
            })?;
            match placed.iter_mut().find(|(t, _)| *t == target) {
                Some((_, rows)) => rows.push(i as u32),
                None => placed.push((target, smallvec::smallvec![i as u32])),
            }
        }
        Ok(placed)
    }

    /// The statement for `target` with only `rows` in it.
    fn text(&self, sql: &str, target: &Target, rows: &[u32]) -> Result<String, PlanError> {
        let mut splices = Splices::default();
        if let Some(span) = self.span.clone().filter(|_| rows.len() < self.rows.len()) {
            let kept: Vec<&str> = rows
                .iter()
                .map(|&r| &sql[self.rows[r as usize].at.clone()])
                .collect();
            splices.replace(span, kept.join(", "));
        }
        apply_edits(sql, &self.edits, target, &mut splices, bytes)
    }

    /// The route of a statement whose rows' keys are all literals.
    pub fn route(
        &self,
        sql: &str,
        table: &PartitionedTable,
        main_backend: u32,
    ) -> Result<Route, PlanError> {
        let values = self
            .rows
            .iter()
            .map(|row| match &row.key {
                Bound::Literal(value) => Ok(value.reborrow()),
                Bound::Param(_) => Err(PlanError::Refuse(format!(
                    "the partition column `{}` must be given as a literal",
                    table.column
                ))),
            })
            .collect::<Result<Vec<_>, PlanError>>()?;
        let placed = self.place(table, &values)?;
        check_others(self.others, placed.iter().map(|(t, _)| t), main_backend)?;
        let mut steps = SmallVec::with_capacity(placed.len());
        for (target, rows) in &placed {
            let sql = self.text(sql, target, rows)?;
            steps.push(Step {
                target: target.clone(),
                sql,
            });
        }
        Ok(Route {
            table: Arc::new(table.table.clone()),
            merge: rows_merge(steps.len()),
            steps,
            writes: true,
            highest_id: self.highest_id(|_| None),
        })
    }
}

impl Rows {
    /// The highest id the rows give, with `param(i)` the parameters' values.
    fn highest_id<'p>(&self, param: impl Fn(usize) -> Option<Value<'p>>) -> Option<u64> {
        self.ids
            .iter()
            .filter_map(|bound| {
                let value = match bound {
                    Bound::Literal(value) => value.reborrow(),
                    Bound::Param(i) => param(*i)?,
                };
                match id_value(&value, false)? {
                    IdValue::Given(id) => Some(id),
                    _ => None,
                }
            })
            .max()
    }
}

fn rows_merge(steps: usize) -> Merge {
    match steps {
        1 => Merge::Single,
        _ => Merge::AffectedRows,
    }
}

/// A prepared statement on a partitioned table, planned once.
#[derive(Debug, Clone)]
pub struct Template {
    sql: String,
    table: Arc<TableName>,
    /// The dictionary version it was planned at.
    version: u64,
    /// The table's default partition: where PREPARE learns the statement's
    /// parameters and columns.
    default: Target,
    /// It reads what only the main backend's connection holds (user
    /// variables, user locks, FOUND_ROWS()).
    main_only: bool,
    form: Form,
    /// The parameters hscale binds to AUTO_INCREMENT ids, which the client
    /// does not know of: indices among all of the text's parameters.
    ids: Vec<usize>,
    /// The table's AUTO_INCREMENT column.
    id_column: Option<String>,
    upsert: Option<Upsert>,
}

#[derive(Debug, Clone)]
pub(crate) enum Form {
    /// SELECT, UPDATE, DELETE and one-row INSERT: the partitions of `keys`
    /// (aligned with the shape's), or every partition.
    Keys {
        shape: ByteShape,
        keys: Vec<Bound>,
        /// Pairs of values that place rows in one partition, or the
        /// execution goes to copies (joined tables co-located by them).
        same_partition: Vec<(Bound, Bound)>,
    },
    /// INSERT of several rows: each placed by its own key.
    Rows(Rows),
    /// Routed without looking at any value (DESCRIBE, INSERT ... SELECT).
    Fixed(Route),
}

/// One statement of an execution: the physical table it runs on and, for
/// an INSERT whose rows go to several, the rows it takes (`None`: all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    pub target: Target,
    pub rows: Option<SmallVec<[u32; 4]>>,
    /// One of several partitions of a scan: the text carries what the merge
    /// needs (`Shape::scan_edits`).
    pub scan: bool,
}

/// Where one execution of a template goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Execution {
    pub runs: SmallVec<[Run; 2]>,
    pub merge: Merge,
    pub writes: bool,
}

#[derive(Debug)]
pub enum Routing {
    Run(Execution),
    /// A move or schema change holds the table: try again later.
    Wait(TableName),
    /// The dictionary changed since the statement was planned.
    Replan,
    Refuse(Refusal),
}

impl Template {
    pub(crate) fn new(
        sql: &str,
        table: &PartitionedTable,
        version: u64,
        main_only: bool,
        form: Form,
    ) -> Template {
        Template {
            sql: sql.to_string(),
            table: Arc::new(table.table.clone()),
            version,
            default: table.default_target(),
            main_only,
            form,
            ids: Vec::new(),
            id_column: table.auto_column.as_ref().map(|a| a.name.clone()),
            upsert: None,
        }
    }

    pub(crate) fn with_upsert(self, upsert: Option<Upsert>) -> Template {
        Template { upsert, ..self }
    }

    /// A one-row INSERT ... ON DUPLICATE KEY UPDATE: whether the ids hscale
    /// binds went in shows in the answer.
    pub fn upsert(&self) -> Option<Upsert> {
        self.upsert
    }

    pub(crate) fn with_ids(self, ids: Vec<usize>) -> Template {
        Template { ids, ..self }
    }

    /// The parameters hscale binds to this instance's next AUTO_INCREMENT
    /// ids at each execution (indices among all the text's parameters; the
    /// client's are the others, in order).
    pub fn id_params(&self) -> &[usize] {
        &self.ids
    }

    /// The client's parameter at index `i` of the text's; `None` for one
    /// that hscale adds (`id_params`).
    pub fn client_param(&self, i: usize) -> Option<usize> {
        match self.ids.binary_search(&i) {
            Ok(_) => None,
            Err(before) => Some(i - before),
        }
    }

    /// The parameters this execution binds to this instance's next
    /// AUTO_INCREMENT ids, in text order: those hscale adds, and the
    /// client's whose value leaves the id to the server (NULL, or 0 without
    /// NO_AUTO_VALUE_ON_ZERO), which the partition table would count on
    /// its own. `client(k)` is the client's k-th value.
    pub fn ids_to_bind<'p>(
        &self,
        client: impl Fn(usize) -> Option<Value<'p>>,
        no_auto_value_on_zero: bool,
    ) -> Result<Vec<usize>, Refusal> {
        let mut ids = self.ids.clone();
        let (Form::Rows(rows), Some(column)) = (&self.form, &self.id_column) else {
            return Ok(ids);
        };
        for bound in &rows.ids {
            // Literals were read at PREPARE, and hscale's own are in `ids`.
            let Bound::Param(i) = *bound else { continue };
            let Some(k) = self.client_param(i) else {
                continue;
            };
            match client(k).and_then(|v| id_value(&v, no_auto_value_on_zero)) {
                Some(IdValue::Generated) => ids.push(i),
                Some(_) => {}
                None => return Err(not_an_id(column).refusal(Some((*self.table).clone()))),
            }
        }
        ids.sort_unstable();
        Ok(ids)
    }

    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// Whether it changes rows.
    pub fn writes(&self) -> bool {
        match &self.form {
            Form::Keys { shape, .. } => shape.writes,
            Form::Rows(_) => true,
            Form::Fixed(route) => route.writes,
        }
    }

    /// Whether any partition's value comes from a parameter.
    pub fn by_parameters(&self) -> bool {
        let param = |b: &Bound| matches!(b, Bound::Param(_));
        match &self.form {
            Form::Keys { keys, .. } => keys.iter().any(param),
            Form::Rows(rows) => rows.rows.iter().any(|r| param(&r.key)),
            Form::Fixed(_) => false,
        }
    }

    /// The run whose text PREPARE sends to learn the parameters and columns.
    pub fn describing_run(&self) -> Run {
        let target = match &self.form {
            Form::Fixed(route) => route.steps[0].target.clone(),
            _ => self.default.clone(),
        };
        Run {
            target,
            rows: None,
            scan: false,
        }
    }

    /// Where an execution goes, given the parameters' values (`param(i)`).
    pub fn route<'s, 'p: 's>(
        &'s self,
        dictionary: &Dictionary,
        main_backend: u32,
        param: impl Fn(usize) -> Result<Value<'p>, PlanError>,
    ) -> Routing {
        self.route_in(dictionary, main_backend, &[], param)
    }

    /// `route`, for a session whose open transaction ran on `passed_fences`
    /// (see `Context`).
    pub fn route_in<'s, 'p: 's>(
        &'s self,
        dictionary: &Dictionary,
        main_backend: u32,
        passed_fences: &[PhysicalId],
        param: impl Fn(usize) -> Result<Value<'p>, PlanError>,
    ) -> Routing {
        if dictionary.version != self.version {
            return Routing::Replan;
        }
        let Some(table) = dictionary.table(&self.table.db, &self.table.name) else {
            return Routing::Replan;
        };
        if table.locked() {
            return Routing::Wait(table.table.clone());
        }
        if let Form::Keys { shape, .. } = &self.form {
            if let Some(joined) = shape.locked_joined(dictionary) {
                return Routing::Wait(joined.clone());
            }
        }
        match self.execution(table, main_backend, param) {
            Ok(execution)
                if execution
                    .runs
                    .iter()
                    .any(|run| run.target.waits(passed_fences)) =>
            {
                Routing::Wait(table.table.clone())
            }
            Ok(execution) => Routing::Run(execution),
            Err(error) => Routing::Refuse(error.refusal(Some(table.table.clone()))),
        }
    }

    fn execution<'s, 'p: 's>(
        &'s self,
        table: &PartitionedTable,
        main_backend: u32,
        param: impl Fn(usize) -> Result<Value<'p>, PlanError>,
    ) -> Result<Execution, PlanError> {
        let value = |bound: &'s Bound| -> Result<Value<'s>, PlanError> {
            match bound {
                Bound::Literal(value) => Ok(value.reborrow()),
                Bound::Param(i) => param(*i),
            }
        };
        let execution = match &self.form {
            Form::Keys {
                shape,
                keys,
                same_partition,
            } => {
                for (a, b) in same_partition {
                    let partition = |bound| {
                        table.target_for(&value(bound)?).map_err(|e| {
                            PlanError::Refuse(format!(
                                "the value of partition column `{}`: {e}",
                                table.column
                            ))
                        })
                    };
                    if partition(a)? != partition(b)? {
                        return Err(PlanError::Refuse(format!(
                            "a join whose tables' partition columns equal values of different partitions of {}",
                            table.table
                        )));
                    }
                }
                let values = keys
                    .iter()
                    .map(&value)
                    .collect::<Result<SmallVec<[Value; 2]>, PlanError>>()?;
                let (targets, merge) = shape.targets(table, main_backend, &values)?;
                let scan = targets.len() > 1 && !shape.scan_edits.is_empty();
                Execution {
                    runs: targets
                        .into_iter()
                        .map(|target| Run {
                            target,
                            rows: None,
                            scan,
                        })
                        .collect(),
                    merge,
                    writes: shape.writes,
                }
            }
            Form::Rows(rows) => {
                let values = rows
                    .rows
                    .iter()
                    .map(|r| value(&r.key))
                    .collect::<Result<Vec<Value>, PlanError>>()?;
                let placed = rows.place(table, &values)?;
                check_others(rows.others, placed.iter().map(|(t, _)| t), main_backend)?;
                let whole = placed.len() == 1;
                Execution {
                    merge: rows_merge(placed.len()),
                    runs: placed
                        .into_iter()
                        .map(|(target, rows)| Run {
                            target,
                            rows: (!whole).then_some(rows),
                            scan: false,
                        })
                        .collect(),
                    writes: true,
                }
            }
            Form::Fixed(route) => Execution {
                runs: route
                    .steps
                    .iter()
                    .map(|s| Run {
                        target: s.target.clone(),
                        rows: None,
                        scan: false,
                    })
                    .collect(),
                merge: route.merge.clone(),
                writes: route.writes,
            },
        };
        let targets = execution.runs.iter().map(|r| &r.target);
        crate::route::check_main_only(self.main_only, targets, main_backend)?;
        Ok(execution)
    }

    /// The highest id an INSERT gives the table's AUTO_INCREMENT column,
    /// `client(k)` the client's k-th value: the sequence moves past it.
    pub fn highest_id<'p>(&self, client: impl Fn(usize) -> Option<Value<'p>>) -> Option<u64> {
        match &self.form {
            Form::Rows(rows) => rows.highest_id(|i| self.client_param(i).and_then(&client)),
            _ => None,
        }
    }

    /// The statement a run prepares on its backend.
    pub fn text(&self, run: &Run) -> Result<String, PlanError> {
        match &self.form {
            Form::Keys { shape, .. } => apply_edits(
                &self.sql,
                shape.edits_for(run.scan, bytes),
                &run.target,
                &mut Splices::default(),
                bytes,
            ),
            Form::Rows(rows) => {
                let all: Vec<u32> = (0..rows.rows.len() as u32).collect();
                let taken = run.rows.as_deref().unwrap_or(&all);
                rows.text(&self.sql, &run.target, taken)
            }
            Form::Fixed(route) => route
                .steps
                .iter()
                .find(|s| s.target == run.target)
                .map(|s| s.sql.clone())
                .ok_or_else(|| PlanError::refuse("a partition the statement was not planned for")),
        }
    }

    /// The parameters a run's text has, of the statement's `count`: `None`
    /// when it has them all.
    pub fn params(&self, run: &Run, count: usize) -> Option<Vec<usize>> {
        let (Form::Rows(rows), Some(taken)) = (&self.form, &run.rows) else {
            return None;
        };
        let first = rows.rows.first()?.params.start;
        let last = rows.rows.last()?.params.end;
        let mut params: Vec<usize> = (0..first).collect();
        for &r in taken {
            params.extend(rows.rows[r as usize].params.clone());
        }
        params.extend(last..count);
        Some(params)
    }
}

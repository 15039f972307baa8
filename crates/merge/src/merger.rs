//! The merger: one result set out of the partitions' result sets, fed one
//! event at a time. It holds at most one row per partition (an ordered
//! merge) or the rows pushed since the last pop (a concatenation), so memory
//! stays bounded however many rows pass.

use std::cmp::Ordering;
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use mysql_common::constants::ColumnFlags;
use mysql_common::io::ParseBuf;
use mysql_common::packets::Column;
use smallvec::SmallVec;

use crate::aggregate::{self, Calc, Combine, Fold, Having, Partial};
use crate::kept::{Budget, Kept, Ranked};
use crate::order::{Collations, Decoded, KeyOrder};
use crate::rows::{self, Encoding};

/// What the merge does, decided when the statement was planned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Spec {
    /// ORDER BY keys, most significant first; none: rows in arrival order.
    pub keys: Vec<SortKey>,
    /// Rows skipped before the first one sent (OFFSET).
    pub offset: u64,
    /// Rows sent at most (LIMIT).
    pub limit: Option<u64>,
    /// Columns after the client's that hscale added for itself; never sent.
    pub hidden: usize,
    /// A grouped answer (GROUP BY, aggregates, DISTINCT): how each of the
    /// client's columns combines the rows of one group, which are the rows
    /// whose keys are equal (all rows, without keys).
    pub groups: Option<Vec<Combine>>,
    /// HAVING, applied to the combined groups.
    pub having: Option<Box<Having>>,
    /// ORDER BY the combined groups' columns, where the partitions could
    /// only sort by the group keys: hscale keeps the first OFFSET + LIMIT
    /// groups in this order.
    pub reorder: Vec<Reorder>,
    /// The expressions of `Combine::Calc` columns. `groups` then covers
    /// hidden columns too: the aggregates the expressions read.
    pub calcs: Vec<Calc>,
}

impl Spec {
    /// Whether a group's row is its first row (without the hidden columns):
    /// every column a GROUP BY key or a value any row gives (DISTINCT), no
    /// aggregate, nothing computed, no HAVING.
    fn first_row_is_the_group(&self) -> bool {
        let firsts = |combines: &Vec<Combine>| combines.iter().all(|&c| c == Combine::First);
        self.groups.as_ref().is_some_and(firsts) && self.calcs.is_empty() && self.having.is_none()
    }
}

/// One ORDER BY key over combined groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reorder {
    /// The client's column it sorts by.
    pub column: usize,
    pub descending: bool,
    /// The group key (an index of `Spec::keys`) that is the same
    /// expression: the group's first row carries its weight, which strings
    /// compare by; a combined row carries none.
    pub group_key: Option<usize>,
}

/// One ORDER BY key: where its value is, and the positions among the
/// hidden columns of its `WEIGHT_STRING`, which strings with a collation
/// compare by, and of its `COLLATION()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SortKey {
    pub value: Place,
    pub weight: usize,
    pub collation: usize,
    pub descending: bool,
}

/// A column of a partition's answer: one of the client's (a key that is a
/// selected column needs no copy), or one hscale added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    Visible(usize),
    Hidden(usize),
}

/// The name hscale gives the hidden column at `position` among them.
pub fn hidden_name(position: usize) -> String {
    format!("`__hscale_{position}`")
}

impl Place {
    /// How an ORDER BY of the partition's statement names it: by position
    /// (a selected column's name may be an expression), or by name.
    pub fn order_term(self) -> String {
        match self {
            Place::Visible(i) => (i + 1).to_string(),
            Place::Hidden(i) => hidden_name(i),
        }
    }

    /// Its index among all the columns, `visible` of them the client's.
    pub fn index(self, visible: usize) -> usize {
        match self {
            Place::Visible(i) => i,
            Place::Hidden(i) => visible + i,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MergeError {
    /// A merge hscale cannot do exactly (refused, never guessed).
    #[error("{0}")]
    Unsupported(String),
    /// Partitions that describe their columns differently: their tables no
    /// longer have the same definition.
    #[error("partitions answer with different columns: {0}")]
    ColumnsDiffer(String),
    #[error("a partition sent a malformed row ({0})")]
    Malformed(&'static str),
    /// The groups an ORDER BY over them keeps outgrew the disk budget.
    #[error("the merge of several partitions needs more than {0} bytes of temporary files")]
    Budget(u64),
    #[error("a temporary file of the merge failed: {0}")]
    Spill(String),
}

/// What the merger wants or gives next.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// A row for the client: the backend's packet without hidden columns.
    Row(Bytes),
    /// Nothing can be sent before this partition's next event.
    Need(usize),
    /// The next event of any partition that has not ended.
    NeedAny,
    /// Every row is sent (or the LIMIT reached): what partitions still send
    /// is not needed.
    Done,
}

#[derive(Debug)]
enum Source {
    /// Its column definitions have not come yet.
    Starting,
    /// Its rows come (an ordered merge keeps its next one in `heads`).
    Open,
    Ended,
}

#[derive(Debug, Clone)]
struct Head {
    row: Bytes,
    /// What each key compares: the value's or the weight's bytes, decoded;
    /// `None`: NULL.
    keys: SmallVec<[Option<KeyValue>; 2]>,
}

/// A key's bytes in its row, and what comparisons read of them.
pub(crate) type KeyValue = (Range<usize>, Decoded);

#[derive(Debug)]
struct Header {
    definitions: Vec<Bytes>,
    columns: Vec<Column>,
    /// One partition's own definitions, not a union's.
    exact: bool,
    orders: Vec<KeyOrder>,
    /// How each of `Spec::reorder` compares that is not a group key (a
    /// group key compares as its `orders` entry, once its rows taught it
    /// the collation).
    reorders: Vec<KeyOrder>,
}

impl Header {
    fn new(
        spec: &Spec,
        definitions: Vec<Bytes>,
        columns: Vec<Column>,
        exact: bool,
    ) -> Result<Header, MergeError> {
        let visible = columns.len() - spec.hidden;
        let orders: Vec<KeyOrder> = spec
            .keys
            .iter()
            .map(|key| {
                let column = columns
                    .get(key.value.index(visible))
                    .ok_or(MergeError::Malformed("a sort key column"))?;
                KeyOrder::of(column)
            })
            .collect::<Result<_, _>>()?;
        let reorders = spec
            .reorder
            .iter()
            .map(|key| match key.group_key {
                Some(k) => orders
                    .get(k)
                    .cloned()
                    .ok_or(MergeError::Malformed("a group key")),
                None => {
                    let column = columns
                        .get(key.column)
                        .ok_or(MergeError::Malformed("an ORDER BY column"))?;
                    let order = KeyOrder::of(column)?;
                    match order.by_weight() {
                        true => Err(MergeError::Unsupported(
                            "ORDER BY a string that is not a group key over the combined groups of several partitions"
                                .into(),
                        )),
                        false => Ok(order),
                    }
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(Header {
            definitions,
            columns,
            exact,
            orders,
            reorders,
        })
    }
}

/// The group being combined: its first row decides its keys.
#[derive(Debug)]
struct Group {
    first: Head,
    rows: Vec<Bytes>,
    partials: Vec<Partial>,
    /// How MIN and MAX compare, per column, once known.
    orders: Vec<Option<KeyOrder>>,
}

/// What comes next from the partitions.
enum Input {
    Row(Head),
    Wait(Next),
    End,
}

#[derive(Debug)]
pub struct Merger {
    encoding: Encoding,
    /// With `Spec::reorder`: the groups that may be among the first.
    kept: Option<Kept>,
    budget: Budget,
    group: Option<Group>,
    spec: Spec,
    collations: Arc<Collations>,
    sources: Vec<Source>,
    /// Each partition's next row, in an ordered merge.
    heads: Vec<Option<Head>>,
    header: Option<Header>,
    /// Rows of a concatenation not yet popped.
    queue: VecDeque<Bytes>,
    skipped: u64,
    sent: u64,
    /// Rows have come: the header's definitions may be out.
    rows_fed: bool,
}

impl Merger {
    pub fn new(
        spec: Spec,
        partitions: usize,
        collations: Arc<Collations>,
        encoding: Encoding,
    ) -> Merger {
        Merger {
            encoding,
            kept: None,
            group: None,
            spec,
            collations,
            sources: (0..partitions).map(|_| Source::Starting).collect(),
            heads: (0..partitions).map(|_| None).collect(),
            header: None,
            queue: VecDeque::new(),
            skipped: 0,
            sent: 0,
            rows_fed: false,
            budget: Budget::default(),
        }
    }

    /// How much the merge may hold in memory and spill to temporary files.
    pub fn with_budget(self, budget: Budget) -> Merger {
        Merger { budget, ..self }
    }

    /// A partition's column definitions (without the count or EOF packets).
    /// The first partition's are the client's (see `client_columns`);
    /// every other must agree.
    pub fn columns(&mut self, partition: usize, definitions: Vec<Bytes>) -> Result<(), MergeError> {
        self.take_columns(partition, definitions, true)
    }

    /// The column definitions of a `UNION ALL` of several partitions (on one
    /// backend): they name no table and carry other flags, so they stand for
    /// what reading the rows needs, and the client gets another partition's
    /// where one answers alone.
    pub fn union_columns(
        &mut self,
        partition: usize,
        definitions: Vec<Bytes>,
    ) -> Result<(), MergeError> {
        self.take_columns(partition, definitions, false)
    }

    fn take_columns(
        &mut self,
        partition: usize,
        definitions: Vec<Bytes>,
        exact: bool,
    ) -> Result<(), MergeError> {
        let columns = definitions
            .iter()
            .map(|d| {
                ParseBuf(d)
                    .parse::<Column>(())
                    .map_err(|_| MergeError::Malformed("a column definition"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if columns.len() < self.spec.hidden {
            return Err(MergeError::Malformed("fewer columns than hscale added"));
        }
        let replaces = match &self.header {
            None => true,
            Some(first) => {
                agree(
                    &first.columns,
                    &columns,
                    self.spec.hidden,
                    first.exact && exact,
                )?;
                exact && !first.exact && !self.rows_fed
            }
        };
        if replaces {
            self.header = Some(Header::new(&self.spec, definitions, columns, exact)?);
        }
        self.sources[partition] = Source::Open;
        Ok(())
    }

    /// How many columns at the end of each partition's answer are hscale's.
    pub fn hidden_columns(&self) -> usize {
        self.spec.hidden
    }

    /// The column definitions the client gets, without hidden columns: the
    /// first partition's that answered alone (`columns`) before any row
    /// came, else the first union's.
    pub fn client_columns(&self) -> &[Bytes] {
        match &self.header {
            Some(header) => &header.definitions[..header.definitions.len() - self.spec.hidden],
            None => &[],
        }
    }

    /// A row of a partition.
    pub fn row(&mut self, partition: usize, row: Bytes) -> Result<(), MergeError> {
        let header = self
            .header
            .as_mut()
            .ok_or(MergeError::Malformed("a row before the columns"))?;
        self.rows_fed = true;
        if self.spec.keys.is_empty() {
            self.queue.push_back(row);
            return Ok(());
        }
        let total = header.columns.len();
        let visible = total - self.spec.hidden;
        let values = rows::values(&row, &header.columns, self.encoding)
            .ok_or(MergeError::Malformed("a row"))?
            .values;
        let mut keys = SmallVec::new();
        for (key, order) in self.spec.keys.iter().zip(&mut header.orders) {
            if let Some(name) = &values[visible + key.collation] {
                order.learn(&row[name.clone()], &self.collations)?;
            }
            keys.push(sort_value(
                key,
                order,
                &row,
                &values,
                visible,
                self.encoding,
            )?);
        }
        match (&self.sources[partition], &mut self.heads[partition]) {
            (Source::Open, head @ None) => *head = Some(Head { row, keys }),
            _ => return Err(MergeError::Malformed("a row out of turn")),
        }
        Ok(())
    }

    /// A partition's result set ended.
    pub fn end(&mut self, partition: usize) {
        self.sources[partition] = Source::Ended;
    }

    /// Whether the LIMIT is reached.
    fn full(&self) -> bool {
        self.spec.limit.is_some_and(|limit| self.sent >= limit)
    }

    pub fn step(&mut self) -> Result<Next, MergeError> {
        loop {
            if self.full() {
                return Ok(Next::Done);
            }
            let row = match (self.input()?, self.spec.groups.is_some()) {
                (Input::Wait(next), _) => return Ok(next),
                (Input::End, false) => return Ok(Next::Done),
                (Input::End, true) => match self.group.take() {
                    Some(done) => match self.finished(done)? {
                        Some(row) => row,
                        None => continue,
                    },
                    None => match self.next_kept()? {
                        Some(row) => row,
                        None => return Ok(Next::Done),
                    },
                },
                (Input::Row(head), false) => self.without_hidden(head.row)?,
                (Input::Row(head), true) => match self.group_row(head)? {
                    Some(done) => match self.finished(done)? {
                        Some(row) => row,
                        None => continue,
                    },
                    None => continue,
                },
            };
            if self.skipped < self.spec.offset {
                self.skipped += 1;
                continue;
            }
            self.sent += 1;
            return Ok(Next::Row(row));
        }
    }

    /// The next row from the partitions in the merge's order, or what it
    /// waits for.
    fn input(&mut self) -> Result<Input, MergeError> {
        if self.spec.keys.is_empty() {
            return Ok(match self.queue.pop_front() {
                Some(row) => Input::Row(Head {
                    row,
                    keys: SmallVec::new(),
                }),
                None if self.sources.iter().any(|s| !matches!(s, Source::Ended)) => {
                    Input::Wait(Next::NeedAny)
                }
                None => Input::End,
            });
        }
        Ok(match self.lowest()? {
            Ok(Some(partition)) => {
                let head = self.heads[partition].take();
                Input::Row(head.expect("lowest names a partition with a row"))
            }
            Ok(None) => Input::End,
            Err(waiting) => Input::Wait(Next::Need(waiting)),
        })
    }

    /// Folds a row into the current group; a row of the next group finishes
    /// it, which is returned.
    fn group_row(&mut self, head: Head) -> Result<Option<Group>, MergeError> {
        if let Some(group) = &self.group {
            if self.compare(&head, &group.first)? == Ordering::Equal {
                let mut group = self.group.take().expect("checked above");
                let folded = self.fold(&mut group, head.row);
                self.group = Some(group);
                return folded.map(|()| None);
            }
        }
        let combines = match self.spec.first_row_is_the_group() {
            true => &[],
            false => self.spec.groups.as_deref().unwrap_or_default(),
        };
        let mut group = Group {
            rows: Vec::new(),
            partials: combines.iter().map(|&c| Partial::start(c)).collect(),
            orders: combines.iter().map(|_| None).collect(),
            first: Head {
                row: head.row.clone(),
                keys: head.keys,
            },
        };
        self.fold(&mut group, head.row)?;
        Ok(self.group.replace(group))
    }

    fn fold(&self, group: &mut Group, row: Bytes) -> Result<(), MergeError> {
        if self.spec.first_row_is_the_group() {
            return Ok(());
        }
        let header = self.header.as_ref().expect("rows come after columns");
        let total = header.columns.len();
        let values = rows::values(&row, &header.columns, self.encoding)
            .ok_or(MergeError::Malformed("a row"))?
            .values;
        group.rows.push(row);
        let combines = self.spec.groups.as_deref().unwrap_or_default();
        aggregate::fold(
            &mut group.partials,
            combines,
            &mut group.orders,
            &group.rows,
            group.rows.len() - 1,
            &values,
            &Fold {
                columns: &header.columns,
                visible: total - self.spec.hidden,
                collations: &self.collations,
                encoding: self.encoding,
            },
        )
    }

    /// A finished group's row for the client now, or `None`: HAVING
    /// dropped it, or it waits among the kept groups of a reordered answer.
    fn finished(&mut self, group: Group) -> Result<Option<Bytes>, MergeError> {
        if self.spec.reorder.is_empty() {
            return self.finish(group);
        }
        let first = group.first.clone();
        if let Some(row) = self.finish(group)? {
            let ranked = self.rank(row, first.row, Some(&first.keys))?;
            let mut kept = self.kept.take().unwrap_or_else(|| {
                let keep = self
                    .spec
                    .offset
                    .saturating_add(self.spec.limit.unwrap_or(u64::MAX));
                Kept::new(keep, self.budget.clone())
            });
            let pushed = kept.push(ranked, &|a, b| self.compare_ranked(a, b));
            self.kept = Some(kept);
            pushed?;
        }
        Ok(None)
    }

    /// The next of the kept groups, once every group has come.
    fn next_kept(&mut self) -> Result<Option<Bytes>, MergeError> {
        let Some(mut kept) = self.kept.take() else {
            return Ok(None);
        };
        let compare = |a: &Ranked, b: &Ranked| self.compare_ranked(a, b);
        let rank = |row, first| self.rank(row, first, None);
        let next = match kept.is_draining() {
            true => kept.next(&compare, &rank),
            false => kept
                .drain(&compare, &rank)
                .and_then(|()| kept.next(&compare, &rank)),
        };
        self.kept = Some(kept);
        next
    }

    /// What a combined group's reorder keys compare: the client's column in
    /// `row`, or a group key in `first` (its keys decoded already when known).
    fn rank(
        &self,
        row: Bytes,
        first: Bytes,
        first_keys: Option<&SmallVec<[Option<KeyValue>; 2]>>,
    ) -> Result<Ranked, MergeError> {
        let header = self.header.as_ref().expect("rows come after columns");
        let visible = header.columns.len() - self.spec.hidden;
        let values = rows::values(&row, &header.columns[..visible], self.encoding)
            .ok_or(MergeError::Malformed("a row"))?
            .values;
        let first_values = match first_keys {
            Some(_) => Default::default(),
            None => {
                rows::values(&first, &header.columns, self.encoding)
                    .ok_or(MergeError::Malformed("a row"))?
                    .values
            }
        };
        let mut keys = SmallVec::new();
        for (key, order) in self.spec.reorder.iter().zip(&header.reorders) {
            keys.push(match (key.group_key, first_keys) {
                (Some(k), Some(first_keys)) => first_keys[k].clone(),
                (Some(k), None) => sort_value(
                    &self.spec.keys[k],
                    &header.orders[k],
                    &first,
                    &first_values,
                    visible,
                    self.encoding,
                )?,
                (None, _) => match &values[key.column] {
                    Some(range) => Some((
                        range.clone(),
                        order.decode(&row[range.clone()], self.encoding)?,
                    )),
                    None => None,
                },
            });
        }
        Ok(Ranked { keys, row, first })
    }

    /// The client's ORDER BY over two combined groups.
    fn compare_ranked(&self, a: &Ranked, b: &Ranked) -> Ordering {
        let header = self.header.as_ref().expect("rows come after columns");
        for (i, (key, order)) in self.spec.reorder.iter().zip(&header.reorders).enumerate() {
            // A group key compares as the merge's own key does, with the
            // collation its rows taught it (PAD SPACE: `'Z'` = `'z '`).
            let (a_bytes, b_bytes, order) = match key.group_key {
                Some(k) => (&a.first, &b.first, &header.orders[k]),
                None => (&a.row, &b.row, order),
            };
            let ordering = match (&a.keys[i], &b.keys[i]) {
                (None, None) => Ordering::Equal,
                (None, Some(_)) => Ordering::Less,
                (Some(_), None) => Ordering::Greater,
                (Some((x, dx)), Some((y, dy))) => {
                    order.compare_decoded((*dx, &a_bytes[x.clone()]), (*dy, &b_bytes[y.clone()]))
                }
            };
            let ordering = if key.descending {
                ordering.reverse()
            } else {
                ordering
            };
            if ordering != Ordering::Equal {
                return ordering;
            }
        }
        Ordering::Equal
    }

    /// The row one table would give for a group, unless HAVING drops it.
    fn finish(&self, group: Group) -> Result<Option<Bytes>, MergeError> {
        if self.spec.first_row_is_the_group() {
            return self.without_hidden(group.first.row).map(Some);
        }
        let header = self.header.as_ref().expect("rows come after columns");
        let mut values =
            aggregate::finish(&group.partials, &group.rows, &header.columns, self.encoding)?;
        let visible = header.columns.len() - self.spec.hidden;
        if !self.spec.calcs.is_empty() {
            aggregate::calculate(
                &mut values,
                self.spec.groups.as_deref().unwrap_or_default(),
                &self.spec.calcs,
                &header.columns,
                visible,
                self.encoding,
            )?;
        }
        values.truncate(visible);
        if let Some(having) = &self.spec.having {
            if having.holds(&values, &header.columns, self.encoding)? != Some(true) {
                return Ok(None);
            }
        }
        let columns = &header.columns[..values.len()];
        Ok(Some(Bytes::from(rows::write_row(
            &values,
            columns,
            self.encoding,
        ))))
    }

    /// The partition whose row comes next (`None`: all ended), or
    /// `Err(partition)` when one has not sent its next row yet.
    fn lowest(&self) -> Result<Result<Option<usize>, usize>, MergeError> {
        let mut lowest: Option<(usize, &Head)> = None;
        for (i, source) in self.sources.iter().enumerate() {
            let head = match source {
                Source::Ended => continue,
                Source::Starting => return Ok(Err(i)),
                Source::Open => match &self.heads[i] {
                    Some(head) => head,
                    None => return Ok(Err(i)),
                },
            };
            lowest = match lowest {
                Some((_, best)) if self.compare(head, best)? != Ordering::Less => lowest,
                _ => Some((i, head)),
            };
        }
        Ok(Ok(lowest.map(|(i, _)| i)))
    }

    fn compare(&self, a: &Head, b: &Head) -> Result<Ordering, MergeError> {
        let header = self.header.as_ref().expect("rows come after columns");
        for ((key, order), (x, y)) in self
            .spec
            .keys
            .iter()
            .zip(&header.orders)
            .zip(a.keys.iter().zip(&b.keys))
        {
            // NULL sorts first, as in MariaDB.
            let ordering = match (x, y) {
                (None, None) => Ordering::Equal,
                (None, Some(_)) => Ordering::Less,
                (Some(_), None) => Ordering::Greater,
                (Some((x, dx)), Some((y, dy))) => {
                    order.compare_decoded((*dx, &a.row[x.clone()]), (*dy, &b.row[y.clone()]))
                }
            };
            let ordering = if key.descending {
                ordering.reverse()
            } else {
                ordering
            };
            if ordering != Ordering::Equal {
                return Ok(ordering);
            }
        }
        Ok(Ordering::Equal)
    }

    fn without_hidden(&self, row: Bytes) -> Result<Bytes, MergeError> {
        if self.spec.hidden == 0 {
            return Ok(row);
        }
        let header = self.header.as_ref().expect("rows come after columns");
        rows::without_hidden(&row, &header.columns, self.spec.hidden, self.encoding)
            .ok_or(MergeError::Malformed("a row"))
    }
}

/// Whether two partitions' columns are the same (their tables' names and
/// the flags of their plans aside). Between two partitions
/// that answer alone (`exact`): their columns wholly, and of hscale's
/// `hidden` columns at the end what reading them needs. Where a `UNION` of
/// partitions takes part, whose definitions have other flags and decimals
/// and may give a weight a character set: what reading the client's columns
/// needs, and hscale's by name.
fn agree(first: &[Column], other: &[Column], hidden: usize, exact: bool) -> Result<(), MergeError> {
    if first.len() != other.len() {
        return Err(MergeError::ColumnsDiffer(format!(
            "{} columns and {}",
            first.len(),
            other.len()
        )));
    }
    let visible = first.len().saturating_sub(hidden);
    for (i, (a, b)) in first.iter().zip(other).enumerate() {
        let named_alike = a.name_ref() == b.name_ref();
        let read_alike = || {
            a.column_type() == b.column_type()
                && a.character_set() == b.character_set()
                && a.flags().contains(ColumnFlags::UNSIGNED_FLAG)
                    == b.flags().contains(ColumnFlags::UNSIGNED_FLAG)
        };
        let same_otherwise =
            || a.flags() - PLAN_FLAGS == b.flags() - PLAN_FLAGS && a.decimals() == b.decimals();
        let same = named_alike
            && match (i < visible, exact) {
                (true, true) => read_alike() && same_otherwise(),
                (true, false) | (false, true) => read_alike(),
                (false, false) => true,
            };
        if !same {
            return Err(MergeError::ColumnsDiffer(format!(
                "column `{}`",
                a.name_str()
            )));
        }
    }
    Ok(())
}

/// Flags that describe the keys and defaults of the column's table, which
/// MariaDB reports or leaves out by the plan it chose (a semi-join read
/// through a temporary table has none), so partitions with other rows
/// answer the same statement with and without them.
const PLAN_FLAGS: ColumnFlags = ColumnFlags::PRI_KEY_FLAG
    .union(ColumnFlags::UNIQUE_KEY_FLAG)
    .union(ColumnFlags::MULTIPLE_KEY_FLAG)
    .union(ColumnFlags::PART_KEY_FLAG)
    .union(ColumnFlags::NO_DEFAULT_VALUE_FLAG)
    .union(ColumnFlags::AUTO_INCREMENT_FLAG)
    .union(ColumnFlags::ON_UPDATE_NOW_FLAG);

/// What an ORDER BY or group key compares in a row with hidden columns:
/// its weight (collated strings) or its value, decoded; `None`: NULL.
fn sort_value(
    key: &SortKey,
    order: &KeyOrder,
    row: &Bytes,
    values: &[Option<Range<usize>>],
    visible: usize,
    encoding: Encoding,
) -> Result<Option<KeyValue>, MergeError> {
    let at = match order.by_weight() {
        true => visible + key.weight,
        false => key.value.index(visible),
    };
    match &values[at] {
        Some(range) => Ok(Some((
            range.clone(),
            order.decode(&row[range.clone()], encoding)?,
        ))),
        None => Ok(None),
    }
}

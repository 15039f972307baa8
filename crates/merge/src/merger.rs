//! The merger: one result set out of the partitions' result sets, fed one
//! event at a time. It holds at most one row per partition (an ordered
//! merge) or the rows pushed since the last pop (a concatenation), so memory
//! stays bounded however many rows pass.

use std::cmp::Ordering;
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use mysql_common::io::ParseBuf;
use mysql_common::packets::Column;
use smallvec::SmallVec;

use crate::aggregate::{self, Combine, Fold, Having, Partial};
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

/// One ORDER BY key: positions among the hidden columns of its value, of
/// its `WEIGHT_STRING`, which strings with a collation compare by, and of its
/// `COLLATION()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SortKey {
    pub value: usize,
    pub weight: usize,
    pub collation: usize,
    pub descending: bool,
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
type KeyValue = (Range<usize>, Decoded);

#[derive(Debug)]
struct Header {
    definitions: Vec<Bytes>,
    columns: Vec<Column>,
    orders: Vec<KeyOrder>,
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

/// A combined group kept for a reordered answer: what each reorder key
/// compares (in `row`, or in `first`, the group's first row, for a group
/// key), and the client's row.
#[derive(Debug)]
struct Ranked {
    keys: SmallVec<[Option<KeyValue>; 2]>,
    row: Bytes,
    first: Bytes,
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
    /// With `Spec::reorder`: the best groups so far, in order, and whether
    /// they are being sent.
    top: Vec<Ranked>,
    top_sent: bool,
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
            top: Vec::new(),
            top_sent: false,
            group: None,
            spec,
            collations,
            sources: (0..partitions).map(|_| Source::Starting).collect(),
            heads: (0..partitions).map(|_| None).collect(),
            header: None,
            queue: VecDeque::new(),
            skipped: 0,
            sent: 0,
        }
    }

    /// A partition's column definitions (without the count or EOF packets).
    /// The first partition's are the client's; every other must agree.
    pub fn columns(&mut self, partition: usize, definitions: Vec<Bytes>) -> Result<(), MergeError> {
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
        match &self.header {
            None => {
                let visible = columns.len() - self.spec.hidden;
                let orders = self
                    .spec
                    .keys
                    .iter()
                    .map(|key| {
                        let column = columns
                            .get(visible + key.value)
                            .ok_or(MergeError::Malformed("a sort key column"))?;
                        KeyOrder::of(column)
                    })
                    .collect::<Result<_, _>>()?;
                self.header = Some(Header {
                    definitions,
                    columns,
                    orders,
                });
            }
            Some(first) => agree(&first.columns, &columns)?,
        }
        self.sources[partition] = Source::Open;
        Ok(())
    }

    /// The column definitions the client gets: the first partition's,
    /// without hidden columns.
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
            let at = visible
                + if order.by_weight() {
                    key.weight
                } else {
                    key.value
                };
            let key = match &values[at] {
                Some(range) => Some((
                    range.clone(),
                    order.decode(&row[range.clone()], self.encoding)?,
                )),
                None => None,
            };
            keys.push(key);
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
                    None if !self.spec.reorder.is_empty() && !self.top.is_empty() => {
                        self.top_sent = true;
                        self.top.remove(0).row
                    }
                    None => return Ok(Next::Done),
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
        let combines = self.spec.groups.as_deref().unwrap_or_default();
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
    /// dropped it, or it waits among the first groups of a reordered answer.
    fn finished(&mut self, group: Group) -> Result<Option<Bytes>, MergeError> {
        if self.spec.reorder.is_empty() || self.top_sent {
            return self.finish(group);
        }
        let first = group.first.clone();
        if let Some(row) = self.finish(group)? {
            self.keep_if_among_the_first(row, first)?;
        }
        Ok(None)
    }

    /// How a reorder key compares, and which row's bytes: a group key's
    /// weight in the group's first row, else the client's column (numbers
    /// and times: a string's weight is not in a combined row).
    fn reorder_order(&self, key: &Reorder) -> Result<KeyOrder, MergeError> {
        let header = self.header.as_ref().expect("rows come after columns");
        if let Some(k) = key.group_key {
            return Ok(header.orders[k].clone());
        }
        let order = KeyOrder::of(&header.columns[key.column])?;
        match order.by_weight() {
            true => Err(MergeError::Unsupported(
                "ORDER BY a string that is not a group key over the combined groups of several partitions"
                    .into(),
            )),
            false => Ok(order),
        }
    }

    /// Keeps a combined group's row if it is among the first OFFSET + LIMIT
    /// in the client's ORDER BY.
    fn keep_if_among_the_first(&mut self, row: Bytes, first: Head) -> Result<(), MergeError> {
        let header = self.header.as_ref().expect("rows come after columns");
        let visible = header.columns.len() - self.spec.hidden;
        let values = rows::values(&row, &header.columns[..visible], self.encoding)
            .ok_or(MergeError::Malformed("a row"))?
            .values;
        let mut keys = SmallVec::new();
        let mut orders = Vec::new();
        for key in &self.spec.reorder {
            let order = self.reorder_order(key)?;
            keys.push(match key.group_key {
                Some(k) => first.keys[k].clone(),
                None => match &values[key.column] {
                    Some(range) => Some((
                        range.clone(),
                        order.decode(&row[range.clone()], self.encoding)?,
                    )),
                    None => None,
                },
            });
            orders.push(order);
        }
        let ranked = Ranked {
            keys,
            row,
            first: first.row,
        };
        let compare = |a: &Ranked, b: &Ranked| {
            for (i, (key, order)) in self.spec.reorder.iter().zip(&orders).enumerate() {
                let (a_bytes, b_bytes) = match key.group_key {
                    Some(_) => (&a.first, &b.first),
                    None => (&a.row, &b.row),
                };
                let ordering = match (&a.keys[i], &b.keys[i]) {
                    (None, None) => Ordering::Equal,
                    (None, Some(_)) => Ordering::Less,
                    (Some(_), None) => Ordering::Greater,
                    (Some((x, dx)), Some((y, dy))) => order
                        .compare_decoded((*dx, &a_bytes[x.clone()]), (*dy, &b_bytes[y.clone()])),
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
        };
        // After the equal ones already kept: the first group to come stays first.
        let at = self
            .top
            .partition_point(|kept| compare(kept, &ranked) != Ordering::Greater);
        let keep = self
            .spec
            .offset
            .saturating_add(self.spec.limit.unwrap_or(u64::MAX));
        if (at as u64) < keep {
            self.top.insert(at, ranked);
            self.top
                .truncate(usize::try_from(keep).unwrap_or(usize::MAX));
        }
        Ok(())
    }

    /// The row one table would give for a group, unless HAVING drops it.
    fn finish(&self, group: Group) -> Result<Option<Bytes>, MergeError> {
        let header = self.header.as_ref().expect("rows come after columns");
        let values =
            aggregate::finish(&group.partials, &group.rows, &header.columns, self.encoding)?;
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

/// Column definitions of two partitions describe the same columns (their
/// tables' names aside).
fn agree(first: &[Column], other: &[Column]) -> Result<(), MergeError> {
    if first.len() != other.len() {
        return Err(MergeError::ColumnsDiffer(format!(
            "{} columns and {}",
            first.len(),
            other.len()
        )));
    }
    for (a, b) in first.iter().zip(other) {
        let same = a.name_ref() == b.name_ref()
            && a.column_type() == b.column_type()
            && a.character_set() == b.character_set()
            && a.flags() == b.flags()
            && a.decimals() == b.decimals();
        if !same {
            return Err(MergeError::ColumnsDiffer(format!(
                "column `{}`",
                a.name_str()
            )));
        }
    }
    Ok(())
}

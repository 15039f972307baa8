//! The partition dictionary as the router reads it: an immutable snapshot of
//! the partitioned tables, their partitions and the version it was loaded at.
//! The proxy loads it from schema `hscale` on the main backend and swaps it in
//! whole; nothing here changes after `Dictionary::new`.

use crate::collation::Folding;
use crate::error::PlanError;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::hashing::{ColumnKind, HashError, HashFunction, Value};

/// Where a partition is in its life. Only `Active` partitions exist for
/// clients alone; the others belong to a move in progress, during which the
/// whole table is locked (statements on it wait).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionState {
    Active,
    /// ADD_PARTITION is copying rows out of the default table; the default
    /// table still holds them.
    Copying,
    /// ADD_PARTITION has copied every row: the partition holds them, the
    /// copies left in the default table are being deleted.
    Cleaning,
    /// DROP_PARTITION is copying rows back; the partition still holds them.
    Draining,
    /// DROP_PARTITION has copied every row back: the default table holds them,
    /// the partition table is being dropped.
    Dropping,
    /// A move is switching the partition to its new place: statements on
    /// it wait (only on it); its table still holds its rows.
    Fenced,
}

impl PartitionState {
    pub fn name(self) -> &'static str {
        match self {
            PartitionState::Active => "active",
            PartitionState::Copying => "copying",
            PartitionState::Cleaning => "cleaning",
            PartitionState::Draining => "draining",
            PartitionState::Dropping => "dropping",
            PartitionState::Fenced => "fenced",
        }
    }

    pub fn parse(name: &str) -> Option<PartitionState> {
        [
            PartitionState::Active,
            PartitionState::Copying,
            PartitionState::Cleaning,
            PartitionState::Draining,
            PartitionState::Dropping,
            PartitionState::Fenced,
        ]
        .into_iter()
        .find(|s| s.name() == name)
    }

    /// Whether the partition, rather than the default table, holds its rows.
    pub fn holds_rows(self) -> bool {
        matches!(
            self,
            PartitionState::Active
                | PartitionState::Cleaning
                | PartitionState::Draining
                | PartitionState::Fenced
        )
    }
}

/// How many partition values a range may span and still be routed to
/// their partitions only.
const MOST_RANGE_VALUES: usize = 64;

/// A logical table: its database and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TableName {
    pub db: String,
    pub name: String,
}

impl std::fmt::Display for TableName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}`.`{}`", self.db, self.name)
    }
}

/// One partition value of one partition; several values may share a
/// partition name (one physical table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionEntry {
    pub name: String,
    pub value: String,
    pub backend: u32,
    pub state: PartitionState,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionedTable {
    pub table: TableName,
    pub column: String,
    /// 1-based position of the partition column, for INSERTs without a column list.
    pub column_position: usize,
    pub kind: ColumnKind,
    pub function: HashFunction,
    pub default_table: String,
    pub default_backend: u32,
    /// Its AUTO_INCREMENT column, whose ids hscale hands out.
    pub auto_column: Option<AutoColumn>,
    /// How the partition column's strings fold: as its collation compares.
    pub folding: Folding,
    pub entries: Vec<PartitionEntry>,
    /// A schema statement (ALTER, RENAME, ...) is running on its physical
    /// tables: statements on it wait.
    pub changing: bool,
    /// Its columns' names, where the dictionary read them (its default
    /// table is on the main backend): which table an unqualified column
    /// of a subquery names.
    pub columns: Option<Arc<[String]>>,
    by_value: FxHashMap<String, usize>,
    /// Built once per snapshot: a routed statement clones a target, it does
    /// not format one.
    default: Target,
    /// The target of `entries[i]`.
    targets: Vec<Target>,
}

/// A physical table a statement goes to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Target {
    pub backend: u32,
    /// The physical table name.
    pub table: Arc<str>,
    /// The partition's name; `None` for the default partition.
    pub partition: Option<Arc<str>>,
    /// A move is switching it: statements on it wait.
    pub fenced: bool,
    /// Which physical table this is, in any snapshot (see `PhysicalId`).
    pub physical: PhysicalId,
}

/// A physical table on its backend (database, name, backend), hashed once
/// per snapshot, so that a session notes where its transaction ran, and an
/// instance finds which fenced tables its sessions are on, without holding
/// or comparing names. 64 bits: among a dictionary's n tables, two hash
/// alike with a chance of about n² / 2^65.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct PhysicalId(u64);

impl PhysicalId {
    pub fn of(db: &str, backend: u32, table: &str) -> PhysicalId {
        use std::hash::{Hash, Hasher};
        let mut hasher = rustc_hash::FxHasher::default();
        db.hash(&mut hasher);
        backend.hash(&mut hasher);
        table.hash(&mut hasher);
        PhysicalId(hasher.finish().max(1))
    }

    /// As a number that is never 0, for an atomic that keeps 0 for none.
    pub fn bits(self) -> u64 {
        self.0
    }

    pub fn from_bits(bits: u64) -> PhysicalId {
        PhysicalId(bits)
    }
}

impl Target {
    /// Whether a statement of a session whose transaction ran on `passed`
    /// waits here (see `Context::passed_fences`).
    pub fn waits(&self, passed: &[PhysicalId]) -> bool {
        self.fenced && !passed.contains(&self.physical)
    }

    /// The physical table `table` of database `db` on `backend`;
    /// `partition`: `None` for a default table.
    pub fn new(db: &str, backend: u32, table: &str, partition: Option<&str>) -> Target {
        Target {
            backend,
            table: Arc::from(table),
            partition: partition.map(Arc::from),
            fenced: false,
            physical: PhysicalId::of(db, backend, table),
        }
    }
}

/// An AUTO_INCREMENT column: its name and 1-based position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AutoColumn {
    pub name: String,
    pub position: usize,
}

/// What SETUP_TABLE records of a partitioned table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableDefinition {
    pub table: TableName,
    pub column: String,
    pub column_position: usize,
    pub kind: ColumnKind,
    pub function: HashFunction,
    pub default_table: String,
    pub default_backend: u32,
    pub auto_column: Option<AutoColumn>,
    /// How the partition column's strings fold: as its collation compares.
    pub folding: Folding,
}

impl PartitionedTable {
    pub fn new(definition: TableDefinition, entries: Vec<PartitionEntry>) -> PartitionedTable {
        let by_value = entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.value.clone(), i))
            .collect();
        let TableDefinition {
            table,
            column,
            column_position,
            kind,
            function,
            default_table,
            default_backend,
            auto_column,
            folding,
        } = definition;
        let default = Target::new(&table.db, default_backend, &default_table, None);
        let targets = entries
            .iter()
            .map(|entry| Target {
                fenced: entry.state == PartitionState::Fenced,
                ..Target::new(
                    &table.db,
                    entry.backend,
                    &partition_table(&table, &entry.name),
                    Some(&entry.name),
                )
            })
            .collect();
        PartitionedTable {
            table,
            column,
            column_position,
            kind,
            function,
            default_table,
            default_backend,
            auto_column,
            folding,
            entries,
            changing: false,
            columns: None,
            by_value,
            default,
            targets,
        }
    }

    /// Whether it has column `name` (without case): None where its columns
    /// are not known.
    pub fn has_column(&self, name: &str) -> Option<bool> {
        let columns = self.columns.as_ref()?;
        Some(columns.iter().any(|c| c.eq_ignore_ascii_case(name)))
    }

    pub fn definition(&self) -> TableDefinition {
        TableDefinition {
            table: self.table.clone(),
            column: self.column.clone(),
            column_position: self.column_position,
            kind: self.kind,
            function: self.function.clone(),
            default_table: self.default_table.clone(),
            default_backend: self.default_backend,
            auto_column: self.auto_column.clone(),
            folding: self.folding.clone(),
        }
    }

    /// The physical table name of a partition.
    pub fn partition_table(&self, partition: &str) -> String {
        partition_table(&self.table, partition)
    }

    /// A schema change or an offline move is in progress: statements on
    /// the table wait for it.
    pub fn locked(&self) -> bool {
        self.changing
            || self
                .entries
                .iter()
                .any(|e| !matches!(e.state, PartitionState::Active | PartitionState::Fenced))
    }

    /// A move is switching one of its partitions: statements that run on
    /// that partition wait (`Target::fenced`); those that hold the whole
    /// table (LOCK TABLES, LOAD DATA, maintenance) wait too.
    pub fn fenced(&self) -> bool {
        self.default.fenced
            || self
                .entries
                .iter()
                .any(|e| e.state == PartitionState::Fenced)
    }

    /// A move is switching the default table: statements that run on it
    /// wait, as on a fenced partition.
    pub fn fence_default(&mut self) {
        self.default.fenced = true;
    }

    pub fn default_fenced(&self) -> bool {
        self.default.fenced
    }

    /// `locked` or `fenced`: a statement on the whole table waits.
    pub fn held(&self) -> bool {
        self.locked() || self.fenced()
    }

    /// The default table's name once the table is renamed to `new`: one
    /// named after the table (`users_default`) follows it, another keeps its
    /// name.
    pub fn renamed_default(&self, new: &str) -> String {
        let prefix = format!("{}_", self.table.name);
        match self.default_table.strip_prefix(&prefix) {
            Some(rest) => format!("{new}_{rest}"),
            None => self.default_table.clone(),
        }
    }

    pub fn default_target(&self) -> Target {
        self.default.clone()
    }

    /// The partition entry for a partition value, if one holds its rows now.
    pub fn entry_for(&self, partition_value: &str) -> Option<&PartitionEntry> {
        self.index_for(partition_value).map(|i| &self.entries[i])
    }

    fn index_for(&self, partition_value: &str) -> Option<usize> {
        self.by_value
            .get(partition_value)
            .copied()
            .filter(|&i| self.entries[i].state.holds_rows())
    }

    /// Where rows whose partition column is `value` live.
    pub fn target_for(&self, value: &Value) -> Result<Target, HashError> {
        let partition_value = match value {
            Value::Null => return Ok(self.default_target()),
            v => self.function.apply(self.kind, &self.folding, v)?,
        };
        Ok(match self.index_for(&partition_value) {
            Some(i) => self.targets[i].clone(),
            None => self.default_target(),
        })
    }

    /// Where rows whose partition column is between `low` and `high` live,
    /// when the values between can be listed; `None`: anywhere.
    pub fn targets_between(
        &self,
        low: &Value,
        high: &Value,
    ) -> Result<Option<Vec<Target>>, HashError> {
        // BETWEEN NULL, and an empty range, match no row: any one table
        // answers that with the right columns.
        let empty = |low: &str, high: &str| matches!((low.parse::<i128>(), high.parse::<i128>()), (Ok(l), Ok(h)) if l > h);
        let no_rows = match (low, high) {
            (Value::Null, _) | (_, Value::Null) => true,
            (Value::Number(l) | Value::String(l), Value::Number(h) | Value::String(h)) => {
                self.kind == ColumnKind::Integer && empty(l.trim(), h.trim())
            }
        };
        if no_rows {
            return Ok(Some(vec![self.default_target()]));
        }
        let Some(values) = self
            .function
            .representatives(self.kind, low, high, MOST_RANGE_VALUES)
        else {
            return Ok(None);
        };
        let mut targets = Vec::new();
        for value in &values {
            let target = self.target_for(value)?;
            if !targets.contains(&target) {
                targets.push(target);
            }
        }
        Ok(Some(targets))
    }

    /// Every physical table that holds rows: the default, then the
    /// partitions in the order they were added, each once.
    pub fn all_targets(&self) -> Vec<Target> {
        let mut seen = HashSet::new();
        let mut targets = vec![self.default_target()];
        for (entry, target) in self.entries.iter().zip(&self.targets) {
            if entry.state.holds_rows() && seen.insert(entry.name.as_str()) {
                targets.push(target.clone());
            }
        }
        targets
    }

    /// Every physical table of the table, whatever the state of its partition.
    pub fn physical_tables(&self) -> Vec<Target> {
        let mut seen = HashSet::new();
        let mut targets = vec![self.default_target()];
        for (entry, target) in self.entries.iter().zip(&self.targets) {
            if seen.insert(entry.name.as_str()) {
                targets.push(target.clone());
            }
        }
        targets
    }

    /// Whether a join that equates the two tables' partition columns can run
    /// partition by partition: the same kind of column and function, and the
    /// same partitions (names, values, backends) and default backend, so that
    /// rows with equal values always sit in same-named tables on one backend.
    pub fn co_located(&self, other: &PartitionedTable) -> Result<(), PlanError> {
        let (a, b) = (&self.table, &other.table);
        if self.kind != other.kind || self.function != other.function {
            return Err(PlanError::Refuse(format!(
                "{a} ({} column, {}) and {b} ({} column, {}) are not partitioned alike",
                self.kind.name(),
                self.function,
                other.kind.name(),
                other.function
            )));
        }
        if self.default_backend != other.default_backend {
            return Err(PlanError::Refuse(format!(
                "the default partitions of {a} and {b} are on backends {} and {}",
                self.default_backend, other.default_backend
            )));
        }
        fn layout(table: &PartitionedTable) -> Vec<(&str, &str, u32)> {
            let mut entries: Vec<(&str, &str, u32)> = table
                .entries
                .iter()
                .filter(|e| e.state.holds_rows())
                .map(|e| (e.name.as_str(), e.value.as_str(), e.backend))
                .collect();
            entries.sort_unstable();
            entries
        }
        let (mine, theirs) = (layout(self), layout(other));
        match mine.iter().zip(&theirs).find(|(x, y)| x != y) {
            None if mine.len() == theirs.len() => Ok(()),
            Some(((name, value, backend), _)) => Err(PlanError::Refuse(format!(
                "{a} has partition {name} for value '{value}' on backend {backend} and {b} has not"
            ))),
            None => Err(PlanError::Refuse(format!(
                "{a} and {b} have different partitions"
            ))),
        }
    }

    /// The entries of one partition name.
    pub fn partition<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a PartitionEntry> {
        self.entries.iter().filter(move |e| e.name == name)
    }
}

/// The physical table of a partition: `users` + `nick1` -> `users_nick1`.
pub fn partition_table(table: &TableName, partition: &str) -> String {
    let mut name = String::with_capacity(table.name.len() + 1 + partition.len());
    name.push_str(&table.name);
    name.push('_');
    name.push_str(partition);
    name
}

/// The names the lexer looks for in every statement, before anything is
/// parsed: those of partitioned tables, lower-cased, in any database, and
/// `information_schema` (only statements that use one are planned further);
/// and those only hscale and admins may name (`guards`).
#[derive(Debug, Clone, Default)]
pub struct TableNames {
    partitioned: NameSet,
    /// The dictionary's schema and every default and partition table: an
    /// application reaches their rows through the partitioned table only.
    guarded: NameSet,
    /// `<schema>.`, lower-cased: what hscale's own user locks are named by.
    lock_prefix: Vec<u8>,
}

impl TableNames {
    pub fn is_empty(&self) -> bool {
        self.partitioned.names.is_empty()
    }

    /// Whether `word` (an identifier as written, unquoted) may name a
    /// partitioned table.
    #[inline]
    pub fn contains(&self, word: &[u8]) -> bool {
        self.partitioned.contains(word)
    }

    /// Whether any name is guarded: the lexer looks for none otherwise.
    pub fn guards_any(&self) -> bool {
        !self.guarded.names.is_empty()
    }

    /// Whether `word` names hscale's schema, a default table or a partition's table.
    #[inline]
    pub fn guards(&self, word: &[u8]) -> bool {
        self.guarded.contains(word)
    }

    /// Whether a string names one of hscale's own user locks.
    pub fn guards_lock(&self, name: &[u8]) -> bool {
        !self.lock_prefix.is_empty()
            && name.len() >= self.lock_prefix.len()
            && name[..self.lock_prefix.len()].eq_ignore_ascii_case(&self.lock_prefix)
    }
}

/// Lower-cased names, with filters by length and first byte that reject
/// most words (SELECT, FROM, column names) before any hashing.
#[derive(Debug, Clone, Default)]
struct NameSet {
    names: FxHashSet<Vec<u8>>,
    /// Bit n: some name is n bytes long (names of 64 bytes and more: bit 63).
    lengths: u64,
    /// Bit b: some name starts with the byte b (lower-cased; bytes past
    /// ASCII share bit 127).
    firsts: u128,
    longest: usize,
}

impl NameSet {
    #[inline]
    fn contains(&self, word: &[u8]) -> bool {
        if word.len() > self.longest || self.lengths & length_bit(word.len()) == 0 {
            return false;
        }
        if self.firsts & first_bit(word) == 0 {
            return false;
        }
        // Most names are short: a small buffer is cheaper to set up.
        match word.len() {
            0..=32 => self.contains_lower::<32>(word),
            _ => self.contains_lower::<256>(word),
        }
    }

    fn contains_lower<const N: usize>(&self, word: &[u8]) -> bool {
        let mut lower = [0u8; N];
        let lower = &mut lower[..word.len()];
        for (l, w) in lower.iter_mut().zip(word) {
            *l = w.to_ascii_lowercase();
        }
        self.names.contains(&lower[..])
    }

    fn insert(&mut self, name: &str) {
        let lower = name.to_ascii_lowercase().into_bytes();
        // 64 characters of up to 4 bytes: MySQL's longest identifier.
        self.longest = self.longest.max(lower.len()).min(256);
        self.lengths |= length_bit(lower.len());
        self.firsts |= first_bit(&lower);
        self.names.insert(lower);
    }
}

fn first_bit(word: &[u8]) -> u128 {
    let first = word.first().map_or(0, |b| b.to_ascii_lowercase());
    1 << first.min(127)
}

fn length_bit(len: usize) -> u64 {
    1 << len.min(63)
}

/// By database, then physical table: the partitioned table's name. By
/// bytes: looked up with the names in column definitions.
type LogicalNames = FxHashMap<Box<[u8]>, FxHashMap<Box<[u8]>, String>>;

/// A small table copied whole to every backend (`HSCALE SETUP_REFERENCE`):
/// reads run on any copy (so joins with it run inside each partition),
/// writes on every copy in one transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReferenceTable {
    pub table: TableName,
    /// The backends that hold a copy, the main backend's (the original)
    /// first.
    pub backends: Vec<u32>,
    /// Every copy is made; until then writes wait.
    pub ready: bool,
}

/// One immutable snapshot of the dictionary.
#[derive(Debug, Clone, Default)]
pub struct Dictionary {
    pub version: u64,
    /// Which snapshot this is, unique in the process: what the plan cache
    /// keys its entries by, since a version read twice (the admin lock's
    /// dictionary, a test's) may hold other tables.
    generation: u64,
    /// By database, then name: looked up with borrowed names once per
    /// statement shape (the plan cache keeps the table it found).
    tables: FxHashMap<String, FxHashMap<String, Arc<PartitionedTable>>>,
    logical: LogicalNames,
    names: TableNames,
    references: FxHashMap<String, FxHashMap<String, ReferenceTable>>,
}

impl Dictionary {
    pub fn new(version: u64, tables: Vec<PartitionedTable>) -> Dictionary {
        let mut names = TableNames::default();
        for t in &tables {
            names.partitioned.insert(&t.table.name);
            for target in t.physical_tables() {
                names.guarded.insert(&target.table);
            }
        }
        // Its tables list physical tables: such queries are planned too.
        if !tables.is_empty() {
            names.partitioned.insert("information_schema");
        }
        let mut by_db: FxHashMap<String, FxHashMap<String, Arc<PartitionedTable>>> =
            FxHashMap::default();
        let mut logical = LogicalNames::default();
        for t in &tables {
            let physical = logical.entry(t.table.db.as_bytes().into()).or_default();
            for target in t.physical_tables() {
                physical.insert(target.table.as_bytes().into(), t.table.name.clone());
            }
        }
        for t in tables {
            by_db
                .entry(t.table.db.clone())
                .or_default()
                .insert(t.table.name.clone(), Arc::new(t));
        }
        static GENERATIONS: AtomicU64 = AtomicU64::new(1);
        Dictionary {
            version,
            generation: GENERATIONS.fetch_add(1, Ordering::Relaxed),
            tables: by_db,
            logical,
            names,
            references: FxHashMap::default(),
        }
    }

    /// The snapshot with its reference tables, whose statements are
    /// planned too.
    pub fn with_references(mut self, references: Vec<ReferenceTable>) -> Dictionary {
        for reference in references {
            self.names.partitioned.insert(&reference.table.name);
            self.references
                .entry(reference.table.db.clone())
                .or_default()
                .insert(reference.table.name.clone(), reference);
        }
        self
    }

    pub fn reference(&self, db: &str, name: &str) -> Option<&ReferenceTable> {
        self.references.get(db)?.get(name)
    }

    /// Reference tables in name order.
    pub fn references(&self) -> Vec<&ReferenceTable> {
        let mut all: Vec<&ReferenceTable> =
            self.references.values().flat_map(|t| t.values()).collect();
        all.sort_by(|a, b| a.table.cmp(&b.table));
        all
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn names(&self) -> &TableNames {
        &self.names
    }

    pub fn table(&self, db: &str, name: &str) -> Option<&PartitionedTable> {
        self.shared_table(db, name).map(|t| &**t)
    }

    /// `table`, for keeping beyond this snapshot's borrow.
    pub fn shared_table(&self, db: &str, name: &str) -> Option<&Arc<PartitionedTable>> {
        self.tables.get(db)?.get(name)
    }

    /// Tables in name order.
    pub fn tables(&self) -> Vec<&PartitionedTable> {
        let mut tables: Vec<&PartitionedTable> = self
            .tables
            .values()
            .flat_map(|t| t.values().map(|t| &**t))
            .collect();
        tables.sort_by(|a, b| a.table.cmp(&b.table));
        tables
    }

    /// The partitioned table whose rows `db.table` holds, if it is one's
    /// default table or partition.
    pub fn logical_name(&self, db: &[u8], table: &[u8]) -> Option<&str> {
        self.logical.get(db)?.get(table).map(String::as_str)
    }

    /// The snapshot with hscale's own schema guarded too: its name, and the
    /// names of hscale's user locks (`<schema>.admin`, ...).
    pub fn guarding_schema(mut self, schema: &str) -> Dictionary {
        self.names.guarded.insert(schema);
        self.names.lock_prefix = format!("{schema}.").to_ascii_lowercase().into_bytes();
        self
    }

    /// The partitioned table that uses `db.name` as its own name, its
    /// default table or a partition's table. Names compare without case, as
    /// on a server with lower_case_table_names: an admin command refuses a
    /// name that is one on some server.
    pub fn claimant(&self, db: &str, name: &str) -> Option<&TableName> {
        let tables = self.tables.get(db)?.values();
        tables
            .filter(|t| {
                t.table.name.eq_ignore_ascii_case(name)
                    || t.physical_tables()
                        .iter()
                        .any(|p| p.table.eq_ignore_ascii_case(name))
            })
            .map(|t| &t.table)
            .next()
    }

    /// Whether any table is partitioned.
    pub fn is_empty(&self) -> bool {
        self.tables.is_empty()
    }

    /// The physical tables a move is fencing: an instance acknowledges this
    /// snapshot only once none of its sessions is on one of them.
    pub fn fenced_tables(&self) -> Vec<PhysicalId> {
        let mut fenced: Vec<PhysicalId> = self
            .tables
            .values()
            .flat_map(|t| t.values())
            .flat_map(|t| std::iter::once(&t.default).chain(&t.targets))
            .filter(|target| target.fenced)
            .map(|target| target.physical)
            .collect();
        fenced.sort_unstable();
        fenced.dedup();
        fenced
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// users by PREFIX(3) of nickname, default on backend 1, partition nick1
    /// ('mar') on backend 2, nick2 ('pet', 'pau') on backend 1.
    pub fn users() -> Dictionary {
        let entry = |name: &str, value: &str, backend| PartitionEntry {
            name: name.into(),
            value: value.into(),
            backend,
            state: PartitionState::Active,
        };
        let users = PartitionedTable::new(
            TableDefinition {
                table: TableName {
                    db: "app".into(),
                    name: "users".into(),
                },
                column: "nickname".into(),
                column_position: 2,
                kind: ColumnKind::Text,
                function: HashFunction::Prefix(3),
                default_table: "users_default".into(),
                default_backend: 1,
                auto_column: None,
                folding: Default::default(),
            },
            vec![
                entry("nick1", "mar", 2),
                entry("nick2", "pet", 1),
                entry("nick2", "pau", 1),
            ],
        );
        Dictionary::new(7, vec![users])
    }

    #[test]
    fn values_find_their_partition_or_the_default() {
        let dict = users();
        let users = dict.table("app", "users").unwrap();
        let target = |v: &str| users.target_for(&Value::String(v.into())).unwrap();
        assert_eq!(target("Martin").table.as_ref(), "users_nick1");
        assert_eq!(target("Martin").backend, 2);
        assert_eq!(target("paula").table.as_ref(), "users_nick2");
        assert_eq!(target("zoe").table.as_ref(), "users_default");
        assert_eq!(
            users.target_for(&Value::Null).unwrap().table.as_ref(),
            "users_default"
        );
    }

    #[test]
    fn the_logical_default_and_partition_tables_are_claimed_by_their_table() {
        let dict = users();
        for name in ["users", "USERS_default", "users_nick1", "users_nick2"] {
            assert_eq!(dict.claimant("app", name).unwrap().name, "users", "{name}");
        }
        assert_eq!(dict.claimant("app", "users_nick3"), None);
        assert_eq!(dict.claimant("other", "users"), None);
    }

    #[test]
    fn a_full_scan_visits_each_physical_table_once() {
        let dict = users();
        let tables: Vec<String> = dict
            .table("app", "users")
            .unwrap()
            .all_targets()
            .into_iter()
            .map(|t| t.table.to_string())
            .collect();
        assert_eq!(tables, ["users_default", "users_nick1", "users_nick2"]);
    }

    #[test]
    fn table_names_match_case_insensitively_and_only_whole_names() {
        let dict = users();
        assert!(dict.names().contains(b"USERS"));
        assert!(!dict.names().contains(b"user"));
        assert!(!dict.names().contains(b"users_default"));
        assert_eq!(dict.logical_name(b"app", b"users_nick2"), Some("users"));
        assert_eq!(dict.logical_name(b"app", b"users_default"), Some("users"));
        assert_eq!(dict.logical_name(b"app", b"users"), None);
        assert_eq!(dict.logical_name(b"other", b"users_nick2"), None);
    }
}

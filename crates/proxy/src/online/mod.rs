//! Online partition moves (docs/moves.md): HSCALE MOVE_PARTITION starts a
//! job that copies a partition's table to another backend in key chunks
//! while the application goes on, catches up from the source's binary log,
//! then fences the partition for a moment, switches the dictionary to the
//! new place, and retires the old table. What is decided (chunks, checksums,
//! the applier's statements) lives in `hscale_moves`; this module does the
//! I/O and keeps the job's row in the dictionary (`moves`).

pub mod binlog;
pub mod copy;
pub mod running;
pub mod table;

use std::sync::Arc;
use std::time::{Duration, Instant};

use hscale_moves::foreign_keys::{self, Parent};
use hscale_moves::{EveryRow, MoveError, MovedTable, Routing, RowFilter, ValuesFilter, Watched};
use hscale_planner::{PartitionState, PartitionedTable, TableName};

use crate::admin::{partitioned, AdminAnswer, AdminError, AdminLock};
use crate::backend::BackendConn;
use crate::dictionary::rows_connection;
use crate::dictionary::store::{self, exec, ident, text_literal};
use crate::error::ProxyError;
use crate::offline::{self, Place as OfflinePlace};
use crate::shared::Cluster;
use copy::{ChunkCopy, Part};

/// Rows per chunk: the copy holds one chunk in memory at a time.
const CHUNK_ROWS: usize = 1000;
/// The applier is this close to the source's end before the fence starts,
/// so that the fence's own catch-up is short.
const CLOSE_ENOUGH_BYTES: u64 = 256 * 1024;
/// How long every live instance has to load a fence, and the source to
/// grant the rename (open transactions on the table hold it back).
const FENCE_BUDGET: Duration = Duration::from_millis(1000);
const FENCE_ATTEMPTS: u32 = 10;

/// What a job does with its partition's rows.
#[derive(Debug, Clone)]
enum Work {
    /// Every row to the destination.
    Move,
    /// The rows whose partition value is `value` to partition `into` on
    /// the destination; the rest stay, rebuilt beside the old table on the
    /// source so that the fence swaps tables instead of deleting rows.
    Split {
        value: String,
        into: String,
        /// `into` exists: the rows gather in a staging table and join it
        /// during the fence.
        into_existing: bool,
        column: String,
        routing: Routing,
    },
    /// DROP_PARTITION: every row of the partition to the default table on
    /// the destination. The rows gather in a staging table there and join
    /// the default table during the fence (which fences both), and the
    /// partition's values then route to the default table.
    Merge,
}

/// A move as its job row has it.
#[derive(Debug, Clone)]
struct Job {
    id: u64,
    table: TableName,
    /// The partition moved or split; `None`: the default table.
    partition: Option<String>,
    /// Its physical table on the source.
    physical: String,
    source: u32,
    destination: u32,
    work: Work,
    /// The rows move during the fence, which lasts as long: the table has
    /// no key to copy it by while it changes, or the source writes no row
    /// binary log to follow its changes by (the job row's `keyless`).
    in_fence: bool,
    /// The owner's epoch: its writes count only while the job's row and
    /// every part's progress row hold it.
    epoch: u64,
    /// What the command that waits for it tells its client as warnings
    /// (foreign keys left out), beside the log.
    notes: Notes,
}

/// A job's warnings for its client, in the order they arose.
type Notes = Arc<std::sync::Mutex<Vec<String>>>;

/// How the default table is named where a partition's name goes.
pub const DEFAULT_PARTITION: &str = "(default)";

impl Job {
    fn note(&self, note: String) {
        self.notes.lock().expect("not poisoned").push(note);
    }

    fn partition_label(&self) -> &str {
        self.partition.as_deref().unwrap_or(DEFAULT_PARTITION)
    }

    /// A table of the job's own (`what`: retired, rest, stage), in the
    /// dictionary's schema of its backend, where no client lists it.
    fn own(&self, shared: &Cluster, what: &str) -> Place {
        let mut name = format!("_hscale_{what}_{}_{}", self.id, self.physical);
        name.truncate(64);
        Place::new(&shared.dictionary.schema, &name)
    }

    /// Where the partition's old table goes at the fence.
    fn retired(&self, shared: &Cluster) -> Place {
        self.own(shared, "retired")
    }

    /// The partition's table on the source.
    fn source_place(&self) -> Place {
        Place::new(&self.table.db, &self.physical)
    }

    /// Where the rows the job takes go, and its backend.
    fn taken(&self, shared: &Cluster) -> (u32, Place) {
        match &self.work {
            Work::Move => (self.destination, self.source_place()),
            Work::Split {
                into_existing: true,
                ..
            } if !self.in_fence => (self.destination, self.own(shared, "stage")),
            Work::Split { into, .. } => (self.destination, self.partition_place(into)),
            Work::Merge => (self.destination, self.own(shared, "stage")),
        }
    }

    /// The table that staged rows join in the fence: an existing partition
    /// a split adds a value to, or the default table a merge fills.
    fn joined(&self, shared: &Cluster) -> Option<Place> {
        match &self.work {
            Work::Split {
                into,
                into_existing: true,
                ..
            } if !self.in_fence => Some(self.partition_place(into)),
            Work::Merge => {
                let dictionary = shared.dictionary.snapshot();
                let t = partitioned(&dictionary, &self.table).ok()?;
                Some(Place::new(&self.table.db, &t.default_table))
            }
            _ => None,
        }
    }

    fn partition_place(&self, partition: &str) -> Place {
        Place::new(
            &self.table.db,
            &hscale_planner::partition_table(&self.table, partition),
        )
    }

    /// The tables the job creates, with their backends, in the order of
    /// its parts (`parts`): the rows it takes, then a split's rest. They
    /// go when the job fails before its switch.
    fn created(&self, shared: &Cluster) -> Vec<(u32, Place)> {
        match &self.work {
            Work::Move | Work::Merge => vec![self.taken(shared)],
            Work::Split { into_existing, .. } => {
                let mut created = Vec::new();
                if !(*into_existing && self.in_fence) {
                    created.push(self.taken(shared));
                }
                if !self.in_fence {
                    created.push((self.source, self.own(shared, "rest")));
                }
                created
            }
        }
    }
}

/// A table by its database and name.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Place {
    db: String,
    name: String,
}

impl Place {
    fn new(db: &str, name: &str) -> Place {
        Place {
            db: db.to_string(),
            name: name.to_string(),
        }
    }

    fn qualified(&self) -> String {
        format!("{}.{}", ident(&self.db), ident(&self.name))
    }

    async fn exists(&self, conn: &mut BackendConn) -> Result<bool, ProxyError> {
        store::table_exists(conn, &self.db, &self.name).await
    }
}

/// A table as the offline row moves (`offline`) name it.
fn offline(shared: &Cluster, backend: u32, place: Place) -> Result<OfflinePlace, ProxyError> {
    Ok(OfflinePlace {
        slot: slot(shared, backend)?,
        db: place.db,
        table: place.name,
    })
}

/// Deletes the rows a split's value or a merged partition's values hold
/// from `place`, where the job put copies of them (the source's rows stay
/// the ones that count).
async fn delete_value_rows(
    shared: &Cluster,
    job: &Job,
    backend: u32,
    place: Place,
) -> Result<(), ProxyError> {
    let dictionary = shared.dictionary.snapshot();
    let t = partitioned(&dictionary, &job.table)?;
    let values = match (&job.work, &job.partition) {
        (Work::Split { value, .. }, _) => vec![value.clone()],
        (Work::Merge, Some(p)) => t.partition(p).map(|e| e.value.clone()).collect(),
        _ => return Ok(()),
    };
    let at = offline(shared, backend, place)?;
    offline::delete_rows(shared, t, &values, &at).await
}

/// `RENAME TABLE from TO to`.
fn rename(from: &Place, to: &Place) -> String {
    format!("RENAME TABLE {} TO {}", from.qualified(), to.qualified())
}

fn jobs(shared: &Cluster) -> String {
    format!("{}.moves", ident(&shared.dictionary.schema))
}

fn slot(shared: &Cluster, backend: u32) -> Result<usize, ProxyError> {
    shared
        .pool_index(backend)
        .ok_or(ProxyError::UnknownBackend { backend })
}

/// A running job: its id, and its end (the rows it took) for a command
/// that waits for it.
pub struct Started {
    pub id: u64,
    pub done: tokio::task::JoinHandle<Result<u64, MoveError>>,
    notes: Notes,
}

/// A job's end, as the command that waited for it answers.
pub struct Finished {
    pub rows: u64,
    /// Warnings for the client (`Job::notes`).
    pub notes: Vec<String>,
}

impl Started {
    /// The command's answer when it does not wait: the job's id.
    pub fn answer(&self) -> AdminAnswer {
        AdminAnswer::Rows {
            columns: vec![("job", hscale_wire::resultset::ColumnType::Integer)],
            rows: vec![vec![Some(self.id.to_string())]],
        }
    }

    /// Waits for the job's end; a failed job's reason is the error.
    pub async fn wait(self) -> Result<Finished, ProxyError> {
        match self.done.await {
            Ok(result) => {
                let rows = result.map_err(ProxyError::from)?;
                let notes = std::mem::take(&mut *self.notes.lock().expect("not poisoned"));
                Ok(Finished { rows, notes })
            }
            Err(e) => Err(MoveError::Failed {
                job: self.id,
                reason: e.to_string(),
            }
            .into()),
        }
    }
}

/// HSCALE MOVE_PARTITION: checks that the move can run, records its job and
/// starts it; answers the job's id at once. `'(default)'` moves the
/// default table.
pub async fn start(
    shared: &Arc<Cluster>,
    table: TableName,
    partition: String,
    destination: u32,
) -> Result<AdminAnswer, ProxyError> {
    let mut lock = AdminLock::take(shared).await?;
    let dictionary = store::load(&mut lock.conn, &shared.dictionary).await?;
    let t = partitioned(&dictionary, &table)?;
    let (partition, source, physical) = match partition.as_str() {
        DEFAULT_PARTITION => (None, t.default_backend, t.default_table.clone()),
        _ => {
            let source = t.partition(&partition).next().map(|e| e.backend);
            let Some(source) = source else {
                return Err(
                    AdminError::Invalid(format!("{table} has no partition '{partition}'")).into(),
                );
            };
            let physical = t.partition_table(&partition);
            (Some(partition), source, physical)
        }
    };
    if source == destination {
        return Err(AdminError::Invalid(format!(
            "partition '{}' is on backend {destination} already",
            partition.as_deref().unwrap_or(DEFAULT_PARTITION)
        ))
        .into());
    }
    let job = Job {
        id: 0,
        table,
        partition,
        physical,
        source,
        destination,
        work: Work::Move,
        in_fence: false,
        epoch: 1,
        notes: Notes::default(),
    };
    launch(shared, &mut lock, t, job).await.map(|s| s.answer())
}

/// A split (ADD_PARTITION of a value the default table holds, or
/// SPLIT_PARTITION): the rows of the partition value `value` go from
/// `from` (`None`: the default table) to partition `into` on `destination`.
/// The caller has checked the names and the value.
pub async fn start_split(
    shared: &Arc<Cluster>,
    lock: &mut AdminLock,
    t: &PartitionedTable,
    from: Option<String>,
    value: String,
    into: String,
    destination: u32,
) -> Result<Started, ProxyError> {
    let (source, physical) = match &from {
        None => (t.default_backend, t.default_table.clone()),
        Some(p) => {
            let source = t.partition(p).next().map(|e| e.backend);
            let source = source.ok_or_else(|| {
                AdminError::Invalid(format!("{} has no partition '{p}'", t.table))
            })?;
            (source, t.partition_table(p))
        }
    };
    let into_existing = t.partition(&into).next().is_some();
    let job = Job {
        id: 0,
        table: t.table.clone(),
        partition: from,
        physical,
        source,
        destination,
        work: Work::Split {
            value,
            into,
            into_existing,
            column: t.column.clone(),
            routing: Routing {
                function: t.function.clone(),
                kind: t.kind,
                folding: t.folding.clone(),
            },
        },
        in_fence: false,
        epoch: 1,
        notes: Notes::default(),
    };
    launch(shared, lock, t, job).await
}

/// DROP_PARTITION: every row of `partition` joins the default table, and
/// its values then route there.
pub async fn start_merge(
    shared: &Arc<Cluster>,
    lock: &mut AdminLock,
    t: &PartitionedTable,
    partition: String,
) -> Result<Started, ProxyError> {
    let source = t.partition(&partition).next().map(|e| e.backend);
    let source = source.ok_or_else(|| {
        AdminError::Invalid(format!("{} has no partition '{partition}'", t.table))
    })?;
    let job = Job {
        id: 0,
        table: t.table.clone(),
        physical: t.partition_table(&partition),
        partition: Some(partition),
        source,
        destination: t.default_backend,
        work: Work::Merge,
        in_fence: false,
        epoch: 1,
        notes: Notes::default(),
    };
    launch(shared, lock, t, job).await
}

/// The running job of a table, if it has one: one at a time per table,
/// and no other admin command changes a table while it moves.
pub async fn running(
    shared: &Cluster,
    conn: &mut BackendConn,
    table: &TableName,
) -> Result<Option<u64>, ProxyError> {
    let rows = exec(
        conn,
        &format!(
            "SELECT id FROM {} WHERE db = {} AND table_name = {} AND phase NOT IN ('done', 'failed', 'cancelled')",
            jobs(shared),
            text_literal(&table.db),
            text_literal(&table.name)
        ),
    )
    .await?;
    Ok(store::text(&rows, 0, 0).parse().ok())
}

/// Refuses an admin command on a table a job is moving.
pub async fn refuse_while_moving(
    shared: &Cluster,
    conn: &mut BackendConn,
    table: &TableName,
) -> Result<(), ProxyError> {
    match running(shared, conn, table).await? {
        None => Ok(()),
        Some(id) => Err(AdminError::Invalid(format!(
            "{table} is being moved (job {id}): wait for it (HSCALE SHOW_MOVES) or cancel it"
        ))
        .into()),
    }
}

/// Checks what every move needs, creates the tables it writes, records
/// its job and starts it.
async fn launch(
    shared: &Arc<Cluster>,
    lock: &mut AdminLock,
    t: &PartitionedTable,
    mut job: Job,
) -> Result<Started, ProxyError> {
    let label = job.partition_label().to_string();
    if t.locked() || t.fenced() || t.entries.iter().any(|e| e.state != PartitionState::Active) {
        return Err(AdminError::Invalid(format!(
            "partition '{label}' of {} is being changed already",
            job.table
        ))
        .into());
    }
    refuse_while_moving(shared, &mut lock.conn, &job.table).await?;
    let mut source_conn = rows_connection(shared, slot(shared, job.source)?).await?;
    slot(shared, job.destination)?;
    let no_binlog = binlog::lacks(&mut source_conn).await?;
    // The fence retires the partition's table into it.
    let schema = ident(&shared.dictionary.schema);
    exec(
        &mut source_conn,
        &format!("CREATE DATABASE IF NOT EXISTS {schema}"),
    )
    .await?;
    let described = table::describe(
        &mut source_conn,
        &job.table.db,
        &job.physical,
        &job.physical,
    )
    .await;
    match (&job.work, described) {
        (
            Work::Split {
                column,
                routing,
                value,
                ..
            },
            Ok(moved),
        ) => {
            let filter =
                ValuesFilter::new(&moved.columns, column, routing.clone(), vec![value.clone()]);
            if let Err(MoveError::Unsupported(why)) = filter {
                // The fence's copy reads values as the router does.
                tracing::warn!(table = %job.table, "{why}: its rows move during the split's fence");
                job.in_fence = true;
            }
        }
        (Work::Split { .. }, Err(ProxyError::Move(MoveError::NoKey(why)))) => {
            tracing::warn!(table = %job.table, "{why}: its rows move during the split's fence");
            job.in_fence = true;
        }
        (_, described) => drop(described?),
    }
    if let Some(refused) = no_binlog {
        moved_in_fence(shared, &mut job, refused).await?;
    }
    let estimate = exec(
        &mut source_conn,
        &format!(
            "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = {} AND TABLE_NAME = {}",
            text_literal(&job.table.db),
            text_literal(&job.physical)
        ),
    )
    .await?;
    let (value, into, into_existing) = match &job.work {
        Work::Move => ("NULL".to_string(), "NULL".to_string(), false),
        Work::Merge => ("NULL".to_string(), text_literal(DEFAULT_PARTITION), true),
        Work::Split {
            value,
            into,
            into_existing,
            ..
        } => (text_literal(value), text_literal(into), *into_existing),
    };
    let keyless = job.in_fence;
    let insert = format!(
        "INSERT INTO {} (db, table_name, partition_name, source_backend, destination_backend, phase, owner, heartbeat, rows_estimated, started, split_value, into_partition, into_existing, keyless, epoch) VALUES ({}, {}, {}, {}, {}, 'copying', {}, NOW(6), {}, NOW(6), {value}, {into}, {into_existing}, {keyless}, {})",
        jobs(shared),
        text_literal(&job.table.db),
        text_literal(&job.table.name),
        text_literal(&label),
        job.source,
        job.destination,
        text_literal(&shared.dictionary.instance),
        store::text(&estimate, 0, 0).parse::<u64>().unwrap_or(0),
        job.epoch
    );
    exec(&mut lock.conn, &insert).await?;
    job.id = store::text(
        &exec(&mut lock.conn, "SELECT LAST_INSERT_ID()").await?,
        0,
        0,
    )
    .parse()
    .unwrap_or(0);
    let mut made = Vec::new();
    let mut created = Ok(());
    for (backend, place) in job.created(shared) {
        let conn = rows_connection(shared, slot(shared, backend)?).await;
        created = match conn {
            Ok(mut conn) => create_like(shared, &job, &mut source_conn, &mut conn, &place, backend)
                .await
                .map(|_| made.push((conn, place))),
            Err(e) => Err(e),
        };
        if created.is_err() {
            break;
        }
    }
    if let Err(e) = created {
        // Only what this start made goes; a table that was there (someone
        // else's) is left as it is.
        for (mut conn, place) in made {
            let _ = exec(
                &mut conn,
                &format!("DROP TABLE IF EXISTS {}", place.qualified()),
            )
            .await;
        }
        let failed = format!(
            "UPDATE {} SET phase = 'failed', last_error = {}, finished = NOW(6) WHERE id = {}",
            jobs(shared),
            text_literal(&e.to_string()),
            job.id
        );
        exec(&mut lock.conn, &failed).await?;
        return Err(e);
    }
    let (value, into) = match &job.work {
        Work::Move => (None, None),
        Work::Merge => (None, Some(DEFAULT_PARTITION)),
        Work::Split { value, into, .. } => (Some(value.as_str()), Some(into.as_str())),
    };
    tracing::info!(job = job.id, table = %job.table, partition = %label, source = job.source, destination = job.destination, ?value, ?into, "move started");
    let (id, notes) = (job.id, Arc::clone(&job.notes));
    let done = shared.spawn_background(run(Arc::clone(shared), job, None));
    Ok(Started { id, done, notes })
}

/// `place` on the destination as `physical` is defined on the source. An
/// empty one of the same definition (a move that stopped before its first
/// chunk) is taken as it is; any other is refused, never touched.
async fn create_like(
    shared: &Cluster,
    job: &Job,
    source: &mut BackendConn,
    dest: &mut BackendConn,
    place: &Place,
    backend: u32,
) -> Result<(), ProxyError> {
    let physical = job.source_place();
    let definition = store::definition(source, &physical.db, &physical.name)
        .await?
        .ok_or_else(|| {
            MoveError::Unsupported(format!("{} does not exist", physical.qualified()))
        })?;
    let head = format!("CREATE TABLE {}", ident(&physical.name));
    let body = definition.strip_prefix(&head).ok_or_else(|| {
        MoveError::Unsupported(format!("unexpected definition of {}", physical.name))
    })?;
    let body = store::without_auto_increment(body);
    let mut parents = Vec::new();
    for reference in foreign_keys::references(&body) {
        let parent = parent_on(shared, job, dest, backend, &reference).await?;
        parents.push((reference, parent));
    }
    let (body, left_out) = foreign_keys::with_foreign_keys(&body, |reference| {
        let found = parents.iter().find(|(r, _)| r == reference);
        found.map_or(Parent::None, |(_, parent)| parent.clone())
    });
    if !left_out.is_empty() {
        tracing::warn!(
            job = job.id,
            table = %job.table,
            backend,
            constraints = ?left_out,
            "foreign keys left out of a partition's table: their parent rows are not on its backend, and they are not enforced there"
        );
        job.note(format!(
            "Foreign keys {} of {} left out of `{}` on backend {backend}: their parent rows are not all on that backend, and they are not enforced there",
            left_out.join(", "),
            job.table,
            place.name
        ));
    }
    if let Some(found) = store::definition(dest, &place.db, &place.name).await? {
        let head = format!("CREATE TABLE {}", ident(&place.name));
        let empty = format!("SELECT 1 FROM {} LIMIT 1", place.qualified());
        let alike = found
            .strip_prefix(&head)
            .is_some_and(|b| store::without_auto_increment(b) == body);
        if alike && exec(dest, &empty).await?.is_empty() {
            return Ok(());
        }
        return Err(AdminError::TableExists {
            db: place.db.clone(),
            name: place.name.clone(),
            backend,
        }
        .into());
    }
    exec(
        dest,
        &format!("CREATE DATABASE IF NOT EXISTS {}", ident(&place.db)),
    )
    .await?;
    exec(dest, &format!("CREATE TABLE {}{body}", place.qualified()))
        .await
        .map(drop)
}

/// Whether `child`'s rows find their parents, by the foreign key
/// `reference`, in `parent`'s partition of their own value: partitioned
/// alike, the key pairing the two partition columns. Any other key of a
/// partitioned parent may name rows on another backend.
fn co_located(
    child: &PartitionedTable,
    parent: &PartitionedTable,
    reference: &foreign_keys::Reference,
) -> bool {
    let (mine, theirs) = (child.definition(), parent.definition());
    mine.kind == theirs.kind
        && mine.function == theirs.function
        && reference.pairs(&mine.column, &theirs.column)
}

/// The table on `backend` that holds the parent rows of the rows `job`
/// puts there, for a foreign key naming `reference` on the source.
async fn parent_on(
    shared: &Cluster,
    job: &Job,
    dest: &mut BackendConn,
    backend: u32,
    reference: &foreign_keys::Reference,
) -> Result<Parent, ProxyError> {
    let db = reference.db.as_deref().unwrap_or(&job.table.db);
    let same = || Parent::Table {
        db: db.to_string(),
        name: reference.table.clone(),
    };
    let dictionary = shared.dictionary.snapshot();
    let logical = dictionary
        .logical_name(db.as_bytes(), reference.table.as_bytes())
        .unwrap_or(&reference.table);
    if let Some(copies) = dictionary.reference(db, logical) {
        return Ok(match copies.backends.contains(&backend) {
            true => same(),
            false => Parent::None,
        });
    }
    if let Some(parent) = dictionary.table(db, logical) {
        let table = dictionary.table(&job.table.db, &job.table.name);
        if !table.is_some_and(|t| co_located(t, parent, reference)) {
            return Ok(Parent::None);
        }
        // What stays of a split keeps the co-located parent it had.
        if backend == job.source {
            return Ok(same());
        }
        let value = match &job.work {
            Work::Split { value, .. } => Some(value.clone()),
            _ => job.partition.as_deref().and_then(|name| {
                let entries = table.map(|t| {
                    t.partition(name)
                        .map(|e| e.value.clone())
                        .collect::<Vec<_>>()
                });
                entries.and_then(|values| values.into_iter().next())
            }),
        };
        let target = match value.as_deref().and_then(|v| parent.entry_for(v)) {
            Some(entry) => (entry.backend, parent.partition_table(&entry.name)),
            None => {
                let default = parent.default_target();
                (default.backend, default.table.to_string())
            }
        };
        return Ok(match target.0 == backend {
            true => Parent::Table {
                db: db.to_string(),
                name: target.1,
            },
            false => Parent::None,
        });
    }
    // Beside the source (what stays of a split): the parents it had.
    if backend == job.source {
        return Ok(same());
    }
    // A plain table: where the backend has one of that name.
    Ok(
        match store::table_exists(dest, db, &reference.table).await? {
            true => same(),
            false => Parent::None,
        },
    )
}

/// Runs a job to its end; a failure is recorded in its row, and what it
/// did before its switch is undone. The rows it took, or why it failed.
async fn run(shared: Arc<Cluster>, job: Job, resumed: Option<String>) -> Result<u64, MoveError> {
    let mut registered = shared.running_moves.register(job.id, job.epoch);
    let work = async {
        let _turn = shared.running_moves.turn().await;
        let mut resumed = resumed;
        loop {
            let attempt = async {
                if let Some(phase) = &resumed {
                    if !prepare_resumed(&shared, &job, phase).await? {
                        return Ok(0);
                    }
                }
                drive(&shared, &job).await
            };
            let lost = match attempt.await {
                Err(e) if unreachable(&e) => e,
                outcome => return outcome,
            };
            // A server that went away (crashed, restarted), or a backend
            // between writers (a failover, a switchover), is waited for:
            // the job goes on from its checkpoint when it is back, as a
            // takeover would, and a fence it held is undone meanwhile.
            tracing::warn!(job = job.id, "the move waits for a backend: {lost}");
            resumed = loop {
                tokio::time::sleep(BACKEND_RETRY).await;
                match waiting_phase(&shared, &job, &lost).await {
                    Ok(phase) => break Some(phase),
                    Err(e) if unreachable(&e) => continue,
                    Err(e) => return Err(e),
                }
            };
        }
    };
    let outcome = tokio::select! {
        outcome = work => outcome,
        stopped = registered.stopped() => Err(stopped),
    };
    match outcome {
        Ok(taken) => {
            tracing::info!(job = job.id, taken, "move done");
            Ok(taken)
        }
        // The new owner carries on: nothing is undone.
        Err(ProxyError::Move(MoveError::Superseded { job: id })) => {
            tracing::warn!(job = id, "another instance took the move over");
            Err(MoveError::Superseded { job: id })
        }
        Err(ProxyError::Move(MoveError::Cancelled { job: id })) => {
            tracing::warn!(job = id, "move cancelled");
            if let Err(e2) = fail(&shared, &job, "cancelled (CANCEL_MOVE)", "cancelled").await {
                tracing::error!(job = id, "could not undo the cancelled move: {e2}");
            }
            Err(MoveError::Cancelled { job: id })
        }
        Err(e) => {
            tracing::error!(job = job.id, "move failed: {e}");
            if let Err(e2) = fail(&shared, &job, &e.to_string(), "failed").await {
                tracing::error!(job = job.id, "could not record the move's failure: {e2}");
            }
            Err(MoveError::Failed {
                job: job.id,
                reason: e.to_string(),
            })
        }
    }
}

/// How long a job waits after it lost a server before it tries again.
const BACKEND_RETRY: Duration = Duration::from_secs(1);

/// A server of the job's could not be reached or went away mid-command, its
/// backend has no writer or a new one, or this instance has no connection
/// to spare for it: the job waits rather than fail.
fn unreachable(e: &ProxyError) -> bool {
    use crate::backend::BackendError::{
        Connect, ConnectTimeout, Lost, NoWriter, PoolExhausted, SplitBrain, WriterChanged,
    };
    matches!(
        e,
        ProxyError::Backend(
            Connect { .. }
                | ConnectTimeout { .. }
                | Lost { .. }
                | PoolExhausted { .. }
                | WriterChanged { .. }
                | NoWriter { .. }
                | SplitBrain { .. }
        ) | ProxyError::BackendMidAnswer { .. }
    )
}

/// While a job waits for a server: says why in its row (SHOW_MOVES'
/// `last_error`), and answers the phase it goes on from. A cancel or a
/// takeover ends the wait.
async fn waiting_phase(
    shared: &Cluster,
    job: &Job,
    lost: &ProxyError,
) -> Result<String, ProxyError> {
    let mut main = rows_connection(shared, shared.main).await?;
    let why = text_literal(&format!("waiting for a server: {lost}"));
    progress(shared, &mut main, job, &format!("last_error = {why}")).await?;
    let sql = format!("SELECT phase FROM {} WHERE id = {}", jobs(shared), job.id);
    Ok(store::text(&exec(&mut main, &sql).await?, 0, 0))
}

/// What every instance does for moves as often as it refreshes its
/// dictionary: takes over jobs whose owner stopped, drops retired tables
/// past their retention. A failure is logged; false if the connection
/// failed.
pub async fn sweep(shared: &Arc<Cluster>, conn: &mut BackendConn) -> bool {
    let beaten = running::beat(&shared.running_moves, conn, &jobs(shared)).await;
    if let Err(e) = &beaten {
        tracing::warn!("cannot beat the hearts of this instance's moves: {e}");
    }
    let taken = take_over(shared, conn).await;
    if let Err(e) = &taken {
        tracing::warn!("cannot look for moves to take over: {e}");
    }
    let dropped = drop_retired(shared, conn).await;
    if let Err(e) = &dropped {
        tracing::warn!("cannot drop retired tables: {e}");
    }
    // A connection that failed is made again.
    ![beaten, taken, dropped]
        .iter()
        .any(|outcome| matches!(outcome, Err(ProxyError::Backend(_))))
}

/// A move is catching up to its fence or fencing: instances poll the
/// dictionary often until it has switched.
pub async fn fencing_soon(shared: &Cluster, conn: &mut BackendConn) -> bool {
    let sql = format!(
        "SELECT 1 FROM {} WHERE phase IN ('catching_up', 'fencing') LIMIT 1",
        jobs(shared)
    );
    exec(conn, &sql).await.is_ok_and(|rows| !rows.is_empty())
}

/// Takes over every job whose owner's heartbeat is older than the lease
/// (the owner died or stalled) and resumes it here. Every instance runs
/// this as often as it refreshes its dictionary; the epoch's
/// compare-and-set lets one win.
async fn take_over(shared: &Arc<Cluster>, conn: &mut BackendConn) -> Result<(), ProxyError> {
    let lease_us = shared.dictionary.lease.as_micros();
    let stale = format!(
        "phase NOT IN ('done', 'failed', 'cancelled') AND heartbeat < NOW(6) - INTERVAL {lease_us} MICROSECOND"
    );
    let candidates = exec(
        conn,
        &format!("SELECT id, epoch FROM {} WHERE {stale}", jobs(shared)),
    )
    .await?;
    for r in 0..candidates.len() {
        let (id, epoch) = (
            store::text(&candidates, r, 0),
            store::text(&candidates, r, 1),
        );
        let claim = format!(
            "UPDATE {} SET owner = {}, epoch = epoch + 1, heartbeat = NOW(6) WHERE id = {id} AND epoch = {epoch} AND {stale}",
            jobs(shared),
            text_literal(&shared.dictionary.instance)
        );
        exec(conn, &claim).await?;
        if store::text(&exec(conn, "SELECT ROW_COUNT()").await?, 0, 0) != "1" {
            continue;
        }
        match load_job(shared, conn, &id).await {
            Ok((job, phase)) => {
                tracing::warn!(job = job.id, phase = %phase, "taking over a move whose owner stopped");
                shared.spawn_background(resume(Arc::clone(shared), job, phase));
            }
            // Its table is no longer partitioned, or its row is unreadable:
            // nothing can carry it on.
            Err(e) => {
                tracing::error!(job = %id, "cannot take the move over: {e}");
                let failed = format!(
                    "UPDATE {} SET phase = 'failed', last_error = {}, finished = NOW(6) WHERE id = {id}",
                    jobs(shared),
                    text_literal(&format!("cannot be taken over: {e}"))
                );
                exec(conn, &failed).await?;
            }
        }
    }
    Ok(())
}

/// A job as its row and the dictionary have it, with its phase.
async fn load_job(
    shared: &Cluster,
    conn: &mut BackendConn,
    id: &str,
) -> Result<(Job, String), ProxyError> {
    let rows = exec(
        conn,
        &format!(
            "SELECT db, table_name, partition_name, source_backend, destination_backend, split_value, into_partition, into_existing, keyless, epoch, phase FROM {} WHERE id = {id}",
            jobs(shared)
        ),
    )
    .await?;
    let text = |c| store::text(&rows, 0, c);
    let table = TableName {
        db: text(0),
        name: text(1),
    };
    let dictionary = store::load(conn, &shared.dictionary).await?;
    let t = partitioned(&dictionary, &table)?;
    let (partition, physical) = match text(2).as_str() {
        DEFAULT_PARTITION => (None, t.default_table.clone()),
        p => (Some(p.to_string()), t.partition_table(p)),
    };
    let work = match (rows[0][5].is_some(), rows[0][6].is_some()) {
        (false, false) => Work::Move,
        (false, true) => Work::Merge,
        (true, _) => Work::Split {
            value: text(5),
            into: text(6),
            into_existing: text(7) == "1",
            column: t.column.clone(),
            routing: Routing {
                function: t.function.clone(),
                kind: t.kind,
                folding: t.folding.clone(),
            },
        },
    };
    let job = Job {
        id: id.parse().unwrap_or(0),
        table,
        partition,
        physical,
        source: text(3).parse().unwrap_or(0),
        destination: text(4).parse().unwrap_or(0),
        work,
        in_fence: text(8) == "1",
        epoch: text(9).parse().unwrap_or(0),
        notes: Notes::default(),
    };
    Ok((job, text(10)))
}

/// Carries a job on where its last owner stopped: a fence it held is
/// undone (the switch had not happened) or, for a job whose rows had all
/// moved in its fence, finished; a switched job is finished; the copy resumes
/// from its checkpoint.
async fn resume(shared: Arc<Cluster>, job: Job, phase: String) {
    drop(run(shared, job, Some(phase)).await);
}

/// What a job that was taken over in `phase` does before it carries on
/// (under its new owner's heartbeat): true if it goes on to `drive`.
async fn prepare_resumed(shared: &Cluster, job: &Job, phase: &str) -> Result<bool, ProxyError> {
    let mut main = rows_connection(shared, shared.main).await?;
    // Only a split needs the source after its switch: a move or a merge
    // ends while its source is away.
    let source_slot = slot(shared, job.source)?;
    let source = || rows_connection(shared, source_slot);
    match phase {
        "switched" => {
            forget_progress(shared, job).await;
            if let Work::Split { .. } = job.work {
                finish_split(shared, &mut main, &mut *source().await?, job).await?;
            }
            progress(shared, &mut main, job, "phase = 'done', finished = NOW(6)").await?;
            return Ok(false);
        }
        "fence_moved" => {
            roll_forward_in_fence(shared, &mut main, &mut *source().await?, job).await?;
            return Ok(false);
        }
        "fencing" => undo_fence(shared, &mut main, &mut *source().await?, job).await?,
        _ => ensure_created(shared, &mut *source().await?, job).await?,
    }
    Ok(true)
}

/// A fence the last owner held before its switch, undone: the source's
/// table back under its name, rows staged into an existing partition or
/// moved in a split's fence deleted there, the tables the copy
/// writes there again (a merged stage is gone: its copy starts over).
async fn undo_fence(
    shared: &Cluster,
    main: &mut BackendConn,
    source: &mut BackendConn,
    job: &Job,
) -> Result<(), ProxyError> {
    let staged_into = match &job.work {
        Work::Split {
            into,
            into_existing,
            ..
        } if *into_existing || job.in_fence => Some(job.partition_place(into)),
        Work::Merge => job.joined(shared),
        _ => None,
    };
    if let Some(place) = staged_into {
        let mut conn = rows_connection(shared, slot(shared, job.destination)?).await?;
        if place.exists(&mut conn).await? {
            delete_value_rows(shared, job, job.destination, place).await?;
        }
    }
    let (physical, retired) = (job.source_place(), job.retired(shared));
    if !physical.exists(source).await? && retired.exists(source).await? {
        exec(source, &rename(&retired, &physical)).await?;
    }
    // The source serves again before the tables the copy writes are made
    // again, which waits for their server if it is the one that went away.
    let mut changes = fence_statements(shared, job, false);
    changes.push(format!(
        "UPDATE {} SET phase = 'catching_up' WHERE id = {}",
        jobs(shared),
        job.id
    ));
    change_owned(shared, main, job, &changes).await?;
    crate::dictionary::reload(shared).await?;
    ensure_created(shared, source, job).await
}

/// The tables the job writes, made again where they are missing (an owner
/// that stopped before it made them, a stage merged before a fence was
/// undone); the copy then starts over, its progress forgotten.
async fn ensure_created(
    shared: &Cluster,
    source: &mut BackendConn,
    job: &Job,
) -> Result<(), ProxyError> {
    let mut restart = false;
    for (backend, place) in job.created(shared) {
        let mut conn = rows_connection(shared, slot(shared, backend)?).await?;
        if !place.exists(&mut conn).await? {
            create_like(shared, job, source, &mut conn, &place, backend).await?;
            restart = true;
        }
    }
    if restart {
        // Nothing reads them before the switch: they start empty again.
        for (backend, place) in job.created(shared) {
            let mut conn = rows_connection(shared, slot(shared, backend)?).await?;
            exec(&mut conn, &format!("TRUNCATE TABLE {}", place.qualified())).await?;
        }
        forget_progress(shared, job).await;
    }
    Ok(())
}

/// Removes the job's progress rows on every part's server; a server that
/// never had them (rows moved in the fence) is passed over.
async fn forget_progress(shared: &Cluster, job: &Job) {
    let forget = format!(
        "DELETE FROM {}.move_progress WHERE job = {}",
        ident(&shared.dictionary.schema),
        job.id
    );
    for (backend, _) in job.created(shared) {
        if let Ok(slot) = slot(shared, backend) {
            if let Ok(mut conn) = rows_connection(shared, slot).await {
                let _ = exec(&mut conn, &forget).await;
            }
        }
    }
}

/// A job whose rows had all reached their place in its fence: a split's
/// source copies go, the dictionary switches, a split's source comes back.
async fn roll_forward_in_fence(
    shared: &Cluster,
    main: &mut BackendConn,
    source: &mut BackendConn,
    job: &Job,
) -> Result<(), ProxyError> {
    delete_value_rows(shared, job, job.source, job.retired(shared)).await?;
    let mut switch = switch_statements(shared, job);
    switch.push(format!(
        "UPDATE {} SET phase = 'switched', heartbeat = NOW(6) WHERE id = {}",
        jobs(shared),
        job.id
    ));
    change_owned(shared, main, job, &switch).await?;
    crate::dictionary::reload(shared).await?;
    if let Work::Split { .. } = job.work {
        finish_split(shared, main, source, job).await?;
    }
    progress(shared, main, job, "phase = 'done', finished = NOW(6)").await
}

/// After a failure: before the switch, the source gets its table back and
/// its partition served again, and the tables the job wrote go; after it,
/// the switch is finished (the dictionary names the new place already).
async fn fail(shared: &Cluster, job: &Job, error: &str, ends: &str) -> Result<(), ProxyError> {
    let mut main = rows_connection(shared, shared.main).await?;
    let phase = exec(
        &mut main,
        &format!("SELECT phase FROM {} WHERE id = {}", jobs(shared), job.id),
    )
    .await?;
    let mut source = rows_connection(shared, slot(shared, job.source)?).await?;
    // The rows left the source in its fence: finished.
    if store::text(&phase, 0, 0) == "fence_moved" {
        return roll_forward_in_fence(shared, &mut main, &mut source, job).await;
    }
    if matches!(store::text(&phase, 0, 0).as_str(), "switched" | "done") {
        if let Work::Split { .. } = job.work {
            finish_split(shared, &mut main, &mut source, job).await?;
        }
        return progress(
            shared,
            &mut main,
            job,
            &format!(
                "phase = 'done', finished = NOW(6), last_error = {}",
                text_literal(error)
            ),
        )
        .await;
    }
    // Rows a split added to an existing partition, or a merge to the
    // default table (only ever in its fence), go before the values are
    // served from the source again.
    let joined = match &job.work {
        Work::Split {
            into,
            into_existing: true,
            ..
        } => Some(job.partition_place(into)),
        Work::Merge if store::text(&phase, 0, 0) == "fencing" => job.joined(shared),
        _ => None,
    };
    if let Some(place) = joined {
        delete_value_rows(shared, job, job.destination, place).await?;
    }
    // A fence that renamed the source table gives it its name back before
    // the partition is served from it again.
    let (physical, retired) = (job.source_place(), job.retired(shared));
    if !physical.exists(&mut source).await? && retired.exists(&mut source).await? {
        exec(&mut source, &rename(&retired, &physical)).await?;
    }
    // The source serves again before the job's tables go: their server may
    // be the one that is away, and the job then ends when a later owner
    // finds it again (its heartbeat stops here).
    change_owned(
        shared,
        &mut main,
        job,
        &fence_statements(shared, job, false),
    )
    .await?;
    crate::dictionary::reload(shared).await?;
    // Nothing names them: a retry starts clean.
    for (backend, place) in job.created(shared) {
        let mut conn = rows_connection(shared, slot(shared, backend)?).await?;
        exec(
            &mut conn,
            &format!("DROP TABLE IF EXISTS {}", place.qualified()),
        )
        .await?;
    }
    let ended = format!(
        "UPDATE {} SET phase = {}, last_error = {}, finished = NOW(6) WHERE id = {}",
        jobs(shared),
        text_literal(ends),
        text_literal(error),
        job.id
    );
    change_owned(shared, &mut main, job, &[ended]).await
}

/// Sets a partition's state (and backend) as a dictionary change.
fn partition_state(
    shared: &Cluster,
    job: &Job,
    partition: &str,
    state: PartitionState,
    backend: Option<u32>,
) -> String {
    let backend = backend.map_or(String::new(), |b| format!(", backend = {b}"));
    format!(
        "UPDATE {}.partitions SET state = '{}'{backend} WHERE db = {} AND table_name = {} AND partition_name = {}",
        ident(&shared.dictionary.schema),
        state.name(),
        text_literal(&job.table.db),
        text_literal(&job.table.name),
        text_literal(partition)
    )
}

/// Sets the default table's state (and backend).
fn default_state(
    shared: &Cluster,
    job: &Job,
    state: PartitionState,
    backend: Option<u32>,
) -> String {
    let backend = backend.map_or(String::new(), |b| format!(", default_backend = {b}"));
    format!(
        "UPDATE {}.tables SET default_state = '{}'{backend} WHERE db = {} AND name = {}",
        ident(&shared.dictionary.schema),
        state.name(),
        text_literal(&job.table.db),
        text_literal(&job.table.name)
    )
}

/// The source partition's state, as a dictionary change.
fn source_state(shared: &Cluster, job: &Job, state: PartitionState) -> String {
    match &job.partition {
        Some(p) => partition_state(shared, job, p, state, None),
        None => default_state(shared, job, state, None),
    }
}

/// Fences (or lifts the fence of) what a job switches: the partition it
/// moves or splits, and a partition a split adds rows to.
fn fence_statements(shared: &Cluster, job: &Job, fenced: bool) -> Vec<String> {
    let state = match fenced {
        true => PartitionState::Fenced,
        false => PartitionState::Active,
    };
    let mut changes = vec![source_state(shared, job, state)];
    match &job.work {
        Work::Split {
            into,
            into_existing: true,
            ..
        } => changes.push(partition_state(shared, job, into, state, None)),
        Work::Merge => changes.push(default_state(shared, job, state, None)),
        _ => {}
    }
    changes
}

/// The dictionary's switch to the new place, in one transaction with the
/// job's phase `switched`. A split's source stays fenced until its rebuilt
/// table has the source's name (`finish_split`).
fn switch_statements(shared: &Cluster, job: &Job) -> Vec<String> {
    let s = ident(&shared.dictionary.schema);
    match (&job.work, &job.partition) {
        (Work::Move, Some(p)) => vec![partition_state(
            shared,
            job,
            p,
            PartitionState::Active,
            Some(job.destination),
        )],
        (Work::Move, None) => vec![default_state(
            shared,
            job,
            PartitionState::Active,
            Some(job.destination),
        )],
        // Its values route to the default table, which holds their rows.
        (Work::Merge, partition) => vec![
            format!(
                "DELETE FROM {s}.partitions WHERE db = {} AND table_name = {} AND partition_name = {}",
                text_literal(&job.table.db),
                text_literal(&job.table.name),
                text_literal(partition.as_deref().unwrap_or_default())
            ),
            default_state(shared, job, PartitionState::Active, None),
        ],
        (
            Work::Split {
                value,
                into,
                into_existing,
                ..
            },
            from,
        ) => {
            let mut changes = vec![match from {
                None => format!(
                    "INSERT INTO {s}.partitions (db, table_name, partition_value, partition_name, backend, state) VALUES ({}, {}, {}, {}, {}, 'active')",
                    text_literal(&job.table.db),
                    text_literal(&job.table.name),
                    text_literal(value),
                    text_literal(into),
                    job.destination
                ),
                Some(_) => format!(
                    "UPDATE {s}.partitions SET partition_name = {}, backend = {}, state = 'active' WHERE db = {} AND table_name = {} AND partition_value = {}",
                    text_literal(into),
                    job.destination,
                    text_literal(&job.table.db),
                    text_literal(&job.table.name),
                    text_literal(value)
                ),
            }];
            if *into_existing {
                changes.push(partition_state(
                    shared,
                    job,
                    into,
                    PartitionState::Active,
                    None,
                ));
            }
            changes
        }
    }
}

/// The rows of a job that moves them in its fence, moved while the source
/// is fenced and retired: nothing else reads or writes them. A move's
/// destination is the job's own table, emptied first: a fence undone after
/// it copied some is copied again whole.
async fn move_in_fence(
    shared: &Cluster,
    main: &mut BackendConn,
    job: &Job,
) -> Result<u64, ProxyError> {
    let dictionary = shared.dictionary.snapshot();
    let t = partitioned(&dictionary, &job.table)?;
    let (backend, taken) = job.taken(shared);
    let from = offline(shared, job.source, job.retired(shared))?;
    let to = offline(shared, backend, taken)?;
    let (moved, values) = match &job.work {
        Work::Split { value, .. } => {
            let values = std::slice::from_ref(value);
            (
                offline::copy_rows(shared, t, values, &from, &to).await?,
                values,
            )
        }
        Work::Move => (offline::copy_all_rows(shared, &from, &to).await?, &[][..]),
        Work::Merge => return Ok(0),
    };
    // From here a takeover finishes the split rather than undo it.
    progress(
        shared,
        main,
        job,
        &format!("phase = 'fence_moved', rows_copied = {moved}"),
    )
    .await?;
    if !values.is_empty() {
        offline::delete_rows(shared, t, values, &from).await?;
    }
    Ok(moved)
}

/// A split after its switch: the rebuilt rest takes the source's name,
/// and the source is served again. Run again after a failure, it does
/// what is left.
async fn finish_split(
    shared: &Cluster,
    main: &mut BackendConn,
    source: &mut BackendConn,
    job: &Job,
) -> Result<(), ProxyError> {
    // A split in its fence left the rest in the source itself.
    let rest = match job.in_fence {
        true => job.retired(shared),
        false => job.own(shared, "rest"),
    };
    let physical = job.source_place();
    if !physical.exists(source).await? && rest.exists(source).await? {
        exec(source, &rename(&rest, &physical)).await?;
    }
    // What stays of the partition is under its name again.
    children_follow(shared, source, job, &job.retired(shared), Some(&physical)).await?;
    change_owned(
        shared,
        main,
        job,
        &[source_state(shared, job, PartitionState::Active)],
    )
    .await?;
    crate::dictionary::reload(shared).await
}

/// Other tables' foreign keys that named the partition's table followed its
/// rename to `retired` (InnoDB moves them with a renamed parent): pointed at
/// `now`, the table that holds those rows on this backend since, or left
/// out where none does. A child busy past a few seconds keeps its
/// constraint on the retired table, and says so.
async fn children_follow(
    shared: &Cluster,
    source: &mut BackendConn,
    job: &Job,
    retired: &Place,
    now: Option<&Place>,
) -> Result<(), ProxyError> {
    let children = exec(
        source,
        &format!(
            "SELECT CONSTRAINT_SCHEMA, TABLE_NAME, CONSTRAINT_NAME FROM information_schema.REFERENTIAL_CONSTRAINTS WHERE UNIQUE_CONSTRAINT_SCHEMA = {} AND REFERENCED_TABLE_NAME = {}",
            text_literal(&retired.db),
            text_literal(&retired.name)
        ),
    )
    .await?;
    if children.is_empty() {
        return Ok(());
    }
    // Clients' statements on the child queue behind a waiting ALTER.
    exec(source, "SET SESSION lock_wait_timeout = 5").await?;
    let dictionary = shared.dictionary.snapshot();
    let parent = dictionary.table(&job.table.db, &job.table.name);
    for row in 0..children.len() {
        let child = Place::new(
            &store::text(&children, row, 0),
            &store::text(&children, row, 1),
        );
        let name = store::text(&children, row, 2);
        let definition = store::definition(source, &child.db, &child.name).await?;
        // Only a co-located child's rows have their parents in what stays;
        // a plain table's, or another key's, may now be on another backend.
        let child_table = dictionary
            .logical_name(child.db.as_bytes(), child.name.as_bytes())
            .and_then(|logical| dictionary.table(&child.db, logical));
        let reference = definition
            .as_deref()
            .and_then(|d| foreign_keys::named(d, &name));
        let follows = match (child_table, parent, &reference) {
            (Some(child_table), Some(parent), Some(reference)) => {
                co_located(child_table, parent, reference)
            }
            _ => false,
        };
        let readded = match (now, &definition) {
            (Some(place), Some(definition)) if follows => {
                foreign_keys::pointed_at(definition, &name, &place.db, &place.name)
            }
            _ => None,
        };
        // Two statements: InnoDB refuses a name dropped and added in one.
        let mut alters = vec![format!(
            "ALTER TABLE {} DROP FOREIGN KEY {}",
            child.qualified(),
            ident(&name)
        )];
        if let Some(item) = &readded {
            alters.push(format!("ALTER TABLE {} ADD {item}", child.qualified()));
        }
        let mut refused = None;
        for alter in &alters {
            if let Err(e) = source.query(alter).await? {
                refused = Some(e.message);
                break;
            }
        }
        match (refused, &readded) {
            (None, Some(_)) => {}
            (None, None) => {
                tracing::warn!(job = job.id, table = %job.table, child = %child.qualified(), constraint = %name, "a foreign key naming the moved partition is left out: its parent rows are no longer all on this backend");
                job.note(format!(
                    "Foreign key {name} of {} left out: its parent rows are no longer all on its backend, and it is not enforced there",
                    child.qualified()
                ));
            }
            (Some(message), _) => {
                tracing::warn!(job = job.id, table = %job.table, child = %child.qualified(), constraint = %name, "a foreign key naming the moved partition could not follow it ({message}): it is not enforced");
                job.note(format!(
                    "Foreign key {name} of {} could not follow the moved partition ({message}): it is not enforced",
                    child.qualified()
                ));
            }
        }
    }
    Ok(())
}

/// Records the job's progress (and its heartbeat), while it is this
/// owner's.
async fn progress(
    shared: &Cluster,
    main: &mut BackendConn,
    job: &Job,
    set: &str,
) -> Result<(), ProxyError> {
    let sql = format!(
        "UPDATE {} SET {set}, heartbeat = NOW(6) WHERE id = {} AND epoch = {}",
        jobs(shared),
        job.id,
        job.epoch
    );
    exec(main, &sql).await?;
    let state = exec(
        main,
        &format!(
            "SELECT ROW_COUNT(), (SELECT cancel AND phase IN ('copying', 'catching_up', 'fencing') FROM {} WHERE id = {})",
            jobs(shared),
            job.id
        ),
    )
    .await?;
    match (
        store::text(&state, 0, 0).as_str(),
        store::text(&state, 0, 1).as_str(),
    ) {
        ("0", _) => Err(MoveError::Superseded { job: job.id }.into()),
        (_, "1") => Err(MoveError::Cancelled { job: job.id }.into()),
        _ => Ok(()),
    }
}

/// HSCALE CANCEL_MOVE(id): asks a job that has not switched yet to stop;
/// its owner undoes what it did at its next step (SHOW_MOVES: `cancelled`).
pub async fn cancel(shared: &Cluster, id: u64) -> Result<AdminAnswer, ProxyError> {
    let mut main = rows_connection(shared, shared.main).await?;
    let sql = format!(
        "UPDATE {} SET cancel = TRUE WHERE id = {id} AND phase IN ('copying', 'catching_up', 'fencing')",
        jobs(shared)
    );
    exec(&mut main, &sql).await?;
    match store::text(&exec(&mut main, "SELECT ROW_COUNT()").await?, 0, 0).as_str() {
        "1" => Ok(AdminAnswer::done(1)),
        _ => Err(
            AdminError::Invalid(format!("move {id} is not running, or is past its switch")).into(),
        ),
    }
}

/// A dictionary change of the job's, made only while the job is this
/// owner's.
async fn change_owned(
    shared: &Cluster,
    main: &mut BackendConn,
    job: &Job,
    statements: &[String],
) -> Result<(), ProxyError> {
    let owned = format!(
        "SELECT epoch = {} FROM {} WHERE id = {} FOR UPDATE",
        job.epoch,
        jobs(shared),
        job.id
    );
    match store::change_if(main, &shared.dictionary.schema, &owned, statements).await? {
        true => Ok(()),
        false => Err(MoveError::Superseded { job: job.id }.into()),
    }
}

/// The parts a job writes, each with the rows it takes.
fn parts(shared: &Cluster, job: &Job, moved: &MovedTable) -> Result<Vec<Part>, ProxyError> {
    let mut filters: Vec<Box<dyn RowFilter>> = match &job.work {
        Work::Move | Work::Merge => vec![Box::new(EveryRow)],
        Work::Split {
            value,
            column,
            routing,
            ..
        } => {
            let taken =
                ValuesFilter::new(&moved.columns, column, routing.clone(), vec![value.clone()])?;
            let rest = taken.rest();
            vec![Box::new(taken), Box::new(rest)]
        }
    };
    job.created(shared)
        .into_iter()
        .zip(filters.drain(..))
        .map(|((backend, place), filter)| {
            Ok(Part {
                table: moved.to(place.qualified()),
                filter,
                slot: slot(shared, backend)?,
            })
        })
        .collect()
}

/// Copies, catches up, fences and switches; the rows the first part took.
async fn drive(shared: &Cluster, job: &Job) -> Result<u64, ProxyError> {
    let source_slot = slot(shared, job.source)?;
    let mut main = rows_connection(shared, shared.main).await?;
    if job.in_fence {
        let moved = fence_and_switch(shared, &mut main, job, None).await?;
        if let Work::Split { .. } = job.work {
            let mut source = rows_connection(shared, source_slot).await?;
            finish_split(shared, &mut main, &mut source, job).await?;
        }
        progress(shared, &mut main, job, "phase = 'done', finished = NOW(6)").await?;
        return Ok(moved);
    }
    let moved = {
        let mut conn = rows_connection(shared, source_slot).await?;
        table::describe(&mut conn, &job.table.db, &job.physical, &job.physical).await?
    };
    let watched = Watched {
        db: job.table.db.clone(),
        table: job.physical.clone(),
        columns: moved.columns.len(),
    };
    let parts = parts(shared, job, &moved)?;
    let mut copy = ChunkCopy::open(shared, job.id, job.epoch, parts, watched, source_slot).await?;
    // Its own renames of the source (a fence's, a takeover's undoing one)
    // are no change to the table.
    copy.fence_rename = Some(job.retired(shared).name);
    copy.resume_applier(shared).await?;
    let (copy_started, resumed_at) = (Instant::now(), copy.checkpoint.rows_copied);
    while !copy.checkpoint.copy_done && copy.copy_chunk(shared, CHUNK_ROWS).await? {
        let copied = copy.checkpoint.rows_copied - resumed_at;
        throttle(shared, &mut main, job, &mut copy, copied, copy_started).await?;
        let c = &copy;
        progress(
            shared,
            &mut main,
            job,
            &format!(
                "rows_copied = {}, chunks_verified = {}, chunks_repaired = {}",
                c.checkpoint.rows_copied, c.chunks_verified, c.chunks_repaired
            ),
        )
        .await?;
    }
    progress(
        shared,
        &mut main,
        job,
        &format!(
            "phase = 'catching_up', rows_copied = {}, chunks_verified = {}, chunks_repaired = {}",
            copy.checkpoint.rows_copied, copy.chunks_verified, copy.chunks_repaired
        ),
    )
    .await?;
    let (catching_up, all_poll_often) = (
        Instant::now(),
        shared.dictionary.refresh + crate::dictionary::FENCE_POLL,
    );
    loop {
        copy.on_current_writers(shared)?;
        let end = binlog::end_of_log(copy.source()).await?;
        let lag = copy.lag_bytes(&end);
        progress(
            shared,
            &mut main,
            job,
            &format!(
                "lag_bytes = {}, lag_seconds = {}",
                lag.min(i64::MAX as u64),
                copy.lag_seconds(&end)
            ),
        )
        .await?;
        copy.apply_until(&end).await?;
        if lag <= CLOSE_ENOUGH_BYTES {
            // Every instance polls often once it has seen this phase: the
            // fence then waits for no instance's slow poll.
            if catching_up.elapsed() >= all_poll_often {
                break;
            }
            tokio::time::sleep(crate::dictionary::FENCE_POLL).await;
        }
    }
    let taken = {
        let (backend, taken) = &job.taken(shared);
        let mut conn = rows_connection(shared, slot(shared, *backend)?).await?;
        let count = format!("SELECT COUNT(*) FROM {}", taken.qualified());
        store::text(&exec(&mut conn, &count).await?, 0, 0)
            .parse()
            .unwrap_or(0)
    };
    fence_and_switch(shared, &mut main, job, Some(&mut copy)).await?;
    copy.finish().await?;
    let mut source = rows_connection(shared, source_slot).await?;
    match job.work {
        Work::Split { .. } => finish_split(shared, &mut main, &mut source, job).await?,
        // The partition's rows left the backend: nothing there holds the
        // parents of the rows that name them.
        _ => children_follow(shared, &mut source, job, &job.retired(shared), None).await?,
    }
    progress(
        shared,
        &mut main,
        job,
        "phase = 'done', finished = NOW(6), lag_bytes = 0",
    )
    .await?;
    tracing::info!(job = job.id, retired = %job.retired(shared).qualified(), "the partition's old table is kept under its retired name");
    Ok(taken)
}

/// Holds the copy to `[moves] rows_per_s`, and pauses it while a server it
/// reads or writes runs more than `[moves] max_threads_running` statements.
async fn throttle(
    shared: &Cluster,
    main: &mut BackendConn,
    job: &Job,
    copy: &mut ChunkCopy,
    copied: u64,
    started: Instant,
) -> Result<(), ProxyError> {
    let limits = &shared.moves;
    if limits.rows_per_s > 0 {
        let due = Duration::from_secs_f64(copied as f64 / limits.rows_per_s as f64);
        if let Some(early) = due.checked_sub(started.elapsed()) {
            tokio::time::sleep(early).await;
        }
    }
    if limits.max_threads_running > 0 {
        while copy.threads_running().await? > limits.max_threads_running {
            // A cancel or a takeover still reaches a paused copy.
            progress(shared, main, job, "owner = owner").await?;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    Ok(())
}

/// Drops the old tables of moves that ended more than `[moves]
/// retired_retention_s` ago. Every instance runs this with its dictionary
/// refresh; dropping one twice is harmless.
async fn drop_retired(shared: &Cluster, conn: &mut BackendConn) -> Result<(), ProxyError> {
    let due = exec(
        conn,
        &format!(
            "SELECT id, source_backend, retired_table FROM {} WHERE phase = 'done' AND retired_table IS NOT NULL AND finished < NOW(6) - INTERVAL {} SECOND",
            jobs(shared),
            shared.moves.retired_retention_s
        ),
    )
    .await?;
    for r in 0..due.len() {
        let backend: u32 = store::text(&due, r, 1).parse().unwrap_or(0);
        let table = store::text(&due, r, 2);
        let dropped = async {
            let mut source = rows_connection(shared, slot(shared, backend)?).await?;
            exec(&mut source, &format!("DROP TABLE IF EXISTS {table}")).await
        };
        if let Err(e) = dropped.await {
            tracing::warn!(table = %table, backend, "cannot drop a retired table: {e}");
            continue;
        }
        exec(
            conn,
            &format!(
                "UPDATE {} SET retired_table = NULL WHERE id = {}",
                jobs(shared),
                store::text(&due, r, 0)
            ),
        )
        .await?;
        tracing::info!(table = %table, backend, "a moved partition's retired table is dropped");
    }
    Ok(())
}

/// Fences the partition, renames its old table out of the way on the
/// source, applies the last changes and points the dictionary at the new
/// place. A fence that an instance does not acknowledge in time, or that
/// an open transaction holds back, is lifted and tried again later.
async fn fence_and_switch(
    shared: &Cluster,
    main: &mut BackendConn,
    job: &Job,
    mut copy: Option<&mut ChunkCopy>,
) -> Result<u64, ProxyError> {
    let retired = job.retired(shared);
    let source_pool = &shared.pools[slot(shared, job.source)?];
    let mut source = rows_connection(shared, slot(shared, job.source)?).await?;
    exec(&mut source, "SET SESSION lock_wait_timeout = 1").await?;
    for attempt in 1..=FENCE_ATTEMPTS {
        // A cancel or a takeover stops the job before it fences again.
        progress(shared, main, job, "owner = owner").await?;
        let started = Instant::now();
        let mut fence = fence_statements(shared, job, true);
        fence.push(format!(
            "UPDATE {} SET phase = 'fencing', fence_attempts = {attempt}, heartbeat = NOW(6) WHERE id = {}",
            jobs(shared),
            job.id
        ));
        change_owned(shared, main, job, &fence).await?;
        crate::dictionary::reload(shared).await?;
        let version = store::read_version(main, &shared.dictionary.schema).await?;
        let acknowledged =
            crate::dictionary::all_instances_loaded(shared, main, version, FENCE_BUDGET).await?;
        let renamed = match acknowledged {
            false => Err(format!(
                "an instance did not load the fence within {FENCE_BUDGET:?}"
            )),
            true => {
                if let Some(copy) = copy.as_deref_mut() {
                    copy.on_current_writers(shared)?;
                    copy.fence_rename = Some(retired.name.clone());
                }
                source_pool.ensure_current(&source)?;
                let rename = rename(&job.source_place(), &retired);
                match source.query(&rename).await? {
                    Ok(_) => Ok(()),
                    Err(refused) => Err(refused.message),
                }
            }
        };
        if let Err(reason) = renamed {
            lift_fence(shared, main, job, attempt, &reason).await?;
            continue;
        }
        let mut moved = 0;
        match copy.as_deref_mut() {
            Some(copy) => {
                // Nothing writes the old table now: its last changes are in
                // the log, but for those of XA transactions prepared on it,
                // which their XA COMMIT may still make.
                let end = binlog::end_of_log(&mut source).await?;
                copy.apply_until(&end).await?;
                if let Some(xid) = copy.undecided_touching() {
                    let reason = format!("the prepared XA transaction {xid} changed the partition and is not decided yet");
                    exec(&mut source, &rename(&retired, &job.source_place())).await?;
                    lift_fence(shared, main, job, attempt, &reason).await?;
                    continue;
                }
            }
            None => moved = move_in_fence(shared, main, job).await?,
        }
        if let Some(into) = job.joined(shared) {
            // The staged rows join the partition or the default table,
            // fenced too.
            let (backend, stage) = &job.taken(shared);
            let mut conn = rows_connection(shared, slot(shared, *backend)?).await?;
            let merge = format!(
                "INSERT INTO {} SELECT * FROM {}",
                into.qualified(),
                stage.qualified()
            );
            exec(&mut conn, &merge).await?;
            exec(&mut conn, &format!("DROP TABLE {}", stage.qualified())).await?;
        }
        // The rows reached the writers the dictionary is about to name.
        if let Some(copy) = copy.as_deref() {
            copy.on_current_writers(shared)?;
        }
        source_pool.ensure_current(&source)?;
        let fence_ms = started.elapsed().as_millis();
        let mut switch = switch_statements(shared, job);
        switch.push(format!(
            "UPDATE {} SET phase = 'switched', last_fence_ms = {fence_ms}, retired_table = {}, heartbeat = NOW(6) WHERE id = {}",
            jobs(shared),
            text_literal(&retired.qualified()),
            job.id
        ));
        change_owned(shared, main, job, &switch).await?;
        crate::dictionary::reload(shared).await?;
        tracing::info!(job = job.id, attempt, fence_ms, "partition switched");
        return Ok(moved);
    }
    Err(MoveError::Unsupported(format!(
        "the partition could not be fenced in {FENCE_ATTEMPTS} attempts: a transaction kept it open, or an instance did not answer"
    ))
    .into())
}

/// Lifts a fence that could not switch (`reason`) and waits before the
/// next attempt.
async fn lift_fence(
    shared: &Cluster,
    main: &mut BackendConn,
    job: &Job,
    attempt: u32,
    reason: &str,
) -> Result<(), ProxyError> {
    tracing::warn!(job = job.id, attempt, "fence lifted: {reason}");
    change_owned(shared, main, job, &fence_statements(shared, job, false)).await?;
    crate::dictionary::reload(shared).await?;
    tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
    Ok(())
}

/// HSCALE SHOW_MOVES: every job, newest first.
pub async fn show(shared: &Cluster) -> Result<AdminAnswer, ProxyError> {
    use hscale_wire::resultset::ColumnType::{Integer, Text};
    let mut main = rows_connection(shared, shared.main).await?;
    let rows = exec(
        &mut main,
        &format!(
            "SELECT id, CONCAT(db, '.', table_name), partition_name, source_backend, destination_backend, phase, rows_copied, rows_estimated, chunks_verified, chunks_repaired, lag_bytes, lag_seconds, IF(phase = 'copying' AND rows_copied > 0, CEIL(IF(rows_estimated > rows_copied, rows_estimated - rows_copied, 0) * TIMESTAMPDIFF(MICROSECOND, started, heartbeat) / rows_copied / 1000000), NULL), fence_attempts, last_fence_ms, retired_table, last_error FROM {} ORDER BY id DESC",
            jobs(shared)
        ),
    )
    .await?;
    let columns = vec![
        ("job", Integer),
        ("table", Text),
        ("partition", Text),
        ("from_backend", Integer),
        ("to_backend", Integer),
        ("phase", Text),
        ("rows_copied", Integer),
        ("rows_estimated", Integer),
        ("chunks_verified", Integer),
        ("chunks_repaired", Integer),
        ("lag_bytes", Integer),
        ("lag_seconds", Integer),
        ("eta_seconds", Integer),
        ("fence_attempts", Integer),
        ("last_fence_ms", Integer),
        ("retired_table", Text),
        ("last_error", Text),
    ];
    let rows = rows
        .into_iter()
        .map(|row| {
            row.into_iter()
                .map(|v| v.map(|b| String::from_utf8_lossy(&b).into_owned()))
                .collect()
        })
        .collect();
    Ok(AdminAnswer::Rows { columns, rows })
}

/// A move or split whose source writes no row binary log (`refused` says
/// what it lacks) moves its rows in the fence, as DROP_PARTITION's fallback
/// does, where it copies none or at most `[moves] offline_max_rows`; above
/// that, or for a merge (whose command falls back itself), it is refused.
async fn moved_in_fence(
    shared: &Cluster,
    job: &mut Job,
    refused: MoveError,
) -> Result<(), ProxyError> {
    let dictionary = shared.dictionary.snapshot();
    let t = partitioned(&dictionary, &job.table)?;
    let from = offline(shared, job.source, job.source_place())?;
    let rows = match &job.work {
        Work::Merge => return Err(refused.into()),
        Work::Move => offline::count_rows(shared, t, None, &from).await?,
        Work::Split { value, .. } => {
            let values = std::slice::from_ref(value);
            offline::count_rows(shared, t, Some(values), &from).await?
        }
    };
    let max = shared.moves.offline_max_rows;
    let MoveError::Unsupported(lacking) = refused else {
        return Err(refused.into());
    };
    if rows > max {
        return Err(MoveError::Unsupported(format!(
            "{lacking}; without them its {rows} rows would move while the table waits, more than [moves] offline_max_rows ({max})"
        ))
        .into());
    }
    if rows > 0 {
        tracing::warn!(table = %job.table, rows, "{lacking}: its rows move during the fence");
    }
    job.in_fence = true;
    Ok(())
}

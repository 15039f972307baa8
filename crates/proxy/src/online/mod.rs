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

mod drive;
mod fence;
mod resume;
mod start;

pub use resume::{fencing_soon, sweep};
pub use start::{start, start_merge, start_split};

use std::sync::Arc;
use std::time::Duration;

use hscale_moves::{MoveError, Routing};
use hscale_planner::TableName;

use crate::admin::{partitioned, AdminAnswer, AdminError};
use crate::backend::BackendConn;
use crate::dictionary::rows_connection;
use crate::dictionary::store::{self, exec, ident, text_literal};
use crate::error::ProxyError;
use crate::offline::{self, Place as OfflinePlace};
use crate::shared::Cluster;

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
fn offline_place(shared: &Cluster, backend: u32, place: Place) -> Result<OfflinePlace, ProxyError> {
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
    let at = offline_place(shared, backend, place)?;
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

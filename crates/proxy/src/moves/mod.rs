//! Online partition moves (docs/moves.md): HSCALE MOVE_PARTITION starts a
//! job that copies a partition's table to another backend in key chunks
//! while the application goes on, catches up from the source's binary log,
//! then fences the partition for a moment, switches the dictionary to the
//! new place, and retires the old table. What is decided (chunks, checksums,
//! the applier's statements) lives in `hscale_moves`; this module does the
//! I/O and keeps the job's row in the dictionary (`moves`).

pub mod binlog;
pub mod copy;
pub mod table;

use std::sync::Arc;
use std::time::{Duration, Instant};

use hscale_moves::{MoveError, Watched};
use hscale_planner::{PartitionState, TableName};

use crate::admin::{AdminAnswer, AdminError, AdminLock};
use crate::backend::BackendConn;
use crate::dictionary::own_connection;
use crate::dictionary::store::{self, exec, ident, text_literal};
use crate::error::ProxyError;
use crate::shared::Shared;
use copy::Copy;

/// Rows per chunk: the copy holds one chunk in memory at a time.
const CHUNK_ROWS: usize = 1000;
/// The applier is this close to the source's end before the fence starts,
/// so that the fence's own catch-up is short.
const CLOSE_ENOUGH_BYTES: u64 = 256 * 1024;
/// How long every live instance has to load a fence, and the source to
/// grant the rename (open transactions on the table hold it back).
const FENCE_BUDGET: Duration = Duration::from_millis(1000);
const FENCE_ATTEMPTS: u32 = 10;

/// A move as its job row has it.
#[derive(Debug, Clone)]
struct Job {
    id: u64,
    table: TableName,
    partition: String,
    source: u32,
    destination: u32,
}

fn jobs(shared: &Shared) -> String {
    format!("{}.moves", ident(&shared.dictionary.schema))
}

fn slot(shared: &Shared, backend: u32) -> Result<usize, ProxyError> {
    shared
        .pool_index(backend)
        .ok_or(ProxyError::UnknownBackend { backend })
}

/// HSCALE MOVE_PARTITION: checks that the move can run, records its job and
/// starts it; answers the job's id at once.
pub async fn start(
    shared: &Arc<Shared>,
    table: TableName,
    partition: String,
    destination: u32,
) -> Result<AdminAnswer, ProxyError> {
    let mut lock = AdminLock::take(shared).await?;
    let dictionary = store::load(&mut lock.conn, &shared.dictionary).await?;
    let t = dictionary
        .table(&table.db, &table.name)
        .ok_or_else(|| AdminError::NotPartitioned {
            table: table.clone(),
        })?;
    let entries: Vec<_> = t.partition(&partition).collect();
    let Some(source) = entries.first().map(|e| e.backend) else {
        return Err(AdminError::Invalid(format!("{table} has no partition '{partition}'")).into());
    };
    if entries.iter().any(|e| e.state != PartitionState::Active) || t.locked() {
        return Err(AdminError::Invalid(format!(
            "partition '{partition}' of {table} is being changed already"
        ))
        .into());
    }
    if source == destination {
        return Err(AdminError::Invalid(format!(
            "partition '{partition}' is on backend {destination} already"
        ))
        .into());
    }
    let (source_slot, dest_slot) = (slot(shared, source)?, slot(shared, destination)?);
    let running = exec(
        &mut lock.conn,
        &format!(
            "SELECT id FROM {} WHERE db = {} AND table_name = {} AND phase NOT IN ('done', 'failed', 'cancelled')",
            jobs(shared),
            text_literal(&table.db),
            text_literal(&table.name)
        ),
    )
    .await?;
    if !running.is_empty() {
        return Err(AdminError::Invalid(format!(
            "{table} has a move in progress (job {}): one at a time per table",
            store::text(&running, 0, 0)
        ))
        .into());
    }
    let physical = t.partition_table(&partition);
    let mut source_conn = own_connection(shared, source_slot).await?;
    binlog::check_requirements(&mut source_conn).await?;
    table::describe(&mut source_conn, &table.db, &physical, &physical).await?;
    create_destination(
        shared,
        &mut source_conn,
        dest_slot,
        &table.db,
        &physical,
        destination,
    )
    .await?;
    let estimate = exec(
        &mut source_conn,
        &format!(
            "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = {} AND TABLE_NAME = {}",
            text_literal(&table.db),
            text_literal(&physical)
        ),
    )
    .await?;
    let insert = format!(
        "INSERT INTO {} (db, table_name, partition_name, source_backend, destination_backend, phase, owner, heartbeat, rows_estimated, started) VALUES ({}, {}, {}, {source}, {destination}, 'copying', {}, NOW(6), {}, NOW(6))",
        jobs(shared),
        text_literal(&table.db),
        text_literal(&table.name),
        text_literal(&partition),
        text_literal(&shared.dictionary.instance),
        store::text(&estimate, 0, 0).parse::<u64>().unwrap_or(0)
    );
    exec(&mut lock.conn, &insert).await?;
    let id: u64 = store::text(
        &exec(&mut lock.conn, "SELECT LAST_INSERT_ID()").await?,
        0,
        0,
    )
    .parse()
    .unwrap_or(0);
    let job = Job {
        id,
        table,
        partition,
        source,
        destination,
    };
    tracing::info!(job = id, table = %job.table, partition = %job.partition, source, destination, "move started");
    tokio::spawn(run(Arc::clone(shared), job));
    Ok(AdminAnswer::Rows {
        columns: vec![("job", hscale_wire::resultset::ColumnType::Integer)],
        rows: vec![vec![Some(id.to_string())]],
    })
}

/// The partition's table on the destination, as the source defines it. An
/// empty one of the same definition (a move that stopped before its first
/// chunk) is taken as it is; any other is refused, never touched.
async fn create_destination(
    shared: &Shared,
    source: &mut BackendConn,
    dest_slot: usize,
    db: &str,
    physical: &str,
    destination: u32,
) -> Result<(), ProxyError> {
    let definition = store::definition(source, db, physical)
        .await?
        .ok_or_else(|| MoveError::Unsupported(format!("`{db}`.`{physical}` does not exist")))?;
    let mut dest = own_connection(shared, dest_slot).await?;
    if let Some(found) = store::definition(&mut dest, db, physical).await? {
        let empty = format!("SELECT 1 FROM {}.{} LIMIT 1", ident(db), ident(physical));
        if found == definition && exec(&mut dest, &empty).await?.is_empty() {
            return Ok(());
        }
        return Err(AdminError::TableExists {
            db: db.to_string(),
            name: physical.to_string(),
            backend: destination,
        }
        .into());
    }
    exec(
        &mut dest,
        &format!("CREATE DATABASE IF NOT EXISTS {}", ident(db)),
    )
    .await?;
    let head = format!("CREATE TABLE {}", ident(physical));
    let body = definition
        .strip_prefix(&head)
        .ok_or_else(|| MoveError::Unsupported(format!("unexpected definition of {physical}")))?;
    exec(
        &mut dest,
        &format!("CREATE TABLE {}.{}{body}", ident(db), ident(physical)),
    )
    .await
    .map(drop)
}

/// Runs a job to its end; a failure is recorded in its row, and a fence it
/// left is lifted.
async fn run(shared: Arc<Shared>, job: Job) {
    match drive(&shared, &job).await {
        Ok(()) => tracing::info!(job = job.id, "move done"),
        Err(e) => {
            tracing::error!(job = job.id, "move failed: {e}");
            if let Err(e2) = fail(&shared, &job, &e.to_string()).await {
                tracing::error!(job = job.id, "could not record the move's failure: {e2}");
            }
        }
    }
}

async fn fail(shared: &Shared, job: &Job, error: &str) -> Result<(), ProxyError> {
    let mut main = own_connection(shared, shared.main).await?;
    let phase = exec(
        &mut main,
        &format!("SELECT phase FROM {} WHERE id = {}", jobs(shared), job.id),
    )
    .await?;
    if matches!(store::text(&phase, 0, 0).as_str(), "switched" | "done") {
        // The partition lives at its destination: only the error is told.
        return progress(
            shared,
            &mut main,
            job,
            &format!("last_error = {}", text_literal(error)),
        )
        .await;
    }
    // A fence that renamed the source table gives it its name back before
    // the partition is served from it again.
    let physical = hscale_planner::partition_table(&job.table, &job.partition);
    let retired = retired_name(job, &physical);
    let mut source = own_connection(shared, slot(shared, job.source)?).await?;
    if !store::table_exists(&mut source, &job.table.db, &physical).await?
        && store::table_exists(&mut source, &job.table.db, &retired).await?
    {
        let db = ident(&job.table.db);
        exec(
            &mut source,
            &format!(
                "RENAME TABLE {db}.{} TO {db}.{}",
                ident(&retired),
                ident(&physical)
            ),
        )
        .await?;
    }
    let mut changes = vec![format!(
        "UPDATE {} SET phase = 'failed', last_error = {}, finished = NOW(6) WHERE id = {}",
        jobs(shared),
        text_literal(error),
        job.id
    )];
    changes.push(partition_state(shared, job, PartitionState::Active, None));
    store::change(&mut main, &shared.dictionary.schema, &changes).await?;
    crate::dictionary::reload(shared).await
}

/// Sets the moved partition's state (and backend, at the switch), as a
/// dictionary change.
fn partition_state(
    shared: &Shared,
    job: &Job,
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
        text_literal(&job.partition)
    )
}

async fn progress(
    shared: &Shared,
    main: &mut BackendConn,
    job: &Job,
    set: &str,
) -> Result<(), ProxyError> {
    exec(
        main,
        &format!(
            "UPDATE {} SET {set}, heartbeat = NOW(6) WHERE id = {}",
            jobs(shared),
            job.id
        ),
    )
    .await
    .map(drop)
}

async fn drive(shared: &Shared, job: &Job) -> Result<(), ProxyError> {
    let (source_slot, dest_slot) = (slot(shared, job.source)?, slot(shared, job.destination)?);
    let physical = hscale_planner::partition_table(&job.table, &job.partition);
    let mut main = own_connection(shared, shared.main).await?;
    let moved = {
        let mut conn = own_connection(shared, source_slot).await?;
        table::describe(&mut conn, &job.table.db, &physical, &physical).await?
    };
    let watched = Watched {
        db: job.table.db.clone(),
        table: physical.clone(),
        columns: moved.columns.len(),
    };
    let mut copy = Copy::open(shared, job.id, moved, watched, source_slot, dest_slot).await?;
    while !copy.checkpoint.copy_done && copy.copy_chunk(shared, CHUNK_ROWS).await? {
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
    loop {
        let end = binlog::end_of_log(copy.source()).await?;
        let lag = copy.lag_bytes(&end);
        progress(
            shared,
            &mut main,
            job,
            &format!("lag_bytes = {}", lag.min(i64::MAX as u64)),
        )
        .await?;
        copy.apply_until(&end).await?;
        if lag <= CLOSE_ENOUGH_BYTES {
            break;
        }
    }
    let retired = fence_and_switch(shared, &mut main, job, &mut copy, &physical).await?;
    copy.finish().await?;
    progress(
        shared,
        &mut main,
        job,
        "phase = 'done', finished = NOW(6), lag_bytes = 0",
    )
    .await?;
    tracing::info!(job = job.id, retired = %retired, "the moved partition's old table is kept under its retired name");
    Ok(())
}

/// The retired name of a moved partition's old table.
fn retired_name(job: &Job, physical: &str) -> String {
    let mut name = format!("_hscale_retired_{}_{physical}", job.id);
    name.truncate(64);
    name
}

/// Fences the partition, renames its old table out of the way on the
/// source, applies the last changes and points the dictionary at the
/// destination. A fence that an instance does not acknowledge in time, or
/// that an open transaction holds back, is lifted and tried again later.
async fn fence_and_switch(
    shared: &Shared,
    main: &mut BackendConn,
    job: &Job,
    copy: &mut Copy,
    physical: &str,
) -> Result<String, ProxyError> {
    let retired = retired_name(job, physical);
    let db = ident(&job.table.db);
    for attempt in 1..=FENCE_ATTEMPTS {
        let started = Instant::now();
        store::change(
            main,
            &shared.dictionary.schema,
            &[
                partition_state(shared, job, PartitionState::Fenced, None),
                format!(
                    "UPDATE {} SET phase = 'fencing', fence_attempts = {attempt}, heartbeat = NOW(6) WHERE id = {}",
                    jobs(shared),
                    job.id
                ),
            ],
        )
        .await?;
        crate::dictionary::reload(shared).await?;
        let version = store::read_version(main, &shared.dictionary.schema).await?;
        let acknowledged =
            crate::dictionary::all_instances_loaded(shared, main, version, FENCE_BUDGET).await?;
        let renamed = match acknowledged {
            false => Err(format!(
                "an instance did not load the fence within {FENCE_BUDGET:?}"
            )),
            true => {
                copy.fence_rename = Some(retired.clone());
                let source = copy.source();
                exec(source, "SET SESSION lock_wait_timeout = 1").await?;
                let rename = format!(
                    "RENAME TABLE {db}.{} TO {db}.{}",
                    ident(physical),
                    ident(&retired)
                );
                match source.query(&rename).await? {
                    Ok(_) => Ok(()),
                    Err(refused) => Err(refused.message),
                }
            }
        };
        if let Err(reason) = renamed {
            tracing::warn!(job = job.id, attempt, "fence lifted: {reason}");
            store::change(
                main,
                &shared.dictionary.schema,
                &[partition_state(shared, job, PartitionState::Active, None)],
            )
            .await?;
            crate::dictionary::reload(shared).await?;
            tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
            continue;
        }
        // Nothing writes the old table now: its last changes are in the log.
        let end = binlog::end_of_log(copy.source()).await?;
        copy.apply_until(&end).await?;
        let fence_ms = started.elapsed().as_millis();
        store::change(
            main,
            &shared.dictionary.schema,
            &[
                partition_state(shared, job, PartitionState::Active, Some(job.destination)),
                format!(
                    "UPDATE {} SET phase = 'switched', last_fence_ms = {fence_ms}, retired_table = {}, heartbeat = NOW(6) WHERE id = {}",
                    jobs(shared),
                    text_literal(&retired),
                    job.id
                ),
            ],
        )
        .await?;
        crate::dictionary::reload(shared).await?;
        tracing::info!(job = job.id, attempt, fence_ms, "partition switched");
        return Ok(retired);
    }
    Err(MoveError::Unsupported(format!(
        "the partition could not be fenced in {FENCE_ATTEMPTS} attempts: a transaction kept it open, or an instance did not answer"
    ))
    .into())
}

/// HSCALE SHOW_MOVES: every job, newest first.
pub async fn show(shared: &Shared) -> Result<AdminAnswer, ProxyError> {
    use hscale_wire::resultset::ColumnType::{Integer, Text};
    let mut main = own_connection(shared, shared.main).await?;
    let rows = exec(
        &mut main,
        &format!(
            "SELECT id, CONCAT(db, '.', table_name), partition_name, source_backend, destination_backend, phase, rows_copied, rows_estimated, chunks_verified, chunks_repaired, lag_bytes, fence_attempts, last_fence_ms, retired_table, last_error FROM {} ORDER BY id DESC",
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

//! A job's run: its parts copied chunk by chunk under a throttle, caught up
//! from the source's binary log, its progress checkpointed; a lost server
//! waited for.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hscale_moves::{EveryRow, MoveError, MovedTable, RowFilter, ValuesFilter, Watched};

use super::copy::{ChunkCopy, Part};
use super::fence::{children_follow, fence_and_switch, finish_split};
use super::resume::{fail, prepare_resumed};
use super::{binlog, table};
use super::{jobs, slot, Job, Work, CHUNK_ROWS, CLOSE_ENOUGH_BYTES};
use crate::backend::BackendConn;
use crate::dictionary::rows_connection;
use crate::dictionary::store::{self, exec, text_literal};
use crate::error::ProxyError;
use crate::shared::Cluster;

/// Runs a job to its end; a failure is recorded in its row, and what it
/// did before its switch is undone. The rows it took, or why it failed.
pub(super) async fn run(
    shared: Arc<Cluster>,
    job: Job,
    resumed: Option<String>,
) -> Result<u64, MoveError> {
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
pub(super) const BACKEND_RETRY: Duration = Duration::from_secs(1);

/// A server of the job's could not be reached or went away mid-command, its
/// backend has no writer or a new one, or this instance has no connection
/// to spare for it: the job waits rather than fail.
pub(super) fn unreachable(e: &ProxyError) -> bool {
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
pub(super) async fn waiting_phase(
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

/// Records the job's progress (and its heartbeat), while it is this
/// owner's.
pub(super) async fn progress(
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

/// A dictionary change of the job's, made only while the job is this
/// owner's.
pub(super) async fn change_owned(
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
pub(super) fn parts(
    shared: &Cluster,
    job: &Job,
    moved: &MovedTable,
) -> Result<Vec<Part>, ProxyError> {
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
pub(super) async fn drive(shared: &Cluster, job: &Job) -> Result<u64, ProxyError> {
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
    copy_rows(shared, &mut main, job, &mut copy).await?;
    catch_up(shared, &mut main, job, &mut copy).await?;
    let taken = rows_taken(shared, job).await?;
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

/// Copies the partition's rows chunk by chunk from the checkpoint on,
/// under the throttle, recording the progress after each and the phase
/// `catching_up` once done.
async fn copy_rows(
    shared: &Cluster,
    main: &mut BackendConn,
    job: &Job,
    copy: &mut ChunkCopy,
) -> Result<(), ProxyError> {
    let (copy_started, resumed_at) = (Instant::now(), copy.checkpoint.rows_copied);
    while !copy.checkpoint.copy_done && copy.copy_chunk(shared, CHUNK_ROWS).await? {
        let copied = copy.checkpoint.rows_copied - resumed_at;
        throttle(shared, main, job, copy, copied, copy_started).await?;
        let c = &*copy;
        progress(
            shared,
            main,
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
        main,
        job,
        &format!(
            "phase = 'catching_up', rows_copied = {}, chunks_verified = {}, chunks_repaired = {}",
            copy.checkpoint.rows_copied, copy.chunks_verified, copy.chunks_repaired
        ),
    )
    .await?;
    Ok(())
}

/// Applies the source's binary log until the applier is close to its end
/// and every instance has had time to poll the dictionary often.
async fn catch_up(
    shared: &Cluster,
    main: &mut BackendConn,
    job: &Job,
    copy: &mut ChunkCopy,
) -> Result<(), ProxyError> {
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
            main,
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
                return Ok(());
            }
            tokio::time::sleep(crate::dictionary::FENCE_POLL).await;
        }
    }
}

/// The rows where the job put them, counted before its fence.
async fn rows_taken(shared: &Cluster, job: &Job) -> Result<u64, ProxyError> {
    let (backend, taken) = &job.taken(shared);
    let mut conn = rows_connection(shared, slot(shared, *backend)?).await?;
    let count = format!("SELECT COUNT(*) FROM {}", taken.qualified());
    Ok(store::text(&exec(&mut conn, &count).await?, 0, 0)
        .parse()
        .unwrap_or(0))
}

/// Holds the copy to `[moves] rows_per_s`, and pauses it while a server it
/// reads or writes runs more than `[moves] max_threads_running` statements.
pub(super) async fn throttle(
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

//! A job carried on after its owner stopped, or undone after a failure:
//! takeover by lease, a fence the last owner held lifted or rolled forward,
//! the tables it writes made again.

use std::sync::Arc;

use hscale_moves::Routing;
use hscale_planner::TableName;

use super::drive::{change_owned, progress, run};
use super::fence::{drop_retired, fence_statements, finish_split, switch_statements};
use super::start::create_like;
use super::{delete_value_rows, jobs, rename, running, slot, Job, Notes, Work, DEFAULT_PARTITION};
use crate::admin::partitioned;
use crate::backend::BackendConn;
use crate::dictionary::rows_connection;
use crate::dictionary::store::{self, exec, ident, text_literal};
use crate::error::ProxyError;
use crate::shared::Cluster;

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
pub(super) async fn take_over(
    shared: &Arc<Cluster>,
    conn: &mut BackendConn,
) -> Result<(), ProxyError> {
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
pub(super) async fn load_job(
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
pub(super) async fn resume(shared: Arc<Cluster>, job: Job, phase: String) {
    drop(run(shared, job, Some(phase)).await);
}

/// What a job that was taken over in `phase` does before it carries on
/// (under its new owner's heartbeat): true if it goes on to `drive`.
pub(super) async fn prepare_resumed(
    shared: &Cluster,
    job: &Job,
    phase: &str,
) -> Result<bool, ProxyError> {
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
pub(super) async fn undo_fence(
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
pub(super) async fn ensure_created(
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
pub(super) async fn forget_progress(shared: &Cluster, job: &Job) {
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
pub(super) async fn roll_forward_in_fence(
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
pub(super) async fn fail(
    shared: &Cluster,
    job: &Job,
    error: &str,
    ends: &str,
) -> Result<(), ProxyError> {
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

//! The fence and the switch: what a job fences, the dictionary's switch to
//! the new place, rows moved inside the fence, a split's rest put back, the
//! children's foreign keys pointed at the new tables, retired tables dropped.

use std::time::{Duration, Instant};

use hscale_moves::foreign_keys;
use hscale_moves::MoveError;
use hscale_planner::PartitionState;

use super::binlog;
use super::copy::ChunkCopy;
use super::drive::{change_owned, progress};
use super::start::co_located;
use super::{jobs, offline_place, rename, slot, Job, Place, Work, FENCE_ATTEMPTS, FENCE_BUDGET};
use crate::admin::partitioned;
use crate::backend::BackendConn;
use crate::dictionary::rows_connection;
use crate::dictionary::store::{self, exec, ident, text_literal};
use crate::error::ProxyError;
use crate::offline;
use crate::shared::Cluster;

/// Sets a partition's state (and backend) as a dictionary change.
pub(super) fn partition_state(
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
pub(super) fn default_state(
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
pub(super) fn source_state(shared: &Cluster, job: &Job, state: PartitionState) -> String {
    match &job.partition {
        Some(p) => partition_state(shared, job, p, state, None),
        None => default_state(shared, job, state, None),
    }
}

/// Fences (or lifts the fence of) what a job switches: the partition it
/// moves or splits, and a partition a split adds rows to.
pub(super) fn fence_statements(shared: &Cluster, job: &Job, fenced: bool) -> Vec<String> {
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
pub(super) fn switch_statements(shared: &Cluster, job: &Job) -> Vec<String> {
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
pub(super) async fn move_in_fence(
    shared: &Cluster,
    main: &mut BackendConn,
    job: &Job,
) -> Result<u64, ProxyError> {
    let dictionary = shared.dictionary.snapshot();
    let t = partitioned(&dictionary, &job.table)?;
    let (backend, taken) = job.taken(shared);
    let from = offline_place(shared, job.source, job.retired(shared))?;
    let to = offline_place(shared, backend, taken)?;
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
pub(super) async fn finish_split(
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
pub(super) async fn children_follow(
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

/// Drops the old tables of moves that ended more than `[moves]
/// retired_retention_s` ago. Every instance runs this with its dictionary
/// refresh; dropping one twice is harmless.
pub(super) async fn drop_retired(
    shared: &Cluster,
    conn: &mut BackendConn,
) -> Result<(), ProxyError> {
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
pub(super) async fn fence_and_switch(
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
pub(super) async fn lift_fence(
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

/// A move or split whose source writes no row binary log (`refused` says
/// what it lacks) moves its rows in the fence, as DROP_PARTITION's fallback
/// does, where it copies none or at most `[moves] offline_max_rows`; above
/// that, or for a merge (whose command falls back itself), it is refused.
pub(super) async fn moved_in_fence(
    shared: &Cluster,
    job: &mut Job,
    refused: MoveError,
) -> Result<(), ProxyError> {
    let dictionary = shared.dictionary.snapshot();
    let t = partitioned(&dictionary, &job.table)?;
    let from = offline_place(shared, job.source, job.source_place())?;
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

//! Starting a job: what every move needs checked, the tables it writes
//! made like the source's (foreign keys kept where their parent rows are on
//! the same backend), its row recorded.

use std::sync::Arc;

use hscale_moves::foreign_keys::{self, Parent};
use hscale_moves::{MoveError, Routing, ValuesFilter};
use hscale_planner::{PartitionState, PartitionedTable, TableName};

use super::drive::run;
use super::fence::moved_in_fence;
use super::{binlog, table};
use super::{jobs, refuse_while_moving, slot, Job, Notes, Place, Started, Work, DEFAULT_PARTITION};
use crate::admin::{partitioned, AdminAnswer, AdminError, AdminLock};
use crate::backend::BackendConn;
use crate::dictionary::rows_connection;
use crate::dictionary::store::{self, exec, ident, text_literal};
use crate::error::ProxyError;
use crate::shared::Cluster;

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

/// Checks what every move needs, creates the tables it writes, records
/// its job and starts it.
pub(super) async fn launch(
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
    job.in_fence = rows_move_in_fence(&mut source_conn, &job).await?;
    if let Some(refused) = no_binlog {
        moved_in_fence(shared, &mut job, refused).await?;
    }
    job.id = record(shared, lock, &mut source_conn, &job, &label).await?;
    if let Err(e) = create_tables(shared, &job, &mut source_conn).await {
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

/// Whether a split's rows move during its fence: its table has no key to
/// copy it by, or its partition values cannot be read as the router reads
/// them. Any other job copies while the application goes on.
async fn rows_move_in_fence(source: &mut BackendConn, job: &Job) -> Result<bool, ProxyError> {
    let described = table::describe(source, &job.table.db, &job.physical, &job.physical).await;
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
                return Ok(true);
            }
        }
        (Work::Split { .. }, Err(ProxyError::Move(MoveError::NoKey(why)))) => {
            tracing::warn!(table = %job.table, "{why}: its rows move during the split's fence");
            return Ok(true);
        }
        (_, described) => drop(described?),
    }
    Ok(job.in_fence)
}

/// The job's row in the dictionary, phase `copying`; its id.
async fn record(
    shared: &Cluster,
    lock: &mut AdminLock,
    source: &mut BackendConn,
    job: &Job,
    label: &str,
) -> Result<u64, ProxyError> {
    let estimate = exec(
        source,
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
        text_literal(label),
        job.source,
        job.destination,
        text_literal(&shared.dictionary.instance),
        store::text(&estimate, 0, 0).parse::<u64>().unwrap_or(0),
        job.epoch
    );
    exec(&mut lock.conn, &insert).await?;
    Ok(store::text(
        &exec(&mut lock.conn, "SELECT LAST_INSERT_ID()").await?,
        0,
        0,
    )
    .parse()
    .unwrap_or(0))
}

/// The tables the job writes, made like the source's. Where one fails,
/// only what this start made goes; a table that was there (someone
/// else's) is left as it is.
async fn create_tables(
    shared: &Cluster,
    job: &Job,
    source: &mut BackendConn,
) -> Result<(), ProxyError> {
    let mut made = Vec::new();
    let mut created = Ok(());
    for (backend, place) in job.created(shared) {
        let conn = rows_connection(shared, slot(shared, backend)?).await;
        created = match conn {
            Ok(mut conn) => create_like(shared, job, source, &mut conn, &place, backend)
                .await
                .map(|_| made.push((conn, place))),
            Err(e) => Err(e),
        };
        if created.is_err() {
            break;
        }
    }
    if let Err(e) = created {
        for (mut conn, place) in made {
            let _ = exec(
                &mut conn,
                &format!("DROP TABLE IF EXISTS {}", place.qualified()),
            )
            .await;
        }
        return Err(e);
    }
    Ok(())
}

/// `place` on the destination as `physical` is defined on the source. An
/// empty one of the same definition (a move that stopped before its first
/// chunk) is taken as it is; any other is refused, never touched.
pub(super) async fn create_like(
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
pub(super) fn co_located(
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
pub(super) async fn parent_on(
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

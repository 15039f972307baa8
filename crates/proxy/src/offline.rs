//! Moving rows between a default table and a partition (ADD_PARTITION,
//! DROP_PARTITION), and finishing or undoing a move that a dead instance left
//! half done. Rows go through hscale as binary literals, so nothing is
//! converted. A move copies first and deletes second, and the partition's
//! state in the dictionary says which copy is authoritative:
//!
//! | state    | holds the rows | at the next start        |
//! |----------|----------------|--------------------------|
//! | copying  | default table  | undone: copies deleted   |
//! | cleaning | partition      | finished: copies deleted |
//! | draining | partition      | undone: copies deleted   |
//! | dropping | default table  | finished: table dropped  |
//!
//! The table is locked (statements on it wait) while any partition of it is
//! in one of these states, so no client sees a row twice or not at all.

use hscale_planner::{Dictionary, PartitionState, PartitionedTable, TableName, Value};

use crate::backend::BackendConn;
use crate::dictionary::rows_connection;
use crate::dictionary::store::{bytes_literal, exec, ident, table_exists, text_literal};
use crate::error::ProxyError;
use crate::shared::Cluster;

/// Distinct partition column values are handled this many at a time.
const VALUES_PER_BATCH: usize = 200;
/// An INSERT of moved rows grows to about this many bytes.
const INSERT_BYTES: usize = 1 << 20;

/// One physical table: where it lives and its name.
pub struct Place {
    pub slot: usize,
    pub db: String,
    pub table: String,
}

impl Place {
    fn qualified(&self) -> String {
        format!("{}.{}", ident(&self.db), ident(&self.table))
    }
}

/// The values of `table`'s partition column in `place` whose partition value
/// is one of `partition_values`, as the server sent them.
async fn matching_values(
    conn: &mut BackendConn,
    table: &PartitionedTable,
    place: &Place,
    partition_values: &[String],
) -> Result<Vec<Vec<u8>>, ProxyError> {
    let sql = format!(
        "SELECT DISTINCT {} FROM {}",
        ident(&table.column),
        place.qualified()
    );
    let rows = exec(conn, &sql).await?;
    Ok(rows
        .into_iter()
        .filter_map(|mut row| row.pop().flatten())
        .filter(|raw| {
            let value = Value::String(String::from_utf8_lossy(raw));
            table
                .function
                .apply(table.kind, &table.folding, &value)
                .is_ok_and(|p| partition_values.iter().any(|v| *v == *p))
        })
        .collect())
}

async fn binary_connection(shared: &Cluster, slot: usize) -> Result<Box<BackendConn>, ProxyError> {
    let mut conn = rows_connection(shared, slot).await?;
    // Rows as stored, without conversion, both ways.
    exec(&mut conn, "SET NAMES binary").await?;
    Ok(conn)
}

/// How long a writer waits for the writers lock, and recovery for a dead
/// instance's last statement.
const WRITER_WAIT_SECONDS: u32 = 60;

fn writers_lock(shared: &Cluster) -> String {
    text_literal(&format!("{}.move_writers", shared.dictionary.schema))
}

/// A connection that writes moved rows. It holds the writers lock on its
/// server until it closes: when an instance dies, the statement it had sent
/// still runs to its end on the server, and only then is the lock released,
/// so recovery (`wait_for_dead_writers`) never races a dead instance's write.
async fn writer_connection(shared: &Cluster, slot: usize) -> Result<Box<BackendConn>, ProxyError> {
    let mut conn = binary_connection(shared, slot).await?;
    let sql = format!(
        "SELECT GET_LOCK({}, {WRITER_WAIT_SECONDS})",
        writers_lock(shared)
    );
    match crate::dictionary::store::text(&exec(&mut conn, &sql).await?, 0, 0).as_str() {
        "1" => Ok(conn),
        _ => Err(crate::admin::AdminError::Busy.into()),
    }
}

/// Waits on every backend until no connection holds the writers lock: the
/// statements a dead instance sent have ended.
async fn wait_for_dead_writers(shared: &Cluster) -> Result<(), ProxyError> {
    for slot in 0..shared.pools.len() {
        writer_connection(shared, slot).await?;
    }
    Ok(())
}

fn in_list(column: &str, values: &[Vec<u8>]) -> String {
    let list: Vec<String> = values.iter().map(|v| bytes_literal(v)).collect();
    format!("{} IN ({})", ident(column), list.join(", "))
}

/// Copies the rows whose partition value is one of `partition_values` from
/// `from` to `to`. Returns how many rows were copied.
pub async fn copy_rows(
    shared: &Cluster,
    table: &PartitionedTable,
    partition_values: &[String],
    from: &Place,
    to: &Place,
) -> Result<u64, ProxyError> {
    let mut source = binary_connection(shared, from.slot).await?;
    let mut target = writer_connection(shared, to.slot).await?;
    let values = matching_values(&mut source, table, from, partition_values).await?;
    let mut copied = 0;
    for batch in values.chunks(VALUES_PER_BATCH) {
        let sql = format!(
            "SELECT * FROM {} WHERE {}",
            from.qualified(),
            in_list(&table.column, batch)
        );
        copied += copy_selected(&mut source, &mut target, &sql, to).await?;
    }
    Ok(copied)
}

/// Copies every row of `from` to `to`; returns how many.
pub async fn copy_all_rows(shared: &Cluster, from: &Place, to: &Place) -> Result<u64, ProxyError> {
    let mut source = binary_connection(shared, from.slot).await?;
    let mut target = writer_connection(shared, to.slot).await?;
    exec(&mut target, &format!("TRUNCATE TABLE {}", to.qualified())).await?;
    let sql = format!("SELECT * FROM {}", from.qualified());
    copy_selected(&mut source, &mut target, &sql, to).await
}

/// The rows of `place` whose partition value is one of `partition_values`
/// (`None`: all of them).
pub async fn count_rows(
    shared: &Cluster,
    table: &PartitionedTable,
    partition_values: Option<&[String]>,
    place: &Place,
) -> Result<u64, ProxyError> {
    let mut conn = binary_connection(shared, place.slot).await?;
    let count = |filter: String| format!("SELECT COUNT(*) FROM {}{filter}", place.qualified());
    let Some(partition_values) = partition_values else {
        let rows = exec(&mut conn, &count(String::new())).await?;
        return Ok(crate::dictionary::store::text(&rows, 0, 0)
            .parse()
            .unwrap_or(0));
    };
    let values = matching_values(&mut conn, table, place, partition_values).await?;
    let mut counted = 0;
    for batch in values.chunks(VALUES_PER_BATCH) {
        let filter = format!(" WHERE {}", in_list(&table.column, batch));
        let rows = exec(&mut conn, &count(filter)).await?;
        counted += crate::dictionary::store::text(&rows, 0, 0)
            .parse::<u64>()
            .unwrap_or(0);
    }
    Ok(counted)
}

/// Runs `select` on `source` and inserts what it answers into `to`.
async fn copy_selected(
    source: &mut BackendConn,
    target: &mut BackendConn,
    select: &str,
    to: &Place,
) -> Result<u64, ProxyError> {
    let rows = exec(source, select).await?;
    let mut copied = 0;
    let mut insert = String::new();
    for row in rows {
        let values: Vec<String> = row
            .iter()
            .map(|v| v.as_deref().map_or("NULL".to_string(), bytes_literal))
            .collect();
        if insert.is_empty() {
            insert = format!("INSERT INTO {} VALUES ", to.qualified());
        } else {
            insert.push_str(", ");
        }
        insert.push('(');
        insert.push_str(&values.join(", "));
        insert.push(')');
        copied += 1;
        if insert.len() >= INSERT_BYTES {
            exec(target, &std::mem::take(&mut insert)).await?;
        }
    }
    if !insert.is_empty() {
        exec(target, &insert).await?;
    }
    Ok(copied)
}

/// Deletes the rows whose partition value is one of `partition_values`.
pub async fn delete_rows(
    shared: &Cluster,
    table: &PartitionedTable,
    partition_values: &[String],
    place: &Place,
) -> Result<(), ProxyError> {
    let mut conn = writer_connection(shared, place.slot).await?;
    let values = matching_values(&mut conn, table, place, partition_values).await?;
    for batch in values.chunks(VALUES_PER_BATCH) {
        let sql = format!(
            "DELETE FROM {} WHERE {}",
            place.qualified(),
            in_list(&table.column, batch)
        );
        exec(&mut conn, &sql).await?;
    }
    Ok(())
}

/// Dictionary entries of one partition: one of its values, or all of them.
pub struct Entries<'a> {
    pub table: &'a TableName,
    pub partition: &'a str,
    pub value: Option<&'a str>,
}

impl Entries<'_> {
    /// Sets their state (`None` removes them) and bumps the version, in one
    /// transaction.
    pub async fn set(
        &self,
        shared: &Cluster,
        conn: &mut BackendConn,
        state: Option<PartitionState>,
    ) -> Result<(), ProxyError> {
        set_state(shared, conn, self, state).await
    }
}

async fn set_state(
    shared: &Cluster,
    conn: &mut BackendConn,
    entries: &Entries<'_>,
    state: Option<PartitionState>,
) -> Result<(), ProxyError> {
    let s = ident(&shared.dictionary.schema);
    let mut filter = format!(
        "db = {} AND table_name = {} AND partition_name = {}",
        text_literal(&entries.table.db),
        text_literal(&entries.table.name),
        text_literal(entries.partition)
    );
    if let Some(value) = entries.value {
        filter.push_str(&format!(" AND partition_value = {}", text_literal(value)));
    }
    let change = match state {
        Some(state) => format!(
            "UPDATE {s}.partitions SET state = '{}' WHERE {filter}",
            state.name()
        ),
        None => format!("DELETE FROM {s}.partitions WHERE {filter}"),
    };
    crate::dictionary::store::change(conn, &shared.dictionary.schema, &[change]).await
}

/// The default table and a partition of `table` as places.
pub fn places(
    shared: &Cluster,
    table: &PartitionedTable,
    partition: &str,
    backend: u32,
) -> Result<(Place, Place), ProxyError> {
    let slot = |backend| {
        shared
            .pool_index(backend)
            .ok_or(ProxyError::UnknownBackend { backend })
    };
    let default = Place {
        slot: slot(table.default_backend)?,
        db: table.table.db.clone(),
        table: table.default_table.clone(),
    };
    let partition = Place {
        slot: slot(backend)?,
        db: table.table.db.clone(),
        table: table.partition_table(partition),
    };
    Ok((default, partition))
}

/// Partitioned tables whose default table does not exist yet while the table
/// of their own name still does: SETUP_TABLE stopped before its rename.
async fn unrenamed<'d>(
    shared: &Cluster,
    dictionary: &'d Dictionary,
) -> Result<Vec<&'d PartitionedTable>, ProxyError> {
    let mut found = Vec::new();
    for table in dictionary.tables() {
        let (default, _) = places(shared, table, "", table.default_backend)?;
        let mut c = rows_connection(shared, default.slot).await?;
        if !table_exists(&mut c, &default.db, &default.table).await?
            && table_exists(&mut c, &default.db, &table.table.name).await?
        {
            found.push(table);
        }
    }
    Ok(found)
}

/// Finishes or undoes every move the dictionary shows in progress, under the
/// admin lock, so that a live instance's move is left alone.
pub async fn recover(shared: &Cluster, conn: &mut BackendConn) -> Result<(), ProxyError> {
    let dictionary = crate::dictionary::store::load(conn, &shared.dictionary).await?;
    if !dictionary.tables().iter().any(|t| t.locked())
        && unrenamed(shared, &dictionary).await?.is_empty()
    {
        return Ok(());
    }
    let _lock = crate::admin::AdminLock::take(shared).await?;
    wait_for_dead_writers(shared).await?;
    let dictionary = crate::dictionary::store::load(conn, &shared.dictionary).await?;
    // SETUP_TABLE records the table, then renames it to its default table.
    for table in unrenamed(shared, &dictionary).await? {
        let (default, _) = places(shared, table, "", table.default_backend)?;
        let mut c = rows_connection(shared, default.slot).await?;
        let rename = format!(
            "RENAME TABLE {}.{} TO {}",
            ident(&default.db),
            ident(&table.table.name),
            default.qualified()
        );
        tracing::warn!(table = %table.table, "finishing an interrupted SETUP_TABLE");
        exec(&mut c, &rename).await?;
    }
    for table in dictionary.tables() {
        for entry in table
            .entries
            .iter()
            .filter(|e| !matches!(e.state, PartitionState::Active | PartitionState::Fenced))
        {
            let (default, partition) = places(shared, table, &entry.name, entry.backend)?;
            let values = [entry.value.clone()];
            let one = Entries {
                table: &table.table,
                partition: &entry.name,
                value: Some(&entry.value),
            };
            tracing::warn!(table = %table.table, partition = %entry.name, value = %entry.value, state = entry.state.name(), "recovering an interrupted partition move");
            match entry.state {
                // A fence belongs to an online move, whose job resumes it.
                PartitionState::Active | PartitionState::Fenced => {}
                PartitionState::Copying => {
                    delete_rows(shared, table, &values, &partition).await?;
                    one.set(shared, conn, None).await?;
                }
                // Undoing a drop and finishing an add both delete the copies
                // the default table holds.
                PartitionState::Cleaning | PartitionState::Draining => {
                    delete_rows(shared, table, &values, &default).await?;
                    one.set(shared, conn, Some(PartitionState::Active)).await?;
                }
                PartitionState::Dropping => {
                    let mut c = rows_connection(shared, partition.slot).await?;
                    exec(
                        &mut c,
                        &format!("DROP TABLE IF EXISTS {}", partition.qualified()),
                    )
                    .await?;
                    one.set(shared, conn, None).await?;
                }
            }
        }
    }
    Ok(())
}

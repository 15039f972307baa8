//! HSCALE ADD_PARTITION(table, partition, value, backend): creates
//! `<table>_<partition>` on the backend with the default table's definition
//! (if the partition is new) and moves the rows of the value out of the
//! default table while the table is locked (see dictionary/moves.rs).

use hscale_planner::{PartitionState, TableName, Value};

use super::{current, partitioned, publish, slot, AdminAnswer, AdminError, AdminLock};
use crate::dictionary::moves::{copy_rows, delete_rows, places, Entries};
use crate::dictionary::{own_connection, store};
use crate::error::ProxyError;
use crate::shared::Shared;

pub async fn run(
    shared: &Shared,
    table: TableName,
    partition: String,
    value: Value<'static>,
    backend: u32,
) -> Result<AdminAnswer, ProxyError> {
    let mut lock = AdminLock::take(shared).await?;
    let dictionary = current(shared, &mut lock).await?;
    let t = partitioned(&dictionary, &table)?;
    if partition.is_empty() || partition.len() + t.table.name.len() + 1 > 64 {
        return Err(AdminError::Invalid(format!(
            "'{partition}' makes no table name of at most 64 characters"
        ))
        .into());
    }
    let partition_value = t
        .function
        .partition_value(t.kind, &value)
        .map_err(AdminError::from)?;
    if let Some(owner) = t.entries.iter().find(|e| e.value == partition_value) {
        return Err(AdminError::Invalid(format!(
            "partition value '{partition_value}' belongs to partition '{}' already",
            owner.name
        ))
        .into());
    }
    let existing = t.partition(&partition).next().map(|e| e.backend);
    if existing.is_some_and(|b| b != backend) {
        return Err(AdminError::Invalid(format!(
            "partition '{partition}' lives on backend {}, not {backend}",
            existing.unwrap_or_default()
        ))
        .into());
    }
    slot(shared, backend)?;
    let (default, place) = places(shared, t, &partition, backend)?;
    if existing.is_none() {
        create_like_default(shared, t, &place, backend).await?;
    }
    let s = store::ident(&shared.dictionary.schema);
    let insert = format!(
        "INSERT INTO {s}.partitions (db, table_name, partition_value, partition_name, backend, state) VALUES ({}, {}, {}, {}, {backend}, '{}')",
        store::text_literal(&table.db),
        store::text_literal(&table.name),
        store::text_literal(&partition_value),
        store::text_literal(&partition),
        PartitionState::Copying.name()
    );
    store::change(&mut lock.conn, &shared.dictionary.schema, &[insert]).await?;
    publish(shared, &mut lock).await?;
    let values = [partition_value.clone()];
    let moved = copy_rows(shared, t, &values, &default, &place).await?;
    let entry = Entries {
        table: &table,
        partition: &partition,
        value: Some(&partition_value),
    };
    entry
        .set(shared, &mut lock.conn, Some(PartitionState::Cleaning))
        .await?;
    delete_rows(shared, t, &values, &default).await?;
    entry
        .set(shared, &mut lock.conn, Some(PartitionState::Active))
        .await?;
    publish(shared, &mut lock).await?;
    tracing::info!(table = %table, %partition, value = %partition_value, backend, moved, "partition added");
    Ok(AdminAnswer::Ok {
        affected_rows: moved,
    })
}

/// The partition table, from the default table's SHOW CREATE TABLE, so that
/// it works across servers; its database is created where it is missing.
async fn create_like_default(
    shared: &Shared,
    t: &hscale_planner::PartitionedTable,
    place: &crate::dictionary::moves::Place,
    backend: u32,
) -> Result<(), ProxyError> {
    let default_slot = slot(shared, t.default_backend)?;
    let mut source = own_connection(shared, default_slot).await?;
    let db = store::ident(&t.table.db);
    let rows = store::exec(
        &mut source,
        &format!("SHOW CREATE TABLE {db}.{}", store::ident(&t.default_table)),
    )
    .await?;
    let definition = store::text(&rows, 0, 1);
    let head = format!("CREATE TABLE {}", store::ident(&t.default_table));
    let body = definition.strip_prefix(&head).ok_or_else(|| {
        AdminError::Invalid(format!("unexpected definition of {}", t.default_table))
    })?;
    let mut target = own_connection(shared, place.slot).await?;
    if store::table_exists(&mut target, &place.db, &place.table).await? {
        return Err(AdminError::TableExists {
            db: place.db.clone(),
            name: place.table.clone(),
            backend,
        }
        .into());
    }
    // Database names pass through: the partition's backend needs the database.
    store::exec(&mut target, &format!("CREATE DATABASE IF NOT EXISTS {db}")).await?;
    let create = format!("CREATE TABLE {db}.{}{body}", store::ident(&place.table));
    store::exec(&mut target, &create).await?;
    Ok(())
}

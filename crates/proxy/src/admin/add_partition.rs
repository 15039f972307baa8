//! HSCALE ADD_PARTITION(table, partition, value, backend): creates
//! `<table>_<partition>` on the backend with the default table's definition
//! (if the partition is new) and moves the rows of the value out of the
//! default table while the table is locked (see dictionary/moves.rs).

use hscale_planner::{PartitionState, TableName, Value};

use super::{current, partitioned, publish, slot, AdminAnswer, AdminError, AdminLock};
use crate::dictionary::moves::{copy_rows, delete_rows, places, Entries, Place};
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
        .partition_value(t.kind, &t.folding, &value)
        .map_err(AdminError::from)?;
    if partition_value.chars().count() > MAX_VALUE_CHARS {
        return Err(AdminError::Invalid(format!(
            "a partition value is at most {MAX_VALUE_CHARS} characters; '{partition_value}' has {}",
            partition_value.chars().count()
        ))
        .into());
    }
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
        if let Some(owner) = dictionary.claimant(&table.db, &place.table) {
            return Err(AdminError::Invalid(format!(
                "partition '{partition}' would be table `{}`, which {owner} uses already",
                place.table
            ))
            .into());
        }
    }
    let created = match existing {
        None => create_like_default(shared, t, &place, backend).await?,
        Some(_) => false,
    };
    let s = store::ident(&shared.dictionary.schema);
    let insert = format!(
        "INSERT INTO {s}.partitions (db, table_name, partition_value, partition_name, backend, state) VALUES ({}, {}, {}, {}, {backend}, '{}')",
        store::text_literal(&table.db),
        store::text_literal(&table.name),
        store::text_literal(&partition_value),
        store::text_literal(&partition),
        PartitionState::Copying.name()
    );
    if let Err(e) = store::change(&mut lock.conn, &shared.dictionary.schema, &[insert]).await {
        // Nothing names the new table: it goes, and a retry starts clean.
        if created {
            drop_table(shared, &place).await;
        }
        return Err(e);
    }
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

/// The longest partition value the dictionary stores (`partitions.partition_value`).
const MAX_VALUE_CHARS: usize = 255;

/// The partition table, from the default table's SHOW CREATE TABLE, so that
/// it works across servers; its database is created where it is missing.
/// An empty table of that name and definition, which an ADD_PARTITION
/// stopped before the dictionary named it leaves behind, is taken as it is;
/// any other table of that name is refused, never touched. True if it was
/// created here.
async fn create_like_default(
    shared: &Shared,
    t: &hscale_planner::PartitionedTable,
    place: &Place,
    backend: u32,
) -> Result<bool, ProxyError> {
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
    if let Some(found) = store::definition(&mut target, &place.db, &place.table).await? {
        let head = format!("CREATE TABLE {}", store::ident(&place.table));
        let alike = found.strip_prefix(&head) == Some(store::without_auto_increment(body).as_str());
        let empty = format!("SELECT 1 FROM {db}.{} LIMIT 1", store::ident(&place.table));
        if alike && store::exec(&mut target, &empty).await?.is_empty() {
            tracing::info!(table = %place.table, backend, "an empty partition table left by an earlier attempt is taken");
            return Ok(false);
        }
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
    Ok(true)
}

/// Drops a partition table this command created, after the command failed.
/// Its failure leaves an empty table that a retry takes as it is.
async fn drop_table(shared: &Shared, place: &Place) {
    let drop = format!(
        "DROP TABLE IF EXISTS {}.{}",
        store::ident(&place.db),
        store::ident(&place.table)
    );
    let dropped = match own_connection(shared, place.slot).await {
        Ok(mut conn) => store::exec(&mut conn, &drop).await.map(|_| ()),
        Err(e) => Err(e),
    };
    if let Err(e) = dropped {
        tracing::warn!(table = %place.table, "could not drop the partition table of a failed ADD_PARTITION: {e}");
    }
}

//! HSCALE ADD_PARTITION(table, partition, value, backend): the value's rows
//! leave the default table for the partition (new, or one it adds the value
//! to) as an online split (docs/moves.md): the table stays open, only the
//! default table and that partition wait during the split's fence. The
//! command waits for the split and answers the rows it moved, so that a
//! script's next statement sees the partition.

use std::sync::Arc;

use hscale_planner::{TableName, Value};

use super::{current, partitioned, slot, AdminAnswer, AdminError, AdminLock};
use crate::error::ProxyError;
use crate::shared::Cluster;

pub async fn run(
    shared: &Arc<Cluster>,
    table: TableName,
    partition: String,
    value: Value<'static>,
    backend: u32,
) -> Result<AdminAnswer, ProxyError> {
    let mut lock = AdminLock::take(shared).await?;
    let dictionary = current(shared, &mut lock).await?;
    let t = partitioned(&dictionary, &table)?;
    let partition_value = checked_value(t, &value)?;
    check_into(shared, &dictionary, t, &partition, backend)?;
    let started = crate::online::start_split(
        shared,
        &mut lock,
        t,
        None,
        partition_value.clone(),
        partition.clone(),
        backend,
    )
    .await?;
    // Other admin commands go on while the split runs.
    drop(lock);
    let finished = started.wait().await?;
    tracing::info!(table = %table, %partition, value = %partition_value, backend, moved = finished.rows, "partition added");
    Ok(AdminAnswer::Ok {
        affected_rows: finished.rows,
        warnings: finished.notes,
    })
}

/// HSCALE SPLIT_PARTITION(table, partition, new partition, value, backend):
/// the rows of one of a partition's values go to a partition of their own
/// (or one that exists, on its backend) as an online split; answers the
/// job's id at once.
pub async fn split(
    shared: &Arc<Cluster>,
    table: TableName,
    partition: String,
    into: String,
    value: Value<'static>,
    backend: u32,
) -> Result<AdminAnswer, ProxyError> {
    let mut lock = AdminLock::take(shared).await?;
    let dictionary = current(shared, &mut lock).await?;
    let t = partitioned(&dictionary, &table)?;
    let partition_value = t
        .function
        .partition_value(t.kind, &t.folding, &value)
        .map_err(AdminError::from)?;
    let values = t.partition(&partition).count();
    let owner = t.entries.iter().find(|e| e.value == partition_value);
    if owner.is_none_or(|e| e.name != partition) {
        return Err(AdminError::Invalid(format!(
            "partition '{partition}' of {table} does not hold the value '{partition_value}'"
        ))
        .into());
    }
    if values < 2 {
        return Err(AdminError::Invalid(format!(
            "'{partition_value}' is the only value of partition '{partition}': move the partition (MOVE_PARTITION) instead"
        ))
        .into());
    }
    if into == partition {
        return Err(AdminError::Invalid(format!(
            "the value is in partition '{partition}' already"
        ))
        .into());
    }
    check_into(shared, &dictionary, t, &into, backend)?;
    let started = crate::online::start_split(
        shared,
        &mut lock,
        t,
        Some(partition),
        partition_value,
        into,
        backend,
    )
    .await?;
    Ok(started.answer())
}

/// The partition a split adds rows to: a new one whose table no other
/// table uses, or one on `backend`.
fn check_into(
    shared: &Cluster,
    dictionary: &hscale_planner::Dictionary,
    t: &hscale_planner::PartitionedTable,
    into: &str,
    backend: u32,
) -> Result<(), ProxyError> {
    if into.is_empty()
        || into == crate::online::DEFAULT_PARTITION
        || into.len() + t.table.name.len() + 1 > 64
    {
        return Err(AdminError::Invalid(format!(
            "'{into}' makes no table name of at most 64 characters"
        ))
        .into());
    }
    let existing = t.partition(into).next().map(|e| e.backend);
    if let Some(lives) = existing.filter(|b| *b != backend) {
        return Err(AdminError::Invalid(format!(
            "partition '{into}' lives on backend {lives}, not {backend}"
        ))
        .into());
    }
    slot(shared, backend)?;
    if existing.is_none() {
        let physical = t.partition_table(into);
        if let Some(owner) = dictionary.claimant(&t.table.db, &physical) {
            return Err(AdminError::Invalid(format!(
                "partition '{into}' would be table `{physical}`, which {owner} uses already"
            ))
            .into());
        }
    }
    Ok(())
}

/// A new partition value: the value as the function maps it, and one no
/// partition has yet.
pub fn checked_value(
    t: &hscale_planner::PartitionedTable,
    value: &Value,
) -> Result<String, ProxyError> {
    let partition_value = t
        .function
        .partition_value(t.kind, &t.folding, value)
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
    Ok(partition_value)
}

/// The longest partition value the dictionary stores (`partitions.partition_value`).
const MAX_VALUE_CHARS: usize = 255;

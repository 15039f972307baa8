//! HSCALE DROP_PARTITION(table, partition): its rows go back to the default
//! table and its values route there. Online, on the move engine (a merge:
//! the rows are copied beside the default table while the partition is
//! served, and join it in the fence); a table the engine cannot copy while
//! it changes (no key, no row-based binary log) is locked while its rows
//! move instead.

use std::sync::Arc;

use hscale_moves::MoveError;
use hscale_planner::{PartitionState, PartitionedTable, TableName};

use super::{current, partitioned, publish, AdminAnswer, AdminError, AdminLock};
use crate::dictionary::{own_connection, store};
use crate::error::ProxyError;
use crate::offline::{copy_rows, places, Entries};
use crate::online::Finished;
use crate::shared::Cluster;

pub async fn run(
    shared: &Arc<Cluster>,
    table: TableName,
    partition: String,
) -> Result<AdminAnswer, ProxyError> {
    let mut lock = AdminLock::take(shared).await?;
    let dictionary = current(shared, &mut lock).await?;
    let t = partitioned(&dictionary, &table)?;
    crate::online::refuse_while_moving(shared, &mut lock.conn, &table).await?;
    if t.partition(&partition).next().is_none() {
        return Err(AdminError::Invalid(format!("{table} has no partition '{partition}'")).into());
    }
    let finished = match crate::online::start_merge(shared, &mut lock, t, partition.clone()).await {
        Ok(started) => {
            // Other admin commands go on while the merge runs.
            drop(lock);
            started.wait().await?
        }
        Err(ProxyError::Move(MoveError::NoKey(why) | MoveError::Unsupported(why))) => {
            tracing::warn!(table = %table, %partition, "{why}: the table is locked while its rows move");
            Finished {
                rows: offline(shared, &mut lock, t, &partition).await?,
                notes: Vec::new(),
            }
        }
        Err(e) => return Err(e),
    };
    tracing::info!(table = %table, %partition, moved = finished.rows, "partition dropped");
    Ok(AdminAnswer::Ok {
        affected_rows: finished.rows,
        warnings: finished.notes,
    })
}

/// The rows moved while the whole table waits (`Draining`).
async fn offline(
    shared: &Cluster,
    lock: &mut AdminLock,
    t: &PartitionedTable,
    partition: &str,
) -> Result<u64, ProxyError> {
    let entries: Vec<_> = t.partition(partition).collect();
    let backend = entries[0].backend;
    let values: Vec<String> = entries.iter().map(|e| e.value.clone()).collect();
    let (default, place) = places(shared, t, partition, backend)?;
    let all = Entries {
        table: &t.table,
        partition,
        value: None,
    };
    all.set(shared, &mut lock.conn, Some(PartitionState::Draining))
        .await?;
    publish(shared, lock).await?;
    let moved = copy_rows(shared, t, &values, &place, &default).await?;
    all.set(shared, &mut lock.conn, Some(PartitionState::Dropping))
        .await?;
    let mut conn = own_connection(shared, place.slot).await?;
    let drop = format!(
        "DROP TABLE IF EXISTS {}.{}",
        store::ident(&place.db),
        store::ident(&place.table)
    );
    store::exec(&mut conn, &drop).await?;
    all.set(shared, &mut lock.conn, None).await?;
    publish(shared, lock).await?;
    Ok(moved)
}

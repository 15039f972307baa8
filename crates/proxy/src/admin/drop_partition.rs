//! HSCALE DROP_PARTITION(table, partition): its rows go back to the default
//! table, then its table is dropped, while the table is locked.

use hscale_planner::{PartitionState, TableName};

use super::{current, partitioned, publish, AdminAnswer, AdminError, AdminLock};
use crate::dictionary::moves::{copy_rows, places, Entries};
use crate::dictionary::{own_connection, store};
use crate::error::ProxyError;
use crate::shared::Shared;

pub async fn run(
    shared: &Shared,
    table: TableName,
    partition: String,
) -> Result<AdminAnswer, ProxyError> {
    let mut lock = AdminLock::take(shared).await?;
    let dictionary = current(shared, &mut lock).await?;
    let t = partitioned(&dictionary, &table)?;
    crate::moves::refuse_while_moving(shared, &mut lock.conn, &table).await?;
    let entries: Vec<_> = t.partition(&partition).collect();
    let Some(backend) = entries.first().map(|e| e.backend) else {
        return Err(AdminError::Invalid(format!("{table} has no partition '{partition}'")).into());
    };
    let values: Vec<String> = entries.iter().map(|e| e.value.clone()).collect();
    let (default, place) = places(shared, t, &partition, backend)?;
    let all = Entries {
        table: &table,
        partition: &partition,
        value: None,
    };
    all.set(shared, &mut lock.conn, Some(PartitionState::Draining))
        .await?;
    publish(shared, &mut lock).await?;
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
    publish(shared, &mut lock).await?;
    tracing::info!(table = %table, %partition, moved, "partition dropped");
    Ok(AdminAnswer::Ok {
        affected_rows: moved,
    })
}

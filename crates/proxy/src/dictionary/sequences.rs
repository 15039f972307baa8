//! Ids for the AUTO_INCREMENT columns of partitioned tables. Each partition
//! table would count on its own and hand out the same ids; instead each
//! instance takes a block of ids from the table's sequence in the dictionary
//! (`hscale.sequences`) and hands them out, so that no two instances ever
//! hand out the same id. Ids grow per instance, not across instances.

use hscale_planner::TableName;
use rustc_hash::FxHashMap;

use super::own_connection;
use super::store::{exec, ident, text, text_literal};
use crate::error::ProxyError;
use crate::shared::Cluster;

/// Ids an instance takes from a sequence at a time.
pub const BLOCK: u64 = 1000;

#[derive(Debug, Default)]
pub struct Sequences {
    tables: tokio::sync::Mutex<FxHashMap<TableName, Sequence>>,
}

/// This instance's view of one table's sequence.
#[derive(Debug, Default, Clone, Copy)]
struct Sequence {
    /// The ids `next..end` are this instance's to hand out.
    next: u64,
    end: u64,
    /// The dictionary's next id is at least this.
    floor: u64,
}

impl Sequences {
    /// `count` consecutive ids for new rows of `table`; the first is returned.
    pub async fn take(
        &self,
        shared: &Cluster,
        table: &TableName,
        count: u64,
    ) -> Result<u64, ProxyError> {
        let mut tables = self.tables.lock().await;
        let sequence = tables.entry(table.clone()).or_default();
        if sequence.end.saturating_sub(sequence.next) < count {
            let size = count.max(BLOCK);
            let first = reserve(shared, table, size).await?;
            *sequence = Sequence {
                next: first,
                end: first + size,
                floor: first + size,
            };
        }
        let first = sequence.next;
        sequence.next += count;
        Ok(first)
    }

    /// An INSERT gave `id` itself: this instance, and every instance's next
    /// block, hands out only ids after it.
    pub async fn given(
        &self,
        shared: &Cluster,
        table: &TableName,
        id: u64,
    ) -> Result<(), ProxyError> {
        let mut tables = self.tables.lock().await;
        let sequence = tables.entry(table.clone()).or_default();
        // Past the block: the next id comes from a new one, after `id`.
        if id >= sequence.next {
            sequence.next = (id + 1).min(sequence.end);
        }
        if id >= sequence.floor {
            sequence.floor = move_past(shared, table, id).await?;
        }
        Ok(())
    }
}

fn key(table: &TableName) -> String {
    format!(
        "db = {} AND table_name = {}",
        text_literal(&table.db),
        text_literal(&table.name)
    )
}

/// Takes `size` ids from the table's sequence; returns the first.
async fn reserve(shared: &Cluster, table: &TableName, size: u64) -> Result<u64, ProxyError> {
    let s = ident(&shared.dictionary.schema);
    let key = key(table);
    in_transaction(shared, table, |next| {
        vec![format!(
            "UPDATE {s}.sequences SET next_id = {} WHERE {key}",
            next + size
        )]
    })
    .await
}

/// Moves the table's sequence past `id`; returns its next id.
async fn move_past(shared: &Cluster, table: &TableName, id: u64) -> Result<u64, ProxyError> {
    let s = ident(&shared.dictionary.schema);
    let key = key(table);
    let next = in_transaction(shared, table, |next| match next > id {
        true => Vec::new(),
        false => vec![format!(
            "UPDATE {s}.sequences SET next_id = {} WHERE {key}",
            id + 1
        )],
    })
    .await?;
    Ok(next.max(id + 1))
}

/// Reads the table's next id under a row lock and runs the `changes` made
/// of it, in one transaction; returns the next id read.
async fn in_transaction(
    shared: &Cluster,
    table: &TableName,
    changes: impl FnOnce(u64) -> Vec<String>,
) -> Result<u64, ProxyError> {
    let s = ident(&shared.dictionary.schema);
    let mut conn = own_connection(shared, shared.main).await?;
    exec(&mut conn, "START TRANSACTION").await?;
    let read = exec(
        &mut conn,
        &format!(
            "SELECT next_id FROM {s}.sequences WHERE {} FOR UPDATE",
            key(table)
        ),
    )
    .await?;
    let next: u64 = text(&read, 0, 0)
        .parse()
        .map_err(|_| ProxyError::DictionaryCorrupt {
            table: table.clone(),
            what: "its AUTO_INCREMENT sequence is missing".into(),
        })?;
    for sql in changes(next) {
        exec(&mut conn, &sql).await?;
    }
    exec(&mut conn, "COMMIT").await?;
    Ok(next)
}

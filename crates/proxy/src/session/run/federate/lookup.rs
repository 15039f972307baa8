//! A lookup join: the rows of the driving table read first, then the other
//! table's matching rows looked up by the join's key on the partitions that
//! hold them, and the joined rows sent to the client with the column
//! definitions MariaDB would give (nullable where an outer join adds NULLs).

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use hscale_planner::{Lookup, Refusal, TableName, MOST_KEYS, MOST_LOOKUP_ROWS};
use hscale_wire::frame::write_lenenc;
use hscale_wire::packets::{write_eof, write_result_end};
use hscale_wire::resultset::{write_binary_row, write_text_row, BinaryColumn};
use mysql_common::constants::ColumnFlags;

use super::copies::read_rows;
use super::{Definitions, Sink};
use crate::error::ProxyError;
use crate::exec::FLUSH_AT;
use crate::session::client::Client;
use crate::session::Backends;
use crate::session::Memo;
use crate::shared::Shared;

/// A column definition without NOT NULL: the inner side of a left join.
pub(super) fn nullable(definition: &Bytes) -> Bytes {
    let mut at = 0;
    // catalog, schema, table, org_table, name, org_name; then the fixed part.
    for _ in 0..6 {
        match definition
            .get(at..)
            .and_then(hscale_wire::frame::read_lenenc)
        {
            Some((len, n)) => at += n + len as usize,
            None => return definition.clone(),
        }
    }
    // Its length byte, character set (2), length (4), type (1): the flags.
    let flags = at + 1 + 2 + 4 + 1;
    let mut cleared = definition.to_vec();
    match cleared.get_mut(flags) {
        Some(low) => *low &= !(ColumnFlags::NOT_NULL_FLAG.bits() as u8),
        None => return definition.clone(),
    }
    cleared.into()
}

/// A lookup join's answer: rows as text or binary, as its command wants.
pub(super) struct Joined {
    columns: Vec<Bytes>,
    rows: Vec<Vec<u8>>,
}

/// A lookup join's answer: its columns and rows, `binary` for an
/// EXECUTE; `None` where the copies must answer instead (see `Lookup`;
/// for an EXECUTE, also a column whose text has no exact binary form).
pub(super) async fn lookup_join(
    shared: &Arc<Shared>,
    client: &mut Client,
    memo: &mut Memo,
    backends: &mut Backends,
    lookup: &Lookup,
    binary: bool,
) -> Result<Option<Joined>, ProxyError> {
    let mut outer = Sink::keep(MOST_KEYS);
    if read_rows(shared, client, memo, backends, &lookup.outer, &mut outer)
        .await
        .is_err()
    {
        return Ok(None);
    }
    let Some((outer_columns, outer_rows)) = outer.kept_integer_keys() else {
        return Ok(None);
    };
    let mut by_key: HashMap<i128, Vec<usize>> = HashMap::new();
    for (i, (_, key)) in outer_rows.iter().enumerate() {
        if let Some(key) = key {
            by_key.entry(*key).or_default().push(i);
        }
    }
    let mut keys: Vec<i128> = by_key.keys().copied().collect();
    keys.sort_unstable();
    // No key: the inner read answers nothing, but its columns.
    let keys: Vec<String> = match keys.is_empty() {
        true => vec!["NULL".into()],
        false => keys.iter().map(i128::to_string).collect(),
    };
    let mut inner = Sink::keep(MOST_LOOKUP_ROWS);
    if read_rows(
        shared,
        client,
        memo,
        backends,
        &lookup.inner_read(&keys),
        &mut inner,
    )
    .await
    .is_err()
    {
        return Ok(None);
    }
    let Some((inner_columns, inner_rows)) = inner.kept_integer_keys() else {
        return Ok(None);
    };
    let outer = (outer_columns, outer_rows);
    let inner = (inner_columns, inner_rows);
    Ok(join(lookup, &by_key, outer, inner, binary))
}

/// Rows as a lookup kept them: their values, and their join key as an
/// integer.
type KeyedRows = Vec<(Vec<Option<Vec<u8>>>, Option<i128>)>;

/// The joined result set of the driving rows (`outer`, indexed by key in
/// `by_key`) and the rows looked up (`inner`), in the client's encoding;
/// `None` where a value cannot be written in it.
fn join(
    lookup: &Lookup,
    by_key: &HashMap<i128, Vec<usize>>,
    (outer_columns, outer_rows): (Vec<Bytes>, KeyedRows),
    (inner_columns, inner_rows): (Vec<Bytes>, KeyedRows),
    binary: bool,
) -> Option<Joined> {
    let columns = lookup
        .columns
        .iter()
        .map(|&(from_inner, i)| match (from_inner, lookup.keeps_outer) {
            (true, true) => nullable(&inner_columns[i]),
            (true, false) => inner_columns[i].clone(),
            (false, _) => outer_columns[i].clone(),
        })
        .collect::<Vec<Bytes>>();
    let types = match binary {
        true => {
            let types: Option<Vec<BinaryColumn>> =
                columns.iter().map(|c| BinaryColumn::of(c)).collect();
            match types {
                Some(types) if types.iter().all(|t| t.converts()) => Some(types),
                _ => return None,
            }
        }
        false => None,
    };
    let write_row = |values: &[Option<&[u8]>]| -> Option<Vec<u8>> {
        let mut row = Vec::new();
        match &types {
            Some(types) => write_binary_row(types, values, &mut row)?,
            None => write_text_row(values, &mut row),
        }
        Some(row)
    };
    let mut rows = Vec::new();
    let mut matched = vec![false; outer_rows.len()];
    for (inner_row, key) in &inner_rows {
        let Some(matches) = key.and_then(|k| by_key.get(&k)) else {
            continue;
        };
        for &o in matches {
            matched[o] = true;
            let outer_row = &outer_rows[o].0;
            let values: Vec<Option<&[u8]>> = lookup
                .columns
                .iter()
                .map(|&(from_inner, i)| match from_inner {
                    true => inner_row[i].as_deref(),
                    false => outer_row[i].as_deref(),
                })
                .collect();
            rows.push(write_row(&values)?);
        }
    }
    if lookup.keeps_outer {
        for (o, _) in matched.iter().enumerate().filter(|(_, m)| !**m) {
            let outer_row = &outer_rows[o].0;
            let values: Vec<Option<&[u8]>> = lookup
                .columns
                .iter()
                .map(|&(from_inner, i)| match from_inner {
                    true => None,
                    false => outer_row[i].as_deref(),
                })
                .collect();
            rows.push(write_row(&values)?);
        }
    }
    Some(Joined { columns, rows })
}

/// A result set hscale made: its columns, rows and end.
pub(super) async fn send_joined(
    client: &mut Client,
    backends: &mut Backends,
    joined: Joined,
) -> Result<(), ProxyError> {
    let deprecate_eof = client.deprecate_eof();
    let status = backends.status_flags();
    let mut count = Vec::with_capacity(9);
    write_lenenc(joined.columns.len() as u64, &mut count);
    let mut seq = client.queue_packet(1, &count);
    for definition in &joined.columns {
        seq = client.queue_packet(seq, definition);
    }
    if !deprecate_eof {
        let mut eof = Vec::with_capacity(5);
        write_eof(status, 0, &mut eof);
        seq = client.queue_packet(seq, &eof);
    }
    for row in &joined.rows {
        seq = client.queue_packet(seq, row);
        if client.write_buffer().len() >= FLUSH_AT {
            client.flush().await?;
        }
    }
    let mut end = Vec::with_capacity(16);
    write_result_end(deprecate_eof, status, &mut end);
    client.send_packet(seq, &end).await?;
    Ok(())
}

/// The `SHOW CREATE TABLE` of a table's default table, read once per
/// dictionary snapshot.
pub(super) async fn definition(
    shared: &Arc<Shared>,
    memo: &mut Memo,
    backends: &mut Backends,
    table: &TableName,
    default: &hscale_planner::Target,
) -> Result<String, ProxyError> {
    let generation = shared.dictionary.snapshot().generation();
    if memo.definitions.generation != generation {
        memo.definitions = Definitions {
            generation,
            by_table: HashMap::new(),
        };
    }
    if let Some(definition) = memo.definitions.by_table.get(table) {
        return Ok(definition.clone());
    }
    let slot = backends.slot_of(default.backend)?;
    let sql = format!(
        "SHOW CREATE TABLE {}.{}",
        hscale_planner::quote_identifier(&table.db),
        hscale_planner::quote_identifier(&default.table)
    );
    let rows = backends.query_rows(slot, &sql).await?;
    let definition = rows
        .first()
        .and_then(|row| row.get(1)?.as_ref())
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .ok_or_else(|| {
            ProxyError::Unroutable(Refusal {
                table: Some(table.clone()),
                reason: "a table whose definition hscale cannot read".into(),
            })
        })?;
    memo.definitions
        .by_table
        .insert(table.clone(), definition.clone());
    Ok(definition)
}

//! Metadata answers that name tables (SHOW TABLES, SHOW TABLE STATUS, SHOW
//! INDEX, SHOW CREATE TABLE, information_schema): read whole from the backend
//! the listing names, corrected to name logical tables only, then sent.
//! COM_FIELD_LIST of a partitioned table: its default table's columns.

use std::sync::Arc;

use bytes::Bytes;
use hscale_planner::{Combine, Elsewhere, Listing, Maintained, NameColumn, QueryOrder, Refusal};
use hscale_planner::{SessionChange, TxEffect};
use hscale_wire::command;
use hscale_wire::frame::read_lenenc;
use hscale_wire::resultset::{column_names, parse_text_row, write_text_row};
use hscale_wire::scan::{Completion, Expect};

use crate::backend::BackendError;
use crate::error::ProxyError;
use crate::exec::{read_answer, Answer, RelayError};
use crate::session::client::Client;
use crate::session::slots::Needs;
use crate::session::Backends;
use crate::shared::Shared;

impl crate::session::Backends {
    /// The whole answer of one statement on `backend`.
    pub(in crate::session) async fn answer_of(
        &mut self,
        backend: u32,
        payload: &Bytes,
    ) -> Result<Answer, ProxyError> {
        let slot = self.slot_of(backend)?;
        let mut lease = self.checkout(slot, Needs::default()).await?;
        let answer = match read_answer(&mut lease.conn, payload).await {
            Ok(answer) => answer,
            Err(RelayError::Backend { source, .. }) => {
                let backend = lease.conn.backend;
                self.forget_connection_state(slot);
                return Err(ProxyError::Backend(BackendError::Lost { backend, source }));
            }
            Err(RelayError::Client(e)) => return Err(ProxyError::Client(e)),
        };
        self.finish_command(slot, lease, &Completion::default());
        Ok(answer)
    }
}

impl crate::session::Backends {
    fn field_list_of_partitioned(
        &self,
        payload: &[u8],
    ) -> Result<Option<(usize, Bytes)>, ProxyError> {
        let Some(end) = payload.iter().skip(1).position(|&b| b == 0) else {
            return Ok(None);
        };
        let (name, wildcard) = (&payload[1..end + 1], &payload[end + 1..]);
        let (Some(db), Ok(name)) = (&self.state.db, std::str::from_utf8(name)) else {
            return Ok(None);
        };
        let dictionary = self.shared.dictionary.snapshot();
        let Some(table) = dictionary.table(db, name) else {
            return Ok(None);
        };
        let target = table.default_target();
        let routed = [&payload[..1], target.table.as_bytes(), wildcard].concat();
        Ok(Some((self.slot_of(target.backend)?, routed.into())))
    }
}

/// The rows as the listing says: physical tables left out or renamed, rows
/// added (`elsewhere`: rows of `listing.elsewhere[i]`) and combined. An
/// answer whose rows from several backends cannot be combined exactly is
/// refused with the reason.
fn correct(
    listing: &Listing,
    header: &[Bytes],
    rows: Vec<Bytes>,
    elsewhere: Vec<(usize, Bytes)>,
) -> Result<Vec<Bytes>, String> {
    // header: the column count, one definition per column, maybe an EOF.
    let Some(columns) = header
        .first()
        .and_then(|count| read_lenenc(count))
        .and_then(|(n, _)| usize::try_from(n).ok())
        .filter(|&n| n < header.len())
    else {
        return Ok(rows);
    };
    let position = |wanted: &str| {
        header[1..=columns].iter().position(|column| {
            column_names(column).is_some_and(|(name, source)| {
                source.eq_ignore_ascii_case(wanted.as_bytes())
                    || name.eq_ignore_ascii_case(wanted.as_bytes())
            })
        })
    };
    let name_at = match listing.column {
        NameColumn::Position(i) | NameColumn::Qualified(i) => Some(i),
        NameColumn::Named(name) => position(name),
    }
    .filter(|&i| i < columns);
    let names = Names {
        listing,
        columns,
        name_at,
        qualified: matches!(listing.column, NameColumn::Qualified(_)),
        schema_at: listing.schema_column.and_then(position),
    };
    let mut named: Vec<(Vec<u8>, Bytes)> = rows
        .into_iter()
        .filter_map(|row| {
            names.rename(row, &|db, table| {
                listing.correct(db, table).map(<[u8]>::to_vec)
            })
        })
        .collect();
    // Which answers gave rows: the listing's backend's, then each elsewhere.
    let mut sources = usize::from(!named.is_empty());
    let mut last_source = None;
    for (i, row) in elsewhere {
        let other = &listing.elsewhere[i];
        if other.probe {
            return Err(several_backends(listing, other, "aggregates or groups"));
        }
        let logical = |db: Option<&[u8]>, table: &[u8]| {
            other
                .physical
                .iter()
                .find(|p| p.table.as_bytes() == table && db.is_none_or(|db| db == p.db.as_bytes()))
                .and_then(|p| p.logical.clone())
                .map(String::into_bytes)
        };
        if let Some(row) = names.rename(row, &logical) {
            if last_source != Some(i) {
                sources += 1;
                last_source = Some(i);
            }
            named.push(row);
        }
    }
    let named = combine(
        listing,
        named,
        Sources {
            count: sources,
            last: last_source,
        },
        name_at,
        columns,
    )?;
    Ok(named.into_iter().map(|(_, row)| row).collect())
}

/// Which answers of a listing gave rows: how many, and the last of the
/// other backends' that did.
struct Sources {
    count: usize,
    last: Option<usize>,
}

/// The rows of every answer as one listing, as `listing.combine` says:
/// sorted by name, summed per table, or as one query's answer would be
/// (refused where its LIMIT or ORDER BY cannot be kept over several).
fn combine(
    listing: &Listing,
    mut named: Vec<(Vec<u8>, Bytes)>,
    sources: Sources,
    name_at: Option<usize>,
    columns: usize,
) -> Result<Vec<(Vec<u8>, Bytes)>, String> {
    let other_source = || &listing.elsewhere[sources.last.unwrap_or(0)];
    match &listing.combine {
        Combine::SortedByName => {
            if !listing.add.is_empty() || !listing.elsewhere.is_empty() {
                for row in &listing.add {
                    let mut packet = Vec::new();
                    write_text_row(row, &mut packet);
                    let name = row.first().cloned().flatten().unwrap_or_default();
                    named.push((name.into_bytes(), Bytes::from(packet)));
                }
                named.sort();
            }
        }
        Combine::Maintenance { tables, checksum } => {
            named = maintained(tables, *checksum, named, columns);
        }
        Combine::Query { .. } if sources.count <= 1 => {}
        Combine::Query {
            order,
            limited,
            distinct,
        } => {
            if *limited {
                return Err(several_backends(listing, other_source(), "LIMIT"));
            }
            match order {
                QueryOrder::Free => {}
                QueryOrder::ByName if name_at.is_some() => {
                    // information_schema compares names case-insensitively.
                    named.sort_by_cached_key(|(name, _)| name.to_ascii_lowercase());
                }
                QueryOrder::ByName | QueryOrder::Other => {
                    return Err(several_backends(listing, other_source(), "ORDER BY"))
                }
            }
            if *distinct {
                let mut seen = std::collections::HashSet::new();
                named.retain(|(_, row)| seen.insert(row.clone()));
            }
        }
    }
    Ok(named)
}

/// Where a listing's rows hold a table's name, and how to put the name the
/// client knows there.
struct Names<'a> {
    listing: &'a Listing,
    columns: usize,
    name_at: Option<usize>,
    qualified: bool,
    schema_at: Option<usize>,
}

impl Names<'_> {
    /// `row` with its table's name as `correct` gives it, and that name
    /// (empty for a row that names no table, kept as it is); `None`: a row
    /// of a table that is not the client's to see.
    fn rename(&self, row: Bytes, correct: &LogicalName) -> Option<(Vec<u8>, Bytes)> {
        let Some(name_at) = self.name_at else {
            return Some((Vec::new(), row));
        };
        let Some(mut values) = parse_text_row(&row, self.columns) else {
            return Some((Vec::new(), row));
        };
        let Some(Some(table)) = values.get(name_at).cloned() else {
            return Some((Vec::new(), row));
        };
        let name = match self.qualified {
            true => {
                let (db, name) = split_qualified(&table);
                [db, b".", &correct(Some(db), name)?].concat()
            }
            false => {
                let db = self
                    .schema_at
                    .and_then(|i| values.get(i).cloned().flatten());
                correct(db.as_deref(), &table)?
            }
        };
        if name == table {
            return Some((table, row));
        }
        if self.listing.create_statement {
            if let Some(Some(create)) = values.get_mut(1) {
                *create = rename_created(create, &table, &name);
            }
        }
        values[name_at] = Some(name.clone());
        let mut packet = Vec::with_capacity(row.len());
        write_text_row(&values, &mut packet);
        Some((name, Bytes::from(packet)))
    }
}

/// A maintenance answer's rows (`Combine::Maintenance`), each `(table,
/// row)`: in the order the statement names the tables, a partitioned
/// table's rows once each, or its checksums summed.
fn maintained(
    tables: &[Maintained],
    checksum: bool,
    mut named: Vec<(Vec<u8>, Bytes)>,
    columns: usize,
) -> Vec<(Vec<u8>, Bytes)> {
    let table_of = |name: &[u8]| tables.iter().position(|t| t.qualified.as_bytes() == name);
    named.sort_by_key(|(name, _)| table_of(name).unwrap_or(usize::MAX));
    let partitioned = |name: &[u8]| table_of(name).is_some_and(|i| tables[i].partitioned);
    let mut kept: Vec<(Vec<u8>, Bytes)> = Vec::with_capacity(named.len());
    for (name, row) in named {
        let same_table = kept.last().filter(|(last, _)| *last == name);
        match same_table {
            Some(_) if !partitioned(&name) => kept.push((name, row)),
            Some((_, last)) if checksum => {
                let sum = add_checksums(last, &row, columns);
                kept.last_mut().expect("the same table's row").1 = sum;
            }
            Some(_) if kept.iter().any(|(n, r)| *n == name && *r == row) => {}
            _ => kept.push((name, row)),
        }
    }
    kept
}

/// One CHECKSUM TABLE row out of two of one table: MariaDB adds its rows'
/// checksums as 32-bit numbers, so partitions add up to the table's. NULL
/// (a partition without a checksum) makes the sum NULL.
fn add_checksums(first: &[u8], second: &[u8], columns: usize) -> Bytes {
    let checksum = |row: &[u8]| {
        let values = parse_text_row(row, columns)?;
        let value = values.get(1).cloned().flatten()?;
        std::str::from_utf8(&value).ok()?.parse::<u64>().ok()
    };
    let mut values = parse_text_row(first, columns).unwrap_or_default();
    if let Some(slot) = values.get_mut(1) {
        *slot = match (checksum(first), checksum(second)) {
            (Some(a), Some(b)) => Some(((a + b) % (1 << 32)).to_string().into_bytes()),
            _ => None,
        };
    }
    let mut packet = Vec::with_capacity(first.len());
    write_text_row(&values, &mut packet);
    Bytes::from(packet)
}

/// `db.table` as a maintenance answer writes it: a database name has no dot.
fn split_qualified(qualified: &[u8]) -> (&[u8], &[u8]) {
    match qualified.iter().position(|&b| b == b'.') {
        Some(dot) => (&qualified[..dot], &qualified[dot + 1..]),
        None => (&[], qualified),
    }
}

/// The name a row's (database, table) gets in the answer; `None` leaves it out.
type LogicalName<'a> = dyn Fn(Option<&[u8]>, &[u8]) -> Option<Vec<u8>> + 'a;

fn several_backends(listing: &Listing, other: &Elsewhere, what: &str) -> String {
    let tables: Vec<String> = other
        .physical
        .iter()
        .filter_map(|p| p.logical.as_ref().map(|l| format!("{}.{l}", p.db)))
        .collect();
    format!(
        "this information_schema query's {what} would combine rows of backend {} with rows of backend {}, which holds the default partition of {}; ask each backend's tables separately",
        listing.backend,
        other.backend,
        tables.join(", ")
    )
}

/// `CREATE TABLE `physical` (...`: the first quoted name is the table's.
fn rename_created(create: &[u8], physical: &[u8], logical: &[u8]) -> Vec<u8> {
    let quoted =
        |name: &[u8]| hscale_planner::quote_identifier(&String::from_utf8_lossy(name)).into_bytes();
    let from = quoted(physical);
    match create
        .windows(from.len())
        .position(|w| w == from.as_slice())
    {
        Some(at) => [&create[..at], &quoted(logical), &create[at + from.len()..]].concat(),
        None => create.to_vec(),
    }
}

/// COM_FIELD_LIST (`mysql_list_fields`, the mariadb CLI's completion)
/// of a partitioned table in the session's database lists its default
/// table's columns, named as the partitioned table's; no backend has a
/// table by the partitioned table's name.
pub(in crate::session) async fn field_list(
    shared: &Arc<Shared>,
    client: &mut Client,
    backends: &mut Backends,
    payload: Bytes,
) -> Result<(), ProxyError> {
    let (slot, payload, needs) = match backends.field_list_of_partitioned(&payload)? {
        Some((slot, routed)) => (slot, routed, Needs::default().routed()),
        None => (shared.main, payload, Needs::default()),
    };
    let (expect, change) = (Some(Expect::FieldList), SessionChange::Nothing);
    backends
        .execute(client, slot, &payload, expect, needs, change)
        .await
        .map(drop)
}

pub(in crate::session) async fn run(
    shared: &Arc<Shared>,
    client: &mut Client,
    backends: &mut Backends,
    payload: Bytes,
    listing: Listing,
    effect: TxEffect,
) -> Result<(), ProxyError> {
    // Table maintenance, which runs on several backends.
    if backends.tx.in_transaction() && effect == TxEffect::CommitsFirst {
        super::transaction::commit_open(shared, backends, None).await?;
    }
    let payload = match &listing.sql {
        Some(sql) => Bytes::from(command::query(sql)),
        None => payload,
    };
    let (header, rows, end) = match backends.answer_of(listing.backend, &payload).await? {
        Answer::Packet(packet) => {
            client.send_packet(1, &packet).await?;
            return Ok(());
        }
        Answer::Rows { header, rows, end } => (header, rows, end),
    };
    let mut elsewhere = Vec::with_capacity(listing.elsewhere.len());
    for (i, other) in listing.elsewhere.iter().enumerate() {
        let payload = Bytes::from(command::query(&other.sql));
        match backends.answer_of(other.backend, &payload).await? {
            Answer::Rows { rows, .. } => elsewhere.extend(rows.into_iter().map(|r| (i, r))),
            // Its error is the answer's: a listing without the row
            // would hide the table.
            Answer::Packet(packet) => {
                client.send_packet(1, &packet).await?;
                return Ok(());
            }
        }
    }
    let rows = correct(&listing, &header, rows, elsewhere).map_err(|reason| {
        ProxyError::Unroutable(Refusal {
            table: None,
            reason,
        })
    })?;
    let mut seq = 1;
    for packet in header.iter().chain(rows.iter()) {
        seq = client.queue_packet(seq, packet);
    }
    client.send_packet(seq, &end).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{add_checksums, rename_created};
    use hscale_wire::resultset::{parse_text_row, write_text_row};

    #[test]
    fn checksums_add_up_as_32_bit_numbers() {
        let row = |checksum: Option<&str>| {
            let mut packet = Vec::new();
            let values = [Some(b"app.users".to_vec()), checksum.map(|c| c.into())];
            write_text_row(&values, &mut packet);
            packet
        };
        let sum = |a, b| {
            let row = add_checksums(&row(a), &row(b), 2);
            parse_text_row(&row, 2).unwrap()[1].clone()
        };
        assert_eq!(sum(Some("4294967295"), Some("2")), Some(b"1".to_vec()));
        assert_eq!(
            sum(Some("115315224"), Some("1349448522")),
            Some(b"1464763746".to_vec())
        );
        assert_eq!(sum(Some("7"), None), None);
        assert_eq!(sum(None, Some("7")), None);
    }

    #[test]
    fn a_create_statement_names_the_logical_table() {
        assert_eq!(
            rename_created(
                b"CREATE TABLE `users_default` (\n  `users_default_id` int",
                b"users_default",
                b"users"
            ),
            b"CREATE TABLE `users` (\n  `users_default_id` int"
        );
    }
}

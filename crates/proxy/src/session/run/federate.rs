//! A SELECT the partitions cannot answer alone (`hscale_planner::Federation`):
//! each partitioned table it reads is copied, as far as the statement needs
//! it, into a temporary table of the same name on the session's main
//! backend connection, where the statement then runs as the client sent it;
//! the copies are dropped before anything else runs there. The connection
//! holds them only for the statement: it is held (sticky) meanwhile, and a
//! connection that could not drop them is closed, never pooled.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use hscale_merge::{Inserts, Spec};
use hscale_planner::{
    drop_temporaries, Action, Federation, Lookup, Refusal, SessionChange, TableName, Temporary,
    MOST_KEYS, MOST_LOOKUP_ROWS,
};
use hscale_wire::command;
use hscale_wire::frame::write_lenenc;
use hscale_wire::packets::{write_eof, write_result_end};
use hscale_wire::resultset::{text_values, write_binary_row, write_text_row, BinaryColumn};
use hscale_wire::scan::{Completion, Expect};
use mysql_common::constants::ColumnFlags;
use mysql_common::io::ParseBuf;
use mysql_common::packets::Column;
use mysql_common::proto::MyDeserialize;

use crate::error::ProxyError;
use crate::exec::{Command, StatementKey, FLUSH_AT};
use crate::session::client::Client;
use crate::session::slots::Needs;
use crate::session::Backends;
use crate::session::Memo;
use crate::shared::Counters;
use crate::shared::Shared;
use crate::spool::{Spool, SpoolBudget};

/// Why the main backend's connection is held while a statement's copies
/// exist.
const COPIES: &str = "hscale's temporary copies of partitioned tables";

/// How much of one copy's INSERTs are held in memory before the rest go to
/// a temporary file.
const COPY_MEMORY: usize = 8 << 20;

/// The tables' definitions (`SHOW CREATE TABLE` of their default tables),
/// for the dictionary snapshot they were read under: a schema change through
/// hscale makes a new one.
#[derive(Debug, Default)]
pub(in crate::session) struct Definitions {
    generation: u64,
    by_table: HashMap<TableName, String>,
}

/// One copy's rows on their way from the partitions: the INSERTs that
/// write them, held (in memory, then in a temporary file) until the scan
/// has ended, as the main backend's connection may be one it reads.
pub(in crate::session) struct Copying {
    head: String,
    /// `INSERT INTO copy (columns) `, for partitions that copy server-side.
    insert_select: String,
    /// The main backend's connection is not among those the read uses: each
    /// INSERT is sent as soon as it is full, not held.
    inline: bool,
    /// A column whose distinct values a later copy is narrowed by.
    key: Option<usize>,
    inserts: Option<Inserts>,
    statements: Spool,
    budget: SpoolBudget,
    disk_limit: u64,
    dir: Option<PathBuf>,
}

/// Where the rows of a read for hscale's own use go (`Session::merge_rows`).
pub(in crate::session) enum Sink {
    /// Into a copy's INSERTs.
    Copying(Box<Copying>),
    /// Kept whole, with their columns, up to `most` rows: a lookup join's.
    Keep {
        columns: Vec<Bytes>,
        rows: Vec<Bytes>,
        most: usize,
        over: bool,
    },
}

impl Sink {
    fn keep(most: usize) -> Sink {
        Sink::Keep {
            columns: Vec::new(),
            rows: Vec::new(),
            most,
            over: false,
        }
    }

    /// A row: an INSERT to send on the main backend now, if one is ready.
    pub(in crate::session) fn row(
        &mut self,
        columns: &[Bytes],
        row: Bytes,
    ) -> Result<Option<Vec<u8>>, ProxyError> {
        match self {
            Sink::Copying(copying) => copying.row(columns, &row),
            Sink::Keep {
                rows, most, over, ..
            } => {
                match rows.len() < *most {
                    true => rows.push(row),
                    false => *over = true,
                }
                Ok(None)
            }
        }
    }

    /// The read's columns, once it ended (with or without rows).
    pub(in crate::session) fn columns(&mut self, definitions: &[Bytes]) {
        if let Sink::Keep { columns, .. } = self {
            *columns = definitions.to_vec();
        }
    }

    /// The kept rows' values, each with its last column (the key) as an
    /// integer, and the columns but the key; `None` where the key is not an
    /// integer column or there were too many rows.
    #[allow(clippy::type_complexity)]
    fn kept_integer_keys(self) -> Option<(Vec<Bytes>, Vec<(Vec<Option<Vec<u8>>>, Option<i128>)>)> {
        let Sink::Keep {
            mut columns,
            rows,
            over: false,
            ..
        } = self
        else {
            return None;
        };
        let key = columns.pop()?;
        let key = Column::deserialize((), &mut ParseBuf(&key)).ok()?;
        use mysql_common::constants::ColumnType::*;
        if !matches!(
            key.column_type(),
            MYSQL_TYPE_TINY
                | MYSQL_TYPE_SHORT
                | MYSQL_TYPE_INT24
                | MYSQL_TYPE_LONG
                | MYSQL_TYPE_LONGLONG
        ) {
            return None;
        }
        let count = columns.len() + 1;
        let mut kept = Vec::with_capacity(rows.len());
        for row in rows {
            let ranges = text_values(&row, count)?;
            let mut values: Vec<Option<Vec<u8>>> = ranges
                .iter()
                .map(|r| r.clone().map(|r| row[r].to_vec()))
                .collect();
            let key = match values.pop()? {
                None => None,
                Some(text) => Some(std::str::from_utf8(&text).ok()?.parse().ok()?),
            };
            kept.push((values, key));
        }
        Some((columns, kept))
    }

    fn copying(&mut self) -> &mut Copying {
        match self {
            Sink::Copying(copying) => copying,
            Sink::Keep { .. } => unreachable!("a copy's sink copies"),
        }
    }
}

impl Copying {
    /// Adds a row: an INSERT (a COM_QUERY) to send on the main backend now,
    /// when one is full and may go at once.
    pub(in crate::session) fn row(
        &mut self,
        columns: &[Bytes],
        row: &[u8],
    ) -> Result<Option<Vec<u8>>, ProxyError> {
        let inserts = match &mut self.inserts {
            Some(inserts) => inserts,
            None => self.inserts.insert(
                Inserts::new(self.head.clone(), columns, self.key, MOST_KEYS)
                    .map_err(ProxyError::MergeSpill)?,
            ),
        };
        match inserts.row(row).map_err(ProxyError::MergeSpill)? {
            Some(statement) => self.send_or_keep(statement),
            None => Ok(None),
        }
    }

    fn send_or_keep(&mut self, statement: String) -> Result<Option<Vec<u8>>, ProxyError> {
        match self.inline {
            true => Ok(Some(command::query(&statement))),
            false => self.keep(&statement).map(|()| None),
        }
    }

    fn keep(&mut self, statement: &str) -> Result<(), ProxyError> {
        let mut line = Vec::with_capacity(4 + statement.len());
        line.extend_from_slice(&(statement.len() as u32).to_le_bytes());
        line.extend_from_slice(statement.as_bytes());
        self.statements
            .push(
                &line,
                &mut self.budget,
                self.disk_limit,
                self.dir.as_deref(),
            )
            .map_err(ProxyError::CopySpill)
    }

    /// The INSERT of the last rows: to send now, or held with the others.
    fn finish(&mut self) -> Result<Option<Vec<u8>>, ProxyError> {
        match self.inserts.as_mut().and_then(Inserts::finish) {
            Some(statement) => self.send_or_keep(statement),
            None => Ok(None),
        }
    }

    /// The statement at `offset` of the held ones, as a COM_QUERY, and the
    /// offset of the next.
    fn statement_at(&self, offset: u64) -> Result<Option<(Vec<u8>, u64)>, ProxyError> {
        let mut length = [0u8; 4];
        let read = self
            .statements
            .read_at(offset, &mut length)
            .map_err(|e| ProxyError::CopySpill(e.into()))?;
        if read == 0 {
            return Ok(None);
        }
        let length = u32::from_le_bytes(length) as usize;
        let mut payload = vec![command::QUERY; 1 + length];
        let mut at = 0;
        while at < length {
            let n = self
                .statements
                .read_at(offset + 4 + at as u64, &mut payload[1 + at..])
                .map_err(|e| ProxyError::CopySpill(e.into()))?;
            if n == 0 {
                break;
            }
            at += n;
        }
        Ok(Some((payload, offset + 4 + length as u64)))
    }
}

/// What runs over the copies once they are made.
pub(in crate::session) enum Then<'a> {
    /// The client's query, as it sent it.
    Query { payload: Bytes, needs: Needs },
    /// COM_STMT_PREPARE of the client's statement, over empty copies.
    Prepare { command: Command<'a> },
    /// An execution of a statement the client prepared.
    Execute {
        id: u32,
        statement: StatementKey,
        rest: &'a [u8],
    },
}

impl Then<'_> {
    /// The client's query (`Action::Federate`).
    pub(in crate::session) fn query(statement: super::Statement) -> Self {
        Then::Query {
            payload: statement.payload,
            needs: statement.needs,
        }
    }
}

/// A column definition without NOT NULL: the inner side of a left join.
fn nullable(definition: &Bytes) -> Bytes {
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
struct Joined {
    columns: Vec<Bytes>,
    rows: Vec<Vec<u8>>,
}

impl crate::session::Backends {
    /// Drops the copies where they were made. A connection that cannot is
    /// closed, with them.
    async fn drop_copies(&mut self, temporaries: &[Temporary]) -> Result<(), ProxyError> {
        let main = self.shared.main;
        if self.slots[main].held.is_none() {
            // The connection went, and its temporary tables with it.
            return Ok(());
        }
        let Some(sql) = drop_temporaries(temporaries.iter().map(|t| &t.table)) else {
            return Ok(());
        };
        let dropped = self.run_quietly(main, &command::query(&sql)).await;
        if dropped.is_err() && self.slots[main].held.is_some() {
            self.forget_connection_state(main);
        }
        dropped.map(drop)
    }
}

/// Copies the statement's tables, runs it on the main backend and drops
/// the copies, whatever happened. The answer of a PREPARE, for its
/// statement's parameters.
pub(in crate::session) async fn run(
    shared: &Arc<Shared>,
    client: &mut Client,
    memo: &mut Memo,
    backends: &mut Backends,
    federation: &Federation,
    then: Then<'_>,
) -> Result<Option<Completion>, ProxyError> {
    let binary = match &then {
        Then::Query { .. } => Some(false),
        Then::Execute { .. } => Some(true),
        Then::Prepare { .. } => None,
    };
    if let (Some(lookup), Some(binary)) = (&federation.lookup, binary) {
        if let Some(joined) = lookup_join(shared, client, memo, backends, lookup, binary).await? {
            tracing::debug!(
                connection_id = client.connection_id,
                "answered by a lookup join"
            );
            Counters::add(&shared.counters.lookup_joins, 1);
            return send_joined(client, backends, joined).await.map(|()| None);
        }
    }
    if binary.is_some() {
        Counters::add(&shared.counters.copied, 1);
    }
    let main = shared.main;
    let mut temporaries = Vec::with_capacity(federation.copies.len());
    for copy in &federation.copies {
        let definition = definition(shared, memo, backends, &copy.table, &copy.definition).await?;
        let temporary = copy
            .temporary(&definition)
            .map_err(|e| ProxyError::Unroutable(e.refusal(Some(copy.table.clone()))))?;
        temporaries.push(temporary);
    }
    tracing::debug!(
        connection_id = client.connection_id,
        reason = %federation.reason,
        tables = temporaries.len(),
        "answering from copies"
    );
    let sticky = backends.slots[main].binding.sticky.replace(COPIES);
    let fill = !matches!(then, Then::Prepare { .. });
    // A client that leaves while its copies are made stops them (the
    // reads of partitions watch it themselves).
    let watcher = crate::session::scatter::watch_client(shared, client, backends);
    let copied = copy_tables(
        shared,
        client,
        memo,
        backends,
        federation,
        &temporaries,
        fill,
    );
    let mut answer = tokio::select! {
        biased;
        copied = copied => copied.map(|()| None),
        never = watcher => match never {},
    };
    if answer.is_ok() {
        answer = match then {
            Then::Query { payload, needs } => backends
                .execute(
                    client,
                    main,
                    &payload,
                    Some(Expect::ResultSets),
                    needs,
                    SessionChange::Nothing,
                )
                .await
                .map(|_| None),
            Then::Prepare { command } => backends
                .execute_command(
                    client,
                    main,
                    command,
                    Some(Expect::Prepare),
                    Needs::default(),
                    SessionChange::Nothing,
                )
                .await
                .map(Some),
            Then::Execute {
                id,
                statement,
                rest,
            } => super::prepared::execute_on(
                shared, client, memo, backends, main, id, statement, rest,
            )
            .await
            .map(|()| None),
        };
    }
    let dropped = backends.drop_copies(&temporaries).await;
    backends.slots[main].binding.sticky = sticky;
    // Clean again, with the session's settings: pooled as any other,
    // unless the session holds it for more.
    if let Some(conn) = backends.slots[main].held.take() {
        backends.checkin(main, conn);
    }
    let answer = answer?;
    dropped.map(|()| answer)
}

/// The copies, in the plan's order: each table's temporary table made,
/// its rows read from the partitions and inserted.
/// `fill`: the rows too, not only the tables.
async fn copy_tables(
    shared: &Arc<Shared>,
    client: &mut Client,
    memo: &mut Memo,
    backends: &mut Backends,
    federation: &Federation,
    temporaries: &[Temporary],
    fill: bool,
) -> Result<(), ProxyError> {
    let main = shared.main;
    let copies = &federation.copies;
    // The column of each copy that a later one is narrowed by.
    let key_of = |i: usize| {
        copies
            .iter()
            .filter_map(|c| c.reduce.as_ref())
            .find(|r| r.from == i)
            .and_then(|r| temporaries[i].position(&r.from_column))
    };
    let mut keys: Vec<Option<Vec<String>>> = Vec::with_capacity(copies.len());
    for (i, (copy, temporary)) in copies.iter().zip(temporaries).enumerate() {
        let create = command::query(&temporary.create);
        match (
            backends.run_quietly(main, &create).await,
            &temporary.create_as_defined,
        ) {
            (Ok(_), _) => {}
            // No Aria here, or a key longer than it takes.
            (Err(ProxyError::Refused(_)), Some(as_defined)) => {
                backends
                    .run_quietly(main, &command::query(as_defined))
                    .await?;
            }
            (Err(e), _) => return Err(e),
        }
        if !fill {
            continue;
        }
        let narrowed = copy.reduce.as_ref().and_then(|r| {
            let same_key = key_of(r.from) == temporaries[r.from].position(&r.from_column);
            keys[r.from].as_deref().filter(|_| same_key)
        });
        let mut sink = Sink::Copying(Box::new(Copying {
            head: temporary.insert_head(),
            insert_select: temporary.insert_select(),
            inline: false,
            key: key_of(i),
            inserts: None,
            statements: Spool::default(),
            budget: SpoolBudget {
                // Read back in order once: memory saves little here.
                memory_left: shared.scans.memory_bytes.min(COPY_MEMORY),
                disk_left: shared.scans.spill_bytes,
            },
            disk_limit: shared.scans.spill_bytes,
            dir: shared.scans.spill_dir.clone(),
        }));
        // No key to join: no row of this table joins either.
        if narrowed.is_none_or(|keys| !keys.is_empty()) {
            let fetch = copy.fetch(temporary, narrowed);
            read_rows(shared, client, memo, backends, &fetch, &mut sink).await?;
            if let Some(last) = sink.copying().finish()? {
                backends.run_quietly(main, &last).await?;
            }
        }
        let copying = sink.copying();
        let mut offset = 0;
        while let Some((insert, next)) = copying.statement_at(offset)? {
            backends.run_quietly(main, &insert).await?;
            offset = next;
        }
        keys.push(
            copying
                .inserts
                .as_ref()
                .and_then(Inserts::keys)
                .or_else(|| {
                    // A copy with no rows has no keys at all.
                    (copying.inserts.is_none() && copying.key.is_some()).then(Vec::new)
                }),
        );
    }
    Ok(())
}

/// Runs a copy's SELECT where the dictionary routes it, its rows to
/// `copying`.
async fn read_rows(
    shared: &Arc<Shared>,
    client: &mut Client,
    memo: &mut Memo,
    backends: &mut Backends,
    fetch: &str,
    sink: &mut Sink,
) -> Result<(), ProxyError> {
    let plan = super::plan_waiting(client, memo, backends, |client, memo, backends| {
        super::plan_statement(client, memo, backends, fetch.as_bytes())
    })
    .await?;
    let route = match plan.action {
        Action::Route(route) => route,
        Action::Refuse(refusal) => return Err(ProxyError::Unroutable(refusal)),
        // A read of one table the partitions cannot answer: what
        // stops it, without copies of copies.
        Action::Federate(federation) => {
            return Err(ProxyError::Unroutable(Refusal {
                table: federation.copies.first().map(|c| c.table.clone()),
                reason: federation.reason,
            }))
        }
        other => {
            return Err(ProxyError::Unroutable(Refusal {
                table: None,
                reason: format!("a copy's read that is not routed ({other:?})"),
            }))
        }
    };
    if !backends.handle.on.planned_fresh() {
        return Err(ProxyError::DictionaryStale);
    }
    let spec = match &route.merge {
        hscale_planner::Merge::Rows(spec) => (**spec).clone(),
        _ => Spec::default(),
    };
    let mut route = route;
    let main = shared.main;
    // Partitions on the main backend copy there, server-side, outside a
    // transaction: their rows need not pass through hscale (unless their
    // keys must). Under REPEATABLE READ an INSERT ... SELECT reads its
    // source with shared locks, which writers of those rows would wait
    // for; READ COMMITTED, for that one statement, makes it a plain
    // consistent read of its own snapshot. Inside a transaction the
    // rows are read through hscale like the other backends': plain
    // reads of the transaction's own snapshot, locking nothing.
    if let Some(copying) = match sink {
        // With autocommit off the statement would begin the client's
        // transaction, at READ COMMITTED.
        Sink::Copying(copying)
            if copying.key.is_none()
                && backends.tx.autocommit()
                && !backends.tx.in_transaction() =>
        {
            Some(copying)
        }
        _ => None,
    } {
        let main_backend = shared.main_backend();
        let (here, elsewhere) = std::mem::take(&mut route.steps)
            .into_iter()
            .partition::<Vec<_>, _>(|step| step.target.backend == main_backend);
        route.steps = elsewhere.into_iter().collect();
        for step in here {
            let unlocked = command::query("SET TRANSACTION ISOLATION LEVEL READ COMMITTED");
            backends.run_quietly(main, &unlocked).await?;
            let insert = format!("{}{}", copying.insert_select, step.sql);
            backends.run_quietly(main, &command::query(&insert)).await?;
        }
        if route.steps.is_empty() {
            return Ok(());
        }
    }
    let needs = Needs {
        reads_only: true,
        ..Needs::default()
    };
    let (slots, payloads, probes) =
        super::route::route_payloads(shared, client, backends, route, false)?;
    if let Sink::Copying(copying) = sink {
        copying.inline = !slots.contains(&main);
    }
    let commands: Vec<Command> = payloads.iter().map(|p| Command::Raw(p)).collect();
    crate::session::scatter::merge_rows(
        shared,
        client,
        memo,
        backends,
        spec,
        &slots,
        &commands,
        needs,
        probes,
        Some(sink),
    )
    .await
}

/// A lookup join's answer: its columns and rows, `binary` for an
/// EXECUTE; `None` where the copies must answer instead (see `Lookup`;
/// for an EXECUTE, also a column whose text has no exact binary form).
async fn lookup_join(
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
                _ => return Ok(None),
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
            let Some(row) = write_row(&values) else {
                return Ok(None);
            };
            rows.push(row);
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
            let Some(row) = write_row(&values) else {
                return Ok(None);
            };
            rows.push(row);
        }
    }
    Ok(Some(Joined { columns, rows }))
}

/// A result set hscale made: its columns, rows and end.
async fn send_joined(
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
async fn definition(
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

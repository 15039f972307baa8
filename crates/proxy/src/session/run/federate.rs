//! A SELECT the partitions cannot answer alone (`hscale_planner::Federation`):
//! each partitioned table it reads is copied, as far as the statement needs
//! it, into a temporary table of the same name on the session's main
//! backend connection, where the statement then runs as the client sent it;
//! the copies are dropped before anything else runs there. The connection
//! holds them only for the statement: it is held (sticky) meanwhile, and a
//! connection that could not drop them is closed, never pooled.

mod copies;
mod lookup;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use hscale_merge::Inserts;
use hscale_planner::{
    drop_temporaries, Federation, SessionChange, TableName, Temporary, MOST_KEYS,
};
use hscale_wire::command;
use hscale_wire::resultset::text_values;
use hscale_wire::scan::{Completion, Expect};
use mysql_common::io::ParseBuf;
use mysql_common::packets::Column;
use mysql_common::proto::MyDeserialize;

use crate::error::ProxyError;
use crate::exec::{Command, StatementKey};
use crate::session::client::Client;
use crate::session::slots::Needs;
use crate::session::Backends;
use crate::session::Memo;
use crate::shared::Counters;
use crate::shared::Shared;
use crate::spool::{Spool, SpoolBudget};
use copies::copy_tables;
use lookup::{definition, lookup_join, send_joined};

/// Why the main backend's connection is held while a statement's copies
/// exist.
const COPIES: &str = "hscale's temporary copies of partitioned tables";

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

/// Where the rows of a read for hscale's own use go (`scatter::merge_rows`).
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
        answer = run_then(shared, client, memo, backends, then).await;
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

/// What runs on the copies, on the session's main backend connection: the
/// client's query, the statement prepared for its columns, or an EXECUTE.
async fn run_then(
    shared: &Arc<Shared>,
    client: &mut Client,
    memo: &mut Memo,
    backends: &mut Backends,
    then: Then<'_>,
) -> Result<Option<Completion>, ProxyError> {
    let main = shared.main;
    match then {
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
        } => super::prepared::execute_on(shared, client, memo, backends, main, id, statement, rest)
            .await
            .map(|()| None),
    }
}

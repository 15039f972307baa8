//! A SELECT the partitions cannot answer alone (`hscale_planner::Federation`):
//! each partitioned table it reads is copied, as far as the statement needs
//! it, into a temporary table of the same name on the session's main
//! backend connection, where the statement then runs as the client sent it;
//! the copies are dropped before anything else runs there. The connection
//! holds them only for the statement: it is held (sticky) meanwhile, and a
//! connection that could not drop them is closed, never pooled.

use std::collections::HashMap;
use std::path::PathBuf;

use bytes::Bytes;
use hscale_merge::{Inserts, Spec};
use hscale_planner::{
    drop_temporaries, Action, Federation, Refusal, SessionChange, TableName, Temporary, MOST_KEYS,
};
use hscale_wire::scan::{Completion, Expect};

use super::slots::Needs;
use super::state::{command, COM_QUERY};
use super::Session;
use crate::error::ProxyError;
use crate::exec::{Command, StatementKey};
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
pub(super) struct Definitions {
    generation: u64,
    by_table: HashMap<TableName, String>,
}

/// One copy's rows on their way from the partitions: the INSERTs that
/// write them, held (in memory, then in a temporary file) until the scan
/// has ended, as the main backend's connection may be one it reads.
pub(super) struct Copying {
    head: String,
    /// A column whose distinct values a later copy is narrowed by.
    key: Option<usize>,
    inserts: Option<Inserts>,
    statements: Spool,
    budget: SpoolBudget,
    disk_limit: u64,
    dir: Option<PathBuf>,
}

impl Copying {
    pub(super) fn row(&mut self, columns: &[Bytes], row: &[u8]) -> Result<(), ProxyError> {
        let inserts = match &mut self.inserts {
            Some(inserts) => inserts,
            None => self.inserts.insert(
                Inserts::new(self.head.clone(), columns, self.key, MOST_KEYS)
                    .map_err(ProxyError::MergeSpill)?,
            ),
        };
        match inserts.row(row).map_err(ProxyError::MergeSpill)? {
            Some(statement) => self.keep(&statement),
            None => Ok(()),
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

    fn finish(&mut self) -> Result<(), ProxyError> {
        match self.inserts.as_mut().and_then(Inserts::finish) {
            Some(statement) => self.keep(&statement),
            None => Ok(()),
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
        let mut payload = vec![COM_QUERY; 1 + length];
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
pub(super) enum Then<'a> {
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

impl Session {
    /// Copies the statement's tables, runs it on the main backend and drops
    /// the copies, whatever happened. The answer of a PREPARE, for its
    /// statement's parameters.
    pub(super) async fn federate(
        &mut self,
        federation: &Federation,
        then: Then<'_>,
    ) -> Result<Option<Completion>, ProxyError> {
        let main = self.shared.main;
        let mut temporaries = Vec::with_capacity(federation.copies.len());
        for copy in &federation.copies {
            let definition = self.definition(&copy.table, &copy.definition).await?;
            let temporary = copy.temporary(&definition).map_err(|reason| {
                ProxyError::Unroutable(Refusal {
                    table: Some(copy.table.clone()),
                    reason,
                })
            })?;
            temporaries.push(temporary);
        }
        tracing::debug!(
            connection_id = self.connection_id,
            reason = %federation.reason,
            tables = temporaries.len(),
            "answering from copies"
        );
        let sticky = self.slots[main].binding.sticky.replace(COPIES);
        let fill = !matches!(then, Then::Prepare { .. });
        // A client that leaves while its copies are made stops them (the
        // reads of partitions watch it themselves).
        let watcher = self.watch_client();
        let copied = self.copy_tables(federation, &temporaries, fill);
        let mut answer = tokio::select! {
            biased;
            copied = copied => copied.map(|()| None),
            never = watcher => match never {},
        };
        if answer.is_ok() {
            answer = match then {
                Then::Query { payload, needs } => self
                    .execute(
                        main,
                        &payload,
                        Some(Expect::ResultSets),
                        needs,
                        SessionChange::Nothing,
                    )
                    .await
                    .map(|_| None),
                Then::Prepare { command } => self
                    .execute_command(
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
                } => self
                    .execute_on(main, id, statement, rest)
                    .await
                    .map(|()| None),
            };
        }
        let dropped = self.drop_copies(&temporaries).await;
        self.slots[main].binding.sticky = sticky;
        // Clean again, with the session's settings: pooled as any other,
        // unless the session holds it for more.
        if let Some(conn) = self.slots[main].held.take() {
            self.checkin(main, conn);
        }
        let answer = answer?;
        dropped.map(|()| answer)
    }

    /// The copies, in the plan's order: each table's temporary table made,
    /// its rows read from the partitions and inserted.
    /// `fill`: the rows too, not only the tables.
    async fn copy_tables(
        &mut self,
        federation: &Federation,
        temporaries: &[Temporary],
        fill: bool,
    ) -> Result<(), ProxyError> {
        let main = self.shared.main;
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
            let create = command(COM_QUERY, &temporary.create);
            self.run_quietly(main, &create).await?;
            if !fill {
                continue;
            }
            let narrowed = copy.reduce.as_ref().and_then(|r| {
                let same_key = key_of(r.from) == temporaries[r.from].position(&r.from_column);
                keys[r.from].as_deref().filter(|_| same_key)
            });
            let mut copying = Copying {
                head: temporary.insert_head(),
                key: key_of(i),
                inserts: None,
                statements: Spool::default(),
                budget: SpoolBudget {
                    // Read back in order once: memory saves little here.
                    memory_left: self.shared.scans.memory_bytes.min(COPY_MEMORY),
                    disk_left: self.shared.scans.spill_bytes,
                },
                disk_limit: self.shared.scans.spill_bytes,
                dir: self.shared.scans.spill_dir.clone(),
            };
            // No key to join: no row of this table joins either.
            if narrowed.is_none_or(|keys| !keys.is_empty()) {
                let fetch = copy.fetch(temporary, narrowed);
                self.read_rows(&fetch, &mut copying).await?;
                copying.finish()?;
            }
            let mut offset = 0;
            while let Some((insert, next)) = copying.statement_at(offset)? {
                self.run_quietly(main, &insert).await?;
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
    async fn read_rows(&mut self, fetch: &str, copying: &mut Copying) -> Result<(), ProxyError> {
        let plan = self
            .plan_waiting(|session| session.plan(fetch.as_bytes()))
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
        if !self.handle.on.planned_fresh() {
            return Err(ProxyError::DictionaryStale);
        }
        let spec = match &route.merge {
            hscale_planner::Merge::Rows(spec) => (**spec).clone(),
            _ => Spec::default(),
        };
        let needs = Needs {
            reads_only: true,
            ..Needs::default()
        };
        let (slots, payloads, probes) = self.route_payloads(route, false)?;
        let commands: Vec<Command> = payloads.iter().map(|p| Command::Raw(p)).collect();
        self.merge_rows(spec, &slots, &commands, needs, probes, Some(copying))
            .await
    }

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
        let dropped = self.run_quietly(main, &command(COM_QUERY, &sql)).await;
        if dropped.is_err() && self.slots[main].held.is_some() {
            self.forget_connection_state(main);
        }
        dropped.map(drop)
    }

    /// The `SHOW CREATE TABLE` of a table's default table, read once per
    /// dictionary snapshot.
    async fn definition(
        &mut self,
        table: &TableName,
        default: &hscale_planner::Target,
    ) -> Result<String, ProxyError> {
        let generation = self.shared.dictionary.snapshot().generation();
        if self.definitions.generation != generation {
            self.definitions = Definitions {
                generation,
                by_table: HashMap::new(),
            };
        }
        if let Some(definition) = self.definitions.by_table.get(table) {
            return Ok(definition.clone());
        }
        let slot = self.slot_of(default.backend)?;
        let sql = format!(
            "SHOW CREATE TABLE {}.{}",
            hscale_planner::quote_identifier(&table.db),
            hscale_planner::quote_identifier(&default.table)
        );
        let rows = self.query_rows(slot, &sql).await?;
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
        self.definitions
            .by_table
            .insert(table.clone(), definition.clone());
        Ok(definition)
    }
}

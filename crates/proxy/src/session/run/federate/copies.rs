//! The temporary copies a federated statement runs over: each partitioned
//! table it reads copied from its partitions (as far as the statement's
//! conditions and columns need), in bounded batches, into a temporary table
//! on the session's main backend connection.

use std::sync::Arc;

use hscale_merge::{Inserts, Spec};
use hscale_planner::{Action, Federation, Refusal, Temporary};
use hscale_wire::command;

use super::{Copying, Sink};
use crate::error::ProxyError;
use crate::exec::Command;
use crate::session::client::Client;
use crate::session::slots::Needs;
use crate::session::Backends;
use crate::session::Memo;
use crate::shared::Shared;
use crate::spool::{Spool, SpoolBudget};

/// How much of one copy's INSERTs are held in memory before the rest go to
/// a temporary file.
pub(super) const COPY_MEMORY: usize = 8 << 20;

/// The copies, in the plan's order: each table's temporary table made,
/// its rows read from the partitions and inserted.
/// `fill`: the rows too, not only the tables.
pub(super) async fn copy_tables(
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
pub(super) async fn read_rows(
    shared: &Arc<Shared>,
    client: &mut Client,
    memo: &mut Memo,
    backends: &mut Backends,
    fetch: &str,
    sink: &mut Sink,
) -> Result<(), ProxyError> {
    let plan =
        crate::session::run::plan_waiting(client, memo, backends, |client, memo, backends| {
            crate::session::run::plan_statement(client, memo, backends, fetch.as_bytes())
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
        crate::session::run::route::route_payloads(shared, client, backends, route, false)?;
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

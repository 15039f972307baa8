//! A statement routed to partitions (`Action::Route`), and an INSERT whose
//! AUTO_INCREMENT ids hscale writes in (`Action::Generate`).

use std::sync::Arc;

use bytes::Bytes;
use hscale_planner::{Action, Generate, Merge, Route, SessionChange, Step};
use hscale_wire::command;
use hscale_wire::scan::Expect;

use crate::error::ProxyError;
use crate::exec::Command;
use crate::session::client::Client;
use crate::session::scatter::Generated;
use crate::session::slots::Needs;
use crate::session::Backends;
use crate::session::Memo;
use crate::shared::Shared;

/// A statement routed to partitions, on a dictionary snapshot that is
/// fresh; `binds`: why its first backend's connection stays.
pub(in crate::session) async fn run(
    shared: &Arc<Shared>,
    client: &mut Client,
    memo: &mut Memo,
    backends: &mut Backends,
    route: Route,
    binds: Option<&'static str>,
    statement: super::Statement,
) -> Result<(), ProxyError> {
    let super::Statement {
        needs, own_values, ..
    } = statement;
    if !backends.handle.on.planned_fresh() {
        return Err(ProxyError::DictionaryStale);
    }
    if let Some(reason) = binds {
        let slot = backends.slot_of(route.steps[0].target.backend)?;
        backends.slots[slot].binding.sticky.get_or_insert(reason);
    }
    run_route(
        shared, client, memo, backends, route, needs, own_values, None,
    )
    .await
}

/// An INSERT that leaves AUTO_INCREMENT ids to the server: this
/// instance's next ids are written into it, and it is planned again.
pub(in crate::session) async fn insert_with_ids(
    shared: &Arc<Shared>,
    client: &mut Client,
    memo: &mut Memo,
    backends: &mut Backends,
    generate: Generate,
    statement: super::Statement,
) -> Result<(), ProxyError> {
    let super::Statement {
        payload,
        needs,
        own_values,
    } = statement;
    let sql = &payload[1..];
    if !shared.dictionary.fresh() {
        return Err(ProxyError::DictionaryStale);
    }
    let first = shared
        .sequences
        .take(shared, &generate.table, generate.count)
        .await?;
    let filled = generate.fill(&String::from_utf8_lossy(sql), first);
    let plan = match filled {
        Some(filled) => {
            super::plan_waiting(client, memo, backends, |client, memo, backends| {
                super::plan_statement(client, memo, backends, filled.as_bytes())
            })
            .await?
        }
        None => return Err(unroutable_with_ids(generate.table)),
    };
    match plan.action {
        Action::Route(route) => {
            let generated = Generated {
                first,
                upsert: generate.upsert,
            };
            run_route(
                shared,
                client,
                memo,
                backends,
                route,
                needs,
                own_values,
                Some(generated),
            )
            .await
        }
        Action::Refuse(refusal) => Err(ProxyError::Unroutable(refusal)),
        _ => Err(unroutable_with_ids(generate.table)),
    }
}

/// A routed statement: one step is forwarded as it is, several are
/// merged. `generated`: the first of the AUTO_INCREMENT ids hscale wrote
/// into it, which its OK reports.
async fn run_route(
    shared: &Arc<Shared>,
    client: &mut Client,
    memo: &mut Memo,
    backends: &mut Backends,
    route: Route,
    needs: Needs,
    own_values: bool,
    generated: Option<Generated>,
) -> Result<(), ProxyError> {
    // An INSERT whose ids hscale wrote was planned again since.
    if !backends.handle.on.planned_fresh() {
        return Err(ProxyError::DictionaryStale);
    }
    shared.counters.routed.add(1);
    let Some(given) = route.highest_id else {
        return run_steps(
            shared, client, memo, backends, route, needs, own_values, generated,
        )
        .await;
    };
    // Before the INSERT runs: nothing may be sent after its answer.
    shared.sequences.given(shared, &route.table, given).await?;
    let before = backends.state.last_insert_id;
    let ran = run_steps(
        shared, client, memo, backends, route, needs, own_values, generated,
    )
    .await;
    if generated.is_none() {
        // Ids given are in the OK, but LAST_INSERT_ID() keeps its value.
        backends.state.last_insert_id = before;
    }
    ran
}

async fn run_steps(
    shared: &Arc<Shared>,
    client: &mut Client,
    memo: &mut Memo,
    backends: &mut Backends,
    mut route: Route,
    needs: Needs,
    own_values: bool,
    generated: Option<Generated>,
) -> Result<(), ProxyError> {
    let payload = |client: &Client, backends: &Backends, step: Step| {
        let payload = Bytes::from(step.into_command(command::QUERY));
        match own_values {
            true => crate::session::with_own_values(shared, client, backends, payload),
            false => payload,
        }
    };
    if route.steps.len() == 1 {
        let step = route.steps.pop().expect("one step");
        let slot = backends.slot_of(step.target.backend)?;
        if route.writes {
            backends.check_writers(&[slot])?;
        }
        let payload = payload(client, backends, step);
        match generated {
            None => {
                backends
                    .execute(
                        client,
                        slot,
                        &payload,
                        Some(Expect::ResultSets),
                        needs.routed(),
                        SessionChange::Nothing,
                    )
                    .await?;
            }
            // Its OK must report the first id hscale wrote in.
            Some(_) => {
                let command = [Command::Raw(&payload)];
                return Box::pin(crate::session::scatter::run_merged(
                    shared,
                    client,
                    memo,
                    backends,
                    Merge::AffectedRows,
                    &[slot],
                    &command,
                    needs,
                    generated,
                    Vec::new(),
                ))
                .await;
            }
        }
        if route.writes {
            backends.tx.wrote(slot);
        }
        return Ok(());
    }
    if route.writes {
        let mut slots = Vec::with_capacity(route.steps.len());
        for step in &route.steps {
            slots.push(backends.slot_of(step.target.backend)?);
        }
        backends.check_writers(&slots)?;
    }
    let merge = route.merge.clone();
    let (slots, payloads, probes) = route_payloads(shared, client, backends, route, own_values)?;
    let commands: Vec<Command> = payloads.iter().map(|p| Command::Raw(p)).collect();
    // Boxed: a merge's future is several KB, which a statement routed to one
    // partition would otherwise carry and copy at every call.
    Box::pin(crate::session::scatter::run_merged(
        shared, client, memo, backends, merge, &slots, &commands, needs, generated, probes,
    ))
    .await
}

/// The slots a route's steps run on and their commands: a statement
/// each, or one per backend where its partitions must go as one
/// (`must_unite`), with the probe that gives its columns.
#[allow(clippy::type_complexity)]
pub(in crate::session) fn route_payloads(
    shared: &Arc<Shared>,
    client: &Client,
    backends: &Backends,
    route: Route,
    own_values: bool,
) -> Result<(Vec<usize>, Vec<Bytes>, Vec<Option<Bytes>>), ProxyError> {
    let with_id = |payload: Bytes| match own_values {
        true => crate::session::with_own_values(shared, client, backends, payload),
        false => payload,
    };
    let mut slots = Vec::with_capacity(route.steps.len());
    for step in &route.steps {
        slots.push(backends.slot_of(step.target.backend)?);
    }
    let united = match backends.must_unite(&slots) {
        true => route.united(),
        false => None,
    };
    Ok(match united {
        Some(united) => {
            let mut one_each = (Vec::new(), Vec::new(), Vec::new());
            for united in united {
                one_each.0.push(backends.slot_of(united.backend)?);
                one_each.2.push(united.probe.clone().map(Bytes::from));
                one_each
                    .1
                    .push(with_id(Bytes::from(united.into_command(command::QUERY))));
            }
            one_each
        }
        None => {
            let payloads = route
                .steps
                .into_iter()
                .map(|step| with_id(Bytes::from(step.into_command(command::QUERY))))
                .collect();
            (slots, payloads, Vec::new())
        }
    })
}

fn unroutable_with_ids(table: hscale_planner::TableName) -> ProxyError {
    ProxyError::Unroutable(hscale_planner::Refusal {
        table: Some(table),
        reason: "an INSERT with the AUTO_INCREMENT ids hscale wrote into it that cannot be routed"
            .into(),
    })
}

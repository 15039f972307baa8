//! A schema statement on a partitioned table, run for the client: the
//! session's open transaction is committed first (as the server does before
//! DDL), then each physical table's statement runs on the session's own
//! connection to its backend, with the session's database and settings,
//! under the table lock.

use std::sync::Arc;

use hscale_planner::{plan, PlanCache, SchemaChange};
use hscale_wire::command;
use hscale_wire::packets::{ErrorPacket, OkInfo};

use crate::admin::schema::SchemaLock;
use crate::error::ProxyError;
use crate::session::client::Client;
use crate::session::Backends;
use crate::shared::Shared;

/// The error of step `failed`. When it is not the first, the message says
/// which physical tables changed before it and which were not reached.
fn partly_done(error: ProxyError, change: &SchemaChange, failed: usize) -> ProxyError {
    if failed == 0 {
        return error;
    }
    let list = |steps: &[hscale_planner::Step]| {
        steps
            .iter()
            .map(|s| format!("{} (backend {})", s.target.table, s.target.backend))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let step = &change.steps[failed];
    let note = format!(
        "hscale: {} of {} failed on {} (backend {}); changed already: {}; not changed: {}",
        change.statement,
        change.table,
        step.target.table,
        step.target.backend,
        list(&change.steps[..failed]),
        match list(&change.steps[failed + 1..]) {
            rest if rest.is_empty() => "none".to_string(),
            rest => rest,
        },
    );
    tracing::error!(%note, error = %error, "schema change partly done");
    match error {
        ProxyError::Refused(packet) => ProxyError::Refused(ErrorPacket {
            message: format!("{} ({note})", packet.message),
            ..packet
        }),
        other => ProxyError::Admin(crate::admin::AdminError::Invalid(format!(
            "{other} ({note})"
        ))),
    }
}

pub(in crate::session) async fn run(
    shared: &Arc<Shared>,
    client: &mut Client,
    backends: &mut Backends,
    sql: &[u8],
) -> Result<(), ProxyError> {
    if backends.tx.in_transaction() {
        super::transaction::commit_open(shared, backends, None).await?;
    }
    let mut lock = SchemaLock::take(shared, |dictionary| {
        plan(
            sql,
            &super::context(client, backends, dictionary),
            &mut PlanCache::default(),
        )
        .action
    })
    .await?;
    let change = lock.change().clone();
    let mut total = OkInfo::default();
    backends.gather_from_here();
    for (i, step) in change.steps.iter().enumerate() {
        let ran = match (
            lock.starting(shared, i).await,
            backends.slot_of(step.target.backend),
        ) {
            (Ok(()), Ok(slot)) => backends.run_part(slot, &command::query(&step.sql)).await,
            (Err(e), _) | (_, Err(e)) => Err(e),
        };
        match ran {
            Ok(completion) => {
                total.affected_rows += completion.affected_rows;
                total.warnings = total.warnings.saturating_add(completion.warnings);
                lock.done(shared, i).await?;
            }
            Err(e) => {
                lock.abandon(shared).await?;
                return Err(partly_done(e, &change, i));
            }
        }
    }
    lock.finish(shared).await?;
    tracing::info!(table = %change.table, statement = %change.statement, "schema change done on every partition");
    backends.previous = crate::session::slots::Previous::Scattered {
        messages: total.warnings > 0,
        slot: shared.main,
    };
    backends.send_total(client, total).await
}

impl crate::session::Backends {
    /// CREATE TABLE IF NOT EXISTS of a partitioned table: a note, or 1050.
    pub(super) async fn exists(
        &mut self,
        client: &mut Client,
        table: &hscale_planner::TableName,
        quiet: bool,
    ) -> Result<(), ProxyError> {
        match quiet {
            true => self.send_ok(client).await,
            false => Err(ProxyError::Refused(hscale_wire::packets::ErrorPacket::new(
                1050,
                "42S01",
                format!("Table '{}' already exists", table.name),
            ))),
        }
    }
}

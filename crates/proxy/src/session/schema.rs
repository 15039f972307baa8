//! A schema statement on a partitioned table, run for the client: the
//! session's open transaction is committed first (as the server does before
//! DDL), then each physical table's statement runs on the session's own
//! connection to its backend, with the session's database and settings,
//! under the table lock.

use hscale_planner::{plan, PlanCache, SchemaChange};
use hscale_wire::packets::{ErrorPacket, OkInfo};

use super::Session;
use crate::admin::schema::SchemaLock;
use crate::error::ProxyError;
use hscale_wire::command;

impl Session {
    pub(super) async fn schema_change(&mut self, sql: &[u8]) -> Result<(), ProxyError> {
        if self.backends.tx.in_transaction() {
            self.commit_open(None).await?;
        }
        let shared = self.shared.clone();
        let mut lock = SchemaLock::take(&shared, |dictionary| {
            plan(sql, &self.context(dictionary), &mut PlanCache::default()).action
        })
        .await?;
        let change = lock.change().clone();
        let mut total = OkInfo::default();
        self.backends.gather_from_here();
        for (i, step) in change.steps.iter().enumerate() {
            let ran = match (
                lock.starting(&shared, i).await,
                self.backends.slot_of(step.target.backend),
            ) {
                (Ok(()), Ok(slot)) => {
                    self.backends
                        .run_part(slot, &command::query(&step.sql))
                        .await
                }
                (Err(e), _) | (_, Err(e)) => Err(e),
            };
            match ran {
                Ok(completion) => {
                    total.affected_rows += completion.affected_rows;
                    total.warnings = total.warnings.saturating_add(completion.warnings);
                    lock.done(&shared, i).await?;
                }
                Err(e) => {
                    lock.abandon(&shared).await?;
                    return Err(partly_done(e, &change, i));
                }
            }
        }
        lock.finish(&shared).await?;
        tracing::info!(table = %change.table, statement = %change.statement, "schema change done on every partition");
        self.backends.previous = super::slots::Previous::Scattered {
            messages: total.warnings > 0,
            slot: self.shared.main,
        };
        self.backends.send_total(&mut self.client, total).await
    }
}

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

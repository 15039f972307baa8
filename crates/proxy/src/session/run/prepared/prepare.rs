//! COM_STMT_PREPARE: the statement planned as its text would be, prepared
//! where its executions will run (a partition for a statement on a
//! partitioned table, the backend of the copies for a read of reference
//! tables, the main backend otherwise), or refused.

use std::sync::Arc;

use bytes::Bytes;
use hscale_planner::{plan_prepared, Action, Context, Plan, SessionChange};
use hscale_wire::scan::Expect;
use smallvec::SmallVec;

use super::{Prepared, Routed};
use crate::error::ProxyError;
use crate::exec::{Command, StatementKey};
use crate::session::client::Client;
use crate::session::run::federate::Then;
use crate::session::slots::Needs;
use crate::session::Backends;
use crate::session::Memo;
use crate::shared::Shared;

/// COM_STMT_PREPARE: prepared on a backend to answer the client with the
/// statement's parameters and columns (on the main backend, or for a
/// partitioned table on its default partition's), and kept in that
/// connection's cache; the connection goes back to the pool.
pub(in crate::session) async fn prepare(
    shared: &Arc<Shared>,
    client: &mut Client,
    memo: &mut Memo,
    backends: &mut Backends,
    payload: Bytes,
) -> Result<(), ProxyError> {
    let payload = crate::session::with_own_values(shared, client, backends, payload);
    let sql = payload.slice(1..);
    let db = backends.state.db.clone();
    let plan = crate::session::run::plan_waiting(client, memo, backends, |client, _, backends| {
        plan_template(client, backends, &sql, db.as_deref())
    })
    .await?;
    let controls = matches!(plan.action, Action::Transaction(_));
    let Placement {
        statement,
        slot,
        routed,
        federation,
        reference_read,
    } = placement(shared, backends, plan.action, &sql, db)?;
    let id = memo.statements.next_id();
    let hidden = routed
        .as_ref()
        .map(|r| r.template.id_params().to_vec())
        .unwrap_or_default();
    let command = Command::Prepare {
        statement: &statement,
        id,
        hidden: &hidden,
    };
    let completion = match &federation {
        // Prepared where its copies stand, empty, for its columns.
        Some(federation) => {
            let then = Then::Prepare { command };
            crate::session::run::federate::run(shared, client, memo, backends, federation, then)
                .await?
                .unwrap_or_default()
        }
        None => {
            // Preparing opens no part of the transaction there.
            let needs = Needs {
                reach: hscale_transaction::Reach {
                    outside: true,
                    ..Default::default()
                },
                ..Needs::default()
            };
            backends
                .execute_command(
                    client,
                    slot,
                    command,
                    Some(Expect::Prepare),
                    needs,
                    SessionChange::Nothing,
                )
                .await?
        }
    };
    if !completion.error {
        let prepared = Prepared {
            statement,
            params: completion.params.saturating_sub(hidden.len() as u16),
            types: None,
            binds: plan.binds,
            change: plan.change,
            needs: Needs::of(&plan.summary).with_effect(plan.tx_effect),
            kind: plan.summary.kind,
            controls,
            tx_effect: plan.tx_effect,
            routed,
            federation,
            reference_read,
        };
        memo.statements.by_id.insert(id, prepared);
    }
    Ok(())
}

/// Where COM_STMT_PREPARE prepares a statement, and how its executions
/// run, by its plan.
pub(super) struct Placement {
    statement: StatementKey,
    slot: usize,
    routed: Option<Box<Routed>>,
    federation: Option<Box<hscale_planner::Federation>>,
    reference_read: Option<SmallVec<[u32; 4]>>,
}

/// The statement's `Placement`; the plans no prepared statement may have
/// refused.
pub(super) fn placement(
    shared: &Shared,
    backends: &Backends,
    action: Action,
    sql: &Bytes,
    db: Option<String>,
) -> Result<Placement, ProxyError> {
    let refuse = |table, reason: &str| {
        Err(ProxyError::Unroutable(hscale_planner::Refusal {
            table,
            reason: reason.into(),
        }))
    };
    let refuse_schema = |table| {
        refuse(
            Some(table),
            "prepared schema statements on a partitioned table (send it as a query)",
        )
    };
    let mut placed = Placement {
        statement: StatementKey::new(db.as_deref(), sql),
        slot: shared.main,
        routed: None,
        federation: None,
        reference_read: None,
    };
    match action {
        Action::Federate(federated) => placed.federation = Some(federated),
        // Where it will run: preparing on the main backend would open
        // the transaction there.
        Action::ReferenceRead(copies_on) => {
            placed.slot = backends.slot_with_copies(&copies_on).unwrap_or(shared.main);
            placed.reference_read = Some(copies_on);
        }
        Action::Main | Action::Transaction(_) | Action::Admin | Action::Kill(_) => {}
        Action::Template(template) => {
            let run = template.describing_run();
            let text = template
                .text(&run)
                .map_err(|e| ProxyError::Unroutable(e.refusal(Some(template.table().clone()))))?;
            placed.statement = StatementKey::new(db.as_deref(), text.as_bytes());
            placed.slot = backends.slot_of(run.target.backend)?;
            placed.routed = Some(Box::new(Routed {
                template: *template,
                db: db.clone(),
                sql: sql.clone(),
                texts: vec![(run, placed.statement.clone())],
                long_data: false,
                last: None,
            }));
        }
        Action::Refuse(refusal) => return Err(ProxyError::Unroutable(refusal)),
        Action::Listing(_) => return refuse(
            None,
            "prepared statements (COM_STMT_PREPARE) that list tables or maintain them while tables are partitioned (send it as a query)",
        ),
        Action::LockTables(_) => {
            return refuse(None, "LOCK TABLES as a prepared statement (send it as a query)")
        }
        Action::Load(load) => {
            return refuse(
                Some(load.table.table.clone()),
                "LOAD DATA as a prepared statement (send it as a query)",
            )
        }
        Action::Schema(change) => return refuse_schema(change.table),
        Action::Exists { table, .. } => return refuse_schema(table),
        // The server prepares none of them either.
        Action::Dynamic(_) | Action::XaRecover => {
            return refuse(
                None,
                "dynamic SQL and XA RECOVER as prepared statements (send them as a query)",
            )
        }
        Action::Route(_) | Action::Wait(_) | Action::Generate(_) => {
            unreachable!("plan_prepared makes templates, plan_waiting waits")
        }
    }
    Ok(placed)
}

/// Plans a statement being prepared, in the database it was prepared in.
pub(super) fn plan_template(
    client: &Client,
    backends: &Backends,
    sql: &[u8],
    db: Option<&str>,
) -> Plan {
    let dictionary = backends.shared.dictionary.planned_by(&backends.handle.on);
    let ctx = Context {
        db,
        ..crate::session::run::context(client, backends, &dictionary)
    };
    plan_prepared(sql, &ctx)
}

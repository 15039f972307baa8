//! A statement for the main backend's server (`Action::Main`), or a read
//! of reference tables on a backend the transaction is on: it runs as the
//! client sent it, on one connection, with what the session must do around
//! it — the transaction opened or committed there, locks released, session
//! variables read back.

use std::sync::Arc;

use hscale_planner::{Action, Kind, Plan, TxEffect};
use hscale_wire::scan::Expect;

use crate::error::ProxyError;
use crate::session::client::Client;
use crate::session::may_change_session_variables;
use crate::session::slots::Previous;
use crate::session::Backends;
use crate::shared::Shared;

/// Runs `plan`'s statement on the connection it reads from, or the
/// backend `on_copies` holds the reference tables it reads on, or the
/// main backend.
pub(in crate::session) async fn run(
    shared: &Arc<Shared>,
    client: &mut Client,
    backends: &mut Backends,
    plan: Plan,
    statement: super::Statement,
) -> Result<(), ProxyError> {
    let super::Statement { payload, needs, .. } = statement;
    let on_copies = match &plan.action {
        Action::ReferenceRead(copies_on) => backends.slot_with_copies(copies_on),
        _ => None,
    };
    let sql = &payload[1..];
    let main = shared.main;
    let kind = plan.summary.kind;
    let releases_locks =
        matches!(kind, Kind::Lock | Kind::Unlock | Kind::Begin) && !plan.summary.multi_statement;
    if releases_locks {
        // The main backend's server releases its own.
        backends.unlock_tables(Some(main)).await?;
    }
    let rereads =
        (kind == Kind::Set || plan.summary.multi_statement) && may_change_session_variables(sql);
    let scattered_messages = matches!(
        backends.previous,
        Previous::Scattered { messages: true, .. }
    );
    if let Some(read) = plan.messages_read.filter(|_| scattered_messages) {
        if backends.answer_gathered(client, read, sql).await? {
            return Ok(());
        }
    }
    let slot = backends
        .slot_for_previous(needs)?
        .or(on_copies)
        .unwrap_or(main);
    if let Some(reason) = plan.binds {
        backends.slots[slot].binding.sticky.get_or_insert(reason);
    }
    if kind.writes() {
        backends.check_writers(&[slot])?;
    }
    let unseen = transaction_before(shared, backends, slot, plan.tx_effect, sql).await?;
    let payload = match plan.summary.own_values {
        true => crate::session::with_own_values(shared, client, backends, payload),
        false => payload,
    };
    let autocommit = backends.tx.autocommit();
    // A procedure may SET any session variable, which hscale does
    // not see: what it changed is read back and carried to the
    // other backends. Not where listing the variables would
    // replace what the statement reads (ROW_COUNT(), warnings).
    let before = match kind == Kind::Call
        && !plan.summary.multi_statement
        && backends.slots.len() > 1
        && !needs.previous_connection
        && !needs.diagnostics
    {
        true => backends.session_variables_before(slot, needs).await?,
        false => None,
    };
    backends
        .execute(
            client,
            slot,
            &payload,
            Some(Expect::ResultSets),
            needs,
            plan.change,
        )
        .await?;
    if let Some(before) = before {
        backends.read_back_changes_later(slot, before);
    }
    if unseen.is_some() && backends.follow_autocommit(autocommit) {
        super::transaction::commit_after(shared, backends, slot).await?;
    }
    if releases_locks {
        backends.tx.set_tables_locked(slot, kind == Kind::Lock);
    }
    backends.session_variables_changed |= rereads;
    if kind.writes() {
        backends.tx.wrote(slot);
    }
    Ok(())
}

/// What the statement does to the session's transaction, done before it
/// runs on `slot`: a commit it makes that hscale does not see (an implicit
/// commit, the client's own XA statements) is refused where the
/// transaction is on other backends too; a transaction it ends or begins is
/// ended or begun on every backend as its effect says. What hides a
/// commit, if it does.
async fn transaction_before(
    shared: &Arc<Shared>,
    backends: &mut Backends,
    slot: usize,
    effect: TxEffect,
    sql: &[u8],
) -> Result<Option<&'static str>, ProxyError> {
    let unseen = match effect {
        TxEffect::Hides(what) => Some(what),
        _ => None,
    };
    match (unseen, effect) {
        (Some(what), _) => {
            backends.check_unseen_commits(slot, what)?;
            backends.tx.runs_unseen(slot);
        }
        (None, TxEffect::ClientXa) => {
            backends.check_unseen_commits(
                slot,
                "an XA statement of the client's (its transaction stays on one backend)",
            )?;
            backends.tx.runs_unseen(slot);
        }
        (None, effect) => {
            super::transaction::commit_before(shared, backends, slot, effect, sql).await?
        }
    }
    Ok(unseen)
}

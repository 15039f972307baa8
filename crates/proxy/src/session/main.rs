//! A statement for the main backend's server (`Action::Main`), or a read
//! of reference tables on a backend the transaction is on: it runs as the
//! client sent it, on one connection, with what the session must do around
//! it — the transaction opened or committed there, locks released, session
//! variables read back.

use bytes::Bytes;
use hscale_planner::{Action, Kind, Plan, TxEffect};
use hscale_wire::scan::Expect;

use super::slots::{Needs, Previous};
use super::{may_change_session_variables, Session};
use crate::error::ProxyError;

impl Session {
    /// Runs `plan`'s statement on the connection it reads from, or the
    /// backend `on_copies` holds the reference tables it reads on, or the
    /// main backend.
    pub(super) async fn run_main(
        &mut self,
        plan: Plan,
        payload: Bytes,
        needs: Needs,
    ) -> Result<(), ProxyError> {
        let on_copies = match &plan.action {
            Action::ReferenceRead(backends) => self.backends.slot_with_copies(backends),
            _ => None,
        };
        let sql = &payload[1..];
        let main = self.shared.main;
        let kind = plan.summary.kind;
        let releases_locks = matches!(kind, Kind::Lock | Kind::Unlock | Kind::Begin)
            && !plan.summary.multi_statement;
        if releases_locks {
            // The main backend's server releases its own.
            self.backends.unlock_tables(Some(main)).await?;
        }
        let rereads = (kind == Kind::Set || plan.summary.multi_statement)
            && may_change_session_variables(sql);
        let scattered_messages = matches!(
            self.backends.previous,
            Previous::Scattered { messages: true, .. }
        );
        if let Some(read) = plan.messages_read.filter(|_| scattered_messages) {
            if self
                .backends
                .answer_gathered(&mut self.client, read, sql)
                .await?
            {
                return Ok(());
            }
        }
        let slot = self
            .backends
            .slot_for_previous(needs)?
            .or(on_copies)
            .unwrap_or(main);
        if let Some(reason) = plan.binds {
            self.backends.slots[slot]
                .binding
                .sticky
                .get_or_insert(reason);
        }
        if kind.writes() {
            self.backends.check_writers(&[slot])?;
        }
        let unseen = match plan.tx_effect {
            TxEffect::Hides(what) => Some(what),
            _ => None,
        };
        match (unseen, plan.tx_effect) {
            (Some(what), _) => {
                self.backends.check_unseen_commits(slot, what)?;
                self.backends.tx.runs_unseen(slot);
            }
            (None, TxEffect::ClientXa) => {
                self.backends.check_unseen_commits(
                    slot,
                    "an XA statement of the client's (its transaction stays on one backend)",
                )?;
                self.backends.tx.runs_unseen(slot);
            }
            (None, effect) => self.commit_before(slot, effect, sql).await?,
        }
        let payload = match plan.summary.own_values {
            true => self.with_own_values(payload),
            false => payload,
        };
        let autocommit = self.backends.tx.autocommit();
        // A procedure may SET any session variable, which hscale does
        // not see: what it changed is read back and carried to the
        // other backends. Not where listing the variables would
        // replace what the statement reads (ROW_COUNT(), warnings).
        let before = match kind == Kind::Call
            && !plan.summary.multi_statement
            && self.backends.slots.len() > 1
            && !needs.previous_connection
            && !needs.diagnostics
        {
            true => self.backends.session_variables_before(slot, needs).await?,
            false => None,
        };
        self.backends
            .execute(
                &mut self.client,
                slot,
                &payload,
                Some(Expect::ResultSets),
                needs,
                plan.change,
            )
            .await?;
        if let Some(before) = before {
            self.backends.read_back_changes_later(slot, before);
        }
        if unseen.is_some() && self.backends.follow_autocommit(autocommit) {
            self.commit_after(slot).await?;
        }
        if releases_locks {
            self.backends.tx.set_tables_locked(slot, kind == Kind::Lock);
        }
        self.backends.session_variables_changed |= rereads;
        if kind.writes() {
            self.backends.tx.wrote(slot);
        }
        Ok(())
    }
}

//! A transaction over several backends: hscale answers a plain BEGIN and
//! each backend opens the transaction with its first statement there;
//! COMMIT and ROLLBACK go to every backend it reached, and so do the
//! commits MariaDB makes by itself (BEGIN, DDL, `SET autocommit = 1`) and
//! the rollbacks it makes without saying so (a deadlock, a lost
//! connection). `transactions = "single"` keeps its writes on one backend.

use bytes::Bytes;
use hscale_planner::{Autocommit, Refusal, SessionChange, TxControl, TxEffect};
use hscale_wire::scan::Expect;
use hscale_wire::StatusFlags;

use super::command::PING;
use super::slots::Needs;
use super::state::{command, COM_QUERY};
use super::Session;
use crate::config::Transactions;
use crate::error::ProxyError;

impl Session {
    /// BEGIN, COMMIT, ROLLBACK, savepoints, as the planner read them.
    pub(super) async fn transaction_control(
        &mut self,
        control: TxControl,
        payload: Bytes,
        needs: Needs,
    ) -> Result<(), ProxyError> {
        // BEGIN, COMMIT and ROLLBACK end what is in progress: no XA branch
        // opens for them.
        let ending = Needs {
            ends_transaction: true,
            ..needs
        };
        match control {
            TxControl::Begin { deferred } => self.begin(deferred, payload, ending).await,
            TxControl::End {
                commit,
                plain,
                chain,
                release,
            } => {
                // A chained transaction begins as a BEGIN hscale answered,
                // so that its branches are XA branches too.
                let xa =
                    self.slots.iter().any(|s| s.binding.xa) || (chain && self.opens_xa_branches());
                match xa {
                    true => self.end_xa_transaction(commit, chain, release).await,
                    // AND NO CHAIN, NO RELEASE: as plain.
                    false => {
                        let plain = plain || (!chain && !release);
                        self.end_transaction(payload, plain, ending).await
                    }
                }
            }
            TxControl::Savepoint { op, name } => self.savepoint(op, name, payload, needs).await,
            TxControl::UnreadSavepoint => self.unread_savepoint(payload, needs).await,
        }
    }

    /// BEGIN / START TRANSACTION: commits the transaction in progress (the
    /// server does, and hscale on the other backends), releases table
    /// locks, and opens a new one.
    async fn begin(
        &mut self,
        deferred: bool,
        payload: Bytes,
        needs: Needs,
    ) -> Result<(), ProxyError> {
        let main = self.shared.main;
        // The main backend's server releases its own.
        self.unlock_tables(Some(main)).await?;
        if deferred && self.opens_xa_branches() {
            // BEGIN commits what is in progress (XA branches only hscale
            // can), and the new transaction's branches are XA branches,
            // autocommit on or off.
            if self.in_transaction() {
                self.commit_open(None).await?;
            }
            return self.begin_here(payload).await;
        }
        if deferred && !self.in_transaction() {
            return self.begin_here(payload).await;
        }
        self.commit_before(main, TxEffect::CommitsFirst, &payload[1..])
            .await?;
        self.each_then_answer(&[], main, &payload, needs).await?;
        self.slots[main].binding.tables_locked = false;
        if self.in_transaction() {
            self.begin = Some(payload);
        }
        Ok(())
    }

    /// A BEGIN outside a transaction, answered by hscale: each backend the
    /// transaction reaches gets it with its first statement there, a read in
    /// the same write (Vitess does the same), so that no backend pays a round
    /// trip for it. InnoDB takes a transaction's snapshot at its first read,
    /// not at BEGIN, so the client sees what it would have seen.
    pub(super) async fn begin_here(&mut self, payload: Bytes) -> Result<(), ProxyError> {
        self.begin = Some(payload);
        self.begun_here = true;
        self.xa_begin = self.opens_xa_branches();
        let mut status = self.status_flags();
        if self.autocommit {
            status |= StatusFlags::SERVER_STATUS_AUTOCOMMIT.bits();
        }
        self.client
            .send_packet(1, &super::handshake::ok_packet(status))
            .await?;
        Ok(())
    }

    /// `transactions = "single"`: the backends a transaction writes on,
    /// with these, must be one. `"atomic"`: so must those whose part
    /// cannot be prepared (a plain transaction: START TRANSACTION with
    /// options, LOCK TABLES), if any.
    pub(super) fn check_writers(&self, slots: &[usize]) -> Result<(), ProxyError> {
        match self.shared.transactions {
            Transactions::Multi => return Ok(()),
            // A statement outside a transaction commits in two phases.
            Transactions::Atomic if !self.in_transaction() => return Ok(()),
            Transactions::Atomic => return self.check_preparable_writers(slots),
            Transactions::Single => {}
        }
        let mut writers: Vec<usize> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.binding.wrote && s.binding.transaction)
            .map(|(i, _)| i)
            .collect();
        for slot in slots {
            if !writers.contains(slot) {
                writers.push(*slot);
            }
        }
        match writers.as_slice() {
            [first, second, ..] => Err(ProxyError::SecondWriter {
                first: self.shared.pools[*first].id(),
                second: self.shared.pools[*second].id(),
            }),
            _ => Ok(()),
        }
    }

    /// `transactions = "atomic"`: a transaction whose writes span backends
    /// commits in two phases, which a plain transaction cannot take part in.
    fn check_preparable_writers(&self, slots: &[usize]) -> Result<(), ProxyError> {
        let mut writers: Vec<usize> = (0..self.slots.len())
            .filter(|&i| self.slots[i].binding.wrote && self.slots[i].binding.transaction)
            .collect();
        for slot in slots {
            if !writers.contains(slot) {
                writers.push(*slot);
            }
        }
        let preparable = |slot: usize| {
            let binding = &self.slots[slot].binding;
            binding.xa
                || (!binding.open
                    && !binding.tables_locked
                    && (self.xa_begin || !self.autocommit)
                    && self.opens_xa_branches())
        };
        match writers.iter().find(|&&slot| !preparable(slot)) {
            Some(&plain) if writers.len() > 1 => {
                tracing::debug!(
                    connection_id = self.connection_id,
                    xa_begin = self.xa_begin,
                    autocommit = self.autocommit,
                    bindings = ?self.slots.iter().map(|s| (s.binding.xa, s.binding.open, s.binding.transaction, s.binding.wrote)).collect::<Vec<_>>(),
                    "refused: a writer that cannot be prepared"
                );
                let other = *writers.iter().find(|&&w| w != plain).expect("two writers");
                Err(ProxyError::Unroutable(Refusal {
                    table: None,
                    reason: format!(
                        "a transaction that writes on backends {} and {}, where the one on backend {} cannot be prepared (it began with START TRANSACTION and options, or under LOCK TABLES): it writes on one backend",
                        self.shared.pools[plain].id(),
                        self.shared.pools[other].id(),
                        self.shared.pools[plain].id(),
                    ),
                }))
            }
            _ => Ok(()),
        }
    }

    /// COMMIT / ROLLBACK of a transaction with XA branches: every backend
    /// it reached ends it (in two phases where several wrote), then hscale
    /// answers. AND CHAIN begins the next one as a BEGIN hscale answered;
    /// RELEASE ends the client's connection after the answer.
    async fn end_xa_transaction(
        &mut self,
        commit: bool,
        chain: bool,
        release: bool,
    ) -> Result<(), ProxyError> {
        self.end_branches(commit).await?;
        if chain && self.autocommit {
            self.begin = Some(command(COM_QUERY, "START TRANSACTION").into());
            self.begun_here = true;
            self.xa_begin = true;
        }
        self.send_ok().await?;
        match release {
            true => Err(ProxyError::Client(hscale_wire::WireError::Closed)),
            false => Ok(()),
        }
    }

    /// Ends the transaction on every backend it reached, some of them XA
    /// branches: committed by the protocol (`commit_branches`), or rolled
    /// back. Each connection then goes back to its slot with the status
    /// its last statement gave.
    pub(super) async fn end_branches(&mut self, commit: bool) -> Result<(), ProxyError> {
        let mut parts = super::atomic::Parts::new();
        let mut branches = Vec::new();
        for slot in 0..self.slots.len() {
            let binding = &self.slots[slot].binding;
            if !binding.xa && !binding.open {
                continue;
            }
            let branch = hscale_transaction::Branch {
                backend: self.shared.pools[slot].id(),
                xa: binding.xa,
                wrote: binding.wrote,
            };
            // Gone with its connection, which ended it.
            let Some(conn) = self.slots[slot].held.take() else {
                continue;
            };
            branches.push(branch);
            let lease = crate::backend::Lease { conn };
            parts.insert(slot, (lease, hscale_wire::scan::Completion::default()));
        }
        let running = self
            .running
            .take()
            .unwrap_or_else(|| crate::xa::begin(&self.shared));
        // A connection that ends its branch here may not have taken the
        // session's latest SET autocommit yet: its status does not change
        // the session's setting.
        let autocommit = self.autocommit;
        let outcome = match commit {
            true => self.commit_branches(&mut parts, &running, &branches).await,
            false => {
                self.roll_back_branches(&mut parts, &running, &branches)
                    .await;
                Ok(())
            }
        };
        for (slot, (lease, last)) in parts {
            let binding = &mut self.slots[slot].binding;
            binding.xa = false;
            binding.wrote = false;
            self.finish_command(slot, lease, &last);
        }
        self.autocommit = autocommit;
        // Ended everywhere, also where a connection went.
        self.transaction_lost = false;
        self.savepoints.clear();
        self.xa_begin = false;
        outcome
    }

    /// COMMIT / ROLLBACK go to every backend the transaction reached; the
    /// client sees the last one's answer. Each commits in turn: not atomic
    /// across backends. `plain`: no AND CHAIN or RELEASE.
    pub(super) async fn end_transaction(
        &mut self,
        payload: Bytes,
        plain: bool,
        needs: Needs,
    ) -> Result<(), ProxyError> {
        if self.begun_here && plain {
            // No backend has the transaction: there is nothing to end.
            self.begun_here = false;
            self.begin = None;
            self.savepoints.clear();
            return self.send_ok().await;
        }
        let mut open = self.transaction_slots();
        let last = open.pop().unwrap_or(self.shared.main);
        let quiet: Vec<(usize, &[u8])> =
            open.into_iter().map(|slot| (slot, &payload[..])).collect();
        // `begin` goes once no backend is in a transaction (`after`): after
        // COMMIT AND CHAIN the new transaction must reach later backends too.
        self.each_then_answer(&quiet, last, &payload, needs).await?;
        // The transaction's savepoints end with it, chained or not.
        self.savepoints.clear();
        if self.in_transaction() && self.autocommit && self.begin.is_none() {
            // Chained from no transaction hscale saw begin: a plain one,
            // which later backends can open too.
            self.begin = Some(command(COM_QUERY, "START TRANSACTION").into());
        }
        Ok(())
    }

    /// A ROLLBACK TO SAVEPOINT hscale cannot read: only where the main
    /// backend alone has the transaction, whose server answers it.
    async fn unread_savepoint(&mut self, payload: Bytes, needs: Needs) -> Result<(), ProxyError> {
        let main = self.shared.main;
        if self.transaction_slots().iter().any(|&slot| slot != main) {
            return Err(ProxyError::Unroutable(Refusal {
                table: None,
                reason: "a ROLLBACK TO SAVEPOINT hscale cannot read, in a transaction on several backends".into(),
            }));
        }
        self.each_then_answer(&[], main, &payload, needs)
            .await
            .map(drop)
    }

    /// Before a statement on `slot` that the server commits the transaction
    /// for, commits it on the other backends (on `slot` the server does),
    /// so that the client's answer comes after every backend committed.
    pub(super) async fn commit_before(
        &mut self,
        slot: usize,
        effect: TxEffect,
        sql: &[u8],
    ) -> Result<(), ProxyError> {
        let ends = match effect {
            TxEffect::CommitsFirst => true,
            TxEffect::SetsAutocommit { to, .. } => to == Autocommit::On && !self.autocommit,
            TxEffect::None | TxEffect::Hides(_) | TxEffect::ClientXa => false,
        };
        if ends && self.xa_begin && self.begun_here {
            // A BEGIN hscale answered, which reached no backend yet: the
            // statement ends it before it began anywhere.
            self.begun_here = false;
            self.xa_begin = false;
        }
        if self.slots.iter().any(|s| s.binding.xa) {
            return match effect {
                // The server cannot end an XA branch by itself (1399): hscale
                // commits every branch first.
                TxEffect::CommitsFirst => self.end_branches(true).await,
                TxEffect::SetsAutocommit {
                    to: Autocommit::On,
                    user_variable: false,
                } if !self.autocommit => {
                    self.end_branches(true).await?;
                    // The other backends take the setting now, as before.
                    self.turn_autocommit_on_everywhere(slot, sql, Autocommit::On, false)
                        .await
                }
                TxEffect::SetsAutocommit {
                    to: Autocommit::On | Autocommit::Unread,
                    ..
                } if !self.autocommit => Err(ProxyError::Unroutable(Refusal {
                    table: None,
                    reason: "a SET of autocommit to a value hscale cannot read, or beside a user variable, in a transaction over XA branches: COMMIT first, or SET autocommit = 1 alone".into(),
                })),
                _ => Ok(()),
            };
        }
        let others_open = (self.slots.iter().enumerate())
            .any(|(other, s)| other != slot && s.binding.transaction);
        if !others_open {
            return Ok(());
        }
        match effect {
            TxEffect::SetsAutocommit { to, user_variable } if !self.autocommit => {
                self.turn_autocommit_on_everywhere(slot, sql, to, user_variable)
                    .await
            }
            TxEffect::CommitsFirst => self.commit_open(Some(slot)).await,
            _ => Ok(()),
        }
    }

    /// A SET that turns autocommit on commits the transaction (MariaDB does
    /// where it was off): the same SET runs first on each other backend in
    /// it, where it commits that backend's part, and fails there as it
    /// would on `slot`, before anything committed. Where hscale cannot run
    /// it there (a user variable, a value it cannot read), it is refused.
    async fn turn_autocommit_on_everywhere(
        &mut self,
        slot: usize,
        sql: &[u8],
        to: Autocommit,
        user_variable: bool,
    ) -> Result<(), ProxyError> {
        let open: Vec<String> = (0..self.slots.len())
            .filter(|&other| other != slot && self.slots[other].binding.open)
            .map(|other| self.shared.pools[other].id().to_string())
            .collect();
        let refuse = |what: &str| {
            match open.is_empty() {
            // Nothing to commit there: the backends take the setting later.
            true => Ok(()),
            false => Err(ProxyError::Unroutable(Refusal {
                table: None,
                reason: format!(
                    "a SET of autocommit {what} while the transaction is open on backend {} too: COMMIT first, or SET autocommit = 1 alone",
                    open.join(", ")
                ),
            })),
        }
        };
        match to {
            Autocommit::Off => Ok(()),
            Autocommit::Unread => refuse("to a value hscale cannot read"),
            Autocommit::On if user_variable => {
                refuse("beside a user variable, which only one connection keeps")
            }
            Autocommit::On => {
                let mut set = Vec::with_capacity(sql.len() + 1);
                set.push(COM_QUERY);
                set.extend_from_slice(sql);
                for other in self.transaction_slots() {
                    if other != slot {
                        self.run_setting_quietly(other, &set).await?;
                    }
                }
                Ok(())
            }
        }
    }

    /// Statements whose commits and rollbacks hscale does not see (`what`:
    /// `hides_transaction_control`) could leave another backend's part of
    /// the transaction behind: refused while another backend has one.
    pub(super) fn check_unseen_commits(&self, slot: usize, what: &str) -> Result<(), ProxyError> {
        let others: Vec<String> = (0..self.slots.len())
            .filter(|&other| other != slot && self.slots[other].binding.open)
            .map(|other| self.shared.pools[other].id().to_string())
            .collect();
        if others.is_empty() {
            return Ok(());
        }
        Err(ProxyError::Unroutable(Refusal {
            table: None,
            reason: format!(
                "{what} while the transaction is open on backend {} too: a COMMIT or ROLLBACK in it would leave that part behind",
                others.join(", ")
            ),
        }))
    }

    /// After statements hscale does not see into: a SET autocommit among
    /// them (the status says) is the session's, which backends the session
    /// reaches later must take too. True when it changed.
    pub(super) fn follow_autocommit(&mut self, before: bool) -> bool {
        if self.autocommit == before {
            return false;
        }
        let set = format!("SET autocommit = {}", u8::from(self.autocommit));
        self.state.record_setting(vec!["autocommit".into()], set);
        true
    }

    /// After statements hscale does not see into that turned autocommit on
    /// (`follow_autocommit`): the transaction ended on `slot`, and so on
    /// every backend.
    pub(super) async fn commit_after(&mut self, slot: usize) -> Result<(), ProxyError> {
        if !self.slots[slot].binding.transaction {
            self.commit_open(Some(slot)).await?;
        }
        Ok(())
    }

    /// Commits the transaction on every backend it reached but `except`'s
    /// (whose server commits it), or on every one where it has XA branches.
    pub(super) async fn commit_open(&mut self, except: Option<usize>) -> Result<(), ProxyError> {
        if self.slots.iter().any(|s| s.binding.xa) {
            return self.end_branches(true).await;
        }
        let commit = command(COM_QUERY, "COMMIT");
        for slot in self.transaction_slots() {
            if Some(slot) != except {
                self.run_quietly(slot, &commit).await?;
            }
        }
        self.savepoints.clear();
        Ok(())
    }

    /// The slots whose backends are in the transaction.
    pub(super) fn transaction_slots(&self) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|&i| self.slots[i].binding.transaction)
            .collect()
    }

    /// Runs each of `quiet`'s commands on its slot, in turn, keeping their
    /// answers from the client, then `payload` on `last`, whose answer the
    /// client gets.
    pub(super) async fn each_then_answer(
        &mut self,
        quiet: &[(usize, &[u8])],
        last: usize,
        payload: &[u8],
        needs: Needs,
    ) -> Result<hscale_wire::scan::Completion, ProxyError> {
        for &(slot, command) in quiet {
            self.run_quietly_with(slot, command, needs).await?;
        }
        self.execute(
            last,
            payload,
            Some(Expect::ResultSets),
            needs,
            SessionChange::Nothing,
        )
        .await
    }

    /// After an error inside a transaction. A deadlock rolls the whole
    /// transaction back on its backend, and a lost connection takes it
    /// with it, with no word of it in the error: the client knows the
    /// transaction is gone, and so it must be on every backend. Asks each
    /// backend that failed (a COM_PING's OK carries the status, and leaves
    /// the error for SHOW ERRORS) and, where the transaction ended, rolls
    /// it back everywhere else.
    pub(super) async fn settle_transaction(&mut self) {
        let mut ended = std::mem::take(&mut self.transaction_lost);
        for slot in 0..self.slots.len() {
            if !std::mem::take(&mut self.slots[slot].binding.unsure) {
                continue;
            }
            let Some(conn) = self.slots[slot].held.as_mut() else {
                ended = true;
                continue;
            };
            match conn.run(&[PING], Expect::Single).await {
                Ok(Ok(pong)) => self.take_status(slot, pong.status),
                _ => self.forget_connection_state(slot),
            }
            ended |= !self.slots[slot].binding.open;
        }
        if !ended {
            return;
        }
        if self.slots.iter().any(|s| s.binding.xa) {
            let _ = self.end_branches(false).await;
            self.begun_here = false;
            if !self.in_transaction() {
                self.begin = None;
            }
            return;
        }
        let rollback = command(COM_QUERY, "ROLLBACK");
        for slot in self.transaction_slots() {
            let Some(conn) = self.slots[slot].held.as_mut() else {
                continue;
            };
            match conn.run(&rollback, Expect::ResultSets).await {
                Ok(Ok(done)) => self.take_status(slot, done.status),
                // Closing the connection rolls its part back.
                _ => self.forget_connection_state(slot),
            }
            self.release_unheld(slot);
        }
        tracing::debug!(
            connection_id = self.connection_id,
            "transaction rolled back on a backend: rolled back on every backend"
        );
        self.transaction_lost = false;
        self.begun_here = false;
        self.savepoints.clear();
        if !self.in_transaction() {
            self.begin = None;
        }
    }
}

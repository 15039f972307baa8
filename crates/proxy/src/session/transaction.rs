//! A transaction over several backends, run as `hscale_transaction::
//! Transaction` says: hscale answers a plain BEGIN and each backend opens
//! the transaction with its first statement there; COMMIT and ROLLBACK go
//! to every backend it reached, and so do the commits MariaDB makes by
//! itself (BEGIN, DDL, `SET autocommit = 1`) and the rollbacks it makes
//! without saying so (a deadlock, a lost connection).

use bytes::Bytes;
use hscale_planner::{Autocommit, TxControl, TxEffect};
use hscale_transaction::{Before, BeginPlan, CommitPlan, EndPlan, Reach, Refused};
use hscale_wire::scan::Expect;

use super::client::Client;
use super::slots::Needs;
use super::Session;
use crate::error::ProxyError;
use command::PING;
use hscale_wire::command;

/// The command a chained transaction begins with, for backends it reaches
/// later.
fn start_transaction() -> Bytes {
    command::query("START TRANSACTION").into()
}

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
            reach: Reach {
                ends_transaction: true,
                ..needs.reach
            },
            ..needs
        };
        match control {
            TxControl::Begin { deferred } => self.begin(deferred, payload, ending).await,
            TxControl::End {
                commit,
                plain,
                chain,
                release,
            } => match self.backends.tx.end_plan(plain, chain, release) {
                EndPlan::Branches => self.end_xa_transaction(commit, chain, release).await,
                EndPlan::Nothing => {
                    self.backends.tx.ended_unbegun();
                    self.backends.send_ok(&mut self.client).await
                }
                EndPlan::Each { quiet, last } => {
                    let quiet: Vec<(usize, &[u8])> =
                        quiet.into_iter().map(|slot| (slot, &payload[..])).collect();
                    self.backends
                        .each_then_answer(&mut self.client, &quiet, last, &payload, ending)
                        .await?;
                    self.backends.tx.ended_each(start_transaction);
                    Ok(())
                }
            },
            TxControl::Savepoint { op, name } => {
                self.backends
                    .savepoint(&mut self.client, op, name, payload, needs)
                    .await
            }
            TxControl::UnreadSavepoint => {
                self.backends.tx.check_unread_savepoint()?;
                let main = self.shared.main;
                self.backends
                    .each_then_answer(&mut self.client, &[], main, &payload, needs)
                    .await
                    .map(drop)
            }
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
        self.backends.unlock_tables(Some(main)).await?;
        match self.backends.tx.begin_plan(deferred) {
            BeginPlan::Here { commit_first } => {
                if commit_first {
                    self.commit_open(None).await?;
                }
                self.backends.begin_here(&mut self.client, payload).await
            }
            BeginPlan::OnServer => {
                self.commit_before(main, TxEffect::CommitsFirst, &payload[1..])
                    .await?;
                self.backends
                    .each_then_answer(&mut self.client, &[], main, &payload, needs)
                    .await?;
                self.backends.tx.begun_on_server(payload);
                Ok(())
            }
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
        if chain {
            self.backends.tx.chain(start_transaction);
        }
        self.backends.send_ok(&mut self.client).await?;
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
        let shared = self.shared.clone();
        let (reached, running) = self
            .backends
            .tx
            .branches(|| crate::xa::begin(&shared, None));
        let mut parts = super::atomic::Parts::new();
        let mut branches = Vec::new();
        for (slot, branch) in reached {
            // Gone with its connection, which ended it.
            let Some(conn) = self.backends.slots[slot].held.take() else {
                continue;
            };
            branches.push(branch);
            let lease = crate::backend::Lease { conn };
            parts.insert(slot, (lease, hscale_wire::scan::Completion::default()));
        }
        // A connection that ends its branch here may not have taken the
        // session's latest SET autocommit yet: its status does not change
        // the session's setting.
        let autocommit = self.backends.tx.autocommit();
        let outcome = match commit {
            true => {
                self.backends
                    .commit_branches(&mut parts, &running, &branches)
                    .await
            }
            false => {
                self.backends
                    .roll_back_branches(&mut parts, &running, &branches)
                    .await;
                Ok(())
            }
        };
        for (slot, (lease, last)) in parts {
            self.backends.tx.branch_ended(slot);
            self.backends.finish_command(slot, lease, &last);
        }
        // Ended everywhere, also where a connection went.
        self.backends.tx.branches_ended(autocommit);
        outcome
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
        let (to, user_variable) = match effect {
            TxEffect::SetsAutocommit { to, user_variable } => (to, user_variable),
            _ => (Autocommit::Off, false),
        };
        match self.backends.tx.before(slot, effect)? {
            Before::Nothing => Ok(()),
            Before::EndBranches { then_autocommit } => {
                self.end_branches(true).await?;
                match then_autocommit {
                    // The other backends take the setting now, as before.
                    true => {
                        self.backends
                            .set_autocommit_elsewhere(slot, sql, to, user_variable)
                            .await
                    }
                    false => Ok(()),
                }
            }
            Before::CommitOthers => self.commit_open(Some(slot)).await,
            Before::SetAutocommitElsewhere => {
                self.backends
                    .set_autocommit_elsewhere(slot, sql, to, user_variable)
                    .await
            }
        }
    }

    /// After statements hscale does not see into that turned autocommit on
    /// (`follow_autocommit`): the transaction ended on `slot`, and so on
    /// every backend.
    pub(super) async fn commit_after(&mut self, slot: usize) -> Result<(), ProxyError> {
        if !self.backends.tx.part(slot).transaction {
            self.commit_open(Some(slot)).await?;
        }
        Ok(())
    }

    /// Commits the transaction on every backend it reached but `except`'s
    /// (whose server commits it), or on every one where it has XA branches.
    pub(super) async fn commit_open(&mut self, except: Option<usize>) -> Result<(), ProxyError> {
        match self.backends.tx.commit_plan(except) {
            CommitPlan::Branches => self.end_branches(true).await,
            CommitPlan::Each(slots) => {
                let commit = command::query("COMMIT");
                for slot in slots {
                    self.backends.run_quietly(slot, &commit).await?;
                }
                self.backends.tx.committed_each();
                Ok(())
            }
        }
    }

    /// After an error inside a transaction. A deadlock rolls the whole
    /// transaction back on its backend, and a lost connection takes it
    /// with it, with no word of it in the error: the client knows the
    /// transaction is gone, and so it must be on every backend. Asks each
    /// backend that failed (a COM_PING's OK carries the status, and leaves
    /// the error for SHOW ERRORS) and, where the transaction ended, rolls
    /// it back everywhere else.
    pub(super) async fn settle_transaction(&mut self) {
        let (unsure, mut ended) = self.backends.tx.to_settle();
        for slot in unsure {
            let Some(conn) = self.backends.slots[slot].held.as_mut() else {
                ended = true;
                continue;
            };
            match conn.run(&[PING], Expect::Single).await {
                Ok(Ok(pong)) => self.backends.take_status(slot, pong.status, true),
                _ => self.backends.forget_connection_state(slot),
            }
            ended |= self.backends.tx.ended_on(slot);
        }
        if !ended {
            return;
        }
        if self.backends.tx.has_branches() {
            let _ = self.end_branches(false).await;
            self.backends.tx.settled();
            return;
        }
        let rollback = command::query("ROLLBACK");
        for slot in self.backends.tx.slots() {
            let Some(conn) = self.backends.slots[slot].held.as_mut() else {
                continue;
            };
            match conn.run(&rollback, Expect::ResultSets).await {
                Ok(Ok(done)) => self.backends.take_status(slot, done.status, true),
                // Closing the connection rolls its part back.
                _ => self.backends.forget_connection_state(slot),
            }
            self.backends.release_unheld(slot);
        }
        tracing::debug!(
            connection_id = self.client.connection_id,
            "transaction rolled back on a backend: rolled back on every backend"
        );
        self.backends.tx.settled();
    }
}

impl super::Backends {
    /// A BEGIN outside a transaction, answered by hscale: each backend the
    /// transaction reaches gets it with its first statement there, a read in
    /// the same write (Vitess does the same), so that no backend pays a round
    /// trip for it. InnoDB takes a transaction's snapshot at its first read,
    /// not at BEGIN, so the client sees what it would have seen.
    pub(super) async fn begin_here(
        &mut self,
        client: &mut Client,
        payload: Bytes,
    ) -> Result<(), ProxyError> {
        self.tx.begun_here(payload);
        let mut status = self.status_flags();
        if self.tx.autocommit() {
            status |= hscale_wire::StatusFlags::SERVER_STATUS_AUTOCOMMIT.bits();
        }
        client
            .send_packet(1, &super::handshake::ok_packet(status))
            .await?;
        Ok(())
    }

    /// Runs each of `quiet`'s commands on its slot, in turn, keeping their
    /// answers from the client, then `payload` on `last`, whose answer the
    /// client gets.
    pub(super) async fn each_then_answer(
        &mut self,
        client: &mut Client,
        quiet: &[(usize, &[u8])],
        last: usize,
        payload: &[u8],
        needs: Needs,
    ) -> Result<hscale_wire::scan::Completion, ProxyError> {
        for &(slot, command) in quiet {
            self.run_quietly_with(slot, command, needs).await?;
        }
        self.execute(
            client,
            last,
            payload,
            Some(Expect::ResultSets),
            needs,
            hscale_planner::SessionChange::Nothing,
        )
        .await
    }
}

impl super::Backends {
    /// A SET that turns autocommit on commits the transaction (MariaDB does
    /// where it was off): the same SET runs first on each other backend in
    /// it, where it commits that backend's part, and fails there as it
    /// would on `slot`, before anything committed.
    async fn set_autocommit_elsewhere(
        &mut self,
        slot: usize,
        sql: &[u8],
        to: Autocommit,
        user_variable: bool,
    ) -> Result<(), ProxyError> {
        let elsewhere = self.tx.autocommit_on_elsewhere(slot, to, user_variable)?;
        if elsewhere.is_empty() {
            return Ok(());
        }
        let mut set = Vec::with_capacity(sql.len() + 1);
        set.push(command::QUERY);
        set.extend_from_slice(sql);
        for other in elsewhere {
            self.run_setting_quietly(other, &set).await?;
        }
        Ok(())
    }
}

impl super::Backends {
    /// Whether a write on `slots` may run in the transaction.
    pub(super) fn check_writers(&self, slots: &[usize]) -> Result<(), ProxyError> {
        Ok(self.tx.check_writers(slots)?)
    }

    /// Statements whose commits and rollbacks hscale does not see (`what`)
    /// could leave another backend's part of the transaction behind:
    /// refused while another backend has one.
    pub(super) fn check_unseen_commits(
        &self,
        slot: usize,
        what: &'static str,
    ) -> Result<(), ProxyError> {
        Ok(self.tx.check_unseen_commits(slot, what)?)
    }

    /// After statements hscale does not see into: a SET autocommit among
    /// them (the status says) is the session's, which backends the session
    /// reaches later must take too. True when it changed.
    pub(super) fn follow_autocommit(&mut self, before: bool) -> bool {
        let autocommit = self.tx.autocommit();
        if autocommit == before {
            return false;
        }
        let set = format!("SET autocommit = {}", u8::from(autocommit));
        self.state.record_setting(vec!["autocommit".into()], set);
        true
    }
}

impl From<Refused> for ProxyError {
    fn from(refused: Refused) -> ProxyError {
        ProxyError::Transaction(refused)
    }
}

//! A transaction over several backends, run as `hscale_transaction::
//! Transaction` says: hscale answers a plain BEGIN and each backend opens
//! the transaction with its first statement there; COMMIT and ROLLBACK go
//! to every backend it reached, and so do the commits MariaDB makes by
//! itself (BEGIN, DDL, `SET autocommit = 1`) and the rollbacks it makes
//! without saying so (a deadlock, a lost connection).

use std::sync::Arc;

use bytes::Bytes;
use command::PING;
use hscale_planner::{Autocommit, TxControl, TxEffect};
use hscale_transaction::{Before, BeginPlan, CommitPlan, EndPlan, Reach, Refused};
use hscale_wire::command;
use hscale_wire::scan::Expect;

use crate::error::ProxyError;
use crate::session::client::Client;
use crate::session::slots::Needs;
use crate::session::Backends;
use crate::shared::Shared;

/// The command a chained transaction begins with, for backends it reaches
/// later.
fn start_transaction() -> Bytes {
    command::query("START TRANSACTION").into()
}

impl crate::session::Backends {
    /// A BEGIN outside a transaction, answered by hscale: each backend the
    /// transaction reaches gets it with its first statement there, a read in
    /// the same write (Vitess does the same), so that no backend pays a round
    /// trip for it. InnoDB takes a transaction's snapshot at its first read,
    /// not at BEGIN, so the client sees what it would have seen.
    pub(in crate::session) async fn begin_here(
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
            .send_packet(1, &crate::session::handshake::ok_packet(status))
            .await?;
        Ok(())
    }

    /// Runs each of `quiet`'s commands on its slot, in turn, keeping their
    /// answers from the client, then `payload` on `last`, whose answer the
    /// client gets.
    pub(in crate::session) async fn each_then_answer(
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

impl crate::session::Backends {
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

impl crate::session::Backends {
    /// Whether a write on `slots` may run in the transaction.
    pub(in crate::session) fn check_writers(&self, slots: &[usize]) -> Result<(), ProxyError> {
        Ok(self.tx.check_writers(slots)?)
    }

    /// Statements whose commits and rollbacks hscale does not see (`what`)
    /// could leave another backend's part of the transaction behind:
    /// refused while another backend has one.
    pub(in crate::session) fn check_unseen_commits(
        &self,
        slot: usize,
        what: &'static str,
    ) -> Result<(), ProxyError> {
        Ok(self.tx.check_unseen_commits(slot, what)?)
    }

    /// After statements hscale does not see into: a SET autocommit among
    /// them (the status says) is the session's, which backends the session
    /// reaches later must take too. True when it changed.
    pub(in crate::session) fn follow_autocommit(&mut self, before: bool) -> bool {
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

/// BEGIN, COMMIT, ROLLBACK, savepoints, as the planner read them.
pub(in crate::session) async fn run(
    shared: &Arc<Shared>,
    client: &mut Client,
    backends: &mut Backends,
    control: TxControl,
    statement: super::Statement,
) -> Result<(), ProxyError> {
    let super::Statement { payload, needs, .. } = statement;
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
        TxControl::Begin { deferred } => {
            begin(shared, client, backends, deferred, payload, ending).await
        }
        TxControl::End {
            commit,
            plain,
            chain,
            release,
        } => match backends.tx.end_plan(plain, chain, release) {
            EndPlan::Branches => {
                end_xa_transaction(shared, client, backends, commit, chain, release).await
            }
            EndPlan::Nothing => {
                backends.tx.ended_unbegun();
                backends.send_ok(client).await
            }
            EndPlan::Each { quiet, last } => {
                let quiet: Vec<(usize, &[u8])> =
                    quiet.into_iter().map(|slot| (slot, &payload[..])).collect();
                backends
                    .each_then_answer(client, &quiet, last, &payload, ending)
                    .await?;
                backends.tx.ended_each(start_transaction);
                Ok(())
            }
        },
        TxControl::Savepoint { op, name } => {
            backends.savepoint(client, op, name, payload, needs).await
        }
        TxControl::UnreadSavepoint => {
            backends.tx.check_unread_savepoint()?;
            let main = shared.main;
            backends
                .each_then_answer(client, &[], main, &payload, needs)
                .await
                .map(drop)
        }
    }
}

/// BEGIN / START TRANSACTION: commits the transaction in progress (the
/// server does, and hscale on the other backends), releases table
/// locks, and opens a new one.
pub(in crate::session) async fn begin(
    shared: &Arc<Shared>,
    client: &mut Client,
    backends: &mut Backends,
    deferred: bool,
    payload: Bytes,
    needs: Needs,
) -> Result<(), ProxyError> {
    let main = shared.main;
    // The main backend's server releases its own.
    backends.unlock_tables(Some(main)).await?;
    match backends.tx.begin_plan(deferred) {
        BeginPlan::Here { commit_first } => {
            if commit_first {
                commit_open(shared, backends, None).await?;
            }
            backends.begin_here(client, payload).await
        }
        BeginPlan::OnServer => {
            commit_before(
                shared,
                backends,
                main,
                TxEffect::CommitsFirst,
                &payload[1..],
            )
            .await?;
            backends
                .each_then_answer(client, &[], main, &payload, needs)
                .await?;
            backends.tx.begun_on_server(payload);
            Ok(())
        }
    }
}

/// COMMIT / ROLLBACK of a transaction with XA branches: every backend
/// it reached ends it (in two phases where several wrote), then hscale
/// answers. AND CHAIN begins the next one as a BEGIN hscale answered;
/// RELEASE ends the client's connection after the answer.
async fn end_xa_transaction(
    shared: &Arc<Shared>,
    client: &mut Client,
    backends: &mut Backends,
    commit: bool,
    chain: bool,
    release: bool,
) -> Result<(), ProxyError> {
    end_branches(shared, backends, commit).await?;
    if chain {
        backends.tx.chain(start_transaction);
    }
    backends.send_ok(client).await?;
    match release {
        true => Err(ProxyError::Client(hscale_wire::WireError::Closed)),
        false => Ok(()),
    }
}

/// Ends the transaction on every backend it reached, some of them XA
/// branches: committed by the protocol (`commit_branches`), or rolled
/// back. Each connection then goes back to its slot with the status
/// its last statement gave.
async fn end_branches(
    shared: &Arc<Shared>,
    backends: &mut Backends,
    commit: bool,
) -> Result<(), ProxyError> {
    let (reached, running) = backends
        .tx
        .branches(|| crate::xa::begin(&shared.cluster, None));
    let mut parts = crate::session::atomic::Parts::new();
    let mut branches = Vec::new();
    for (slot, branch) in reached {
        // Gone with its connection, which ended it.
        let Some(conn) = backends.slots[slot].held.take() else {
            continue;
        };
        branches.push(branch);
        let lease = crate::backend::Lease { conn };
        parts.insert(slot, (lease, hscale_wire::scan::Completion::default()));
    }
    // A connection that ends its branch here may not have taken the
    // session's latest SET autocommit yet: its status does not change
    // the session's setting.
    let autocommit = backends.tx.autocommit();
    let outcome = match commit {
        true => {
            backends
                .commit_branches(&mut parts, &running, &branches)
                .await
        }
        false => {
            backends
                .roll_back_branches(&mut parts, &running, &branches)
                .await;
            Ok(())
        }
    };
    for (slot, (lease, last)) in parts {
        backends.tx.branch_ended(slot);
        backends.finish_command(slot, lease, &last);
    }
    // Ended everywhere, also where a connection went.
    backends.tx.branches_ended(autocommit);
    outcome
}

/// Before a statement on `slot` that the server commits the transaction
/// for, commits it on the other backends (on `slot` the server does),
/// so that the client's answer comes after every backend committed.
pub(in crate::session) async fn commit_before(
    shared: &Arc<Shared>,
    backends: &mut Backends,
    slot: usize,
    effect: TxEffect,
    sql: &[u8],
) -> Result<(), ProxyError> {
    let (to, user_variable) = match effect {
        TxEffect::SetsAutocommit { to, user_variable } => (to, user_variable),
        _ => (Autocommit::Off, false),
    };
    match backends.tx.before(slot, effect)? {
        Before::Nothing => Ok(()),
        Before::EndBranches { then_autocommit } => {
            end_branches(shared, backends, true).await?;
            match then_autocommit {
                // The other backends take the setting now, as before.
                true => {
                    backends
                        .set_autocommit_elsewhere(slot, sql, to, user_variable)
                        .await
                }
                false => Ok(()),
            }
        }
        Before::CommitOthers => commit_open(shared, backends, Some(slot)).await,
        Before::SetAutocommitElsewhere => {
            backends
                .set_autocommit_elsewhere(slot, sql, to, user_variable)
                .await
        }
    }
}

/// After statements hscale does not see into that turned autocommit on
/// (`follow_autocommit`): the transaction ended on `slot`, and so on
/// every backend.
pub(in crate::session) async fn commit_after(
    shared: &Arc<Shared>,
    backends: &mut Backends,
    slot: usize,
) -> Result<(), ProxyError> {
    if !backends.tx.part(slot).transaction {
        commit_open(shared, backends, Some(slot)).await?;
    }
    Ok(())
}

/// Commits the transaction on every backend it reached but `except`'s
/// (whose server commits it), or on every one where it has XA branches.
pub(in crate::session) async fn commit_open(
    shared: &Arc<Shared>,
    backends: &mut Backends,
    except: Option<usize>,
) -> Result<(), ProxyError> {
    match backends.tx.commit_plan(except) {
        CommitPlan::Branches => end_branches(shared, backends, true).await,
        CommitPlan::Each(slots) => {
            let commit = command::query("COMMIT");
            for slot in slots {
                backends.run_quietly(slot, &commit).await?;
            }
            backends.tx.committed_each();
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
pub(in crate::session) async fn settle_transaction(
    shared: &Arc<Shared>,
    client: &mut Client,
    backends: &mut Backends,
) {
    let (unsure, mut ended) = backends.tx.to_settle();
    for slot in unsure {
        let Some(conn) = backends.slots[slot].held.as_mut() else {
            ended = true;
            continue;
        };
        match conn.run(&[PING], Expect::Single).await {
            Ok(Ok(pong)) => backends.take_status(slot, pong.status, true),
            _ => backends.forget_connection_state(slot),
        }
        ended |= backends.tx.ended_on(slot);
    }
    if !ended {
        return;
    }
    if backends.tx.has_branches() {
        let _ = end_branches(shared, backends, false).await;
        backends.tx.settled();
        return;
    }
    let rollback = command::query("ROLLBACK");
    for slot in backends.tx.slots() {
        let Some(conn) = backends.slots[slot].held.as_mut() else {
            continue;
        };
        match conn.run(&rollback, Expect::ResultSets).await {
            Ok(Ok(done)) => backends.take_status(slot, done.status, true),
            // Closing the connection rolls its part back.
            _ => backends.forget_connection_state(slot),
        }
        backends.release_unheld(slot);
    }
    tracing::debug!(
        connection_id = client.connection_id,
        "transaction rolled back on a backend: rolled back on every backend"
    );
    backends.tx.settled();
}

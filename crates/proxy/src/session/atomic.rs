//! Ending a transaction over several backends (`transactions =
//! "atomic"`): the steps `hscale_transaction::Commit` gives — in one phase
//! where at most one part wrote, else every XA branch prepared, the
//! decision recorded (in the plain part as it commits, or in the
//! dictionary), every branch committed — run on the parts' connections.
//! The client gets OK only once the decision is durable; a branch whose
//! commit fails after it is committed by recovery. Serves an autocommitted
//! statement that writes on several backends (`write_each`) and a
//! transaction the client ends.

use std::collections::BTreeMap;

use hscale_transaction::{rollback_steps, Branch, Commit, Decision, Next, Recorded, Step, Went};
use hscale_wire::scan::Completion;

use crate::backend::Lease;
use crate::error::ProxyError;
use crate::failpoint;
use crate::shared::Cluster;
use crate::xa::{self, Running};
use hscale_wire::command;

/// The connections of a transaction's branches, by slot, with the last
/// answer each gave.
pub(super) type Parts = BTreeMap<usize, (Lease, Completion)>;

impl super::Backends {
    /// Commits the transaction `running` on `parts`, whose branches are
    /// `branches` (in the order of `parts`), step by step as
    /// `hscale_transaction::Commit` says. An error before the decision
    /// rolls every branch back and is the answer; after it, a branch that
    /// did not commit is left prepared, its connection closed, for recovery
    /// to commit.
    pub(super) async fn commit_branches(
        &mut self,
        parts: &mut Parts,
        running: &Running,
        branches: &[Branch],
    ) -> Result<(), ProxyError> {
        let Ok(mut commit) = Commit::new(&running.xid(0), branches) else {
            self.roll_back_branches(parts, running, branches).await;
            return Err(ProxyError::Unroutable(hscale_planner::Refusal {
                table: None,
                reason: "a transaction that wrote on several backends, one of them in a transaction that cannot be prepared (START TRANSACTION with options, or LOCK TABLES): rolled back".into(),
            }));
        };
        let shared = self.shared.clone();
        let mut went = Went::Started;
        let mut error = None;
        // The decision went in with a plain part's commit: that part
        // committed already.
        let mut committed_one = false;
        loop {
            went = match commit.next(went) {
                Next::Run(each) => {
                    if commit.two_phase() && !commit.decided() {
                        failpoint::hit("xa_before_prepare").await;
                    }
                    if committed_one {
                        failpoint::hit("xa_between_commits").await;
                    }
                    match self.run_on_each(parts, &each, commit.decided()).await {
                        Ok(()) => Went::Ran { failed: Vec::new() },
                        Err((e, failed)) => {
                            if commit.decided() {
                                tracing::warn!(
                                    transaction = %running.gtrid(),
                                    "XA COMMIT failed after the decision; recovery commits the branch: {e}"
                                );
                            }
                            error.get_or_insert(e);
                            let failed =
                                failed.iter().map(|&slot| shared.pools[slot].id()).collect();
                            Went::Ran { failed }
                        }
                    }
                }
                Next::Record => {
                    failpoint::hit("xa_after_prepare").await;
                    let recorded = record_in_dictionary(&shared, running, &mut error).await;
                    if recorded == Recorded::Durable {
                        failpoint::hit("xa_after_decision").await;
                    }
                    Went::Recorded(recorded)
                }
                Next::RecordIn(backend) => {
                    failpoint::hit("xa_after_prepare").await;
                    let slot = shared.pool_index(backend).expect("a branch's backend");
                    let insert = xa::decision_insert(&shared, &running.gtrid());
                    let (lease, last) = parts.get_mut(&slot).expect("the plain part");
                    let recorded = match commit_with(lease, &insert).await {
                        Ok(completion) => {
                            *last = completion;
                            committed_one = true;
                            failpoint::hit("xa_after_decision").await;
                            Recorded::Durable
                        }
                        Err(e) => recorded_in_part(e, &mut error),
                    };
                    Went::Recorded(recorded)
                }
                Next::RollBack => {
                    self.roll_back_branches(parts, running, branches).await;
                    return Err(error.expect("a failure to roll back for"));
                }
                Next::Abandon => {
                    // Closing the connections leaves the prepared branches
                    // to recovery, which reads the decision once it can.
                    let slots: Vec<usize> = parts.keys().copied().collect();
                    self.leave_to_recovery(parts, &slots);
                    return Err(error.expect("a failure to abandon for"));
                }
                Next::Finish { leave } => {
                    let slots: Vec<usize> = parts
                        .keys()
                        .copied()
                        .filter(|&slot| leave.contains(&shared.pools[slot].id()))
                        .collect();
                    self.leave_to_recovery(parts, &slots);
                    if commit.two_phase() {
                        shared
                            .xa
                            .committed
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    return Ok(());
                }
            };
        }
    }

    /// Runs each backend's statements of a step, the backends at once; the
    /// first error, and the slots where one came.
    async fn run_on_each(
        &mut self,
        parts: &mut Parts,
        each: &[(u32, Vec<String>)],
        committing: bool,
    ) -> Result<(), (ProxyError, Vec<usize>)> {
        let shared = self.shared.clone();
        let work = parts
            .iter_mut()
            .enumerate()
            .filter_map(|(i, (&slot, part))| {
                let backend = shared.pools[slot].id();
                let (_, statements) = each.iter().find(|(b, _)| *b == backend)?;
                Some(async move {
                    if committing && i == 1 {
                        failpoint::hit("xa_between_commits").await;
                    }
                    let (lease, last) = part;
                    let (queued, final_statement) = statements.split_at(statements.len() - 1);
                    for statement in queued {
                        lease.conn.queue_command(&command::query(statement));
                    }
                    match run_statement(lease, &final_statement[0]).await {
                        Ok(completion) => {
                            *last = completion;
                            Ok(())
                        }
                        Err(e) => Err((slot, e)),
                    }
                })
            });
        let mut first = None;
        let mut failed = Vec::new();
        for outcome in crate::exec::all_at_once(work).await {
            if let Err((slot, e)) = outcome {
                failed.push(slot);
                first.get_or_insert(e);
            }
        }
        match first {
            None => Ok(()),
            Some(e) => Err((e, failed)),
        }
    }

    /// Rolls back every branch, prepared or not: each statement on its own
    /// (an XA END fails on a branch that ended or that a deadlock left
    /// rollback-only, and only the rollback counts). A branch whose
    /// rollback fails is closed: unprepared, the server ends it; prepared,
    /// recovery finds no decision and rolls it back.
    pub(super) async fn roll_back_branches(
        &mut self,
        parts: &mut Parts,
        running: &Running,
        branches: &[Branch],
    ) {
        let steps = rollback_steps(&running.xid(0), branches);
        let mut failed = Vec::new();
        for step in &steps {
            let Step::Run(each) = step else { continue };
            for (&slot, (lease, last)) in parts.iter_mut() {
                let backend = self.shared.pools[slot].id();
                let Some((_, statements)) = each.iter().find(|(b, _)| *b == backend) else {
                    continue;
                };
                let (before, rollback) = statements.split_at(statements.len() - 1);
                for statement in before {
                    let _ = run_statement(lease, statement).await;
                }
                match run_statement(lease, &rollback[0]).await {
                    Ok(completion) => *last = completion,
                    Err(_) => failed.push(slot),
                }
            }
        }
        self.leave_to_recovery(parts, &failed);
    }

    /// Closes the connections of `slots`: a prepared branch outlives its
    /// connection, and recovery resolves it from another.
    fn leave_to_recovery(&mut self, parts: &mut Parts, slots: &[usize]) {
        for slot in slots {
            if let Some((lease, _)) = parts.remove(slot) {
                drop(lease);
                self.forget_connection_state(*slot);
            }
        }
    }
}

/// Runs `first`, then COMMIT only if `first` succeeded: in one query where
/// the connection runs several statements (the server runs nothing after a
/// failed one), else in two, for a client that did not ask for several
/// statements per query (most drivers' default), whose capabilities its
/// connection carries.
async fn commit_with(lease: &mut Lease, first: &str) -> Result<Completion, ProxyError> {
    if runs_several(lease) {
        return run_statement(lease, &format!("{first};\nCOMMIT")).await;
    }
    run_statement(lease, first).await?;
    run_statement(lease, "COMMIT").await
}

/// Whether the connection runs several statements in one query.
pub(super) fn runs_several(lease: &Lease) -> bool {
    lease
        .conn
        .key
        .capabilities
        .contains(hscale_wire::CapabilityFlags::CLIENT_MULTI_STATEMENTS)
}

async fn run_statement(lease: &mut Lease, sql: &str) -> Result<Completion, ProxyError> {
    match lease
        .conn
        .run(&command::query(sql), hscale_wire::scan::Expect::ResultSets)
        .await
    {
        Ok(Ok(completion)) => Ok(completion),
        Ok(Err(refused)) => Err(ProxyError::Refused(refused)),
        Err(e) => Err(ProxyError::Backend(e)),
    }
}

/// The commit decision written into the dictionary; what it came to, with
/// the client's error where it was not written.
async fn record_in_dictionary(
    shared: &Cluster,
    running: &Running,
    error: &mut Option<ProxyError>,
) -> Recorded {
    match xa::record(shared, &running.gtrid(), Decision::Commit).await {
        xa::Recorded::Durable => Recorded::Durable,
        xa::Recorded::Preempted(decision) => {
            if decision == Decision::Abort {
                *error = Some(xa::rolled_back_by_recovery());
            }
            Recorded::Preempted(decision)
        }
        xa::Recorded::Refused(e) => {
            *error = Some(e);
            Recorded::Refused
        }
        xa::Recorded::Unknown(e) => {
            *error = Some(xa::outcome_unknown(&e));
            Recorded::Unknown
        }
    }
}

/// What a plain part's commit that failed, carrying the decision, came
/// to, with the client's error.
fn recorded_in_part(failure: ProxyError, error: &mut Option<ProxyError>) -> Recorded {
    match failure {
        // Recovery took the transaction for dead and recorded its abort
        // first.
        ProxyError::Refused(e) if e.code == xa::ER_DUP_ENTRY => {
            *error = Some(xa::rolled_back_by_recovery());
            Recorded::Preempted(Decision::Abort)
        }
        e @ ProxyError::Refused(_) => {
            *error = Some(e);
            Recorded::Refused
        }
        e => {
            *error = Some(xa::outcome_unknown(&e));
            Recorded::Unknown
        }
    }
}

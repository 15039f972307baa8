//! An autocommitted statement that writes on several backends (a multi-row
//! INSERT, an UPDATE or DELETE over partitions, LOAD DATA) as one
//! transaction committed in two phases (`transactions = "atomic"`): each
//! backend's part runs in an XA branch; once every part succeeded, every
//! branch is prepared, the decision is recorded in the dictionary, and
//! every branch commits. The client gets OK only once the decision is
//! durable; a branch whose commit fails after it is committed by recovery.

use std::collections::BTreeMap;

use hscale_transaction::{statements, Decision};
use hscale_wire::scan::Completion;

use super::state::{command, COM_QUERY};
use super::Session;
use crate::backend::Lease;
use crate::error::ProxyError;
use crate::xa::{self, Recorded, Running};

/// The connections of a statement's parts, by slot, with the last answer
/// each gave.
pub(super) type Parts = BTreeMap<usize, (Lease, Completion)>;

impl Session {
    /// Queues the branch's XA START ahead of the part's first statement on
    /// `slot`'s connection: one round trip for both. Should it fail, the
    /// connection is taken for lost, and the server ends what it began.
    pub(super) fn start_branch(&self, lease: &mut Lease, slot: usize, running: &Running) {
        let xid = running.xid(self.shared.pools[slot].id());
        lease
            .conn
            .queue_command(&command(COM_QUERY, &statements::start(&xid)));
    }

    /// Prepares every branch, records the decision, commits every branch.
    /// An error before the decision rolls every branch back; after it, a
    /// branch that did not commit is left prepared, its connection closed,
    /// for recovery to commit.
    pub(super) async fn commit_atomic(
        &mut self,
        parts: &mut Parts,
        running: &Running<'_>,
    ) -> Result<(), ProxyError> {
        let slots: Vec<usize> = parts.keys().copied().collect();
        for &slot in &slots {
            let xid = running.xid(self.shared.pools[slot].id());
            let [end, prepare] = statements::prepare(&xid);
            let (lease, last) = parts.get_mut(&slot).expect("a part's slot");
            lease.conn.queue_command(&command(COM_QUERY, &end));
            match run_statement(lease, &prepare).await {
                Ok(completion) => *last = completion,
                Err(e) => {
                    self.roll_back_atomic(parts, running).await;
                    return Err(e);
                }
            }
        }
        let shared = self.shared.clone();
        match xa::record(&shared, &running.gtrid(), Decision::Commit).await {
            Recorded::Durable | Recorded::Preempted(Decision::Commit) => {}
            Recorded::Preempted(Decision::Abort) => {
                self.roll_back_atomic(parts, running).await;
                return Err(xa::rolled_back_by_recovery());
            }
            Recorded::Refused(e) => {
                self.roll_back_atomic(parts, running).await;
                return Err(e);
            }
            Recorded::Unknown(e) => {
                // Closing the connections leaves the prepared branches to
                // recovery, which reads the decision once it can.
                self.leave_to_recovery(parts, &slots);
                return Err(xa::outcome_unknown(&e));
            }
        }
        let mut uncommitted = Vec::new();
        for &slot in &slots {
            let xid = running.xid(self.shared.pools[slot].id());
            let (lease, last) = parts.get_mut(&slot).expect("a part's slot");
            match run_statement(lease, &statements::commit(&xid)).await {
                Ok(completion) => *last = completion,
                Err(e) => {
                    tracing::warn!(branch = %xid, "XA COMMIT failed after the decision; recovery commits the branch: {e}");
                    uncommitted.push(slot);
                }
            }
        }
        self.leave_to_recovery(parts, &uncommitted);
        self.shared
            .xa
            .committed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Rolls back every branch, prepared or not.
    pub(super) async fn roll_back_atomic(&mut self, parts: &mut Parts, running: &Running<'_>) {
        let slots: Vec<usize> = parts.keys().copied().collect();
        let mut failed = Vec::new();
        for &slot in &slots {
            let xid = running.xid(self.shared.pools[slot].id());
            let (lease, last) = parts.get_mut(&slot).expect("a part's slot");
            // XA END fails on a branch that ended already: only ROLLBACK
            // must succeed.
            let _ = run_statement(lease, &statements::rollback(&xid, false)[0]).await;
            match run_statement(lease, &statements::rollback(&xid, true)[0]).await {
                Ok(completion) => *last = completion,
                Err(_) => failed.push(slot),
            }
        }
        // An unprepared branch ends with its connection; a prepared one
        // is then recovery's, which finds no decision and rolls it back.
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

async fn run_statement(lease: &mut Lease, sql: &str) -> Result<Completion, ProxyError> {
    match lease
        .conn
        .run(
            &command(COM_QUERY, sql),
            hscale_wire::scan::Expect::ResultSets,
        )
        .await
    {
        Ok(Ok(completion)) => Ok(completion),
        Ok(Err(refused)) => Err(ProxyError::Refused(refused)),
        Err(e) => Err(ProxyError::Backend(e)),
    }
}

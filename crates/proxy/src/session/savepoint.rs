//! SAVEPOINT, ROLLBACK TO SAVEPOINT and RELEASE SAVEPOINT in a transaction
//! that may span several backends. A savepoint is set on every backend the
//! transaction has reached; a backend it reaches later has done nothing
//! before the savepoint, so rolling back to it there is a whole ROLLBACK
//! (the next statement there opens the transaction again).

use bytes::Bytes;
use hscale_planner::SavepointOp;
use hscale_transaction::SavepointStep;
use hscale_wire::packets::ErrorPacket;

use super::client::Client;
use super::slots::Needs;
use crate::error::ProxyError;
use hscale_wire::command;

const ER_SP_DOES_NOT_EXIST: u16 = 1305;

impl super::Backends {
    pub(super) async fn savepoint(
        &mut self,
        client: &mut Client,
        op: SavepointOp,
        name: String,
        payload: Bytes,
        needs: Needs,
    ) -> Result<(), ProxyError> {
        let Ok(mut steps) = self.tx.savepoint_steps(op, &name) else {
            // Not set, or gone: as MariaDB answers.
            return Err(ProxyError::Refused(ErrorPacket::new(
                ER_SP_DOES_NOT_EXIST,
                "42000",
                format!("SAVEPOINT {name} does not exist"),
            )));
        };
        let Some(SavepointStep::Statement(last)) = steps.pop() else {
            unreachable!("the client's answer comes from its statement")
        };
        let rollback = command::query("ROLLBACK");
        let mut quiet: Vec<(usize, &[u8])> = Vec::with_capacity(steps.len());
        for step in steps {
            match step {
                SavepointStep::RollBackBranch(slot) => self.roll_back_branch(slot).await?,
                SavepointStep::WholeRollback(slot) => quiet.push((slot, &rollback[..])),
                SavepointStep::Statement(slot) => quiet.push((slot, &payload[..])),
            }
        }
        let completion = self
            .each_then_answer(client, &quiet, last, &payload, needs)
            .await?;
        if !completion.error {
            self.tx.savepoint_done(op, name);
        }
        Ok(())
    }
}

impl super::Backends {
    /// Rolls back the XA branch on `slot` alone; the transaction's next
    /// statement there opens it again.
    async fn roll_back_branch(&mut self, slot: usize) -> Result<(), ProxyError> {
        let shared = self.shared.clone();
        let running = self
            .tx
            .running_or(|| crate::xa::begin(&shared.cluster, None));
        let xid = running.xid(self.shared.pools[slot].id());
        let [end, rollback] = [
            format!("XA END {}", xid.sql()),
            hscale_transaction::statements::rollback(&xid, true).remove(0),
        ];
        // XA END fails where the branch ended already; the rollback counts.
        let _ = self.run_quietly(slot, &command::query(&end)).await;
        self.run_quietly(slot, &command::query(&rollback)).await?;
        self.tx.branch_ended(slot);
        Ok(())
    }
}

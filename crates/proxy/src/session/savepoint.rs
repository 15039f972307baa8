//! SAVEPOINT, ROLLBACK TO SAVEPOINT and RELEASE SAVEPOINT in a transaction
//! that may span several backends. A savepoint is set on every backend the
//! transaction has reached; a backend it reaches later has done nothing
//! before the savepoint, so rolling back to it there is a whole ROLLBACK
//! (the next statement there opens the transaction again).

use bytes::Bytes;
use hscale_planner::SavepointOp;
use hscale_wire::packets::ErrorPacket;

use super::slots::Needs;
use super::state::{command, COM_QUERY};
use super::Session;
use crate::error::ProxyError;

const ER_SP_DOES_NOT_EXIST: u16 = 1305;

/// A savepoint the session set, and the backends (slots) it is set on.
#[derive(Debug)]
pub(super) struct Savepoint {
    name: String,
    slots: Vec<usize>,
}

impl Session {
    /// Rolls back the XA branch on `slot` alone; the transaction's next
    /// statement there opens it again.
    async fn roll_back_branch(&mut self, slot: usize) -> Result<(), ProxyError> {
        let Some(running) = self.running.as_ref() else {
            return Ok(());
        };
        let xid = running.xid(self.shared.pools[slot].id());
        let [end, rollback] = [
            format!("XA END {}", xid.sql()),
            hscale_transaction::statements::rollback(&xid, true).remove(0),
        ];
        // XA END fails where the branch ended already; the rollback counts.
        let _ = self.run_quietly(slot, &command(COM_QUERY, &end)).await;
        self.run_quietly(slot, &command(COM_QUERY, &rollback))
            .await?;
        self.slots[slot].binding.xa = false;
        self.slots[slot].binding.wrote = false;
        Ok(())
    }

    pub(super) async fn savepoint(
        &mut self,
        op: SavepointOp,
        name: String,
        payload: Bytes,
        needs: Needs,
    ) -> Result<(), ProxyError> {
        let open = self.transaction_slots();
        let known = self.savepoints.iter().position(|s| s.name == name);
        // (slot, whole ROLLBACK instead of the statement), the client's answer last.
        let mut steps: Vec<(usize, bool)> = match (op, known) {
            (SavepointOp::Set, _) => match open.is_empty() {
                // The main backend opens the transaction with it.
                true => vec![(self.shared.main, false)],
                false => open.iter().map(|&slot| (slot, false)).collect(),
            },
            (_, None) if open.iter().all(|&slot| slot == self.shared.main) => {
                // Only the server can say what it knows of the name.
                vec![(self.shared.main, false)]
            }
            // Not set, or gone: as MariaDB answers. (One set inside a
            // multi-statement query is not known here: an error, never a
            // rollback on one backend only.)
            (_, None) => {
                return Err(ProxyError::Refused(ErrorPacket::new(
                    ER_SP_DOES_NOT_EXIST,
                    "42000",
                    format!("SAVEPOINT {name} does not exist"),
                )))
            }
            (SavepointOp::RollbackTo, Some(i)) => {
                let set_on = &self.savepoints[i].slots;
                let mut steps: Vec<(usize, bool)> = open
                    .iter()
                    .map(|&slot| (slot, !set_on.contains(&slot)))
                    .collect();
                // Whole rollbacks first: the client's answer is the savepoint's.
                steps.sort_by_key(|&(_, whole)| !whole);
                steps
            }
            (SavepointOp::Release, Some(i)) => open
                .iter()
                .filter(|slot| self.savepoints[i].slots.contains(slot))
                .map(|&slot| (slot, false))
                .collect(),
        };
        if steps.last().is_none_or(|&(_, whole)| whole) {
            // No backend holds the savepoint any more: the server says so.
            steps.push((self.shared.main, false));
        }
        let (last, _) = steps.pop().expect("one step at least");
        let rollback = command(COM_QUERY, "ROLLBACK");
        let mut quiet: Vec<(usize, &[u8])> = Vec::with_capacity(steps.len());
        for (slot, whole) in steps {
            match whole {
                true if self.slots[slot].binding.xa => self.roll_back_branch(slot).await?,
                true => quiet.push((slot, &rollback[..])),
                false => quiet.push((slot, &payload[..])),
            }
        }
        let completion = self.each_then_answer(&quiet, last, &payload, needs).await?;
        if completion.error {
            return Ok(());
        }
        match (op, known) {
            // Outside a transaction a savepoint is gone at once.
            (SavepointOp::Set, _) if !self.in_transaction() => {}
            (SavepointOp::Set, _) => {
                // Setting a name again moves it.
                self.savepoints.retain(|s| s.name != name);
                let slots = self.transaction_slots();
                self.savepoints.push(Savepoint { name, slots });
            }
            // Those set after it are gone; it stays.
            (SavepointOp::RollbackTo, Some(i)) => self.savepoints.truncate(i + 1),
            // It and those set after it are gone.
            (SavepointOp::Release, Some(i)) => self.savepoints.truncate(i),
            (_, None) => {}
        }
        Ok(())
    }
}

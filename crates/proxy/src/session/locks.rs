//! LOCK TABLES over several backends. A partitioned table is locked by
//! locking its physical tables on each backend, on the session's own
//! connection there, which the lock binds to the session. The server
//! releases a connection's table locks at its next LOCK TABLES, UNLOCK
//! TABLES or START TRANSACTION; hscale does the same on the session's other
//! backends, which do not see the statement.

use hscale_planner::TableLocks;

use super::slots::Previous;
use super::Session;
use crate::error::ProxyError;
use hscale_wire::command;

impl Session {
    /// As the server does for LOCK TABLES: the open transaction is
    /// committed and the session's earlier table locks released, then each
    /// backend locks its share. If one fails, none is kept.
    pub(super) async fn lock_tables(&mut self, locks: TableLocks) -> Result<(), ProxyError> {
        if self.backends.tx.in_transaction() {
            self.commit_open(None).await?;
        }
        self.backends.unlock_tables(None).await?;
        for (backend, sql) in &locks.per_backend {
            let slot = self.backends.slot_of(*backend)?;
            self.backends.slots[slot]
                .binding
                .sticky
                .get_or_insert("LOCK TABLES");
            if let Err(e) = self.backends.run_quietly(slot, &command::query(sql)).await {
                self.backends.unlock_tables(None).await?;
                return Err(e);
            }
            self.backends.tx.set_tables_locked(slot, true);
        }
        self.backends.previous = Previous::Nothing;
        self.backends.send_ok(&mut self.client).await
    }
}

impl super::Backends {
    /// UNLOCK TABLES on each connection of the session that holds table
    /// locks, but `except` (where the client's own statement releases them).
    pub(super) async fn unlock_tables(&mut self, except: Option<usize>) -> Result<(), ProxyError> {
        for slot in 0..self.slots.len() {
            if Some(slot) == except || !self.tx.part(slot).tables_locked {
                continue;
            }
            self.tx.set_tables_locked(slot, false);
            self.run_quietly(slot, &command::query("UNLOCK TABLES"))
                .await?;
        }
        Ok(())
    }
}

//! LOCK TABLES over several backends. A partitioned table is locked by
//! locking its physical tables on each backend, on the session's own
//! connection there, which the lock binds to the session. The server
//! releases a connection's table locks at its next LOCK TABLES, UNLOCK
//! TABLES or START TRANSACTION; hscale does the same on the session's other
//! backends, which do not see the statement.

use std::sync::Arc;

use hscale_planner::TableLocks;
use hscale_wire::command;

use crate::error::ProxyError;
use crate::session::client::Client;
use crate::session::slots::Previous;
use crate::session::Backends;
use crate::shared::Shared;

impl crate::session::Backends {
    /// UNLOCK TABLES on each connection of the session that holds table
    /// locks, but `except` (where the client's own statement releases them).
    pub(in crate::session) async fn unlock_tables(
        &mut self,
        except: Option<usize>,
    ) -> Result<(), ProxyError> {
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

/// As the server does for LOCK TABLES: the open transaction is
/// committed and the session's earlier table locks released, then each
/// backend locks its share. If one fails, none is kept.
pub(in crate::session) async fn run(
    shared: &Arc<Shared>,
    client: &mut Client,
    backends: &mut Backends,
    locks: TableLocks,
) -> Result<(), ProxyError> {
    if backends.tx.in_transaction() {
        super::transaction::commit_open(shared, backends, None).await?;
    }
    backends.unlock_tables(None).await?;
    for (backend, sql) in &locks.per_backend {
        let slot = backends.slot_of(*backend)?;
        backends.slots[slot]
            .binding
            .sticky
            .get_or_insert("LOCK TABLES");
        if let Err(e) = backends.run_quietly(slot, &command::query(sql)).await {
            backends.unlock_tables(None).await?;
            return Err(e);
        }
        backends.tx.set_tables_locked(slot, true);
    }
    backends.previous = Previous::Nothing;
    backends.send_ok(client).await
}

//! Which connection of a backend a command takes: the writer's, or a
//! replica's for a read that may go there and sees the session's own
//! writes (the writer's GTID position waited for, briefly).

use hscale_planner::ReadsHint;
use hscale_transaction::Opening;

use super::Needs;
use crate::backend::Lease;
use crate::error::ProxyError;

/// How long a read on a replica waits for the replica to apply the
/// session's own writes before the writer answers it instead.
const REPLICA_WAIT_S: f64 = 0.05;

impl crate::session::Backends {
    /// A held connection that no longer goes to the backend's writer: a
    /// replica's, whose read is over, goes back to its pool; one to an old
    /// writer is an error, since the session's state there (a transaction,
    /// locks, variables) stays with it.
    pub(super) fn let_go_of_a_replica(&mut self, slot: usize) -> Result<(), ProxyError> {
        let pool = &self.shared.pools[slot];
        let Some(conn) = self.slots[slot].held.take_if(|conn| !pool.is_current(conn)) else {
            return Ok(());
        };
        if pool.reader_of(&conn).is_some() {
            pool.release(conn);
            return Ok(());
        }
        self.forget_connection_state(slot);
        Err(crate::backend::BackendError::WriterChanged {
            backend: conn.backend,
        }
        .into())
    }

    /// A connection to the writer from the pool, the session's own if no
    /// one used it since.
    pub(super) async fn writer_lease(
        &mut self,
        slot: usize,
        needs: Needs,
    ) -> Result<Lease, ProxyError> {
        self.slots[slot].wrote |= !needs.reads_only;
        let s = &self.slots[slot];
        Ok(self.shared.pools[slot]
            .acquire(&s.bucket, s.returned)
            .await?)
    }

    pub(super) fn may_read_a_replica(&self, needs: Needs, opening: &Opening) -> bool {
        let wanted = match needs.reads_hint {
            Some(ReadsHint::Replica) => true,
            Some(ReadsHint::Primary) => false,
            None => self.reads.by_default,
        };
        wanted && needs.replica_ok && *opening == Opening::Nothing
    }

    /// A connection to a replica for a read that may go there, one that
    /// applied what the session wrote through the writer; `None`: the
    /// writer answers.
    pub(super) async fn replica_for(
        &mut self,
        slot: usize,
        needs: Needs,
        opening: &Opening,
    ) -> Option<Lease> {
        let max_lag = self.reads.max_lag;
        if !self.may_read_a_replica(needs, opening) {
            return None;
        }
        let pool = self.shared.pools[slot].clone();
        let wanted = match self.slots[slot].wrote {
            true => Some(self.writer_position(slot).await?),
            false => None,
        };
        let (reader, applied) = pool.reader(max_lag, wanted.as_deref())?;
        let key = self.slots[slot].bucket.key;
        let mut lease = reader.acquire(&reader.bucket(key), None).await.ok()?;
        if let Some(wanted) = wanted.filter(|_| !applied) {
            // A short wait: the writer answers sooner than a replica far behind.
            let wait = format!("SELECT MASTER_GTID_WAIT('{wanted}', {REPLICA_WAIT_S})");
            let reached = matches!(lease.conn.query(&wait).await, Ok(Ok(rows))
                if rows.first().and_then(|r| r.first()).cloned().flatten().as_deref() == Some(b"0"));
            if !reached {
                reader.release(lease.conn);
                return None;
            }
        }
        self.slots[slot].wrote = false;
        Some(lease)
    }

    /// The writer's GTID position now: what a replica must have applied to
    /// show this session its own writes.
    pub(super) async fn writer_position(&mut self, slot: usize) -> Option<String> {
        let pool = &self.shared.pools[slot];
        let s = &self.slots[slot];
        let mut lease = pool.acquire(&s.bucket, s.returned).await.ok()?;
        let position = match lease.conn.query("SELECT @@global.gtid_binlog_pos").await {
            Ok(Ok(rows)) => rows.first()?.first()?.clone(),
            _ => None,
        };
        pool.release_to(&s.bucket, lease.conn);
        position.map(|p| String::from_utf8_lossy(&p).into_owned())
    }
}

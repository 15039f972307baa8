//! The applier of a move: the source's binary log followed from the
//! checkpoint, each transaction's changes to the rows the move takes applied
//! on the parts in one transaction with the checkpoint (an XA transaction's
//! at its commit, in commit order), and how far behind the source it is.

use hscale_moves::{BinlogPosition, Group, MoveError, PartView, Step, Xid};

use super::ChunkCopy;
use crate::dictionary::store::exec;
use crate::error::ProxyError;

/// How many source transactions the applier groups into one of its own.
const TRANSACTIONS_PER_COMMIT: usize = 200;

impl ChunkCopy {
    /// Applies the source's changes until the applier reaches `target`, a
    /// transaction's end; each group of transactions commits on the
    /// destinations, the checkpoint's last. An XA transaction's changes
    /// are held from its PREPARE and applied at its `XA COMMIT`, in commit
    /// order, or dropped at its `XA ROLLBACK`.
    pub async fn apply_until(&mut self, target: &BinlogPosition) -> Result<(), ProxyError> {
        if self.dump.is_none() {
            return Ok(());
        }
        let mut open = false;
        let mut transactions = 0;
        while self.applied_to() < target {
            let dump = self.dump.as_mut().expect("checked above");
            let event = dump.next().await?;
            let parts: Vec<PartView> = self
                .writers
                .iter()
                .map(|w| (&w.part.table, &*w.part.filter))
                .collect();
            let step = self.follower.step(event, dump.position(), &parts)?;
            match step {
                Step::Apply(changes) => {
                    self.open_applied(&mut open).await?;
                    for w in &mut self.writers {
                        w.pending.absorb(&w.part.table, &changes, &*w.part.filter)?;
                        if w.pending.is_full() {
                            w.write_pending().await?;
                        }
                    }
                }
                Step::Commit(group) => {
                    if let Some(group) = group {
                        self.open_applied(&mut open).await?;
                        self.apply_group(group).await?;
                    }
                    transactions += 1;
                    if open && transactions >= TRANSACTIONS_PER_COMMIT {
                        self.commit_applied(true).await?;
                        open = false;
                        transactions = 0;
                    }
                }
                Step::Ddl(sql)
                    if self
                        .fence_rename
                        .as_ref()
                        .is_some_and(|r| sql.contains(r.as_str())) => {}
                Step::Ddl(sql) => {
                    return Err(MoveError::Unsupported(format!(
                        "the moved table was changed on its backend while it moved ({sql})"
                    ))
                    .into())
                }
                Step::Skip => {}
            }
        }
        self.commit_applied(open).await
    }

    /// Begins the applier's transaction on every part, unless `open`.
    pub(super) async fn open_applied(&mut self, open: &mut bool) -> Result<(), ProxyError> {
        if !*open {
            for i in 0..self.writers.len() {
                self.begin(i).await?;
            }
            *open = true;
        }
        Ok(())
    }

    /// A committed XA transaction's changes, as if its rows changed at its
    /// commit: its row locks kept every other writer off them meanwhile.
    pub(super) async fn apply_group(&mut self, group: Group) -> Result<(), ProxyError> {
        for change in group.into_changes()? {
            let (part, key, row) = change?;
            let w = &mut self.writers[part];
            w.pending.hold(key, row);
            if w.pending.is_full() {
                w.write_pending().await?;
            }
        }
        Ok(())
    }

    /// An XA transaction prepared on the source, not decided yet in the
    /// log read so far, that changed rows the move takes: the fence waits
    /// for its decision.
    pub fn undecided_touching(&self) -> Option<&Xid> {
        self.follower.touching()
    }

    /// Commits what was applied, the first part last with the checkpoint;
    /// `open`: the parts have a transaction open.
    pub(super) async fn commit_applied(&mut self, open: bool) -> Result<(), ProxyError> {
        if open {
            for w in &mut self.writers {
                w.write_pending().await?;
            }
        }
        self.checkpoint.applied = Some(self.applied_to().clone());
        if let Some(from) = self.follower.undecided_from(self.applied_to()) {
            self.checkpoint.undecided_from = from;
        }
        let save = self.save_statement();
        for i in (0..self.writers.len()).rev() {
            if i == 0 && !open {
                self.begin(0).await?;
            }
            let conn = &mut self.writers[i].conn;
            if i == 0 {
                exec(conn, &save).await?;
            }
            if open || i == 0 {
                exec(conn, "COMMIT").await?;
            }
        }
        Ok(())
    }

    pub(super) fn applied_to(&self) -> &BinlogPosition {
        self.dump.as_ref().expect("the dump is open").position()
    }

    /// How far the applier is behind `end`, in bytes of the same file.
    pub fn lag_bytes(&self, end: &BinlogPosition) -> u64 {
        match self.dump.as_ref().map(|d| d.position()) {
            Some(at) if at.file == end.file => end.offset.saturating_sub(at.offset),
            Some(_) => u64::MAX,
            None => 0,
        }
    }

    /// How long ago the source wrote the last change applied, while the
    /// applier is behind `end`; 0 when it is not.
    pub fn lag_seconds(&self, end: &BinlogPosition) -> u64 {
        let Some(dump) = self.dump.as_ref().filter(|_| self.lag_bytes(end) > 0) else {
            return 0;
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        match dump.timestamp() {
            0 => 0,
            written => now.saturating_sub(u64::from(written)),
        }
    }
}

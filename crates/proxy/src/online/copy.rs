//! The copy and the applier of one move, on connections of hscale's own:
//! the source's, which reads chunks each in a consistent snapshot, and one
//! per part the move writes (a move has one, a split two: the rows it takes
//! and the rest), which write the chunks' rows and the binlog's changes.
//! The first part's destination keeps the move's checkpoint
//! (`move_progress`) and changes it in the transaction of each write,
//! after the other parts have committed theirs: a move killed at any point
//! resumes from a checkpoint no part is behind, and applying a change again
//! ends where it ended (see hscale_moves::apply).
//!
//! Every part's server has a row of the job with the owner's epoch; each
//! write transaction locks it first and goes on only while it holds this
//! owner's epoch. An instance that takes the job over raises the epoch on
//! every part before it reads the checkpoint, which waits for a transaction
//! the old owner has open: an old owner that wakes up writes nothing more.

mod apply;

use std::time::{Duration, Instant};

use hscale_moves::{
    BinlogPosition, Checksum, Follower, MoveError, MovedTable, PendingChanges, RowFilter,
    TextValue, Undecided, Watched,
};

use super::binlog::{position_of, BinlogDump};
use crate::backend::BackendConn;
use crate::dictionary::store::{self, exec, ident, text_literal};
use crate::error::ProxyError;
use crate::shared::Cluster;

/// Where a move stands, as the destination records it.
#[derive(Debug, Clone, Default)]
pub struct Checkpoint {
    /// The key of the last row copied; `None`: none yet.
    pub copied_key: Option<Vec<TextValue>>,
    pub copy_done: bool,
    /// How far the applier has applied the source's binlog.
    pub applied: Option<BinlogPosition>,
    /// Where the earliest XA transaction that was prepared and undecided
    /// at `applied` starts in the log: a resumed applier reads from there
    /// to hold those transactions again, applying nothing up to `applied`.
    pub undecided_from: Option<BinlogPosition>,
    pub rows_copied: u64,
    /// The `@@server_id` of the source host whose binary log `applied` and
    /// `undecided_from` are positions in: after a failover or switchover
    /// of the source's backend they mean nothing on its new writer.
    pub source_server: Option<u64>,
}

/// How long a move waits for XA transactions prepared on its source before
/// it started to be decided, before it fails naming one.
const PREPARED_BEFORE_WAIT: Duration = Duration::from_secs(60);

/// One table a move writes: the rows of the source its filter takes.
pub struct Part {
    /// Its `destination` is this part's table.
    pub table: MovedTable,
    pub filter: Box<dyn RowFilter>,
    pub slot: usize,
}

struct Writer {
    part: Part,
    conn: Box<BackendConn>,
    /// The applier's changes not written yet.
    pending: PendingChanges,
}

impl Writer {
    async fn write_pending(&mut self) -> Result<(), ProxyError> {
        for sql in self.pending.take_statements(&self.part.table) {
            exec(&mut self.conn, &sql).await?;
        }
        Ok(())
    }
}

pub struct ChunkCopy {
    pub job: u64,
    epoch: u64,
    watched: Watched,
    source_slot: usize,
    source: Box<BackendConn>,
    /// The first keeps the checkpoint.
    writers: Vec<Writer>,
    dump: Option<BinlogDump>,
    /// Where the first chunk's dump starts: before every XA transaction
    /// that can be undecided at its snapshot.
    first_dump_from: Option<BinlogPosition>,
    /// What the applier does with each event (XA transactions held until
    /// decided); made when the dump opens.
    follower: Follower,
    pub checkpoint: Checkpoint,
    pub chunks_verified: u64,
    pub chunks_repaired: u64,
    checkpoints: String,
    /// The fence's own rename of the source table, which the applier meets
    /// in the binlog and passes over.
    pub fence_rename: Option<String>,
}

/// A connection for moved rows: values as stored both ways, TIMESTAMPs in
/// UTC.
pub async fn raw_connection(shared: &Cluster, slot: usize) -> Result<Box<BackendConn>, ProxyError> {
    let mut conn = crate::dictionary::rows_connection(shared, slot).await?;
    exec(&mut conn, "SET NAMES binary, time_zone = '+00:00'").await?;
    Ok(conn)
}

fn encode_key(key: &[TextValue]) -> String {
    let parts: Vec<String> = key
        .iter()
        .map(|v| match v {
            Some(bytes) => bytes.iter().map(|b| format!("{b:02x}")).collect(),
            None => "-".to_string(),
        })
        .collect();
    parts.join(",")
}

fn decode_key(text: &str) -> Option<Vec<TextValue>> {
    text.split(',')
        .map(|part| match part {
            "-" => Some(None),
            hex => (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
                .collect::<Option<Vec<u8>>>()
                .map(Some),
        })
        .collect()
}

impl ChunkCopy {
    /// Opens the source and every part, and reads the checkpoint the first
    /// part's destination holds (a new one if this is the move's first
    /// start).
    pub async fn open(
        shared: &Cluster,
        job: u64,
        epoch: u64,
        parts: Vec<Part>,
        watched: Watched,
        source_slot: usize,
    ) -> Result<ChunkCopy, ProxyError> {
        let mut source = raw_connection(shared, source_slot).await?;
        let mut writers = Vec::with_capacity(parts.len());
        for part in parts {
            let conn = raw_connection(shared, part.slot).await?;
            writers.push(Writer {
                part,
                conn,
                pending: PendingChanges::default(),
            });
        }
        if writers.is_empty() {
            return Err(MoveError::Unsupported("a move without a destination".into()).into());
        }
        let schema = ident(&shared.dictionary.schema);
        let checkpoints = format!("{schema}.move_progress");
        for (part, w) in writers.iter_mut().enumerate() {
            let conn = &mut w.conn;
            exec(conn, &format!("CREATE DATABASE IF NOT EXISTS {schema}")).await?;
            exec(conn, &format!("CREATE TABLE IF NOT EXISTS {checkpoints} (job BIGINT UNSIGNED NOT NULL, part TINYINT UNSIGNED NOT NULL, epoch BIGINT UNSIGNED NOT NULL, copied_key LONGTEXT NULL, copy_done BOOLEAN NOT NULL, applied VARCHAR(600) NULL, undecided_from VARCHAR(600) NULL, rows_copied BIGINT UNSIGNED NOT NULL, PRIMARY KEY (job, part)) ENGINE=InnoDB")).await?;
            exec(conn, &format!("ALTER TABLE {checkpoints} ADD COLUMN IF NOT EXISTS undecided_from VARCHAR(600) NULL AFTER applied")).await?;
            exec(conn, &format!("ALTER TABLE {checkpoints} ADD COLUMN IF NOT EXISTS source_server BIGINT UNSIGNED NULL")).await?;
            exec(conn, &format!("INSERT INTO {checkpoints} (job, part, epoch, copy_done, rows_copied) VALUES ({job}, {part}, {epoch}, FALSE, 0) ON DUPLICATE KEY UPDATE epoch = IF(epoch <= {epoch}, {epoch}, epoch)")).await?;
            let held = exec(
                conn,
                &format!("SELECT epoch FROM {checkpoints} WHERE job = {job} AND part = {part}"),
            )
            .await?;
            if store::text(&held, 0, 0) != epoch.to_string() {
                return Err(MoveError::Superseded { job }.into());
            }
        }
        let dest = &mut writers[0].conn;
        let rows = exec(
            dest,
            &format!("SELECT copied_key, copy_done, applied, rows_copied, undecided_from, source_server FROM {checkpoints} WHERE job = {job} AND part = 0"),
        )
        .await?;
        let checkpoint = match rows.first() {
            None => Checkpoint::default(),
            Some(row) => Checkpoint {
                copied_key: row[0]
                    .as_deref()
                    .and_then(|k| decode_key(&String::from_utf8_lossy(k))),
                copy_done: store::text(&rows, 0, 1) == "1",
                applied: row[2]
                    .as_deref()
                    .and_then(|p| BinlogPosition::parse(&String::from_utf8_lossy(p))),
                undecided_from: row[4]
                    .as_deref()
                    .and_then(|p| BinlogPosition::parse(&String::from_utf8_lossy(p))),
                rows_copied: store::text(&rows, 0, 3).parse().unwrap_or(0),
                source_server: store::text(&rows, 0, 5).parse().ok(),
            },
        };
        let server = store::text(&exec(&mut source, "SELECT @@server_id").await?, 0, 0)
            .parse()
            .ok();
        let positioned = checkpoint.applied.is_some() || checkpoint.undecided_from.is_some();
        // A checkpoint from before the column had none: its source is as
        // it was (no replica sets then).
        let elsewhere = checkpoint.source_server.is_some() && checkpoint.source_server != server;
        let checkpoint = match positioned && elsewhere {
            true => {
                tracing::warn!(job, "the move's source has another writer than its checkpoint's binlog positions are on: the copy starts again");
                Checkpoint {
                    source_server: server,
                    ..Checkpoint::default()
                }
            }
            false => Checkpoint {
                source_server: server,
                ..checkpoint
            },
        };
        let follower = Follower::new(Undecided::new(writers.len()), None);
        Ok(ChunkCopy {
            job,
            epoch,
            watched,
            source_slot,
            source,
            writers,
            dump: None,
            first_dump_from: None,
            follower,
            checkpoint,
            chunks_verified: 0,
            chunks_repaired: 0,
            checkpoints,
            fence_rename: None,
        })
    }

    /// The source's side of the statements: every part reads the same.
    fn source_table(&self) -> &MovedTable {
        &self.writers[0].part.table
    }

    /// The checkpoint's UPDATE, run in the transaction of a write.
    fn save_statement(&self) -> String {
        let c = &self.checkpoint;
        let key = c
            .copied_key
            .as_ref()
            .map_or("NULL".into(), |k| text_literal(&encode_key(k)));
        let position = |p: &Option<BinlogPosition>| {
            p.as_ref()
                .map_or("NULL".into(), |p| text_literal(&p.to_string()))
        };
        let source_server = c.source_server.map_or("NULL".into(), |s| s.to_string());
        format!(
            "UPDATE {} SET copied_key = {key}, copy_done = {}, applied = {}, undecided_from = {}, rows_copied = {}, source_server = {source_server} WHERE job = {} AND part = 0",
            self.checkpoints,
            c.copy_done,
            position(&c.applied),
            position(&c.undecided_from),
            c.rows_copied,
            self.job
        )
    }

    /// Every connection of the copy reaches its backend's writer of now: a
    /// host a failover or switchover replaced may take the service
    /// account's writes (read_only does not stop it) and they would be
    /// lost. The job then waits and resumes on the new writers.
    pub fn on_current_writers(&self, shared: &Cluster) -> Result<(), ProxyError> {
        let conns = std::iter::once((self.source_slot, &self.source))
            .chain(self.writers.iter().map(|w| (w.part.slot, &w.conn)));
        for (slot, conn) in conns {
            shared.pools[slot].ensure_current(conn)?;
        }
        Ok(())
    }

    /// Starts a write transaction on part `i`, which goes on only while
    /// this owner's epoch is the part's (the row stays locked until the
    /// transaction ends).
    async fn begin(&mut self, i: usize) -> Result<(), ProxyError> {
        let (job, epoch) = (self.job, self.epoch);
        let lock = format!(
            "SELECT epoch FROM {} WHERE job = {job} AND part = {i} FOR UPDATE",
            self.checkpoints
        );
        let conn = &mut self.writers[i].conn;
        exec(conn, "START TRANSACTION").await?;
        if store::text(&exec(conn, &lock).await?, 0, 0) != epoch.to_string() {
            exec(conn, "ROLLBACK").await?;
            return Err(MoveError::Superseded { job }.into());
        }
        Ok(())
    }

    /// A resumed move's applier: the dump starts where the checkpoint says
    /// the last owner's applier stood, before anything else reads it (a
    /// copy that was done copies no chunk that would start it).
    pub async fn resume_applier(&mut self, shared: &Cluster) -> Result<(), ProxyError> {
        if let Some(applied) = self.checkpoint.applied.clone() {
            self.dump(shared, &applied).await?;
        }
        Ok(())
    }

    /// Starts the binlog dump: where the applier stands (`applied`), or at
    /// `snapshot` for a move's first chunk, so that every change after it
    /// reaches the destination. The dump reads from earlier where XA
    /// transactions may be undecided there (`undecided_from`, or the first
    /// chunk's `first_dump_from`), applying nothing up to that point.
    async fn dump(
        &mut self,
        shared: &Cluster,
        snapshot: &BinlogPosition,
    ) -> Result<&mut BinlogDump, ProxyError> {
        if self.dump.is_none() {
            let c = &mut self.checkpoint;
            if c.applied.is_none() {
                c.applied = Some(snapshot.clone());
                c.undecided_from = self.first_dump_from.take();
            }
            let applied = c.applied.clone().expect("set above");
            let start = match &c.undecided_from {
                Some(from) if *from < applied => from.clone(),
                _ => applied.clone(),
            };
            self.follower = Follower::new(Undecided::new(self.writers.len()), Some(applied));
            let dump =
                BinlogDump::open(shared, self.source_slot, start, self.watched.clone()).await?;
            self.dump = Some(dump);
        }
        Ok(self.dump.as_mut().expect("opened above"))
    }

    /// A place in the source's log before every XA transaction that can
    /// still be undecided at a snapshot taken after this returns: the end
    /// of the log, once each transaction XA RECOVER listed then is decided
    /// (one prepared before it and undecided at the snapshot would be
    /// listed, and still be there).
    async fn before_undecided(&mut self) -> Result<BinlogPosition, ProxyError> {
        let end = super::binlog::end_of_log(&mut self.source).await?;
        let prepared = exec(&mut self.source, "XA RECOVER FORMAT='SQL'").await?;
        let started = Instant::now();
        loop {
            let now = exec(&mut self.source, "XA RECOVER FORMAT='SQL'").await?;
            let Some(waited) = prepared.iter().find(|xid| now.contains(xid)) else {
                return Ok(end);
            };
            if started.elapsed() >= PREPARED_BEFORE_WAIT {
                let xid = waited.last().cloned().flatten().unwrap_or_default();
                return Err(MoveError::Unsupported(format!(
                    "the XA transaction {} on backend {} stayed prepared for {PREPARED_BEFORE_WAIT:?}: a move starts once the transactions prepared before it are decided (XA COMMIT or XA ROLLBACK it)",
                    String::from_utf8_lossy(&xid),
                    self.source.backend
                ))
                .into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Copies the next chunk of `rows` rows under a snapshot, brings the
    /// applier to the snapshot's position, and compares the chunk on both
    /// sides there, copying it again if they differ. False when the copy
    /// is complete.
    pub async fn copy_chunk(&mut self, shared: &Cluster, rows: usize) -> Result<bool, ProxyError> {
        self.on_current_writers(shared)?;
        if self.dump.is_none() && self.checkpoint.applied.is_none() {
            self.first_dump_from = Some(self.before_undecided().await?);
        }
        exec(
            &mut self.source,
            "START TRANSACTION WITH CONSISTENT SNAPSHOT",
        )
        .await?;
        let result = self.copy_chunk_in_snapshot(shared, rows).await;
        let ended = exec(&mut self.source, "COMMIT").await;
        let more = result?;
        ended?;
        Ok(more)
    }

    async fn copy_chunk_in_snapshot(
        &mut self,
        shared: &Cluster,
        rows: usize,
    ) -> Result<bool, ProxyError> {
        let status = exec(
            &mut self.source,
            "SELECT VARIABLE_VALUE FROM information_schema.SESSION_STATUS WHERE VARIABLE_NAME IN ('BINLOG_SNAPSHOT_FILE', 'BINLOG_SNAPSHOT_POSITION') ORDER BY VARIABLE_NAME",
        )
        .await?;
        let snapshot = position_of(
            &vec![vec![
                status.first().and_then(|r| r[0].clone()),
                status.get(1).and_then(|r| r[0].clone()),
            ]],
            self.source.backend,
        )?;
        self.dump(shared, &snapshot).await?;
        let after = self.checkpoint.copied_key.clone();
        let chunk_query = self.source_table().chunk_query(after.as_deref(), rows);
        let chunk = exec(&mut self.source, &chunk_query).await?;
        let Some(last) = chunk.last() else {
            // At the snapshot the source has no row past the last key: at
            // the same position no part may have one either.
            self.apply_until(&snapshot).await?;
            if self.clear_tail(after.as_deref()).await? {
                tracing::warn!(
                    job = self.job,
                    "rows past the copy's end on the destination: removed"
                );
                self.chunks_repaired += 1;
            }
            self.checkpoint.copy_done = true;
            return self.commit_applied(false).await.map(|_| false);
        };
        let up_to = self.source_table().key_of(last);
        self.checkpoint.copied_key = Some(up_to.clone());
        self.checkpoint.rows_copied += chunk.len() as u64;
        self.write_chunk(&chunk, None).await?;
        // The destination at the snapshot's position: the chunk must read
        // the same on both sides.
        self.apply_until(&snapshot).await?;
        let range = (after.as_deref(), up_to.as_slice());
        if self.source_sum(range).await? != self.parts_sum(range).await? {
            tracing::warn!(
                job = self.job,
                "a chunk differs on the destination: copied again"
            );
            let again_query = self
                .source_table()
                .chunk_query(after.as_deref(), chunk.len());
            let again = exec(&mut self.source, &again_query).await?;
            self.write_chunk(&again, Some(range)).await?;
            self.chunks_repaired += 1;
        }
        self.chunks_verified += 1;
        Ok(true)
    }

    /// Writes a chunk's rows to the parts that take them, each in a
    /// transaction, the first last with the checkpoint; with `clear`,
    /// the chunk's key range is emptied first.
    async fn write_chunk(
        &mut self,
        chunk: &[Vec<TextValue>],
        clear: Option<(Option<&[TextValue]>, &[TextValue])>,
    ) -> Result<(), ProxyError> {
        let save = self.save_statement();
        for i in (0..self.writers.len()).rev() {
            self.begin(i).await?;
            let w = &mut self.writers[i];
            if let Some((after, up_to)) = clear {
                exec(&mut w.conn, &w.part.table.clear_statement(after, up_to)).await?;
            }
            let taken = chunk.iter().filter(|row| w.part.filter.takes_text(row));
            if let Some(sql) = w.part.table.copy_statement(taken) {
                exec(&mut w.conn, &sql).await?;
            }
            if i == 0 {
                exec(&mut w.conn, &save).await?;
            }
            exec(&mut w.conn, "COMMIT").await?;
        }
        Ok(())
    }

    /// Removes every part's rows past the last key copied; true if there
    /// were any.
    async fn clear_tail(&mut self, after: Option<&[TextValue]>) -> Result<bool, ProxyError> {
        let mut removed = false;
        for i in 0..self.writers.len() {
            self.begin(i).await?;
            let w = &mut self.writers[i];
            exec(&mut w.conn, &w.part.table.clear_after_statement(after)).await?;
            removed |= store::text(&exec(&mut w.conn, "SELECT ROW_COUNT()").await?, 0, 0) != "0";
            exec(&mut w.conn, "COMMIT").await?;
        }
        Ok(removed)
    }

    async fn source_sum(
        &mut self,
        (after, up_to): (Option<&[TextValue]>, &[TextValue]),
    ) -> Result<Option<Checksum>, ProxyError> {
        let sql = self.source_table().checksum_query(false, after, up_to);
        let rows = exec(&mut self.source, &sql).await?;
        Ok(rows.first().and_then(|r| Checksum::parse(r)))
    }

    /// The parts' sums over a key range, added up: what the source's is
    /// when every row is in the one part that takes it.
    async fn parts_sum(
        &mut self,
        (after, up_to): (Option<&[TextValue]>, &[TextValue]),
    ) -> Result<Option<Checksum>, ProxyError> {
        let mut total = Checksum::default();
        for w in &mut self.writers {
            let sql = w.part.table.checksum_query(true, after, up_to);
            let rows = exec(&mut w.conn, &sql).await?;
            match rows.first().and_then(|r| Checksum::parse(r)) {
                Some(sum) => total = total.and(sum),
                None => return Ok(None),
            }
        }
        Ok(Some(total))
    }

    /// The busiest of the servers the move reads and writes, by
    /// `Threads_running`.
    pub async fn threads_running(&mut self) -> Result<u64, ProxyError> {
        const SQL: &str = "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'THREADS_RUNNING'";
        let mut most: u64 = store::text(&exec(&mut self.source, SQL).await?, 0, 0)
            .parse()
            .unwrap_or(0);
        for w in &mut self.writers {
            let running = store::text(&exec(&mut w.conn, SQL).await?, 0, 0);
            most = most.max(running.parse().unwrap_or(0));
        }
        Ok(most)
    }

    /// The source's connection, for its end of log and the fence.
    pub fn source(&mut self) -> &mut BackendConn {
        &mut self.source
    }

    /// Forgets the checkpoint once the move is over.
    pub async fn finish(mut self) -> Result<(), ProxyError> {
        let sql = format!("DELETE FROM {} WHERE job = {}", self.checkpoints, self.job);
        for w in &mut self.writers {
            exec(&mut w.conn, &sql).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_stored_and_read_back_as_it_was() {
        let key = vec![
            Some(b"a,b".to_vec()),
            Some(vec![]),
            None,
            Some(vec![0, 255]),
        ];
        assert_eq!(decode_key(&encode_key(&key)), Some(key));
    }
}

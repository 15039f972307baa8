//! The copy and the applier of one move, on two connections of hscale's
//! own: the source's, which reads chunks each in a consistent snapshot, and
//! the destination's, which writes them and the binlog's changes. The
//! destination keeps the move's checkpoint (`move_checkpoints`) and
//! changes it in the transaction of each write, so that a move killed at
//! any point resumes where its last write left it.

use hscale_moves::{BinlogPosition, Decoded, EveryRow, MoveError, MovedTable, TextValue, Watched};

use super::binlog::{position_of, BinlogDump};
use crate::backend::BackendConn;
use crate::dictionary::store::{self, exec, ident, text_literal};
use crate::error::ProxyError;
use crate::shared::Shared;

/// Where a move stands, as the destination records it.
#[derive(Debug, Clone, Default)]
pub struct Checkpoint {
    /// The key of the last row copied; `None`: none yet.
    pub copied_key: Option<Vec<TextValue>>,
    pub copy_done: bool,
    /// How far the applier has applied the source's binlog.
    pub applied: Option<BinlogPosition>,
    pub rows_copied: u64,
}

/// How many source transactions the applier groups into one of its own.
const TRANSACTIONS_PER_COMMIT: usize = 200;

pub struct Copy {
    pub job: u64,
    pub table: MovedTable,
    watched: Watched,
    source_slot: usize,
    source: Box<BackendConn>,
    dest: Box<BackendConn>,
    dump: Option<BinlogDump>,
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
pub async fn raw_connection(shared: &Shared, slot: usize) -> Result<Box<BackendConn>, ProxyError> {
    let mut conn = crate::dictionary::own_connection(shared, slot).await?;
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

impl Copy {
    /// Opens both sides and reads the checkpoint the destination holds
    /// (a new one if this is the move's first start).
    pub async fn open(
        shared: &Shared,
        job: u64,
        table: MovedTable,
        watched: Watched,
        source_slot: usize,
        dest_slot: usize,
    ) -> Result<Copy, ProxyError> {
        let source = raw_connection(shared, source_slot).await?;
        let mut dest = raw_connection(shared, dest_slot).await?;
        let schema = ident(&shared.dictionary.schema);
        exec(
            &mut dest,
            &format!("CREATE DATABASE IF NOT EXISTS {schema}"),
        )
        .await?;
        exec(&mut dest, &format!("CREATE TABLE IF NOT EXISTS {schema}.move_checkpoints (job BIGINT UNSIGNED NOT NULL PRIMARY KEY, copied_key LONGTEXT NULL, copy_done BOOLEAN NOT NULL, applied VARCHAR(600) NULL, rows_copied BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB")).await?;
        let checkpoints = format!("{schema}.move_checkpoints");
        let rows = exec(
            &mut dest,
            &format!("SELECT copied_key, copy_done, applied, rows_copied FROM {checkpoints} WHERE job = {job}"),
        )
        .await?;
        let checkpoint = match rows.first() {
            None => {
                exec(&mut dest, &format!("INSERT INTO {checkpoints} (job, copy_done, rows_copied) VALUES ({job}, FALSE, 0)")).await?;
                Checkpoint::default()
            }
            Some(row) => Checkpoint {
                copied_key: row[0]
                    .as_deref()
                    .and_then(|k| decode_key(&String::from_utf8_lossy(k))),
                copy_done: store::text(&rows, 0, 1) == "1",
                applied: row[2]
                    .as_deref()
                    .and_then(|p| BinlogPosition::parse(&String::from_utf8_lossy(p))),
                rows_copied: store::text(&rows, 0, 3).parse().unwrap_or(0),
            },
        };
        Ok(Copy {
            job,
            table,
            watched,
            source_slot,
            source,
            dest,
            dump: None,
            checkpoint,
            chunks_verified: 0,
            chunks_repaired: 0,
            checkpoints,
            fence_rename: None,
        })
    }

    /// The checkpoint's UPDATE, run in the transaction of a write.
    fn save_statement(&self) -> String {
        let c = &self.checkpoint;
        let key = c
            .copied_key
            .as_ref()
            .map_or("NULL".into(), |k| text_literal(&encode_key(k)));
        let applied = c
            .applied
            .as_ref()
            .map_or("NULL".into(), |p| text_literal(&p.to_string()));
        format!(
            "UPDATE {} SET copied_key = {key}, copy_done = {}, applied = {applied}, rows_copied = {} WHERE job = {}",
            self.checkpoints, c.copy_done, c.rows_copied, self.job
        )
    }

    /// Starts the binlog dump where the applier stands, or at `snapshot`
    /// for a move's first chunk: every change after it reaches the
    /// destination.
    async fn dump(
        &mut self,
        shared: &Shared,
        snapshot: &BinlogPosition,
    ) -> Result<&mut BinlogDump, ProxyError> {
        if self.dump.is_none() {
            let start = self
                .checkpoint
                .applied
                .get_or_insert_with(|| snapshot.clone())
                .clone();
            let dump =
                BinlogDump::open(shared, self.source_slot, start, self.watched.clone()).await?;
            self.dump = Some(dump);
        }
        Ok(self.dump.as_mut().expect("opened above"))
    }

    /// Copies the next chunk of `rows` rows under a snapshot, brings the
    /// applier to the snapshot's position, and compares the chunk on both
    /// sides there, copying it again if they differ. False when the copy
    /// is complete.
    pub async fn copy_chunk(&mut self, shared: &Shared, rows: usize) -> Result<bool, ProxyError> {
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
        shared: &Shared,
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
        let chunk = exec(
            &mut self.source,
            &self.table.chunk_query(after.as_deref(), rows),
        )
        .await?;
        let Some(last) = chunk.last() else {
            self.checkpoint.copy_done = true;
            self.apply_until(&snapshot).await?;
            return Ok(false);
        };
        let up_to = self.table.key_of(last);
        exec(&mut self.dest, "START TRANSACTION").await?;
        if let Some(sql) = self.table.copy_statement(&chunk) {
            exec(&mut self.dest, &sql).await?;
        }
        self.checkpoint.copied_key = Some(up_to.clone());
        self.checkpoint.rows_copied += chunk.len() as u64;
        let save = self.save_statement();
        exec(&mut self.dest, &save).await?;
        exec(&mut self.dest, "COMMIT").await?;
        // The destination at the snapshot's position: the chunk must read
        // the same on both sides.
        self.apply_until(&snapshot).await?;
        let source_sum = exec(
            &mut self.source,
            &self.table.checksum_query(false, after.as_deref(), &up_to),
        )
        .await?;
        let dest_sum = exec(
            &mut self.dest,
            &self.table.checksum_query(true, after.as_deref(), &up_to),
        )
        .await?;
        if source_sum != dest_sum {
            tracing::warn!(
                job = self.job,
                "a chunk differs on the destination: copied again"
            );
            let again = exec(
                &mut self.source,
                &self.table.chunk_query(after.as_deref(), chunk.len()),
            )
            .await?;
            exec(&mut self.dest, "START TRANSACTION").await?;
            exec(
                &mut self.dest,
                &self.table.clear_statement(after.as_deref(), &up_to),
            )
            .await?;
            if let Some(sql) = self.table.copy_statement(&again) {
                exec(&mut self.dest, &sql).await?;
            }
            exec(&mut self.dest, "COMMIT").await?;
            self.chunks_repaired += 1;
        }
        self.chunks_verified += 1;
        Ok(true)
    }

    /// Applies the source's changes until the applier reaches `target`, a
    /// transaction's end; each group of transactions commits on the
    /// destination with the checkpoint.
    pub async fn apply_until(&mut self, target: &BinlogPosition) -> Result<(), ProxyError> {
        if self.dump.is_none() {
            return Ok(());
        }
        let mut open = false;
        let mut transactions = 0;
        while self.applied_to() < target {
            let dump = self.dump.as_mut().expect("checked above");
            match dump.next().await? {
                Decoded::Rows(changes) => {
                    if !open {
                        exec(&mut self.dest, "START TRANSACTION").await?;
                        open = true;
                    }
                    for sql in self.table.apply_statements(&changes, &EveryRow)? {
                        exec(&mut self.dest, &sql).await?;
                    }
                }
                Decoded::Commit => {
                    transactions += 1;
                    if open && transactions >= TRANSACTIONS_PER_COMMIT {
                        self.checkpoint.applied = Some(self.applied_to().clone());
                        let save = self.save_statement();
                        exec(&mut self.dest, &save).await?;
                        exec(&mut self.dest, "COMMIT").await?;
                        open = false;
                        transactions = 0;
                    }
                }
                Decoded::Ddl(sql)
                    if self
                        .fence_rename
                        .as_ref()
                        .is_some_and(|r| sql.contains(r.as_str())) => {}
                Decoded::Ddl(sql) => {
                    return Err(MoveError::Unsupported(format!(
                        "the moved table was changed on its backend while it moved ({sql})"
                    ))
                    .into())
                }
                Decoded::Other => {}
            }
        }
        self.checkpoint.applied = Some(self.applied_to().clone());
        if !open {
            exec(&mut self.dest, "START TRANSACTION").await?;
        }
        let save = self.save_statement();
        exec(&mut self.dest, &save).await?;
        exec(&mut self.dest, "COMMIT").await.map(drop)
    }

    fn applied_to(&self) -> &BinlogPosition {
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

    /// The source's connection, for its end of log and the fence.
    pub fn source(&mut self) -> &mut BackendConn {
        &mut self.source
    }

    /// Forgets the checkpoint once the move is over.
    pub async fn finish(mut self) -> Result<(), ProxyError> {
        exec(
            &mut self.dest,
            &format!("DELETE FROM {} WHERE job = {}", self.checkpoints, self.job),
        )
        .await
        .map(drop)
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

//! A binlog dump from a backend: hscale connects as a replica would and
//! reads the source's row changes from a position on. The events are
//! decoded by `hscale_moves::Decoder`; this file only moves packets.

use hscale_moves::{BinlogPosition, Decoded, Decoder, MoveError, Watched};

use crate::backend::BackendConn;
use crate::dictionary::{rows_connection, store};
use crate::error::ProxyError;
use crate::shared::Cluster;

/// What hscale understands of MariaDB's own events: their GTIDs (4), so
/// that the server sends them as they are rather than rewritten.
const MARIADB_CAPABILITY: u32 = 4;

pub struct BinlogDump {
    conn: Box<BackendConn>,
    decoder: Decoder,
}

/// What a backend's binary log lacks to feed a move; `None` when it can.
pub async fn lacks(conn: &mut BackendConn) -> Result<Option<MoveError>, ProxyError> {
    let rows = store::exec(
        conn,
        "SELECT @@global.log_bin, @@global.binlog_format, @@global.binlog_row_image",
    )
    .await?;
    let (log_bin, format, image) = (
        store::text(&rows, 0, 0),
        store::text(&rows, 0, 1),
        store::text(&rows, 0, 2),
    );
    Ok(hscale_moves::binlog_refusal(
        conn.backend,
        &log_bin,
        &format,
        &image,
    ))
}

/// Where the binary log ends now.
pub async fn end_of_log(conn: &mut BackendConn) -> Result<BinlogPosition, ProxyError> {
    let rows = store::exec(conn, "SHOW MASTER STATUS").await?;
    position_of(&rows, conn.backend)
}

/// `file, position` in the first row.
pub fn position_of(
    rows: &crate::backend::Rows,
    backend: u32,
) -> Result<BinlogPosition, ProxyError> {
    let file = store::text(rows, 0, 0);
    match store::text(rows, 0, 1).parse() {
        Ok(offset) if !file.is_empty() => Ok(BinlogPosition::new(file, offset)),
        _ => Err(MoveError::Binlog(format!(
            "backend {backend} did not tell its binlog position"
        ))
        .into()),
    }
}

impl BinlogDump {
    /// Starts reading `slot`'s binary log at `start` for `watched`'s rows.
    pub async fn open(
        shared: &Cluster,
        slot: usize,
        start: BinlogPosition,
        watched: Watched,
    ) -> Result<BinlogDump, ProxyError> {
        let mut conn = rows_connection(shared, slot).await?;
        let checksum = store::exec(&mut conn, "SELECT @@global.binlog_checksum").await?;
        let checksums = !store::text(&checksum, 0, 0).eq_ignore_ascii_case("NONE");
        for sql in [
            "SET @master_binlog_checksum = @@global.binlog_checksum",
            &format!("SET @mariadb_slave_capability = {MARIADB_CAPABILITY}"),
        ] {
            store::exec(&mut conn, sql).await?;
        }
        // A replica's server id; two dumps with one id end each other.
        let server_id = rand::random::<u32>() | 0x8000_0000;
        let offset = u32::try_from(start.offset)
            .map_err(|_| MoveError::Binlog(format!("position {start} is past 4 GiB")))?;
        let mut command = Vec::with_capacity(11 + start.file.len());
        command.push(hscale_wire::command::BINLOG_DUMP);
        command.extend_from_slice(&offset.to_le_bytes());
        command.extend_from_slice(&0u16.to_le_bytes());
        command.extend_from_slice(&server_id.to_le_bytes());
        command.extend_from_slice(start.file.as_bytes());
        let backend = conn.backend;
        conn.send_command(&command)
            .await
            .map_err(|source| crate::backend::BackendError::Lost { backend, source })?;
        Ok(BinlogDump {
            conn,
            decoder: Decoder::new(start, watched, checksums),
        })
    }

    /// The position after the last event read.
    pub fn position(&self) -> &BinlogPosition {
        self.decoder.position()
    }

    /// When the source wrote the last event read (seconds since the epoch).
    pub fn timestamp(&self) -> u32 {
        self.decoder.timestamp()
    }

    /// The next event; waits for the source to write one.
    pub async fn next(&mut self) -> Result<Decoded, ProxyError> {
        let backend = self.conn.backend;
        let lost = |source| crate::backend::BackendError::Lost { backend, source };
        let packet = self
            .conn
            .stream
            .read_packet()
            .await
            .map_err(lost)?
            .ok_or_else(|| lost(hscale_wire::WireError::Closed))?;
        match packet.payload.first() {
            Some(0x00) => Ok(self.decoder.decode(&packet.payload[1..])?),
            Some(0xff) => {
                let error =
                    hscale_wire::packets::ErrorPacket::parse(&packet.payload).map_err(lost)?;
                Err(MoveError::Binlog(format!("backend {backend}: {}", error.message)).into())
            }
            _ => Err(MoveError::Binlog(format!("backend {backend} ended its binlog dump")).into()),
        }
    }
}

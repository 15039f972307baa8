//! SHOW [FULL] TABLES where partitioned tables live: the main backend's
//! answer without the physical tables, with the logical ones, in name order.

use bytes::Bytes;
use hscale_planner::ShowTables;
use hscale_wire::resultset::{parse_text_row, write_text_row};
use hscale_wire::scan::Completion;

use super::slots::Needs;
use super::Session;
use crate::backend::BackendError;
use crate::error::ProxyError;
use crate::exec::{read_answer, Answer, RelayError};

impl Session {
    pub(super) async fn show_tables(
        &mut self,
        payload: Bytes,
        show: ShowTables,
    ) -> Result<(), ProxyError> {
        let main = self.shared.main;
        let mut lease = self.checkout(main, Needs::default()).await?;
        let answer = match read_answer(&mut lease.conn, &payload).await {
            Ok(answer) => answer,
            Err(RelayError::Backend { source, .. }) => {
                let backend = lease.conn.backend;
                self.forget_connection_state(main);
                return Err(ProxyError::Backend(BackendError::Lost { backend, source }));
            }
            Err(RelayError::Client(e)) => return Err(ProxyError::Client(e)),
        };
        self.finish_command(main, lease, &Completion::default());
        let (header, rows, end) = match answer {
            Answer::Packet(packet) => {
                self.client.send_packet(1, &packet).await?;
                return Ok(());
            }
            Answer::Rows { header, rows, end } => (header, rows, end),
        };
        let columns = if show.full { 2 } else { 1 };
        let mut named: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(rows.len() + show.add.len());
        for row in rows {
            let name = parse_text_row(&row, columns)
                .and_then(|mut values| values.swap_remove(0))
                .unwrap_or_default();
            if !show.hide.iter().any(|h| h.as_bytes() == name.as_slice()) {
                named.push((name, row.to_vec()));
            }
        }
        for name in &show.add {
            let mut row = Vec::new();
            let mut values = vec![Some(name.clone())];
            if show.full {
                values.push(Some("BASE TABLE".into()));
            }
            write_text_row(&values, &mut row);
            named.push((name.clone().into_bytes(), row));
        }
        named.sort();
        let mut seq = 1;
        for packet in header
            .iter()
            .map(|p| &p[..])
            .chain(named.iter().map(|(_, row)| &row[..]))
        {
            seq = self.client.queue_packet(seq, packet);
        }
        self.client.send_packet(seq, &end).await?;
        Ok(())
    }
}

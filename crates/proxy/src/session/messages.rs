//! SHOW WARNINGS and SHOW ERRORS after a statement that ran on several
//! connections. Each connection keeps only its own part's messages, and a
//! part run after another on the same connection replaces them, so hscale
//! reads each part's list as soon as the part ends with warnings or an error
//! (before its connection runs anything else) and answers the client's
//! SHOW WARNINGS from the lists joined, as long as the messages stay the
//! previous statement's.

use bytes::Bytes;
use hscale_wire::packets::write_result_end;
use hscale_wire::resultset::{text_result, text_values, ColumnType};

use super::client::Client;
use hscale_planner::MessagesRead;
use hscale_wire::command;
use hscale_wire::WireError;

use crate::backend::BackendConn;
use crate::error::ProxyError;
use crate::exec::{read_answer, Answer, RelayError};

/// The messages the parts of a statement left, in the order of the parts.
#[derive(Debug, Default)]
pub(super) struct Gathered {
    /// SHOW WARNINGS' column count and definitions (and their EOF) as the
    /// first part's connection answered them: what the client's would.
    header: Vec<Bytes>,
    rows: Vec<Bytes>,
    /// Lists joined so far.
    lists: usize,
    /// The session's max_error_count, which caps the list as the server's
    /// own is capped: read once a second list joins the first.
    limit: Option<usize>,
    /// @@warning_count and @@error_count summed over the parts: past
    /// max_error_count the lists stop and the counts go on.
    warnings: u64,
    errors: u64,
}

/// ER_CANNOT_ADD_FOREIGN: what hscale warns of itself is a foreign key it
/// could not keep (`online::Finished::notes`).
const FOREIGN_KEY_LEFT_OUT: u16 = 1215;

impl Gathered {
    /// The warnings of a command hscale answered itself, listed as SHOW
    /// WARNINGS lists a server's.
    pub(super) fn own(warnings: &[String], deprecate_eof: bool, status: u16) -> Gathered {
        let columns = [
            ("Level", ColumnType::Text),
            ("Code", ColumnType::Integer),
            ("Message", ColumnType::Text),
        ];
        let rows: Vec<Vec<Option<String>>> = warnings
            .iter()
            .map(|message| {
                let code = FOREIGN_KEY_LEFT_OUT.to_string();
                vec![Some("Warning".into()), Some(code), Some(message.clone())]
            })
            .collect();
        let mut packets = text_result(&columns, &rows, deprecate_eof, status);
        packets.pop();
        let rows = packets.split_off(1 + columns.len() + usize::from(!deprecate_eof));
        Gathered {
            header: packets.into_iter().map(Bytes::from).collect(),
            rows: rows.into_iter().map(Bytes::from).collect(),
            lists: 1,
            limit: None,
            warnings: warnings.len() as u64,
            errors: 0,
        }
    }
}

impl super::Backends {
    /// Answers SHOW WARNINGS or SHOW ERRORS (or the count, `sql` naming its
    /// column) from the gathered lists; false when there are none to answer
    /// from.
    pub(super) async fn answer_gathered(
        &mut self,
        client: &mut Client,
        read: MessagesRead,
        sql: &[u8],
    ) -> Result<bool, ProxyError> {
        let Some(gathered) = self.gathered.as_ref().filter(|g| !g.header.is_empty()) else {
            return Ok(false);
        };
        let deprecate_eof = client.deprecate_eof();
        if let Some(column) = read.count_column(sql) {
            let count = match read.errors_only {
                true => gathered.errors,
                false => gathered.warnings,
            };
            let columns = [(column.as_ref(), ColumnType::Count)];
            let rows = [vec![Some(count.to_string())]];
            let mut seq = 1;
            for packet in text_result(&columns, &rows, deprecate_eof, self.status_flags()) {
                seq = client.queue_packet(seq, &packet);
            }
            client.flush().await?;
            return Ok(true);
        }
        let is_error = |row: &Bytes| {
            text_values(row, 1)
                .and_then(|values| values.into_iter().next().flatten())
                .is_some_and(|level| row[level].eq_ignore_ascii_case(b"error"))
        };
        let rows: Vec<Bytes> = gathered
            .rows
            .iter()
            .filter(|row| !read.errors_only || is_error(row))
            .skip(read.offset)
            .take(read.limit.unwrap_or(usize::MAX))
            .cloned()
            .collect();
        let header = gathered.header.clone();
        let mut seq = 1;
        for packet in header.iter().chain(rows.iter()) {
            seq = client.queue_packet(seq, packet);
        }
        let mut end = Vec::with_capacity(16);
        write_result_end(deprecate_eof, self.status_flags(), &mut end);
        client.send_packet(seq, &end).await?;
        Ok(true)
    }
}

impl super::Backends {
    /// Begins gathering the messages of a statement that runs on several
    /// connections, forgetting those of the statement before.
    pub(super) fn gather_from_here(&mut self) {
        self.gathered = Some(Gathered::default());
    }

    /// Joins the messages a part left on `conn` to the statement's. Run
    /// after a part that ended with warnings or an error, before its
    /// connection runs anything else. An error: the connection failed.
    pub(super) async fn gather_messages(
        &mut self,
        conn: &mut BackendConn,
    ) -> Result<(), WireError> {
        let Some(gathered) = &self.gathered else {
            return Ok(());
        };
        let read_limit = gathered.lists > 0 && gathered.limit.is_none();
        let counts = match ask(conn, "SELECT @@warning_count, @@error_count").await? {
            Answer::Rows { rows, .. } => rows.first().and_then(|row| {
                let values = text_values(row, 2)?;
                let number = |i: usize| -> Option<u64> {
                    let at = values.get(i)?.clone()?;
                    std::str::from_utf8(&row[at]).ok()?.parse().ok()
                };
                Some((number(0)?, number(1)?))
            }),
            Answer::Packet(_) => None,
        };
        let Some((warnings, errors)) = counts else {
            self.gathered = None;
            return Ok(());
        };
        let Answer::Rows { header, rows, .. } = ask(conn, "SHOW WARNINGS").await? else {
            // Refused: what SHOW WARNINGS would list is not known.
            self.gathered = None;
            return Ok(());
        };
        let limit = match read_limit {
            true => match ask(conn, "SELECT @@max_error_count").await? {
                Answer::Rows { rows, .. } => rows.first().and_then(|row| {
                    let value = text_values(row, 1)?.into_iter().next()??;
                    std::str::from_utf8(&row[value]).ok()?.parse::<usize>().ok()
                }),
                Answer::Packet(_) => None,
            },
            false => None,
        };
        let Some(gathered) = self
            .gathered
            .as_mut()
            .filter(|_| !read_limit || limit.is_some())
        else {
            self.gathered = None;
            return Ok(());
        };
        if gathered.header.is_empty() {
            gathered.header = header;
        }
        gathered.lists += 1;
        gathered.warnings += warnings;
        gathered.errors += errors;
        gathered.limit = gathered.limit.or(limit);
        gathered.rows.extend(rows);
        if let Some(limit) = gathered.limit {
            gathered.rows.truncate(limit);
        }
        Ok(())
    }
}

/// A query hscale runs for itself on `conn`, its answer read whole.
async fn ask(conn: &mut BackendConn, sql: &str) -> Result<Answer, WireError> {
    read_answer(conn, &command::query(sql))
        .await
        .map_err(|e| match e {
            RelayError::Backend { source, .. } | RelayError::Client(source) => source,
        })
}

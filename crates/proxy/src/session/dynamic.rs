//! Dynamic SQL as the planner read it (`hscale_planner::Dynamic`): the text
//! of an EXECUTE IMMEDIATE runs as the client's statement; statements
//! prepared from text that hscale routes or guards are kept here, by name,
//! and planned at each EXECUTE; what hscale cannot read runs as written for
//! admins only. And XA RECOVER, which lists the client's transactions, not
//! hscale's own branches.

use std::collections::HashMap;

use bytes::Bytes;
use hscale_planner::{Dynamic, Plan, Refusal, Using, XA_FORMAT_ID};
use hscale_wire::frame::read_lenenc;
use hscale_wire::resultset::parse_text_row;

use super::Session;
use crate::error::ProxyError;
use crate::exec::Answer;
use hscale_wire::command;

/// Statements prepared with PREPARE ... FROM text that hscale keeps: by
/// name (lower-cased, as the server compares them), their text.
#[derive(Default)]
pub struct SqlStatements(HashMap<String, String>);

impl SqlStatements {
    pub fn clear(&mut self) {
        self.0.clear();
    }
}

impl Session {
    /// `server`: the plan that runs the statement as written on the main
    /// backend, where the server is to answer it.
    pub(super) async fn dynamic(
        &mut self,
        dynamic: Dynamic,
        server: Plan,
        payload: Bytes,
    ) -> Result<(), ProxyError> {
        match dynamic {
            Dynamic::Run(text) => self.run_text(&text).await,
            Dynamic::Prepare {
                name,
                text: Some(text),
            } => {
                self.memo.sql_statements.0.insert(name, text);
                self.backends.send_ok(&mut self.client, ).await
            }
            Dynamic::Prepare { name, text: None } => {
                self.memo.sql_statements.0.remove(&name);
                Box::pin(self.run_plan(server, payload)).await
            }
            Dynamic::Execute { name, using } => {
                let Some(text) = self.memo.sql_statements.0.get(&name).cloned() else {
                    return Box::pin(self.run_plan(server, payload)).await;
                };
                let text = match using {
                    Using::Literals(values) if values.is_empty() => text,
                    Using::Literals(values) => {
                        hscale_planner::with_literals(text.as_bytes(), self.backends.quoting, &values)
                            .and_then(|filled| String::from_utf8(filled).ok())
                            .ok_or_else(|| refused("EXECUTE whose USING values do not match its statement's parameters"))?
                    }
                    Using::Unread => {
                        return Err(refused(&format!(
                            "EXECUTE {name} USING values hscale cannot read (user variables or expressions): its statement is one hscale routes; pass literals, or prepare it with the binary protocol"
                        )))
                    }
                };
                self.run_text(&text).await
            }
            Dynamic::Deallocate { name } => match self.memo.sql_statements.0.remove(&name) {
                Some(_) => self.backends.send_ok(&mut self.client, ).await,
                None => Box::pin(self.run_plan(server, payload)).await,
            },
            Dynamic::Unread { .. } if self.client.admin => Box::pin(self.run_plan(server, payload)).await,
            Dynamic::Unread { what } => Err(refused(&format!(
                "{what}: hscale cannot read the statement it runs, which could reach partitioned, reference or hscale tables unrouted (admins only)"
            ))),
        }
    }

    /// Runs `text` as if the client had sent it.
    async fn run_text(&mut self, text: &str) -> Result<(), ProxyError> {
        let payload = Bytes::from(command::query(text));
        Box::pin(self.query(payload)).await
    }

    /// XA RECOVER on the main backend, without hscale's branches.
    pub(super) async fn xa_recover(&mut self, payload: Bytes) -> Result<(), ProxyError> {
        let backend = self.shared.main_backend();
        let (header, rows, end) = match self.backends.answer_of(backend, &payload).await? {
            Answer::Packet(packet) => {
                self.client.send_packet(1, &packet).await?;
                return Ok(());
            }
            Answer::Rows { header, rows, end } => (header, rows, end),
        };
        let columns = header
            .first()
            .and_then(|count| read_lenenc(count))
            .map_or(0, |(n, _)| n as usize);
        let hscale = XA_FORMAT_ID.to_string();
        let mut seq = 1;
        for packet in &header {
            seq = self.client.queue_packet(seq, packet);
        }
        for row in rows {
            let format = parse_text_row(&row, columns).and_then(|values| values.first()?.clone());
            if format.as_deref() != Some(hscale.as_bytes()) {
                seq = self.client.queue_packet(seq, &row);
            }
        }
        self.client.send_packet(seq, &end).await?;
        Ok(())
    }
}

fn refused(reason: &str) -> ProxyError {
    ProxyError::Unroutable(Refusal {
        table: None,
        reason: reason.into(),
    })
}

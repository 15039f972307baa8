//! Dynamic SQL as the planner read it (`hscale_planner::Dynamic`): the text
//! of an EXECUTE IMMEDIATE runs as the client's statement; statements
//! prepared from text that hscale routes or guards are kept here, by name,
//! and planned at each EXECUTE; what hscale cannot read runs as written for
//! admins only. And XA RECOVER, which lists the client's transactions, not
//! hscale's own branches.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use hscale_planner::{Dynamic, Plan, Refusal, Using, XA_FORMAT_ID};
use hscale_wire::command;
use hscale_wire::frame::read_lenenc;
use hscale_wire::resultset::parse_text_row;

use crate::error::ProxyError;
use crate::exec::Answer;
use crate::session::client::Client;
use crate::session::Backends;
use crate::session::Memo;
use crate::shared::Shared;

/// Statements prepared with PREPARE ... FROM text that hscale keeps: by
/// name (lower-cased, as the server compares them), their text.
#[derive(Default)]
pub struct SqlStatements(HashMap<String, String>);

impl SqlStatements {
    pub fn clear(&mut self) {
        self.0.clear();
    }
}

fn refused(reason: &str) -> ProxyError {
    ProxyError::Unroutable(Refusal {
        table: None,
        reason: reason.into(),
    })
}

/// `server`: the plan that runs the statement as written on the main
/// backend, where the server is to answer it.
pub(in crate::session) async fn run(
    shared: &Arc<Shared>,
    client: &mut Client,
    memo: &mut Memo,
    backends: &mut Backends,
    dynamic: Dynamic,
    server: Plan,
    statement: super::Statement,
) -> Result<(), ProxyError> {
    let payload = statement.payload;
    match dynamic {
        Dynamic::Run(text) => run_text(shared, client, memo, backends, &text).await,
        Dynamic::Prepare {
            name,
            text: Some(text),
        } => {
            memo.sql_statements.0.insert(name, text);
            backends.send_ok(client, ).await
        }
        Dynamic::Prepare { name, text: None } => {
            memo.sql_statements.0.remove(&name);
            Box::pin(super::run_plan(shared, client, memo, backends, server, payload)).await
        }
        Dynamic::Execute { name, using } => {
            let Some(text) = memo.sql_statements.0.get(&name).cloned() else {
                return Box::pin(super::run_plan(shared, client, memo, backends, server, payload)).await;
            };
            let text = match using {
                Using::Literals(values) if values.is_empty() => text,
                Using::Literals(values) => {
                    hscale_planner::with_literals(text.as_bytes(), backends.quoting, &values)
                        .and_then(|filled| String::from_utf8(filled).ok())
                        .ok_or_else(|| refused("EXECUTE whose USING values do not match its statement's parameters"))?
                }
                Using::Unread => {
                    return Err(refused(&format!(
                        "EXECUTE {name} USING values hscale cannot read (user variables or expressions): its statement is one hscale routes; pass literals, or prepare it with the binary protocol"
                    )))
                }
            };
            run_text(shared, client, memo, backends, &text).await
        }
        Dynamic::Deallocate { name } => match memo.sql_statements.0.remove(&name) {
            Some(_) => backends.send_ok(client, ).await,
            None => Box::pin(super::run_plan(shared, client, memo, backends, server, payload)).await,
        },
        Dynamic::Unread { .. } if client.admin => Box::pin(super::run_plan(shared, client, memo, backends, server, payload)).await,
        Dynamic::Unread { what } => Err(refused(&format!(
            "{what}: hscale cannot read the statement it runs, which could reach partitioned, reference or hscale tables unrouted (admins only)"
        ))),
    }
}

/// Runs `text` as if the client had sent it.
async fn run_text(
    shared: &Arc<Shared>,
    client: &mut Client,
    memo: &mut Memo,
    backends: &mut Backends,
    text: &str,
) -> Result<(), ProxyError> {
    let payload = Bytes::from(command::query(text));
    Box::pin(super::query(shared, client, memo, backends, payload)).await
}

/// XA RECOVER on the main backend, without hscale's branches.
pub(in crate::session) async fn xa_recover(
    shared: &Arc<Shared>,
    client: &mut Client,
    backends: &mut Backends,
    payload: Bytes,
) -> Result<(), ProxyError> {
    let backend = shared.main_backend();
    let (header, rows, end) = match backends.answer_of(backend, &payload).await? {
        Answer::Packet(packet) => {
            client.send_packet(1, &packet).await?;
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
        seq = client.queue_packet(seq, packet);
    }
    for row in rows {
        let format = parse_text_row(&row, columns).and_then(|values| values.first()?.clone());
        if format.as_deref() != Some(hscale.as_bytes()) {
            seq = client.queue_packet(seq, &row);
        }
    }
    client.send_packet(seq, &end).await?;
    Ok(())
}

//! One partition's answer read as a source of a merged result set: its
//! statement sent, its column definitions read (or probed, where partitions
//! go as one UNION), its packets read to their end, its connection given
//! back or dropped.

use std::sync::Arc;

use bytes::Bytes;
use hscale_merge::Merger;
use hscale_planner::Refusal;
use hscale_wire::frame::read_lenenc;
use hscale_wire::packets::{ErrorPacket, ERR_HEADER, OK_HEADER};
use hscale_wire::resultset::is_result_end;
use hscale_wire::scan::Completion;
use hscale_wire::{CapabilityFlags, WireError};

use super::{merge_error, Abort, Reading, Source};
use crate::backend::BackendError;
use crate::error::ProxyError;
use crate::exec::{command_payload, end_completion, Command};
use crate::session::client::Client;
use crate::session::probed::{client_definition, ProbedColumns, Under};
use crate::session::slots::Needs;
use crate::session::Backends;
use crate::session::Memo;
use crate::shared::Shared;

/// A `UNION` of partitions that MariaDB refused for its own reasons (an
/// expression whose collations it cannot aggregate: a `CASE` between two
/// columns of different collations), where one table would have answered.
pub(super) fn cannot_unite(error: &[u8]) -> bool {
    const CANT_AGGREGATE_COLLATIONS: [u16; 3] = [1267, 1270, 1271];
    ErrorPacket::parse(error)
        .is_ok_and(|e| CANT_AGGREGATE_COLLATIONS.contains(&e.code) && e.message.contains("'UNION'"))
}

/// The client's answer in place of `cannot_unite`'s error, which names a
/// `UNION` the client never wrote.
pub(super) fn union_refused() -> Bytes {
    let refusal = ProxyError::Unroutable(Refusal {
        table: None,
        reason: "an ORDER BY whose columns MariaDB cannot unite (ERROR 1271: an expression mixing collations) over partitions that share a backend inside a transaction; COLLATE the expression, or order outside the transaction".into(),
    });
    let mut bytes = Vec::new();
    if let (Some(packet), _) = refusal.to_client() {
        packet.write(&mut bytes);
    }
    bytes.into()
}

/// Checks a connection out for a partition and sends its statement.
pub(super) async fn start_source(
    memo: &mut Memo,
    backends: &mut Backends,
    source: &mut Source,
    command: Command<'_>,
    needs: Needs,
) -> Result<(), Abort> {
    let mut lease = backends
        .checkout(source.slot, needs)
        .await
        .map_err(Abort::Failed)?;
    if let Some(sql) = source.probe.take() {
        let prepared = match lease.conn.prepare(&sql).await {
            Ok(prepared) => prepared,
            Err(e) => {
                backends.forget_connection_state(source.slot);
                return Err(Abort::Failed(ProxyError::Backend(e)));
            }
        };
        if let Some(id) = prepared.id() {
            let deprecate_eof = lease
                .conn
                .key
                .capabilities
                .contains(CapabilityFlags::CLIENT_DEPRECATE_EOF);
            let definitions: Arc<[Bytes]> = prepared
                .column_definitions(deprecate_eof)
                .into_iter()
                .map(Bytes::copy_from_slice)
                .collect();
            if let Some(key) = &source.probe_key {
                memo.probed_columns.keep(key.clone(), definitions.clone());
            }
            source.definitions = Some(definitions);
            if let Err(e) = lease.conn.close_statement(id).await {
                backends.forget_connection_state(source.slot);
                return Err(Abort::Failed(ProxyError::Backend(e)));
            }
        }
    }
    let payload = match command_payload(&mut lease.conn, command).await {
        Ok(Ok(payload)) => payload,
        Ok(Err(refusal)) => {
            if let Err(e) = backends.gather_messages(&mut lease.conn).await {
                source.lease = Some(lease);
                return Err(Abort::Failed(backends.lost(source, e, false)));
            }
            backends.finish_command(source.slot, lease, &Completion::default());
            let mut packet = Vec::with_capacity(refusal.message.len() + 9);
            refusal.write(&mut packet);
            return Err(Abort::Answer(packet.into()));
        }
        Err(e) => {
            backends.forget_connection_state(source.slot);
            return Err(Abort::Failed(ProxyError::Backend(e)));
        }
    };
    backends
        .handle
        .scanning(lease.conn.backend, lease.conn.thread_id);
    let sent = lease.conn.send_command(&payload).await;
    source.lease = Some(lease);
    source.reading = Reading::Columns;
    if let Err(e) = sent {
        return Err(Abort::Failed(backends.lost(source, e, false)));
    }
    Ok(())
}

/// A partition's column definitions, for the merger.
pub(super) async fn read_columns(
    shared: &Arc<Shared>,
    client: &mut Client,
    memo: &mut Memo,
    backends: &mut Backends,
    merger: &mut Merger,
    i: usize,
    source: &mut Source,
) -> Result<(), Abort> {
    let first = backends.next_of(source, false).await?;
    let malformed = |what| {
        Abort::Failed(ProxyError::Backend(BackendError::Lost {
            backend: 0,
            source: WireError::Malformed { what },
        }))
    };
    let count = match first.first() {
        Some(&ERR_HEADER) => {
            backends.gather_of(source, false).await?;
            backends.finish_source(source, true);
            let answer = match source.union && cannot_unite(&first) {
                true => union_refused(),
                false => first,
            };
            return Err(Abort::Answer(answer));
        }
        Some(&OK_HEADER) => return Err(malformed("an OK where rows were expected")),
        _ => read_lenenc(&first).ok_or(malformed("column count"))?.0,
    };
    let count = count as usize;
    let mut definitions = Vec::with_capacity(count);
    for _ in 0..count {
        definitions.push(backends.next_of(source, false).await?);
    }
    if !source.deprecate_eof() {
        backends.next_of(source, false).await?;
    }
    source.reading = Reading::Rows;
    let exact = match (source.union, source.definitions.take()) {
        (false, _) => true,
        (true, Some(probed)) if probed.len() == count => {
            let hidden_from = count - merger.hidden_columns().min(count);
            let mut stands = true;
            for (i, (definition, probed)) in definitions.iter_mut().zip(probed.iter()).enumerate() {
                match client_definition(probed, definition, i >= hidden_from) {
                    Some(client) => *definition = client,
                    None => stands = false,
                }
            }
            if !stands {
                forget_probe(memo, source);
            }
            stands
        }
        (true, probed) => {
            if probed.is_some() {
                forget_probe(memo, source);
            }
            false
        }
    };
    let names = &shared.dictionary;
    for definition in &mut definitions {
        if let Some(renamed) = client.column_names.logical(names, definition) {
            *definition = Bytes::copy_from_slice(renamed);
        }
    }
    match exact {
        true => merger.columns(i, definitions),
        false => merger.union_columns(i, definitions),
    }
    .map_err(merge_error)
}

/// A probe's definitions that no longer fit its union's (the table
/// changed) are probed anew next time.
pub(super) fn forget_probe(memo: &mut Memo, source: &Source) {
    if let Some(key) = &source.probe_key {
        memo.probed_columns.forget(key);
    }
}

/// Gives a union that stands for every partition the definitions of
/// its first partition's statement `text`: kept from an earlier probe of
/// its shape, or probed before the union is sent.
pub(super) fn probe_first(
    shared: &Arc<Shared>,
    memo: &mut Memo,
    backends: &mut Backends,
    source: &mut Source,
    text: Option<Bytes>,
) {
    let Some(text) = text else { return };
    let under = Under {
        settings: backends.state.fingerprint(),
        generation: shared.dictionary.snapshot().generation(),
        db: backends.state.db.as_deref().unwrap_or(""),
        quoting: backends.quoting,
    };
    source.probe_key = ProbedColumns::key(&under, &text);
    source.definitions = source
        .probe_key
        .as_deref()
        .and_then(|key| memo.probed_columns.get(key));
    if source.definitions.is_none() {
        source.probe = Some(text);
    }
}

impl Backends {
    pub(super) fn finish_completed(&mut self, source: &mut Source, completion: &Completion) {
        source.reading = Reading::Ended;
        if let Some(lease) = source.lease.take() {
            self.finish_command(source.slot, lease, completion);
        }
    }

    pub(super) fn finish_source(&mut self, source: &mut Source, failed: bool) {
        let completion = Completion {
            error: failed,
            ..Completion::default()
        };
        self.finish_completed(source, &completion);
    }

    /// Reads what a partition still sends, to its end.
    pub(super) async fn drain(
        &mut self,
        source: &mut Source,
        answered: bool,
    ) -> Result<(), ProxyError> {
        loop {
            match source.reading {
                Reading::NotSent | Reading::Ended => return Ok(()),
                Reading::Columns | Reading::Rows => {}
            }
            let packet = match self.next_of(source, answered).await {
                Ok(packet) => packet,
                Err(Abort::Failed(e)) => return Err(e),
                Err(Abort::Answer(_)) => unreachable!("reading a packet only fails"),
            };
            let deprecate_eof = source.deprecate_eof();
            if packet.first() == Some(&ERR_HEADER) {
                self.finish_source(source, true);
            } else if source.reading == Reading::Columns {
                // The column count: skip the definitions too.
                let count = read_lenenc(&packet).map_or(0, |(n, _)| n);
                for _ in 0..count + u64::from(!deprecate_eof) {
                    if let Err(Abort::Failed(e)) = self.next_of(source, answered).await {
                        return Err(e);
                    }
                }
                source.reading = Reading::Rows;
            } else if is_result_end(&packet, deprecate_eof) {
                let completion = end_completion(&packet, deprecate_eof);
                if completion.warnings > 0 {
                    match self.gather_of(source, answered).await {
                        Ok(()) => {}
                        Err(Abort::Failed(e)) => return Err(e),
                        Err(Abort::Answer(_)) => unreachable!("gathering only fails"),
                    }
                }
                self.finish_completed(source, &completion);
            }
        }
    }

    pub(super) async fn next_of(
        &mut self,
        source: &mut Source,
        answered: bool,
    ) -> Result<Bytes, Abort> {
        let lease = source
            .lease
            .as_mut()
            .expect("a partition being read has a connection");
        match lease.conn.stream.read_packet().await {
            Ok(Some(packet)) => Ok(packet.payload),
            Ok(None) => Err(Abort::Failed(self.lost(
                source,
                WireError::Closed,
                answered,
            ))),
            Err(e) => Err(Abort::Failed(self.lost(source, e, answered))),
        }
    }

    /// The error for a partition whose connection failed; its connection is
    /// gone, with whatever state the session had there.
    pub(super) fn lost(
        &mut self,
        source: &mut Source,
        error: WireError,
        answered: bool,
    ) -> ProxyError {
        let backend = source.lease.take().map_or(0, |l| l.conn.backend);
        source.reading = Reading::Ended;
        self.forget_connection_state(source.slot);
        let error = BackendError::Lost {
            backend,
            source: error,
        };
        match answered {
            true => ProxyError::BackendMidAnswer { source: error },
            false => ProxyError::Backend(error),
        }
    }

    /// The messages a partition's statement left, read before its
    /// connection goes back.
    pub(super) async fn gather_of(
        &mut self,
        source: &mut Source,
        answered: bool,
    ) -> Result<(), Abort> {
        let Some(lease) = source.lease.as_mut() else {
            return Ok(());
        };
        match self.gather_messages(&mut lease.conn).await {
            Ok(()) => Ok(()),
            Err(e) => Err(Abort::Failed(self.lost(source, e, answered))),
        }
    }

    /// Connections in the middle of an answer cannot be reused: closed.
    pub(super) fn drop_sources(&mut self, sources: &mut [Source]) {
        for source in sources {
            if source.lease.take().is_some() {
                self.forget_connection_state(source.slot);
            }
            source.reading = Reading::Ended;
        }
    }
}

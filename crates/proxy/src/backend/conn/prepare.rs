//! Statements prepared on a backend connection: COM_STMT_PREPARE's answer
//! (`PrepareAnswer`), rewritten for the client with hscale's id and without
//! the parameters hscale binds itself; a text's statement id on this
//! connection, prepared in its database on first use; closing one.

use std::borrow::Cow;

use bytes::Bytes;
use hscale_wire::command;
use hscale_wire::frame::{write_packet, FrameHeader, HEADER_LEN};
use hscale_wire::packets::ErrorPacket;
use hscale_wire::scan::{Completion, Expect};
use hscale_wire::WireError;

use super::{last_packet, BackendConn};
use crate::backend::BackendError;
use crate::dictionary::DictionaryHandle;

/// The whole answer to a COM_STMT_PREPARE, read into memory (a statement's
/// parameter and column definitions: small).
#[derive(Debug)]
pub struct PrepareAnswer {
    /// The frames as the server sent them.
    pub frames: Vec<u8>,
    /// The statement's id and parameter count, or the error.
    pub completion: Completion,
}

impl PrepareAnswer {
    /// The server's id for the statement; `None`: it refused.
    pub fn id(&self) -> Option<u32> {
        self.completion
            .statement_id
            .filter(|_| !self.completion.error)
    }

    /// The answer with another statement id, for a client.
    pub fn with_id(mut self, id: u32) -> Vec<u8> {
        if self.id().is_some() {
            self.frames[HEADER_LEN + 1..HEADER_LEN + 5].copy_from_slice(&id.to_le_bytes());
        }
        self.frames
    }

    /// The answer for a client that does not know of the parameters
    /// `hidden` (hscale binds them): hscale's id, their definitions left
    /// out, and the columns named by their logical tables (`names`).
    pub fn for_client(
        self,
        id: u32,
        hidden: &[usize],
        deprecate_eof: bool,
        names: &DictionaryHandle,
    ) -> Vec<u8> {
        if self.id().is_none() {
            return self.frames;
        }
        let frames = self.with_id(id);
        let payloads = payloads(&frames);
        let Some((columns, params)) = counts(&payloads) else {
            return frames;
        };
        let ok = payloads[0];
        let shown = params.saturating_sub(hidden.len());
        let mut ok = ok.to_vec();
        ok[7..9].copy_from_slice(&(shown as u16).to_le_bytes());
        let mut kept: Vec<Cow<[u8]>> = vec![Cow::Owned(ok)];
        for (i, definition) in payloads.iter().enumerate().skip(1).take(params) {
            if !hidden.contains(&(i - 1)) {
                kept.push(Cow::Borrowed(definition));
            }
        }
        // The parameters' EOF goes with the last of them.
        let rest_at = 1 + params + usize::from(params > 0 && !deprecate_eof);
        if shown > 0 && !deprecate_eof {
            kept.extend(payloads.get(1 + params).map(|eof| Cow::Borrowed(*eof)));
        }
        for (i, payload) in payloads.iter().enumerate().skip(rest_at) {
            match i < rest_at + columns {
                true => kept.push(
                    names
                        .logical_column(payload)
                        .map_or(Cow::Borrowed(*payload), Cow::Owned),
                ),
                false => kept.push(Cow::Borrowed(payload)),
            }
        }
        let mut out = Vec::with_capacity(frames.len());
        let mut seq = frames[3];
        for payload in &kept {
            seq = write_packet(seq, payload, &mut out);
        }
        out
    }

    /// The statement's column definitions, as a result set of it has them.
    pub fn column_definitions(&self, deprecate_eof: bool) -> Vec<&[u8]> {
        let payloads = payloads(&self.frames);
        match counts(&payloads) {
            Some((columns, params)) if self.id().is_some() => {
                let eof = usize::from(params > 0 && !deprecate_eof);
                let first = 1 + params + eof;
                payloads.into_iter().skip(first).take(columns).collect()
            }
            _ => Vec::new(),
        }
    }
}

/// The payloads of whole frames (a packet of one frame each: definitions).
pub(super) fn payloads(frames: &[u8]) -> Vec<&[u8]> {
    let mut payloads = Vec::new();
    let mut at = 0;
    while let Some(header) = frames.get(at..).and_then(FrameHeader::parse) {
        let start = at + HEADER_LEN;
        payloads.push(&frames[start..(start + header.len).min(frames.len())]);
        at = start + header.len;
    }
    payloads
}

/// The column and parameter counts of a prepare answer's OK.
pub(super) fn counts(payloads: &[&[u8]]) -> Option<(usize, usize)> {
    let ok = payloads.first().filter(|ok| ok.len() >= 9)?;
    let columns = usize::from(u16::from_le_bytes([ok[5], ok[6]]));
    let params = usize::from(u16::from_le_bytes([ok[7], ok[8]]));
    Some((columns, params))
}

impl BackendConn {
    /// COM_STMT_PREPARE of `sql`, answer read whole. The statement is not
    /// remembered: see `statement_id` and `remember`.
    pub async fn prepare(&mut self, sql: &[u8]) -> Result<PrepareAnswer, BackendError> {
        let mut command = Vec::with_capacity(sql.len() + 1);
        command.push(command::STMT_PREPARE);
        command.extend_from_slice(sql);
        let mut frames = Vec::new();
        let completion = self
            .read_answer(&command, Expect::Prepare, None, |bytes, _| {
                frames.extend_from_slice(bytes)
            })
            .await?;
        Ok(PrepareAnswer { frames, completion })
    }

    /// This connection's id for a statement, keyed by `key` (the database,
    /// a zero byte, the text), prepared here first if it is not yet: in the
    /// statement's database, then back in the connection's own. The inner
    /// error is the server refusing to prepare it.
    pub async fn statement_id(
        &mut self,
        key: &Bytes,
        db_len: usize,
    ) -> Result<Result<u32, ErrorPacket>, BackendError> {
        let settings = self.settings;
        if let Some(id) = self.statements.get(settings, key) {
            return Ok(Ok(id));
        }
        let db = std::str::from_utf8(&key[..db_len]).unwrap_or_default();
        let own = self.db.clone();
        let elsewhere = !db.is_empty() && own.as_deref() != Some(db);
        if elsewhere {
            if let Err(refused) = self.switch_database(db).await? {
                return Ok(Err(refused));
            }
        }
        let answer = self.prepare(&key[db_len + 1..]).await;
        if let (true, Some(own)) = (elsewhere, own) {
            // The connection's database existed a moment ago: a refusal now
            // leaves it where the statement's is, which `db` records.
            let _ = self.switch_database(&own).await?;
        }
        let answer = answer?;
        let Some(id) = answer.id() else {
            let malformed = WireError::Malformed {
                what: "error answer to a prepare",
            };
            let refusal = last_packet(&answer.frames)
                .and_then(|p| ErrorPacket::parse(p).ok())
                .ok_or(BackendError::Lost {
                    backend: self.backend,
                    source: malformed,
                })?;
            return Ok(Err(refusal));
        };
        self.remember(key.clone(), id).await?;
        Ok(Ok(id))
    }

    /// Keeps a statement prepared here for later executions; the one it
    /// pushes out of the cache is closed on the server.
    pub async fn remember(&mut self, key: Bytes, id: u32) -> Result<(), BackendError> {
        let settings = self.settings;
        if self.statements.get(settings, &key).is_some() {
            // Prepared here already (another client's PREPARE of the same text).
            return self.close_statement(id).await;
        }
        if let Some(old) = self.statements.insert(settings, key, id) {
            self.close_statement(old).await?;
        }
        Ok(())
    }

    /// COM_STMT_CLOSE, which has no answer.
    pub async fn close_statement(&mut self, id: u32) -> Result<(), BackendError> {
        let mut command = [command::STMT_CLOSE, 0, 0, 0, 0];
        command[1..].copy_from_slice(&id.to_le_bytes());
        let backend = self.backend;
        self.send_command(&command)
            .await
            .map_err(|source| BackendError::Lost { backend, source })
    }

    pub(super) async fn switch_database(
        &mut self,
        db: &str,
    ) -> Result<Result<(), ErrorPacket>, BackendError> {
        let mut command = Vec::with_capacity(db.len() + 1);
        command.push(command::INIT_DB);
        command.extend_from_slice(db.as_bytes());
        let answer = self.run(&command, Expect::Single).await?;
        if answer.is_ok() {
            self.db = Some(db.to_string());
        }
        Ok(answer.map(drop))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Frames numbered from 1, as a server answers a command.
    fn frames(payloads: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for (n, payload) in payloads.iter().enumerate() {
            out.extend_from_slice(&(payload.len() as u32).to_le_bytes()[..3]);
            out.push(n as u8 + 1);
            out.extend_from_slice(payload);
        }
        out
    }

    fn answer(payloads: &[&[u8]]) -> PrepareAnswer {
        PrepareAnswer {
            frames: frames(payloads),
            completion: Completion {
                statement_id: Some(9),
                params: 2,
                ..Completion::default()
            },
        }
    }

    /// OK: statement 9, one column, two parameters.
    const OK: &[u8] = &[0, 9, 0, 0, 0, 1, 0, 2, 0, 0, 0, 0];
    const EOF: &[u8] = &[0xfe, 0, 0, 2, 0];

    #[test]
    fn parameters_hscale_binds_are_left_out_of_the_clients_answer() {
        let shown_ok = [0, 5, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0];
        let names = &DictionaryHandle::new("hscale".into(), Duration::ZERO, Duration::ZERO);
        let with_eof = answer(&[OK, b"param0", b"param1", EOF, b"column", EOF]);
        assert_eq!(
            with_eof.for_client(5, &[1], false, names),
            frames(&[&shown_ok, b"param0", EOF, b"column", EOF])
        );
        let without_eof = answer(&[OK, b"param0", b"param1", b"column"]);
        assert_eq!(
            without_eof.for_client(5, &[0], true, names),
            frames(&[&shown_ok, b"param1", b"column"])
        );
        // No parameter left: no parameter EOF either.
        let none_ok = [0, 5, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        let with_eof = answer(&[OK, b"param0", b"param1", EOF, b"column", EOF]);
        assert_eq!(
            with_eof.for_client(5, &[0, 1], false, names),
            frames(&[&none_ok, b"column", EOF])
        );
    }
}

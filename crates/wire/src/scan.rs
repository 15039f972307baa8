//! Finds where a backend's response to one command ends, so that hscale can
//! forward it as raw bytes, frame by frame, without decoding rows. Sans-IO: feed
//! it the bytes read so far; it says how many may be forwarded now.

use mysql_common::constants::StatusFlags;

use crate::frame::{read_lenenc, FrameHeader, HEADER_LEN, MAX_FRAME_PAYLOAD};
use crate::packets::{eof_status, OkInfo, EOF_HEADER, ERR_HEADER, LOCAL_INFILE_HEADER, OK_HEADER};
use crate::WireError;

/// The shape of response a command gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// COM_QUERY, COM_STMT_EXECUTE: OK, ERR, local infile, or result sets, possibly several.
    ResultSets,
    /// COM_STMT_PREPARE: the statement's OK, then parameter and column definitions.
    Prepare,
    /// COM_STMT_FETCH: rows up to an EOF or ERR.
    Rows,
    /// COM_FIELD_LIST: column definitions up to an EOF or ERR.
    FieldList,
    /// Everything else: exactly one packet.
    Single,
}

/// How the response ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Completion {
    /// Status flags of the last OK or EOF, if the response carried one.
    pub status: Option<u16>,
    /// The last non-zero LAST_INSERT_ID an OK packet reported.
    pub last_insert_id: u64,
    /// Affected rows of the last OK packet.
    pub affected_rows: u64,
    /// Warnings of the last OK or EOF.
    pub warnings: u16,
    /// The id of a statement COM_STMT_PREPARE created.
    pub statement_id: Option<u32>,
    /// The parameters of a statement COM_STMT_PREPARE created.
    pub params: u16,
    pub error: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Forward this many bytes; the response goes on.
    More(usize),
    /// Forward this many bytes; then the server waits for the client's local file.
    LocalInfile(usize),
    /// Forward this many bytes; the response is complete.
    Done(usize, Completion),
    /// Forward the bytes before `at`; `at..end` is a result set's column
    /// definition, whole (header and payload), for the caller to forward or
    /// replace. Only from a scanner `stopping_at_columns`.
    Column { at: usize, end: usize },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    First,
    Columns(u64),
    ColumnsEof,
    Rows,
    FieldList,
    PrepareFirst,
    Definitions {
        left: u64,
        eof_after: bool,
        then_columns: u64,
    },
    DefinitionsEof {
        then_columns: u64,
    },
    Single,
}

#[derive(Debug)]
pub struct ResponseScanner {
    deprecate_eof: bool,
    state: State,
    /// Payload bytes of the current frame not yet passed.
    skip: usize,
    /// The previous frame was full: the next one continues the same packet.
    continuing: bool,
    completion: Completion,
    column_stops: bool,
}

impl ResponseScanner {
    pub fn new(expect: Expect, deprecate_eof: bool) -> ResponseScanner {
        let state = match expect {
            Expect::ResultSets => State::First,
            Expect::Prepare => State::PrepareFirst,
            Expect::Rows => State::Rows,
            Expect::FieldList => State::FieldList,
            Expect::Single => State::Single,
        };
        ResponseScanner {
            deprecate_eof,
            state,
            skip: 0,
            continuing: false,
            completion: Completion::default(),
            column_stops: false,
        }
    }

    /// A scanner that stops at each column definition of a result set or of
    /// a COM_FIELD_LIST answer (`Progress::Column`).
    pub fn stopping_at_columns(mut self) -> ResponseScanner {
        self.column_stops = true;
        self
    }

    /// Scans `buf`, which starts where the previous call's forwarded bytes ended.
    pub fn scan(&mut self, buf: &[u8]) -> Result<Progress, WireError> {
        let mut pos = 0;
        loop {
            if self.skip > 0 {
                let take = self.skip.min(buf.len() - pos);
                pos += take;
                self.skip -= take;
                if self.skip > 0 {
                    return Ok(Progress::More(pos));
                }
            }
            let Some(header) = FrameHeader::parse(&buf[pos..]) else {
                return Ok(Progress::More(pos));
            };
            let payload_at = pos + HEADER_LEN;
            if self.continuing {
                self.continuing = header.continues();
                self.skip = header.len;
                pos = payload_at;
                continue;
            }
            let needs_whole = self.needs_whole_frame(header, buf.get(payload_at).copied());
            match needs_whole {
                None => return Ok(Progress::More(pos)),
                Some(false) => {
                    self.continuing = header.continues();
                    self.skip = header.len;
                    pos = payload_at;
                }
                Some(true) => {
                    let end = payload_at + header.len;
                    if buf.len() < end {
                        return Ok(Progress::More(pos));
                    }
                    match self.on_control_packet(&buf[payload_at..end])? {
                        Step::Continue => pos = end,
                        Step::Column => return Ok(Progress::Column { at: pos, end }),
                        Step::LocalInfile => return Ok(Progress::LocalInfile(end)),
                        Step::Done => return Ok(Progress::Done(end, self.completion)),
                    }
                }
            }
        }
    }

    /// `None`: the first payload byte is needed to decide. `Some(true)`: the packet
    /// is small control data (metadata, terminators) that must be read whole;
    /// `Some(false)`: a row, passed on as it arrives however large it is.
    fn needs_whole_frame(&self, header: FrameHeader, first: Option<u8>) -> Option<bool> {
        match self.state {
            State::Rows => {
                if header.len == 0 {
                    return Some(false);
                }
                let first = first?;
                let terminator_limit = if self.deprecate_eof {
                    MAX_FRAME_PAYLOAD
                } else {
                    9
                };
                Some(first == ERR_HEADER || (first == EOF_HEADER && header.len < terminator_limit))
            }
            _ => Some(true),
        }
    }

    fn on_control_packet(&mut self, payload: &[u8]) -> Result<Step, WireError> {
        let malformed = || WireError::Malformed { what: "response" };
        let first = payload.first().copied();
        if first == Some(ERR_HEADER) && self.state != State::Single {
            self.completion.error = true;
            return Ok(Step::Done);
        }
        match self.state {
            State::First => match first.ok_or_else(malformed)? {
                OK_HEADER => self.on_ok(payload),
                LOCAL_INFILE_HEADER => Ok(Step::LocalInfile),
                _ => {
                    let (columns, _) = read_lenenc(payload).ok_or_else(malformed)?;
                    if columns == 0 {
                        return Err(malformed());
                    }
                    self.state = State::Columns(columns);
                    Ok(Step::Continue)
                }
            },
            State::ColumnsEof => {
                let status = self.on_eof(payload)?;
                if status & StatusFlags::SERVER_STATUS_CURSOR_EXISTS.bits() != 0 {
                    return Ok(Step::Done);
                }
                self.state = State::Rows;
                Ok(Step::Continue)
            }
            // A definition's first byte is the length of its catalog ("def").
            State::FieldList if first != Some(EOF_HEADER) => Ok(self.column_step()),
            // Servers answer some commands (COM_FIELD_LIST, cursors) with a classic
            // EOF even when CLIENT_DEPRECATE_EOF is on; its 5 bytes tell it apart
            // from an OK terminator, which has at least 7.
            State::Rows | State::FieldList if self.deprecate_eof && payload.len() > 5 => {
                self.on_ok(payload)
            }
            State::Rows | State::FieldList => {
                let status = self.on_eof(payload)?;
                Ok(self.after_result(status))
            }
            State::PrepareFirst => {
                let ok = payload.get(..9).ok_or_else(malformed)?;
                let columns = u64::from(u16::from_le_bytes([ok[5], ok[6]]));
                self.completion.params = u16::from_le_bytes([ok[7], ok[8]]);
                let params = u64::from(self.completion.params);
                self.completion.statement_id =
                    Some(u32::from_le_bytes([ok[1], ok[2], ok[3], ok[4]]));
                if let Some(warnings) = payload.get(10..12) {
                    self.completion.warnings = u16::from_le_bytes([warnings[0], warnings[1]]);
                }
                self.state = definitions(params, self.deprecate_eof, columns);
                if self.state == State::Single {
                    return Ok(Step::Done);
                }
                Ok(Step::Continue)
            }
            State::DefinitionsEof { then_columns } => {
                self.state = definitions(then_columns, self.deprecate_eof, 0);
                if self.state == State::Single {
                    return Ok(Step::Done);
                }
                Ok(Step::Continue)
            }
            State::Single => {
                match first {
                    Some(OK_HEADER) => {
                        self.on_ok(payload)?;
                    }
                    Some(EOF_HEADER) => {
                        self.on_eof(payload)?;
                    }
                    Some(ERR_HEADER) => self.completion.error = true,
                    _ => {}
                }
                Ok(Step::Done)
            }
            State::Columns(left) => {
                self.state = match (left - 1, self.deprecate_eof) {
                    (0, true) => State::Rows,
                    (0, false) => State::ColumnsEof,
                    (n, _) => State::Columns(n),
                };
                Ok(self.column_step())
            }
            State::Definitions {
                left,
                eof_after,
                then_columns,
            } => {
                self.state = match left - 1 {
                    0 if eof_after => State::DefinitionsEof { then_columns },
                    0 => definitions(then_columns, self.deprecate_eof, 0),
                    n => State::Definitions {
                        left: n,
                        eof_after,
                        then_columns,
                    },
                };
                Ok(if self.state == State::Single {
                    Step::Done
                } else {
                    Step::Continue
                })
            }
        }
    }

    fn column_step(&self) -> Step {
        match self.column_stops {
            true => Step::Column,
            false => Step::Continue,
        }
    }

    fn on_eof(&mut self, payload: &[u8]) -> Result<u16, WireError> {
        let status = eof_status(payload).ok_or(WireError::Malformed { what: "EOF" })?;
        self.completion.status = Some(status);
        self.completion.warnings = u16::from_le_bytes([payload[1], payload[2]]);
        Ok(status)
    }

    fn on_ok(&mut self, payload: &[u8]) -> Result<Step, WireError> {
        let ok = OkInfo::parse(payload).ok_or(WireError::Malformed { what: "OK" })?;
        self.completion.status = Some(ok.status);
        self.completion.warnings = ok.warnings;
        self.completion.affected_rows = ok.affected_rows;
        if ok.last_insert_id != 0 {
            self.completion.last_insert_id = ok.last_insert_id;
        }
        Ok(self.after_result(ok.status))
    }

    fn after_result(&mut self, status: u16) -> Step {
        if status & StatusFlags::SERVER_MORE_RESULTS_EXISTS.bits() != 0 {
            self.state = State::First;
            Step::Continue
        } else {
            Step::Done
        }
    }
}

/// The state that reads `count` definitions (then their EOF), then `then_columns`.
fn definitions(count: u64, deprecate_eof: bool, then_columns: u64) -> State {
    match (count, then_columns) {
        (0, 0) => State::Single,
        (0, columns) => definitions(columns, deprecate_eof, 0),
        (n, then_columns) => State::Definitions {
            left: n,
            eof_after: !deprecate_eof,
            then_columns,
        },
    }
}

enum Step {
    Continue,
    Column,
    LocalInfile,
    Done,
}

#[cfg(test)]
mod tests;

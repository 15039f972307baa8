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
mod tests {
    use super::*;
    use crate::frame::write_packet;
    use crate::packets::{write_eof, ErrorPacket};

    const MORE: u16 = 0x0008;

    fn ok(status: u16, last_insert_id: u64) -> Vec<u8> {
        let mut p = Vec::new();
        OkInfo {
            last_insert_id,
            status,
            ..OkInfo::default()
        }
        .write(OK_HEADER, &mut p);
        p
    }

    fn eof(status: u16) -> Vec<u8> {
        let mut p = Vec::new();
        write_eof(status, 0, &mut p);
        p
    }

    fn ok_terminator(status: u16) -> Vec<u8> {
        let mut p = Vec::new();
        OkInfo {
            status,
            ..OkInfo::default()
        }
        .write(EOF_HEADER, &mut p);
        p
    }

    fn frames(packets: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut seq = 1;
        for p in packets {
            seq = write_packet(seq, p, &mut out);
        }
        out
    }

    fn result_set(columns: usize, rows: usize, deprecate_eof: bool, status: u16) -> Vec<Vec<u8>> {
        let mut packets = vec![vec![columns as u8]];
        packets.extend((0..columns).map(|i| format!("\x03def\0\0\0\x01c{i}").into_bytes()));
        if !deprecate_eof {
            packets.push(eof(2));
        }
        packets.extend((0..rows).map(|i| format!("\x01{}", i % 10).into_bytes()));
        packets.push(if deprecate_eof {
            ok_terminator(status)
        } else {
            eof(status)
        });
        packets
    }

    /// Feeds `bytes` in chunks of `chunk` and returns the progress events.
    fn scan_all(
        expect: Expect,
        deprecate_eof: bool,
        bytes: &[u8],
        chunk: usize,
    ) -> (usize, Progress) {
        let mut scanner = ResponseScanner::new(expect, deprecate_eof);
        let mut buf = Vec::new();
        let mut forwarded = 0;
        let mut fed = 0;
        loop {
            let end = (fed + chunk).min(bytes.len());
            buf.extend_from_slice(&bytes[fed..end]);
            fed = end;
            match scanner.scan(&buf).unwrap() {
                Progress::More(n) => {
                    forwarded += n;
                    buf.drain(..n);
                    assert!(
                        fed < bytes.len(),
                        "scanner wants more than the response has"
                    );
                }
                done => {
                    let n = match done {
                        Progress::Done(n, _) | Progress::LocalInfile(n) => n,
                        Progress::More(_) | Progress::Column { .. } => unreachable!(),
                    };
                    return (forwarded + n, done);
                }
            }
        }
    }

    #[test]
    fn ok_response_is_complete_with_its_status_and_insert_id() {
        let bytes = frames(&[ok(0x0002, 7)]);
        let (n, p) = scan_all(Expect::ResultSets, true, &bytes, 1);
        assert_eq!(n, bytes.len());
        let Progress::Done(_, c) = p else {
            panic!("{p:?}")
        };
        assert_eq!((c.status, c.last_insert_id, c.error), (Some(2), 7, false));
    }

    #[test]
    fn result_set_ends_after_its_terminator_in_both_eof_modes() {
        for deprecate_eof in [false, true] {
            for chunk in [1, 3, 7, 4096] {
                let mut bytes = frames(&result_set(3, 20, deprecate_eof, 0x0002));
                let len = bytes.len();
                bytes.extend_from_slice(b"next command's bytes");
                let (n, p) = scan_all(Expect::ResultSets, deprecate_eof, &bytes, chunk);
                assert_eq!(n, len, "deprecate_eof={deprecate_eof} chunk={chunk}");
                assert!(matches!(p, Progress::Done(_, c) if c.status == Some(2)));
            }
        }
    }

    /// The definitions a scanner `stopping_at_columns` stops at, whole.
    fn column_stops(expect: Expect, deprecate_eof: bool, bytes: &[u8]) -> Vec<Vec<u8>> {
        let mut scanner = ResponseScanner::new(expect, deprecate_eof).stopping_at_columns();
        let (mut at, mut columns) = (0, Vec::new());
        loop {
            match scanner.scan(&bytes[at..]).unwrap() {
                Progress::Column { at: start, end } => {
                    columns.push(bytes[at + start + HEADER_LEN..at + end].to_vec());
                    at += end;
                }
                Progress::Done(n, _) => break at += n,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(at, bytes.len());
        columns
    }

    #[test]
    fn a_scanner_stopping_at_columns_gives_each_definition_whole() {
        for deprecate_eof in [false, true] {
            let mut packets = result_set(2, 1, deprecate_eof, MORE | 2);
            packets.extend(result_set(3, 2, deprecate_eof, 2));
            let columns = column_stops(Expect::ResultSets, deprecate_eof, &frames(&packets));
            let definitions: Vec<Vec<u8>> = packets
                .into_iter()
                .filter(|p| p.starts_with(b"\x03def"))
                .collect();
            assert_eq!(columns, definitions);
            assert_eq!(columns.len(), 5);
        }
    }

    #[test]
    fn a_field_list_stops_at_each_definition_up_to_either_terminator() {
        // COM_FIELD_LIST's definitions end with the column's default value.
        let definitions: Vec<Vec<u8>> = (0..3)
            .map(|i| {
                let fixed = "\x0c\x08\0\x0b\0\0\0\x03\0\0\0\0";
                let definition = format!("\x03def\x02db\x01t\x01t\x02c{i}\x02c{i}{fixed}");
                let no_default = 0xfb; // NULL
                [definition.as_bytes(), &[no_default]].concat()
            })
            .collect();
        for (deprecate_eof, end) in [(false, eof(2)), (true, eof(2)), (true, ok_terminator(2))] {
            let mut packets = definitions.clone();
            packets.push(end);
            let bytes = frames(&packets);
            assert_eq!(
                column_stops(Expect::FieldList, deprecate_eof, &bytes),
                definitions
            );
            let (n, p) = scan_all(Expect::FieldList, deprecate_eof, &bytes, 5);
            assert_eq!(n, bytes.len());
            assert!(matches!(p, Progress::Done(_, c) if c.status == Some(2)));
        }
        let mut err = Vec::new();
        ErrorPacket::new(1146, "42S02", "no such table").write(&mut err);
        let error = frames(&[err]);
        let (n, p) = scan_all(Expect::FieldList, true, &error, 4);
        assert_eq!(n, error.len());
        assert!(matches!(p, Progress::Done(_, c) if c.error));
    }

    #[test]
    fn multiple_result_sets_continue_while_more_results_is_set() {
        for deprecate_eof in [false, true] {
            let mut packets = result_set(1, 2, deprecate_eof, MORE | 2);
            packets.push(ok(MORE | 2, 0));
            packets.extend(result_set(2, 1, deprecate_eof, 2));
            let bytes = frames(&packets);
            let (n, p) = scan_all(Expect::ResultSets, deprecate_eof, &bytes, 5);
            assert_eq!(n, bytes.len());
            assert!(matches!(p, Progress::Done(..)));
        }
    }

    #[test]
    fn error_in_the_middle_of_rows_ends_the_response() {
        let mut packets = result_set(1, 3, true, 2);
        packets.pop();
        let mut err = Vec::new();
        ErrorPacket::new(1317, "70100", "Query execution was interrupted").write(&mut err);
        packets.push(err);
        let bytes = frames(&packets);
        let (n, p) = scan_all(Expect::ResultSets, true, &bytes, 2);
        assert_eq!(n, bytes.len());
        assert!(matches!(p, Progress::Done(_, c) if c.error));
    }

    #[test]
    fn rows_larger_than_a_frame_are_not_mistaken_for_terminators() {
        let mut big = vec![0xfeu8];
        big.extend_from_slice(&(20_000_000u64).to_le_bytes());
        big.resize(20_000_009, EOF_HEADER);
        let mut packets = vec![vec![1u8], b"\x03def\0\0\0\x01c".to_vec(), big];
        packets.push(ok_terminator(2));
        let bytes = frames(&packets);
        let (n, p) = scan_all(Expect::ResultSets, true, &bytes, 1 << 20);
        assert_eq!(n, bytes.len());
        assert!(matches!(p, Progress::Done(..)));
    }

    #[test]
    fn local_infile_request_pauses_then_the_final_ok_completes() {
        let mut scanner = ResponseScanner::new(Expect::ResultSets, true);
        let request = frames(&[b"\xfb/tmp/data.csv".to_vec()]);
        assert_eq!(
            scanner.scan(&request).unwrap(),
            Progress::LocalInfile(request.len())
        );
        let done = frames(&[ok(2, 0)]);
        assert!(matches!(scanner.scan(&done).unwrap(), Progress::Done(..)));
    }

    #[test]
    fn prepare_response_covers_params_and_columns() {
        for deprecate_eof in [false, true] {
            let mut packets = vec![vec![0, 1, 0, 0, 0, 2, 0, 3, 0, 0, 0, 0]];
            let def = b"\x03def\0\0\0\x01?".to_vec();
            packets.extend(std::iter::repeat_n(def.clone(), 3));
            if !deprecate_eof {
                packets.push(eof(2));
            }
            packets.extend(std::iter::repeat_n(def, 2));
            if !deprecate_eof {
                packets.push(eof(2));
            }
            let mut bytes = frames(&packets);
            let len = bytes.len();
            bytes.extend_from_slice(b"garbage after");
            let (n, _) = scan_all(Expect::Prepare, deprecate_eof, &bytes, 3);
            assert_eq!(n, len);
        }
    }

    #[test]
    fn prepare_without_params_or_columns_is_one_packet() {
        let bytes = frames(&[vec![0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]]);
        let (n, _) = scan_all(Expect::Prepare, false, &bytes, 64);
        assert_eq!(n, bytes.len());
    }

    #[test]
    fn a_classic_eof_also_ends_rows_when_deprecate_eof_is_on() {
        let packets = vec![b"\x03def\0\0\0\x01a".to_vec(), eof(2)];
        let bytes = frames(&packets);
        let (n, p) = scan_all(Expect::Rows, true, &bytes, 3);
        assert_eq!(n, bytes.len());
        assert!(matches!(p, Progress::Done(_, c) if c.status == Some(2)));
    }

    #[test]
    fn cursor_open_ends_after_column_definitions() {
        let packets = vec![vec![1u8], b"\x03def\0\0\0\x01c".to_vec(), eof(0x0040 | 2)];
        let bytes = frames(&packets);
        let (n, p) = scan_all(Expect::ResultSets, false, &bytes, 64);
        assert_eq!(n, bytes.len());
        assert!(matches!(p, Progress::Done(_, c) if c.status == Some(0x42)));
    }
}

//! The response scanner on each kind of answer: OKs, result sets in both
//! EOF modes, several result sets, errors mid-rows, column definitions.

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
fn scan_all(expect: Expect, deprecate_eof: bool, bytes: &[u8], chunk: usize) -> (usize, Progress) {
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

//! Whatever bytes a backend answers with, cut anywhere, the response scanner
//! never panics, never forwards more than it was given, and always moves on;
//! asked to, it stops at each column definition and names where it lies.
#![no_main]

use hscale_wire::scan::{Expect, Progress, ResponseScanner};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (u8, u8, &[u8])| {
    let (shape, cut, bytes) = input;
    let expect = match shape % 5 {
        0 => Expect::ResultSets,
        1 => Expect::Prepare,
        2 => Expect::Rows,
        3 => Expect::FieldList,
        _ => Expect::Single,
    };
    let mut scanner = ResponseScanner::new(expect, shape & 8 != 0);
    if shape & 16 != 0 {
        scanner = scanner.stopping_at_columns();
    }
    // Bytes arrive in chunks of `cut` (at least 1), as reads from a socket do.
    let chunk = usize::from(cut).max(1);
    let mut buffered: Vec<u8> = Vec::new();
    let mut fed = 0;
    loop {
        let progress = match scanner.scan(&buffered) {
            Ok(progress) => progress,
            Err(_) => return,
        };
        let n = match progress {
            Progress::More(n) | Progress::LocalInfile(n) | Progress::Done(n, _) => n,
            // A column definition the caller forwards whole, header and all.
            Progress::Column { at, end } => {
                assert!(at < end && end <= buffered.len());
                end
            }
        };
        assert!(n <= buffered.len());
        buffered.drain(..n);
        if matches!(progress, Progress::Done(..) | Progress::LocalInfile(_)) {
            return;
        }
        if fed == bytes.len() {
            return;
        }
        let next = (fed + chunk).min(bytes.len());
        buffered.extend_from_slice(&bytes[fed..next]);
        fed = next;
    }
});

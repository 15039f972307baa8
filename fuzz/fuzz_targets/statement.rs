//! Whatever a client sends as SQL, the statement analysis answers without
//! panicking, and the CONNECTION_ID() rewrite leaves no call behind.
#![no_main]

use hscale_planner::{parse_kill, parse_set, replace_connection_id, summarize, target_database};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|sql: &[u8]| {
    let summary = summarize(sql);
    let _ = summary.binds_connection();
    let _ = target_database(sql);
    let text = String::from_utf8_lossy(sql);
    let _ = parse_set(&text);
    let _ = parse_kill(&text);
    if let Some(rewritten) = replace_connection_id(sql, 4_294_967_295) {
        assert!(summary.connection_id, "a call the lexer did not see");
        assert_eq!(
            replace_connection_id(&rewritten, 1),
            None,
            "a call left behind"
        );
    }
});

//! Whatever a client sends as SQL, the statement analysis answers without
//! panicking, and the CONNECTION_ID() rewrite leaves no call behind.
#![no_main]

use hscale_planner::{
    parse_kill, parse_set, replace_connection_id, summarize, target_database, Quoting,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    // The first byte picks the sql_mode the statement is read under.
    let Some((&mode, sql)) = input.split_first() else {
        return;
    };
    let quoting = Quoting {
        no_backslash_escapes: mode & 1 != 0,
        ansi_quotes: mode & 2 != 0,
    };
    let summary = summarize(sql, quoting, &Default::default());
    let _ = summary.binds_connection();
    let _ = target_database(sql);
    let text = String::from_utf8_lossy(sql);
    let _ = parse_set(&text, quoting);
    let _ = parse_kill(&text);
    if let Some(rewritten) = replace_connection_id(sql, 4_294_967_295, quoting) {
        assert!(summary.connection_id, "a call the lexer did not see");
        assert_eq!(
            replace_connection_id(&rewritten, 1, quoting),
            None,
            "a call left behind"
        );
    }
});

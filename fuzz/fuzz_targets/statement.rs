//! Whatever a client sends as SQL, the statement analysis answers without
//! panicking, and the rewrite of CONNECTION_ID() and the server's variables
//! leaves none behind.
#![no_main]

use hscale_planner::{
    parse_kill, parse_set, replace_own_values, summarize, target_database, OwnValues, Quoting,
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
    let own = OwnValues {
        connection_id: 4_294_967_295,
        port: 65_535,
        address: std::net::Ipv6Addr::LOCALHOST.into(),
        hostname: "db'1\\",
    };
    if let Some(rewritten) = replace_own_values(sql, &own, quoting) {
        assert!(summary.own_values, "a call the lexer did not see");
        assert_eq!(
            replace_own_values(&rewritten, &own, quoting),
            None,
            "a call left behind"
        );
    }
});

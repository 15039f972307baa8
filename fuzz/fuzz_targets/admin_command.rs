//! Whatever follows HSCALE, the admin grammar answers with a command or an
//! error and never panics, and an EXPLAIN keeps a statement that was in the
//! text.
#![no_main]

use hscale_planner::admin::{parse_admin, AdminCommand};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Ok(rest) = std::str::from_utf8(input) else {
        return;
    };
    let sql = format!("HSCALE {rest}");
    if let Ok(AdminCommand::Explain(statement)) = parse_admin(&sql) {
        assert!(sql.contains(statement.as_str()), "{statement:?} is not in {sql:?}");
    }
});

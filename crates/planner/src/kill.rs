//! KILL statements: which connection, and whether only its running query.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillScope {
    Query,
    Connection,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kill {
    /// `KILL [HARD|SOFT] [CONNECTION|QUERY] id`
    Thread { scope: KillScope, id: u64 },
    /// `KILL [CONNECTION|QUERY] CONNECTION_ID()`: the client's own connection.
    Own { scope: KillScope },
    /// `KILL ... USER name` and `KILL QUERY ID n`: not by connection id.
    Unsupported,
}

/// Parses a statement whose first keyword is KILL.
pub fn parse_kill(sql: &str) -> Kill {
    let mut words = sql
        .split_whitespace()
        .map(|w| w.trim_end_matches(';'))
        .skip(1)
        .peekable();
    let mut scope = KillScope::Connection;
    while let Some(word) = words.peek() {
        match word.to_ascii_lowercase().as_str() {
            "hard" | "soft" => {}
            "connection" => scope = KillScope::Connection,
            "query" => scope = KillScope::Query,
            _ => break,
        }
        words.next();
    }
    let target: Vec<&str> = words.collect();
    // `CONNECTION_ID( )` is as good as `CONNECTION_ID()`.
    if target.concat().eq_ignore_ascii_case("connection_id()") {
        return Kill::Own { scope };
    }
    match target[..] {
        [id] => id
            .parse()
            .map_or(Kill::Unsupported, |id| Kill::Thread { scope, id }),
        _ => Kill::Unsupported,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_scope_and_id() {
        assert_eq!(
            parse_kill("KILL 12"),
            Kill::Thread {
                scope: KillScope::Connection,
                id: 12
            }
        );
        assert_eq!(
            parse_kill("kill query 7;"),
            Kill::Thread {
                scope: KillScope::Query,
                id: 7
            }
        );
        assert_eq!(
            parse_kill("KILL HARD CONNECTION 3"),
            Kill::Thread {
                scope: KillScope::Connection,
                id: 3
            }
        );
        assert_eq!(
            parse_kill("KILL SOFT QUERY 9"),
            Kill::Thread {
                scope: KillScope::Query,
                id: 9
            }
        );
    }

    #[test]
    fn connection_id_names_the_clients_own_connection() {
        assert_eq!(
            parse_kill("KILL CONNECTION_ID()"),
            Kill::Own {
                scope: KillScope::Connection
            }
        );
        assert_eq!(
            parse_kill("kill query connection_id( );"),
            Kill::Own {
                scope: KillScope::Query
            }
        );
    }

    #[test]
    fn other_forms_are_unsupported() {
        assert_eq!(parse_kill("KILL USER app"), Kill::Unsupported);
        assert_eq!(parse_kill("KILL QUERY ID 5"), Kill::Unsupported);
        assert_eq!(parse_kill("KILL"), Kill::Unsupported);
        assert_eq!(parse_kill("KILL 1 2"), Kill::Unsupported);
    }
}

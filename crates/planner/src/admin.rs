//! The HSCALE admin commands' grammar (DESIGN.md §5):
//! `HSCALE name [ '(' argument { ',' argument } ')' ]` with string or number
//! arguments, and `HSCALE EXPLAIN statement`. Tokens come from sqlparser's
//! tokenizer, so quoting and comments read as in any other statement.

use sqlparser::dialect::MySqlDialect;
use sqlparser::tokenizer::{Token, Tokenizer};

use crate::hashing::{HashError, HashFunction, Value};
use crate::rewrite::Offsets;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminCommand {
    SetupTable {
        table: String,
        column: String,
        default_table: String,
        backend: u32,
        function: HashFunction,
    },
    AddPartition {
        table: String,
        partition: String,
        value: Value<'static>,
        backend: u32,
    },
    DropPartition {
        table: String,
        partition: String,
    },
    MovePartition {
        table: String,
        partition: String,
        backend: u32,
    },
    /// A value of a partition that has several, to a partition of its own
    /// (or another one) on `backend`.
    SplitPartition {
        table: String,
        partition: String,
        into: String,
        value: Value<'static>,
        backend: u32,
    },
    /// A small table copied to every backend: read anywhere, written
    /// everywhere at once.
    SetupReference {
        table: String,
    },
    ShowPartitions {
        table: String,
    },
    Lookup {
        table: String,
        value: Value<'static>,
    },
    ShowTables,
    /// Online moves: their phases and progress.
    ShowMoves,
    CancelMove {
        job: u64,
    },
    Status,
    /// Every host of every backend: role, health, replication, lag.
    ShowBackends,
    /// A planned change of a backend's writer to one of its replicas.
    Switchover {
        backend: u32,
        host: String,
    },
    Refresh,
    /// The statement to explain, as written.
    Explain(String),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdminSyntax {
    #[error("HSCALE command syntax: {0}")]
    Syntax(String),
    #[error("unknown HSCALE command '{0}'; the commands are SETUP_TABLE, ADD_PARTITION, DROP_PARTITION, MOVE_PARTITION, SPLIT_PARTITION, SHOW_MOVES, CANCEL_MOVE, SHOW_PARTITIONS, LOOKUP, SHOW_TABLES, SHOW_BACKENDS, SWITCHOVER, STATUS, REFRESH, EXPLAIN")]
    Unknown(String),
    #[error("{command} takes {expected}")]
    Arguments {
        command: &'static str,
        expected: &'static str,
    },
    #[error(transparent)]
    Function(#[from] HashError),
}

/// An argument as written: a quoted string or a number.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Argument {
    Text(String),
    Number(String),
}

impl Argument {
    fn text(&self) -> &str {
        match self {
            Argument::Text(s) | Argument::Number(s) => s,
        }
    }

    fn value(&self) -> Value<'static> {
        match self {
            Argument::Text(s) => Value::String(s.clone().into()),
            Argument::Number(n) => Value::Number(n.clone().into()),
        }
    }
}

pub fn parse_admin(sql: &str) -> Result<AdminCommand, AdminSyntax> {
    let syntax = |what: &str| AdminSyntax::Syntax(what.to_string());
    let tokens = Tokenizer::new(&MySqlDialect {}, sql)
        .tokenize_with_location()
        .map_err(|e| syntax(&e.to_string()))?;
    let mut tokens = tokens.iter().filter(|t| !is_space(&t.token)).peekable();
    match tokens.next().map(|t| &t.token) {
        Some(Token::Word(w)) if w.value.eq_ignore_ascii_case("hscale") => {}
        _ => return Err(syntax("an admin command starts with HSCALE")),
    }
    let name = match tokens.next().map(|t| &t.token) {
        Some(Token::Word(w)) => w.value.to_ascii_uppercase(),
        _ => return Err(syntax("HSCALE is followed by a command name")),
    };
    if name == "EXPLAIN" {
        let first = tokens
            .next()
            .ok_or_else(|| syntax("EXPLAIN needs a statement"))?;
        let offsets = Offsets::new(sql);
        let start = offsets
            .byte(first.span.start)
            .ok_or_else(|| syntax("EXPLAIN needs a statement"))?;
        let rest: Vec<&Token> = tokens.map(|t| &t.token).collect();
        if let Some(end) = rest.iter().position(|t| **t == Token::SemiColon) {
            alone(&rest[end..])?;
        }
        let statement = sql[start..].trim().trim_end_matches(';').trim_end();
        return Ok(AdminCommand::Explain(statement.to_string()));
    }
    let mut args = Vec::new();
    if matches!(tokens.peek().map(|t| &t.token), Some(Token::LParen)) {
        tokens.next();
        loop {
            match tokens.next().map(|t| &t.token) {
                Some(Token::RParen) if args.is_empty() => break,
                Some(Token::SingleQuotedString(s) | Token::DoubleQuotedString(s)) => {
                    args.push(Argument::Text(s.clone()))
                }
                Some(Token::Number(n, _)) => args.push(Argument::Number(n.clone())),
                Some(Token::Minus) => match tokens.next().map(|t| &t.token) {
                    Some(Token::Number(n, _)) => args.push(Argument::Number(format!("-{n}"))),
                    _ => return Err(syntax("'-' must be followed by a number")),
                },
                _ => return Err(syntax("arguments are quoted strings or numbers")),
            }
            match tokens.next().map(|t| &t.token) {
                Some(Token::Comma) => continue,
                Some(Token::RParen) => break,
                _ => return Err(syntax("arguments are separated by ',' and end with ')'")),
            }
        }
    }
    let rest: Vec<&Token> = tokens.map(|t| &t.token).collect();
    match rest.first() {
        None | Some(Token::SemiColon) => alone(&rest)?,
        Some(t) => return Err(syntax(&format!("unexpected '{t}' after the command"))),
    }
    command(&name, &args)
}

/// What may follow a command: semicolons. Anything more is another
/// statement, which an admin command would otherwise swallow unseen.
fn alone(rest: &[&Token]) -> Result<(), AdminSyntax> {
    match rest.iter().all(|t| **t == Token::SemiColon) {
        true => Ok(()),
        false => Err(AdminSyntax::Syntax(
            "an HSCALE command must be alone in its query".into(),
        )),
    }
}

fn is_space(token: &Token) -> bool {
    matches!(token, Token::Whitespace(_))
}

fn command(name: &str, args: &[Argument]) -> Result<AdminCommand, AdminSyntax> {
    let arity = |command: &'static str, expected: &'static str| AdminSyntax::Arguments {
        command,
        expected,
    };
    let text = |i: usize| args[i].text().to_string();
    Ok(match (name, args.len()) {
        ("SETUP_TABLE", 5) => AdminCommand::SetupTable {
            table: text(0),
            column: text(1),
            default_table: text(2),
            backend: backend(&args[3])?,
            function: HashFunction::parse(args[4].text())?,
        },
        ("SETUP_TABLE", _) => {
            return Err(arity(
                "SETUP_TABLE",
                "(table, column, default table, backend, function)",
            ))
        }
        ("ADD_PARTITION", 4) => AdminCommand::AddPartition {
            table: text(0),
            partition: text(1),
            value: args[2].value(),
            backend: backend(&args[3])?,
        },
        ("ADD_PARTITION", _) => {
            return Err(arity("ADD_PARTITION", "(table, partition, value, backend)"))
        }
        ("DROP_PARTITION", 2) => AdminCommand::DropPartition {
            table: text(0),
            partition: text(1),
        },
        ("DROP_PARTITION", _) => return Err(arity("DROP_PARTITION", "(table, partition)")),
        ("MOVE_PARTITION", 3) => AdminCommand::MovePartition {
            table: text(0),
            partition: text(1),
            backend: backend(&args[2])?,
        },
        ("MOVE_PARTITION", _) => {
            return Err(arity("MOVE_PARTITION", "(table, partition, backend)"))
        }
        ("SPLIT_PARTITION", 5) => AdminCommand::SplitPartition {
            table: text(0),
            partition: text(1),
            into: text(2),
            value: args[3].value(),
            backend: backend(&args[4])?,
        },
        ("SPLIT_PARTITION", _) => {
            return Err(arity(
                "SPLIT_PARTITION",
                "(table, partition, new partition, value, backend)",
            ))
        }
        ("SETUP_REFERENCE", 1) => AdminCommand::SetupReference { table: text(0) },
        ("SETUP_REFERENCE", _) => return Err(arity("SETUP_REFERENCE", "(table)")),
        ("SHOW_PARTITIONS", 1) => AdminCommand::ShowPartitions { table: text(0) },
        ("SHOW_PARTITIONS", _) => return Err(arity("SHOW_PARTITIONS", "(table)")),
        ("LOOKUP", 2) => AdminCommand::Lookup {
            table: text(0),
            value: args[1].value(),
        },
        ("LOOKUP", _) => return Err(arity("LOOKUP", "(table, value)")),
        ("SHOW_TABLES", 0) => AdminCommand::ShowTables,
        ("SHOW_MOVES", 0) => AdminCommand::ShowMoves,
        ("STATUS", 0) => AdminCommand::Status,
        ("SHOW_BACKENDS", 0) => AdminCommand::ShowBackends,
        ("SWITCHOVER", 2) => AdminCommand::Switchover {
            backend: backend(&args[0])?,
            host: text(1),
        },
        ("SWITCHOVER", _) => return Err(arity("SWITCHOVER", "(backend, 'host:port')")),
        ("REFRESH", 0) => AdminCommand::Refresh,
        ("SHOW_TABLES" | "SHOW_MOVES" | "SHOW_BACKENDS" | "STATUS" | "REFRESH", _) => {
            return Err(arity(
                "SHOW_TABLES, SHOW_MOVES, SHOW_BACKENDS, STATUS and REFRESH",
                "no arguments",
            ))
        }
        ("CANCEL_MOVE", 1) => AdminCommand::CancelMove {
            job: args[0].text().trim().parse().map_err(|_| {
                AdminSyntax::Syntax(format!("'{}' is not a move's job id", args[0].text()))
            })?,
        },
        ("CANCEL_MOVE", _) => return Err(arity("CANCEL_MOVE", "(job)")),
        (other, _) => return Err(AdminSyntax::Unknown(other.to_string())),
    })
}

fn backend(arg: &Argument) -> Result<u32, AdminSyntax> {
    arg.text()
        .trim()
        .parse()
        .map_err(|_| AdminSyntax::Syntax(format!("'{}' is not a backend id", arg.text())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_seed_commands_with_either_quote_and_free_case() {
        assert_eq!(
            parse_admin("HSCALE SETUP_TABLE('users', 'nickname', 'users_default', 1, 'PREFIX(3)')")
                .unwrap(),
            AdminCommand::SetupTable {
                table: "users".into(),
                column: "nickname".into(),
                default_table: "users_default".into(),
                backend: 1,
                function: HashFunction::Prefix(3),
            }
        );
        assert_eq!(
            parse_admin("hscale  add_partition ( \"users\",'nick1', 'mar' , 2 ) ;").unwrap(),
            AdminCommand::AddPartition {
                table: "users".into(),
                partition: "nick1".into(),
                value: Value::String("mar".into()),
                backend: 2,
            }
        );
        assert_eq!(
            parse_admin("HSCALE SPLIT_PARTITION('t', 'p', 'q', 3, 2)").unwrap(),
            AdminCommand::SplitPartition {
                table: "t".into(),
                partition: "p".into(),
                into: "q".into(),
                value: Value::Number("3".into()),
                backend: 2,
            }
        );
        assert!(parse_admin("HSCALE SPLIT_PARTITION('t', 'p', 3, 2)").is_err());
        assert_eq!(
            parse_admin("HSCALE ADD_PARTITION('t', 'p', -1, '2')").unwrap(),
            AdminCommand::AddPartition {
                table: "t".into(),
                partition: "p".into(),
                value: Value::Number("-1".into()),
                backend: 2,
            }
        );
        assert_eq!(
            parse_admin("HSCALE show_tables").unwrap(),
            AdminCommand::ShowTables
        );
        assert_eq!(parse_admin("HSCALE STATUS;").unwrap(), AdminCommand::Status);
        assert_eq!(
            parse_admin("hscale show_backends").unwrap(),
            AdminCommand::ShowBackends
        );
        assert!(parse_admin("HSCALE SHOW_BACKENDS(1)").is_err());
        assert_eq!(
            parse_admin("HSCALE SWITCHOVER(2, '10.0.0.7:3306')").unwrap(),
            AdminCommand::Switchover {
                backend: 2,
                host: "10.0.0.7:3306".into()
            }
        );
        assert!(parse_admin("HSCALE SWITCHOVER('10.0.0.7:3306')").is_err());
        assert_eq!(
            parse_admin("hscale show_moves").unwrap(),
            AdminCommand::ShowMoves
        );
        assert_eq!(
            parse_admin("HSCALE CANCEL_MOVE(17)").unwrap(),
            AdminCommand::CancelMove { job: 17 }
        );
        assert!(parse_admin("HSCALE CANCEL_MOVE('x')").is_err());
        assert_eq!(
            parse_admin("HSCALE LOOKUP('users', 'martin')").unwrap(),
            AdminCommand::Lookup {
                table: "users".into(),
                value: Value::String("martin".into())
            }
        );
    }

    #[test]
    fn trailing_semicolons_and_comments_end_a_command() {
        for sql in [
            "HSCALE STATUS;",
            "HSCALE STATUS ; ; ",
            "HSCALE STATUS; -- done\n",
        ] {
            assert_eq!(parse_admin(sql), Ok(AdminCommand::Status), "{sql}");
        }
    }

    #[test]
    fn explain_keeps_the_statement_as_written() {
        assert_eq!(
            parse_admin("HSCALE EXPLAIN SELECT * FROM users /* x */ WHERE nickname = 'Martin';")
                .unwrap(),
            AdminCommand::Explain("SELECT * FROM users /* x */ WHERE nickname = 'Martin'".into())
        );
    }

    #[test]
    fn bad_commands_say_what_is_wrong() {
        for (sql, says) in [
            ("HSCALE FROB", "unknown HSCALE command 'FROB'"),
            ("HSCALE SETUP_TABLE('users')", "SETUP_TABLE takes"),
            (
                "HSCALE SETUP_TABLE('users', 'n', 'd', 1, 'SHA1(3)')",
                "not a hashing function",
            ),
            (
                "HSCALE ADD_PARTITION('users', 'n', 'mar', 'two')",
                "not a backend id",
            ),
            (
                "HSCALE ADD_PARTITION('users', nick, 'mar', 2)",
                "quoted strings or numbers",
            ),
            ("HSCALE STATUS extra", "unexpected"),
            ("HSCALE SHOW_TABLES('x')", "no arguments"),
            ("HSCALE STATUS; DROP TABLE victim", "alone in its query"),
            ("HSCALE REFRESH;;SELECT 1", "alone in its query"),
            (
                "HSCALE EXPLAIN SELECT 1 FROM users; DROP TABLE victim",
                "alone in its query",
            ),
        ] {
            let error = parse_admin(sql).unwrap_err().to_string();
            assert!(error.contains(says), "{sql}: {error}");
        }
    }
}

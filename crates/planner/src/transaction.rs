//! What a statement does to the transaction in progress, read once from the
//! lexer's tokens: the statements that control it (`TxControl`), which the
//! session carries out over every backend the transaction reached, and the
//! effects other statements have on it (`TxEffect`), which the server acts
//! on by itself on one backend only.

use crate::lexer::{Kind, Quoting, Summary, TokenKind, Tokens};
use crate::set::{assigns_user_variable, autocommit_after, Autocommit};

/// A statement that controls the transaction, alone in its query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxControl {
    /// BEGIN, START TRANSACTION. `deferred`: with nothing after it (no
    /// snapshot taken at once, no access mode that could refuse it), so
    /// hscale may answer it and let each backend open the transaction with
    /// its first statement there.
    Begin { deferred: bool },
    /// COMMIT or ROLLBACK. `plain`: without AND CHAIN or RELEASE; `chain`:
    /// AND CHAIN (a new transaction begins); `release`: RELEASE (the
    /// client's connection ends).
    End {
        commit: bool,
        plain: bool,
        chain: bool,
        release: bool,
    },
    /// SAVEPOINT, ROLLBACK TO SAVEPOINT, RELEASE SAVEPOINT, and the name,
    /// lowercase (MariaDB compares savepoint names without regard to case).
    Savepoint { op: SavepointOp, name: String },
    /// A ROLLBACK ... TO whose savepoint hscale cannot read: only the
    /// server can answer it.
    UnreadSavepoint,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SavepointOp {
    Set,
    RollbackTo,
    Release,
}

/// What a statement that is not transaction control does to the
/// transaction in progress on the backend that runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TxEffect {
    #[default]
    None,
    /// The server commits the transaction before it runs (BEGIN, LOCK
    /// TABLES, DDL, table maintenance, FLUSH and the others MariaDB lists).
    CommitsFirst,
    /// A SET of autocommit: turned on where it was off, the server commits.
    /// `user_variable`: it also assigns a user variable, which only one
    /// connection keeps.
    SetsAutocommit { to: Autocommit, user_variable: bool },
    /// It may run COMMIT, ROLLBACK or SET autocommit where hscale cannot
    /// see it; what it is, for messages.
    Hides(&'static str),
    /// XA START, END, PREPARE, COMMIT, ROLLBACK of the client's own: its
    /// transaction stays on the backend it runs on, and hscale opens none
    /// there for it.
    ClientXa,
}

/// A token as transaction control reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Word {
    /// A keyword or unquoted identifier, lowercase.
    Plain(String),
    /// A quoted identifier, lowercase.
    Quoted(String),
    /// Anything else: a string, a number, a symbol.
    Other,
}

fn words(sql: &[u8], quoting: Quoting) -> Vec<Word> {
    Tokens::new(sql, quoting)
        .filter(|token| token.kind != TokenKind::Symbol(b';'))
        .map(|token| {
            let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).to_lowercase();
            match token.kind {
                TokenKind::Word => Word::Plain(text(&sql[token.start..token.end])),
                TokenKind::Quoted(quote) if quoting.quotes_identifier(quote) => {
                    let inner = &sql[token.start + 1..token.end];
                    Word::Quoted(text(inner.strip_suffix(&[quote]).unwrap_or(inner)))
                }
                _ => Word::Other,
            }
        })
        .collect()
}

/// The transaction control a statement alone in its query is, if any.
pub(crate) fn tx_control(sql: &[u8], summary: &Summary, quoting: Quoting) -> Option<TxControl> {
    if summary.multi_statement
        || !matches!(
            summary.kind,
            Kind::Begin | Kind::Commit | Kind::Rollback | Kind::Other
        )
    {
        return None;
    }
    let words = words(sql, quoting);
    let plain: Vec<Option<&str>> = words
        .iter()
        .map(|word| match word {
            Word::Plain(word) => Some(word.as_str()),
            _ => None,
        })
        .collect();
    let name = |word: Option<&Word>| match word? {
        Word::Plain(name) | Word::Quoted(name) => Some(name.clone()),
        Word::Other => None,
    };
    let savepoint = |op, at: usize| match words.len() == at + 1 {
        true => Some(TxControl::Savepoint {
            op,
            name: name(words.get(at))?,
        }),
        false => None,
    };
    match plain[..] {
        [Some("begin")] | [Some("begin"), Some("work")] | [Some("start"), Some("transaction")] => {
            Some(TxControl::Begin { deferred: true })
        }
        [Some("begin"), ..] | [Some("start"), Some("transaction"), ..] => {
            Some(TxControl::Begin { deferred: false })
        }
        [Some("savepoint"), _] => savepoint(SavepointOp::Set, 1),
        [Some("release"), Some("savepoint"), _] => savepoint(SavepointOp::Release, 2),
        [Some(end @ ("commit" | "rollback")), ref rest @ ..] => {
            let rest = match rest {
                [Some("work"), rest @ ..] => rest,
                rest => rest,
            };
            match rest {
                // ROLLBACK [WORK] TO [SAVEPOINT] name
                [Some("to"), ..] => {
                    let after_to = words.len() - rest.len() + 1;
                    let at = match rest {
                        [_, Some("savepoint"), _] => after_to + 1,
                        _ => after_to,
                    };
                    savepoint(SavepointOp::RollbackTo, at).or(Some(TxControl::UnreadSavepoint))
                }
                _ => {
                    let negated = |at: usize| at > 0 && rest[at - 1] == Some("no");
                    let said = |word: &str| {
                        rest.iter()
                            .position(|w| *w == Some(word))
                            .is_some_and(|at| !negated(at))
                    };
                    Some(TxControl::End {
                        commit: end == "commit",
                        plain: rest.is_empty(),
                        chain: said("chain"),
                        release: said("release"),
                    })
                }
            }
        }
        _ => None,
    }
}

/// What a statement that is not transaction control does to the
/// transaction in progress.
pub(crate) fn tx_effect(sql: &[u8], summary: &Summary, quoting: Quoting) -> TxEffect {
    let first_two = || {
        let words = Tokens::new(sql, quoting)
            .filter(|token| token.kind == TokenKind::Word)
            .take(2)
            .map(|token| String::from_utf8_lossy(&sql[token.start..token.end]).to_lowercase());
        let mut words = words;
        (words.next().unwrap_or_default(), words.next())
    };
    let commits_first = || match summary.kind {
        Kind::Begin | Kind::Lock | Kind::DropDatabase => true,
        Kind::Other => commits_implicitly(first_two()),
        _ => false,
    };
    if summary.multi_statement {
        // What follows the first statement hscale does not see; a first
        // one that commits (a CREATE PROCEDURE's body reads as several
        // statements) commits before all of it.
        return match commits_first() {
            true => TxEffect::CommitsFirst,
            false => TxEffect::Hides("several statements in one query"),
        };
    }
    match summary.kind {
        Kind::Begin | Kind::Lock | Kind::DropDatabase => TxEffect::CommitsFirst,
        Kind::Call => TxEffect::Hides("CALL"),
        Kind::Xa => TxEffect::ClientXa,
        Kind::SqlPrepared if first_two().0 == "execute" => {
            TxEffect::Hides("EXECUTE of a statement prepared in SQL")
        }
        Kind::Set => {
            let text = String::from_utf8_lossy(sql);
            match autocommit_after(&text, quoting) {
                Some(to) => TxEffect::SetsAutocommit {
                    to,
                    user_variable: assigns_user_variable(&text, quoting),
                },
                None => TxEffect::None,
            }
        }
        Kind::Other => match commits_implicitly(first_two()) {
            true => TxEffect::CommitsFirst,
            false => TxEffect::None,
        },
        _ => TxEffect::None,
    }
}

/// Whether a statement that begins with these words (lowercase) makes the
/// server commit first: DDL (not on temporary tables), account changes,
/// table maintenance, FLUSH and the other administration statements
/// MariaDB lists.
fn commits_implicitly((first, second): (String, Option<String>)) -> bool {
    let second = second.as_deref().unwrap_or("");
    match first.as_str() {
        "drop" => second != "temporary",
        // ANALYZE SELECT runs a query.
        "analyze" => matches!(second, "table" | "tables" | "no_write_to_binlog" | "local"),
        "load" => second == "index",
        first => matches!(
            first,
            "create"
                | "alter"
                | "rename"
                | "truncate"
                | "grant"
                | "revoke"
                | "check"
                | "optimize"
                | "repair"
                | "flush"
                | "cache"
                | "reset"
                | "install"
                | "uninstall"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dictionary::TableNames;
    use crate::lexer::summarize;

    fn control(sql: &str) -> Option<TxControl> {
        let quoting = Quoting::default();
        let summary = summarize(sql.as_bytes(), quoting, &TableNames::default());
        tx_control(sql.as_bytes(), &summary, quoting)
    }

    fn effect(sql: &str) -> TxEffect {
        let quoting = Quoting::default();
        let summary = summarize(sql.as_bytes(), quoting, &TableNames::default());
        tx_effect(sql.as_bytes(), &summary, quoting)
    }

    fn savepoint(op: SavepointOp, name: &str) -> Option<TxControl> {
        Some(TxControl::Savepoint {
            op,
            name: name.into(),
        })
    }

    #[test]
    fn reads_begin_and_whether_hscale_may_defer_it() {
        for deferred in ["BEGIN", "begin work;", "START TRANSACTION", "/* c */ Begin"] {
            assert_eq!(
                control(deferred),
                Some(TxControl::Begin { deferred: true }),
                "{deferred}"
            );
        }
        for now in [
            "START TRANSACTION WITH CONSISTENT SNAPSHOT",
            "START TRANSACTION READ ONLY",
            "BEGIN NOT ATOMIC SELECT 1; END",
        ] {
            let expected = match now.starts_with("BEGIN NOT") {
                // Several statements: hscale does not see into them.
                true => None,
                false => Some(TxControl::Begin { deferred: false }),
            };
            assert_eq!(control(now), expected, "{now}");
        }
    }

    #[test]
    fn reads_commit_and_rollback_and_whether_they_chain_or_release() {
        let end = |commit, plain, chain, release| {
            Some(TxControl::End {
                commit,
                plain,
                chain,
                release,
            })
        };
        assert_eq!(control("COMMIT"), end(true, true, false, false));
        assert_eq!(control("commit work ;"), end(true, true, false, false));
        assert_eq!(control("ROLLBACK"), end(false, true, false, false));
        assert_eq!(control("ROLLBACK WORK"), end(false, true, false, false));
        assert_eq!(control("COMMIT AND CHAIN"), end(true, false, true, false));
        assert_eq!(
            control("ROLLBACK AND NO CHAIN RELEASE"),
            end(false, false, false, true)
        );
        assert_eq!(
            control("COMMIT WORK AND CHAIN NO RELEASE"),
            end(true, false, true, false)
        );
        assert_eq!(control("COMMIT; COMMIT"), None);
    }

    #[test]
    fn reads_the_three_savepoint_statements() {
        assert_eq!(control("SAVEPOINT a"), savepoint(SavepointOp::Set, "a"));
        assert_eq!(
            control(" savepoint `Sp1`;"),
            savepoint(SavepointOp::Set, "sp1")
        );
        assert_eq!(
            control("SAVEPOINT `a b`"),
            savepoint(SavepointOp::Set, "a b")
        );
        for rollback in [
            "ROLLBACK TO a",
            "rollback to savepoint A",
            "ROLLBACK WORK TO a",
            "ROLLBACK WORK TO SAVEPOINT `a`",
        ] {
            assert_eq!(
                control(rollback),
                savepoint(SavepointOp::RollbackTo, "a"),
                "{rollback}"
            );
        }
        assert_eq!(
            control("RELEASE SAVEPOINT a"),
            savepoint(SavepointOp::Release, "a")
        );
        // A savepoint named `savepoint`.
        assert_eq!(
            control("ROLLBACK TO savepoint"),
            savepoint(SavepointOp::RollbackTo, "savepoint")
        );
        for unread in ["ROLLBACK TO 'a'", "ROLLBACK WORK TO a b", "ROLLBACK TO"] {
            assert_eq!(
                control(unread),
                Some(TxControl::UnreadSavepoint),
                "{unread}"
            );
        }
        assert_eq!(control("START SLAVE"), None, "not a transaction");
        for other in [
            "RELEASE a",
            "SAVEPOINT",
            "SAVEPOINTS a",
            "SELECT 1",
            "SAVEPOINT a; SELECT 1",
        ] {
            assert_eq!(control(other), None, "{other}");
        }
    }

    #[test]
    fn reads_which_statements_commit_first_or_hide_what_they_do() {
        for commits in [
            "CREATE TABLE t (a INT)",
            "drop table t",
            "ALTER TABLE t ADD b INT",
            "TRUNCATE t",
            "ANALYZE TABLE t",
            "LOAD INDEX INTO CACHE t",
            "LOCK TABLES t WRITE",
            "BEGIN",
            "DROP DATABASE d",
            "FLUSH TABLES",
        ] {
            assert_eq!(effect(commits), TxEffect::CommitsFirst, "{commits}");
        }
        for not in [
            "DROP TEMPORARY TABLE t",
            "CREATE TEMPORARY TABLE t (a INT)",
            "ANALYZE SELECT 1",
            "LOAD DATA INFILE 'f' INTO TABLE t",
            "SELECT 1",
            "SHOW TABLES",
            "SET @a = 1",
        ] {
            assert_eq!(effect(not), TxEffect::None, "{not}");
        }
        assert_eq!(effect("CALL p()"), TxEffect::Hides("CALL"));
        assert_eq!(effect("XA START 'x'"), TxEffect::ClientXa);
        assert_eq!(
            effect("EXECUTE s"),
            TxEffect::Hides("EXECUTE of a statement prepared in SQL")
        );
        assert_eq!(effect("PREPARE s FROM 'SELECT 1'"), TxEffect::None);
        assert_eq!(
            effect("SELECT 1; SELECT 2"),
            TxEffect::Hides("several statements in one query")
        );
        assert_eq!(
            effect("CREATE PROCEDURE p() BEGIN SELECT 1; SELECT 2; END"),
            TxEffect::CommitsFirst
        );
        assert_eq!(
            effect("SET autocommit = 1, @a = 2"),
            TxEffect::SetsAutocommit {
                to: Autocommit::On,
                user_variable: true
            }
        );
        assert_eq!(
            effect("SET autocommit = @x"),
            TxEffect::SetsAutocommit {
                to: Autocommit::Unread,
                user_variable: false
            }
        );
    }
}

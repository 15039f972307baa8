//! Dynamic SQL (`EXECUTE IMMEDIATE`, `PREPARE ... FROM`, `EXECUTE`,
//! `DEALLOCATE PREPARE`) and client XA statements: statements whose real
//! statement is text inside them, or that name a transaction by its id. What
//! hscale can read — a literal text, literal parameters — is planned like
//! any statement, so that it is routed and guarded; what it cannot read (an
//! expression, a user variable) must not reach partitioned, reference or
//! hscale tables unrouted, and is refused for users without `admin` while
//! such tables exist. XA statements on a transaction in hscale's own format
//! are refused: hscale's two-phase branches are ended by hscale alone.

use crate::lexer::{summarize, Kind, Quoting, Token, TokenKind, Tokens};
use crate::literal::string_at;
use crate::plan::{Action, Context, Refusal};

/// The format ID of hscale's two-phase commit branches ("hsc1").
pub const XA_FORMAT_ID: u32 = 0x6873_6331;

/// What a dynamic SQL statement comes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dynamic {
    /// EXECUTE IMMEDIATE of a literal (its `?` filled with the USING
    /// literals): this statement, planned as if the client had sent it.
    Run(String),
    /// PREPARE name FROM a literal. `text`: the statement, which hscale
    /// keeps and plans at each EXECUTE, where it is one hscale routes or
    /// guards; `None`: the server prepares it (hscale forgets a statement
    /// of its own by that name).
    Prepare { name: String, text: Option<String> },
    /// EXECUTE name [USING ...]: of hscale's statement if it keeps one by
    /// that name, else the server's.
    Execute { name: String, using: Using },
    /// DEALLOCATE PREPARE name, DROP PREPARE name.
    Deallocate { name: String },
    /// Dynamic SQL whose text hscale cannot read: run as written for an
    /// admin, refused for others (`what` names it).
    Unread { what: &'static str },
}

/// The parameters of an EXECUTE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Using {
    /// Literals, as written: they fill the statement's `?` in order.
    Literals(Vec<String>),
    /// Values hscale does not know (user variables, expressions).
    Unread,
}

/// The plan of a dynamic SQL statement (the lexer's `Kind::SqlPrepared`,
/// or DROP PREPARE), where partitioned or reference tables exist.
pub(crate) fn dynamic(sql: &str, ctx: &Context) -> Option<Action> {
    let bytes = sql.as_bytes();
    let tokens: Vec<Token> = Tokens::new(bytes, ctx.quoting)
        .filter(|t| t.kind != TokenKind::Symbol(b';'))
        .collect();
    let word = |i: usize| {
        tokens
            .get(i)
            .filter(|t| t.kind == TokenKind::Word)
            .map(|t| sql[t.start..t.end].to_ascii_lowercase())
    };
    let name = |i: usize| -> Option<String> {
        let t = tokens.get(i)?;
        match t.kind {
            TokenKind::Word => Some(sql[t.start..t.end].to_lowercase()),
            TokenKind::Quoted(q) if ctx.quoting.quotes_identifier(q) => {
                Some(sql[t.start + 1..t.end - 1].to_lowercase())
            }
            _ => None,
        }
    };
    let dynamic = match (word(0).as_deref(), word(1).as_deref()) {
        (Some("execute"), Some("immediate")) => {
            let Some((text, after)) = string_at(bytes, &tokens, 2, ctx.quoting) else {
                return Some(unread("EXECUTE IMMEDIATE of an expression or a variable"));
            };
            let text = match String::from_utf8(text) {
                Ok(text) => text,
                Err(_) => return Some(Action::Refuse(Refusal::unreadable())),
            };
            match using(sql, &tokens, after, ctx.quoting) {
                Using::Literals(values) if values.is_empty() => Dynamic::Run(text),
                Using::Literals(values) => {
                    let filled = crate::lexer::with_literals(text.as_bytes(), ctx.quoting, &values)
                        .and_then(|filled| String::from_utf8(filled).ok());
                    match filled {
                        Some(filled) => Dynamic::Run(filled),
                        None => return Some(refuse("EXECUTE IMMEDIATE whose USING values do not match its parameters")),
                    }
                }
                Using::Unread => {
                    return Some(unread("EXECUTE IMMEDIATE ... USING values hscale cannot read (variables or expressions)"))
                }
            }
        }
        (Some("prepare"), _) => {
            let statement = name(1)?;
            if word(2).as_deref() != Some("from") {
                return None;
            }
            let Some((text, _)) = string_at(bytes, &tokens, 3, ctx.quoting) else {
                return Some(unread("PREPARE ... FROM an expression or a variable"));
            };
            let Ok(text) = String::from_utf8(text) else {
                return Some(Action::Refuse(Refusal::unreadable()));
            };
            if !keeps(&text, ctx) {
                return Some(Action::Dynamic(Dynamic::Prepare {
                    name: statement,
                    text: None,
                }));
            }
            // Refused now rather than at each EXECUTE.
            if let Action::Refuse(refusal) = crate::plan::plan_prepared(text.as_bytes(), ctx).action
            {
                return Some(Action::Refuse(refusal));
            }
            Dynamic::Prepare {
                name: statement,
                text: Some(text),
            }
        }
        (Some("execute"), _) => Dynamic::Execute {
            name: name(1)?,
            using: using(sql, &tokens, 2, ctx.quoting),
        },
        (Some("deallocate" | "drop"), Some("prepare")) => Dynamic::Deallocate { name: name(2)? },
        _ => return None,
    };
    Some(Action::Dynamic(dynamic))
}

/// Whether the statement a dynamic SQL statement holds names hscale's
/// schema, a default or partition table, or one of hscale's locks: only an
/// admin may prepare or run it (`Summary::names_guarded`).
pub(crate) fn guards_inside(action: &Action, ctx: &Context) -> bool {
    match action {
        Action::Dynamic(Dynamic::Prepare {
            text: Some(text), ..
        }) => summarize(text.as_bytes(), ctx.quoting, ctx.dictionary.names()).names_guarded,
        _ => false,
    }
}

/// Whether hscale keeps a statement prepared from text rather than let the
/// server prepare it: one it routes, guards or refuses, or dynamic SQL.
fn keeps(text: &str, ctx: &Context) -> bool {
    let summary = summarize(text.as_bytes(), ctx.quoting, ctx.dictionary.names());
    summary.names_partitioned
        || summary.names_guarded
        || summary.multi_statement
        || matches!(summary.kind, Kind::Xa | Kind::SqlPrepared | Kind::Admin)
}

/// `USING v1, v2, ...` from `tokens[at]`.
fn using(sql: &str, tokens: &[Token], at: usize, quoting: Quoting) -> Using {
    let bytes = sql.as_bytes();
    let Some(first) = tokens.get(at) else {
        return Using::Literals(Vec::new());
    };
    if !sql[first.start..first.end].eq_ignore_ascii_case("using") {
        return Using::Unread;
    }
    let mut values = Vec::new();
    let mut i = at + 1;
    loop {
        let start = match tokens.get(i) {
            Some(t) => t.start,
            None => return Using::Unread,
        };
        // A sign before a number.
        let signed = tokens[i].kind == TokenKind::Symbol(b'-');
        let at_value = i + usize::from(signed);
        let end = match tokens.get(at_value) {
            Some(t) if t.kind == TokenKind::Number => at_value + 1,
            Some(t)
                if !signed
                    && t.kind == TokenKind::Word
                    && sql[t.start..t.end].eq_ignore_ascii_case("null") =>
            {
                at_value + 1
            }
            Some(_) if !signed => match string_at(bytes, tokens, at_value, quoting) {
                Some((_, after)) => after,
                None => return Using::Unread,
            },
            _ => return Using::Unread,
        };
        values.push(sql[start..tokens[end - 1].end].to_string());
        match tokens.get(end) {
            None => return Using::Literals(values),
            Some(t) if t.kind == TokenKind::Symbol(b',') => i = end + 1,
            Some(_) => return Using::Unread,
        }
    }
}

fn unread(what: &'static str) -> Action {
    Action::Dynamic(Dynamic::Unread { what })
}

fn refuse(reason: &str) -> Action {
    Action::Refuse(Refusal {
        table: None,
        reason: reason.into(),
    })
}

/// XA statements: `XA RECOVER` lists the client's transactions only
/// (`Action::XaRecover`); one that names a transaction in hscale's format
/// is refused; the others run on the main backend as written.
pub(crate) fn client_xa(sql: &str, quoting: Quoting) -> Action {
    let bytes = sql.as_bytes();
    let tokens: Vec<Token> = Tokens::new(bytes, quoting).collect();
    let word = |i: usize| {
        tokens
            .get(i)
            .map(|t| sql[t.start..t.end].to_ascii_lowercase())
    };
    if word(1).as_deref() == Some("recover") {
        return Action::XaRecover;
    }
    match format_id(sql, &tokens, quoting) {
        Some(format) if format == f64::from(XA_FORMAT_ID) => refuse(&format!(
            "an XA statement on a transaction in the format of hscale's own two-phase commit branches (format ID {XA_FORMAT_ID}): hscale ends them itself"
        )),
        _ => Action::Main,
    }
}

/// The format ID an XA statement's xid (`gtrid [, bqual [, formatID]]`,
/// from the third token) gives, by value; 1 where it gives none.
fn format_id(sql: &str, tokens: &[Token], quoting: Quoting) -> Option<f64> {
    let bytes = sql.as_bytes();
    let (_, mut at) = string_at(bytes, tokens, 2, quoting)?;
    let comma = |at: usize| {
        tokens
            .get(at)
            .is_some_and(|t| t.kind == TokenKind::Symbol(b','))
    };
    if !comma(at) {
        return Some(1.0);
    }
    (_, at) = string_at(bytes, tokens, at + 1, quoting)?;
    if !comma(at) {
        return Some(1.0);
    }
    let token = tokens.get(at + 1)?;
    let text = sql[token.start..token.end].to_ascii_lowercase();
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok().map(|v| v as f64),
        None => text.parse().ok(),
    }
}

/// A query of several statements, some of them XA or dynamic SQL, which
/// hscale cannot plan one by one there: refused, or (dynamic SQL) run as
/// written for an admin only.
pub(crate) fn in_statements(sql: &[u8], ctx: &Context) -> Option<Action> {
    for statement in crate::lexer::statements(sql, ctx.quoting) {
        let summary = summarize(statement, ctx.quoting, ctx.dictionary.names());
        match summary.kind {
            Kind::Xa => {
                let Ok(text) = std::str::from_utf8(statement) else {
                    return Some(Action::Refuse(Refusal::unreadable()));
                };
                match client_xa(text, ctx.quoting) {
                    Action::Main => {}
                    _ => return Some(refuse("XA RECOVER, or an XA statement on a transaction of hscale's own, among several statements in one query")),
                }
            }
            Kind::SqlPrepared if !ctx.dictionary.names().is_empty() => {
                return Some(unread(
                    "dynamic SQL (PREPARE, EXECUTE) among several statements in one query",
                ))
            }
            _ => {}
        }
    }
    None
}

/// Whether a statement creates a stored routine, trigger or event whose
/// body runs dynamic SQL: hscale cannot see what it will run.
pub(crate) fn creates_dynamic_routine(sql: &[u8], quoting: Quoting) -> bool {
    let mut words = Tokens::new(sql, quoting)
        .filter(|t| t.kind == TokenKind::Word)
        .map(|t| sql[t.start..t.end].to_ascii_lowercase());
    if words.next().as_deref() != Some(b"create".as_slice()) {
        return false;
    }
    let mut routine = false;
    for (i, word) in words.enumerate() {
        if i < 6
            && matches!(
                word.as_slice(),
                b"procedure" | b"function" | b"trigger" | b"event"
            )
        {
            routine = true;
        }
        if routine && matches!(word.as_slice(), b"prepare" | b"execute") {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::PlanCache;
    use crate::plan::{plan, ClientCharset};

    fn action(sql: &str) -> Action {
        let dictionary = crate::dictionary::tests::users().guarding_schema("hscale");
        let ctx = Context {
            db: Some("app"),
            quoting: Quoting::BACKSLASH_ESCAPES,
            no_auto_value_on_zero: false,
            tables_locked: false,
            charset: ClientCharset::Utf8,
            dictionary: &dictionary,
            main_backend: 1,
            passed_fences: &[],
        };
        plan(sql.as_bytes(), &ctx, &mut PlanCache::default()).action
    }

    fn dynamic(sql: &str) -> Dynamic {
        match action(sql) {
            Action::Dynamic(dynamic) => dynamic,
            other => panic!("{sql}: {other:?}"),
        }
    }

    fn run(text: &str) -> Dynamic {
        Dynamic::Run(text.into())
    }

    fn is_main(sql: &str) -> bool {
        matches!(action(sql), Action::Main)
    }

    #[test]
    fn execute_immediate_of_a_literal_runs_its_statement() {
        assert_eq!(
            dynamic("EXECUTE IMMEDIATE 'INSERT INTO users_default VALUES (99, ''mario'')'"),
            run("INSERT INTO users_default VALUES (99, 'mario')")
        );
        assert_eq!(
            dynamic("execute immediate 'SELECT * FROM users WHERE nickname = ?' USING 'Martin'"),
            run("SELECT * FROM users WHERE nickname = 'Martin'")
        );
        assert_eq!(
            dynamic("EXECUTE IMMEDIATE _utf8mb4'SELECT ' 'id FROM users' USING"),
            Dynamic::Unread {
                what: "EXECUTE IMMEDIATE ... USING values hscale cannot read (variables or expressions)"
            }
        );
        assert_eq!(
            dynamic("EXECUTE IMMEDIATE 'SELECT ?, ?' USING -1, NULL"),
            run("SELECT -1, NULL")
        );
    }

    #[test]
    fn dynamic_sql_hscale_cannot_read_is_unread() {
        for sql in [
            "EXECUTE IMMEDIATE CONCAT('INSERT INTO users', '_default VALUES (1, ''x'')')",
            "EXECUTE IMMEDIATE @sql",
            "PREPARE s FROM @sql",
            "PREPARE s FROM CONCAT('SELECT 1')",
            "EXECUTE IMMEDIATE 'SELECT ?' USING @v",
            "SELECT 1; EXECUTE IMMEDIATE 'SELECT 2'",
            "CREATE PROCEDURE p() BEGIN PREPARE s FROM @q; EXECUTE s; END",
            "CREATE DEFINER = CURRENT_USER PROCEDURE p(q TEXT) EXECUTE IMMEDIATE q",
        ] {
            assert!(
                matches!(action(sql), Action::Dynamic(Dynamic::Unread { .. })),
                "{sql}: {:?}",
                action(sql)
            );
        }
        // Nothing dynamic: passes as it did.
        assert!(is_main("CREATE PROCEDURE p() SELECT 1"));
    }

    #[test]
    fn statements_prepared_from_text_hscale_routes_are_kept_by_hscale() {
        assert_eq!(
            dynamic("PREPARE Stmt FROM 'SELECT * FROM users WHERE nickname = ?'"),
            Dynamic::Prepare {
                name: "stmt".into(),
                text: Some("SELECT * FROM users WHERE nickname = ?".into()),
            }
        );
        assert_eq!(
            dynamic("PREPARE s FROM 'SELECT * FROM app.users_nick1'"),
            Dynamic::Prepare {
                name: "s".into(),
                text: Some("SELECT * FROM app.users_nick1".into()),
            }
        );
        assert_eq!(
            dynamic("PREPARE s FROM 'SELECT * FROM other'"),
            Dynamic::Prepare {
                name: "s".into(),
                text: None,
            }
        );
        assert_eq!(
            dynamic("EXECUTE s USING 'Martin', 2"),
            Dynamic::Execute {
                name: "s".into(),
                using: Using::Literals(vec!["'Martin'".into(), "2".into()]),
            }
        );
        assert_eq!(
            dynamic("EXECUTE `S` USING @a"),
            Dynamic::Execute {
                name: "s".into(),
                using: Using::Unread,
            }
        );
        for sql in ["DEALLOCATE PREPARE s", "DROP PREPARE S"] {
            assert_eq!(
                dynamic(sql),
                Dynamic::Deallocate { name: "s".into() },
                "{sql}"
            );
        }
    }

    #[test]
    fn xa_statements_on_hscales_branches_are_refused_by_their_format_id_as_a_value() {
        for sql in [
            "XA ROLLBACK '4242-0a1b2c3d:17', '2', 1752392497",
            "XA COMMIT 'x','y',0x68736331",
            "xa commit X'4242', b'1', 1752392497",
            "XA ROLLBACK '4242' '-0a:17', _binary'2', 1752392497.0",
            "XA START 'a','b',1752392497",
            "SELECT 1; XA ROLLBACK 'a', 'b', 1752392497",
        ] {
            assert!(matches!(action(sql), Action::Refuse(_)), "{sql}");
        }
        for sql in [
            "XA ROLLBACK 'client-branch'",
            "XA COMMIT 'a', 'b'",
            "XA COMMIT 'a', 'b', 1752392498",
            "XA END 'a'",
        ] {
            assert!(is_main(sql), "{sql}");
        }
        assert!(matches!(action("XA RECOVER"), Action::XaRecover));
        assert!(matches!(
            action("xa recover format='SQL'"),
            Action::XaRecover
        ));
    }
}

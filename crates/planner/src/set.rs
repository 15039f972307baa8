//! What a SET statement does to a session, so that hscale can replay it on
//! another backend connection or knows it must not.

use crate::lexer::{Quoting, TokenKind, Tokens};
use crate::plan::ClientCharset;

/// The effect of one SET statement on the client's session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetItem {
    /// Session settings that replaying the statement text restores; the keys
    /// (lower-case variable names, or `names`) let a later SET replace it.
    Replayable(Vec<String>),
    /// Only server-wide or one-off effects (GLOBAL, PASSWORD, STATEMENT ... FOR).
    NoSessionState,
    /// State that only this connection can keep (SET TRANSACTION for the next
    /// transaction, user variables, roles, expressions with subqueries).
    BindsConnection,
}

/// Classifies `sql`, a statement whose first keyword is SET.
pub fn parse_set(sql: &str, quoting: Quoting) -> SetItem {
    let body = strip_executable_comment(sql.trim());
    let Some(rest) = strip_keyword(body, "set") else {
        return SetItem::BindsConnection;
    };
    let rest = rest.trim_end_matches([';', ' ', '\n', '\t', '\r']);
    let lead = first_word(rest).to_ascii_lowercase();
    match lead.as_str() {
        "names" | "character" | "charset" => return SetItem::Replayable(vec!["names".into()]),
        "password" | "statement" => return SetItem::NoSessionState,
        "transaction" | "role" | "default" => return SetItem::BindsConnection,
        _ => {}
    }
    if contains_word(rest, "select") {
        return SetItem::BindsConnection;
    }
    let mut keys = Vec::new();
    let mut globals = 0;
    let mut user_variables = 0;
    for item in split_top_level(rest, quoting) {
        match assignment_target(item.trim()) {
            Target::Session(name) => keys.push(name),
            Target::Global => globals += 1,
            // Lives on this connection; the session variables beside it
            // (mysqldump's `SET @OLD_SQL_MODE=@@SQL_MODE, SQL_MODE=...`)
            // are replayed by the values read back after it.
            Target::UserVariable => user_variables += 1,
            Target::Unknown => return SetItem::BindsConnection,
        }
    }
    match (keys.is_empty(), globals) {
        (true, _) if user_variables > 0 => SetItem::BindsConnection,
        (true, _) => SetItem::NoSessionState,
        (false, 0) => SetItem::Replayable(keys),
        // Replaying would set the global part again: keep the connection instead.
        (false, _) => SetItem::BindsConnection,
    }
}

/// The client character set after `sql`, a SET statement that `parse_set`
/// found replayable; `None` when it leaves `character_set_client` alone.
/// A value hscale cannot name (DEFAULT, an expression) counts as `Other`.
pub fn client_charset_after(sql: &str, quoting: Quoting) -> Option<ClientCharset> {
    let body = strip_executable_comment(sql.trim());
    let rest = strip_keyword(body, "set")?.trim_start();
    let named = |after: &str| Some(ClientCharset::named(charset_name(after)));
    if let Some(after) = strip_keyword(rest, "names").or_else(|| strip_keyword(rest, "charset")) {
        return named(after);
    }
    if let Some(after) = strip_keyword(rest, "character") {
        return named(strip_keyword(after.trim_start(), "set")?);
    }
    split_top_level(rest, quoting)
        .into_iter()
        .rev()
        .find_map(|item| {
            let item = item.trim();
            match assignment_target(item) {
                Target::Session(name) if name.eq_ignore_ascii_case("character_set_client") => {
                    let (_, value) = item.split_once('=')?;
                    named(value)
                }
                _ => None,
            }
        })
}

/// What a SET statement sets the session's autocommit to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Autocommit {
    On,
    Off,
    /// DEFAULT, a variable, an expression: known only once it ran.
    Unread,
}

/// The session's autocommit after `sql`, a statement whose first keyword is
/// SET: its last session assignment to it; `None` where it assigns none.
pub fn autocommit_after(sql: &str, quoting: Quoting) -> Option<Autocommit> {
    assignments(sql, quoting)?
        .into_iter()
        .rev()
        .find_map(|item| {
            let item = item.trim();
            match assignment_target(item) {
                Target::Session(name) if name.eq_ignore_ascii_case("autocommit") => {
                    let (_, value) = item.split_once('=')?;
                    let value = value.trim().trim_matches(|c| c == '\'' || c == '"');
                    Some(match value.to_ascii_lowercase().as_str() {
                        "1" | "on" | "true" => Autocommit::On,
                        "0" | "off" | "false" => Autocommit::Off,
                        _ => Autocommit::Unread,
                    })
                }
                _ => None,
            }
        })
}

/// Whether `sql`, a SET statement, assigns a user variable, which lives on
/// the connection that runs it.
pub fn assigns_user_variable(sql: &str, quoting: Quoting) -> bool {
    assignments(sql, quoting).is_some_and(|items| {
        items
            .iter()
            .any(|item| matches!(assignment_target(item.trim()), Target::UserVariable))
    })
}

/// The assignments of a SET statement, as written.
fn assignments(sql: &str, quoting: Quoting) -> Option<Vec<&str>> {
    let body = strip_executable_comment(sql.trim());
    let rest = strip_keyword(body, "set")?;
    let rest = rest.trim_end_matches([';', ' ', '\n', '\t', '\r']);
    Some(split_top_level(rest, quoting))
}

/// The charset a SET names: a word or a quoted name; empty for anything else.
fn charset_name(s: &str) -> &str {
    let s = s.trim_start();
    match s.chars().next() {
        Some(quote @ ('\'' | '"' | '`')) => s[1..].split(quote).next().unwrap_or(""),
        _ => first_word(s),
    }
}

enum Target {
    Session(String),
    Global,
    UserVariable,
    Unknown,
}

fn assignment_target(item: &str) -> Target {
    let lower = item.to_ascii_lowercase();
    let mut s = lower.as_str();
    let mut global = false;
    for (prefix, is_global) in [
        ("@@global.", true),
        ("@@persist.", true),
        ("@@persist_only.", true),
        ("@@session.", false),
        ("@@local.", false),
        ("@@", false),
    ] {
        if let Some(r) = s.strip_prefix(prefix) {
            s = r;
            global = is_global;
            break;
        }
    }
    if !item.starts_with("@@") {
        for (word, is_global) in [
            ("global", true),
            ("persist", true),
            ("persist_only", true),
            ("session", false),
            ("local", false),
        ] {
            if let Some(r) = strip_keyword(s, word) {
                s = r.trim_start();
                global = is_global;
                break;
            }
        }
    }
    if s.starts_with('@') {
        return Target::UserVariable;
    }
    let name_end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
        .unwrap_or(s.len());
    let name = s[..name_end].trim_matches('`');
    let after = s[name_end..].trim_start();
    if name.is_empty() || !(after.starts_with('=') || after.starts_with(":=")) {
        if lower.starts_with("session transaction") || lower.starts_with("local transaction") {
            return Target::Session("transaction".into());
        }
        if lower.starts_with("global transaction") {
            return Target::Global;
        }
        return Target::Unknown;
    }
    if global {
        Target::Global
    } else {
        Target::Session(name.to_string())
    }
}

fn strip_executable_comment(sql: &str) -> &str {
    let Some(inner) = sql.strip_prefix("/*!").or_else(|| sql.strip_prefix("/*M!")) else {
        return sql;
    };
    let inner = inner.trim_start_matches(|c: char| c.is_ascii_digit());
    inner.strip_suffix("*/").unwrap_or(inner).trim()
}

fn strip_keyword<'a>(s: &'a str, keyword: &str) -> Option<&'a str> {
    let head = s.get(..keyword.len())?;
    let next = s[keyword.len()..].chars().next();
    if head.eq_ignore_ascii_case(keyword)
        && next.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'))
    {
        Some(&s[keyword.len()..])
    } else {
        None
    }
}

fn first_word(s: &str) -> &str {
    let s = s.trim_start();
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

fn contains_word(s: &str, word: &str) -> bool {
    let lower = s.to_ascii_lowercase();
    lower.match_indices(word).any(|(at, _)| {
        let before = lower[..at].chars().next_back();
        let after = lower[at + word.len()..].chars().next();
        let boundary = |c: Option<char>| c.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        boundary(before) && boundary(after)
    })
}

/// Splits on commas outside parentheses, quotes and comments.
fn split_top_level(s: &str, quoting: Quoting) -> Vec<&str> {
    let mut items = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for token in Tokens::new(s.as_bytes(), quoting) {
        match token.kind {
            TokenKind::Symbol(b'(') => depth += 1,
            TokenKind::Symbol(b')') => depth -= 1,
            TokenKind::Symbol(b',') if depth == 0 => {
                items.push(&s[start..token.start]);
                start = token.end;
            }
            _ => {}
        }
    }
    items.push(&s[start..]);
    items
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(sql: &str) -> SetItem {
        parse_set(sql, Quoting::BACKSLASH_ESCAPES)
    }

    fn keys(sql: &str) -> Vec<String> {
        match classify(sql) {
            SetItem::Replayable(k) => k,
            other => panic!("{sql}: {other:?}"),
        }
    }

    #[test]
    fn autocommit_follows_the_last_session_assignment_to_it() {
        let after = |sql| autocommit_after(sql, Quoting::BACKSLASH_ESCAPES);
        assert_eq!(after("SET autocommit = 1"), Some(Autocommit::On));
        assert_eq!(after("set AUTOCOMMIT=ON;"), Some(Autocommit::On));
        assert_eq!(after("SET SESSION autocommit = true"), Some(Autocommit::On));
        assert_eq!(
            after("SET @@session.autocommit = 'on'"),
            Some(Autocommit::On)
        );
        assert_eq!(
            after("SET sql_mode = '', @@autocommit := 1"),
            Some(Autocommit::On)
        );
        assert_eq!(
            after("SET autocommit = 1, LOCAL autocommit = OFF"),
            Some(Autocommit::Off)
        );
        assert_eq!(after("SET autocommit = 0"), Some(Autocommit::Off));
        assert_eq!(after("SET autocommit = @on"), Some(Autocommit::Unread));
        assert_eq!(after("SET autocommit = DEFAULT"), Some(Autocommit::Unread));
        assert_eq!(after("SET autocommit = ?"), Some(Autocommit::Unread));
        assert_eq!(after("SET GLOBAL autocommit = 1"), None);
        assert_eq!(after("SET @autocommit = 1"), None);
        assert_eq!(after("SET sql_mode = 'autocommit=1'"), None);
        assert_eq!(after("SET NAMES utf8mb4"), None);
        let user = |sql| assigns_user_variable(sql, Quoting::BACKSLASH_ESCAPES);
        assert!(user("SET @x = 1, autocommit = 1"));
        assert!(user("SET autocommit = 1, @`x` := @@autocommit"));
        assert!(!user("SET autocommit = @x"));
        assert!(!user("SET @@session.autocommit = 1, sql_mode = '@x'"));
    }

    #[test]
    fn the_client_charset_follows_names_charset_and_character_set_client() {
        let after = |sql| client_charset_after(sql, Quoting::BACKSLASH_ESCAPES);
        assert_eq!(after("SET NAMES utf8mb4"), Some(ClientCharset::Utf8));
        assert_eq!(
            after("set names 'UTF8' COLLATE utf8_bin"),
            Some(ClientCharset::Utf8)
        );
        assert_eq!(
            after("/*!40101 SET NAMES latin1 */"),
            Some(ClientCharset::Other)
        );
        assert_eq!(
            after("SET CHARACTER SET `utf8mb3`"),
            Some(ClientCharset::Utf8)
        );
        assert_eq!(after("SET CHARSET cp1250"), Some(ClientCharset::Other));
        assert_eq!(after("SET NAMES DEFAULT"), Some(ClientCharset::Other));
        assert_eq!(
            after("SET @@session.character_set_client = 'latin1', sql_mode = ''"),
            Some(ClientCharset::Other)
        );
        assert_eq!(
            after("SET character_set_client = latin1, character_set_client = utf8mb4"),
            Some(ClientCharset::Utf8)
        );
        assert_eq!(after("SET character_set_results = latin1"), None);
        assert_eq!(after("SET sql_mode = 'ANSI'"), None);
    }

    #[test]
    fn session_variables_are_replayable_under_their_names() {
        assert_eq!(keys("SET sql_mode = 'ANSI'"), ["sql_mode"]);
        assert_eq!(
            keys("set @@session.wait_timeout=10, SESSION net_read_timeout = 5"),
            ["wait_timeout", "net_read_timeout"]
        );
        assert_eq!(keys("SET autocommit=0"), ["autocommit"]);
        assert_eq!(keys("SET LOCAL time_zone = '+00:00'"), ["time_zone"]);
        assert_eq!(
            keys("SET sql_mode = CONCAT(@@sql_mode, ',ANSI_QUOTES'), x = 'a,b'"),
            ["sql_mode", "x"]
        );
    }

    #[test]
    fn character_set_statements_share_one_key() {
        assert_eq!(
            keys("SET NAMES utf8mb4 COLLATE utf8mb4_unicode_ci"),
            ["names"]
        );
        assert_eq!(keys("SET CHARACTER SET latin1"), ["names"]);
        assert_eq!(keys("/*!40101 SET NAMES utf8 */"), ["names"]);
    }

    #[test]
    fn global_and_one_off_settings_leave_no_session_state() {
        assert_eq!(
            classify("SET GLOBAL max_connections = 100"),
            SetItem::NoSessionState
        );
        assert_eq!(
            classify("SET @@global.max_connections = 100"),
            SetItem::NoSessionState
        );
        assert_eq!(
            classify("SET STATEMENT max_statement_time=1 FOR SELECT 1"),
            SetItem::NoSessionState
        );
    }

    #[test]
    fn what_cannot_be_replayed_binds_the_connection() {
        assert_eq!(classify("SET @x = 1"), SetItem::BindsConnection);
        assert_eq!(
            classify("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"),
            SetItem::BindsConnection
        );
        assert_eq!(
            classify("SET sql_mode = (SELECT 'ANSI')"),
            SetItem::BindsConnection
        );
        assert_eq!(
            classify("SET GLOBAL a = 1, b = 2"),
            SetItem::BindsConnection
        );
        assert_eq!(classify("SET ROLE admin"), SetItem::BindsConnection);
    }

    #[test]
    fn session_transaction_characteristics_are_replayable() {
        assert_eq!(
            keys("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"),
            ["transaction"]
        );
    }

    #[test]
    fn items_are_split_as_the_server_reads_the_quotes() {
        let sql = "SET time_zone = 'C:\\', sql_mode = 'ANSI'";
        assert_eq!(keys(sql), ["time_zone"]);
        let plain = parse_set(sql, Quoting::NO_BACKSLASH_ESCAPES);
        assert_eq!(
            plain,
            SetItem::Replayable(vec!["time_zone".into(), "sql_mode".into()])
        );
        assert_eq!(keys("SET a = 1 /* , b */, c = 2"), ["a", "c"]);
    }

    #[test]
    fn session_variables_set_beside_user_variables_are_replayable() {
        assert_eq!(
            keys("/*!40101 SET @OLD_SQL_MODE=@@SQL_MODE, SQL_MODE='NO_AUTO_VALUE_ON_ZERO' */"),
            ["sql_mode"]
        );
        assert_eq!(
            keys("SET @a := 1, SESSION time_zone = '+01:00', @b = 2"),
            ["time_zone"]
        );
        assert_eq!(classify("SET @a = 1, @b = 2"), SetItem::BindsConnection);
    }
}

//! Values hscale answers for itself, where the backend would answer for its
//! own connection or server.
//!
//! CONNECTION_ID() answers the id hscale greeted the client with. Its backend
//! connection has another id, and a multiplexed client runs each statement on
//! whichever connection is free: `UPDATE jobs SET owner = CONNECTION_ID()` and a
//! later `SELECT ... WHERE owner = CONNECTION_ID()` must see the same number, so
//! the call is replaced by that number in the statement text before it is sent,
//! as Vitess does with its own session values.
//!
//! The system variables that say where "the server" is (`@@port`, `@@socket`,
//! `@@hostname`, ...) answer hscale's listener the same way: drivers use them
//! to reconnect (the Rust `mysql` crate and mysql_async move to the unix socket
//! `@@socket` names when the server is on their host), and a backend's answer
//! would take the client past routing, to the physical tables. hscale listens on
//! TCP only, so `@@socket` is empty: the drivers take an empty path for "no
//! socket", and NULL, which MariaDB never answers, makes the `mysql` crate panic.
//!
//! The replacement of CONNECTION_ID(), `CAST(0000000042 AS UNSIGNED)`, has the
//! function's own result type (INT UNSIGNED, display width 10), and is an
//! expression rather than a literal, so that `ORDER BY CONNECTION_ID()` does not
//! become a column position; the variables' have theirs (BIGINT, or a utf8mb3
//! string that may be NULL). A select-list item that contains a replaced call or
//! variable and has no alias is given its original text as alias, so the column
//! keeps the name MariaDB gives it.
//!
//! Statements that store SQL for later (CREATE VIEW, TRIGGER, PROCEDURE, EVENT;
//! ALTER) are left alone: they must keep the call, not one client's id.

use crate::lexer::{Quoting, Token, TokenKind, Tokens};

/// Longer names are not valid aliases (MariaDB's limit on a column name).
const MAX_ALIAS_LEN: usize = 256;

/// What the client's own connection to hscale answers.
#[derive(Clone, Copy, Debug)]
pub struct OwnValues<'a> {
    /// The id hscale greeted the client with.
    pub connection_id: u32,
    /// The port the client reached hscale on.
    pub port: u16,
    /// The address the client reached hscale at.
    pub address: std::net::IpAddr,
    /// The name of hscale's host.
    pub hostname: &'a str,
}

/// What a server-describing variable answers through hscale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ServerValue {
    Port,
    Zero,
    Empty,
    Null,
    Hostname,
    Address,
}

/// The global variables a client may read to find or reach the server again.
const SERVER_VARIABLES: &[(&[u8], ServerValue)] = &[
    (b"port", ServerValue::Port),
    (b"report_port", ServerValue::Port),
    (b"extra_port", ServerValue::Zero),
    (b"socket", ServerValue::Empty),
    (b"report_host", ServerValue::Null),
    (b"hostname", ServerValue::Hostname),
    (b"bind_address", ServerValue::Address),
];

fn server_value(name: &[u8]) -> Option<ServerValue> {
    SERVER_VARIABLES
        .iter()
        .find(|(known, _)| name.eq_ignore_ascii_case(known))
        .map(|&(_, value)| value)
}

/// Whether `@@name` (or `@@global.name`) is a variable hscale answers itself.
pub fn is_server_variable(name: &[u8]) -> bool {
    server_value(name).is_some()
}

impl OwnValues<'_> {
    fn text(&self, value: ServerValue) -> Vec<u8> {
        let string = |s: &str| {
            let hex: String = s.bytes().map(|b| format!("{b:02x}")).collect();
            format!("CAST(X'{hex}' AS CHAR CHARACTER SET utf8mb3)")
        };
        match value {
            // A literal of 19 digits is a BIGINT, as the variables are.
            ServerValue::Port => format!("CAST({:019} AS SIGNED)", self.port),
            ServerValue::Zero => format!("CAST({:019} AS SIGNED)", 0),
            ServerValue::Empty => string(""),
            ServerValue::Null => "CAST(NULL AS CHAR CHARACTER SET utf8mb3)".to_string(),
            ServerValue::Hostname => string(self.hostname),
            ServerValue::Address => string(&self.address.to_string()),
        }
        .into_bytes()
    }
}

/// `sql` with each CONNECTION_ID() call and server-describing variable
/// replaced by hscale's own value; `None` when there is none to replace.
pub fn replace_own_values(sql: &[u8], own: &OwnValues, quoting: Quoting) -> Option<Vec<u8>> {
    let mut lexer = Tokens::new(sql, quoting);
    let tokens: Vec<Token> = lexer.by_ref().collect();
    if lexer.unterminated {
        // The server refuses it as it is; an alias must not land inside the quote.
        return None;
    }
    let word = |t: &Token| (t.kind == TokenKind::Word).then(|| &sql[t.start..t.end]);
    let is_word = |t: &Token, w: &[u8]| word(t).is_some_and(|x| x.eq_ignore_ascii_case(w));
    let is_symbol = |t: Option<&Token>, c: u8| t.is_some_and(|t| t.kind == TokenKind::Symbol(c));

    let mut edits: Vec<Edit> = Vec::new();
    let mut lists: Vec<SelectList> = Vec::new();
    let mut depth = 0usize;
    let mut statement_start = 0usize;
    let mut i = 0;
    while i < tokens.len() {
        let token = &tokens[i];
        let stored = tokens
            .get(statement_start)
            .is_some_and(|t| is_word(t, b"create") || is_word(t, b"alter"));
        // The token that ends a replaced call or variable, and its value.
        let mut replaced: Option<(usize, Vec<u8>)> = None;
        match token.kind {
            TokenKind::Symbol(b'(') => depth += 1,
            TokenKind::Symbol(b')') => {
                while lists.last().is_some_and(|l| l.depth == depth) {
                    close_item(sql, &tokens, &mut lists, i, &mut edits);
                }
                depth = depth.saturating_sub(1);
            }
            TokenKind::Symbol(b';') => {
                while !lists.is_empty() {
                    close_item(sql, &tokens, &mut lists, i, &mut edits);
                }
                depth = 0;
                statement_start = i + 1;
            }
            TokenKind::Symbol(b',') if lists.last().is_some_and(|l| l.depth == depth) => {
                let list = lists.last_mut().expect("checked above");
                list.finish_item(sql, &tokens, i, &mut edits);
                list.start_item(i + 1);
            }
            TokenKind::SystemVariable if !stored => {
                let name = &sql[token.start + 2..token.end];
                // `@@global.port`; `@@session.port` is the server's error to give.
                let scoped = name.eq_ignore_ascii_case(b"global")
                    && is_symbol(tokens.get(i + 1), b'.')
                    && tokens.get(i + 2).and_then(word).is_some()
                    && tokens[i + 2].start == token.end + 1;
                let (name, last) = match scoped {
                    true => (word(&tokens[i + 2]).expect("checked above"), i + 2),
                    false => (name, i),
                };
                replaced = server_value(name).map(|value| (last, own.text(value)));
            }
            TokenKind::Word => {
                let w = word(token).expect("a word");
                let in_list = lists.last().is_some_and(|l| l.depth == depth);
                if w.eq_ignore_ascii_case(b"select") {
                    lists.push(SelectList::new(depth, i + 1));
                } else if in_list && ENDS_SELECT_LIST.iter().any(|k| w.eq_ignore_ascii_case(k)) {
                    close_item(sql, &tokens, &mut lists, i, &mut edits);
                } else if in_list
                    && lists.last().is_some_and(|l| l.item_start == i)
                    && SELECT_MODIFIERS.iter().any(|k| w.eq_ignore_ascii_case(k))
                {
                    lists.last_mut().expect("checked above").start_item(i + 1);
                } else if w.eq_ignore_ascii_case(b"connection_id")
                    && !stored
                    && is_symbol(tokens.get(i + 1), b'(')
                    && is_symbol(tokens.get(i + 2), b')')
                {
                    let id = own.connection_id;
                    replaced = Some((i + 2, format!("CAST({id:010} AS UNSIGNED)").into_bytes()));
                }
            }
            _ => {}
        }
        if let Some((last, text)) = replaced {
            edits.push(Edit {
                start: token.start,
                end: tokens[last].end,
                text,
            });
            for list in &mut lists {
                list.item_has_call = true;
            }
            i = last + 1;
            continue;
        }
        i += 1;
    }
    while !lists.is_empty() {
        close_item(sql, &tokens, &mut lists, tokens.len(), &mut edits);
    }
    if edits.is_empty() {
        return None;
    }
    // Aliases are inserted where an item ends, after the replacement that ends there.
    edits.sort_by_key(|e| (e.start, e.end == e.start));
    let mut out = Vec::with_capacity(sql.len() + edits.len() * 32);
    let mut at = 0;
    for edit in &edits {
        out.extend_from_slice(&sql[at..edit.start]);
        out.extend_from_slice(&edit.text);
        at = edit.end;
    }
    out.extend_from_slice(&sql[at..]);
    Some(out)
}

/// Words that end a select list at its own depth.
const ENDS_SELECT_LIST: &[&[u8]] = &[
    b"from",
    b"into",
    b"where",
    b"group",
    b"having",
    b"order",
    b"limit",
    b"union",
    b"except",
    b"intersect",
    b"minus",
    b"for",
    b"lock",
    b"window",
    b"procedure",
    b"on",
];

/// Words between SELECT and its first item.
const SELECT_MODIFIERS: &[&[u8]] = &[
    b"all",
    b"distinct",
    b"distinctrow",
    b"high_priority",
    b"straight_join",
    b"sql_small_result",
    b"sql_big_result",
    b"sql_buffer_result",
    b"sql_cache",
    b"sql_no_cache",
    b"sql_calc_found_rows",
];

/// Words that end an expression without being its alias.
const NOT_AN_ALIAS: &[&[u8]] = &[b"null", b"true", b"false", b"unknown", b"end"];

/// Words after which the next word is an operand, not an alias.
const TAKES_OPERAND: &[&[u8]] = &[
    b"and",
    b"or",
    b"xor",
    b"not",
    b"is",
    b"like",
    b"in",
    b"between",
    b"div",
    b"mod",
    b"regexp",
    b"rlike",
    b"binary",
    b"interval",
    b"escape",
    b"collate",
    b"then",
    b"else",
    b"when",
    b"case",
    b"as",
    b"sounds",
];

struct Edit {
    start: usize,
    end: usize,
    text: Vec<u8>,
}

/// A select list being read: the depth of its SELECT and where its current item
/// began.
struct SelectList {
    depth: usize,
    item_start: usize,
    item_has_call: bool,
}

impl SelectList {
    fn new(depth: usize, item_start: usize) -> SelectList {
        SelectList {
            depth,
            item_start,
            item_has_call: false,
        }
    }

    fn start_item(&mut self, at: usize) {
        self.item_start = at;
        self.item_has_call = false;
    }

    /// The item ends before token `end`: alias it if it holds a call and has none.
    fn finish_item(&self, sql: &[u8], tokens: &[Token], end: usize, edits: &mut Vec<Edit>) {
        let item = &tokens[self.item_start.min(end)..end];
        let (Some(first), Some(last)) = (item.first(), item.last()) else {
            return;
        };
        // A complete expression ends in one of these; after anything else (an
        // operator: the server will refuse the statement) the alias could
        // change how the text reads (`--` and a space begin a comment).
        let complete = match last.kind {
            TokenKind::Word
            | TokenKind::Quoted(_)
            | TokenKind::Number
            | TokenKind::SystemVariable => true,
            TokenKind::Symbol(c) => c == b')',
            _ => false,
        };
        if !self.item_has_call || !complete || has_alias(sql, item) {
            return;
        }
        let name = &sql[first.start..last.end];
        if name.len() > MAX_ALIAS_LEN {
            return;
        }
        let mut text = b" AS `".to_vec();
        for &c in name {
            if c == b'`' {
                text.push(b'`');
            }
            text.push(c);
        }
        text.push(b'`');
        edits.push(Edit {
            start: last.end,
            end: last.end,
            text,
        });
    }
}

/// Ends the current item of the innermost select list, and the list.
fn close_item(
    sql: &[u8],
    tokens: &[Token],
    lists: &mut Vec<SelectList>,
    end: usize,
    edits: &mut Vec<Edit>,
) {
    if let Some(list) = lists.pop() {
        list.finish_item(sql, tokens, end, edits);
    }
}

/// `expr AS name`, `expr name`, `expr 'name'`: an AS at the item's own depth, or
/// a last word or quoted name that follows a complete expression.
fn has_alias(sql: &[u8], item: &[Token]) -> bool {
    let word_in = |t: &Token, set: &[&[u8]]| {
        t.kind == TokenKind::Word
            && set
                .iter()
                .any(|w| sql[t.start..t.end].eq_ignore_ascii_case(w))
    };
    let mut depth = 0usize;
    for token in item {
        match token.kind {
            TokenKind::Symbol(b'(') => depth += 1,
            TokenKind::Symbol(b')') => depth = depth.saturating_sub(1),
            TokenKind::Word if depth == 0 && word_in(token, &[b"as"]) => return true,
            _ => {}
        }
    }
    let [.., before, last] = item else {
        return false;
    };
    let names = matches!(last.kind, TokenKind::Word | TokenKind::Quoted(_));
    let follows_expression = match before.kind {
        TokenKind::Symbol(b')') | TokenKind::Quoted(_) | TokenKind::SystemVariable => true,
        TokenKind::Word => !word_in(before, TAKES_OPERAND),
        _ => false,
    };
    names && !word_in(last, NOT_AN_ALIAS) && follows_expression
}

#[cfg(test)]
mod tests;

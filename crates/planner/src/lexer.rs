//! A single pass over a statement's tokens, without allocation: its kind, the
//! features that bind a session to its backend connection, and whether it may
//! name a partitioned table (only then is it parsed).

use crate::dictionary::TableNames;
use crate::own_values::is_server_variable;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Select,
    Insert,
    Update,
    Delete,
    Replace,
    Set,
    Use,
    Begin,
    Commit,
    Rollback,
    Lock,
    Unlock,
    CreateTemporary,
    /// PREPARE, EXECUTE, DEALLOCATE: server-side statements named in SQL.
    SqlPrepared,
    Handler,
    /// CALL: a stored procedure may change session state hscale cannot see.
    Call,
    Xa,
    /// DROP DATABASE / DROP SCHEMA: a connection whose database it was has none after.
    DropDatabase,
    /// KILL: names a connection by the id its client was given.
    Kill,
    /// HSCALE ...: an admin command hscale answers itself.
    Admin,
    Other,
    Empty,
}

/// What hscale must know of a statement before it picks a backend connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub kind: Kind,
    /// `@name`, a user variable: session state that lives only on the server.
    pub user_variables: bool,
    /// GET_LOCK and friends: locks owned by the server connection.
    pub user_lock: bool,
    /// SQL_CALC_FOUND_ROWS / FOUND_ROWS(): ties a statement to the one before it.
    pub found_rows: bool,
    /// LAST_INSERT_ID(): answered by the connection that did the insert.
    pub last_insert_id: bool,
    /// ROW_COUNT() / FOUND_ROWS(): answered from the statement before, so only
    /// by the connection that ran it.
    pub reads_previous_statement: bool,
    /// SHOW WARNINGS, SHOW ERRORS, SHOW COUNT(*) WARNINGS, GET DIAGNOSTICS,
    /// @@warning_count, @@error_count: the messages the statement before
    /// left, which only the connection that ran it keeps.
    pub reads_diagnostics: bool,
    /// CONNECTION_ID() or a variable naming the server (`@@port`, `@@socket`),
    /// which must answer the client's connection to hscale, not the backend's
    /// (`own_values`).
    pub own_values: bool,
    /// More than one statement in one COM_QUERY.
    pub multi_statement: bool,
    /// Every statement of the query reads or writes rows or controls the
    /// transaction (SELECT, INSERT, UPDATE, DELETE, REPLACE, BEGIN, COMMIT,
    /// ROLLBACK): none changes session state that hscale would have to follow.
    pub every_statement_plain: bool,
    /// A word or quoted identifier of the statement is the name of a
    /// partitioned table (in some database): the statement must be planned.
    pub names_partitioned: bool,
    /// The statement names hscale's schema, a default or partition table,
    /// or one of hscale's user locks (`TableNames::guards`): only an admin
    /// may run it.
    pub names_guarded: bool,
    /// The statement locks rows (FOR UPDATE, FOR SHARE, LOCK IN SHARE
    /// MODE), advances a sequence (NEXTVAL, SETVAL) or sends its answer
    /// elsewhere (INTO): a SELECT that only a primary may run.
    pub locks_or_writes: bool,
    /// A `/* hscale:replica */` or `/* hscale:primary */` comment: where
    /// the statement's read goes, whatever the user's `reads` says.
    pub reads_hint: Option<ReadsHint>,
}

/// Where a statement's comment asks its read to go (docs/replicas.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadsHint {
    Replica,
    Primary,
}

impl ReadsHint {
    /// The hint a block comment's text (between `/*` and `*/`) gives.
    fn of_comment(text: &[u8]) -> Option<ReadsHint> {
        let text = text.strip_suffix(b"*/").unwrap_or(text).trim_ascii();
        if text.eq_ignore_ascii_case(b"hscale:replica") {
            Some(ReadsHint::Replica)
        } else if text.eq_ignore_ascii_case(b"hscale:primary") {
            Some(ReadsHint::Primary)
        } else {
            None
        }
    }
}

impl Summary {
    /// True when the statement leaves state on its connection that only that
    /// connection can honour later.
    pub fn binds_connection(&self) -> bool {
        self.user_variables
            || self.user_lock
            || self.found_rows
            || matches!(
                self.kind,
                Kind::Lock
                    | Kind::CreateTemporary
                    | Kind::SqlPrepared
                    | Kind::Handler
                    | Kind::Xa
                    | Kind::Call
            )
    }

    /// Several statements that hscale cannot follow one by one: it reads the
    /// session changes of a query's first statement only.
    pub fn multi_statement_binds(&self) -> bool {
        self.multi_statement && !self.every_statement_plain
    }
}

impl Kind {
    fn is_plain(self) -> bool {
        matches!(
            self,
            Kind::Select
                | Kind::Insert
                | Kind::Update
                | Kind::Delete
                | Kind::Replace
                | Kind::Begin
                | Kind::Commit
                | Kind::Rollback
        )
    }
}

/// How the session's sql_mode reads quotes. Read the wrong way, `'C:\'; SET
/// @x = 1` is one string instead of two statements, and `"users"` a string
/// instead of a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Quoting {
    /// NO_BACKSLASH_ESCAPES: a backslash in a string is a plain character,
    /// not an escape. The server tells its clients in the status flags of
    /// every OK and EOF.
    pub no_backslash_escapes: bool,
    /// ANSI_QUOTES (also in ANSI): `"..."` quotes an identifier, as a
    /// backtick does, not a string. The server does not tell: hscale asks
    /// after a SET of sql_mode.
    pub ansi_quotes: bool,
}

impl Quoting {
    /// MySQL's default.
    pub const BACKSLASH_ESCAPES: Quoting = Quoting {
        no_backslash_escapes: false,
        ansi_quotes: false,
    };
    pub const NO_BACKSLASH_ESCAPES: Quoting = Quoting {
        no_backslash_escapes: true,
        ansi_quotes: false,
    };

    /// Whether `quote` opens an identifier rather than a string.
    pub fn quotes_identifier(self, quote: u8) -> bool {
        quote == b'`' || (quote == b'"' && self.ansi_quotes)
    }
}

/// Whether a value of @@sql_mode has `mode` (as the server lists it: ANSI
/// comes with ANSI_QUOTES spelt out).
pub fn sql_mode_has(sql_mode: &str, mode: &str) -> bool {
    sql_mode
        .split(',')
        .any(|m| m.trim().eq_ignore_ascii_case(mode))
}

/// A lexical token of a statement; its bytes are `sql[start..end]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Token {
    pub kind: TokenKind,
    pub start: usize,
    pub end: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenKind {
    /// A keyword or an unquoted identifier.
    Word,
    /// A string or quoted identifier; the quote character.
    Quoted(u8),
    /// `@name`: a user variable (the name follows as its own token).
    UserVariable,
    /// `@@name` or `@@scope.name`, up to the first dot.
    SystemVariable,
    /// A number literal: digits, a fraction, an exponent (`12`, `1.5`, `2e-3`).
    Number,
    /// Any other byte: punctuation, operators, digits.
    Symbol(u8),
}

/// The tokens of a statement, without whitespace and comments. MySQL's
/// executable comments `/*! ... */` are read as code, as the server reads them.
pub(crate) struct Tokens<'a> {
    sql: &'a [u8],
    at: usize,
    quoting: Quoting,
    /// A string or quoted identifier ran to the end of the text: the server
    /// will refuse the statement.
    pub unterminated: bool,
    /// The first comment that is a hint, if any.
    pub reads_hint: Option<ReadsHint>,
}

impl<'a> Tokens<'a> {
    pub fn new(sql: &'a [u8], quoting: Quoting) -> Tokens<'a> {
        Tokens {
            sql,
            at: 0,
            quoting,
            unterminated: false,
            reads_hint: None,
        }
    }
}

impl Iterator for Tokens<'_> {
    type Item = Token;

    #[inline]
    fn next(&mut self) -> Option<Token> {
        let sql = self.sql;
        let mut start = self.at;
        loop {
            while sql
                .get(start)
                .is_some_and(|c| matches!(c, b' ' | b'\t' | b'\r' | b'\n'))
            {
                start += 1;
            }
            let &c = sql.get(start)?;
            let next = || sql.get(start + 1).copied();
            let (kind, end) = match c {
                c if c.is_ascii_alphabetic() || c == b'_' => {
                    (TokenKind::Word, skip_word(sql, start))
                }
                c if c.is_ascii_digit() => match skip_number(sql, start) {
                    Some(end) => (TokenKind::Number, end),
                    // `1abc` is an identifier, `0x1f` a hex literal: words.
                    None => (TokenKind::Word, skip_word(sql, start)),
                },
                b'#' => {
                    start = skip_line(sql, start);
                    continue;
                }
                b'-' if next() == Some(b'-')
                    && sql.get(start + 2).is_none_or(|c| c.is_ascii_whitespace()) =>
                {
                    start = skip_line(sql, start);
                    continue;
                }
                b'/' if next() == Some(b'*') => {
                    start = match sql.get(start + 2) {
                        Some(b'!') => skip_digits(sql, start + 3),
                        Some(b'M') if sql.get(start + 3) == Some(&b'!') => {
                            skip_digits(sql, start + 4)
                        }
                        _ => {
                            let end = skip_block_comment(sql, start);
                            if self.reads_hint.is_none() {
                                self.reads_hint = ReadsHint::of_comment(&sql[start + 2..end]);
                            }
                            end
                        }
                    };
                    continue;
                }
                // The end of an executable comment.
                b'*' if next() == Some(b'/') => {
                    start += 2;
                    continue;
                }
                b'\'' | b'"' | b'`' => {
                    let end = skip_quoted(sql, start, self.quoting);
                    self.unterminated |= end.is_none();
                    (TokenKind::Quoted(c), end.unwrap_or(sql.len()))
                }
                b'@' if next() == Some(b'@') => {
                    (TokenKind::SystemVariable, skip_word(sql, start + 2))
                }
                b'@' => (TokenKind::UserVariable, start + 1),
                c => (TokenKind::Symbol(c), start + 1),
            };
            self.at = end;
            return Some(Token { kind, start, end });
        }
    }
}

impl Kind {
    /// Changes rows: what `transactions = "single"` keeps on one backend.
    pub fn writes(self) -> bool {
        matches!(
            self,
            Kind::Insert | Kind::Update | Kind::Delete | Kind::Replace
        )
    }
}

pub fn summarize(sql: &[u8], quoting: Quoting, partitioned: &TableNames) -> Summary {
    summarize_into(sql, quoting, partitioned, |_| {})
}

/// `summarize`, handing every token to `sink` on the way: planning reads a
/// statement's tokens once.
pub(crate) fn summarize_into(
    sql: &[u8],
    quoting: Quoting,
    partitioned: &TableNames,
    mut sink: impl FnMut(Token),
) -> Summary {
    let check_names = !partitioned.is_empty();
    let check_guarded = partitioned.guards_any();
    let mut s = Summary {
        kind: Kind::Empty,
        user_variables: false,
        user_lock: false,
        found_rows: false,
        last_insert_id: false,
        reads_previous_statement: false,
        reads_diagnostics: false,
        own_values: false,
        multi_statement: false,
        every_statement_plain: true,
        names_partitioned: false,
        names_guarded: false,
        locks_or_writes: false,
        reads_hint: None,
    };
    let mut previous_word: &[u8] = b"";
    let mut words = 0usize;
    let mut statement_words = 0usize;
    let mut first = Kind::Empty;
    let mut first_is_create = false;
    let mut after_statement_end = false;
    let mut tokens = Tokens::new(sql, quoting);
    for token in &mut tokens {
        sink(token);
        match token.kind {
            TokenKind::Symbol(b'(' | b')' | b',') => continue,
            TokenKind::SystemVariable => {
                let name = &sql[token.start + 2..token.end];
                if is_diagnostics_count(name) {
                    s.reads_diagnostics |= !after_statement_end;
                }
                s.own_values |= is_server_variable(name);
                continue;
            }
            TokenKind::Symbol(b';') => {
                after_statement_end = true;
                statement_words = 0;
                continue;
            }
            TokenKind::UserVariable => s.user_variables = true,
            TokenKind::Word => {
                let word = &sql[token.start..token.end];
                if words == 0 {
                    first = first_keyword(word);
                    first_is_create = word.eq_ignore_ascii_case(b"create");
                } else if words == 1
                    && first == Kind::Other
                    && sql[..token.start]
                        .trim_ascii()
                        .eq_ignore_ascii_case(b"drop")
                    && (word.eq_ignore_ascii_case(b"database")
                        || word.eq_ignore_ascii_case(b"schema"))
                {
                    first = Kind::DropDatabase;
                } else if first_is_create && words <= 3 && word.eq_ignore_ascii_case(b"temporary") {
                    // CREATE [OR REPLACE] TEMPORARY TABLE
                    first = Kind::CreateTemporary;
                }
                if words == 1 && first == Kind::Other && !after_statement_end {
                    s.reads_diagnostics |=
                        asks_for_diagnostics(sql[..token.start].trim_ascii(), word);
                }
                note_function(word, after_statement_end, &mut s);
                s.locks_or_writes |= locks_or_writes(previous_word, word);
                previous_word = word;
                // `@@global.port`: the prefix is its own token.
                let global = b"@@global.";
                s.own_values |= sql[..token.start].len() >= global.len()
                    && sql[token.start - global.len()..token.start].eq_ignore_ascii_case(global)
                    && is_server_variable(word);
                if is_diagnostics_count(word) {
                    // `@@session.warning_count`: the prefix is its own token.
                    let before = sql[..token.start].to_ascii_lowercase();
                    s.reads_diagnostics |= !after_statement_end
                        && (before.ends_with(b"@@session.") || before.ends_with(b"@@local."));
                }
                s.names_partitioned |= check_names && partitioned.contains(word);
                s.names_guarded |= check_guarded && partitioned.guards(word);
            }
            TokenKind::Quoted(quote) if quoting.quotes_identifier(quote) => {
                let quoted = &sql[token.start + 1..token.end];
                let name = quoted.strip_suffix(&[quote]).unwrap_or(quoted);
                s.names_partitioned |= check_names && partitioned.contains(name);
                s.names_guarded |= check_guarded && partitioned.guards(name);
            }
            TokenKind::Quoted(_) | TokenKind::Symbol(_) | TokenKind::Number => {}
        }
        if statement_words == 0 {
            let plain = token.kind == TokenKind::Word
                && first_keyword(&sql[token.start..token.end]).is_plain();
            s.every_statement_plain &= plain;
        }
        s.multi_statement |= after_statement_end;
        words += 1;
        statement_words += 1;
    }
    s.kind = first;
    s.reads_hint = tokens.reads_hint;
    s.reads_previous_statement |= s.reads_diagnostics;
    // Lock names, by value: `'hscale' '.admin'`, `0x6873...`, CONCAT(...).
    if check_guarded && (s.user_lock || mentions_lock_test(sql)) {
        s.names_guarded |= crate::literal::names_guarded_lock(sql, quoting, partitioned);
    }
    s
}

/// How many `?` placeholders a statement has, outside strings, quoted
/// identifiers and comments.
/// The statement with each `?` placeholder replaced by the SQL of the
/// value at its index; `None` if it has another number of them.
pub fn with_literals(sql: &[u8], quoting: Quoting, literals: &[String]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(sql.len() + 16 * literals.len());
    let mut at = 0;
    let mut next = literals.iter();
    for token in Tokens::new(sql, quoting) {
        if token.kind == TokenKind::Symbol(b'?') {
            out.extend_from_slice(&sql[at..token.start]);
            out.extend_from_slice(next.next()?.as_bytes());
            at = token.start + 1;
        }
    }
    if next.next().is_some() {
        return None;
    }
    out.extend_from_slice(&sql[at..]);
    Some(out)
}

pub fn placeholders(sql: &[u8], quoting: Quoting) -> usize {
    Tokens::new(sql, quoting)
        .filter(|t| t.kind == TokenKind::Symbol(b'?'))
        .count()
}

/// The statements of a query, split at each `;` outside strings, quoted
/// identifiers and comments, without the empty ones.
pub(crate) fn statements(sql: &[u8], quoting: Quoting) -> Vec<&[u8]> {
    let mut statements = Vec::new();
    let mut start = 0;
    let ends = Tokens::new(sql, quoting)
        .filter(|t| t.kind == TokenKind::Symbol(b';'))
        .map(|t| t.start)
        .chain([sql.len()]);
    for end in ends {
        let statement = &sql[start..end];
        if Tokens::new(statement, quoting).next().is_some() {
            statements.push(statement);
        }
        start = end + 1;
    }
    statements
}

/// `first` and `second` begin SHOW WARNINGS, SHOW ERRORS, SHOW COUNT(*)
/// WARNINGS|ERRORS or GET [CURRENT|STACKED] DIAGNOSTICS.
fn asks_for_diagnostics(first: &[u8], second: &[u8]) -> bool {
    let is = |word: &[u8], w: &[u8]| word.eq_ignore_ascii_case(w);
    (is(first, b"show")
        && (is(second, b"warnings") || is(second, b"errors") || is(second, b"count")))
        || (is(first, b"get")
            && (is(second, b"diagnostics") || is(second, b"current") || is(second, b"stacked")))
}

fn is_diagnostics_count(name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(b"warning_count") || name.eq_ignore_ascii_case(b"error_count")
}

/// The database a `USE db` or `DROP DATABASE [IF EXISTS] db` names.
pub fn target_database(sql: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(sql);
    let mut rest = text.trim();
    for keyword in ["use", "drop", "database", "schema", "if", "exists"] {
        let Some(head) = rest.get(..keyword.len()) else {
            continue;
        };
        let boundary = rest[keyword.len()..].starts_with(|c: char| c.is_whitespace() || c == '`');
        if head.eq_ignore_ascii_case(keyword) && boundary {
            rest = rest[keyword.len()..].trim_start();
        }
    }
    let rest = rest.trim_end_matches(|c: char| c == ';' || c.is_whitespace());
    let name = match rest.strip_prefix('`') {
        Some(quoted) => quoted.strip_suffix('`')?.replace("``", "`"),
        None => rest.to_string(),
    };
    (!name.is_empty()).then_some(name)
}

/// `in_later_statement`: past the first `;`, where ROW_COUNT() and FOUND_ROWS()
/// read a statement of the same query, on the same connection.
/// IS_USED_LOCK( or IS_FREE_LOCK(, which bind no connection but name a
/// lock; looked for only where hscale's locks are guarded.
fn mentions_lock_test(sql: &[u8]) -> bool {
    let lower = sql.to_ascii_lowercase();
    let has = |needle: &[u8]| lower.windows(needle.len()).any(|w| w == needle);
    has(b"is_used_lock") || has(b"is_free_lock")
}

/// `word`, after `previous`, makes a SELECT lock rows, write a sequence or
/// send its rows elsewhere.
fn locks_or_writes(previous: &[u8], word: &[u8]) -> bool {
    let is = |w: &[u8], like: &[u8]| w.eq_ignore_ascii_case(like);
    match word.len() {
        4 => is(word, b"into"),
        5 => is(word, b"share") && (is(previous, b"for") || is(previous, b"in")),
        6 => (is(word, b"update") && is(previous, b"for")) || is(word, b"setval"),
        7 => is(word, b"nextval"),
        _ => false,
    }
}

fn note_function(word: &[u8], in_later_statement: bool, s: &mut Summary) {
    if word.len() < 8 {
        return;
    }
    let is = |w: &[u8]| word.eq_ignore_ascii_case(w);
    if is(b"get_lock") || is(b"release_lock") || is(b"release_all_locks") {
        s.user_lock = true;
    } else if is(b"sql_calc_found_rows") {
        s.found_rows = true;
    } else if is(b"found_rows") {
        s.found_rows = true;
        s.reads_previous_statement |= !in_later_statement;
    } else if is(b"row_count") {
        s.reads_previous_statement |= !in_later_statement;
    } else if is(b"last_insert_id") {
        s.last_insert_id = true;
    } else if is(b"connection_id") {
        s.own_values = true;
    }
}

fn first_keyword(word: &[u8]) -> Kind {
    let is = |w: &[u8]| word.eq_ignore_ascii_case(w);
    match word.len() {
        3 if is(b"set") => Kind::Set,
        3 if is(b"use") => Kind::Use,
        2 if is(b"xa") => Kind::Xa,
        4 if is(b"lock") => Kind::Lock,
        4 if is(b"kill") => Kind::Kill,
        4 if is(b"call") => Kind::Call,
        5 if is(b"begin") => Kind::Begin,
        5 if is(b"start") => Kind::Begin,
        6 if is(b"select") => Kind::Select,
        6 if is(b"hscale") => Kind::Admin,
        6 if is(b"insert") => Kind::Insert,
        6 if is(b"update") => Kind::Update,
        6 if is(b"delete") => Kind::Delete,
        6 if is(b"commit") => Kind::Commit,
        6 if is(b"unlock") => Kind::Unlock,
        7 if is(b"replace") => Kind::Replace,
        7 if is(b"prepare") || is(b"execute") || is(b"handler") => {
            if is(b"handler") {
                Kind::Handler
            } else {
                Kind::SqlPrepared
            }
        }
        8 if is(b"rollback") => Kind::Rollback,
        10 if is(b"deallocate") => Kind::SqlPrepared,
        _ => Kind::Other,
    }
}

/// Bytes that continue an unquoted identifier or keyword.
const WORD_BYTE: [bool; 256] = {
    let mut table = [false; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        table[c] = b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80;
        c += 1;
    }
    table
};

fn skip_word(sql: &[u8], i: usize) -> usize {
    sql[i..]
        .iter()
        .position(|&c| !WORD_BYTE[usize::from(c)])
        .map_or(sql.len(), |p| i + p)
}

/// The end of the number at `i`, or `None` if the digits run into a word.
fn skip_number(sql: &[u8], i: usize) -> Option<usize> {
    let mut end = skip_digits(sql, i);
    if sql.get(end) == Some(&b'.') {
        end = skip_digits(sql, end + 1);
    }
    if matches!(sql.get(end), Some(b'e' | b'E')) {
        let sign = usize::from(matches!(sql.get(end + 1), Some(b'+' | b'-')));
        if sql.get(end + 1 + sign).is_some_and(u8::is_ascii_digit) {
            end = skip_digits(sql, end + 1 + sign);
        }
    }
    match sql.get(end) {
        Some(&c) if WORD_BYTE[usize::from(c)] => None,
        _ => Some(end),
    }
}

/// Under ANSI_QUOTES, `sql` with each `"..."` identifier quoted with
/// backticks instead, which every sql_mode reads as an identifier: the
/// parser and everything after it then read the statement as the server
/// does. Byte for byte the same length, so token positions still hold; an
/// identifier holding a quote or a backtick cannot be kept so (`Err`).
/// `None`: nothing to change.
pub(crate) fn ansi_identifiers_as_backticks(
    sql: &[u8],
    quoting: Quoting,
) -> Result<Option<Vec<u8>>, ()> {
    if !quoting.ansi_quotes || !sql.contains(&b'"') {
        return Ok(None);
    }
    let mut out = sql.to_vec();
    for token in Tokens::new(sql, quoting) {
        if token.kind != TokenKind::Quoted(b'"') || token.end - token.start < 2 {
            continue;
        }
        let inner = &sql[token.start + 1..token.end - 1];
        if inner.contains(&b'"') || inner.contains(&b'`') || sql[token.end - 1] != b'"' {
            return Err(());
        }
        out[token.start] = b'`';
        out[token.end - 1] = b'`';
    }
    Ok(Some(out))
}

fn skip_digits(sql: &[u8], mut i: usize) -> usize {
    while i < sql.len() && sql[i].is_ascii_digit() {
        i += 1;
    }
    i
}

/// The end of the quoted text at `start`; `None` if it runs to the end.
fn skip_quoted(sql: &[u8], start: usize, quoting: Quoting) -> Option<usize> {
    let quote = sql[start];
    let escapes = !quoting.quotes_identifier(quote) && !quoting.no_backslash_escapes;
    let mut i = start + 1;
    while i < sql.len() {
        match sql[i] {
            b'\\' if escapes => i += 2,
            c if c == quote => {
                if sql.get(i + 1) == Some(&quote) {
                    i += 2;
                } else {
                    return Some(i + 1);
                }
            }
            _ => i += 1,
        }
    }
    None
}

fn skip_line(sql: &[u8], i: usize) -> usize {
    sql[i..]
        .iter()
        .position(|c| *c == b'\n')
        .map_or(sql.len(), |p| i + p + 1)
}

fn skip_block_comment(sql: &[u8], i: usize) -> usize {
    let mut at = i + 2;
    while let Some(star) = sql[at..].iter().position(|&c| c == b'*') {
        at += star + 1;
        if sql.get(at) == Some(&b'/') {
            return at + 1;
        }
    }
    sql.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(sql: &[u8]) -> Summary {
        summarize(sql, Quoting::BACKSLASH_ESCAPES, &TableNames::default())
    }

    fn kind(sql: &str) -> Kind {
        summary(sql.as_bytes()).kind
    }

    #[test]
    fn placeholders_are_counted_outside_strings_names_and_comments() {
        let count = |sql: &str| placeholders(sql.as_bytes(), Quoting::BACKSLASH_ESCAPES);
        assert_eq!(count("SELECT a FROM t WHERE b = ? AND c IN (?, ?)"), 3);
        assert_eq!(
            count("SELECT '?', `?`, \"?\" /* ? */ FROM t -- ?\n WHERE a=?"),
            1
        );
        assert_eq!(count("SELECT 1"), 0);
    }

    #[test]
    fn selects_that_lock_or_write_are_told_apart_from_plain_reads() {
        let locks = |sql: &str| summary(sql.as_bytes()).locks_or_writes;
        for sql in [
            "SELECT * FROM t WHERE id = 1 FOR UPDATE",
            "select * from t for share",
            "SELECT * FROM t LOCK IN SHARE MODE",
            "SELECT NEXTVAL(s)",
            "SELECT setval(s, 10)",
            "SELECT a INTO @x FROM t",
            "SELECT * FROM t INTO OUTFILE '/tmp/x'",
        ] {
            assert!(locks(sql), "{sql}");
        }
        for sql in [
            "SELECT * FROM t WHERE id = 1",
            "SELECT `update`, share FROM t",
            "SELECT 'FOR UPDATE' FROM t",
            "SELECT * FROM t /* for update */",
        ] {
            assert!(!locks(sql), "{sql}");
        }
    }

    #[test]
    fn a_comment_hint_says_where_a_read_goes() {
        let hint = |sql: &str| summary(sql.as_bytes()).reads_hint;
        assert_eq!(
            hint("SELECT /* hscale:replica */ * FROM t"),
            Some(ReadsHint::Replica)
        );
        assert_eq!(
            hint("/*HSCALE:PRIMARY*/ SELECT 1"),
            Some(ReadsHint::Primary)
        );
        assert_eq!(
            hint("SELECT 1 /* hscale:primary */ /* hscale:replica */"),
            Some(ReadsHint::Primary)
        );
        assert_eq!(hint("SELECT '/* hscale:replica */'"), None);
        assert_eq!(hint("SELECT 1 -- hscale:replica"), None);
        assert_eq!(hint("SELECT /* hscale:replicas please */ 1"), None);
        assert_eq!(hint("SELECT /*! hscale:replica */ 1"), None);
    }

    #[test]
    fn classifies_by_first_keyword_after_comments() {
        assert_eq!(kind("/* hi */ SELECT 1"), Kind::Select);
        assert_eq!(kind("-- note\n  insert into t values (1)"), Kind::Insert);
        assert_eq!(kind("# note\nUPDATE t SET a = 1"), Kind::Update);
        assert_eq!(kind("(select 1) union (select 2)"), Kind::Select);
        assert_eq!(kind("START TRANSACTION"), Kind::Begin);
        assert_eq!(kind("set names utf8mb4"), Kind::Set);
        assert_eq!(kind("USE `shop`"), Kind::Use);
        assert_eq!(kind("  "), Kind::Empty);
        assert_eq!(kind("SHOW TABLES"), Kind::Other);
        assert_eq!(kind("KILL QUERY 5"), Kind::Kill);
    }

    #[test]
    fn the_2008_seed_query_is_a_plain_select() {
        let s = summary(
            b"SELECT id, category FROM small WHERE small.category='books' /* Added */ /* some */ \
              /* comments */ /* to */ /* produce */ /* a */ /* higher */ /* tokenizer */ /* load */",
        );
        assert_eq!(s.kind, Kind::Select);
        assert!(!s.binds_connection());
        assert!(!s.multi_statement);
    }

    #[test]
    fn temporary_tables_bind_the_connection() {
        assert_eq!(
            kind("CREATE TEMPORARY TABLE t (a int)"),
            Kind::CreateTemporary
        );
        assert_eq!(
            kind("create or replace temporary table t (a int)"),
            Kind::CreateTemporary
        );
        assert_eq!(kind("CREATE TABLE temporary_stuff (a int)"), Kind::Other);
        assert!(summary(b"CREATE TEMPORARY TABLE t (a int)").binds_connection());
    }

    #[test]
    fn user_variables_bind_but_system_variables_do_not() {
        assert!(summary(b"SELECT @x := 1").binds_connection());
        assert!(summary(b"SET @a = 5").user_variables);
        assert!(!summary(b"SELECT @@session.autocommit, @@version").binds_connection());
        assert!(!summary(b"SELECT '@not_a_var'").binds_connection());
        assert!(!summary(b"SELECT 1 /* @x */").binds_connection());
    }

    #[test]
    fn locks_and_found_rows_bind_the_connection() {
        assert!(summary(b"SELECT GET_LOCK('a', 1)").user_lock);
        assert!(summary(b"SELECT SQL_CALC_FOUND_ROWS * FROM t LIMIT 1").found_rows);
        assert!(summary(b"LOCK TABLES t WRITE").binds_connection());
        assert!(summary(b"PREPARE s FROM 'SELECT 1'").binds_connection());
        assert!(summary(b"CALL set_up_session()").binds_connection());
        assert!(!summary(b"SELECT 'get_lock('").binds_connection());
    }

    #[test]
    fn hscales_schema_physical_tables_and_locks_are_guarded() {
        let dictionary = crate::dictionary::tests::users().guarding_schema("hscale");
        let guarded = |sql: &str| {
            summarize(
                sql.as_bytes(),
                Quoting::BACKSLASH_ESCAPES,
                dictionary.names(),
            )
            .names_guarded
        };
        for sql in [
            "UPDATE hscale.partitions SET backend = 1",
            "UPDATE `HSCALE`.`version` SET version = 0",
            "INSERT INTO users_default VALUES (99, 'mario')",
            "SELECT * FROM app.`users_nick1`",
            "USE hscale",
            "SELECT GET_LOCK('hscale.admin', 0)",
            "SELECT RELEASE_LOCK('HScale.move_writers')",
            // By value, however spelled.
            "SELECT GET_LOCK('hscale' '.admin', 0)",
            "SELECT GET_LOCK(_utf8mb4'hscale.admin', 0)",
            "SELECT GET_LOCK(X'687363616c652e61646d696e', 0)",
            "SELECT GET_LOCK(0x687363616c652e61646d696e, 0)",
            "SELECT IS_USED_LOCK('hscale.admin')",
            "SELECT is_free_lock('hscale.move_writers')",
            "DO RELEASE_LOCK('hscale.admin')",
            // Names hscale cannot read could be its own.
            "SELECT GET_LOCK(CONCAT('hscale', '.admin'), 0)",
            "SELECT GET_LOCK(@name, 0)",
        ] {
            assert!(guarded(sql), "{sql}");
        }
        for sql in [
            "SELECT * FROM users WHERE nickname = 'users_default'",
            "SELECT 'hscale.admin'",
            "SELECT GET_LOCK('app.hscale', 0)",
            "SELECT GET_LOCK('app' '.lock', 0), IS_FREE_LOCK(0x6170)",
            // A prepared statement's parameter: its value is bound later.
            "SELECT GET_LOCK(?, 10)",
            "SELECT hscale_id FROM t",
        ] {
            assert!(!guarded(sql), "{sql}");
        }
        // Without the schema guarded (a dictionary not loaded by an
        // instance), physical tables still are.
        let names = crate::dictionary::tests::users();
        let summary = summarize(
            b"DELETE FROM users_nick2",
            Quoting::BACKSLASH_ESCAPES,
            names.names(),
        );
        assert!(summary.names_guarded);
    }

    #[test]
    fn row_count_and_found_rows_read_the_previous_statement() {
        assert!(summary(b"SELECT ROW_COUNT()").reads_previous_statement);
        assert!(summary(b"select found_rows()").reads_previous_statement);
        let calc = summary(b"SELECT SQL_CALC_FOUND_ROWS * FROM t LIMIT 1");
        assert!(!calc.reads_previous_statement);
        assert!(!summary(b"SELECT 'row_count()', `row_count`").reads_previous_statement);
        let one_query = summary(b"UPDATE t SET a = 1; SELECT ROW_COUNT()");
        assert!(!one_query.reads_previous_statement);
        assert!(summary(b"SELECT ROW_COUNT(); DO 1").reads_previous_statement);
    }

    #[test]
    fn diagnostics_are_read_from_the_previous_statement() {
        for sql in [
            "SHOW WARNINGS",
            "show errors limit 1",
            "SHOW COUNT(*) WARNINGS",
            "SELECT @@warning_count",
            "SELECT @@session.error_count, 1",
            "SELECT @@LOCAL.WARNING_COUNT",
            "GET DIAGNOSTICS @n = NUMBER",
            "SHOW WARNINGS; SELECT 1",
        ] {
            let s = summary(sql.as_bytes());
            assert!(s.reads_diagnostics && s.reads_previous_statement, "{sql}");
        }
        for sql in [
            "SHOW TABLES",
            "SELECT warning_count FROM t",
            "SELECT 'SHOW WARNINGS'",
            "SELECT @@max_error_count",
            "SELECT 1/0; SHOW WARNINGS",
        ] {
            assert!(!summary(sql.as_bytes()).reads_diagnostics, "{sql}");
        }
    }

    #[test]
    fn executable_comments_are_read_as_code() {
        assert!(summary(b"SELECT /*!40001 SQL_CALC_FOUND_ROWS */ 1").found_rows);
        assert_eq!(kind("/*!40101 SET NAMES utf8 */"), Kind::Set);
    }

    #[test]
    fn detects_several_statements_in_one_query() {
        assert!(summary(b"SELECT 1; SELECT 2").multi_statement);
        assert!(!summary(b"SELECT 1;").multi_statement);
        assert!(!summary(b"SELECT 1; -- trailing\n").multi_statement);
        assert!(!summary(b"SELECT ';'").multi_statement);
        assert!(summary(b"SELECT 1; 'a'").multi_statement);
    }

    #[test]
    fn only_batches_that_change_session_state_bind() {
        for sql in [
            "INSERT INTO t VALUES (1); SELECT * FROM t",
            "BEGIN; UPDATE t SET a = 1; COMMIT",
            "/* hi */ (SELECT 1) ; delete from t;",
        ] {
            assert!(!summary(sql.as_bytes()).multi_statement_binds(), "{sql}");
        }
        for sql in [
            "SELECT 1; SET NAMES latin1",
            "SET time_zone = '+01:00'; SELECT NOW()",
            "SELECT 1; USE other",
            "SELECT 1; CREATE TEMPORARY TABLE x (a INT)",
            "SELECT 1; CALL p()",
            "SELECT 1; 'a'",
        ] {
            assert!(summary(sql.as_bytes()).multi_statement_binds(), "{sql}");
        }
    }

    #[test]
    fn names_the_database_of_use_and_drop_database() {
        assert_eq!(kind("DROP DATABASE shop"), Kind::DropDatabase);
        assert_eq!(kind("drop schema if exists `shop`"), Kind::DropDatabase);
        assert_eq!(kind("DROP TABLE shop"), Kind::Other);
        assert_eq!(target_database(b"USE `my``db`;").as_deref(), Some("my`db"));
        assert_eq!(target_database(b"use shop").as_deref(), Some("shop"));
        assert_eq!(
            target_database(b"DROP SCHEMA IF EXISTS `slap`").as_deref(),
            Some("slap")
        );
        assert_eq!(
            target_database(b"DROP DATABASE shop").as_deref(),
            Some("shop")
        );
    }

    #[test]
    fn notes_connection_id() {
        assert!(summary(b"UPDATE t SET owner = CONNECTION_ID()").own_values);
        assert!(!summary(b"SELECT 'connection_id()'").own_values);
        assert!(!summary(b"SELECT 1").own_values);
        assert!(summary(b"SELECT @@socket").own_values);
        assert!(summary(b"SELECT 1, @@GLOBAL.port").own_values);
        assert!(!summary(b"SELECT @@version, '@@port'").own_values);
    }

    #[test]
    fn notes_last_insert_id() {
        assert!(summary(b"SELECT LAST_INSERT_ID()").last_insert_id);
        assert!(!summary(b"SELECT 'LAST_INSERT_ID()'").last_insert_id);
    }

    #[test]
    fn a_backslash_escapes_only_where_the_sql_mode_says_so() {
        let sql = b"SELECT 'C:\\'; SET @x = 1";
        let escaped = summary(sql);
        assert!(!escaped.user_variables && !escaped.multi_statement);
        let plain = summarize(sql, Quoting::NO_BACKSLASH_ESCAPES, &TableNames::default());
        assert!(plain.user_variables && plain.multi_statement_binds());
        // Backticks never escape, whatever the mode.
        assert!(summary(b"SELECT `a\\`, @x").user_variables);
    }

    #[test]
    fn notices_names_of_partitioned_tables_in_words_and_backticks() {
        let dict = crate::dictionary::tests::users();
        let names = dict.names();
        let check = |sql: &str| {
            summarize(sql.as_bytes(), Quoting::BACKSLASH_ESCAPES, names).names_partitioned
        };
        assert!(check("SELECT * FROM users WHERE id = 1"));
        assert!(check("select * from app.`Users`"));
        assert!(!check("SELECT * FROM users_default"));
        assert!(!check("SELECT 'users' FROM t"));
        assert!(!check("SELECT * FROM t -- users"));
        assert_eq!(kind("HSCALE SHOW_TABLES"), Kind::Admin);
    }
}

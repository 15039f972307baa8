//! The one planning call: a statement and the session's context in, a `Plan`
//! out. The plan carries everything execution needs; nothing after it reads
//! the SQL again.

use std::sync::Arc;

use smallvec::SmallVec;

use crate::cache::PlanCache;
use crate::dictionary::{Dictionary, PhysicalId, TableName, TableNames, Target};
use crate::kill::{parse_kill, Kill};
use crate::lexer::{
    ansi_identifiers_as_backticks, statements, summarize, summarize_into, target_database, Kind,
    Quoting, Summary, TokenKind,
};
use crate::messages::{messages_read, MessagesRead};
use crate::set::{parse_set, SetItem};
use crate::transaction::{tx_control, tx_effect, TxControl, TxEffect};

/// What planning needs to know of the session and the proxy.
pub struct Context<'a> {
    /// The session's current database.
    pub db: Option<&'a str>,
    pub quoting: Quoting,
    /// sql_mode NO_AUTO_VALUE_ON_ZERO: a 0 given for an AUTO_INCREMENT
    /// column is stored as 0 rather than replaced by an id.
    pub no_auto_value_on_zero: bool,
    /// The session holds LOCK TABLES: a partition table is named by its own
    /// name, as it is locked, not aliased by the logical one (a backend may
    /// hold several partitions of a table, which one alias cannot lock).
    pub tables_locked: bool,
    pub charset: ClientCharset,
    pub dictionary: &'a Dictionary,
    /// Where every table that is not partitioned lives.
    pub main_backend: u32,
    /// The physical tables the session's open transaction has run on: its
    /// statements on one of them that a move is fencing run where they are
    /// routed instead of waiting, so that the transaction finishes rather
    /// than hold the fence off (its instance acknowledges the fence once it
    /// has). A statement on any other fenced table waits for the switch:
    /// it holds nothing there that the fence must wait for.
    pub passed_fences: &'a [PhysicalId],
}

/// The character set the client's statements are written in
/// (`character_set_client`), as far as hscale reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientCharset {
    /// utf8mb3 or utf8mb4: hscale reads the text as the server does.
    #[default]
    Utf8,
    /// Any other: only ASCII text reads the same in it as in UTF-8.
    Other,
}

impl ClientCharset {
    /// The character set of a collation id from the handshake (one byte).
    pub fn of_collation(id: u8) -> ClientCharset {
        match id {
            // utf8mb3, utf8mb4, and MySQL 8's utf8mb4_0900_ai_ci.
            33 | 83 | 192..=215 | 223 | 45 | 46 | 224..=247 | 255 => ClientCharset::Utf8,
            _ => ClientCharset::Other,
        }
    }

    pub fn named(name: &str) -> ClientCharset {
        match name.to_ascii_lowercase().as_str() {
            "utf8" | "utf8mb3" | "utf8mb4" => ClientCharset::Utf8,
            _ => ClientCharset::Other,
        }
    }

    /// Whether hscale reads `sql` as the server does: values it routes by,
    /// text it rewrites or replays. ASCII reads the same in every character
    /// set a client may use; anything else only as valid UTF-8 in a UTF-8
    /// session.
    pub fn reads(self, sql: &[u8]) -> bool {
        sql.is_ascii() || (self == ClientCharset::Utf8 && std::str::from_utf8(sql).is_ok())
    }
}

#[derive(Debug)]
pub struct Plan {
    /// The lexer's verdict: the statement's kind and what it needs of its connection.
    pub summary: Summary,
    pub action: Action,
    /// What the statement changes in the session when it succeeds.
    pub change: SessionChange,
    /// Why the session must keep its backend connection from now on.
    pub binds: Option<&'static str>,
    /// What the statement does to the transaction in progress where it runs.
    pub tx_effect: TxEffect,
    /// SHOW WARNINGS or SHOW ERRORS, which hscale answers itself after a
    /// statement that ran on several connections.
    pub messages_read: Option<MessagesRead>,
}

#[derive(Debug)]
pub enum Action {
    /// The statement names no partitioned table: it goes to the main backend as it is.
    Main,
    /// A read of reference tables alone: each of these backends holds
    /// copies of all of them, the main backend's first. It runs as it is on
    /// one the client's transaction is already on, else on the main backend.
    ReferenceRead(SmallVec<[u32; 4]>),
    /// BEGIN, COMMIT, ROLLBACK, savepoints: carried out on every backend the
    /// transaction reached.
    Transaction(TxControl),
    /// HSCALE ...: answered by the proxy's admin commands.
    Admin,
    Kill(Kill),
    Route(Route),
    /// A prepared statement on a partitioned table (`plan_prepared` only):
    /// routed at each execution by its parameters' values.
    Template(Box<crate::template::Template>),
    /// An INSERT that needs ids for the table's AUTO_INCREMENT column: plan
    /// `Generate::fill`'s text once the ids are taken.
    Generate(crate::auto::Generate),
    /// A metadata statement (SHOW TABLES, SHOW CREATE TABLE, a query on
    /// information_schema, ...) whose answer is corrected to name logical
    /// tables only.
    Listing(Box<crate::show::Listing>),
    /// A schema statement on a partitioned table: run on every physical
    /// table in turn, under the table lock.
    Schema(Box<SchemaChange>),
    /// CREATE TABLE of a name that a partitioned table has: `quiet` with IF
    /// NOT EXISTS (an OK), else error 1050.
    Exists {
        table: TableName,
        quiet: bool,
    },
    /// LOCK TABLES naming partitioned tables: each backend's statement.
    LockTables(crate::lock::TableLocks),
    /// LOAD DATA LOCAL INFILE into a partitioned table: hscale reads the
    /// client's file and each partition's backend loads its lines.
    Load(Box<crate::load::Load>),
    /// A SELECT no partition answers alone: its partitioned tables copied
    /// to the main backend, where it runs as written.
    Federate(Box<crate::federate::Federation>),
    /// A table the statement names is locked by a partition move; plan again
    /// once the dictionary changes.
    Wait(TableName),
    /// Dynamic SQL: the statement inside, or what hscale keeps of it.
    Dynamic(crate::dynamic::Dynamic),
    /// XA RECOVER: the main backend's prepared transactions but those of
    /// hscale's own two-phase commit.
    XaRecover,
    Refuse(Refusal),
}

/// A statement on a partitioned table: the physical tables it runs on and
/// how their answers combine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub table: Arc<TableName>,
    /// Inline: most routed statements have one step.
    pub steps: SmallVec<[Step; 1]>,
    pub merge: Merge,
    /// The statement changes rows (what `transactions = "single"` counts).
    pub writes: bool,
    /// The highest id an INSERT gives the table's AUTO_INCREMENT column: the
    /// sequence moves past it.
    pub highest_id: Option<u64>,
}

impl Route {
    /// The backends the steps run on, each once, in step order.
    pub fn backends(&self) -> Vec<u32> {
        let mut backends = Vec::new();
        for step in &self.steps {
            if !backends.contains(&step.target.backend) {
                backends.push(step.target.backend);
            }
        }
        backends
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub target: Target,
    pub sql: String,
}

impl Step {
    /// The statement as a command's payload: `code`, then the text. Routed
    /// statements are written with a byte of room to spare, so the text is
    /// moved within its own buffer, not copied to a new one.
    pub fn into_command(self, code: u8) -> Vec<u8> {
        let mut payload = self.sql.into_bytes();
        payload.insert(0, code);
        payload
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Merge {
    /// One step: its answer is forwarded as it is.
    Single,
    /// The rows of every step, one result set: concatenated, or merged in
    /// order, with OFFSET and LIMIT applied by hscale (`Spec`).
    Rows(Box<hscale_merge::Spec>),
    /// One OK whose affected rows are the sum of the steps'.
    AffectedRows,
    /// The same write on every copy of a reference table, in one
    /// transaction: one OK, each copy's (they must agree).
    Copies,
}

/// ALTER, TRUNCATE, CREATE/DROP INDEX, DROP TABLE or RENAME TABLE of a
/// partitioned table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaChange {
    pub table: TableName,
    /// The statement's name for what it does, for messages ("ALTER TABLE").
    pub statement: String,
    /// One statement per physical table, the default table first: a
    /// statement the default table refuses changes nothing.
    pub steps: Vec<Step>,
    pub effect: SchemaEffect,
}

/// What the dictionary records once every step has run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchemaEffect {
    /// The same partitions (ALTER, TRUNCATE, indexes); an ALTER may move the
    /// partition column, whose position is read again.
    Unchanged,
    /// The table is no longer partitioned, nor there.
    Dropped,
    /// The table has a new name, and so have its physical tables.
    Renamed(TableName),
}

impl SchemaEffect {
    /// How the dictionary's lock records it.
    pub fn name(&self) -> &'static str {
        match self {
            SchemaEffect::Unchanged => "unchanged",
            SchemaEffect::Dropped => "dropped",
            SchemaEffect::Renamed(_) => "renamed",
        }
    }
}

/// Why hscale will not run a statement (error 1235).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The partitioned table the statement names, if it got that far.
    pub table: Option<TableName>,
    pub reason: String,
}

impl Refusal {
    /// Text hscale must read but cannot read as the server does
    /// (`ClientCharset::reads`).
    pub fn unreadable() -> Refusal {
        Refusal {
            table: None,
            reason: "a statement hscale must read whose text is not UTF-8 \
                     (it reads such statements as utf8mb4: SET NAMES utf8mb4)"
                .into(),
        }
    }
}

/// What a successful statement changes in the session's server-side state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionChange {
    Nothing,
    Database(String),
    DroppedDatabase(String),
    /// A replayable SET statement and the variables it sets.
    Setting(Vec<String>, String),
    /// What only the server can tell: a SET whose values read user
    /// variables, or several statements in one query that set variables
    /// (`keys`) or choose the database, some of which may not have run
    /// (one failed). Read back from the connection that ran them, before
    /// the client's next command that does not ask for their diagnostics.
    ReadBack {
        keys: Vec<String>,
        database: bool,
    },
}

/// The variables `SET NAMES` and `SET CHARACTER SET` change.
const NAMES_VARIABLES: [&str; 4] = [
    "character_set_client",
    "character_set_connection",
    "character_set_results",
    "collation_connection",
];

/// What several statements in one query change: every variable a SET among
/// them names (autocommit aside, which the server's status reports), and
/// whether one chooses or drops a database. SETs hscale cannot read keep
/// the connection (`multi_statement_binds`), as alone.
fn change_of_statements(sql: &[u8], quoting: Quoting) -> SessionChange {
    let mut keys: Vec<String> = Vec::new();
    let mut database = false;
    for statement in statements(sql, quoting) {
        let kind = summarize(statement, quoting, &TableNames::default()).kind;
        match kind {
            Kind::Use | Kind::DropDatabase => database = true,
            Kind::Set => {
                let text = String::from_utf8_lossy(statement);
                if let SetItem::Replayable(set) = parse_set(&text, quoting) {
                    for key in set {
                        match key.as_str() {
                            "names" => keys.extend(NAMES_VARIABLES.map(String::from)),
                            "autocommit" => {}
                            _ => keys.push(key),
                        }
                    }
                }
            }
            _ => {}
        }
    }
    keys.sort();
    keys.dedup();
    match keys.is_empty() && !database {
        true => SessionChange::Nothing,
        false => SessionChange::ReadBack { keys, database },
    }
}

/// Plans one statement. `cache` keeps the shapes of statements on
/// partitioned tables for the next statement of the same shape.
pub fn plan(sql: &[u8], ctx: &Context, cache: &mut PlanCache) -> Plan {
    let names = ctx.dictionary.names();
    let summary = match names.is_empty() {
        true => summarize(sql, ctx.quoting, names),
        false => {
            let tokens = cache.token_sink();
            summarize_into(sql, ctx.quoting, names, |t| tokens.push(t))
        }
    };
    plan_summarized(sql, summary, ctx, |text, summary| {
        plan_partitioned(text, summary, ctx, cache)
    })
}

/// Plans a statement being prepared (COM_STMT_PREPARE): one on a partitioned
/// table becomes a `Template`, routed by its parameters at each execution.
pub fn plan_prepared(sql: &[u8], ctx: &Context) -> Plan {
    let mut params = Vec::new();
    let summary = summarize_into(sql, ctx.quoting, ctx.dictionary.names(), |token| {
        if token.kind == TokenKind::Symbol(b'?') {
            params.push(token.start);
        }
    });
    let parameters = !params.is_empty();
    let mut plan = plan_summarized(sql, summary, ctx, |text, summary| {
        match crate::route::route(text, summary, ctx, Some(&params)).action {
            // An INSERT that leaves AUTO_INCREMENT ids to the server: a
            // parameter where each goes, which hscale binds.
            Action::Generate(generate) => match generate.fill_params(text, &params) {
                Some((filled, ids)) => match plan_prepared(filled.as_bytes(), ctx).action {
                    Action::Template(template) => {
                        Action::Template(Box::new(template.with_ids(ids)))
                    }
                    other => other,
                },
                None => Action::Refuse(Refusal {
                    table: Some(generate.table),
                    reason: "an INSERT whose AUTO_INCREMENT ids hscale cannot place".into(),
                }),
            },
            action => action,
        }
    });
    // `SET time_zone = ?`: the value comes with each execution.
    if let (SessionChange::Setting(keys, _), true) = (&mut plan.change, parameters) {
        plan.change = SessionChange::ReadBack {
            keys: std::mem::take(keys),
            database: false,
        };
    }
    plan
}

/// A prepared SELECT whose execution reaches partitions whose answers
/// hscale cannot merge (`reason`): the copies it runs on instead.
pub fn plan_copies(sql: &[u8], ctx: &Context, reason: String) -> Action {
    match std::str::from_utf8(sql) {
        Ok(text) if ctx.charset.reads(sql) => crate::route::copies(text, ctx, reason),
        _ => Action::Refuse(Refusal::unreadable()),
    }
}

fn plan_summarized(
    sql: &[u8],
    summary: Summary,
    ctx: &Context,
    partitioned: impl FnOnce(&str, &Summary) -> Action,
) -> Plan {
    // What follows reads identifiers quoted as MySQL's default sql_mode does.
    let translated;
    let sql = match ansi_identifiers_as_backticks(sql, ctx.quoting) {
        Ok(None) => sql,
        Ok(Some(text)) => {
            translated = text;
            &translated[..]
        }
        Err(()) => {
            return Plan {
                summary,
                action: Action::Refuse(Refusal {
                    table: None,
                    reason: "a \"...\" identifier that holds a quote or a backtick under sql_mode ANSI_QUOTES".into(),
                }),
                change: SessionChange::Nothing,
                binds: None,
                tx_effect: TxEffect::None,
                messages_read: None,
            }
        }
    };
    let mut binds = if summary.binds_connection() {
        Some("session state only the backend connection holds")
    } else if summary.multi_statement_binds() {
        Some("several statements in one query")
    } else {
        None
    };
    // from_utf8 validates faster than from_utf8_lossy walks.
    let text = || match std::str::from_utf8(sql) {
        Ok(text) => std::borrow::Cow::Borrowed(text),
        Err(_) => String::from_utf8_lossy(sql),
    };
    let change = match summary.kind {
        _ if summary.multi_statement => change_of_statements(sql, ctx.quoting),
        Kind::Set => match parse_set(&text(), ctx.quoting) {
            // `SET sql_mode = @saved`: replayed elsewhere, the text would
            // read another connection's (unset) variable.
            SetItem::Replayable(keys) if summary.user_variables => SessionChange::ReadBack {
                keys,
                database: false,
            },
            SetItem::Replayable(keys) => SessionChange::Setting(keys, text().into_owned()),
            SetItem::NoSessionState => SessionChange::Nothing,
            SetItem::BindsConnection => {
                binds.get_or_insert("SET that cannot be replayed");
                SessionChange::Nothing
            }
        },
        Kind::Use => target_database(sql).map_or(SessionChange::Nothing, SessionChange::Database),
        Kind::DropDatabase => {
            target_database(sql).map_or(SessionChange::Nothing, SessionChange::DroppedDatabase)
        }
        _ => SessionChange::Nothing,
    };
    let control = tx_control(sql, &summary, ctx.quoting);
    let dynamic_elsewhere = match summary.multi_statement {
        true => crate::dynamic::in_statements(sql, ctx),
        false => None,
    };
    let has_tables = !ctx.dictionary.names().is_empty();
    let action = match summary.kind {
        _ if control.is_some() => Action::Transaction(control.expect("checked")),
        _ if dynamic_elsewhere.is_some() => dynamic_elsewhere.expect("checked"),
        Kind::Admin => Action::Admin,
        Kind::Xa => crate::dynamic::client_xa(&text(), ctx.quoting),
        Kind::SqlPrepared if has_tables => {
            crate::dynamic::dynamic(&text(), ctx).unwrap_or(Action::Main)
        }
        Kind::Other if has_tables && crate::dynamic::creates_dynamic_routine(sql, ctx.quoting) => {
            Action::Dynamic(crate::dynamic::Dynamic::Unread {
                what: "a stored routine, trigger or event that runs dynamic SQL",
            })
        }
        // hscale answers KILL itself, so it cannot be one of several statements.
        Kind::Kill if summary.multi_statement => Action::Refuse(Refusal {
            table: None,
            reason: "KILL with other statements in one query".into(),
        }),
        Kind::Kill => Action::Kill(parse_kill(&text())),
        Kind::Lock if summary.names_partitioned && summary.multi_statement => {
            Action::Refuse(Refusal {
                table: None,
                reason: "LOCK TABLES of a partitioned table with other statements in one query"
                    .into(),
            })
        }
        Kind::Lock if summary.names_partitioned => crate::lock::lock_tables(&text(), ctx),
        Kind::Other if has_tables => match crate::dynamic::dynamic(&text(), ctx) {
            Some(dropped) => dropped,
            None => match crate::show::listing(&text(), ctx) {
                Some(listing) => Action::Listing(Box::new(listing)),
                None if summary.names_partitioned => crate::maintenance::maintenance(&text(), ctx)
                    .or_else(|| match summary.multi_statement {
                        true => None,
                        false => crate::load::load_data(&text(), ctx),
                    })
                    .unwrap_or_else(|| partitioned(&text(), &summary)),
                None => Action::Main,
            },
        },
        _ if summary.names_partitioned => partitioned(&text(), &summary),
        _ => Action::Main,
    };
    let action = wait_for_fence(action, ctx.passed_fences);
    // A read that leaves state on its connection stays on the main backend's.
    let action = match action {
        Action::ReferenceRead(_)
            if binds.is_some()
                || summary.multi_statement
                || summary.user_variables
                || !matches!(change, SessionChange::Nothing) =>
        {
            Action::Main
        }
        action => action,
    };
    let mut summary = summary;
    summary.names_guarded |= crate::dynamic::guards_inside(&action, ctx);
    let interprets = !matches!(action, Action::Main | Action::ReferenceRead(_))
        || !matches!(change, SessionChange::Nothing)
        || summary.kind == Kind::Set;
    if interprets && !ctx.charset.reads(sql) {
        return unreadable(summary, binds);
    }
    let tx_effect = match action {
        Action::Transaction(_) => TxEffect::None,
        _ => tx_effect(sql, &summary, ctx.quoting),
    };
    let messages_read = match summary.reads_diagnostics && !summary.multi_statement {
        true => messages_read(sql, ctx.quoting),
        false => None,
    };
    Plan {
        summary,
        action,
        change,
        binds,
        tx_effect,
        messages_read,
    }
}

/// A statement that runs on a partition a move is switching waits for the
/// switch, then is planned again for the partition's new place; others run.
fn wait_for_fence(action: Action, passed: &[PhysicalId]) -> Action {
    match action {
        Action::Route(route) if route.steps.iter().any(|s| s.target.waits(passed)) => {
            Action::Wait((*route.table).clone())
        }
        action => action,
    }
}

/// A statement hscale would have to read but cannot (see
/// `ClientCharset::reads`): reading it anyway could store or route by values
/// other than the server's. A SET keeps its connection, whose server read it;
/// anything else hscale would act on is refused.
fn unreadable(summary: Summary, binds: Option<&'static str>) -> Plan {
    let (action, binds) = match summary.kind {
        Kind::Set => (
            Action::Main,
            Some(binds.unwrap_or("a SET whose text is not UTF-8")),
        ),
        _ => (Action::Refuse(Refusal::unreadable()), binds),
    };
    Plan {
        summary,
        action,
        change: SessionChange::Nothing,
        binds,
        tx_effect: TxEffect::None,
        messages_read: None,
    }
}

/// A statement that may name a partitioned table: from the cache when its
/// shape is known, else analysed (and its shape kept).
fn plan_partitioned(sql: &str, summary: &Summary, ctx: &Context, cache: &mut PlanCache) -> Action {
    cache.prepare(sql.as_bytes(), ctx);
    let hit = cache.lookup(sql, ctx, |shape, table, values, locate| {
        if table.locked() {
            return Some(Action::Wait(table.table.clone()));
        }
        if let Some(joined) = shape.locked_joined(ctx.dictionary) {
            return Some(Action::Wait(joined.clone()));
        }
        let routed = shape.render(sql, table, ctx.main_backend, values, locate);
        // What the partitions cannot answer alone is planned anew: a SELECT
        // may run on copies of its tables.
        if routed.is_err() && !shape.writes {
            return None;
        }
        // A merge read from this statement's literals is planned anew.
        if shape.scan_reads_literals && !matches!(&routed, Ok(route) if route.steps.len() == 1) {
            return None;
        }
        Some(crate::route::finish(routed, summary, ctx, &table.table))
    });
    if let Some(action) = hit {
        return action;
    }
    let routed = crate::route::route(sql, summary, ctx, None);
    cache.store(ctx, &routed.action, routed.shape.as_ref());
    routed.action
}

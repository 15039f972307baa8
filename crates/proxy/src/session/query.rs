//! COM_QUERY: plan the statement once, then do what the plan says — pass it
//! to the main backend, route it to partitions, answer an admin command or a
//! KILL, wait for a partition move, or refuse.

use std::time::{Duration, Instant};

use bytes::Bytes;
use hscale_planner::{
    plan, Action, Context, Dictionary, Generate, Kind, Merge, Plan, Route, SessionChange, Step,
};
use hscale_wire::scan::Expect;
use hscale_wire::StatusFlags;

use super::savepoint::savepoint_statement;
use super::slots::{Needs, Previous};
use super::state::{command, COM_QUERY};
use super::{may_change_session_variables, Session};
use crate::config::Transactions;
use crate::error::ProxyError;
use crate::exec::Command;

/// How often a statement waiting for a partition move looks again.
const WAIT_STEP: Duration = Duration::from_millis(20);

impl Session {
    /// Plans a statement against the current dictionary snapshot.
    pub(super) fn plan(&mut self, sql: &[u8]) -> Plan {
        let dictionary = self.shared.dictionary.snapshot();
        let ctx = Context {
            db: self.state.db.as_deref(),
            quoting: self.quoting,
            charset: self.charset,
            dictionary: &dictionary,
            main_backend: self.shared.main_backend(),
        };
        plan(sql, &ctx, &mut self.plans)
    }

    /// The context of a statement planned against another dictionary than
    /// the snapshot (the one the admin lock reads).
    pub(super) fn context<'a>(&'a self, dictionary: &'a Dictionary) -> Context<'a> {
        Context {
            db: self.state.db.as_deref(),
            quoting: self.quoting,
            charset: self.charset,
            dictionary,
            main_backend: self.shared.main_backend(),
        }
    }

    pub(super) async fn query(&mut self, payload: Bytes) -> Result<(), ProxyError> {
        let sql = &payload[1..];
        tracing::trace!(connection_id = self.connection_id, sql = %String::from_utf8_lossy(sql), "query");
        let plan = self.plan_waiting(|session| session.plan(sql)).await?;
        let needs = Needs::of(&plan.summary);
        let main = self.shared.main;
        match plan.action {
            Action::Main => {
                if let Some(reason) = plan.binds {
                    self.slots[main].binding.sticky.get_or_insert(reason);
                }
                let kind = plan.summary.kind;
                if matches!(kind, Kind::Rollback | Kind::Other) && !plan.summary.multi_statement {
                    if let Some((op, name)) = savepoint_statement(sql) {
                        return self.savepoint(op, name, payload, needs).await;
                    }
                }
                if matches!(kind, Kind::Commit | Kind::Rollback) && !plan.summary.multi_statement {
                    return self.end_transaction(payload, needs).await;
                }
                if kind == Kind::Begin && !self.in_transaction() && plain_begin(sql) {
                    return self.begin_here(payload).await;
                }
                let rereads = (kind == Kind::Set || plan.summary.multi_statement)
                    && may_change_session_variables(sql);
                let slot = self.slot_for_previous(needs)?.unwrap_or(main);
                if kind.writes() {
                    self.check_writers(&[slot])?;
                }
                let sets_autocommit = match plan.summary.multi_statement {
                    true => false,
                    false => self.commit_before(slot, kind, sql).await?,
                };
                let payload = match plan.summary.connection_id {
                    true => self.with_own_connection_id(payload),
                    false => payload,
                };
                let opens = kind == Kind::Begin && !plan.summary.multi_statement;
                self.execute(slot, &payload, Some(Expect::ResultSets), needs, plan.change)
                    .await?;
                self.commit_after(slot, sets_autocommit).await?;
                self.session_variables_changed |= rereads;
                if opens && self.in_transaction() {
                    self.begin = Some(payload);
                }
                if kind.writes() && self.slots[slot].binding.transaction {
                    self.slots[slot].binding.wrote = true;
                }
                Ok(())
            }
            Action::Admin => self.admin(&String::from_utf8_lossy(sql)).await,
            Action::Kill(kill) => self.kill(kill).await,
            Action::Route(route) => {
                if !self.shared.dictionary.fresh() {
                    return Err(ProxyError::DictionaryStale);
                }
                if let Some(reason) = plan.binds {
                    let slot = self.slot_of(route.steps[0].target.backend)?;
                    self.slots[slot].binding.sticky.get_or_insert(reason);
                }
                self.run_route(route, needs, plan.summary.connection_id, None)
                    .await
            }
            Action::Listing(listing) => self.listing(payload, *listing).await,
            Action::Schema(_) => self.schema_change(sql).await,
            Action::Exists { table, quiet } => match quiet {
                true => self.send_ok().await,
                false => Err(ProxyError::Refused(hscale_wire::packets::ErrorPacket::new(
                    1050,
                    "42S01",
                    format!("Table '{}' already exists", table.name),
                ))),
            },
            Action::Wait(_) => unreachable!("waited for above"),
            Action::Template(_) => unreachable!("only plan_prepared makes templates"),
            Action::Generate(generate) => {
                self.insert_with_ids(generate, sql, needs, plan.summary.connection_id)
                    .await
            }
            Action::Refuse(refusal) => Err(ProxyError::Unroutable(refusal)),
        }
    }

    /// A BEGIN outside a transaction, answered by hscale: each backend the
    /// transaction reaches gets it with its first statement there, a read in
    /// the same write (Vitess does the same), so that no backend pays a round
    /// trip for it. InnoDB takes a transaction's snapshot at its first read,
    /// not at BEGIN, so the client sees what it would have seen.
    async fn begin_here(&mut self, payload: Bytes) -> Result<(), ProxyError> {
        self.begin = Some(payload);
        self.begun_here = true;
        // Autocommit is on, or the session would be in a transaction already.
        let status = self.status_flags() | StatusFlags::SERVER_STATUS_AUTOCOMMIT.bits();
        self.client
            .send_packet(1, &super::handshake::ok_packet(status))
            .await?;
        Ok(())
    }

    /// Plans with `plan` until no partition move or schema change holds the
    /// statement's table, for at most `lock_wait`.
    pub(super) async fn plan_waiting(
        &mut self,
        mut plan: impl FnMut(&mut Session) -> Plan,
    ) -> Result<Plan, ProxyError> {
        let mut waited_since = None;
        loop {
            let planned = plan(self);
            let Action::Wait(table) = &planned.action else {
                return Ok(planned);
            };
            self.wait_for_lock(table, &mut waited_since).await?;
        }
    }

    /// One pause for a locked table; an error once `lock_wait` has passed
    /// since `waited_since`.
    pub(super) async fn wait_for_lock(
        &self,
        table: &hscale_planner::TableName,
        waited_since: &mut Option<Instant>,
    ) -> Result<(), ProxyError> {
        let since = *waited_since.get_or_insert_with(Instant::now);
        let lock_wait = self.shared.lock_wait;
        if since.elapsed() >= lock_wait {
            return Err(ProxyError::LockWaitTimeout {
                table: table.clone(),
                waited_ms: lock_wait.as_millis() as u64,
            });
        }
        tokio::time::sleep(WAIT_STEP).await;
        Ok(())
    }

    /// ROW_COUNT(), FOUND_ROWS() and SHOW WARNINGS run where the previous
    /// statement ran. After one that ran on several connections, SHOW
    /// WARNINGS finds none on one of them, or is refused if it left some.
    fn slot_for_previous(&self, needs: Needs) -> Result<Option<usize>, ProxyError> {
        match self.previous {
            _ if !needs.previous_connection => Ok(None),
            Previous::On { slot, .. } => Ok(Some(slot)),
            Previous::Scattered { messages, slot } if needs.diagnostics && !messages => {
                Ok(Some(slot))
            }
            Previous::Scattered { .. } => Err(ProxyError::PreviousStatementScattered),
            Previous::Nothing => Ok(None),
        }
    }

    /// The slot of a backend the dictionary names.
    pub(super) fn slot_of(&self, backend: u32) -> Result<usize, ProxyError> {
        self.shared
            .pool_index(backend)
            .ok_or(ProxyError::UnknownBackend { backend })
    }

    /// `transactions = "single"`: the backends a transaction writes on,
    /// with these, must be one.
    pub(super) fn check_writers(&self, slots: &[usize]) -> Result<(), ProxyError> {
        if self.shared.transactions == Transactions::Multi {
            return Ok(());
        }
        let mut writers: Vec<usize> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.binding.wrote && s.binding.transaction)
            .map(|(i, _)| i)
            .collect();
        for slot in slots {
            if !writers.contains(slot) {
                writers.push(*slot);
            }
        }
        match writers.as_slice() {
            [first, second, ..] => Err(ProxyError::SecondWriter {
                first: self.shared.pools[*first].id(),
                second: self.shared.pools[*second].id(),
            }),
            _ => Ok(()),
        }
    }

    /// COMMIT / ROLLBACK go to every backend the transaction reached; the
    /// client sees the last one's answer. Each commits in turn: not atomic
    /// across backends.
    async fn end_transaction(&mut self, payload: Bytes, needs: Needs) -> Result<(), ProxyError> {
        if self.begun_here && plain_end(&payload[1..]) {
            // No backend has the transaction: there is nothing to end.
            self.begun_here = false;
            self.begin = None;
            self.savepoints.clear();
            return self.send_ok().await;
        }
        let mut open = self.transaction_slots();
        // A ROLLBACK TO that `savepoint_statement` could not read: only
        // where the main backend alone has the transaction.
        let to_savepoint = String::from_utf8_lossy(&payload[1..])
            .to_ascii_lowercase()
            .split_whitespace()
            .take(3)
            .any(|word| word == "to");
        if to_savepoint && open.iter().any(|&slot| slot != self.shared.main) {
            return Err(ProxyError::Unroutable(hscale_planner::Refusal {
                table: None,
                reason: "a ROLLBACK TO SAVEPOINT hscale cannot read, in a transaction on several backends".into(),
            }));
        }
        let last = match open.pop() {
            Some(last) if !to_savepoint => last,
            _ => {
                open.clear();
                self.shared.main
            }
        };
        let quiet: Vec<(usize, &[u8])> =
            open.into_iter().map(|slot| (slot, &payload[..])).collect();
        // `begin` goes once no backend is in a transaction (`after`): after
        // COMMIT AND CHAIN the new transaction must reach later backends too.
        self.each_then_answer(&quiet, last, &payload, needs).await?;
        // The transaction's savepoints end with it, chained or not.
        self.savepoints.clear();
        if self.in_transaction() && self.autocommit && self.begin.is_none() {
            // Chained from no transaction hscale saw begin: a plain one,
            // which later backends can open too.
            self.begin = Some(command(COM_QUERY, "START TRANSACTION").into());
        }
        Ok(())
    }

    /// Before a statement on `slot` that the server commits the transaction
    /// for, commits it on the other backends (on `slot` the server does).
    /// True for a SET of autocommit, after which `commit_after` looks
    /// whether it ended the transaction.
    pub(super) async fn commit_before(
        &mut self,
        slot: usize,
        kind: Kind,
        sql: &[u8],
    ) -> Result<bool, ProxyError> {
        let others_open = (self.slots.iter().enumerate())
            .any(|(other, s)| other != slot && s.binding.transaction);
        if !others_open {
            return Ok(false);
        }
        if commits_implicitly(kind, sql) {
            self.commit_open(Some(slot)).await?;
        }
        Ok(kind == Kind::Set
            && sql
                .to_ascii_lowercase()
                .windows(10)
                .any(|w| w == b"autocommit"))
    }

    /// After a SET of autocommit (`commit_before`): `SET autocommit = 1`
    /// committed the transaction on `slot`, and so on every backend.
    pub(super) async fn commit_after(
        &mut self,
        slot: usize,
        sets_autocommit: bool,
    ) -> Result<(), ProxyError> {
        if sets_autocommit && !self.slots[slot].binding.transaction {
            self.commit_open(Some(slot)).await?;
        }
        Ok(())
    }

    /// Commits the transaction on every backend it reached but `except`'s.
    pub(super) async fn commit_open(&mut self, except: Option<usize>) -> Result<(), ProxyError> {
        let commit = command(COM_QUERY, "COMMIT");
        for slot in self.transaction_slots() {
            if Some(slot) != except {
                self.run_quietly(slot, &commit).await?;
            }
        }
        self.savepoints.clear();
        Ok(())
    }

    /// The slots whose backends are in the transaction.
    pub(super) fn transaction_slots(&self) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|&i| self.slots[i].binding.transaction)
            .collect()
    }

    /// Runs each of `quiet`'s commands on its slot, in turn, keeping their
    /// answers from the client, then `payload` on `last`, whose answer the
    /// client gets.
    pub(super) async fn each_then_answer(
        &mut self,
        quiet: &[(usize, &[u8])],
        last: usize,
        payload: &[u8],
        needs: Needs,
    ) -> Result<hscale_wire::scan::Completion, ProxyError> {
        for &(slot, command) in quiet {
            self.run_quietly(slot, command).await?;
        }
        self.execute(
            last,
            payload,
            Some(Expect::ResultSets),
            needs,
            SessionChange::Nothing,
        )
        .await
    }

    /// A routed statement: one step is forwarded as it is, several are merged.
    /// An INSERT that leaves AUTO_INCREMENT ids to the server: this
    /// instance's next ids are written into it, and it is planned again.
    async fn insert_with_ids(
        &mut self,
        generate: Generate,
        sql: &[u8],
        needs: Needs,
        connection_id: bool,
    ) -> Result<(), ProxyError> {
        if !self.shared.dictionary.fresh() {
            return Err(ProxyError::DictionaryStale);
        }
        let shared = self.shared.clone();
        let first = shared
            .sequences
            .take(&shared, &generate.table, generate.count)
            .await?;
        let filled = generate.fill(&String::from_utf8_lossy(sql), first);
        let plan = match filled {
            Some(filled) => {
                self.plan_waiting(|session| session.plan(filled.as_bytes()))
                    .await?
            }
            None => return Err(unroutable_with_ids(generate.table)),
        };
        match plan.action {
            Action::Route(route) => {
                self.run_route(route, needs, connection_id, Some(first))
                    .await
            }
            Action::Refuse(refusal) => Err(ProxyError::Unroutable(refusal)),
            _ => Err(unroutable_with_ids(generate.table)),
        }
    }

    /// A routed statement: one step is forwarded as it is, several are
    /// merged. `generated`: the first of the AUTO_INCREMENT ids hscale wrote
    /// into it, which its OK reports.
    async fn run_route(
        &mut self,
        route: Route,
        needs: Needs,
        connection_id: bool,
        generated: Option<u64>,
    ) -> Result<(), ProxyError> {
        self.shared.counters.routed.add(1);
        let Some(given) = route.highest_id else {
            return self.run_steps(route, needs, connection_id, generated).await;
        };
        // Before the INSERT runs: nothing may be sent after its answer.
        let shared = self.shared.clone();
        shared.sequences.given(&shared, &route.table, given).await?;
        let before = self.state.last_insert_id;
        let ran = self.run_steps(route, needs, connection_id, generated).await;
        if generated.is_none() {
            // Ids given are in the OK, but LAST_INSERT_ID() keeps its value.
            self.state.last_insert_id = before;
        }
        ran
    }

    async fn run_steps(
        &mut self,
        mut route: Route,
        needs: Needs,
        connection_id: bool,
        generated: Option<u64>,
    ) -> Result<(), ProxyError> {
        let payload = |session: &Session, step: Step| {
            let payload = Bytes::from(step.into_command(COM_QUERY));
            match connection_id {
                true => session.with_own_connection_id(payload),
                false => payload,
            }
        };
        if route.steps.len() == 1 {
            let step = route.steps.pop().expect("one step");
            let slot = self.slot_of(step.target.backend)?;
            if route.writes {
                self.check_writers(&[slot])?;
            }
            let payload = payload(self, step);
            match generated {
                None => {
                    self.execute(
                        slot,
                        &payload,
                        Some(Expect::ResultSets),
                        needs,
                        SessionChange::Nothing,
                    )
                    .await?;
                }
                // Its OK must report the first id hscale wrote in.
                Some(_) => {
                    let command = [Command::Raw(&payload)];
                    return self
                        .run_merged(Merge::AffectedRows, &[slot], &command, needs, generated)
                        .await;
                }
            }
            if route.writes && self.slots[slot].binding.transaction {
                self.slots[slot].binding.wrote = true;
            }
            return Ok(());
        }
        let mut slots = Vec::with_capacity(route.steps.len());
        for step in &route.steps {
            slots.push(self.slot_of(step.target.backend)?);
        }
        if route.writes {
            self.check_writers(&slots)?;
        }
        let payloads: Vec<Bytes> = route
            .steps
            .into_iter()
            .map(|step| payload(self, step))
            .collect();
        let commands: Vec<Command> = payloads.iter().map(|p| Command::Raw(p)).collect();
        self.run_merged(route.merge, &slots, &commands, needs, generated)
            .await
    }
}

fn unroutable_with_ids(table: hscale_planner::TableName) -> ProxyError {
    ProxyError::Unroutable(hscale_planner::Refusal {
        table: Some(table),
        reason: "an INSERT with the AUTO_INCREMENT ids hscale wrote into it that cannot be routed"
            .into(),
    })
}

/// BEGIN [WORK] or START TRANSACTION alone: no snapshot taken at once (WITH
/// CONSISTENT SNAPSHOT), no access mode that could refuse it.
fn plain_begin(sql: &[u8]) -> bool {
    with_words(sql, |words| {
        matches!(
            words,
            ["begin"] | ["begin", "work"] | ["start", "transaction"]
        )
    })
}

/// Statements before which the server commits the transaction in
/// progress: BEGIN, LOCK TABLES and DDL (not on temporary tables).
fn commits_implicitly(kind: Kind, sql: &[u8]) -> bool {
    match kind {
        Kind::Begin | Kind::Lock | Kind::DropDatabase => true,
        Kind::Other => with_words(sql, |words| match words {
            ["drop", "temporary", ..] => false,
            [first, ..] => matches!(
                *first,
                "create" | "alter" | "drop" | "rename" | "truncate" | "grant" | "revoke"
            ),
            [] => false,
        }),
        _ => false,
    }
}

/// COMMIT or ROLLBACK [WORK] alone: no chain, release or savepoint.
fn plain_end(sql: &[u8]) -> bool {
    with_words(sql, |words| {
        matches!(
            words,
            ["commit" | "rollback"] | ["commit" | "rollback", "work"]
        )
    })
}

/// `read` of a statement's words, lowercase.
pub(super) fn with_words<T>(sql: &[u8], read: impl FnOnce(&[&str]) -> T) -> T {
    let text = String::from_utf8_lossy(sql).to_lowercase();
    let words: Vec<&str> = text
        .trim()
        .trim_end_matches(';')
        .split_whitespace()
        .collect();
    read(&words)
}

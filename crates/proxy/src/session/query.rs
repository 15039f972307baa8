//! COM_QUERY: plan the statement once, then do what the plan says — pass it
//! to the main backend, route it to partitions, answer an admin command or a
//! KILL, wait for a partition move, or refuse.

use std::time::{Duration, Instant};

use bytes::Bytes;
use hscale_planner::{
    plan, Action, Context, Dictionary, Generate, Kind, Merge, Plan, Route, SessionChange, Step,
};
use hscale_wire::scan::Expect;

use super::client::Client;
use super::scatter::Generated;
use super::slots::{Needs, Previous};
use super::Session;
use crate::error::ProxyError;
use crate::exec::Command;
use crate::shared::Counters;
use hscale_wire::command;

/// How often a statement waiting for a partition move looks again.
const WAIT_STEP: Duration = Duration::from_millis(20);

impl Session {
    /// Plans a statement against the current dictionary snapshot.
    pub(super) fn plan(&mut self, sql: &[u8]) -> Plan {
        let dictionary = self.backends.handle.on.planning(&self.shared.dictionary);
        let ctx = Context {
            db: self.backends.state.db.as_deref(),
            quoting: self.backends.quoting,
            no_auto_value_on_zero: self.backends.no_auto_value_on_zero,
            tables_locked: self.backends.tx.tables_locked(),
            charset: self.client.charset,
            dictionary: &dictionary,
            main_backend: self.shared.main_backend(),
            passed_fences: &self.backends.transaction_tables,
        };
        plan(sql, &ctx, &mut self.memo.plans)
    }

    /// The context of a statement planned against another dictionary than
    /// the snapshot (the one the admin lock reads).
    pub(super) fn context<'a>(&'a self, dictionary: &'a Dictionary) -> Context<'a> {
        Context {
            db: self.backends.state.db.as_deref(),
            quoting: self.backends.quoting,
            no_auto_value_on_zero: self.backends.no_auto_value_on_zero,
            tables_locked: self.backends.tx.tables_locked(),
            charset: self.client.charset,
            dictionary,
            main_backend: self.shared.main_backend(),
            passed_fences: &self.backends.transaction_tables,
        }
    }

    pub(super) async fn query(&mut self, payload: Bytes) -> Result<(), ProxyError> {
        let sql = &payload[1..];
        tracing::trace!(connection_id = self.client.connection_id, sql = %String::from_utf8_lossy(sql), "query");
        let plan = self.plan_waiting(|session| session.plan(sql)).await?;
        self.run_plan(plan, payload).await
    }

    /// Does what a COM_QUERY's plan says.
    pub(super) async fn run_plan(&mut self, plan: Plan, payload: Bytes) -> Result<(), ProxyError> {
        let sql = &payload[1..];
        let needs = Needs::of(&plan.summary).with_effect(plan.tx_effect);
        let own_values = plan.summary.own_values;
        match plan.action {
            Action::Transaction(control) => self.transaction_control(control, payload, needs).await,
            Action::Main | Action::ReferenceRead(_) => self.run_main(plan, payload, needs).await,
            Action::Admin => {
                let sql = String::from_utf8_lossy(sql);
                super::admin::run(&self.shared, &mut self.client, &mut self.backends, &sql).await
            }
            Action::Kill(kill) => {
                super::kill::run(&self.shared, &mut self.client, &self.backends, kill).await
            }
            Action::Route(route) => self.route(route, plan.binds, needs, own_values).await,
            Action::LockTables(locks) => self.lock_tables(locks).await,
            Action::Load(load) => self.load(*load, needs).await,
            Action::Listing(listing) => self.listing(payload, *listing, plan.tx_effect).await,
            Action::Schema(_) => self.schema_change(sql).await,
            Action::Exists { table, quiet } => {
                self.backends.exists(&mut self.client, &table, quiet).await
            }
            Action::Wait(_) => unreachable!("waited for above"),
            Action::Template(_) => unreachable!("only plan_prepared makes templates"),
            Action::Generate(generate) => {
                self.insert_with_ids(generate, sql, needs, own_values).await
            }
            Action::Federate(federation) => {
                let then = super::federate::Then::Query { payload, needs };
                self.federate(&federation, then).await.map(drop)
            }
            Action::Dynamic(dynamic) => {
                let plan = Plan {
                    action: Action::Main,
                    ..plan
                };
                self.dynamic(dynamic, plan, payload).await
            }
            Action::XaRecover => self.xa_recover(payload).await,
            Action::Refuse(refusal) => Err(ProxyError::Unroutable(refusal)),
        }
    }

    /// A statement routed to partitions, on a dictionary snapshot that is
    /// fresh; `binds`: why its first backend's connection stays.
    async fn route(
        &mut self,
        route: Route,
        binds: Option<&'static str>,
        needs: Needs,
        own_values: bool,
    ) -> Result<(), ProxyError> {
        if !self.backends.handle.on.planned_fresh() {
            return Err(ProxyError::DictionaryStale);
        }
        if let Some(reason) = binds {
            let slot = self.backends.slot_of(route.steps[0].target.backend)?;
            self.backends.slots[slot]
                .binding
                .sticky
                .get_or_insert(reason);
        }
        self.run_route(route, needs, own_values, None).await
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
            // HSCALE commands by others get their own refusal.
            if planned.summary.names_guarded
                && !self.client.admin
                && planned.summary.kind != Kind::Admin
            {
                return Err(ProxyError::Guarded {
                    user: self.client.user.clone(),
                });
            }
            let Action::Wait(table) = &planned.action else {
                self.backends.note_tables(&planned.action);
                return Ok(planned);
            };
            self.backends
                .wait_for_lock(table, &mut waited_since)
                .await?;
        }
    }

    /// An INSERT that leaves AUTO_INCREMENT ids to the server: this
    /// instance's next ids are written into it, and it is planned again.
    async fn insert_with_ids(
        &mut self,
        generate: Generate,
        sql: &[u8],
        needs: Needs,
        own_values: bool,
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
                let generated = Generated {
                    first,
                    upsert: generate.upsert,
                };
                self.run_route(route, needs, own_values, Some(generated))
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
        own_values: bool,
        generated: Option<Generated>,
    ) -> Result<(), ProxyError> {
        // An INSERT whose ids hscale wrote was planned again since.
        if !self.backends.handle.on.planned_fresh() {
            return Err(ProxyError::DictionaryStale);
        }
        self.shared.counters.routed.add(1);
        let Some(given) = route.highest_id else {
            return self.run_steps(route, needs, own_values, generated).await;
        };
        // Before the INSERT runs: nothing may be sent after its answer.
        let shared = self.shared.clone();
        shared.sequences.given(&shared, &route.table, given).await?;
        let before = self.backends.state.last_insert_id;
        let ran = self.run_steps(route, needs, own_values, generated).await;
        if generated.is_none() {
            // Ids given are in the OK, but LAST_INSERT_ID() keeps its value.
            self.backends.state.last_insert_id = before;
        }
        ran
    }

    async fn run_steps(
        &mut self,
        mut route: Route,
        needs: Needs,
        own_values: bool,
        generated: Option<Generated>,
    ) -> Result<(), ProxyError> {
        let payload = |session: &Session, step: Step| {
            let payload = Bytes::from(step.into_command(command::QUERY));
            match own_values {
                true => session.with_own_values(payload),
                false => payload,
            }
        };
        if route.steps.len() == 1 {
            let step = route.steps.pop().expect("one step");
            let slot = self.backends.slot_of(step.target.backend)?;
            if route.writes {
                self.backends.check_writers(&[slot])?;
            }
            let payload = payload(self, step);
            match generated {
                None => {
                    self.backends
                        .execute(
                            &mut self.client,
                            slot,
                            &payload,
                            Some(Expect::ResultSets),
                            needs.routed(),
                            SessionChange::Nothing,
                        )
                        .await?;
                }
                // Its OK must report the first id hscale wrote in.
                Some(_) => {
                    let command = [Command::Raw(&payload)];
                    return self
                        .run_merged(
                            Merge::AffectedRows,
                            &[slot],
                            &command,
                            needs,
                            generated,
                            Vec::new(),
                        )
                        .await;
                }
            }
            if route.writes {
                self.backends.tx.wrote(slot);
            }
            return Ok(());
        }
        if route.writes {
            let mut slots = Vec::with_capacity(route.steps.len());
            for step in &route.steps {
                slots.push(self.backends.slot_of(step.target.backend)?);
            }
            self.backends.check_writers(&slots)?;
        }
        let merge = route.merge.clone();
        let (slots, payloads, probes) = self.route_payloads(route, own_values)?;
        let commands: Vec<Command> = payloads.iter().map(|p| Command::Raw(p)).collect();
        self.run_merged(merge, &slots, &commands, needs, generated, probes)
            .await
    }

    /// The slots a route's steps run on and their commands: a statement
    /// each, or one per backend where its partitions must go as one
    /// (`must_unite`), with the probe that gives its columns.
    #[allow(clippy::type_complexity)]
    pub(super) fn route_payloads(
        &self,
        route: Route,
        own_values: bool,
    ) -> Result<(Vec<usize>, Vec<Bytes>, Vec<Option<Bytes>>), ProxyError> {
        let with_id = |payload: Bytes| match own_values {
            true => self.with_own_values(payload),
            false => payload,
        };
        let mut slots = Vec::with_capacity(route.steps.len());
        for step in &route.steps {
            slots.push(self.backends.slot_of(step.target.backend)?);
        }
        let united = match self.backends.must_unite(&slots) {
            true => route.united(),
            false => None,
        };
        Ok(match united {
            Some(united) => {
                let mut one_each = (Vec::new(), Vec::new(), Vec::new());
                for united in united {
                    one_each.0.push(self.backends.slot_of(united.backend)?);
                    one_each.2.push(united.probe.clone().map(Bytes::from));
                    one_each
                        .1
                        .push(with_id(Bytes::from(united.into_command(command::QUERY))));
                }
                one_each
            }
            None => {
                let payloads = route
                    .steps
                    .into_iter()
                    .map(|step| with_id(Bytes::from(step.into_command(command::QUERY))))
                    .collect();
                (slots, payloads, Vec::new())
            }
        })
    }
}

impl super::Backends {
    /// CREATE TABLE IF NOT EXISTS of a partitioned table: a note, or 1050.
    async fn exists(
        &mut self,
        client: &mut Client,
        table: &hscale_planner::TableName,
        quiet: bool,
    ) -> Result<(), ProxyError> {
        match quiet {
            true => self.send_ok(client).await,
            false => Err(ProxyError::Refused(hscale_wire::packets::ErrorPacket::new(
                1050,
                "42S01",
                format!("Table '{}' already exists", table.name),
            ))),
        }
    }
}

impl super::Backends {
    /// Notes which partitions' tables a planned statement goes to, for the
    /// fences of moves (see `OnTables`). Statements on a whole table
    /// (LOCK TABLES, LOAD DATA, maintenance) wait for any fence on it, and
    /// are counted as possibly on every table while they run.
    fn note_tables(&mut self, action: &Action) {
        let tables = &mut self.statement_tables;
        tables.clear();
        match action {
            Action::Route(route) => tables.extend(route.steps.iter().map(|s| s.target.physical)),
            Action::Template(template) => tables.push(template.describing_run().target.physical),
            Action::Main
            | Action::ReferenceRead(_)
            | Action::Transaction(_)
            | Action::Admin
            | Action::Kill(_)
            | Action::Exists { .. }
            | Action::Dynamic(_)
            | Action::XaRecover
            | Action::Refuse(_) => {}
            Action::LockTables(_)
            | Action::Load(_)
            | Action::Listing(_)
            | Action::Schema(_)
            | Action::Generate(_)
            | Action::Federate(_)
            | Action::Wait(_) => return,
        }
        self.handle.on.runs_on(tables);
    }

    /// A backend the transaction is on that holds every reference table
    /// a read names (`Action::ReferenceRead`): reading there opens no
    /// other backend's part. The main backend where it is one of them.
    pub(super) fn slot_with_copies(&self, backends: &[u32]) -> Option<usize> {
        let reached = self.tx.slots();
        let main = self.shared.main;
        if reached.contains(&main) {
            return None;
        }
        reached
            .into_iter()
            .find(|&slot| backends.contains(&self.shared.pools[slot].id()))
    }

    /// One pause for a locked table; an error once `lock_wait` has passed
    /// since `waited_since`.
    pub(super) async fn wait_for_lock(
        &self,
        table: &hscale_planner::TableName,
        waited_since: &mut Option<Instant>,
    ) -> Result<(), ProxyError> {
        let since = *waited_since.get_or_insert_with(|| {
            Counters::add(&self.shared.counters.waited, 1);
            Instant::now()
        });
        self.handle.on.waits();
        let lock_wait = self.shared.lock_wait;
        if since.elapsed() >= lock_wait {
            return Err(ProxyError::LockWaitTimeout {
                table: table.clone(),
                holder: self.holder_of(table).await,
                waited_ms: lock_wait.as_millis() as u64,
            });
        }
        tokio::time::sleep(WAIT_STEP).await;
        Ok(())
    }

    /// What a table waited for: the move that holds it, named for SHOW_MOVES
    /// (asked of the dictionary only when a wait has run out).
    async fn holder_of(&self, table: &hscale_planner::TableName) -> String {
        let shared = &self.shared;
        let job = match crate::dictionary::own_connection(shared, shared.main).await {
            Ok(mut conn) => crate::online::running(shared, &mut conn, table)
                .await
                .ok()
                .flatten(),
            Err(_) => None,
        };
        match job {
            Some(job) => format!("move {job} (HSCALE SHOW_MOVES)"),
            None => "a partition move or schema change".into(),
        }
    }

    /// ROW_COUNT(), FOUND_ROWS() and SHOW WARNINGS run where the previous
    /// statement ran. After one that ran on several connections, SHOW
    /// WARNINGS finds none on one of them, or is refused if it left some.
    pub(super) fn slot_for_previous(&self, needs: Needs) -> Result<Option<usize>, ProxyError> {
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
}

fn unroutable_with_ids(table: hscale_planner::TableName) -> ProxyError {
    ProxyError::Unroutable(hscale_planner::Refusal {
        table: Some(table),
        reason: "an INSERT with the AUTO_INCREMENT ids hscale wrote into it that cannot be routed"
            .into(),
    })
}

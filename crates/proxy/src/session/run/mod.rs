//! COM_QUERY: plan the statement once, then do what the plan says — pass it
//! to the main backend, route it to partitions, answer an admin command or a
//! KILL, wait for a partition move, or refuse.

pub(super) mod admin;
pub(super) mod dynamic;
pub(super) mod federate;
pub(super) mod kill;
pub(super) mod listing;
pub(super) mod load;
pub(super) mod locks;
pub(super) mod main;
pub(super) mod prepared;
pub(super) mod route;
pub(super) mod schema;
pub(super) mod transaction;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hscale_planner::{plan, Action, Context, Dictionary, Kind, Plan};

use crate::error::ProxyError;
use crate::session::client::Client;
use crate::session::slots::{Needs, Previous};
use crate::session::Backends;
use crate::session::Memo;
use crate::shared::Counters;
use crate::shared::Shared;

/// A COM_QUERY's statement as its handler gets it: the client's command
/// and what the plan says it needs.
pub(in crate::session) struct Statement {
    /// The command as the client sent it, its first byte COM_QUERY.
    pub payload: Bytes,
    pub needs: Needs,
    /// It names CONNECTION_ID() or a variable naming the server, which
    /// hscale replaces with its own (`with_own_values`).
    pub own_values: bool,
}

impl Statement {
    fn of(plan: &Plan, payload: Bytes) -> Statement {
        Statement {
            needs: Needs::of(&plan.summary).with_effect(plan.tx_effect),
            own_values: plan.summary.own_values,
            payload,
        }
    }
}

/// How often a statement waiting for a partition move looks again.
const WAIT_STEP: Duration = Duration::from_millis(20);

/// Plans a statement against the current dictionary snapshot.
pub(in crate::session) fn plan_statement(
    client: &Client,
    memo: &mut Memo,
    backends: &Backends,
    sql: &[u8],
) -> Plan {
    let dictionary = backends.shared.dictionary.planned_by(&backends.handle.on);
    plan(
        sql,
        &context(client, backends, &dictionary),
        &mut memo.plans,
    )
}

/// The context of a statement planned against another dictionary than
/// the snapshot (the one the admin lock reads).
pub(in crate::session) fn context<'a>(
    client: &Client,
    backends: &'a Backends,
    dictionary: &'a Dictionary,
) -> Context<'a> {
    Context {
        db: backends.state.db.as_deref(),
        quoting: backends.quoting,
        no_auto_value_on_zero: backends.no_auto_value_on_zero,
        tables_locked: backends.tx.tables_locked(),
        charset: client.charset,
        dictionary,
        main_backend: backends.shared.main_backend(),
        passed_fences: &backends.transaction_tables,
    }
}

pub(in crate::session) async fn query(
    shared: &Arc<Shared>,
    client: &mut Client,
    memo: &mut Memo,
    backends: &mut Backends,
    payload: Bytes,
) -> Result<(), ProxyError> {
    let sql = &payload[1..];
    tracing::trace!(connection_id = client.connection_id, sql = %String::from_utf8_lossy(sql), "query");
    let plan = plan_waiting(client, memo, backends, |client, memo, backends| {
        plan_statement(client, memo, backends, sql)
    })
    .await?;
    run_plan(shared, client, memo, backends, plan, payload).await
}

/// Does what a COM_QUERY's plan says.
pub(in crate::session) async fn run_plan(
    shared: &Arc<Shared>,
    client: &mut Client,
    memo: &mut Memo,
    backends: &mut Backends,
    mut plan: Plan,
    payload: Bytes,
) -> Result<(), ProxyError> {
    let statement = Statement::of(&plan, payload);
    let sql = &statement.payload[1..];
    match plan.action {
        Action::Transaction(control) => {
            transaction::run(shared, client, backends, control, statement).await
        }
        Action::Main | Action::ReferenceRead(_) => {
            main::run(shared, client, backends, plan, statement).await
        }
        Action::Admin => admin::run(shared, client, backends, &String::from_utf8_lossy(sql)).await,
        Action::Kill(kill) => kill::run(shared, client, backends, kill).await,
        Action::Route(route) => {
            route::run(shared, client, memo, backends, route, plan.binds, statement).await
        }
        Action::LockTables(locks) => locks::run(shared, client, backends, locks).await,
        Action::Load(load) => load::run(shared, client, backends, *load, statement.needs).await,
        Action::Listing(listing) => {
            let (payload, effect) = (statement.payload, plan.tx_effect);
            listing::run(shared, client, backends, payload, *listing, effect).await
        }
        Action::Schema(_) => schema::run(shared, client, backends, sql).await,
        Action::Exists { table, quiet } => backends.exists(client, &table, quiet).await,
        Action::Wait(_) => unreachable!("waited for above"),
        Action::Template(_) => unreachable!("only plan_prepared makes templates"),
        Action::Generate(generate) => {
            route::insert_with_ids(shared, client, memo, backends, generate, statement).await
        }
        Action::Federate(federation) => {
            let then = federate::Then::query(statement);
            federate::run(shared, client, memo, backends, &federation, then)
                .await
                .map(drop)
        }
        Action::Dynamic(dynamic) => {
            // Whatever it runs is planned again; the plan of the statement
            // itself is the main backend's.
            plan.action = Action::Main;
            dynamic::run(shared, client, memo, backends, dynamic, plan, statement).await
        }
        Action::XaRecover => dynamic::xa_recover(shared, client, backends, statement.payload).await,
        Action::Refuse(refusal) => Err(ProxyError::Unroutable(refusal)),
    }
}

/// Plans with `plan` until no partition move or schema change holds the
/// statement's table, for at most `lock_wait`.
pub(in crate::session) async fn plan_waiting(
    client: &Client,
    memo: &mut Memo,
    backends: &mut Backends,
    mut plan: impl FnMut(&Client, &mut Memo, &Backends) -> Plan,
) -> Result<Plan, ProxyError> {
    let (mut waited_since, mut dictionary_since) = (None, None);
    loop {
        let planned = plan(client, memo, backends);
        // HSCALE commands by others get their own refusal.
        if planned.summary.names_guarded && !client.admin && planned.summary.kind != Kind::Admin {
            return Err(ProxyError::Guarded {
                user: client.user.clone(),
            });
        }
        let on_partitions = matches!(
            planned.action,
            Action::Route(_)
                | Action::Federate(_)
                | Action::Load(_)
                | Action::Generate(_)
                | Action::Template(_)
        );
        if on_partitions
            && !backends.handle.on.planned_fresh()
            && backends.wait_for_dictionary(&mut dictionary_since).await
        {
            continue;
        }
        let Action::Wait(table) = &planned.action else {
            backends.note_tables(&planned.action);
            return Ok(planned);
        };
        backends.wait_for_lock(table, &mut waited_since).await?;
    }
}

impl crate::session::Backends {
    /// A statement on partitions planned while the dictionary's lease has
    /// lapsed waits (and is planned again) while its backend may be failing
    /// over, as statements wait for their own backend's new writer: up to
    /// its `failover_wait_ms`, where it has replicas. False: it waits no
    /// more, and gets the stale dictionary's refusal.
    pub(super) async fn wait_for_dictionary(&self, since: &mut Option<std::time::Instant>) -> bool {
        let main = self.shared.main_pool();
        if main.replicas().hosts.len() < 2 {
            return false;
        }
        let since = since.get_or_insert_with(std::time::Instant::now);
        if since.elapsed() >= Duration::from_millis(main.config.failover_wait_ms) {
            return false;
        }
        tokio::time::sleep(WAIT_STEP).await;
        true
    }

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
    pub(in crate::session) fn slot_with_copies(&self, backends: &[u32]) -> Option<usize> {
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
    pub(in crate::session) async fn wait_for_lock(
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
    pub(in crate::session) fn slot_for_previous(
        &self,
        needs: Needs,
    ) -> Result<Option<usize>, ProxyError> {
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
    pub(in crate::session) fn slot_of(&self, backend: u32) -> Result<usize, ProxyError> {
        self.shared
            .pool_index(backend)
            .ok_or(ProxyError::UnknownBackend { backend })
    }
}

//! Statements that run on several partitions: writes run on each, in one
//! transaction per backend (committed in two phases where they span
//! backends), their affected rows summed into one OK; reads merged into one
//! result set (`merged`).

mod merged;

pub(super) use merged::{merge_rows, run_merged, watch_client};

use std::collections::BTreeMap;

use hscale_planner::Upsert;
use hscale_transaction::Branch;
use hscale_transaction::Reach;
use hscale_wire::command;
use hscale_wire::packets::{ErrorPacket, OkInfo, OK_HEADER};
use hscale_wire::scan::{Completion, Expect};

use super::atomic::Parts;
use super::client::Client;
use super::slots::{Needs, Previous};
use super::state::{breaks_connection, UNKNOWN_SETTINGS};
use crate::backend::{BackendError, Lease, UNKNOWN_ID};
use crate::error::ProxyError;
use crate::exec::{command_payload, Command};
use crate::spool::Spool;
use crate::xa::Running;

/// The needs of a statement that ends the transaction where it runs, or
/// runs outside one: no XA branch opens for it.
const ENDING: Needs = Needs {
    last_insert_id: false,
    previous_connection: false,
    diagnostics: false,
    reads_only: false,
    replica_ok: false,
    reads_hint: None,
    logical_columns: false,
    reach: Reach {
        ends_transaction: true,
        may_begin: false,
        plain_branch: false,
        outside: false,
    },
};

/// The AUTO_INCREMENT ids hscale wrote into an INSERT.
#[derive(Debug, Clone, Copy)]
pub(super) struct Generated {
    pub first: u64,
    pub upsert: Option<Upsert>,
}

impl super::Backends {
    /// One OK with the affected rows of every partition. `generated`: the
    /// AUTO_INCREMENT ids hscale wrote into the statements, the first of
    /// which the OK reports and LAST_INSERT_ID() returns once its row went
    /// in.
    async fn sum_affected(
        &mut self,
        client: &mut Client,
        slots: &[usize],
        commands: &[Command<'_>],
        needs: Needs,
        generated: Option<Generated>,
    ) -> Result<(), ProxyError> {
        let last_insert_id = self.state.last_insert_id;
        let parts: Vec<Part> = commands.iter().map(|&c| Part::Command(c)).collect();
        let mut total = self
            .write_each(slots, &parts, needs, generated.is_some(), false)
            .await?;
        if let Some(generated) = generated {
            // The server reports an id written in as given: that of the
            // last row it inserted or updated.
            let inserted = generated.upsert.is_none() || total.last_insert_id == generated.first;
            if inserted {
                total.last_insert_id = generated.first;
                self.state.last_insert_id = generated.first;
            } else if generated.upsert.is_some_and(|u| u.sets_last_insert_id) {
                self.state.last_insert_id = total.last_insert_id;
            } else {
                // The updated row's id is in the OK only.
                self.state.last_insert_id = last_insert_id;
            }
        }
        self.send_total(client, total).await
    }

    /// One OK for statements that ran on several connections.
    pub(super) async fn send_total(
        &mut self,
        client: &mut Client,
        total: OkInfo,
    ) -> Result<(), ProxyError> {
        let mut ok = Vec::with_capacity(16);
        OkInfo {
            status: self.status_flags(),
            ..total
        }
        .write(OK_HEADER, &mut ok);
        client.send_packet(1, &ok).await?;
        Ok(())
    }

    /// Writes on several partitions as one statement, their affected rows
    /// and warnings summed. Outside a transaction the partitions' statements
    /// run in one transaction per backend, committed once every one
    /// succeeded: in two phases where they span backends and
    /// `transactions = "atomic"` (`commit_atomic`), else in turn. `ids_written`: hscale wrote AUTO_INCREMENT ids into them,
    /// which LAST_INSERT_ID() on their connections does not know.
    pub(super) async fn write_each(
        &mut self,
        slots: &[usize],
        parts: &[Part<'_>],
        needs: Needs,
        ids_written: bool,
        same: bool,
    ) -> Result<OkInfo, ProxyError> {
        // One statement is atomic by itself.
        let implicit = !self.tx.in_transaction() && slots.len() > 1;
        let shared = self.shared.clone();
        let atomic = self.tx.statement_is_atomic(slots);
        // The first backend's part is a plain transaction whose commit
        // carries the decision, where the account may write it there.
        let plain = match atomic {
            true => {
                let bucket = self.slots[slots[0]].bucket.clone();
                crate::xa::may_record(&shared, slots[0], &bucket)
                    .await
                    .then_some(slots[0])
            }
            false => None,
        };
        let decided_on = plain.map(|slot| shared.pools[slot].id());
        let running = atomic.then(|| crate::xa::begin(&shared.cluster, decided_on));
        self.gather_from_here();
        let mut leases: Parts = BTreeMap::new();
        let outcome = self
            .run_each(
                slots,
                parts,
                needs,
                implicit,
                running.as_ref().map(|running| Atomic { running, plain }),
                &mut leases,
            )
            .await;
        // Copies of one table (one part per backend) change alike, or not
        // at all.
        let each: Vec<u64> = leases.values().map(|(_, c)| c.affected_rows).collect();
        let outcome = match outcome {
            Ok(_) if same && each.windows(2).any(|w| w[0] != w[1]) => {
                Err(ProxyError::CopiesDiffer { affected: each })
            }
            Ok(total) if same => Ok(OkInfo {
                affected_rows: each.first().copied().unwrap_or(0),
                warnings: total.warnings / slots.len().max(1) as u16,
                ..total
            }),
            other => other,
        };
        let outcome = match (outcome, implicit, &running) {
            (Ok(total), true, Some(running)) => {
                let branches = self.written_branches(&leases, plain);
                self.commit_branches(&mut leases, running, &branches)
                    .await
                    .map(|_| total)
            }
            (Err(e), true, Some(running)) => {
                let branches = self.written_branches(&leases, plain);
                self.roll_back_branches(&mut leases, running, &branches)
                    .await;
                Err(e)
            }
            (Ok(total), true, None) => self.finish_each(&mut leases, "COMMIT").await.map(|_| total),
            (Ok(total), false, _) => Ok(total),
            (Err(e), true, None) => {
                let _ = self.finish_each(&mut leases, "ROLLBACK").await;
                Err(e)
            }
            (Err(e), false, _) => Err(e),
        };
        let broken = matches!(&outcome, Err(e) if breaks_connection(e));
        for (slot, (lease, completion)) in std::mem::take(&mut leases) {
            if broken {
                // Which connection failed is not known here: none is reused.
                drop(lease);
                self.forget_connection_state(slot);
                continue;
            }
            let mut lease = lease;
            if ids_written {
                lease.conn.last_insert_id = UNKNOWN_ID;
            }
            self.finish_command(slot, lease, &completion);
            self.tx.wrote(slot);
        }
        if broken {
            self.gathered = None;
        }
        self.previous = Previous::Scattered {
            messages: outcome.as_ref().map_or(true, |total| total.warnings > 0),
            slot: slots[0],
        };
        outcome
    }

    /// Whether partitions on one backend must go as one statement there
    /// (`Route::united`): an ordered merge reads every partition at once,
    /// and a transaction (or a connection the session holds) has one
    /// connection on a backend. Elsewhere each partition takes its own.
    pub(super) fn must_unite(&self, slots: &[usize]) -> bool {
        let shared_backend = (1..slots.len()).any(|i| slots[..i].contains(&slots[i]));
        shared_backend && !self.may_borrow(slots)
    }

    /// Whether pooled connections may serve the statement's partitions
    /// besides the session's own: none is in a transaction or holds state.
    /// A connection held only for the last statement's warnings may take
    /// part: this statement replaces them.
    fn may_borrow(&self, slots: &[usize]) -> bool {
        !self.tx.in_transaction()
            && slots
                .iter()
                .all(|&s| !self.slots[s].binding.pins(self.tx.holds(s)))
    }

    /// The branches of an autocommitted write: each backend wrote, in XA.
    fn written_branches(&self, parts: &Parts, plain: Option<usize>) -> Vec<Branch> {
        parts
            .keys()
            .map(|&slot| Branch {
                backend: self.shared.pools[slot].id(),
                xa: Some(slot) != plain,
                wrote: true,
            })
            .collect()
    }

    async fn run_each(
        &mut self,
        slots: &[usize],
        parts: &[Part<'_>],
        needs: Needs,
        implicit: bool,
        atomic: Option<Atomic<'_>>,
        leases: &mut Parts,
    ) -> Result<OkInfo, ProxyError> {
        let distinct = slots
            .iter()
            .enumerate()
            .all(|(i, s)| !slots[..i].contains(s));
        if let (true, Some(atomic), true) = (implicit, atomic, distinct) {
            return self
                .run_branches_at_once(slots, parts, needs, atomic, leases)
                .await;
        }
        let mut total = OkInfo::default();
        for (&slot, &part) in slots.iter().zip(parts) {
            // The first part on a backend opens its branch.
            let mut branch_first = None;
            if let std::collections::btree_map::Entry::Vacant(vacant) = leases.entry(slot) {
                let mut lease = self.checkout(slot, needs).await?;
                let begun = match (implicit, atomic) {
                    (true, Some(atomic)) => {
                        branch_first = Some(atomic.opening(slot, &self.shared));
                        Ok(Completion::default())
                    }
                    (true, None) => run_query(&mut lease, "BEGIN").await,
                    (false, _) => Ok(Completion::default()),
                };
                vacant.insert((lease, Completion::default()));
                begun?;
            }
            let (lease, last) = leases.get_mut(&slot).expect("checked out above");
            let answer = match (part, branch_first) {
                (part, Some(start)) => run_in_branch(lease, part, &start).await,
                (Part::Command(command), None) => run(lease, command).await,
                (Part::Load { sql, lines }, None) => refused(
                    lease
                        .conn
                        .run_with_file(sql, Expect::ResultSets, Some(lines))
                        .await,
                ),
            };
            if left_messages(&answer) {
                let backend = lease.conn.backend;
                self.gather_messages(&mut lease.conn)
                    .await
                    .map_err(|source| {
                        ProxyError::Backend(BackendError::Lost { backend, source })
                    })?;
            }
            let completion = answer?;
            total.affected_rows += completion.affected_rows;
            total.warnings = total.warnings.saturating_add(completion.warnings);
            if total.last_insert_id == 0 {
                total.last_insert_id = completion.last_insert_id;
            }
            *last = completion;
        }
        Ok(total)
    }

    /// The parts of a write over several backends, one per backend, each in
    /// its XA branch or the plain part: the backends at once. Their messages are read after
    /// all ended, from connections that ran nothing since.
    async fn run_branches_at_once(
        &mut self,
        slots: &[usize],
        parts: &[Part<'_>],
        needs: Needs,
        atomic: Atomic<'_>,
        leases: &mut Parts,
    ) -> Result<OkInfo, ProxyError> {
        for &slot in slots {
            let lease = self.checkout(slot, needs).await?;
            leases.insert(slot, (lease, Completion::default()));
        }
        let shared = self.shared.clone();
        let answers = crate::exec::all_at_once(leases.iter_mut().map(|(&slot, (lease, _))| {
            let part = parts[slots
                .iter()
                .position(|&s| s == slot)
                .expect("a part's slot")];
            let start = atomic.opening(slot, &shared);
            async move { (slot, run_in_branch(lease, part, &start).await) }
        }))
        .await;
        let mut total = OkInfo::default();
        let mut first_error = None;
        for (slot, answer) in answers {
            let (lease, last) = leases.get_mut(&slot).expect("checked out above");
            if left_messages(&answer) {
                let backend = lease.conn.backend;
                if let Err(source) = self.gather_messages(&mut lease.conn).await {
                    first_error
                        .get_or_insert(ProxyError::Backend(BackendError::Lost { backend, source }));
                }
            }
            match answer {
                Ok(completion) => {
                    total.affected_rows += completion.affected_rows;
                    total.warnings = total.warnings.saturating_add(completion.warnings);
                    if total.last_insert_id == 0 {
                        total.last_insert_id = completion.last_insert_id;
                    }
                    *last = completion;
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(total), Err)
    }

    /// COMMIT or ROLLBACK on every connection of an implicit transaction.
    async fn finish_each(&mut self, leases: &mut Parts, what: &str) -> Result<(), ProxyError> {
        let mut first_error = None;
        for (lease, last) in leases.values_mut() {
            match run_query(lease, what).await {
                Ok(completion) => *last = completion,
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// One command of hscale's own on one slot (COMMIT, SET autocommit,
    /// LOCK TABLES, XA statements), whose answer the client does not see:
    /// no transaction opens for it.
    pub(super) async fn run_quietly(
        &mut self,
        slot: usize,
        payload: &[u8],
    ) -> Result<Completion, ProxyError> {
        self.run_on(slot, payload, false, ENDING, false).await
    }

    /// A SET of the client's run quietly on one slot ahead of where the
    /// session records it: the connection's settings are not the session's
    /// as recorded before or after it, so they are replayed whole before
    /// its next statement, and it is reset before another client's.
    pub(super) async fn run_setting_quietly(
        &mut self,
        slot: usize,
        payload: &[u8],
    ) -> Result<Completion, ProxyError> {
        self.run_on(slot, payload, false, ENDING, true).await
    }

    /// One part of a statement of the client's, run quietly on one slot
    /// with the `needs` of the statement (a savepoint on each backend).
    pub(super) async fn run_quietly_with(
        &mut self,
        slot: usize,
        payload: &[u8],
        needs: Needs,
    ) -> Result<Completion, ProxyError> {
        // A SAVEPOINT with autocommit off opens the transaction there, as
        // the client's statement does where it answers.
        let needs = Needs {
            reach: Reach {
                plain_branch: false,
                ..needs.reach
            },
            ..Needs::default()
        };
        self.run_on(slot, payload, false, needs, false).await
    }

    /// One part of a schema statement that runs on several connections,
    /// whose messages join the statement's.
    pub(super) async fn run_part(
        &mut self,
        slot: usize,
        payload: &[u8],
    ) -> Result<Completion, ProxyError> {
        self.run_on(slot, payload, true, ENDING, false).await
    }

    /// `unsettles`: the command changes session variables the session
    /// records elsewhere (`run_setting_quietly`).
    async fn run_on(
        &mut self,
        slot: usize,
        payload: &[u8],
        gather: bool,
        needs: Needs,
        unsettles: bool,
    ) -> Result<Completion, ProxyError> {
        let needs = Needs {
            reads_only: false,
            ..needs
        };
        let mut lease = self.checkout(slot, needs).await?;
        let answer = run(&mut lease, Command::Raw(payload)).await;
        if unsettles {
            lease.conn.settings = UNKNOWN_SETTINGS;
        }
        if gather && left_messages(&answer) {
            if let Err(source) = self.gather_messages(&mut lease.conn).await {
                let backend = lease.conn.backend;
                drop(lease);
                self.forget_connection_state(slot);
                return Err(ProxyError::Backend(BackendError::Lost { backend, source }));
            }
        }
        match answer {
            Ok(completion) => {
                self.finish_command(slot, lease, &completion);
                Ok(completion)
            }
            Err(e) if breaks_connection(&e) => {
                drop(lease);
                self.forget_connection_state(slot);
                Err(e)
            }
            Err(e) => {
                let failed = Completion {
                    error: true,
                    ..Completion::default()
                };
                self.finish_command(slot, lease, &failed);
                Err(e)
            }
        }
    }

    /// The rows of a query of hscale's own (the session's settings, in its
    /// transaction where one is open there).
    pub(super) async fn query_rows(
        &mut self,
        slot: usize,
        sql: &str,
    ) -> Result<crate::backend::Rows, ProxyError> {
        let mut lease = self.checkout(slot, Needs::default()).await?;
        match lease.conn.query(sql).await {
            Ok(answer) => {
                self.checkin(slot, lease.conn);
                answer.map_err(ProxyError::Refused)
            }
            Err(e) => {
                drop(lease);
                self.forget_connection_state(slot);
                Err(e.into())
            }
        }
    }
}

/// One partition's statement in a write over several.
#[derive(Debug, Clone, Copy)]
pub(super) enum Part<'a> {
    Command(Command<'a>),
    /// A LOAD DATA LOCAL INFILE (a COM_QUERY) whose file is `lines`.
    Load {
        sql: &'a [u8],
        lines: &'a Spool,
    },
}

/// An autocommitted write over several backends as one XA transaction:
/// its number, and the slot whose part is a plain transaction that carries
/// the decision, if the account may write it there.
#[derive(Clone, Copy)]
struct Atomic<'a> {
    running: &'a Running,
    plain: Option<usize>,
}

impl Atomic<'_> {
    /// What opens the part on `slot`.
    fn opening(&self, slot: usize, shared: &crate::shared::Shared) -> String {
        match Some(slot) == self.plain {
            true => "BEGIN".to_string(),
            false => {
                hscale_transaction::statements::start(&self.running.xid(shared.pools[slot].id()))
            }
        }
    }
}

/// One part of a write over several backends in its transaction (`start`:
/// its XA START, or BEGIN): a text statement with it in the same query (the
/// server runs nothing after a statement that fails) where the connection
/// runs several statements in one query, any other after it.
async fn run_in_branch(
    lease: &mut Lease,
    part: Part<'_>,
    start: &str,
) -> Result<Completion, ProxyError> {
    match part {
        Part::Command(Command::Raw([command::QUERY, sql @ ..]))
            if super::atomic::runs_several(lease) =>
        {
            let mut both = Vec::with_capacity(start.len() + sql.len() + 3);
            both.push(command::QUERY);
            both.extend_from_slice(start.as_bytes());
            both.extend_from_slice(b";\n");
            both.extend_from_slice(sql);
            run(lease, Command::Raw(&both)).await
        }
        Part::Command(command) => {
            run_query(lease, start).await?;
            run(lease, command).await
        }
        Part::Load { sql, lines } => {
            run_query(lease, start).await?;
            refused(
                lease
                    .conn
                    .run_with_file(sql, Expect::ResultSets, Some(lines))
                    .await,
            )
        }
    }
}

async fn run(lease: &mut Lease, command: Command<'_>) -> Result<Completion, ProxyError> {
    let payload = match command_payload(&mut lease.conn, command).await {
        Ok(Ok(payload)) => payload,
        Ok(Err(refused)) => return Err(ProxyError::Refused(refused)),
        Err(e) => return Err(ProxyError::Backend(e)),
    };
    refused(lease.conn.run(&payload, Expect::ResultSets).await)
}

/// A command's answer, the server's refusal as an error.
fn refused(
    answer: Result<Result<Completion, ErrorPacket>, BackendError>,
) -> Result<Completion, ProxyError> {
    match answer {
        Ok(Ok(completion)) => Ok(completion),
        Ok(Err(refused)) => Err(ProxyError::Refused(refused)),
        Err(e) => Err(ProxyError::Backend(e)),
    }
}

/// A part's answer left messages on its connection: warnings, or the
/// server's error.
fn left_messages(answer: &Result<Completion, ProxyError>) -> bool {
    match answer {
        Ok(completion) => completion.warnings > 0,
        Err(e) => matches!(e, ProxyError::Refused(_)),
    }
}

async fn run_query(lease: &mut Lease, sql: &str) -> Result<Completion, ProxyError> {
    run(lease, Command::Raw(&command::query(sql))).await
}

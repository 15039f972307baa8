//! Statements that run on several partitions: rows merged into one result
//! set (concatenated, or in ORDER BY order, with LIMIT), or affected rows
//! summed into one OK.

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hscale_merge::{Budget, Encoding, MergeError, Merger, Next, Spec};
use hscale_planner::{KillScope, Merge, Refusal, Upsert};
use hscale_transaction::Branch;
use hscale_transaction::Reach;
use hscale_wire::command;
use hscale_wire::frame::{read_lenenc, write_lenenc};
use hscale_wire::packets::{
    write_eof, write_result_end, ErrorPacket, OkInfo, ERR_HEADER, OK_HEADER,
};
use hscale_wire::resultset::is_result_end;
use hscale_wire::scan::{Completion, Expect};
use hscale_wire::{CapabilityFlags, WireError};

use super::atomic::Parts;
use super::client::Client;
use super::probed::{client_definition, ProbedColumns, Under};
use super::run::federate::Sink;
use super::run::kill::kill_backend_thread;
use super::slots::{Needs, Previous};
use super::state::{breaks_connection, UNKNOWN_SETTINGS};
use super::Backends;
use super::Memo;
use crate::backend::{BackendError, Lease, UNKNOWN_ID};
use crate::error::ProxyError;
use crate::exec::{command_payload, end_completion, Command, FLUSH_AT};
use crate::shared::Shared;
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

/// How long a scan runs before hscale watches its client's socket for a
/// disconnect: most scans end sooner, and the watch costs a handful of system
/// calls.
const WATCH_AFTER: Duration = Duration::from_millis(20);

/// The AUTO_INCREMENT ids hscale wrote into an INSERT.
#[derive(Debug, Clone, Copy)]
pub(super) struct Generated {
    pub first: u64,
    pub upsert: Option<Upsert>,
}

impl super::Backends {
    /// The column count and definitions, once, before the first row.
    async fn send_header(
        &mut self,
        client: &mut Client,
        merger: &Merger,
        out: &mut Output<'_>,
    ) -> Result<(), ProxyError> {
        if out.header_sent {
            return Ok(());
        }
        out.header_sent = true;
        let columns = merger.client_columns();
        let mut count = Vec::with_capacity(9);
        write_lenenc(columns.len() as u64, &mut count);
        out.seq = client.queue_packet(out.seq, &count);
        for definition in columns {
            out.seq = client.queue_packet(out.seq, definition);
        }
        if !client.deprecate_eof() {
            let mut eof = Vec::with_capacity(5);
            write_eof(0, 0, &mut eof);
            out.seq = client.queue_packet(out.seq, &eof);
        }
        Ok(())
    }

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
}

impl super::Backends {
    fn finish_completed(&mut self, source: &mut Source, completion: &Completion) {
        source.reading = Reading::Ended;
        if let Some(lease) = source.lease.take() {
            self.finish_command(source.slot, lease, completion);
        }
    }

    fn finish_source(&mut self, source: &mut Source, failed: bool) {
        let completion = Completion {
            error: failed,
            ..Completion::default()
        };
        self.finish_completed(source, &completion);
    }

    /// Reads what a partition still sends, to its end.
    async fn drain(&mut self, source: &mut Source, answered: bool) -> Result<(), ProxyError> {
        loop {
            match source.reading {
                Reading::NotSent | Reading::Ended => return Ok(()),
                Reading::Columns | Reading::Rows => {}
            }
            let packet = match self.next_of(source, answered).await {
                Ok(packet) => packet,
                Err(Abort::Failed(e)) => return Err(e),
                Err(Abort::Answer(_)) => unreachable!("reading a packet only fails"),
            };
            let deprecate_eof = source.deprecate_eof();
            if packet.first() == Some(&ERR_HEADER) {
                self.finish_source(source, true);
            } else if source.reading == Reading::Columns {
                // The column count: skip the definitions too.
                let count = read_lenenc(&packet).map_or(0, |(n, _)| n);
                for _ in 0..count + u64::from(!deprecate_eof) {
                    if let Err(Abort::Failed(e)) = self.next_of(source, answered).await {
                        return Err(e);
                    }
                }
                source.reading = Reading::Rows;
            } else if is_result_end(&packet, deprecate_eof) {
                let completion = end_completion(&packet, deprecate_eof);
                if completion.warnings > 0 {
                    match self.gather_of(source, answered).await {
                        Ok(()) => {}
                        Err(Abort::Failed(e)) => return Err(e),
                        Err(Abort::Answer(_)) => unreachable!("gathering only fails"),
                    }
                }
                self.finish_completed(source, &completion);
            }
        }
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
}

impl super::Backends {
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

    async fn next_of(&mut self, source: &mut Source, answered: bool) -> Result<Bytes, Abort> {
        let lease = source
            .lease
            .as_mut()
            .expect("a partition being read has a connection");
        match lease.conn.stream.read_packet().await {
            Ok(Some(packet)) => Ok(packet.payload),
            Ok(None) => Err(Abort::Failed(self.lost(
                source,
                WireError::Closed,
                answered,
            ))),
            Err(e) => Err(Abort::Failed(self.lost(source, e, answered))),
        }
    }

    /// The error for a partition whose connection failed; its connection is
    /// gone, with whatever state the session had there.
    fn lost(&mut self, source: &mut Source, error: WireError, answered: bool) -> ProxyError {
        let backend = source.lease.take().map_or(0, |l| l.conn.backend);
        source.reading = Reading::Ended;
        self.forget_connection_state(source.slot);
        let error = BackendError::Lost {
            backend,
            source: error,
        };
        match answered {
            true => ProxyError::BackendMidAnswer { source: error },
            false => ProxyError::Backend(error),
        }
    }

    /// The messages a partition's statement left, read before its
    /// connection goes back.
    async fn gather_of(&mut self, source: &mut Source, answered: bool) -> Result<(), Abort> {
        let Some(lease) = source.lease.as_mut() else {
            return Ok(());
        };
        match self.gather_messages(&mut lease.conn).await {
            Ok(()) => Ok(()),
            Err(e) => Err(Abort::Failed(self.lost(source, e, answered))),
        }
    }

    /// Connections in the middle of an answer cannot be reused: closed.
    fn drop_sources(&mut self, sources: &mut [Source]) {
        for source in sources {
            if source.lease.take().is_some() {
                self.forget_connection_state(source.slot);
            }
            source.reading = Reading::Ended;
        }
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
}

impl super::Backends {
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
}

impl super::Backends {
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

/// One partition's part of a merged result set.
struct Source {
    slot: usize,
    lease: Option<Lease>,
    reading: Reading,
    /// A `UNION ALL` of several partitions on one backend.
    union: bool,
    /// The text of one of the union's partitions' statements, prepared
    /// before the union for its definitions (`definitions`).
    probe: Option<Bytes>,
    /// Where the session keeps them (`ProbedColumns`).
    probe_key: Option<Vec<u8>>,
    /// The definitions the client gets in place of the union's.
    definitions: Option<Arc<[Bytes]>>,
}

/// A `UNION` of partitions that MariaDB refused for its own reasons (an
/// expression whose collations it cannot aggregate: a `CASE` between two
/// columns of different collations), where one table would have answered.
fn cannot_unite(error: &[u8]) -> bool {
    const CANT_AGGREGATE_COLLATIONS: [u16; 3] = [1267, 1270, 1271];
    ErrorPacket::parse(error)
        .is_ok_and(|e| CANT_AGGREGATE_COLLATIONS.contains(&e.code) && e.message.contains("'UNION'"))
}

/// The client's answer in place of `cannot_unite`'s error, which names a
/// `UNION` the client never wrote.
fn union_refused() -> Bytes {
    let refusal = ProxyError::Unroutable(Refusal {
        table: None,
        reason: "an ORDER BY whose columns MariaDB cannot unite (ERROR 1271: an expression mixing collations) over partitions that share a backend inside a transaction; COLLATE the expression, or order outside the transaction".into(),
    });
    let mut bytes = Vec::new();
    if let (Some(packet), _) = refusal.to_client() {
        packet.write(&mut bytes);
    }
    bytes.into()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    NotSent,
    Columns,
    Rows,
    Ended,
}

impl Source {
    fn deprecate_eof(&self) -> bool {
        self.lease.as_ref().is_some_and(|l| {
            l.conn
                .key
                .capabilities
                .contains(CapabilityFlags::CLIENT_DEPRECATE_EOF)
        })
    }
}

/// What the client got so far of a merged result set; or, `copying`, where
/// its rows go instead of to the client.
struct Output<'c> {
    seq: u8,
    header_sent: bool,
    warnings: u16,
    status: Option<u16>,
    copying: Option<&'c mut Sink>,
}

/// Why a merged result set stopped early.
enum Abort {
    /// A partition's ERR (or hscale's refusal): the client's answer.
    Answer(Bytes),
    Failed(ProxyError),
}

impl From<ProxyError> for Abort {
    fn from(e: ProxyError) -> Abort {
        Abort::Failed(e)
    }
}

fn merge_error(e: MergeError) -> Abort {
    let reason = match e {
        MergeError::Malformed(what) => {
            return Abort::Failed(ProxyError::Backend(BackendError::Lost {
                backend: 0,
                source: WireError::Malformed { what },
            }))
        }
        MergeError::Budget(_) | MergeError::Spill(_) => {
            return Abort::Failed(ProxyError::MergeSpill(e))
        }
        other => other.to_string(),
    };
    Abort::Failed(ProxyError::Unroutable(Refusal {
        table: None,
        reason,
    }))
}

/// Commands on several partitions, their answers merged into one.
/// `probes`: where a command joins several partitions of its backend
/// (`Session::must_unite`), one partition's statement.
pub(super) async fn run_merged(
    shared: &Arc<Shared>,
    client: &mut Client,
    memo: &mut Memo,
    backends: &mut Backends,
    merge: Merge,
    slots: &[usize],
    commands: &[Command<'_>],
    needs: Needs,
    generated: Option<Generated>,
    probes: Vec<Option<Bytes>>,
) -> Result<(), ProxyError> {
    match merge {
        Merge::AffectedRows => {
            backends
                .sum_affected(client, slots, commands, needs, generated)
                .await
        }
        Merge::Copies => {
            let parts: Vec<Part> = commands.iter().map(|&c| Part::Command(c)).collect();
            let one = backends
                .write_each(slots, &parts, needs, false, true)
                .await?;
            backends.send_total(client, one).await
        }
        Merge::Single => {
            merge_rows(
                shared,
                client,
                memo,
                backends,
                Spec::default(),
                slots,
                commands,
                needs,
                probes,
                None,
            )
            .await
        }
        Merge::Rows(spec) => {
            merge_rows(
                shared, client, memo, backends, *spec, slots, commands, needs, probes, None,
            )
            .await
        }
    }
}

/// One result set out of several partitions' result sets, as `spec`
/// merges them (`hscale_merge::Merger`): every partition's statement is
/// sent at once, and every answer's columns are read before the client
/// sees anything, so that an error from any partition is the whole
/// answer. Partitions on one backend need a connection each when their
/// rows are merged in order (or come as one statement, `must_unite`);
/// otherwise they take turns on the session's. `copying`: the rows go
/// there, not to the client (`Session::federate`).
pub(super) async fn merge_rows(
    shared: &Arc<Shared>,
    client: &mut Client,
    memo: &mut Memo,
    backends: &mut Backends,
    spec: Spec,
    slots: &[usize],
    commands: &[Command<'_>],
    needs: Needs,
    mut probes: Vec<Option<Bytes>>,
    copying: Option<&mut Sink>,
) -> Result<(), ProxyError> {
    let may_borrow = backends.may_borrow(slots);
    // EXECUTE answers with binary rows, a query with text rows.
    let encoding = match commands.first() {
        Some(Command::Statement { .. }) => Encoding::Binary,
        _ => Encoding::Text,
    };
    let scans = &shared.scans;
    let budget = Budget {
        memory_bytes: scans.memory_bytes,
        spill_bytes: scans.spill_bytes,
        spill_dir: scans.spill_dir.clone(),
        ..Budget::default()
    };
    let (timeout_ms, fan_out) = (scans.timeout_ms, scans.fan_out);
    // An ordered merge reads every partition's next row: all run at once.
    let fan_out = match spec.keys.is_empty() {
        true => fan_out,
        false => usize::MAX,
    };
    let mut merger =
        Merger::new(spec, slots.len(), shared.collations.clone(), encoding).with_budget(budget);
    let mut sources: Vec<Source> = slots
        .iter()
        .map(|&slot| Source {
            slot,
            lease: None,
            reading: Reading::NotSent,
            union: false,
            probe: None,
            probe_key: None,
            definitions: None,
        })
        .collect();
    for (source, text) in sources.iter_mut().zip(&probes) {
        source.union = text.is_some();
    }
    // Where no backend answers with one partition's own definitions, a
    // probe of one partition's statement gives them.
    if !probes.is_empty() && probes.iter().all(Option::is_some) {
        probe_first(
            shared,
            memo,
            backends,
            &mut sources[0],
            probes.swap_remove(0),
        );
    }
    let copies = copying.is_some();
    let mut out = Output {
        seq: 1,
        header_sent: false,
        warnings: 0,
        status: None,
        copying,
    };
    backends.gather_from_here();
    client.column_names.start(&shared.dictionary);
    let watcher = watch_client(shared, client, backends);
    let driven = drive(
        shared,
        client,
        memo,
        backends,
        &mut merger,
        &mut sources,
        commands,
        needs,
        may_borrow.then_some(fan_out),
        &mut out,
    );
    let watched = async {
        tokio::select! {
            biased;
            outcome = driven => outcome,
            never = watcher => match never {},
        }
    };
    let outcome = match timeout_ms {
        0 => watched.await,
        ms => tokio::time::timeout(Duration::from_millis(ms), watched)
            .await
            .unwrap_or(Err(Abort::Failed(ProxyError::ScanTimeout { ms }))),
    };
    backends.handle.scan_ended();
    let outcome = match outcome {
        Ok(()) => Ok(()),
        Err(Abort::Answer(packet)) => Err(packet),
        Err(Abort::Failed(e)) => {
            let stopped = matches!(e, ProxyError::ScanTimeout { .. });
            if stopped || matches!(e, ProxyError::Client(_)) {
                // Nobody waits for the partitions' queries any more.
                for source in sources.iter().filter(|s| s.reading != Reading::Ended) {
                    if let Some(lease) = &source.lease {
                        let (backend, thread) = (lease.conn.backend, lease.conn.thread_id);
                        kill_backend_thread(shared, backend, thread, KillScope::Query).await;
                    }
                }
            }
            // Connections in the middle of an answer (or of a packet,
            // where the timeout cut in) are closed.
            backends.drop_sources(&mut sources);
            backends.gathered = None;
            if stopped && out.header_sent {
                // Mid-result, the ERR takes the end packet's place.
                if let (Some(packet), _) = e.to_client() {
                    let mut bytes = Vec::new();
                    packet.write(&mut bytes);
                    client.send_packet(out.seq, &bytes).await?;
                }
                return Ok(());
            }
            return Err(e);
        }
    };
    // Partitions still sending (the LIMIT was reached, or another failed)
    // are read to their end, so that their connections are clean.
    for i in 0..sources.len() {
        if let Err(e) = backends.drain(&mut sources[i], out.seq > 1).await {
            backends.drop_sources(&mut sources);
            return Err(e);
        }
    }
    if slots.len() > 1 {
        backends.previous = Previous::Scattered {
            messages: out.warnings > 0 || outcome.is_err(),
            slot: slots[0],
        };
    }
    if copies {
        if let Some(sink) = out.copying.as_deref_mut() {
            sink.columns(merger.client_columns());
        }
        return match outcome {
            Ok(()) => Ok(()),
            Err(packet) => Err(ProxyError::Refused(
                ErrorPacket::parse(&packet).map_err(ProxyError::Client)?,
            )),
        };
    }
    match outcome {
        Ok(()) => {
            backends.send_header(client, &merger, &mut out).await?;
            let deprecate_eof = client.deprecate_eof();
            let mut end = Vec::with_capacity(16);
            write_result_end(deprecate_eof, out.status.unwrap_or(0), &mut end);
            if !deprecate_eof {
                end[1..3].copy_from_slice(&out.warnings.to_le_bytes());
            }
            client.send_packet(out.seq, &end).await?;
        }
        // Mid-result, the ERR takes the end packet's place, as when the
        // server itself fails a statement after sending rows.
        Err(packet) => {
            client.send_packet(out.seq, &packet).await?;
        }
    }
    Ok(())
}

/// While a scan waits on its partitions, hscale writes nothing to the
/// client and would not see it leave: once the scan has run for
/// `WATCH_AFTER`, this watches the client's socket (a duplicate of it,
/// peeked, never read) and kills the partitions' queries if the client
/// closes it. A client that sends something meanwhile (a pipelined
/// command) ends the watch. Never completes: it runs beside the scan and
/// is dropped with it.
pub(super) fn watch_client(
    shared: &Arc<Shared>,
    client: &Client,
    backends: &Backends,
) -> impl std::future::Future<Output = std::convert::Infallible> {
    let raw = client.stream.get_ref().as_raw_fd();
    let (handle, shared) = (backends.handle.clone(), shared.clone());
    async move {
        tokio::time::sleep(WATCH_AFTER).await;
        // SAFETY: `merge_rows` drops this future before it returns, and
        // the session's client socket outlives `merge_rows`.
        let client_fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(raw) };
        let watched = || {
            let duplicate: std::net::TcpStream =
                socket2::SockRef::from(&client_fd).try_clone().ok()?.into();
            duplicate.set_nonblocking(true).ok()?;
            tokio::net::TcpStream::from_std(duplicate).ok()
        };
        if let Some(socket) = watched() {
            let mut byte = [0u8; 1];
            if matches!(socket.peek(&mut byte).await, Ok(0) | Err(_)) {
                for (backend, thread_id) in handle.threads() {
                    kill_backend_thread(&shared, backend, thread_id, KillScope::Query).await;
                }
            }
        }
        std::future::pending().await
    }
}

/// Feeds the merger from the partitions as it asks and sends the client
/// what it gives. `fan_out`: how many partitions of one backend are sent
/// at once, each on a connection of its own; `None`: one, on the
/// session's (the others take turns as the merger reaches them).
async fn drive(
    shared: &Arc<Shared>,
    client: &mut Client,
    memo: &mut Memo,
    backends: &mut Backends,
    merger: &mut Merger,
    sources: &mut [Source],
    commands: &[Command<'_>],
    needs: Needs,
    fan_out: Option<usize>,
    out: &mut Output<'_>,
) -> Result<(), Abort> {
    let fan_out = fan_out.unwrap_or(1);
    let upfront: Vec<usize> = (0..sources.len())
        .filter(|&i| {
            let before = sources[..i].iter().filter(|s| s.slot == sources[i].slot);
            before.count() < fan_out
        })
        .collect();
    for &i in &upfront {
        start_source(memo, backends, &mut sources[i], commands[i], needs).await?;
    }
    for &i in &upfront {
        read_columns(shared, client, memo, backends, merger, i, &mut sources[i]).await?;
    }
    loop {
        // Rows already read, and a merge's answer once every group has
        // come, take no turn at the socket, where tokio counts a task's
        // work: one unit a row lets this worker's other sessions run
        // every 128 rows, not after megabytes.
        tokio::task::consume_budget().await;
        let i = match merger.step().map_err(merge_error)? {
            Next::Row(row) => {
                if let Some(copying) = out.copying.as_deref_mut() {
                    let ready = copying
                        .row(merger.client_columns(), row)
                        .map_err(Abort::Failed)?;
                    if let Some(insert) = ready {
                        let main = shared.main;
                        backends.run_quietly(main, &insert).await?;
                    }
                    continue;
                }
                backends
                    .send_header(client, merger, out)
                    .await
                    .map_err(Abort::Failed)?;
                out.seq = client.queue_packet(out.seq, &row);
                if client.write_buffer().len() >= FLUSH_AT {
                    client
                        .flush()
                        .await
                        .map_err(|e| Abort::Failed(ProxyError::Client(e)))?;
                }
                continue;
            }
            Next::Done => return Ok(()),
            Next::Need(i) => i,
            Next::NeedAny => sources
                .iter()
                .position(|s| !matches!(s.reading, Reading::Ended))
                .expect("the merger asks only while a partition is open"),
        };
        if matches!(sources[i].reading, Reading::NotSent) {
            start_source(memo, backends, &mut sources[i], commands[i], needs).await?;
            read_columns(shared, client, memo, backends, merger, i, &mut sources[i]).await?;
            continue;
        }
        let answered = out.seq > 1;
        let packet = backends.next_of(&mut sources[i], answered).await?;
        let deprecate_eof = sources[i].deprecate_eof();
        if packet.first() == Some(&ERR_HEADER) {
            backends.gather_of(&mut sources[i], answered).await?;
            backends.finish_source(&mut sources[i], true);
            return Err(Abort::Answer(packet));
        }
        if is_result_end(&packet, deprecate_eof) {
            let completion = end_completion(&packet, deprecate_eof);
            if completion.warnings > 0 {
                backends.gather_of(&mut sources[i], answered).await?;
            }
            out.warnings = out.warnings.saturating_add(completion.warnings);
            out.status = completion.status;
            backends.finish_completed(&mut sources[i], &completion);
            merger.end(i);
            continue;
        }
        merger.row(i, packet).map_err(merge_error)?;
    }
}

/// Checks a connection out for a partition and sends its statement.
async fn start_source(
    memo: &mut Memo,
    backends: &mut Backends,
    source: &mut Source,
    command: Command<'_>,
    needs: Needs,
) -> Result<(), Abort> {
    let mut lease = backends
        .checkout(source.slot, needs)
        .await
        .map_err(Abort::Failed)?;
    if let Some(sql) = source.probe.take() {
        let prepared = match lease.conn.prepare(&sql).await {
            Ok(prepared) => prepared,
            Err(e) => {
                backends.forget_connection_state(source.slot);
                return Err(Abort::Failed(ProxyError::Backend(e)));
            }
        };
        if let Some(id) = prepared.id() {
            let deprecate_eof = lease
                .conn
                .key
                .capabilities
                .contains(CapabilityFlags::CLIENT_DEPRECATE_EOF);
            let definitions: Arc<[Bytes]> = prepared
                .column_definitions(deprecate_eof)
                .into_iter()
                .map(Bytes::copy_from_slice)
                .collect();
            if let Some(key) = &source.probe_key {
                memo.probed_columns.keep(key.clone(), definitions.clone());
            }
            source.definitions = Some(definitions);
            if let Err(e) = lease.conn.close_statement(id).await {
                backends.forget_connection_state(source.slot);
                return Err(Abort::Failed(ProxyError::Backend(e)));
            }
        }
    }
    let payload = match command_payload(&mut lease.conn, command).await {
        Ok(Ok(payload)) => payload,
        Ok(Err(refusal)) => {
            if let Err(e) = backends.gather_messages(&mut lease.conn).await {
                source.lease = Some(lease);
                return Err(Abort::Failed(backends.lost(source, e, false)));
            }
            backends.finish_command(source.slot, lease, &Completion::default());
            let mut packet = Vec::with_capacity(refusal.message.len() + 9);
            refusal.write(&mut packet);
            return Err(Abort::Answer(packet.into()));
        }
        Err(e) => {
            backends.forget_connection_state(source.slot);
            return Err(Abort::Failed(ProxyError::Backend(e)));
        }
    };
    backends
        .handle
        .scanning(lease.conn.backend, lease.conn.thread_id);
    let sent = lease.conn.send_command(&payload).await;
    source.lease = Some(lease);
    source.reading = Reading::Columns;
    if let Err(e) = sent {
        return Err(Abort::Failed(backends.lost(source, e, false)));
    }
    Ok(())
}

/// A partition's column definitions, for the merger.
async fn read_columns(
    shared: &Arc<Shared>,
    client: &mut Client,
    memo: &mut Memo,
    backends: &mut Backends,
    merger: &mut Merger,
    i: usize,
    source: &mut Source,
) -> Result<(), Abort> {
    let first = backends.next_of(source, false).await?;
    let malformed = |what| {
        Abort::Failed(ProxyError::Backend(BackendError::Lost {
            backend: 0,
            source: WireError::Malformed { what },
        }))
    };
    let count = match first.first() {
        Some(&ERR_HEADER) => {
            backends.gather_of(source, false).await?;
            backends.finish_source(source, true);
            let answer = match source.union && cannot_unite(&first) {
                true => union_refused(),
                false => first,
            };
            return Err(Abort::Answer(answer));
        }
        Some(&OK_HEADER) => return Err(malformed("an OK where rows were expected")),
        _ => read_lenenc(&first).ok_or(malformed("column count"))?.0,
    };
    let count = count as usize;
    let mut definitions = Vec::with_capacity(count);
    for _ in 0..count {
        definitions.push(backends.next_of(source, false).await?);
    }
    if !source.deprecate_eof() {
        backends.next_of(source, false).await?;
    }
    source.reading = Reading::Rows;
    let exact = match (source.union, source.definitions.take()) {
        (false, _) => true,
        (true, Some(probed)) if probed.len() == count => {
            let hidden_from = count - merger.hidden_columns().min(count);
            let mut stands = true;
            for (i, (definition, probed)) in definitions.iter_mut().zip(probed.iter()).enumerate() {
                match client_definition(probed, definition, i >= hidden_from) {
                    Some(client) => *definition = client,
                    None => stands = false,
                }
            }
            if !stands {
                forget_probe(memo, source);
            }
            stands
        }
        (true, probed) => {
            if probed.is_some() {
                forget_probe(memo, source);
            }
            false
        }
    };
    let names = &shared.dictionary;
    for definition in &mut definitions {
        if let Some(renamed) = client.column_names.logical(names, definition) {
            *definition = Bytes::copy_from_slice(renamed);
        }
    }
    match exact {
        true => merger.columns(i, definitions),
        false => merger.union_columns(i, definitions),
    }
    .map_err(merge_error)
}

/// A probe's definitions that no longer fit its union's (the table
/// changed) are probed anew next time.
fn forget_probe(memo: &mut Memo, source: &Source) {
    if let Some(key) = &source.probe_key {
        memo.probed_columns.forget(key);
    }
}

/// Gives a union that stands for every partition the definitions of
/// its first partition's statement `text`: kept from an earlier probe of
/// its shape, or probed before the union is sent.
fn probe_first(
    shared: &Arc<Shared>,
    memo: &mut Memo,
    backends: &mut Backends,
    source: &mut Source,
    text: Option<Bytes>,
) {
    let Some(text) = text else { return };
    let under = Under {
        settings: backends.state.fingerprint(),
        generation: shared.dictionary.snapshot().generation(),
        db: backends.state.db.as_deref().unwrap_or(""),
        quoting: backends.quoting,
    };
    source.probe_key = ProbedColumns::key(&under, &text);
    source.definitions = source
        .probe_key
        .as_deref()
        .and_then(|key| memo.probed_columns.get(key));
    if source.definitions.is_none() {
        source.probe = Some(text);
    }
}

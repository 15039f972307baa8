//! Statements that run on several partitions, one after the other: rows
//! concatenated into one result set, or affected rows summed into one OK.
//! Parallel fan-out and real merges come with full partition scans.

use std::collections::BTreeMap;

use hscale_planner::Merge;
use hscale_wire::packets::{write_result_end, OkInfo, OK_HEADER};
use hscale_wire::scan::{Completion, Expect};
use hscale_wire::CapabilityFlags;

use super::slots::{Needs, Previous};
use super::state::{breaks_connection, command, COM_QUERY};
use super::Session;
use crate::backend::{BackendError, Lease, UNKNOWN_ID};
use crate::error::ProxyError;
use crate::exec::{command_payload, relay_rows, Command, RelayError, RowsEnd};

impl Session {
    /// Commands on several partitions, their answers merged into one.
    pub(super) async fn run_merged(
        &mut self,
        merge: Merge,
        slots: &[usize],
        commands: &[Command<'_>],
        needs: Needs,
        generated: Option<u64>,
    ) -> Result<(), ProxyError> {
        match merge {
            Merge::AffectedRows => self.sum_affected(slots, commands, needs, generated).await,
            Merge::Single | Merge::Concat => self.concat_rows(slots, commands, needs).await,
        }
    }

    /// One result set: the first partition's columns, every partition's rows.
    async fn concat_rows(
        &mut self,
        slots: &[usize],
        commands: &[Command<'_>],
        needs: Needs,
    ) -> Result<(), ProxyError> {
        let mut seq = 1u8;
        let mut last = Completion::default();
        let mut warnings = 0u16;
        for (i, (&slot, &command)) in slots.iter().zip(commands).enumerate() {
            let mut lease = self.checkout(slot, needs).await?;
            let relayed =
                relay_rows(&mut self.client, &mut lease.conn, command, i == 0, &mut seq).await;
            match relayed {
                Ok(RowsEnd::Done(completion)) => {
                    warnings = warnings.saturating_add(completion.warnings);
                    last = completion;
                    self.finish_command(slot, lease, &completion);
                }
                Ok(RowsEnd::Error(packet)) => {
                    let failed = Completion {
                        error: true,
                        ..Completion::default()
                    };
                    self.finish_command(slot, lease, &failed);
                    self.previous = Previous::Scattered;
                    // Mid-result, the ERR takes the end packet's place, as when
                    // the server itself fails a statement after sending rows.
                    self.client.send_packet(seq, &packet).await?;
                    return Ok(());
                }
                Err(RelayError::Backend { source, answered }) => {
                    let backend = lease.conn.backend;
                    self.forget_connection_state(slot);
                    let error = BackendError::Lost { backend, source };
                    return Err(match answered {
                        true => ProxyError::BackendMidAnswer { source: error },
                        false => ProxyError::Backend(error),
                    });
                }
                Err(RelayError::Client(e)) => return Err(ProxyError::Client(e)),
            }
        }
        let deprecate_eof = self
            .capabilities
            .contains(CapabilityFlags::CLIENT_DEPRECATE_EOF);
        let mut end = Vec::with_capacity(16);
        write_result_end(deprecate_eof, last.status.unwrap_or(0), &mut end);
        if !deprecate_eof {
            end[1..3].copy_from_slice(&warnings.to_le_bytes());
        }
        self.client.send_packet(seq, &end).await?;
        if slots.len() > 1 {
            self.previous = Previous::Scattered;
        }
        Ok(())
    }

    /// One OK with the affected rows of every partition. Outside a
    /// transaction the partitions' statements run in one transaction per
    /// backend, committed in turn once every one succeeded. `generated`: the
    /// first AUTO_INCREMENT id hscale wrote into the statements, which the OK
    /// reports and LAST_INSERT_ID() returns.
    async fn sum_affected(
        &mut self,
        slots: &[usize],
        commands: &[Command<'_>],
        needs: Needs,
        generated: Option<u64>,
    ) -> Result<(), ProxyError> {
        // One statement is atomic by itself.
        let implicit = !self.in_transaction() && slots.len() > 1;
        let mut leases: BTreeMap<usize, (Lease, Completion)> = BTreeMap::new();
        let outcome = self
            .run_each(slots, commands, needs, implicit, &mut leases)
            .await;
        let outcome = match (outcome, implicit) {
            (Ok(total), true) => self.finish_each(&mut leases, "COMMIT").await.map(|_| total),
            (Ok(total), false) => Ok(total),
            (Err(e), true) => {
                let _ = self.finish_each(&mut leases, "ROLLBACK").await;
                Err(e)
            }
            (Err(e), false) => Err(e),
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
            if generated.is_some() {
                lease.conn.last_insert_id = UNKNOWN_ID;
            }
            self.finish_command(slot, lease, &completion);
            if self.slots[slot].binding.transaction {
                self.slots[slot].binding.wrote = true;
            }
        }
        let mut total = outcome?;
        if let Some(first) = generated {
            total.last_insert_id = first;
            self.state.last_insert_id = first;
        }
        self.previous = Previous::Scattered;
        self.send_total(total).await
    }

    /// One OK for statements that ran on several connections.
    pub(super) async fn send_total(&mut self, total: OkInfo) -> Result<(), ProxyError> {
        let mut ok = Vec::with_capacity(16);
        OkInfo {
            status: self.status_flags(),
            ..total
        }
        .write(OK_HEADER, &mut ok);
        self.client.send_packet(1, &ok).await?;
        Ok(())
    }

    async fn run_each(
        &mut self,
        slots: &[usize],
        commands: &[Command<'_>],
        needs: Needs,
        implicit: bool,
        leases: &mut BTreeMap<usize, (Lease, Completion)>,
    ) -> Result<OkInfo, ProxyError> {
        let mut total = OkInfo::default();
        for (&slot, &command) in slots.iter().zip(commands) {
            if let std::collections::btree_map::Entry::Vacant(vacant) = leases.entry(slot) {
                let mut lease = self.checkout(slot, needs).await?;
                let begun = match implicit {
                    true => run_query(&mut lease, "BEGIN").await,
                    false => Ok(Completion::default()),
                };
                vacant.insert((lease, Completion::default()));
                begun?;
            }
            let (lease, last) = leases.get_mut(&slot).expect("checked out above");
            let completion = run(lease, command).await?;
            total.affected_rows += completion.affected_rows;
            total.warnings = total.warnings.saturating_add(completion.warnings);
            if total.last_insert_id == 0 {
                total.last_insert_id = completion.last_insert_id;
            }
            *last = completion;
        }
        Ok(total)
    }

    /// COMMIT or ROLLBACK on every connection of an implicit transaction.
    async fn finish_each(
        &mut self,
        leases: &mut BTreeMap<usize, (Lease, Completion)>,
        what: &str,
    ) -> Result<(), ProxyError> {
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

impl Session {
    /// One command on one slot whose answer the client does not see.
    pub(super) async fn run_quietly(
        &mut self,
        slot: usize,
        payload: &[u8],
    ) -> Result<Completion, ProxyError> {
        let mut lease = self.checkout(slot, Needs::default()).await?;
        match run(&mut lease, Command::Raw(payload)).await {
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

async fn run(lease: &mut Lease, command: Command<'_>) -> Result<Completion, ProxyError> {
    let payload = match command_payload(&mut lease.conn, command).await {
        Ok(Ok(payload)) => payload,
        Ok(Err(refused)) => return Err(ProxyError::Refused(refused)),
        Err(e) => return Err(ProxyError::Backend(e)),
    };
    match lease.conn.run(&payload, Expect::ResultSets).await {
        Ok(Ok(completion)) => Ok(completion),
        Ok(Err(refused)) => Err(ProxyError::Refused(refused)),
        Err(e) => Err(ProxyError::Backend(e)),
    }
}

async fn run_query(lease: &mut Lease, sql: &str) -> Result<Completion, ProxyError> {
    run(lease, Command::Raw(&command(COM_QUERY, sql))).await
}

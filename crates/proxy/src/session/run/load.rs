//! LOAD DATA LOCAL INFILE into a partitioned table (the planner's `Load`):
//! hscale asks the client for the file, reads its lines into one spool per
//! partition table, and only once the whole file is read and every line
//! placed has each partition table's backend load its lines, as one write
//! over several partitions: a line hscale cannot place refuses the whole
//! statement, and nothing is written.

use std::collections::BTreeMap;
use std::sync::Arc;

use hscale_planner::PlanError;
use hscale_planner::{text_literal, Load, Refusal, Target};
use hscale_wire::command;
use hscale_wire::frame::write_lenenc;
use hscale_wire::packets::{ErrorPacket, OkInfo, OK_HEADER};
use hscale_wire::CapabilityFlags;

use crate::error::ProxyError;
use crate::session::client::Client;
use crate::session::scatter::Part;
use crate::session::slots::Needs;
use crate::session::Backends;
use crate::shared::Shared;
use crate::spool::{Spool, SpoolBudget};

const LOCAL_INFILE_REQUEST: u8 = 0xfb;

/// The client's file, placed: each partition table's lines.
#[derive(Default)]
struct Placed {
    spools: BTreeMap<Target, Spool>,
    /// The highest AUTO_INCREMENT id a line gives.
    highest_id: Option<u64>,
}

impl crate::session::Backends {
    /// How many columns the table has: the fields of a line the server
    /// reads when the statement lists none (it skips the rest of the line).
    async fn table_columns(&mut self, load: &Load) -> Result<usize, ProxyError> {
        let target = load.table.default_target();
        let slot = self.slot_of(target.backend)?;
        let sql = format!(
            "SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = {} AND TABLE_NAME = {}",
            text_literal(&load.table.table.db),
            text_literal(&target.table)
        );
        let rows = self.query_rows(slot, &sql).await?;
        let count = rows
            .first()
            .and_then(|row| row.first()?.as_ref())
            .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok());
        match count {
            Some(count) if count > 0 => Ok(count),
            _ => Err(ProxyError::Unroutable(Refusal {
                table: Some(load.table.table.clone()),
                reason: "LOAD DATA into a table whose columns hscale cannot find".into(),
            })),
        }
    }
}

pub(in crate::session) async fn run(
    shared: &Arc<Shared>,
    client: &mut Client,
    backends: &mut Backends,
    load: Load,
    needs: Needs,
) -> Result<(), ProxyError> {
    if !backends.handle.on.planned_fresh() {
        return Err(ProxyError::DictionaryStale);
    }
    if !client
        .capabilities
        .contains(CapabilityFlags::CLIENT_LOCAL_FILES)
    {
        return Err(ProxyError::Refused(ErrorPacket::new(
            4166,
            "HY000",
            "The used command is not allowed because the MariaDB server or client has \
             disabled the local infile capability",
        )));
    }
    let fields = match load.listed {
        Some(fields) => fields,
        None => backends.table_columns(&load).await?,
    };
    let mut request = Vec::with_capacity(1 + load.file.len());
    request.push(LOCAL_INFILE_REQUEST);
    request.extend_from_slice(load.file.as_bytes());
    client.send_packet(1, &request).await?;
    let placed = read_file(shared, client, &load, fields).await?;
    if let Some(id) = placed.highest_id {
        shared
            .sequences
            .given(shared, &load.table.table, id)
            .await?;
    }
    let records: u64 = placed.spools.values().map(|s| s.lines).sum();
    let mut slots = Vec::with_capacity(placed.spools.len());
    let mut statements = Vec::with_capacity(placed.spools.len());
    for target in placed.spools.keys() {
        slots.push(backends.slot_of(target.backend)?);
        let mut sql = vec![command::QUERY];
        sql.extend_from_slice(load.statement(target).as_bytes());
        statements.push(sql);
    }
    let total = match slots.is_empty() {
        true => OkInfo::default(),
        false => {
            backends.check_writers(&slots)?;
            let parts: Vec<Part> = (statements.iter().zip(placed.spools.values()))
                .map(|(sql, lines)| Part::Load { sql, lines })
                .collect();
            backends
                .write_each(&slots, &parts, needs, false, false)
                .await?
        }
    };
    // The server counts a row written (copied) once and a row REPLACE
    // replaced once more; IGNORE and LOCAL skip duplicates.
    let (deleted, skipped) = match load.replace {
        true => (total.affected_rows.saturating_sub(records), 0),
        false => (0, records.saturating_sub(total.affected_rows)),
    };
    let mut ok = Vec::with_capacity(64);
    OkInfo {
        status: backends.status_flags(),
        last_insert_id: 0,
        ..total
    }
    .write(OK_HEADER, &mut ok);
    let info = format!(
        "Records: {records}  Deleted: {deleted}  Skipped: {skipped}  Warnings: {}",
        total.warnings
    );
    // Length-prefixed, as servers send it (and clients read it), with
    // or without session tracking.
    write_lenenc(info.len() as u64, &mut ok);
    ok.extend_from_slice(info.as_bytes());
    client.send_packet(client.reply_seq, &ok).await?;
    Ok(())
}

/// Reads the client's file to its end (the empty packet), placing its
/// lines; the first line that cannot be placed is the answer, once the
/// client has sent the rest.
async fn read_file(
    shared: &Arc<Shared>,
    client: &mut Client,
    load: &Load,
    fields: usize,
) -> Result<Placed, ProxyError> {
    let scans = &shared.scans;
    let mut budget = SpoolBudget {
        memory_left: scans.memory_bytes,
        disk_left: scans.spill_bytes,
    };
    let (disk_limit, dir) = (scans.spill_bytes, scans.spill_dir.clone());
    let wanted = load.wanted();
    let mut placed = Placed::default();
    let mut pending: Vec<u8> = Vec::new();
    let mut lines_read = 0u64;
    let mut failed: Option<ProxyError> = None;
    let refused =
        |error: PlanError| ProxyError::Unroutable(error.refusal(Some(load.table.table.clone())));
    let mut take_lines = |pending: &mut Vec<u8>, at_end: bool| -> Result<(), ProxyError> {
        let mut at = 0;
        loop {
            let rest = &pending[at..];
            if lines_read < load.ignore_lines {
                let Some(len) = load.format.skip_line(rest, at_end) else {
                    break;
                };
                lines_read += 1;
                at += len;
                continue;
            }
            let Some(line) = load.format.read_line(rest, at_end, &wanted, fields) else {
                break;
            };
            lines_read += 1;
            let place = load.place(&line, lines_read).map_err(refused)?;
            if let Some(id) = place.id {
                placed.highest_id = placed.highest_id.max(Some(id));
            }
            placed.spools.entry(place.target).or_default().push(
                &rest[..line.len],
                &mut budget,
                disk_limit,
                dir.as_deref(),
            )?;
            at += line.len;
        }
        pending.drain(..at);
        Ok(())
    };
    loop {
        let packet = client
            .read_packet()
            .await?
            .ok_or(ProxyError::Client(hscale_wire::WireError::Closed))?;
        client.reply_seq = packet.seq.wrapping_add(1);
        let end = packet.payload.is_empty();
        if failed.is_none() {
            pending.extend_from_slice(&packet.payload);
            if let Err(e) = take_lines(&mut pending, end) {
                failed = Some(e);
                pending = Vec::new();
            }
        }
        if end {
            return match failed {
                Some(e) => Err(e),
                None => Ok(placed),
            };
        }
    }
}

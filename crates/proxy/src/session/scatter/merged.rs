//! The rows of several partitions merged into one result set: each
//! partition's answer read as a source (concatenated, or in ORDER BY order,
//! with LIMIT), column definitions probed where partitions go as one UNION,
//! and the client's socket watched for a disconnect while a scan runs.

mod source;

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hscale_merge::{Budget, Encoding, MergeError, Merger, Next, Spec};
use hscale_planner::{KillScope, Merge, Refusal};
use hscale_wire::frame::write_lenenc;
use hscale_wire::packets::{write_eof, write_result_end, ErrorPacket, ERR_HEADER};
use hscale_wire::resultset::is_result_end;
use hscale_wire::{CapabilityFlags, WireError};

use super::{Generated, Part};
use crate::backend::{BackendError, Lease};
use crate::error::ProxyError;
use crate::exec::{end_completion, Command, FLUSH_AT};
use crate::session::client::Client;
use crate::session::run::federate::Sink;
use crate::session::run::kill::kill_backend_thread;
use crate::session::slots::{Needs, Previous};
use crate::session::Backends;
use crate::session::Memo;
use crate::shared::Shared;
use source::{probe_first, read_columns, start_source};

/// How long a scan runs before hscale watches its client's socket for a
/// disconnect: most scans end sooner, and the watch costs a handful of system
/// calls.
const WATCH_AFTER: Duration = Duration::from_millis(20);

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    NotSent,
    Columns,
    Rows,
    Ended,
}

impl Source {
    fn new(slot: usize) -> Source {
        Source {
            slot,
            lease: None,
            reading: Reading::NotSent,
            union: false,
            probe: None,
            probe_key: None,
            definitions: None,
        }
    }

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
/// (`Backends::must_unite`), one partition's statement.
pub(in crate::session) async fn run_merged(
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
/// there, not to the client (`run::federate`).
pub(in crate::session) async fn merge_rows(
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
    // An ordered merge reads every partition's next row: all run at once.
    let fan_out = match spec.keys.is_empty() {
        true => shared.scans.fan_out,
        false => usize::MAX,
    };
    let mut merger = merger_for(shared, spec, slots.len(), commands);
    let mut sources: Vec<Source> = slots.iter().map(|&slot| Source::new(slot)).collect();
    for (source, text) in sources.iter_mut().zip(&probes) {
        source.union = text.is_some();
    }
    // Where no backend answers with one partition's own definitions, a
    // probe of one partition's statement gives them.
    if !probes.is_empty() && probes.iter().all(Option::is_some) {
        let probe = probes.swap_remove(0);
        probe_first(shared, memo, backends, &mut sources[0], probe);
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
    let outcome = match shared.scans.timeout_ms {
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
            return stopped(shared, client, backends, &mut sources, &out, e).await;
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
    end_result(client, backends, &merger, &mut out, outcome).await
}

/// The merge of `partitions` answers to `commands`, within the scans'
/// memory and spill budget.
fn merger_for(shared: &Shared, spec: Spec, partitions: usize, commands: &[Command<'_>]) -> Merger {
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
    Merger::new(spec, partitions, shared.collations.clone(), encoding).with_budget(budget)
}

/// A merge that failed or was stopped (its timeout, its client gone): the
/// partitions' queries killed where nobody waits for them any more, their
/// connections closed; mid-result, a timeout's ERR takes the end packet's
/// place.
async fn stopped(
    shared: &Arc<Shared>,
    client: &mut Client,
    backends: &mut Backends,
    sources: &mut [Source],
    out: &Output<'_>,
    e: ProxyError,
) -> Result<(), ProxyError> {
    let timed_out = matches!(e, ProxyError::ScanTimeout { .. });
    if timed_out || matches!(e, ProxyError::Client(_)) {
        for source in sources.iter().filter(|s| s.reading != Reading::Ended) {
            if let Some(lease) = &source.lease {
                let (backend, thread) = (lease.conn.backend, lease.conn.thread_id);
                kill_backend_thread(shared, backend, thread, KillScope::Query).await;
            }
        }
    }
    // Connections in the middle of an answer (or of a packet, where the
    // timeout cut in) are closed.
    backends.drop_sources(sources);
    backends.gathered = None;
    if timed_out && out.header_sent {
        if let (Some(packet), _) = e.to_client() {
            let mut bytes = Vec::new();
            packet.write(&mut bytes);
            client.send_packet(out.seq, &bytes).await?;
        }
        return Ok(());
    }
    Err(e)
}

/// The merged result set's end: the header if no row sent it, then the end
/// packet with the partitions' warnings and status; or, mid-result, a
/// partition's ERR in its place, as when the server itself fails a
/// statement after sending rows.
async fn end_result(
    client: &mut Client,
    backends: &mut Backends,
    merger: &Merger,
    out: &mut Output<'_>,
    outcome: Result<(), Bytes>,
) -> Result<(), ProxyError> {
    match outcome {
        Ok(()) => {
            backends.send_header(client, merger, out).await?;
            let deprecate_eof = client.deprecate_eof();
            let mut end = Vec::with_capacity(16);
            write_result_end(deprecate_eof, out.status.unwrap_or(0), &mut end);
            if !deprecate_eof {
                end[1..3].copy_from_slice(&out.warnings.to_le_bytes());
            }
            client.send_packet(out.seq, &end).await?;
        }
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
pub(in crate::session) fn watch_client(
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

impl Backends {
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
}

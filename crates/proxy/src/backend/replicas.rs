//! A backend as a replica set: its configured primary and replicas, each
//! host checked every `monitor_ms` (reachable, read_only, GTID positions,
//! replication and lag), and the writer elected from what the checks saw:
//! the one reachable host whose read_only is off, as ProxySQL and MaxScale
//! find it. A failover made elsewhere (MaxScale, orchestrator, a person)
//! flips read_only, and hscale follows within one period.
//!
//! Two hosts with read_only off are a split brain: the backend has no writer
//! until one is read-only again, so that no write reaches either. Each
//! writer gets a generation; a connection opened to another generation's
//! writer is never used again (a server's SUPER accounts write through
//! read_only, so routing is what keeps the old primary unwritten).

mod change;
mod monitor;

pub use change::{switchover, Switched};
use monitor::check;
pub use monitor::{check_soon, monitor};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::{BackendConn, BackendError, Pool};

/// Generations of writers, unique in the process: a connection's says
/// which host of which election it was opened to.
static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

/// Who takes the backend's writes now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Writer {
    /// No host was checked yet.
    Unknown,
    At {
        host: usize,
        generation: u64,
    },
    /// No reachable host has read_only off.
    None,
    /// A split brain: these hosts all have read_only off.
    Several(Vec<usize>),
}

/// What the last check of one host saw.
#[derive(Debug, Clone, Default)]
pub struct Health {
    pub reachable: bool,
    pub read_only: bool,
    /// `@@gtid_binlog_pos`: the transactions this host wrote to its binary log.
    pub gtid_binlog: String,
    /// `@@gtid_slave_pos`: the transactions it applied as a replica.
    pub gtid_slave: String,
    /// SHOW SLAVE STATUS, where the host replicates.
    pub replication: Option<Replication>,
    /// Why the last check failed, or what it could not read.
    pub error: Option<String>,
    pub checked: Option<Instant>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Replication {
    /// host:port of the primary it replicates from.
    pub source: String,
    pub io_running: bool,
    pub sql_running: bool,
    /// Seconds_Behind_Master; `None` while the SQL thread does not run.
    pub lag_s: Option<u64>,
    /// Gtid_IO_Pos: the transactions it received, applied or not.
    pub received: String,
}

/// The hosts of one backend and the writer among them.
pub struct ReplicaSet {
    /// The configured primary first, then the replicas.
    pub hosts: Vec<String>,
    health: Mutex<Vec<Health>>,
    /// The generation of the writer now; 0 while there is none. What a
    /// connection's `generation` is compared with before each use.
    current: AtomicU64,
    writer: watch::Sender<Writer>,
    /// The monitor's connection to each host; held by whoever checks, so
    /// that one check runs at a time.
    monitor: tokio::sync::Mutex<Vec<Option<Box<BackendConn>>>>,
    /// A switchover runs: checks record what they see but elect no one,
    /// so that the old writer, still writable for a moment, is not taken
    /// back.
    switching: AtomicBool,
    /// Another instance's switchover holds the backend's statements until
    /// then (it lifts the hold when done; a hold outlives no switchover).
    held_until: Mutex<Option<Instant>>,
    /// Hosts a failover left behind: never the writer again, made
    /// read-only whenever seen writable, until they replicate from the
    /// writer (rejoined).
    fenced: Mutex<Vec<bool>>,
    /// Fences this instance set or lifted (host, fenced) that the
    /// dictionary does not have yet (`hscale.fenced_hosts`, where every
    /// instance, one started later too, reads them).
    fence_changes: Mutex<Vec<(usize, bool)>>,
    /// `failover = "auto"`: a writer that went away and was replaced is
    /// fenced by every instance that saw it, not only the one that
    /// promoted its successor.
    fences_lost_writer: bool,
    /// The host that was the writer last, and since when it has been
    /// unreachable (`failover = "auto"`).
    lost: Mutex<(Option<usize>, Option<Instant>)>,
}

impl ReplicaSet {
    pub fn new(hosts: Vec<String>, fences_lost_writer: bool) -> ReplicaSet {
        let count = hosts.len();
        // A lone host is the writer whatever its checks say, as a backend
        // was before replica sets: nothing could take its place.
        let first = if count == 1 {
            Writer::At {
                host: 0,
                generation: NEXT_GENERATION.fetch_add(1, Ordering::Relaxed),
            }
        } else {
            Writer::Unknown
        };
        ReplicaSet {
            current: AtomicU64::new(generation_of(&first)),
            writer: watch::Sender::new(first),
            health: Mutex::new(vec![Health::default(); count]),
            monitor: tokio::sync::Mutex::new((0..count).map(|_| None).collect()),
            switching: AtomicBool::new(false),
            held_until: Mutex::new(None),
            fenced: Mutex::new(vec![false; count]),
            fence_changes: Mutex::new(Vec::new()),
            fences_lost_writer,
            lost: Mutex::new((None, None)),
            hosts,
        }
    }

    /// The generation of the writer now; 0: none.
    pub fn generation(&self) -> u64 {
        self.current.load(Ordering::Acquire)
    }

    pub fn writer(&self) -> Writer {
        self.writer.borrow().clone()
    }

    /// What the last check of each host saw.
    pub fn health(&self) -> Vec<Health> {
        self.health
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Records what a check of every host saw and elects the writer.
    fn record(&self, seen: Vec<Health>) {
        if self.hosts.len() > 1 && !self.switching.load(Ordering::Acquire) && !self.held() {
            let previous = self.writer();
            if let Writer::At { host: writer, .. } = previous {
                self.unfence_rejoined(&seen, writer);
            }
            let fenced = self.fenced();
            let candidates: Vec<Health> = (0..seen.len())
                .map(|h| match fenced[h] {
                    true => Health::default(),
                    false => seen[h].clone(),
                })
                .collect();
            let writer = elect(&candidates, &previous);
            let mut lost = self.lost.lock().unwrap_or_else(|e| e.into_inner());
            match writer {
                Writer::At { host, .. } => {
                    if let (Some(gone), Some(_)) = *lost {
                        if gone != host && self.fences_lost_writer {
                            self.fence(gone);
                        }
                    }
                    *lost = (Some(host), None);
                }
                _ => {
                    if let (Some(last), None) = *lost {
                        if !seen[last].reachable {
                            lost.1 = Some(Instant::now());
                        }
                    }
                }
            }
            drop(lost);
            self.publish(writer);
        }
        *self.health.lock().unwrap_or_else(|e| e.into_inner()) = seen;
    }

    fn held(&self) -> bool {
        let held = self.held_until.lock().unwrap_or_else(|e| e.into_inner());
        held.is_some_and(|until| Instant::now() < until)
    }

    /// Another instance's switchover holds the backend's statements (they
    /// wait for a writer, as during this instance's own), or lifts its
    /// hold; whether that changed anything.
    pub fn hold(&self, held: bool) -> bool {
        let mut until = self.held_until.lock().unwrap_or_else(|e| e.into_inner());
        let was = until.is_some_and(|until| Instant::now() < until);
        *until = held.then(|| Instant::now() + HOLD_AT_MOST);
        drop(until);
        if held && !was {
            self.publish(Writer::None);
        }
        held != was
    }

    fn fence(&self, host: usize) {
        let mut fenced = self.fenced.lock().unwrap_or_else(|e| e.into_inner());
        if !fenced[host] {
            tracing::warn!(host = %self.hosts[host], "fenced: the writer it was went away and another host took its place");
            fenced[host] = true;
            self.fence_changed(host, true);
        }
    }

    fn fence_changed(&self, host: usize, fenced: bool) {
        self.fence_changes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((host, fenced));
    }

    /// The fences set (true) or lifted since the last call, by address.
    pub fn take_fence_changes(&self) -> Vec<(String, bool)> {
        let changes =
            std::mem::take(&mut *self.fence_changes.lock().unwrap_or_else(|e| e.into_inner()));
        changes
            .into_iter()
            .map(|(host, fenced)| (self.hosts[host].clone(), fenced))
            .collect()
    }

    /// Changes `take_fence_changes` gave that did not reach the dictionary:
    /// given again next time.
    pub fn fence_changes_back(&self, changes: Vec<(String, bool)>) {
        let mut pending = self.fence_changes.lock().unwrap_or_else(|e| e.into_inner());
        let again = changes.into_iter().filter_map(|(address, fenced)| {
            Some((self.hosts.iter().position(|h| *h == address)?, fenced))
        });
        let later = std::mem::take(&mut *pending);
        pending.extend(again);
        pending.extend(later);
    }

    /// Hosts the dictionary says an instance fenced: fenced here too. A
    /// fence is lifted only where a host is seen rejoined, which every
    /// instance sees for itself.
    pub fn fenced_elsewhere(&self, addresses: &[String]) {
        let mut fenced = self.fenced.lock().unwrap_or_else(|e| e.into_inner());
        for (host, address) in self.hosts.iter().enumerate() {
            if addresses.contains(address) && !fenced[host] {
                tracing::warn!(host = %address, "fenced, as the dictionary says");
                fenced[host] = true;
            }
        }
    }

    /// A fenced host seen read-only and replicating from the writer, both
    /// threads running, was rejoined (by hand: it had to apply what the
    /// writer has, so it holds nothing the others lack): it counts again.
    fn unfence_rejoined(&self, seen: &[Health], writer: usize) {
        let mut fenced = self.fenced.lock().unwrap_or_else(|e| e.into_inner());
        for host in 0..fenced.len() {
            let rejoined = seen[host].reachable
                && seen[host].read_only
                && seen[host].replication.as_ref().is_some_and(|r| {
                    r.io_running && r.sql_running && r.source == self.hosts[writer]
                });
            if fenced[host] && rejoined {
                tracing::warn!(host = %self.hosts[host], "rejoined: a replica of the writer again");
                fenced[host] = false;
                self.fence_changed(host, false);
            }
        }
    }

    fn fenced(&self) -> Vec<bool> {
        self.fenced
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The last writer, if it has been unreachable at least `after`.
    fn lost_for(&self, after: Duration) -> Option<usize> {
        let lost = self.lost.lock().unwrap_or_else(|e| e.into_inner());
        match *lost {
            (Some(host), Some(since)) if since.elapsed() >= after => Some(host),
            _ => None,
        }
    }

    fn publish(&self, next: Writer) {
        let previous = self.writer();
        if next != previous {
            tracing::warn!(hosts = ?self.hosts, "backend writer: {previous:?} -> {next:?}");
            self.current.store(generation_of(&next), Ordering::Release);
            self.writer.send_replace(next);
        }
    }
}

/// One host as SHOW_BACKENDS, /status and /metrics show it.
pub struct HostView {
    pub backend: u32,
    pub address: String,
    pub role: &'static str,
    pub health: Health,
}

impl ReplicaSet {
    /// Each host with its role: `writer`; `replica` (read-only and
    /// replicating); `read-only` (not replicating); `split brain` (one of
    /// several writable hosts); `down`; `unchecked` before its first check.
    pub fn view(&self, backend: u32) -> Vec<HostView> {
        let writer = self.writer();
        let health = self.health();
        let fenced = self.fenced();
        (0..self.hosts.len())
            .map(|host| {
                let seen = &health[host];
                let role = match &writer {
                    Writer::At { host: w, .. } if *w == host => "writer",
                    Writer::Several(hosts) if hosts.contains(&host) => "split brain",
                    _ if fenced[host] => "fenced",
                    _ if seen.checked.is_none() => "unchecked",
                    _ if !seen.reachable => "down",
                    _ if seen.replication.is_some() => "replica",
                    _ => "read-only",
                };
                HostView {
                    backend,
                    address: self.hosts[host].clone(),
                    role,
                    health: seen.clone(),
                }
            })
            .collect()
    }
}

fn generation_of(writer: &Writer) -> u64 {
    match writer {
        Writer::At { generation, .. } => *generation,
        _ => 0,
    }
}

/// The writer `seen` shows: the one reachable host with read_only off, in
/// the previous writer's generation if it is the same host.
pub fn elect(seen: &[Health], previous: &Writer) -> Writer {
    let writable: Vec<usize> = (0..seen.len())
        .filter(|&h| seen[h].reachable && !seen[h].read_only)
        .collect();
    match writable[..] {
        [] => Writer::None,
        [host] => match previous {
            Writer::At {
                host: was,
                generation,
            } if *was == host => previous.clone(),
            _ => Writer::At {
                host,
                generation: NEXT_GENERATION.fetch_add(1, Ordering::Relaxed),
            },
        },
        _ => Writer::Several(writable),
    }
}

impl Pool {
    /// Waits until the writer of `generation` is no longer the writer, at
    /// most `wait`.
    pub(super) async fn replaced(
        &self,
        generation: u64,
        wait: Duration,
    ) -> Result<(), BackendError> {
        let mut changes = self.replicas.writer.subscribe();
        let started = Instant::now();
        let gone = changes.wait_for(|writer| generation_of(writer) != generation);
        let replaced = tokio::time::timeout(wait, gone).await.is_ok();
        match replaced {
            true => Ok(()),
            false => Err(BackendError::NoWriter {
                backend: self.config.id,
                waited_ms: started.elapsed().as_millis() as u64,
            }),
        }
    }

    /// The writer's host and generation; waits up to the backend's
    /// `failover_wait_ms` while it has none (a failover, the host back),
    /// and checks the hosts first if no one did yet.
    pub(super) async fn writer_host(&self) -> Result<(usize, u64), BackendError> {
        let set = &self.replicas;
        if set.writer() == Writer::Unknown {
            // Boxed: a rare path, kept out of every connection's future.
            Box::pin(check(self)).await;
        }
        let wait = Duration::from_millis(self.config.failover_wait_ms);
        let started = Instant::now();
        let mut changes = set.writer.subscribe();
        loop {
            match &*changes.borrow_and_update() {
                Writer::At { host, generation } => return Ok((*host, *generation)),
                Writer::Several(hosts) => {
                    return Err(BackendError::SplitBrain {
                        backend: self.config.id,
                        hosts: hosts.iter().map(|&h| set.hosts[h].clone()).collect(),
                    })
                }
                Writer::None | Writer::Unknown => {}
            }
            let left = wait.saturating_sub(started.elapsed());
            if tokio::time::timeout(left, changes.changed()).await.is_err() {
                return Err(BackendError::NoWriter {
                    backend: self.config.id,
                    waited_ms: started.elapsed().as_millis() as u64,
                });
            }
        }
    }
}

impl Pool {
    /// The pool of the replica `conn` was opened to, if it was opened for a
    /// read on a replica.
    pub fn reader_of(&self, conn: &BackendConn) -> Option<&Arc<Pool>> {
        self.readers.iter().find(|reader| reader.is_current(conn))
    }

    /// A replica to read from: replicating, its lag known and within
    /// `max_lag`, the least busy first; with whether the monitor saw it
    /// apply `wanted` (a GTID position) already.
    pub fn reader(&self, max_lag: Duration, wanted: Option<&str>) -> Option<(&Arc<Pool>, bool)> {
        if self.readers.is_empty() {
            return None;
        }
        let writer = match self.replicas.writer() {
            Writer::At { host, .. } => Some(host),
            _ => None,
        };
        let health = self.replicas.health();
        let hosts = self.readers.len();
        let first = self.next_reader.fetch_add(1, Ordering::Relaxed);
        (0..hosts)
            .map(|i| (first + i) % hosts)
            .filter(|&host| Some(host) != writer)
            .filter(|&host| {
                let seen = &health[host];
                let Some(replication) = &seen.replication else {
                    return false;
                };
                seen.reachable
                    && seen.read_only
                    && replication.io_running
                    && replication.sql_running
                    && replication
                        .lag_s
                        .is_some_and(|lag| Duration::from_secs(lag) <= max_lag)
            })
            .map(|host| {
                let applied = wanted.is_none_or(|w| gtid_covers(&health[host].gtid_slave, w));
                (host, applied)
            })
            .min_by_key(|&(host, applied)| (!applied, self.readers[host].open_connections()))
            .map(|(host, applied)| (&self.readers[host], applied))
    }
}

/// Whether the GTID position `have` includes every transaction of
/// `wanted`: per replication domain, a sequence number at least as high.
/// Positions are `domain-server-sequence`, comma separated.
pub fn gtid_covers(have: &str, wanted: &str) -> bool {
    let parse = |position: &str| -> Vec<(u32, u64)> {
        position
            .split(',')
            .filter_map(|gtid| {
                let mut parts = gtid.trim().split('-');
                let domain = parts.next()?.parse().ok()?;
                let _server = parts.next()?;
                let sequence = parts.next()?.parse().ok()?;
                Some((domain, sequence))
            })
            .collect()
    };
    let have = parse(have);
    parse(wanted)
        .into_iter()
        .all(|(domain, sequence)| have.iter().any(|&(d, s)| d == domain && s >= sequence))
}

/// The longest another instance's switchover holds this one's statements
/// (its own checks allow 10 s to catch up): past it, the switchover's
/// instance is taken for dead and the hosts are checked again.
const HOLD_AT_MOST: Duration = Duration::from_secs(30);

/// The reachable replica whose received position covers the most others'
/// (with semi-synchronous replication, every acknowledged commit is in one
/// replica's relay log at least).
pub fn most_advanced(health: &[Health], lost: usize) -> Option<usize> {
    let replicas: Vec<(usize, &str)> = (0..health.len())
        .filter(|&h| h != lost && health[h].reachable)
        .filter_map(|h| Some((h, health[h].replication.as_ref()?.received.as_str())))
        .collect();
    replicas
        .iter()
        .max_by_key(|(_, received)| {
            replicas
                .iter()
                .filter(|(_, other)| gtid_covers(received, other))
                .count()
        })
        .map(|&(h, _)| h)
}

#[cfg(test)]
mod tests;

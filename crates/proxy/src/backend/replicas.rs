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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hscale_wire::resultset::TextValue;
use tokio::sync::watch;

use super::{BackendConn, BackendError, ConnKey, Pool};

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

/// How long a switchover waits for the new writer to apply the old one's
/// last transaction before it gives up and leaves the old one the writer.
const CATCH_UP_S: u64 = 10;

/// The longest another instance's switchover holds this one's statements
/// (its own checks allow 10 s to catch up): past it, the switchover's
/// instance is taken for dead and the hosts are checked again.
const HOLD_AT_MOST: Duration = Duration::from_secs(30);

/// How long a switchover waits for the statements in flight on the old
/// writer before it makes it read-only.
const IN_FLIGHT_WAIT: Duration = Duration::from_millis(500);

/// What a switchover did: the old and new writer, and how long statements
/// that needed the writer waited.
pub struct Switched {
    pub from: String,
    pub to: String,
    pub pause: Duration,
}

/// HSCALE SWITCHOVER: `to`, a replica in step, becomes the writer, with no
/// acknowledged write lost. Statements that need the writer wait from the
/// start (new ones for a writer, those in flight finish first: setting
/// read_only waits for them); the old writer is made read-only, `to`
/// applies everything it wrote, is made writable, and the other hosts,
/// the old writer too, replicate from it.
/// `in_flight`: whether a statement of this instance may still be on its
/// way to the old writer on a connection taken before the pause began.
pub async fn switchover(
    pool: &Arc<Pool>,
    to: &str,
    in_flight: impl Fn() -> bool,
) -> Result<Switched, String> {
    let set = &pool.replicas;
    let Some(target) = set.hosts.iter().position(|h| h == to) else {
        return Err(format!(
            "{to} is not a host of backend {} ({})",
            pool.config.id,
            set.hosts.join(", ")
        ));
    };
    let Writer::At { host: from, .. } = set.writer() else {
        return Err(format!(
            "backend {} has no writer to switch from",
            pool.config.id
        ));
    };
    if from == target {
        return Err(format!(
            "{to} is the writer of backend {} already",
            pool.config.id
        ));
    }
    let replica = set.health()[target].replication.clone().unwrap_or_default();
    if !(replica.io_running && replica.sql_running) {
        return Err(format!(
            "{to} does not replicate (IO and SQL threads): it cannot take over"
        ));
    }
    let Some((host, port)) = to.rsplit_once(':') else {
        return Err(format!("{to} is not host:port: replicas cannot reach it"));
    };
    let started = Instant::now();
    set.switching.store(true, Ordering::Release);
    set.publish(Writer::None);
    // Such a statement would meet read_only and fail; one that takes longer
    // than this ends as its transaction's must once the writer changed.
    let quiet = Instant::now() + IN_FLIGHT_WAIT;
    while in_flight() && Instant::now() < quiet {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let result = hand_over(pool, from, target, (host, port)).await;
    if let Err(e) = &result {
        tracing::warn!(backend = pool.config.id, "switchover to {to} failed: {e}");
    }
    set.switching.store(false, Ordering::Release);
    check(pool).await;
    result.map(|()| Switched {
        from: set.hosts[from].clone(),
        to: to.to_string(),
        pause: started.elapsed(),
    })
}

/// Runs one of hscale's own statements; what failed, with the statement.
async fn run(conn: &mut BackendConn, sql: &str) -> Result<super::Rows, String> {
    match conn.query(sql).await {
        Ok(Ok(rows)) => Ok(rows),
        Ok(Err(e)) => Err(format!("{sql}: {}", e.message)),
        Err(e) => Err(format!("{sql}: {e}")),
    }
}

/// The first value of an answer, as text.
fn first_value(rows: &super::Rows) -> Option<String> {
    let value = rows.first()?.first()?.as_ref()?;
    Some(String::from_utf8_lossy(value).into_owned())
}

async fn hand_over(
    pool: &Arc<Pool>,
    from: usize,
    target: usize,
    address: (&str, &str),
) -> Result<(), String> {
    let mut old = open(pool, from).await?;
    // Waits for the statements and commits in flight there, not longer.
    run(&mut old, "SET SESSION lock_wait_timeout = 5").await?;
    run(&mut old, "SET GLOBAL read_only = 1").await?;
    let position =
        first_value(&run(&mut old, "SELECT @@global.gtid_binlog_pos").await?).unwrap_or_default();
    if let Err(e) = promote(pool, target, &position).await {
        run(&mut old, "SET GLOBAL read_only = 0").await?;
        return Err(format!("{e}; the writer stays"));
    }
    follow(pool, target, address, &[]).await?;
    acknowledged_soon(pool, target).await;
    Ok(())
}

/// How long a new writer that commits semi-synchronously is given to see
/// a replica that acknowledges its commits.
const ACKNOWLEDGER_WAIT: Duration = Duration::from_millis(1000);

/// Returns once `target` has a replica that acknowledges its commits, if
/// it commits semi-synchronously (at most `ACKNOWLEDGER_WAIT`): a replica
/// pointed at it registers a moment after its START SLAVE, and a commit
/// made before then waits `rpl_semi_sync_master_timeout` for an
/// acknowledgement no one sends (2 s and more; 10 s by default).
async fn acknowledged_soon(pool: &Pool, target: usize) {
    let Ok(mut conn) = open(pool, target).await else {
        return;
    };
    let ask = "SELECT @@global.rpl_semi_sync_master_enabled, (SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'RPL_SEMI_SYNC_MASTER_CLIENTS')";
    let deadline = Instant::now() + ACKNOWLEDGER_WAIT;
    while Instant::now() < deadline {
        let Ok(rows) = run(&mut conn, ask).await else {
            return;
        };
        let value = |column: usize| {
            let value = rows.first()?.get(column)?.as_ref()?;
            Some(String::from_utf8_lossy(value).into_owned())
        };
        let semi_sync = value(0).as_deref() == Some("1");
        let clients: u64 = value(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        if !semi_sync || clients > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn open(pool: &Pool, host: usize) -> Result<Box<BackendConn>, String> {
    pool.open_own_to(host, ConnKey::service())
        .await
        .map_err(|e| e.to_string())
}

/// `target` applies everything up to `position`, stops replicating and
/// takes writes.
async fn promote(pool: &Pool, target: usize, position: &str) -> Result<(), String> {
    let mut new = open(pool, target).await?;
    let wait = format!("SELECT MASTER_GTID_WAIT('{position}', {CATCH_UP_S})");
    if first_value(&run(&mut new, &wait).await?).as_deref() != Some("0") {
        return Err(format!(
            "{} did not apply {position} within {CATCH_UP_S} s",
            pool.replicas.hosts[target]
        ));
    }
    for sql in ["STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL read_only = 0"] {
        run(&mut new, sql).await?;
    }
    Ok(())
}

/// Every host but `target` and `skip` replicates from `target`, all at
/// once; one that is down now follows once a tool or a person points it
/// there. Answers once one of them follows: the new writer's
/// semi-synchronous commits need one replica to acknowledge them, and a
/// replica's STOP SLAVE can take seconds (a semi-synchronous replica of a
/// former writer, 2 s on MariaDB 10.11), which writes need not wait for.
async fn follow(
    pool: &Arc<Pool>,
    target: usize,
    (host, port): (&str, &str),
    skip: &[usize],
) -> Result<(), String> {
    let config = &pool.config;
    let user = config.replication_user.as_deref().unwrap_or(&config.user);
    let password = config
        .replication_password
        .as_deref()
        .unwrap_or(&config.password);
    let change = format!(
        "CHANGE MASTER TO MASTER_HOST = '{}', MASTER_PORT = {}, MASTER_USER = '{}', MASTER_PASSWORD = '{}', MASTER_USE_GTID = slave_pos",
        host.replace('\'', "''"),
        port.parse::<u16>().map_err(|_| format!("'{port}' is not a port"))?,
        user.replace('\'', "''"),
        password.replace('\'', "''"),
    );
    let others = (0..pool.replicas.hosts.len()).filter(|h| *h != target && !skip.contains(h));
    let (done, mut followed) = tokio::sync::mpsc::unbounded_channel();
    for other in others {
        let (pool, change, done) = (pool.clone(), change.clone(), done.clone());
        // Spawned, not only awaited: none is left stopped half-way.
        tokio::spawn(async move {
            let _ = done.send(point_at(&pool, other, &change).await);
        });
    }
    drop(done);
    while let Some(pointed) = followed.recv().await {
        if pointed {
            break;
        }
    }
    Ok(())
}

/// `host` replicates as `change` says; whether it does.
async fn point_at(pool: &Pool, host: usize, change: &str) -> bool {
    let Ok(mut conn) = open(pool, host).await else {
        return false;
    };
    for sql in ["STOP SLAVE", change, "START SLAVE"] {
        if let Err(e) = run(&mut conn, sql).await {
            let address = &pool.replicas.hosts[host];
            tracing::warn!(backend = pool.config.id, host = %address, "pointing at the new writer: {e}");
            return false;
        }
    }
    true
}

/// Checks the backend's hosts every `period`, as long as the process serves.
/// With `failover = "auto"`, fails over once the writer has been gone for
/// `failover_after_ms`; `main` holds the lock that elects the instance that
/// does.
pub async fn monitor(pool: Arc<Pool>, period: Duration, main: Arc<Pool>) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        check(&pool).await;
        if pool.config.failover == crate::config::Failover::Auto {
            fence(&pool).await;
            let after = Duration::from_millis(pool.config.failover_after_ms);
            if let Some(lost) = pool.replicas.lost_for(after) {
                if let Err(e) = fail_over(&pool, lost, &main).await {
                    tracing::warn!(backend = pool.config.id, "failover: {e}");
                }
            }
        }
    }
}

/// A fenced host seen writable is made read-only: it came back after a
/// failover took its place.
async fn fence(pool: &Pool) {
    let (fenced, health) = (pool.replicas.fenced(), pool.replicas.health());
    for host in
        (0..fenced.len()).filter(|&h| fenced[h] && health[h].reachable && !health[h].read_only)
    {
        if let Ok(mut conn) = open(pool, host).await {
            let _ = run(&mut conn, "SET GLOBAL read_only = 1").await;
            tracing::warn!(backend = pool.config.id, host = %pool.replicas.hosts[host], "a fenced host came back writable: made read-only");
        }
    }
}

/// Promotes the replica that received most of the lost writer's
/// transactions, once it applied them, and points the others at it; the
/// lost writer is fenced. One instance does it: the one that holds the
/// backend's failover lock (`elected`).
async fn fail_over(pool: &Arc<Pool>, lost: usize, main: &Arc<Pool>) -> Result<(), String> {
    let Some(_lock) = elected(pool, lost, main).await? else {
        return Ok(());
    };
    // Another instance may have done it meanwhile.
    check(pool).await;
    if pool.replicas.lost_for(Duration::ZERO) != Some(lost) {
        return Ok(());
    }
    let health = pool.replicas.health();
    let Some(target) = most_advanced(&health, lost) else {
        return Err("no replica to promote (none reachable and replicating)".into());
    };
    let to = pool.replicas.hosts[target].clone();
    let Some((host, port)) = to.rsplit_once(':') else {
        return Err(format!("{to} is not host:port: replicas cannot reach it"));
    };
    tracing::warn!(backend = pool.config.id, from = %pool.replicas.hosts[lost], to = %to, "failover: promoting");
    let received = health[target]
        .replication
        .as_ref()
        .map(|r| r.received.clone())
        .unwrap_or_default();
    pool.replicas.fence(lost);
    promote(pool, target, &received).await?;
    follow(pool, target, (host, port), &[lost]).await?;
    acknowledged_soon(pool, target).await;
    check(pool).await;
    Ok(())
}

/// Whether this instance takes the backend's failover lock
/// (`GET_LOCK('hscale_failover_<id>')`): on the main backend, where every
/// instance meets; for the main backend itself, whose writer is the one
/// lost, on a majority of its other hosts, so that two instances never
/// both hold it. The lock lives as long as the connections returned.
async fn elected(
    pool: &Arc<Pool>,
    lost: usize,
    main: &Arc<Pool>,
) -> Result<Option<Vec<Box<BackendConn>>>, String> {
    let take = format!("SELECT GET_LOCK('hscale_failover_{}', 0)", pool.config.id);
    if !Arc::ptr_eq(pool, main) {
        let mut lock = main
            .open_own(ConnKey::service())
            .await
            .map_err(|e| e.to_string())?;
        let taken = first_value(&run(&mut lock, &take).await?).as_deref() == Some("1");
        return Ok(taken.then(|| vec![lock]));
    }
    let others: Vec<usize> = (0..pool.replicas.hosts.len())
        .filter(|&h| h != lost)
        .collect();
    let mut held = Vec::new();
    for &host in &others {
        let Ok(mut conn) = open(pool, host).await else {
            continue;
        };
        if let Ok(rows) = run(&mut conn, &take).await {
            if first_value(&rows).as_deref() == Some("1") {
                held.push(conn);
            }
        }
    }
    Ok((held.len() * 2 > others.len()).then_some(held))
}

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

/// Checks the hosts now, in the background: after another instance's
/// switchover lifted its hold, the new writer is found at once rather
/// than at the next period.
pub fn check_soon(pool: &Arc<Pool>) {
    let pool = pool.clone();
    tokio::spawn(async move { check(&pool).await });
}

/// Checks every host at once, then elects the writer.
async fn check(pool: &Pool) {
    let set = &pool.replicas;
    let mut connections = set.monitor.lock().await;
    // A check that waits longer than a period on one host would hold up the
    // others' next one: a host that slow counts as unreachable.
    let limit = pool.connect_timeout;
    let checks = connections
        .iter_mut()
        .enumerate()
        .map(|(host, conn)| async move {
            match tokio::time::timeout(limit, check_host(pool, host, conn)).await {
                Ok(Ok(health)) => health,
                Ok(Err(e)) => {
                    *conn = None;
                    unreachable(e.to_string())
                }
                Err(_) => {
                    *conn = None;
                    unreachable(format!("no answer within {} ms", limit.as_millis()))
                }
            }
        });
    let seen = crate::exec::all_at_once(checks).await;
    set.record(seen);
}

fn unreachable(error: String) -> Health {
    Health {
        error: Some(error),
        checked: Some(Instant::now()),
        ..Health::default()
    }
}

async fn check_host(
    pool: &Pool,
    host: usize,
    conn: &mut Option<Box<BackendConn>>,
) -> Result<Health, BackendError> {
    if conn.is_none() {
        *conn = Some(pool.connect_monitor(host, ConnKey::service()).await?);
    }
    let conn = conn.as_mut().expect("connected above");
    let refused = |e: hscale_wire::packets::ErrorPacket| e.message;
    let (_, rows) = conn
        .query_named("SELECT @@global.read_only, @@global.gtid_binlog_pos, @@global.gtid_slave_pos")
        .await?
        .map_err(|e| BackendError::Refused {
            backend: pool.config.id,
            message: refused(e),
        })?;
    let row = rows.first().map(Vec::as_slice).unwrap_or_default();
    let text = |i: usize| {
        row.get(i)
            .cloned()
            .flatten()
            .map(|v| String::from_utf8_lossy(&v).into_owned())
            .unwrap_or_default()
    };
    let mut health = Health {
        reachable: true,
        read_only: text(0) != "0",
        gtid_binlog: text(1),
        gtid_slave: text(2),
        checked: Some(Instant::now()),
        ..Health::default()
    };
    match conn.query_named("SHOW SLAVE STATUS").await? {
        Ok((names, rows)) => {
            health.replication = rows.first().map(|row| replication(&names, row));
        }
        // Without SLAVE MONITOR (REPLICATION CLIENT) hscale sees no lag.
        Err(e) => health.error = Some(refused(e)),
    }
    Ok(health)
}

/// SHOW SLAVE STATUS's row, read by column name.
fn replication(names: &[String], row: &[TextValue]) -> Replication {
    let value = |name: &str| {
        names
            .iter()
            .position(|n| n == name)
            .and_then(|i| row.get(i).cloned().flatten())
            .map(|v| String::from_utf8_lossy(&v).into_owned())
    };
    Replication {
        source: format!(
            "{}:{}",
            value("Master_Host").unwrap_or_default(),
            value("Master_Port").unwrap_or_default()
        ),
        io_running: value("Slave_IO_Running").as_deref() == Some("Yes"),
        sql_running: value("Slave_SQL_Running").as_deref() == Some("Yes"),
        lag_s: value("Seconds_Behind_Master").and_then(|s| s.parse().ok()),
        received: value("Gtid_IO_Pos").unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(reachable: bool, read_only: bool) -> Health {
        Health {
            reachable,
            read_only,
            checked: Some(Instant::now()),
            ..Health::default()
        }
    }

    #[test]
    fn the_writer_is_the_one_reachable_host_with_read_only_off() {
        let seen = [host(true, true), host(true, false), host(true, true)];
        let Writer::At {
            host: writer,
            generation,
        } = elect(&seen, &Writer::Unknown)
        else {
            panic!("no writer elected");
        };
        assert_eq!(writer, 1);
        let before = Writer::At {
            host: writer,
            generation,
        };
        let again = elect(&seen, &before);
        assert_eq!(again, before, "same host, same generation");
        let flipped = [host(true, false), host(true, true), host(true, true)];
        let Writer::At {
            host: new,
            generation: newer,
        } = elect(&flipped, &again)
        else {
            panic!("no writer after the flip");
        };
        assert_eq!(new, 0);
        assert_ne!(
            newer, generation,
            "another host: connections to the old one are done"
        );
    }

    #[test]
    fn two_writable_hosts_are_no_writer_and_unreachable_ones_do_not_count() {
        let split = [host(true, false), host(true, false), host(true, true)];
        assert_eq!(elect(&split, &Writer::Unknown), Writer::Several(vec![0, 1]));
        let gone = [host(false, false), host(true, true)];
        assert_eq!(elect(&gone, &Writer::Unknown), Writer::None);
        let read_only = [host(true, true), host(true, true)];
        assert_eq!(elect(&read_only, &Writer::Unknown), Writer::None);
    }

    #[test]
    fn a_position_covers_another_domain_by_domain() {
        assert!(gtid_covers("0-1-100", "0-1-100"));
        assert!(
            gtid_covers("0-2-101", "0-1-100"),
            "a later server id counts too"
        );
        assert!(!gtid_covers("0-1-99", "0-1-100"));
        assert!(gtid_covers("0-1-5,1-3-7", "1-3-7"));
        assert!(
            !gtid_covers("0-1-5", "0-1-5,1-3-7"),
            "a domain it never saw"
        );
        assert!(gtid_covers("", ""), "nothing written, nothing to wait for");
        assert!(gtid_covers("0-1-5", ""));
    }

    #[test]
    fn the_replica_that_received_most_is_promoted_and_never_the_lost_writer() {
        let replica = |received: &str| Health {
            reachable: true,
            read_only: true,
            replication: Some(Replication {
                received: received.into(),
                ..Replication::default()
            }),
            ..Health::default()
        };
        let lost = Health::default();
        let seen = [lost.clone(), replica("0-1-41"), replica("0-1-42")];
        assert_eq!(most_advanced(&seen, 0), Some(2));
        let mut behind_and_down = replica("0-1-43");
        behind_and_down.reachable = false;
        let seen = [lost.clone(), replica("0-1-41"), behind_and_down];
        assert_eq!(most_advanced(&seen, 0), Some(1));
        assert_eq!(most_advanced(&[replica("0-1-50"), lost], 0), None);
    }

    #[test]
    fn a_writer_that_went_and_was_replaced_stays_fenced_until_it_replicates_from_the_new_one() {
        let set = ReplicaSet::new(vec!["a:1".into(), "b:1".into()], true);
        let at = |set: &ReplicaSet| match set.writer() {
            Writer::At { host, .. } => Some(host),
            _ => None,
        };
        set.record(vec![host(true, false), host(true, true)]);
        assert_eq!(at(&set), Some(0));
        set.record(vec![host(false, false), host(true, true)]);
        assert_eq!(set.writer(), Writer::None);
        // Another instance promoted b.
        set.record(vec![host(false, false), host(true, false)]);
        assert_eq!(at(&set), Some(1));
        // a restarts writable: not a split brain, not the writer.
        set.record(vec![host(true, false), host(true, false)]);
        assert_eq!(at(&set), Some(1));
        assert_eq!(set.view(2)[0].role, "fenced");
        // For the dictionary, once.
        assert_eq!(set.take_fence_changes(), [("a:1".to_string(), true)]);
        assert_eq!(set.take_fence_changes(), []);
        let replicating_from = |source: &str, sql_running: bool| Health {
            replication: Some(Replication {
                source: source.into(),
                io_running: true,
                sql_running,
                ..Replication::default()
            }),
            ..host(true, true)
        };
        for not_rejoined in [
            replicating_from("c:1", true),
            replicating_from("b:1", false),
        ] {
            set.record(vec![not_rejoined, host(true, false)]);
            assert_eq!(set.view(2)[0].role, "fenced");
        }
        set.record(vec![replicating_from("b:1", true), host(true, false)]);
        assert_eq!(set.view(2)[0].role, "replica");
        assert_eq!(at(&set), Some(1));
        assert_eq!(set.take_fence_changes(), [("a:1".to_string(), false)]);

        // An instance that did not see the failover reads the fence.
        let later = ReplicaSet::new(vec!["a:1".into(), "b:1".into()], true);
        later.fenced_elsewhere(&["a:1".to_string()]);
        later.record(vec![host(true, false), host(true, false)]);
        assert_eq!(at(&later), Some(1));
        assert_eq!(later.take_fence_changes(), []);

        // Without automatic failover, hscale only follows: the old writer
        // back writable is a split brain.
        let external = ReplicaSet::new(vec!["a:1".into(), "b:1".into()], false);
        external.record(vec![host(true, false), host(true, true)]);
        external.record(vec![host(false, false), host(true, true)]);
        external.record(vec![host(false, false), host(true, false)]);
        external.record(vec![host(true, false), host(true, false)]);
        assert_eq!(external.writer(), Writer::Several(vec![0, 1]));
    }

    #[test]
    fn a_lone_host_is_the_writer_before_any_check() {
        let set = ReplicaSet::new(vec!["127.0.0.1:3306".into()], false);
        assert!(matches!(set.writer(), Writer::At { host: 0, .. }));
        assert_ne!(set.generation(), 0);
        let pair = ReplicaSet::new(vec!["a:1".into(), "b:1".into()], false);
        assert_eq!(pair.writer(), Writer::Unknown);
        assert_eq!(pair.generation(), 0);
    }
}

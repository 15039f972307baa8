//! A bounded pool of connections to one backend. Idle connections wait in a
//! list per `ConnKey` and per core, oldest first; a session looks its key's
//! lists up once and then takes and returns connections under its core's
//! list's lock alone, which no other core takes but to borrow.
//!
//! Per core: a connection is registered with the reactor of one worker
//! (`cores`), and it goes back to that worker's list, so its readiness
//! wakes the thread that polls its session. A worker whose list is empty
//! takes another worker's idle connection and moves it over (registered
//! with its own reactor, then idle in its own list), else opens one while
//! the backend's `max_connections` allows, else waits with every other
//! worker's sessions for the next one returned (the first waiting is served
//! first): no client starves because its worker's list is empty, and a
//! backend holds about as many connections as statements run at once, not
//! workers times clients (clients move between workers).
//!
//! A session takes back the connection it returned last, if no one used it
//! since, else the oldest. Its own keeps a client on one connection, as it
//! would be without hscale: the socket buffers, MariaDB's thread for it and
//! hscale's state of it are warm in the CPUs' caches, the session's settings
//! are already applied, and ROW_COUNT() or FOUND_ROWS() find the connection
//! that ran the previous statement. Taken in turn instead, every connection
//! a burst of clients left idle is cold when a lone client's statement meets
//! it (docs/benchmarks.md: a third more CPU per point select in hscale and a
//! quarter more in MariaDB). The oldest otherwise, and the oldest evicted for
//! another key: those returned lately are left to the sessions that returned
//! them.

mod open;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, Semaphore};

use super::accounts::Accounts;
use super::replicas::ReplicaSet;
use super::{BackendConn, BackendError, ConnKey, ConnMark};
use crate::config::BackendConfig;
use crate::tls::ToBackend;

/// At most this many connections of hscale's own per backend: the
/// dictionary's refresh and sweep, admin commands', sequences', two-phase
/// commit recovery's, and those of the moves working at once
/// (`online::running::AT_ONCE`, each up to eight on its source: the job, the
/// snapshot reads, a part's writes, the binlog dump, a split's rest, the
/// fence, a dictionary reload and a count).
const OWN_CONNECTIONS: usize = 32;

/// A connection idle longer than this has its socket read before use; a
/// shorter idle one is trusted to the reactor's word (`BackendStream::is_stale`).
const STALE_CHECK_AFTER: Duration = Duration::from_millis(250);

/// How far back from the most recently returned connection a session looks
/// for its own: the look stays short under the lock however large the pool.
const OWN_LOOKUP_DEPTH: usize = 64;

/// The idle connections of one key, a list per core.
#[derive(Clone)]
pub struct Bucket {
    pub key: ConnKey,
    idle: Arc<[IdleList]>,
}

impl Bucket {
    /// The list of `core`; the last list is the threads' that are no worker
    /// (the dictionary's loops, two-phase commit recovery).
    fn list(&self, core: usize) -> usize {
        core.min(self.idle.len() - 1)
    }

    /// The calling worker's list.
    fn here(&self) -> &IdleList {
        &self.idle[self.list(crate::cores::current())]
    }

    /// The list of the worker whose reactor `conn` is registered with.
    fn home(&self, conn: &BackendConn) -> &IdleList {
        &self.idle[self.list(conn.core)]
    }

    /// The other lists, the next worker's first.
    fn others(&self) -> impl Iterator<Item = &IdleList> {
        let lists = self.idle.len();
        let here = self.list(crate::cores::current());
        (1..lists).map(move |i| &self.idle[(here + i) % lists])
    }
}

/// Idle connections, the oldest first, each with its mark as it was returned
/// (no command runs on an idle connection), so that a look for one reads
/// the marks side by side and not each connection. The lock is held for a
/// push or a take: shorter than any wait a lock-free queue's contention would
/// save. One per core, each on cache lines of its own.
#[derive(Default)]
#[repr(align(128))]
struct IdleList(Mutex<Idle>);

#[derive(Default)]
struct Idle {
    connections: VecDeque<(ConnMark, Box<BackendConn>)>,
    /// Times the lock was taken (`Pool::lock_acquisitions`), counted under it.
    locked: u64,
}

impl IdleList {
    fn lock(&self) -> std::sync::MutexGuard<'_, Idle> {
        // A push or a take cannot leave the list half changed.
        let mut idle = self.0.lock().unwrap_or_else(|e| e.into_inner());
        idle.locked += 1;
        idle
    }

    fn push(&self, conn: Box<BackendConn>) {
        self.lock().connections.push_back((conn.mark(), conn));
    }

    /// The connection `own` names if it is among the most recently returned,
    /// else the oldest.
    fn take(&self, own: Option<ConnMark>) -> Option<Box<BackendConn>> {
        let idle = &mut self.lock().connections;
        let at = own.and_then(|own| {
            let mut newest = idle.iter().rev().take(OWN_LOOKUP_DEPTH);
            newest
                .position(|(mark, _)| *mark == own)
                .map(|back| idle.len() - 1 - back)
        });
        idle.remove(at.unwrap_or(0)).map(|(_, conn)| conn)
    }

    /// The connection `mark` names, wherever it is.
    fn take_marked(&self, mark: ConnMark) -> Option<Box<BackendConn>> {
        let idle = &mut self.lock().connections;
        let at = idle.iter().rposition(|(m, _)| *m == mark)?;
        idle.remove(at).map(|(_, conn)| conn)
    }

    /// Its length and how often it was locked, without counting this look.
    fn counts(&self) -> (usize, u64) {
        let idle = self.0.lock().unwrap_or_else(|e| e.into_inner());
        (idle.connections.len(), idle.locked)
    }
}

pub struct Pool {
    pub config: BackendConfig,
    /// Who each connection logs in as, by its key's account.
    accounts: Arc<Accounts>,
    /// How connections to each host switch to TLS (`None`: they stay in
    /// clear), or why the configured TLS could not be set up: then none is
    /// opened.
    tls: Vec<Result<Option<ToBackend>, String>>,
    /// The backend's hosts, and which one is the writer the pool's
    /// connections go to.
    pub(super) replicas: ReplicaSet,
    /// One permit per host, for the monitor's connection to it.
    monitor_slots: Arc<Semaphore>,
    /// A pool of its own per host of a replica set, for reads on replicas
    /// (`reads = "replicas"`); empty for a lone host.
    pub(super) readers: Vec<Arc<Pool>>,
    /// Where the next choice of a replica starts among equals: clients
    /// that start together (each sees no connection open anywhere yet) are
    /// spread over the replicas rather than all sent to the first.
    pub(super) next_reader: AtomicUsize,
    buckets: RwLock<HashMap<ConnKey, Bucket>>,
    /// One permit per open connection.
    slots: Arc<Semaphore>,
    /// Sessions waiting for a connection: a return wakes one only then, so
    /// that the common return writes nothing another core reads.
    waiting: AtomicUsize,
    /// Connections a worker took from another's list.
    borrowed: AtomicU64,
    cores: usize,
    /// Connections hscale opens for itself (dictionary, admin commands, row
    /// moves), apart from the clients' so that they never take a client's place.
    own_slots: Arc<Semaphore>,
    returned: Notify,
    pub(super) connect_timeout: Duration,
    queue_timeout: Duration,
}

/// A connection on loan.
pub struct Lease {
    pub conn: Box<BackendConn>,
}

impl Pool {
    /// A pool whose idle connections wait in `cores` lists per key; how
    /// long opening one may take, and how long a session waits for one.
    pub fn new(
        config: BackendConfig,
        accounts: Arc<Accounts>,
        (connect_timeout, queue_timeout): (Duration, Duration),
        cores: usize,
    ) -> Pool {
        let slots = Arc::new(Semaphore::new(config.max_connections));
        let hosts = config.hosts();
        let tls = hosts
            .iter()
            .map(|address| {
                crate::tls::connector(config.tls, config.tls_ca.as_deref())
                    .and_then(|connector| {
                        let Some(connector) = connector else {
                            return Ok(None);
                        };
                        let name = crate::tls::server_name(address)?;
                        Ok(Some(ToBackend { connector, name }))
                    })
                    .map_err(|e| e.to_string())
            })
            .collect();
        let readers = match hosts.len() {
            1 => Vec::new(),
            _ => hosts
                .iter()
                .map(|host| {
                    let alone = BackendConfig {
                        address: host.clone(),
                        replicas: Vec::new(),
                        ..config.clone()
                    };
                    let timeouts = (connect_timeout, queue_timeout);
                    Arc::new(Pool::new(alone, accounts.clone(), timeouts, cores))
                })
                .collect(),
        };
        Pool {
            readers,
            next_reader: AtomicUsize::new(0),
            monitor_slots: Arc::new(Semaphore::new(hosts.len())),
            replicas: ReplicaSet::new(hosts, config.failover == crate::config::Failover::Auto),
            config,
            accounts,
            tls,
            buckets: RwLock::new(HashMap::new()),
            slots,
            waiting: AtomicUsize::new(0),
            borrowed: AtomicU64::new(0),
            cores: cores.max(1),
            own_slots: Arc::new(Semaphore::new(OWN_CONNECTIONS)),
            returned: Notify::new(),
            connect_timeout,
            queue_timeout,
        }
    }

    pub fn id(&self) -> u32 {
        self.config.id
    }

    pub fn bucket(&self, key: ConnKey) -> Bucket {
        if let Some(b) = self
            .buckets
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return b.clone();
        }
        let mut buckets = self.buckets.write().unwrap_or_else(|e| e.into_inner());
        buckets
            .entry(key)
            .or_insert_with(|| Bucket {
                key,
                idle: (0..=self.cores).map(|_| IdleList::default()).collect(),
            })
            .clone()
    }

    /// An idle connection of the bucket's key (`own`, the one the caller
    /// returned last, if no one used it since), else a new one, else waits
    /// for one.
    pub async fn acquire(
        &self,
        bucket: &Bucket,
        own: Option<ConnMark>,
    ) -> Result<Lease, BackendError> {
        match take_idle(bucket, own, self.replicas.generation()) {
            Some(conn) => Ok(Lease { conn }),
            // Boxed: opening a connection (a login, a wait for a writer)
            // is rare, and its future large; unboxed, every statement's
            // future would carry it and be copied whole at each call.
            None => Box::pin(self.acquire_slow(bucket)).await,
        }
    }

    async fn acquire_slow(&self, bucket: &Bucket) -> Result<Lease, BackendError> {
        // Another worker's idle connection comes over before a new one is
        // opened: connections follow the statements in flight, not workers
        // times clients (a client that moved to this worker left its
        // connections idle on the other).
        if let Some(conn) = self.borrow(bucket) {
            return Ok(Lease { conn });
        }
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            return self.open(bucket.key, permit).await;
        }
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let waited = self.wait_for_one(bucket).await;
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        waited
    }

    /// Every worker's list, then a new connection, then one of another
    /// key's closed for it, then the next one returned or closed.
    async fn wait_for_one(&self, bucket: &Bucket) -> Result<Lease, BackendError> {
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + self.queue_timeout;
        loop {
            let returned = self.returned.notified();
            tokio::pin!(returned);
            // Enabled before the lists are read: a return after the look
            // (which reads `waiting` under the list's lock the look took)
            // wakes this wait.
            returned.as_mut().enable();
            if let Some(conn) = take_idle(bucket, None, self.replicas.generation()) {
                return Ok(Lease { conn });
            }
            if let Some(conn) = self.borrow(bucket) {
                return Ok(Lease { conn });
            }
            if let Ok(permit) = self.slots.clone().try_acquire_owned() {
                return self.open(bucket.key, permit).await;
            }
            if self.evict_idle_of_other_keys(bucket.key) {
                continue;
            }
            tokio::select! {
                _ = &mut returned => {}
                permit = self.slots.clone().acquire_owned() => {
                    let permit = permit.expect("the pool never closes its semaphore");
                    return self.open(bucket.key, permit).await;
                }
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(BackendError::PoolExhausted {
                        backend: self.config.id,
                        waited_ms: started.elapsed().as_millis() as u64,
                        max: self.config.max_connections,
                    });
                }
            }
        }
    }

    /// Whether a connection goes to the backend's writer now; one opened to
    /// another host is never used again.
    pub fn is_current(&self, conn: &BackendConn) -> bool {
        conn.generation == self.replicas.generation()
    }

    /// `is_current`, as the error of a writer change where it is not.
    pub fn ensure_current(&self, conn: &BackendConn) -> Result<(), BackendError> {
        match self.is_current(conn) {
            true => Ok(()),
            false => Err(BackendError::WriterChanged {
                backend: conn.backend,
            }),
        }
    }

    /// The backend's hosts and the writer among them.
    pub fn replicas(&self) -> &ReplicaSet {
        &self.replicas
    }

    /// Returns a healthy connection to the idle list of its current key.
    pub fn release(&self, conn: Box<BackendConn>) {
        let bucket = self.bucket(conn.key);
        self.release_to(&bucket, conn);
    }

    /// Returns a connection to the bucket the caller already holds for its
    /// key, in the list of the worker that opened it.
    pub fn release_to(&self, bucket: &Bucket, mut conn: Box<BackendConn>) {
        if conn.key != bucket.key {
            return self.release(conn);
        }
        if !self.is_current(&conn) {
            // A replica's goes back to its pool; one of an old writer closes.
            if let Some(reader) = self.reader_of(&conn) {
                reader.release(conn);
            }
            return;
        }
        conn.idle_since = Instant::now();
        bucket.home(&conn).push(conn);
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.returned.notify_one();
        }
    }

    /// The idle connection `mark` names, if no one ran a command on it since
    /// and it is still alive: in the calling worker's list, where the
    /// session returned it unless it was borrowed.
    pub fn take_marked(&self, bucket: &Bucket, mark: ConnMark) -> Option<Box<BackendConn>> {
        if let Some(conn) = bucket.here().take_marked(mark) {
            return Some(conn).filter(|conn| self.is_current(conn) && !is_dead(conn));
        }
        if let Some(conn) = bucket.others().find_map(|list| list.take_marked(mark)) {
            return self.move_here(conn);
        }
        // The session's last statement read a replica.
        self.readers
            .iter()
            .find_map(|reader| reader.take_marked(&reader.bucket(bucket.key), mark))
    }

    /// Another worker's idle connection of the key, the oldest of the first
    /// list that has one, moved to this worker: registered with its reactor
    /// and, once returned, idle in its list.
    fn borrow(&self, bucket: &Bucket) -> Option<Box<BackendConn>> {
        for list in bucket.others() {
            while let Some(conn) = list.take(None) {
                if let Some(conn) = self.move_here(conn) {
                    return Some(conn);
                }
            }
        }
        None
    }

    /// An idle connection of another worker's list, alive, registered with
    /// the calling worker's reactor; `None` where it is dead or cannot move.
    fn move_here(&self, mut conn: Box<BackendConn>) -> Option<Box<BackendConn>> {
        if !self.is_current(&conn) || is_dead(&conn) {
            return None;
        }
        if let Err(e) = conn.stream.get_mut().rehome() {
            tracing::info!(
                backend = conn.backend,
                "an idle backend connection could not move to another worker; dropped: {e}"
            );
            return None;
        }
        conn.core = crate::cores::current();
        self.borrowed.fetch_add(1, Ordering::Relaxed);
        Some(conn)
    }

    /// Closes one idle connection of another key to free its slot.
    fn evict_idle_of_other_keys(&self, key: ConnKey) -> bool {
        let buckets = self.buckets.read().unwrap_or_else(|e| e.into_inner());
        for (k, bucket) in buckets.iter() {
            if *k != key {
                if let Some(conn) = bucket.idle.iter().find_map(|list| list.take(None)) {
                    drop(conn);
                    return true;
                }
            }
        }
        false
    }

    /// Connections open now, idle or in use.
    pub fn open_connections(&self) -> usize {
        self.config.max_connections - self.slots.available_permits()
    }

    /// Connections waiting in the pool for a client.
    pub fn idle_connections(&self) -> usize {
        self.sum_lists(|(len, _)| len as u64) as usize
    }

    /// Times an idle list's lock was taken, on every worker.
    pub fn lock_acquisitions(&self) -> u64 {
        self.sum_lists(|(_, locked)| locked)
    }

    /// Connections a worker borrowed from another's list.
    pub fn borrowed(&self) -> u64 {
        self.borrowed.load(Ordering::Relaxed)
    }

    fn sum_lists(&self, count: impl Fn((usize, u64)) -> u64) -> u64 {
        let buckets = self.buckets.read().unwrap_or_else(|e| e.into_inner());
        buckets
            .values()
            .flat_map(|bucket| bucket.idle.iter())
            .map(|list| count(list.counts()))
            .sum()
    }
}

/// An idle connection of the calling worker's list that is still alive and
/// goes to the writer of `generation`.
fn take_idle(
    bucket: &Bucket,
    mut own: Option<ConnMark>,
    generation: u64,
) -> Option<Box<BackendConn>> {
    while let Some(conn) = bucket.here().take(own.take()) {
        if conn.generation == generation && !is_dead(&conn) {
            return Some(conn);
        }
    }
    None
}

/// Whether an idle connection was closed by its server (a restart, its
/// wait_timeout, a KILL) or sent something unasked. This is the only moment
/// a connection may be swapped for another unseen: a command is sent at most
/// once, and a connection that fails after it was written fails the command.
fn is_dead(conn: &BackendConn) -> bool {
    let ask_kernel = conn.idle_since.elapsed() > STALE_CHECK_AFTER;
    let dead = conn.stream.get_ref().is_stale(ask_kernel);
    if dead {
        tracing::info!(
            backend = conn.backend,
            "idle backend connection was closed; dropped"
        );
    }
    dead
}

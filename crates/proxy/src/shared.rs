//! State every session reads: users, backend pools, counters. Built once from
//! the configuration and handed to sessions as an `Arc`.

use std::collections::HashMap;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hscale_planner::{Dictionary, PhysicalId};
use hscale_wire::auth::PasswordHash;
use hscale_wire::StatusFlags;
use smallvec::SmallVec;
use tokio::sync::Notify;

use crate::backend::accounts::Accounts;
use crate::backend::{ConnKey, Pool};
use crate::config::{Config, Transactions};
use crate::dictionary::DictionaryHandle;

pub struct User {
    pub password: PasswordHash,
    pub admin: bool,
}

/// MariaDB's default wait_timeout and interactive_timeout, until the main
/// backend has told its own.
pub const DEFAULT_WAIT_TIMEOUT_S: u64 = 28800;

/// Answered to clients until the main backend has told its own version.
/// MariaDB's largest max_allowed_packet, hscale's until the main backend
/// says its own.
const MAX_ALLOWED_PACKET_LIMIT: usize = 1 << 30;

const FALLBACK_VERSION: &str = "5.5.5-10.11.0-MariaDB-hscale";

/// What other sessions may know of a session: enough to KILL it, and to
/// close it when it stayed idle past its wait_timeout.
pub struct SessionHandle {
    user: Mutex<String>,
    /// The backend connection serving the session now: backend id in the high
    /// half, the server's thread id in the low half; 0 when it has none.
    running: AtomicU64,
    /// The backend connections of a scan in progress, (backend id, thread
    /// id): a KILL stops each partition's query.
    scanning: Mutex<Vec<(u32, u32)>>,
    killed: Notify,
    /// Set by `kill`, before the session's backend threads are killed: their
    /// lost connections end the session without a word, as MariaDB closes a
    /// killed connection.
    was_killed: AtomicBool,
    /// The session ended and its client's socket is closed.
    ended: AtomicBool,
    ended_notify: Notify,
    /// Since when (ms after `Shared::started`) the client has sent nothing;
    /// `BUSY` while a command runs.
    waiting_since_ms: AtomicU64,
    /// The session's wait_timeout in seconds.
    wait_timeout_s: AtomicU64,
    /// Which partitions' tables the session is on, for moves' fences.
    pub on: OnTables,
    /// The backend connections the session holds, (backend id, thread id):
    /// between commands exactly those kept for it, during one also those
    /// it took since. What the deadlock detector maps server threads to
    /// sessions by.
    holding: Mutex<SmallVec<[(u32, u32); 2]>>,
    /// Commands the client sent: a command still running at two looks of
    /// the deadlock detector has waited a while.
    commands: AtomicU64,
    /// Set by the deadlock detector before it kills the connection the
    /// session's statement waits on: that lost connection is a deadlock.
    deadlocked: AtomicBool,
}

/// The physical tables of partitioned tables a session is on: the one its
/// running statement was routed to, and those its open transaction ran on.
/// An instance acknowledges a fence only once no session is on a fenced
/// table (`Sessions::on_any`). The session writes, the dictionary's refresh
/// reads: a statement costs a few stores, and only a transaction's new
/// table takes the lock.
pub struct OnTables {
    /// The lowest dictionary version the running command planned by:
    /// `IDLE` between commands, while a statement waits for a fence, and
    /// for a statement on no partition; `PLANNING` while it takes a
    /// snapshot.
    planned: AtomicU64,
    /// The running statement's table (`PhysicalId::bits`); `UNKNOWN` until
    /// it is routed, and for a statement on several.
    statement: AtomicU64,
    /// Whether the dictionary was fresh when the running statement took its
    /// snapshot (see `planning`).
    fresh: AtomicBool,
    transaction: Mutex<SmallVec<[PhysicalId; 4]>>,
}

const IDLE: u64 = u64::MAX;
const PLANNING: u64 = 0;
const UNKNOWN: u64 = 0;

impl OnTables {
    fn new() -> OnTables {
        OnTables {
            planned: AtomicU64::new(IDLE),
            statement: AtomicU64::new(UNKNOWN),
            fresh: AtomicBool::new(false),
            transaction: Mutex::new(SmallVec::new()),
        }
    }

    /// The snapshot a statement is planned by. `PLANNING` is published
    /// before the snapshot is read, each side's fence between its write and
    /// its read: an instance that installs a fence and then does not find
    /// this session planning knows that the session's snapshot has it.
    /// Freshness is read before the snapshot too (`planned_fresh`): a
    /// snapshot read after a fresh lease is the one that read confirmed, or
    /// newer, where a lease confirmed after an old snapshot was planned by
    /// says nothing of it (a process woken from a stop plans by its old
    /// snapshot while its refresh reads the new one).
    pub fn planning(&self, handle: &DictionaryHandle) -> arc_swap::Guard<Arc<Dictionary>> {
        let before = self.planned.load(Ordering::Relaxed);
        self.planned.store(PLANNING, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        self.fresh.store(handle.fresh(), Ordering::Relaxed);
        let dictionary = handle.snapshot();
        self.planned
            .store(before.min(dictionary.version), Ordering::Release);
        dictionary
    }

    /// Whether the dictionary was read within its lease when the running
    /// statement took its snapshot: a routed statement runs only then.
    pub fn planned_fresh(&self) -> bool {
        self.fresh.load(Ordering::Relaxed)
    }

    /// The running statement goes to `tables`: none is as good as idle.
    pub fn runs_on(&self, tables: &[PhysicalId]) {
        match tables {
            [] => self.planned.store(IDLE, Ordering::Release),
            [one] => self.statement.store(one.bits(), Ordering::Release),
            _ => self.statement.store(UNKNOWN, Ordering::Release),
        }
    }

    /// The statement waits for a fence: it is on nothing until it is
    /// planned again.
    pub fn waits(&self) {
        self.statement.store(UNKNOWN, Ordering::Release);
        self.planned.store(IDLE, Ordering::Release);
    }

    /// The command is over; it ran on `ran`. `in_transaction`: a
    /// transaction is open on a backend, which keeps the tables its
    /// statements ran on; `kept`, the session's copy of them, follows.
    pub fn ended(
        &self,
        in_transaction: bool,
        ran: &[PhysicalId],
        kept: &mut SmallVec<[PhysicalId; 4]>,
    ) {
        let before = kept.len();
        match in_transaction {
            true => {
                for table in ran {
                    if !kept.contains(table) {
                        kept.push(*table);
                    }
                }
            }
            false => kept.clear(),
        }
        if kept.len() != before {
            self.lock().clone_from(kept);
        }
        self.statement.store(UNKNOWN, Ordering::Release);
        self.planned.store(IDLE, Ordering::Release);
    }

    /// Whether the session is on one of `fenced`, or may be: its running
    /// statement was planned by a snapshot older than `version` (which
    /// fenced them) and is not known to go elsewhere. The caller has
    /// fenced after installing `version` (see `planning`).
    fn on_any(&self, version: u64, fenced: &[PhysicalId]) -> bool {
        let planned = self.planned.load(Ordering::Acquire);
        if planned < version {
            let statement = self.statement.load(Ordering::Acquire);
            if statement == UNKNOWN || fenced.contains(&PhysicalId::from_bits(statement)) {
                return true;
            }
        }
        self.lock().iter().any(|t| fenced.contains(t))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SmallVec<[PhysicalId; 4]>> {
        self.transaction.lock().unwrap_or_else(|e| e.into_inner())
    }
}

const BUSY: u64 = u64::MAX;

/// How often idle sessions are looked for, and the idle clock advances.
pub const IDLE_TICK_MS: u64 = 1000;

impl SessionHandle {
    pub fn user(&self) -> String {
        self.user.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn set_user(&self, user: &str) {
        *self.user.lock().unwrap_or_else(|e| e.into_inner()) = user.to_owned();
    }

    pub fn set_running(&self, backend: u32, thread_id: u32) {
        let packed = u64::from(backend) << 32 | u64::from(thread_id);
        self.running.store(packed, Ordering::Relaxed);
    }

    pub fn set_idle(&self) {
        self.running.store(0, Ordering::Relaxed);
    }

    /// (backend id, server thread id) of the connection serving the session.
    pub fn running(&self) -> Option<(u32, u32)> {
        let packed = self.running.load(Ordering::Relaxed);
        (packed != 0).then_some(((packed >> 32) as u32, packed as u32))
    }

    pub fn kill(&self) {
        self.was_killed.store(true, Ordering::Relaxed);
        self.killed.notify_one();
    }

    pub fn was_killed(&self) -> bool {
        self.was_killed.load(Ordering::Relaxed)
    }

    /// Called once the session's client socket is closed.
    pub fn set_ended(&self) {
        self.ended.store(true, Ordering::Release);
        self.ended_notify.notify_waiters();
    }

    /// Waits, at most `limit`, until the session's client socket is closed.
    pub async fn wait_ended(&self, limit: std::time::Duration) {
        let ended = async {
            loop {
                let notified = self.ended_notify.notified();
                tokio::pin!(notified);
                // Registered before the check: a set_ended in between wakes it.
                notified.as_mut().enable();
                if self.ended.load(Ordering::Acquire) {
                    return;
                }
                notified.await;
            }
        };
        let _ = tokio::time::timeout(limit, ended).await;
    }

    /// A scan's partition query started on this backend thread.
    pub fn scanning(&self, backend: u32, thread_id: u32) {
        self.scanning
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((backend, thread_id));
    }

    pub fn scan_ended(&self) {
        self.scanning
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Every backend thread serving the session now: its connection, and
    /// each partition's of a scan.
    pub fn threads(&self) -> Vec<(u32, u32)> {
        let mut threads = self
            .scanning
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(running) = self.running() {
            if !threads.contains(&running) {
                threads.push(running);
            }
        }
        threads
    }

    /// The client is expected to send its next command from `now_ms` on.
    pub fn set_waiting(&self, now_ms: u64) {
        self.waiting_since_ms.store(now_ms, Ordering::Relaxed);
    }

    pub fn set_busy(&self) {
        self.waiting_since_ms.store(BUSY, Ordering::Relaxed);
        self.commands.fetch_add(1, Ordering::Relaxed);
    }

    /// Which command is running, counted from the first; `None` between
    /// commands.
    pub fn running_command(&self) -> Option<u64> {
        let busy = self.waiting_since_ms.load(Ordering::Relaxed) == BUSY;
        busy.then(|| self.commands.load(Ordering::Relaxed))
    }

    /// The session took a backend connection.
    pub fn hold(&self, backend: u32, thread_id: u32) {
        let mut holding = self.holding.lock().unwrap_or_else(|e| e.into_inner());
        if !holding.contains(&(backend, thread_id)) {
            holding.push((backend, thread_id));
        }
    }

    /// Between commands: the connections kept for the session, all of them.
    pub fn set_holding(&self, threads: impl Iterator<Item = (u32, u32)>) {
        let mut holding = self.holding.lock().unwrap_or_else(|e| e.into_inner());
        holding.clear();
        holding.extend(threads);
    }

    pub fn holding(&self) -> SmallVec<[(u32, u32); 2]> {
        self.holding
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn mark_deadlocked(&self) {
        self.deadlocked.store(true, Ordering::Relaxed);
    }

    /// Whether the detector ended the session's transaction; cleared.
    pub fn take_deadlocked(&self) -> bool {
        self.deadlocked.swap(false, Ordering::Relaxed)
    }

    pub fn set_wait_timeout(&self, seconds: u64) {
        self.wait_timeout_s.store(seconds, Ordering::Relaxed);
    }

    /// Whether the client has sent nothing for longer than its wait_timeout.
    /// Both times are read off the idle clock, which may lag one tick: a
    /// session is closed up to two ticks late, never early.
    fn timed_out(&self, now_ms: u64) -> bool {
        let since = self.waiting_since_ms.load(Ordering::Relaxed);
        let limit_ms = self
            .wait_timeout_s
            .load(Ordering::Relaxed)
            .saturating_mul(1000);
        since != BUSY && now_ms.saturating_sub(since) > limit_ms.saturating_add(IDLE_TICK_MS)
    }

    /// Completes once the session has been killed.
    pub async fn killed(&self) {
        self.killed.notified().await
    }
}

/// Sessions by the connection id their clients were given. Touched at connect,
/// disconnect and KILL only.
#[derive(Default)]
pub struct Sessions {
    by_id: Mutex<HashMap<u32, Arc<SessionHandle>>>,
}

impl Sessions {
    pub fn register(&self, id: u32, user: &str) -> Arc<SessionHandle> {
        let handle = Arc::new(SessionHandle {
            user: Mutex::new(user.to_owned()),
            running: AtomicU64::new(0),
            scanning: Mutex::new(Vec::new()),
            killed: Notify::new(),
            was_killed: AtomicBool::new(false),
            ended: AtomicBool::new(false),
            ended_notify: Notify::new(),
            waiting_since_ms: AtomicU64::new(BUSY),
            wait_timeout_s: AtomicU64::new(DEFAULT_WAIT_TIMEOUT_S),
            on: OnTables::new(),
            holding: Mutex::new(SmallVec::new()),
            commands: AtomicU64::new(0),
            deadlocked: AtomicBool::new(false),
        });
        self.by_id
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, handle.clone());
        handle
    }

    /// Closes the sessions whose clients stayed idle past their wait_timeout.
    pub fn close_idle(&self, now_ms: u64) {
        let sessions = self.by_id.lock().unwrap_or_else(|e| e.into_inner());
        for (id, handle) in sessions.iter() {
            if handle.timed_out(now_ms) {
                tracing::info!(connection_id = id, "idle past wait_timeout: closing");
                handle.set_busy();
                handle.kill();
            }
        }
    }

    /// Every session, by connection id.
    pub fn all(&self) -> Vec<(u32, Arc<SessionHandle>)> {
        let sessions = self.by_id.lock().unwrap_or_else(|e| e.into_inner());
        sessions.iter().map(|(id, s)| (*id, s.clone())).collect()
    }

    pub fn remove(&self, id: u32) {
        self.by_id
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }

    /// Whether some session is (or may be) on one of the `fenced` tables
    /// of dictionary `version` (see `OnTables::on_any`).
    pub fn on_any(&self, version: u64, fenced: &[PhysicalId]) -> bool {
        fence(Ordering::SeqCst);
        let sessions = self.by_id.lock().unwrap_or_else(|e| e.into_inner());
        sessions.values().any(|s| s.on.on_any(version, fenced))
    }

    pub fn get(&self, id: u64) -> Option<Arc<SessionHandle>> {
        let id = u32::try_from(id).ok()?;
        self.by_id
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned()
    }
}

/// What the instances of hscale share through the backends, and what the
/// control plane works on: the backends and their pools, the accounts, the
/// dictionary, AUTO_INCREMENT ids, two-phase commit and the moves. Admin
/// commands, moves, two-phase commit and the dictionary take this alone.
pub struct Cluster {
    /// This instance's sessions: the moves' fences wait for those on a
    /// fenced table, and KILL finds its target here.
    pub sessions: Sessions,
    /// The backend accounts: hscale's service account and the users'.
    pub accounts: Arc<Accounts>,
    pub pools: Vec<Arc<Pool>>,
    /// Index into `pools` of the main backend.
    pub main: usize,
    pub dictionary: DictionaryHandle,
    /// This instance's blocks of AUTO_INCREMENT ids.
    pub sequences: crate::dictionary::sequences::Sequences,
    pub transactions: Transactions,
    /// Two-phase commit: this instance's transactions over several backends.
    pub xa: crate::xa::Coordinator,
    /// How long a statement waits for a partition move on its table.
    pub lock_wait: Duration,
    pub moves: crate::config::MovesConfig,
    /// The moves this instance runs: their heartbeats and their turns.
    pub running_moves: crate::online::running::RunningMoves,
    /// The runtime of the acceptor and the dictionary's loops (`run` sets
    /// it): background jobs run there, not on the worker of the client that
    /// started them, whose other clients they would slow alone.
    background: std::sync::OnceLock<tokio::runtime::Handle>,
}

/// One instance's front: its clients (sessions, workers, limits, TLS,
/// logins, counters) over the `Cluster`, whose fields it reads as its own.
pub struct Shared {
    pub cluster: Arc<Cluster>,
    /// This host's name: what `@@hostname` answers through hscale.
    pub hostname: String,
    pub users: HashMap<String, User>,
    pub server_version: String,
    /// The status flags of a new session on the main backend, as its greeting
    /// says: clients read from hscale's greeting whether to escape with
    /// backslashes, and hscale lexes their first statement the same way.
    pub new_session_status: StatusFlags,
    /// The main backend's global sql_mode, a new session's: whether it reads
    /// `"..."` as an identifier (ANSI_QUOTES), whether 0 is an id
    /// (NO_AUTO_VALUE_ON_ZERO).
    pub new_session_sql_mode: String,
    pub max_connections: usize,
    /// Worker threads, each with a runtime of its own (`cores`).
    pub cores: usize,
    /// Where clients are, and when one moves to another worker.
    pub balance: crate::cores::Balance,
    pub counters: Counters,
    /// How often the deadlock detector looks; `None`: never.
    pub deadlock_check: Option<Duration>,
    /// The main backend's global wait_timeout and interactive_timeout, in
    /// seconds: a new session's idle limit (interactive clients get the second).
    pub wait_timeouts: (u64, u64),
    /// The main backend's max_allowed_packet: the largest command a logged-in
    /// client may send, as that server would enforce it.
    pub max_allowed_packet: usize,
    /// How long a client may take to log in.
    pub login_timeout: Duration,
    /// What clients that switch to TLS get; `None`: the greeting offers none.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// Clients must switch to TLS.
    pub require_tls: bool,
    /// What the greeting asks clients to log in with.
    pub default_auth: crate::config::DefaultAuth,
    /// What caching_sha2_password keeps: digests for fast logins, the RSA key.
    pub sha2: crate::sha2_auth::Sha2Logins,
    /// The main backend's collations: how ORDER BY merges compare strings.
    pub collations: Arc<hscale_merge::Collations>,
    /// How statements on several partitions are bounded.
    pub scans: crate::config::ScansConfig,
    next_connection_id: AtomicU32,
    pub started: Instant,
    idle_clock_ms: AtomicU64,
}

impl std::ops::Deref for Shared {
    type Target = Cluster;

    fn deref(&self) -> &Cluster {
        &self.cluster
    }
}

#[derive(Default)]
pub struct Counters {
    pub questions: ShardedCounter,
    /// Statements on partitioned tables.
    pub routed: ShardedCounter,
    pub connections: AtomicU64,
    pub clients: AtomicU64,
    /// Statements that waited for a fence or a lock on their table (each
    /// counted once, however long it waited).
    pub waited: AtomicU64,
    /// SELECTs the partitions could not answer alone, answered by a lookup
    /// join (`lookup_joins`) or from copies of their tables (`copied`).
    pub lookup_joins: AtomicU64,
    pub copied: AtomicU64,
    /// Transactions ended by the deadlock detector: cycles of lock waits
    /// through several backends.
    pub deadlocks: AtomicU64,
}

impl Counters {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// A counter that every statement bumps: one slot per thread, each on its own
/// cache line, so that the workers do not pass one line back and forth.
#[derive(Default)]
pub struct ShardedCounter {
    slots: [PaddedCount; COUNTER_SHARDS],
}

const COUNTER_SHARDS: usize = 32;

#[derive(Default)]
#[repr(align(128))]
struct PaddedCount(AtomicU64);

impl ShardedCounter {
    pub fn add(&self, n: u64) {
        thread_local! {
            static SHARD: usize = {
                static NEXT: AtomicU64 = AtomicU64::new(0);
                NEXT.fetch_add(1, Ordering::Relaxed) as usize % COUNTER_SHARDS
            };
        }
        let shard = SHARD.with(|shard| *shard);
        self.slots[shard].0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn total(&self) -> u64 {
        self.slots
            .iter()
            .map(|slot| slot.0.load(Ordering::Relaxed))
            .sum()
    }
}

impl Shared {
    pub fn new(config: &Config) -> Shared {
        let connect_timeout = Duration::from_millis(config.proxy.connect_timeout_ms);
        let queue_timeout = Duration::from_millis(config.proxy.queue_timeout_ms);
        let accounts = Arc::new(Accounts::new(&config.users));
        let cores = crate::cores::count(config.proxy.threads);
        let pools: Vec<Arc<Pool>> = config
            .backends
            .iter()
            .map(|b| {
                let accounts = accounts.clone();
                Arc::new(Pool::new(
                    b.clone(),
                    accounts,
                    (connect_timeout, queue_timeout),
                    cores,
                ))
            })
            .collect();
        let main = pools
            .iter()
            .position(|p| p.id() == config.dictionary.backend)
            .unwrap_or(0);
        let users = config
            .users
            .iter()
            .filter_map(|u| {
                let password = u.password_hash()?;
                Some((
                    u.name.clone(),
                    User {
                        password,
                        admin: u.admin,
                    },
                ))
            })
            .collect();
        let main_backend = pools[main].id();
        Shared {
            cluster: Arc::new(Cluster {
                sessions: Sessions::default(),
                accounts,
                pools,
                main,
                sequences: Default::default(),
                xa: Default::default(),
                dictionary: DictionaryHandle::new(
                    config.dictionary.schema.clone(),
                    Duration::from_millis(config.dictionary.refresh_ms.max(1)),
                    Duration::from_millis(config.dictionary.lease_ms),
                )
                .on_backend(main_backend),
                transactions: config.proxy.transactions,
                moves: config.moves.clone(),
                running_moves: Default::default(),
                background: Default::default(),
                lock_wait: Duration::from_millis(config.dictionary.lock_wait_ms),
            }),
            hostname: host_name(),
            users,
            server_version: FALLBACK_VERSION.into(),
            new_session_status: StatusFlags::SERVER_STATUS_AUTOCOMMIT,
            new_session_sql_mode: String::new(),
            max_connections: config.proxy.max_connections,
            cores,
            balance: crate::cores::Balance::new(cores, config.proxy.move_clients),
            counters: Counters::default(),
            deadlock_check: (config.proxy.deadlock_check_ms > 0)
                .then(|| Duration::from_millis(config.proxy.deadlock_check_ms)),
            scans: config.scans.clone(),
            wait_timeouts: (DEFAULT_WAIT_TIMEOUT_S, DEFAULT_WAIT_TIMEOUT_S),
            max_allowed_packet: MAX_ALLOWED_PACKET_LIMIT,
            login_timeout: Duration::from_millis(config.proxy.login_timeout_ms),
            tls: client_tls(config),
            require_tls: config.proxy.require_tls,
            default_auth: config.proxy.default_auth,
            sha2: Default::default(),
            collations: Arc::default(),
            next_connection_id: AtomicU32::new(1),
            started: Instant::now(),
            idle_clock_ms: AtomicU64::new(0),
        }
    }

    /// Asks the main backend for its version and a new session's status, so
    /// that clients see the server they really talk to. A backend that is down
    /// now only leaves the fallbacks.
    pub async fn learn_main_backend(&mut self) {
        let cluster = self.cluster.clone();
        let pool = &cluster.pools[cluster.main];
        match pool.acquire(&pool.bucket(ConnKey::service()), None).await {
            Ok(lease) => {
                self.server_version = lease.conn.server_version.clone();
                self.new_session_status = lease.conn.greeting_status
                    & (StatusFlags::SERVER_STATUS_AUTOCOMMIT
                        | StatusFlags::SERVER_STATUS_NO_BACKSLASH_ESCAPES);
                let mut conn = lease.conn;
                let sql = "SELECT @@global.wait_timeout, @@global.interactive_timeout, @@global.sql_mode, @@global.max_allowed_packet";
                if let Ok(Ok(rows)) = conn.query(sql).await {
                    let text = |i: usize| {
                        let value = rows.first()?.get(i)?.as_ref()?;
                        std::str::from_utf8(value).ok()
                    };
                    let number = |i: usize| text(i)?.parse().ok();
                    if let (Some(wait), Some(interactive)) = (number(0), number(1)) {
                        self.wait_timeouts = (wait, interactive);
                    }
                    self.new_session_sql_mode = text(2).unwrap_or_default().to_string();
                    if let Some(max) = number(3) {
                        self.max_allowed_packet = (max as usize).min(MAX_ALLOWED_PACKET_LIMIT);
                    }
                }
                match learn_collations(&mut conn).await {
                    Some(collations) => self.collations = Arc::new(collations),
                    None => tracing::warn!(
                        "could not read the main backend's collations: ORDER BY a string column over several partitions is refused"
                    ),
                }
                pool.release(conn);
            }
            Err(e) => tracing::warn!("main backend not reachable at start: {e}"),
        }
    }

    /// The idle clock: milliseconds since this instance started, as of its
    /// last tick. A session reads it per command; reading the system clock
    /// instead would cost more than the rest of the bookkeeping.
    pub fn idle_clock_ms(&self) -> u64 {
        self.idle_clock_ms.load(Ordering::Relaxed)
    }

    /// Advances the idle clock and closes the sessions idle past their
    /// wait_timeout.
    pub fn idle_tick(&self) {
        let now = self.started.elapsed().as_millis() as u64;
        self.idle_clock_ms.store(now, Ordering::Relaxed);
        self.sessions.close_idle(now);
    }

    pub fn next_connection_id(&self) -> u32 {
        self.next_connection_id.fetch_add(1, Ordering::Relaxed)
    }

    pub fn statistics(&self) -> String {
        let uptime = self.started.elapsed().as_secs().max(1);
        let questions = self.counters.questions.total();
        let open: usize = self.pools.iter().map(|p| p.open_connections()).sum();
        format!(
            "Uptime: {uptime}  Threads: {}  Questions: {questions}  Slow queries: 0  Opens: {}  Open tables: 0  Backend connections: {open}  Queries per second avg: {:.3}",
            self.counters.clients.load(Ordering::Relaxed),
            self.counters.connections.load(Ordering::Relaxed),
            questions as f64 / uptime as f64
        )
    }
}

impl Cluster {
    /// Runs the calling runtime's tasks as this instance's background.
    pub fn set_background(&self) {
        let _ = self.background.set(tokio::runtime::Handle::current());
    }

    /// Spawns a background job (a move) on the main thread's runtime, or
    /// on the caller's before `run` set it.
    pub fn spawn_background<F>(&self, job: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match self.background.get() {
            Some(runtime) => runtime.spawn(job),
            None => tokio::spawn(job),
        }
    }

    pub fn main_pool(&self) -> &Arc<Pool> {
        &self.pools[self.main]
    }

    /// The id of the main backend.
    pub fn main_backend(&self) -> u32 {
        self.pools[self.main].id()
    }

    /// The index into `pools` of a backend id.
    pub fn pool_index(&self, backend: u32) -> Option<usize> {
        self.pools.iter().position(|p| p.id() == backend)
    }
}

/// The TLS acceptor for clients, if the configuration has a certificate.
/// `validate` reported a certificate that cannot be read; a listener with
/// `require_tls` then refuses every client rather than serve in clear.
fn client_tls(config: &Config) -> Option<tokio_rustls::TlsAcceptor> {
    let (cert, key) = (
        config.proxy.tls_cert.as_ref()?,
        config.proxy.tls_key.as_ref()?,
    );
    match crate::tls::acceptor(cert, key) {
        Ok(acceptor) => Some(acceptor),
        Err(e) => {
            tracing::error!("TLS for clients is off: {e}");
            None
        }
    }
}

/// What an ORDER BY merge needs of each collation the main backend has: the
/// weight of a space in it (`WEIGHT_STRING`), and whether it pads.
async fn learn_collations(
    conn: &mut crate::backend::BackendConn,
) -> Option<hscale_merge::Collations> {
    let names = "SELECT COLLATION_NAME, CHARACTER_SET_NAME FROM information_schema.COLLATIONS \
                 WHERE ID IS NOT NULL AND CHARACTER_SET_NAME <> 'binary'";
    let rows = conn.query(names).await.ok()?.ok()?;
    let text = |v: &Option<Vec<u8>>| String::from_utf8(v.clone()?).ok();
    let plain = |s: &str| s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    let weights = rows
        .iter()
        .filter_map(|row| Some((text(&row[0])?, text(&row[1])?)))
        .filter(|(name, charset)| plain(name) && plain(charset))
        .map(|(name, charset)| {
            format!(
                "SELECT '{name}', WEIGHT_STRING(CONVERT(_utf8mb4' ' USING {charset}) COLLATE {name})"
            )
        })
        .collect::<Vec<_>>()
        .join(" UNION ALL ");
    let rows = conn.query(&weights).await.ok()?.ok()?;
    let mut collations = hscale_merge::Collations::new();
    for row in rows {
        let (Some(name), Some(space)) = (text(&row[0]), row[1].clone()) else {
            continue;
        };
        let pad = !name.contains("_nopad_");
        collations.insert(name, hscale_merge::Collation { space, pad });
    }
    Some(collations)
}

/// The host's name, as `gethostname(2)` gives it (MariaDB's `@@hostname`).
fn host_name() -> String {
    let mut name = [0u8; 256];
    // SAFETY: the buffer is valid for its length; the name is NUL-terminated
    // unless truncated, and the last byte stays 0 either way.
    let rc = unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len() - 1) };
    if rc != 0 {
        return String::new();
    }
    let len = name.iter().position(|&b| b == 0).unwrap_or(0);
    String::from_utf8_lossy(&name[..len]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kill_reaches_every_partition_of_a_scan_and_the_running_connection() {
        let sessions = Sessions::default();
        let handle = sessions.register(7, "app");
        assert!(handle.threads().is_empty());
        handle.set_running(1, 40);
        handle.scanning(1, 40);
        handle.scanning(2, 41);
        handle.scanning(1, 42);
        assert_eq!(handle.threads(), [(1, 40), (2, 41), (1, 42)]);
        handle.scan_ended();
        assert_eq!(handle.threads(), [(1, 40)]);
    }

    /// What an instance reads before it acknowledges a fence at version 5
    /// of table `p`: a statement planned before the fence is on `p` until
    /// it is known to go elsewhere or ends; one planned after it is not (it
    /// waited, or its transaction ran there); a transaction is on the tables
    /// it ran on until it ends.
    #[test]
    fn a_session_is_on_a_fenced_table_while_its_statement_or_transaction_may_be() {
        let second = Duration::from_secs(1);
        let handle = DictionaryHandle::new("hscale".into(), second, second);
        let sessions = Sessions::default();
        let on = &sessions.register(7, "app").on;
        let (p, q) = (
            PhysicalId::of("app", 1, "t_p"),
            PhysicalId::of("app", 1, "t_q"),
        );
        let fenced = [p];
        let mut kept = SmallVec::new();
        assert!(!sessions.on_any(5, &fenced), "idle");
        // Planned by the empty snapshot (version 0), where it goes not yet known.
        on.planning(&handle);
        assert!(sessions.on_any(5, &fenced));
        on.runs_on(&[q]);
        assert!(!sessions.on_any(5, &fenced), "known to go elsewhere");
        on.ended(true, &[q], &mut kept);
        assert_eq!(kept.as_slice(), [q]);
        assert!(
            !sessions.on_any(5, &fenced),
            "its transaction ran elsewhere"
        );
        on.planning(&handle);
        on.runs_on(&[p, q]);
        assert!(sessions.on_any(5, &fenced), "a statement on several tables");
        on.runs_on(&[p]);
        assert!(sessions.on_any(5, &fenced), "the statement runs on p");
        assert!(
            !sessions.on_any(0, &fenced),
            "a statement planned by the fence passed it"
        );
        on.ended(true, &[p], &mut kept);
        assert_eq!(kept.as_slice(), [q, p]);
        assert!(sessions.on_any(5, &fenced), "its transaction ran on p");
        on.planning(&handle);
        on.waits();
        assert!(
            sessions.on_any(5, &fenced),
            "waiting, its transaction is still on p"
        );
        on.ended(false, &[], &mut kept);
        assert!(kept.is_empty());
        assert!(!sessions.on_any(5, &fenced), "the transaction ended");
        on.planning(&handle);
        on.runs_on(&[]);
        assert!(!sessions.on_any(5, &fenced), "a statement on no partition");
    }
}

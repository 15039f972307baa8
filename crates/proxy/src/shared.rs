//! State every session reads: users, backend pools, counters. Built once from
//! the configuration and handed to sessions as an `Arc`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hscale_wire::auth::PasswordHash;
use hscale_wire::StatusFlags;

use crate::backend::accounts::Accounts;
use crate::backend::{ConnKey, Pool};
use crate::config::{Config, Transactions};
use crate::dictionary::DictionaryHandle;
pub use crate::sessions::{
    OnTables, SessionHandle, Sessions, DEFAULT_WAIT_TIMEOUT_S, IDLE_TICK_MS,
};

pub struct User {
    pub password: PasswordHash,
    pub admin: bool,
    pub reads: ReplicaReads,
}

/// Where a user's autocommitted reads go (`[[users]] reads`, `max_lag_ms`).
#[derive(Debug, Clone, Copy)]
pub struct ReplicaReads {
    /// `reads = "replicas"`: to replicas unless a statement's hint says
    /// `hscale:primary`; otherwise only those hinted `hscale:replica`.
    pub by_default: bool,
    /// How far behind the writer a replica that answers may be.
    pub max_lag: Duration,
}

impl Default for ReplicaReads {
    /// A client hscale knows no `[[users]]` entry of (a backend account).
    fn default() -> ReplicaReads {
        ReplicaReads {
            by_default: false,
            max_lag: Duration::from_millis(crate::config::default_max_lag_ms()),
        }
    }
}

/// Answered to clients until the main backend has told its own version.
/// MariaDB's largest max_allowed_packet, hscale's until the main backend
/// says its own.
const MAX_ALLOWED_PACKET_LIMIT: usize = 1 << 30;

const FALLBACK_VERSION: &str = "5.5.5-10.11.0-MariaDB-hscale";

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
    /// How often every backend host is checked (`backend::replicas`).
    pub monitor: Duration,
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
                        reads: ReplicaReads {
                            by_default: u.reads == crate::config::Reads::Replicas,
                            max_lag: Duration::from_millis(u.max_lag_ms),
                        },
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
                monitor: Duration::from_millis(config.proxy.monitor_ms.max(1)),
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
        let mut status = format!(
            "Uptime: {uptime}  Threads: {}  Questions: {questions}  Slow queries: 0  Opens: {}  Open tables: 0  Backend connections: {open}  Queries per second avg: {:.3}",
            self.counters.clients.load(Ordering::Relaxed),
            self.counters.connections.load(Ordering::Relaxed),
            questions as f64 / uptime as f64
        );
        // A line per backend host, as HSCALE SHOW_BACKENDS lists them.
        for pool in &self.pools {
            for host in pool.replicas().view(pool.id()) {
                let lag = host.health.replication.as_ref().and_then(|r| r.lag_s);
                status.push_str(&format!(
                    "\nBackend {} {}: {}{}",
                    host.backend,
                    host.address,
                    host.role,
                    lag.map(|s| format!(", lag {} ms", s * 1000))
                        .unwrap_or_default()
                ));
            }
        }
        status
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

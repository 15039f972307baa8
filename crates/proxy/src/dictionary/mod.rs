//! The partition dictionary as this instance holds it: an immutable snapshot
//! swapped whole when the version in schema `hscale` changes, polled every
//! `refresh_ms`, with a heartbeat that tells other instances which version
//! this one routes by. An instance that could not read the dictionary for
//! `lease_ms` stops serving partitioned tables.

pub mod collations;
pub mod sequences;
pub mod store;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use hscale_planner::Dictionary;
use hscale_wire::resultset::{rename_column_table, RenamedColumn};

use crate::backend::{BackendConn, ConnKey};
use crate::error::ProxyError;
use crate::shared::Cluster;

/// `DictionaryHandle::logical_column`, borrowing from a snapshot the
/// caller holds (the relay writes the new definition straight to the
/// client's buffer).
pub fn logical_column<'a>(
    dictionary: &'a Dictionary,
    definition: &'a [u8],
) -> Option<RenamedColumn<'a>> {
    rename_column_table(definition, |schema, table| {
        dictionary.logical_name(schema, table)
    })
}

/// A session's recent column definitions and what its client gets for
/// each (`logical_column`), for one dictionary snapshot: a session's
/// statements repeat their columns, and comparing bytes costs less than
/// reading the definition and looking its tables up again.
#[derive(Debug, Default)]
#[allow(clippy::type_complexity)]
pub struct ColumnNames {
    generation: u64,
    /// Definitions as the backend sent them, and what the client gets.
    recent: Vec<(Box<[u8]>, Option<Box<[u8]>>)>,
    /// The entry the next new definition replaces once `recent` is full.
    next: usize,
}

const RECENT_COLUMNS: usize = 32;

impl ColumnNames {
    /// As an answer starts: whether its columns may need other names (some
    /// table is partitioned). What an older snapshot named is forgotten.
    pub fn start(&mut self, handle: &DictionaryHandle) -> bool {
        let dictionary = handle.snapshot();
        self.follow(&dictionary);
        !dictionary.is_empty()
    }

    /// What the client gets for `definition`; `None`: it stands. Between
    /// `start`s, a definition seen before is answered without a look at the
    /// dictionary.
    pub fn logical(&mut self, handle: &DictionaryHandle, definition: &[u8]) -> Option<&[u8]> {
        let found = self
            .recent
            .iter()
            .position(|(seen, _)| **seen == *definition);
        let i = match found {
            Some(i) => i,
            None => {
                let dictionary = handle.snapshot();
                self.follow(&dictionary);
                let renamed = logical_column(&dictionary, definition)
                    .map(|renamed| renamed.to_vec().into_boxed_slice());
                let entry = (definition.into(), renamed);
                match self.recent.len() < RECENT_COLUMNS {
                    true => {
                        self.recent.push(entry);
                        self.recent.len() - 1
                    }
                    false => {
                        let i = self.next;
                        self.recent[i] = entry;
                        self.next = (i + 1) % RECENT_COLUMNS;
                        i
                    }
                }
            }
        };
        self.recent[i].1.as_deref()
    }

    fn follow(&mut self, dictionary: &Dictionary) {
        if dictionary.generation() != self.generation {
            self.generation = dictionary.generation();
            self.recent.clear();
            self.next = 0;
        }
    }
}

pub struct DictionaryHandle {
    current: ArcSwap<Dictionary>,
    /// Reads of the dictionary begun (`begin_read`).
    reads: AtomicU64,
    /// `reads` when the served snapshot was installed (see `install`).
    installed_at: std::sync::Mutex<u64>,
    /// `now_ms` when the last successful read started; 0: never.
    last_read_ms: AtomicU64,
    /// Whether the last read is within the lease, as the refresh loop last
    /// saw (`fresh` reads the clock too).
    fresh: AtomicBool,
    /// `now_ms` of the read that made the dictionary fresh after it was
    /// not (or first): see `fresh_for`.
    fresh_since_ms: AtomicU64,
    /// A switchover is under way (announced or pausing): the refresh polls
    /// often, so that the pause it asks for starts soon.
    pub switchover_soon: AtomicBool,
    /// `coarse_ms` when the handle was made.
    started_ms: u64,
    pub schema: String,
    pub refresh: Duration,
    pub lease: Duration,
    /// This instance's name in the heartbeat table.
    pub instance: String,
    /// The version the heartbeat tells (see `acknowledged`).
    acknowledged: AtomicU64,
    /// The collations partition columns compare by, as learned.
    pub collations: collations::Collations,
    /// The backend the dictionary is read from: the columns of the default
    /// tables there are read with it.
    pub main_backend: u32,
}

impl DictionaryHandle {
    pub fn new(schema: String, refresh: Duration, lease: Duration) -> DictionaryHandle {
        let instance = format!("{}-{:08x}", std::process::id(), rand::random::<u32>());
        DictionaryHandle {
            current: ArcSwap::from_pointee(Dictionary::default().guarding_schema(&schema)),
            reads: AtomicU64::new(0),
            installed_at: std::sync::Mutex::new(0),
            last_read_ms: AtomicU64::new(0),
            fresh: AtomicBool::new(false),
            fresh_since_ms: AtomicU64::new(0),
            switchover_soon: AtomicBool::new(false),
            started_ms: coarse_ms(),
            schema,
            refresh,
            lease,
            instance,
            acknowledged: AtomicU64::new(0),
            collations: Default::default(),
            main_backend: 0,
        }
    }

    /// The handle of a dictionary read from backend `id`.
    pub fn on_backend(mut self, id: u32) -> DictionaryHandle {
        self.main_backend = id;
        self
    }

    /// The current snapshot; a guard, not a reference count, so that workers
    /// do not pass the count's cache line between them on every statement.
    pub fn snapshot(&self) -> arc_swap::Guard<Arc<Dictionary>> {
        self.current.load()
    }

    /// A column definition as the client must see it: where it names a
    /// partition's physical table (hscale's rewrite of the statement put
    /// it there), the partitioned table's name, as one plain table would
    /// answer. Drivers show it as the column's table, and an updatable
    /// result set (Connector/J) writes its changes back to it. `None`: the
    /// definition stands.
    pub fn logical_column(&self, definition: &[u8]) -> Option<Vec<u8>> {
        logical_column(&self.current.load(), definition).map(|renamed| renamed.to_vec())
    }

    /// The snapshot a statement of the session whose tables are `on` is
    /// planned by (`OnTables::planning`: the fence's side of the protocol).
    pub fn planned_by(&self, on: &crate::sessions::OnTables) -> arc_swap::Guard<Arc<Dictionary>> {
        on.planning(|| (self.fresh(), self.snapshot()))
    }

    /// Whether the snapshot was confirmed within the lease. The refresh
    /// loop's flag, and the clock: a process that was stopped (SIGSTOP, a
    /// paused VM) past its lease may run a client's statement before its
    /// refresh loop notices, and the other instances have gone on without
    /// it by then (a move switched, a split's rest took the old table's
    /// name).
    pub fn fresh(&self) -> bool {
        // Acquire: a snapshot read after this is the one the read installed.
        self.fresh.load(Ordering::Acquire)
            && self
                .now_ms()
                .saturating_sub(self.last_read_ms.load(Ordering::Acquire))
                <= self.lease.as_millis() as u64
    }

    /// Called on every refresh tick, successful or not.
    pub(crate) fn check_lease(&self) {
        let last = self.last_read_ms.load(Ordering::Relaxed);
        let fresh =
            last != 0 && self.now_ms().saturating_sub(last) <= self.lease.as_millis() as u64;
        if self.fresh.swap(fresh, Ordering::Relaxed) && !fresh {
            tracing::error!(
                "the dictionary was not read within its lease: partitioned tables are not served"
            );
        }
    }

    /// Milliseconds since the handle was made, never 0, from the kernel's
    /// coarse monotonic clock: every routed statement reads it (`fresh`),
    /// and a lease of seconds does not notice its tick (1 to 4 ms).
    fn now_ms(&self) -> u64 {
        coarse_ms().saturating_sub(self.started_ms) + 1
    }

    /// A read that started at `asked` (`now_ms`) found the dictionary: the
    /// lease counts from before the read, as other instances count it from
    /// the heartbeat written during it.
    fn confirmed(&self, asked: u64) {
        self.last_read_ms.store(asked, Ordering::Release);
        if !self.fresh.swap(true, Ordering::AcqRel) {
            self.fresh_since_ms.store(asked, Ordering::Release);
        }
    }

    /// Whether the dictionary has been read within every lease for `span`
    /// at least: after it was away (its backend failing over), every live
    /// instance's heartbeat is stale until its next read, and none may be
    /// taken for dead before each had a lease to write one.
    pub fn fresh_for(&self, span: Duration) -> bool {
        self.fresh()
            && self
                .now_ms()
                .saturating_sub(self.fresh_since_ms.load(Ordering::Acquire))
                >= span.as_millis() as u64
    }

    /// Serves `dictionary` as if a read had just found it: for the
    /// session's unit tests, which have no dictionary schema to read.
    #[cfg(test)]
    pub(crate) fn serve_for_test(&self, dictionary: Dictionary) {
        self.install(dictionary, self.begin_read());
        self.confirmed(self.now_ms());
    }

    /// A read of the dictionary begins: its number, for `install`.
    fn begin_read(&self) -> u64 {
        self.reads.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Serves `dictionary`, found by read number `read`, unless it is older
    /// than the one served and that read began before the served one was
    /// installed. Reads run at once (the refresh loop's, a move's, an admin
    /// command's), and one that started before a change may end after
    /// another read installed it: served again, its older snapshot would
    /// take back a fence this instance has acknowledged, and a statement
    /// planned by it would reach a partition's table after the move renamed
    /// it away (1146). An older version found by a read begun after the
    /// install is the dictionary's own (restored, made anew): served.
    fn install(&self, dictionary: Dictionary, read: u64) {
        let mut installed_at = self.installed_at.lock().unwrap_or_else(|e| e.into_inner());
        let served = self.current.load().version;
        if dictionary.version < served && read <= *installed_at {
            return;
        }
        if dictionary.version != served {
            tracing::info!(
                version = dictionary.version,
                tables = dictionary.tables().len(),
                "dictionary loaded"
            );
        }
        *installed_at = self.reads.load(Ordering::SeqCst);
        self.current
            .store(Arc::new(dictionary.guarding_schema(&self.schema)));
    }
}

/// CLOCK_MONOTONIC_COARSE in milliseconds: read from the vDSO for a few
/// instructions, where CLOCK_MONOTONIC costs a hundred or more. It runs on
/// while the process is stopped, as a lease must.
#[cfg(target_os = "linux")]
fn coarse_ms() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut now) };
    now.tv_sec as u64 * 1000 + now.tv_nsec as u64 / 1_000_000
}

#[cfg(not(target_os = "linux"))]
fn coarse_ms() -> u64 {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// A connection of hscale's own to a backend, for the dictionary and admin
/// commands; it is closed, never pooled, when dropped.
pub async fn own_connection(shared: &Cluster, slot: usize) -> Result<Box<BackendConn>, ProxyError> {
    Ok(shared.pools[slot].open_own(ConnKey::service()).await?)
}

/// A connection of hscale's own for a move or split: the rows it copies,
/// replaces and removes are the same rows in another place, so no foreign
/// key check or action fires for them (a cascade from the copy's REPLACE or
/// the source's DELETE would remove another table's rows).
pub async fn rows_connection(
    shared: &Cluster,
    slot: usize,
) -> Result<Box<BackendConn>, ProxyError> {
    let mut conn = own_connection(shared, slot).await?;
    store::exec(&mut conn, "SET SESSION foreign_key_checks = 0").await?;
    Ok(conn)
}

/// Reads the version and, when it changed (or `Load::Always`), the whole
/// dictionary; then the heartbeat.
pub async fn reload_with(
    shared: &Cluster,
    conn: &mut BackendConn,
    load: Load,
) -> Result<(), ProxyError> {
    let handle = &shared.dictionary;
    let asked = handle.now_ms();
    let read = handle.begin_read();
    let version = store::read_version(conn, &handle.schema).await?;
    if load == Load::Always || version != handle.snapshot().version {
        let loaded = store::load(conn, handle).await?;
        if load == Load::WhenChanged {
            crate::failpoint::hit("dictionary_poll_before_install").await;
        }
        handle.install(loaded, read);
        let switchovers = store::switchovers(conn, &handle.schema, &handle.instance).await?;
        follow_switchovers(shared, &switchovers);
        let fenced = store::fenced_hosts(conn, &handle.schema).await?;
        for pool in &shared.pools {
            let hosts: Vec<String> = fenced
                .iter()
                .filter(|(backend, _)| *backend == pool.id())
                .map(|(_, host)| host.clone())
                .collect();
            pool.replicas().fenced_elsewhere(&hosts);
        }
    }
    record_fences(shared, conn).await;
    let acknowledged = acknowledged(shared);
    store::heartbeat(conn, &handle.schema, &handle.instance, acknowledged).await?;
    handle.confirmed(asked);
    Ok(())
}

/// Writes the fences this instance set or lifted into the dictionary
/// (bumping its version, so that the others load them); kept for the next
/// reload where the dictionary does not take them now.
async fn record_fences(shared: &Cluster, conn: &mut BackendConn) {
    let table = format!("{}.fenced_hosts", store::ident(&shared.dictionary.schema));
    for pool in &shared.pools {
        let changes = pool.replicas().take_fence_changes();
        if changes.is_empty() {
            continue;
        }
        let statements: Vec<String> = changes
            .iter()
            .map(|(host, fenced)| match fenced {
                true => format!(
                    "REPLACE INTO {table} VALUES ({}, {}, NOW(6))",
                    pool.id(),
                    store::text_literal(host)
                ),
                false => format!(
                    "DELETE FROM {table} WHERE backend = {} AND host = {}",
                    pool.id(),
                    store::text_literal(host)
                ),
            })
            .collect();
        if let Err(e) = store::change(conn, &shared.dictionary.schema, &statements).await {
            tracing::warn!(
                backend = pool.id(),
                "a fence waits to be recorded in the dictionary: {e}"
            );
            pool.replicas().fence_changes_back(changes);
        }
    }
}

/// Holds the statements of each backend another instance switches over
/// now, before this instance's heartbeat tells it has loaded the version
/// that asked for it, and lets go of the others (checking their hosts at
/// once for the new writer).
fn follow_switchovers(shared: &Cluster, switchovers: &[(u32, bool)]) {
    shared
        .dictionary
        .switchover_soon
        .store(!switchovers.is_empty(), Ordering::Relaxed);
    for pool in &shared.pools {
        let held = switchovers.contains(&(pool.id(), true));
        if pool.replicas().hold(held) && !held {
            crate::backend::replicas::check_soon(pool);
        }
    }
}

/// The version this instance's heartbeat tells others it routes by: the
/// snapshot's, once none of its sessions is on a table that snapshot fences
/// (`Sessions::on_any`), and until then the last it told. A move renames a
/// fenced table away only when every instance has told the fence's version,
/// so no statement of theirs reaches the table in between, and every
/// transaction that ran on it has ended.
fn acknowledged(shared: &Cluster) -> u64 {
    let handle = &shared.dictionary;
    let dictionary = handle.snapshot();
    let fenced = dictionary.fenced_tables();
    if fenced.is_empty() || !shared.sessions.on_any(dictionary.version, &fenced) {
        handle
            .acknowledged
            .store(dictionary.version, Ordering::Relaxed);
        return dictionary.version;
    }
    handle.acknowledged.load(Ordering::Relaxed)
}

/// Whether this instance's sessions are still on tables its snapshot fences:
/// the refresh then polls at once again, to tell the fence soon.
pub(crate) fn acknowledging(shared: &Cluster) -> bool {
    shared.dictionary.acknowledged.load(Ordering::Relaxed) < shared.dictionary.snapshot().version
}

/// Whether a reload reads the dictionary when its version is the one loaded.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// The poll: a change bumps the version.
    WhenChanged,
    /// HSCALE REFRESH and after a change: also what was written by hand
    /// into the dictionary's tables, which bumps nothing.
    Always,
}

/// Reloads now, on a connection of its own (HSCALE REFRESH, after a change).
pub async fn reload(shared: &Cluster) -> Result<(), ProxyError> {
    let mut conn = own_connection(shared, shared.main).await?;
    reload_with(shared, &mut conn, Load::Always).await
}

/// A connection to the dictionary whose statements wait for no lock longer
/// than a second: the loops that keep this instance's lease go on rather
/// than wait for whoever holds one.
pub(crate) async fn impatient_connection(shared: &Cluster) -> Option<Box<BackendConn>> {
    let mut conn = own_connection(shared, shared.main).await.ok()?;
    store::exec(
        &mut conn,
        "SET SESSION innodb_lock_wait_timeout = 1, lock_wait_timeout = 1",
    )
    .await
    .ok()?;
    Some(conn)
}

/// How often instances poll the dictionary while a move fences.
pub(crate) const FENCE_POLL: Duration = Duration::from_millis(25);

/// How often an instance looks again whether its sessions left the tables a
/// fence holds.
pub(crate) const ACKNOWLEDGE_POLL: Duration = Duration::from_millis(5);

/// Removes this instance's heartbeat at shutdown, so that admin commands do
/// not wait for it, and its waiting sessions. Best effort: a heartbeat left
/// behind expires with its lease, and the sessions with it.
pub async fn leave(shared: &Cluster) {
    let handle = &shared.dictionary;
    if let Ok(mut conn) = own_connection(shared, shared.main).await {
        for table in ["instances", "waiting_sessions"] {
            let column = if table == "instances" {
                "id"
            } else {
                "instance"
            };
            let sql = format!(
                "DELETE FROM {}.{table} WHERE {column} = {}",
                store::ident(&handle.schema),
                store::text_literal(&handle.instance)
            );
            let _ = store::exec(&mut conn, &sql).await;
        }
    }
}

/// After a change at `version`: waits until every live instance has loaded
/// it, or until the lease is over (an instance that has not read the
/// dictionary for that long has stopped serving partitioned tables).
pub async fn wait_for_instances(
    shared: &Cluster,
    conn: &mut BackendConn,
    version: u64,
) -> Result<(), ProxyError> {
    let handle = &shared.dictionary;
    all_instances_loaded(shared, conn, version, handle.lease + handle.refresh)
        .await
        .map(drop)
}

/// Waits until every live instance has loaded `version`, this one
/// included, and acknowledged it (see `acknowledged`), for at most
/// `budget`: false if one has not (a move then lifts its fence rather than
/// go on without it).
pub async fn all_instances_loaded(
    shared: &Cluster,
    conn: &mut BackendConn,
    version: u64,
    budget: Duration,
) -> Result<bool, ProxyError> {
    let handle = &shared.dictionary;
    let deadline = Instant::now() + budget;
    loop {
        let behind = store::instances_behind(
            conn,
            &handle.schema,
            &handle.instance,
            version,
            handle.lease.as_millis() as u64,
        )
        .await?;
        if behind.is_empty() && acknowledged(shared) >= version {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            tracing::warn!(
                ?behind,
                version,
                "instances did not load the dictionary in time"
            );
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_that_ends_after_a_newer_one_does_not_take_its_snapshot_back() {
        let handle = DictionaryHandle::new(
            "hscale".into(),
            Duration::from_millis(1),
            Duration::from_secs(5),
        );
        let (early, late) = (handle.begin_read(), handle.begin_read());
        handle.install(Dictionary::new(7, Vec::new()), late);
        handle.install(Dictionary::new(6, Vec::new()), early);
        assert_eq!(handle.snapshot().version, 7, "the earlier read ended last");
        let generation = handle.snapshot().generation();
        handle.install(Dictionary::new(7, Vec::new()), early);
        assert_ne!(
            handle.snapshot().generation(),
            generation,
            "the same version read again (HSCALE REFRESH after a change by hand) is served"
        );
        handle.install(Dictionary::new(3, Vec::new()), handle.begin_read());
        assert_eq!(
            handle.snapshot().version,
            3,
            "an older version read after the install: the dictionary went back"
        );
        handle.install(Dictionary::new(8, Vec::new()), early);
        assert_eq!(
            handle.snapshot().version,
            8,
            "a newer version whenever read"
        );
    }

    #[test]
    fn a_snapshot_not_confirmed_within_the_lease_is_not_served() {
        let handle = DictionaryHandle::new(
            "hscale".into(),
            Duration::from_millis(1),
            Duration::from_millis(20),
        );
        assert!(!handle.fresh(), "never read");
        handle.confirmed(handle.now_ms());
        handle.check_lease();
        assert!(handle.fresh());
        std::thread::sleep(Duration::from_millis(30));
        assert!(
            !handle.fresh(),
            "lease over, before the refresh loop looks (a process stopped and woken)"
        );
        handle.check_lease();
        assert!(!handle.fresh(), "lease over");
        handle.confirmed(handle.now_ms());
        assert!(handle.fresh(), "read again");
    }
}

//! What the sessions of this instance know of each other: each one's
//! handle (its user, the backend threads serving it, the tables its
//! statement and transaction are on, its idle clock), and the registry
//! that KILL, the deadlock detector, idle closes and the moves' fences
//! read.

use std::collections::HashMap;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use hscale_planner::{Dictionary, PhysicalId};
use smallvec::SmallVec;
use tokio::sync::Notify;

/// MariaDB's default wait_timeout and interactive_timeout, until the main
/// backend has told its own.
pub const DEFAULT_WAIT_TIMEOUT_S: u64 = 28800;

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
    /// `read` gives the lease's freshness, then the snapshot
    /// (`DictionaryHandle::planned_by`).
    pub fn planning(
        &self,
        read: impl FnOnce() -> (bool, arc_swap::Guard<Arc<Dictionary>>),
    ) -> arc_swap::Guard<Arc<Dictionary>> {
        let before = self.planned.load(Ordering::Relaxed);
        self.planned.store(PLANNING, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let (fresh, dictionary) = read();
        self.fresh.store(fresh, Ordering::Relaxed);
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
        // The empty snapshot, version 0.
        let snapshots = arc_swap::ArcSwap::from_pointee(Dictionary::new(0, Vec::new()));
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
        on.planning(|| (true, snapshots.load()));
        assert!(sessions.on_any(5, &fenced));
        on.runs_on(&[q]);
        assert!(!sessions.on_any(5, &fenced), "known to go elsewhere");
        on.ended(true, &[q], &mut kept);
        assert_eq!(kept.as_slice(), [q]);
        assert!(
            !sessions.on_any(5, &fenced),
            "its transaction ran elsewhere"
        );
        on.planning(|| (true, snapshots.load()));
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
        on.planning(|| (true, snapshots.load()));
        on.waits();
        assert!(
            sessions.on_any(5, &fenced),
            "waiting, its transaction is still on p"
        );
        on.ended(false, &[], &mut kept);
        assert!(kept.is_empty());
        assert!(!sessions.on_any(5, &fenced), "the transaction ended");
        on.planning(|| (true, snapshots.load()));
        on.runs_on(&[]);
        assert!(!sessions.on_any(5, &fenced), "a statement on no partition");
    }
}

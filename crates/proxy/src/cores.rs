//! One single-threaded runtime per core (docs/ARCHITECTURE.md, "Cores").
//!
//! Each worker thread runs its own tokio runtime and serves the clients the
//! acceptor hands it: a session's client socket, its backend connections and
//! its tasks are polled by one thread and woken by that thread's reactor, so
//! a query crosses no core and no worker wakes another to steal work.
//! ProxySQL's threads work the same way; tokio's shared scheduler let any
//! worker poll any session, and the CPU per query grew with the workers
//! (issue 42).
//!
//! A client is placed on the worker serving the fewest, and moves only
//! between statements, when `Balance` finds its worker kept busy (a heavy
//! merge) while another is mostly idle: the session leaves its worker's
//! reactor with nothing of its own in flight (no transaction, no connection
//! held) and the other worker takes it up where it stopped, so the other
//! clients of a busy worker need not share it.

use std::cell::Cell;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::config::MoveClients;

thread_local! {
    static CORE: Cell<usize> = const { Cell::new(NO_WORKER) };
}

/// What `current` answers on a thread that is no worker (the acceptor's,
/// the dictionary's loops').
pub const NO_WORKER: usize = usize::MAX;

/// The worker the calling thread is.
pub fn current() -> usize {
    CORE.with(Cell::get)
}

/// Makes the calling thread worker `core` (`current`), as it starts.
pub(crate) fn enter(core: usize) {
    CORE.with(|c| c.set(core));
}

/// The workers to run: `threads`, or one per CPU this process may use (a
/// CPU quota or an affinity mask counts, as `available_parallelism` reads
/// them).
pub fn count(threads: usize) -> usize {
    match threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}

/// How often `balance_loop` looks at the workers' CPU time.
const BALANCE_PERIOD: Duration = Duration::from_millis(200);

/// A worker busier than this share of a CPU over a period, and by `GAP`
/// busier than another, gives that one a client: absolute, so that lightly
/// loaded workers keep their clients; relative, so that evenly loaded ones
/// do, however busy (on a machine shared with MariaDB no worker gets a
/// whole CPU).
const BUSY: f64 = 0.5;
const GAP: f64 = 0.3;

/// Where clients are and when one moves (`[proxy] move_clients`): the
/// acceptor places a client on the worker serving the fewest; every
/// `BALANCE_PERIOD` the CPU time of each worker's thread is read, and where
/// one was kept busy and another mostly idle, the busy one is asked to give
/// one client away. The first of its sessions to reach a statement boundary
/// free to move takes the request: the light, frequent ones, never a merge
/// in the middle of its rows.
pub struct Balance {
    mode: MoveClients,
    serving: Box<[Line<AtomicUsize>]>,
    /// Per worker: 0, or 1 + the worker one of its clients is asked to move to.
    requests: Box<[Line<AtomicUsize>]>,
    /// Per worker, its thread's CPU clock (`pthread_getcpuclockid`), once
    /// started; -1 before.
    clocks: Box<[AtomicI64]>,
    /// Clients moved between workers.
    pub moved: AtomicU64,
}

/// On a cache line of its own: each worker's counts are written by the
/// sessions on it, not passed between cores.
#[derive(Default)]
#[repr(align(128))]
struct Line<T>(T);

impl Balance {
    pub fn new(cores: usize, mode: MoveClients) -> Balance {
        Balance {
            mode,
            serving: (0..cores).map(|_| Line::default()).collect(),
            requests: (0..cores).map(|_| Line::default()).collect(),
            clocks: (0..cores).map(|_| AtomicI64::new(-1)).collect(),
            moved: AtomicU64::new(0),
        }
    }

    /// The worker serving the fewest clients.
    pub(crate) fn least_serving(&self) -> usize {
        (0..self.serving.len())
            .min_by_key(|&core| self.serving[core].0.load(Ordering::Relaxed))
            .unwrap_or(0)
    }

    pub(crate) fn arrived(&self, core: usize) {
        self.serving[core].0.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn left(&self, core: usize) {
        self.serving[core].0.fetch_sub(1, Ordering::Relaxed);
    }

    /// Clients each worker serves now.
    pub fn serving(&self) -> Vec<usize> {
        let serving = self.serving.iter();
        serving.map(|n| n.0.load(Ordering::Relaxed)).collect()
    }

    /// Called on worker `core`'s own thread as it starts.
    pub(crate) fn started(&self, core: usize) {
        let mut clock: libc::clockid_t = 0;
        // SAFETY: pthread_self() is the calling thread, alive; `clock` is
        // a valid place for the answer.
        if unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut clock) } == 0 {
            self.clocks[core].store(i64::from(clock), Ordering::Relaxed);
        }
    }

    /// Whether a client of the calling worker is asked to move: cheap, read
    /// at every statement boundary before the session looks whether it may.
    pub fn asked(&self) -> bool {
        let core = current();
        match self.mode {
            MoveClients::Never => false,
            MoveClients::Always => core != NO_WORKER && self.requests.len() > 1,
            MoveClients::ByLoad => self
                .requests
                .get(core)
                .is_some_and(|r| r.0.load(Ordering::Relaxed) != 0),
        }
    }

    /// Takes the calling worker's request, if no other session took it:
    /// the worker to move to.
    pub fn claim(&self) -> Option<usize> {
        let core = current();
        let workers = self.requests.len();
        match self.mode {
            MoveClients::Never => None,
            MoveClients::Always => (core != NO_WORKER && workers > 1).then(|| (core + 1) % workers),
            MoveClients::ByLoad => {
                let request = &self.requests.get(core)?.0;
                let to = request.swap(0, Ordering::Relaxed);
                to.checked_sub(1)
            }
        }
    }

    /// The CPU time each worker's thread has used, in nanoseconds (`None`
    /// where it is not known).
    fn cpu_times(&self) -> Vec<Option<u64>> {
        let read = |clock: i64| {
            let clock = libc::clockid_t::try_from(clock).ok()?;
            let mut now = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: `now` is a valid place for the answer; a clock of a
            // thread that ended makes the call fail, not misbehave.
            if unsafe { libc::clock_gettime(clock, &mut now) } != 0 {
                return None;
            }
            Some(now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64)
        };
        let clocks = self.clocks.iter();
        clocks.map(|c| read(c.load(Ordering::Relaxed))).collect()
    }

    /// Looks at the workers every `BALANCE_PERIOD`, asking a busy one to
    /// give a client to an idle one. Runs until aborted.
    pub async fn watch(&self) {
        if self.mode != MoveClients::ByLoad || self.requests.len() < 2 {
            return std::future::pending().await;
        }
        let mut tick = tokio::time::interval(BALANCE_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut before = (Instant::now(), self.cpu_times());
        loop {
            tick.tick().await;
            let now = (Instant::now(), self.cpu_times());
            let wall = now.0.duration_since(before.0).as_nanos().max(1) as f64;
            let busy: Vec<f64> = (now.1.iter().zip(&before.1))
                .map(|pair| match pair {
                    (Some(after), Some(earlier)) => after.saturating_sub(*earlier) as f64 / wall,
                    _ => 0.0,
                })
                .collect();
            before = now;
            for request in self.requests.iter() {
                request.0.store(0, Ordering::Relaxed);
            }
            if let Some((from, to)) = move_one(&busy, &self.serving()) {
                self.requests[from].0.store(to + 1, Ordering::Relaxed);
            }
        }
    }
}

/// The worker that should give a client away and the one to take it: the
/// busiest, if it was kept busy and serves more than one client, and the
/// idlest, if it was by far less busy.
fn move_one(busy: &[f64], serving: &[usize]) -> Option<(usize, usize)> {
    let by_load = |a: &usize, b: &usize| busy[*a].total_cmp(&busy[*b]);
    let from = (0..busy.len()).max_by(by_load)?;
    let to = (0..busy.len()).min_by(by_load)?;
    let moves = busy[from] >= BUSY && busy[from] - busy[to] >= GAP && serving[from] > 1;
    moves.then_some((from, to))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_worker_gives_a_client_to_an_idle_one() {
        assert_eq!(move_one(&[0.95, 0.1], &[5, 2]), Some((0, 1)));
        assert_eq!(move_one(&[0.2, 0.9, 0.5, 0.3], &[3, 3, 3, 3]), Some((1, 0)));
        // A merge's worker on two cores shared with MariaDB.
        assert_eq!(move_one(&[0.55, 0.2], &[3, 2]), Some((0, 1)));
    }

    #[test]
    fn evenly_loaded_or_lone_clients_stay() {
        // Every worker busy: no one is idle enough to take a client.
        assert_eq!(move_one(&[0.95, 0.8], &[32, 32]), None);
        // Every worker lightly loaded: no one is kept busy.
        assert_eq!(move_one(&[0.45, 0.05], &[4, 4]), None);
        // A busy worker's only client (a heavy merge) has nowhere better to be.
        assert_eq!(move_one(&[1.0, 0.0], &[1, 4]), None);
        assert_eq!(move_one(&[], &[]), None);
        assert_eq!(move_one(&[1.0], &[3]), None);
    }

    #[test]
    fn a_request_is_taken_once() {
        let balance = Balance::new(2, MoveClients::ByLoad);
        balance.requests[0].0.store(2, Ordering::Relaxed);
        CORE.with(|c| c.set(0));
        assert!(balance.asked());
        assert_eq!(balance.claim(), Some(1));
        assert!(!balance.asked());
        assert_eq!(balance.claim(), None);
        CORE.with(|c| c.set(NO_WORKER));
        assert!(!balance.asked());
        assert_eq!(balance.claim(), None);
    }
}

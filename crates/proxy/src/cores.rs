//! One single-threaded runtime per core (docs/ARCHITECTURE.md, "Cores").
//!
//! Each worker thread runs its own tokio runtime and serves the clients the
//! acceptor hands it, from their login to their last statement: a session's
//! client socket, its backend connections and its tasks are polled by one
//! thread and woken by that thread's reactor, so a query crosses no core
//! and no worker wakes another to steal work. ProxySQL's threads work the
//! same way; tokio's shared scheduler let any worker poll any session, and
//! the CPU per query grew with the workers (issue 42).

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};

use crate::shared::Shared;

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

/// The workers to run: `threads`, or one per CPU this process may use (a
/// CPU quota or an affinity mask counts, as `available_parallelism` reads
/// them).
pub fn count(threads: usize) -> usize {
    match threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}

/// A client accepted, with its place under `[proxy] max_connections`.
struct Arrival {
    socket: std::net::TcpStream,
    slot: OwnedSemaphorePermit,
}

/// The running workers; `stop` ends them and every task they run.
pub struct Workers {
    inboxes: Vec<mpsc::UnboundedSender<Arrival>>,
    /// Clients each worker serves now: a new one goes to the least busy.
    serving: Arc<[AtomicUsize]>,
    stopped: Vec<oneshot::Receiver<()>>,
}

impl Workers {
    /// Starts `shared.cores` workers, each serving the clients it is handed.
    pub fn start(shared: &Arc<Shared>) -> std::io::Result<Workers> {
        let cores = shared.cores;
        let serving: Arc<[AtomicUsize]> = (0..cores).map(|_| AtomicUsize::new(0)).collect();
        let mut workers = Workers {
            inboxes: Vec::with_capacity(cores),
            serving: serving.clone(),
            stopped: Vec::with_capacity(cores),
        };
        for core in 0..cores {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let (inbox, mut arrivals) = mpsc::unbounded_channel::<Arrival>();
            let (done, stopped) = oneshot::channel();
            let (shared, serving) = (shared.clone(), serving.clone());
            std::thread::Builder::new()
                .name(format!("hscale-core-{core}"))
                .spawn(move || {
                    CORE.with(|c| c.set(core));
                    runtime.block_on(async {
                        while let Some(Arrival { socket, slot }) = arrivals.recv().await {
                            let socket = match tokio::net::TcpStream::from_std(socket) {
                                Ok(socket) => socket,
                                Err(e) => {
                                    tracing::warn!("cannot serve a client on core {core}: {e}");
                                    serving[core].fetch_sub(1, Ordering::Relaxed);
                                    continue;
                                }
                            };
                            let (shared, serving) = (shared.clone(), serving.clone());
                            tokio::spawn(async move {
                                crate::server::serve_client(shared, socket).await;
                                drop(slot);
                                serving[core].fetch_sub(1, Ordering::Relaxed);
                            });
                        }
                    });
                    // Ends every session and task of this core, as a stopped
                    // process would.
                    drop(runtime);
                    let _ = done.send(());
                })?;
            workers.inboxes.push(inbox);
            workers.stopped.push(stopped);
        }
        Ok(workers)
    }

    /// Hands a client to the worker serving the fewest.
    pub fn hand(&self, socket: tokio::net::TcpStream, slot: OwnedSemaphorePermit) {
        let core = (0..self.serving.len())
            .min_by_key(|&core| self.serving[core].load(Ordering::Relaxed))
            .unwrap_or(0);
        let socket = match socket.into_std() {
            Ok(socket) => socket,
            Err(e) => {
                tracing::warn!("cannot hand a client to a worker: {e}");
                return;
            }
        };
        self.serving[core].fetch_add(1, Ordering::Relaxed);
        if self.inboxes[core].send(Arrival { socket, slot }).is_err() {
            self.serving[core].fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Stops every worker and waits until each has dropped its runtime.
    pub async fn stop(self) {
        drop(self.inboxes);
        for stopped in self.stopped {
            let _ = stopped.await;
        }
    }
}

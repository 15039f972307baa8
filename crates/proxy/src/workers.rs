//! The workers (docs/ARCHITECTURE.md, "Cores"): one thread and one
//! single-threaded runtime per core, each serving the clients the acceptor
//! hands it and those that move to it between statements (`cores::Balance`
//! says where).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};

use crate::session::{Served, Session};
use crate::shared::{Counters, Shared};

/// A client for a worker, with its place under `[proxy] max_connections`.
enum Arrival {
    /// Just accepted.
    Accepted {
        socket: std::net::TcpStream,
        slot: OwnedSemaphorePermit,
    },
    /// Logged in on another worker, its socket detached (`ClientSocket::Moving`).
    Moved {
        session: Box<Session>,
        slot: OwnedSemaphorePermit,
    },
}

/// The running workers; `stop` ends them and every task they run.
pub struct Workers {
    shared: Arc<Shared>,
    inboxes: Vec<mpsc::UnboundedSender<Arrival>>,
    stopped: Vec<oneshot::Receiver<()>>,
}

impl Workers {
    /// Starts `shared.cores` workers, each serving the clients it is handed.
    pub fn start(shared: &Arc<Shared>) -> std::io::Result<Workers> {
        let cores = shared.cores;
        let (inboxes, arrivals): (Vec<_>, Vec<_>) =
            (0..cores).map(|_| mpsc::unbounded_channel()).unzip();
        // A worker hands a moving client to another's inbox; held weakly,
        // so that `stop` closes every inbox by dropping `inboxes`.
        let exits: Arc<[mpsc::WeakUnboundedSender<Arrival>]> =
            inboxes.iter().map(|inbox| inbox.downgrade()).collect();
        let mut workers = Workers {
            shared: shared.clone(),
            inboxes,
            stopped: Vec::with_capacity(cores),
        };
        for (core, mut arrivals) in arrivals.into_iter().enumerate() {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let (done, stopped) = oneshot::channel();
            let (shared, exits) = (shared.clone(), exits.clone());
            std::thread::Builder::new()
                .name(format!("hscale-core-{core}"))
                .spawn(move || {
                    crate::cores::enter(core);
                    shared.balance.started(core);
                    runtime.block_on(async {
                        while let Some(arrival) = arrivals.recv().await {
                            tokio::spawn(serve(shared.clone(), core, arrival, exits.clone()));
                        }
                    });
                    // Ends every session and task of this core, as a stopped
                    // process would.
                    drop(runtime);
                    let _ = done.send(());
                })?;
            workers.stopped.push(stopped);
        }
        Ok(workers)
    }

    /// Hands a client to the worker serving the fewest.
    pub fn hand(&self, socket: tokio::net::TcpStream, slot: OwnedSemaphorePermit) {
        let balance = &self.shared.balance;
        let core = balance.least_serving();
        let socket = match socket.into_std() {
            Ok(socket) => socket,
            Err(e) => {
                tracing::warn!("cannot hand a client to a worker: {e}");
                return;
            }
        };
        balance.arrived(core);
        if self.inboxes[core]
            .send(Arrival::Accepted { socket, slot })
            .is_err()
        {
            balance.left(core);
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

/// A client's time on worker `core`: to its end, or until it moves on.
async fn serve(
    shared: Arc<Shared>,
    core: usize,
    arrival: Arrival,
    exits: Arc<[mpsc::WeakUnboundedSender<Arrival>]>,
) {
    let (served, slot) = match arrival {
        Arrival::Accepted { socket, slot } => {
            let socket = match tokio::net::TcpStream::from_std(socket) {
                Ok(socket) => socket,
                Err(e) => {
                    tracing::warn!("cannot serve a client on core {core}: {e}");
                    shared.balance.left(core);
                    return;
                }
            };
            (serve_client(shared.clone(), socket).await, slot)
        }
        Arrival::Moved { session, slot } => (Session::resume(session).await, slot),
    };
    let balance = &shared.balance;
    balance.left(core);
    match served {
        Served::Ended => client_ended(&shared, slot),
        Served::Moving(session, to) => {
            balance.arrived(to);
            balance.moved.fetch_add(1, Ordering::Relaxed);
            let inbox = exits[to].upgrade();
            let sent = inbox.map(|inbox| inbox.send(Arrival::Moved { session, slot }));
            if !matches!(sent, Some(Ok(()))) {
                // Stopping: the session ends with the process.
                balance.left(to);
            }
        }
    }
}

/// A client's life on the worker it was handed to: to its end, or until it
/// moves to another (`cores::Balance`).
pub(crate) async fn serve_client(shared: Arc<Shared>, socket: TcpStream) -> Served {
    Counters::add(&shared.counters.connections, 1);
    Counters::add(&shared.counters.clients, 1);
    Session::serve(shared.clone(), socket).await
}

/// A client's session ended, on whichever worker: its place under
/// `max_connections` is free.
pub(crate) fn client_ended(shared: &Shared, slot: tokio::sync::OwnedSemaphorePermit) {
    drop(slot);
    shared
        .counters
        .clients
        .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
}

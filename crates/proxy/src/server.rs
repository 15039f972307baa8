//! The client-facing listener: a cap on connections, each client handed to
//! a worker (`cores`) that runs it as a task, and a shutdown signal. `run` lets tests start the whole proxy in-process on
//! 127.0.0.1:0.

use std::future::Future;
use std::sync::Arc;

use hscale_wire::packets::ErrorPacket;
use hscale_wire::stream::PacketStream;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::error::ProxyError;
use crate::shared::Shared;
use crate::workers::Workers;

pub struct Server {
    shared: Arc<Shared>,
    listener: TcpListener,
    client_slots: Arc<Semaphore>,
    workers: Workers,
}

impl Server {
    pub fn new(listener: TcpListener, shared: Arc<Shared>, workers: Workers) -> Server {
        let client_slots = Arc::new(Semaphore::new(shared.max_connections));
        Server {
            shared,
            listener,
            client_slots,
            workers,
        }
    }

    async fn accept_loop(&self) {
        loop {
            let socket = match self.listener.accept().await {
                Ok((socket, _)) => socket,
                Err(e) => {
                    // Out of file descriptors and the like: wait and go on serving.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(slot) = self.client_slots.clone().try_acquire_owned() else {
                tokio::spawn(refuse(socket, self.shared.max_connections));
                continue;
            };
            self.workers.hand(socket, slot);
        }
    }
}

/// Binds the client listener. Its accept queue is as long as the connection cap
/// (the kernel clips it to net.core.somaxconn): a burst of clients connecting at
/// once must queue, not be reset, as MariaDB's `back_log` does.
pub fn bind(address: &str, max_connections: usize) -> std::io::Result<TcpListener> {
    let address: std::net::SocketAddr = address
        .parse()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let socket = if address.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(max_connections.clamp(128, 65_535) as u32)
}

/// Two-phase commit recovery looks for left branches at most this often.
const RECOVERY_PERIOD_MIN: std::time::Duration = std::time::Duration::from_millis(500);

/// Serves clients on `listener` until `shutdown` completes, with the
/// dictionary loaded first and refreshed all along: the clients on
/// `shared.cores` workers of their own, the dictionary's loops on the
/// caller's runtime. Returns once every worker stopped, or at once if the
/// workers cannot start.
pub async fn run(
    listener: TcpListener,
    shared: Arc<Shared>,
    shutdown: impl Future,
) -> std::io::Result<()> {
    shared.set_background();
    let workers = Workers::start(&shared)?;
    if let Err(e) = crate::upkeep::open(&shared).await {
        tracing::warn!("cannot open the partition dictionary: {e}; partitioned tables are not served until it can be read");
    }
    let refresh = tokio::spawn(crate::upkeep::refresh_loop(shared.clone()));
    let sweep = tokio::spawn(crate::upkeep::sweep_loop(shared.clone()));
    let recovery = tokio::spawn(crate::xa::recovery_loop(
        shared.cluster.clone(),
        shared.dictionary.refresh.max(RECOVERY_PERIOD_MIN),
    ));
    let idle = tokio::spawn(close_idle_sessions(shared.clone()));
    let deadlocks = tokio::spawn(crate::deadlocks::detect_loop(shared.clone()));
    let monitors: Vec<_> = shared
        .pools
        .iter()
        .map(|pool| {
            let main = shared.main_pool().clone();
            tokio::spawn(crate::backend::replicas::monitor(
                pool.clone(),
                shared.monitor,
                main,
            ))
        })
        .collect();
    let balancing = shared.clone();
    let balance = tokio::spawn(async move { balancing.balance.watch().await });
    let server = Server::new(listener, shared.clone(), workers);
    tokio::select! {
        _ = server.accept_loop() => {}
        _ = shutdown => tracing::info!("shutting down"),
    }
    refresh.abort();
    sweep.abort();
    recovery.abort();
    idle.abort();
    deadlocks.abort();
    balance.abort();
    monitors.iter().for_each(|monitor| monitor.abort());
    server.workers.stop().await;
    crate::dictionary::leave(&shared).await;
    Ok(())
}

/// wait_timeout is in seconds: a look every second at who has been idle
/// costs a session nothing per command but a load and two stores, where a
/// timer per read would cost a timer wheel insertion and removal.
async fn close_idle_sessions(shared: Arc<Shared>) {
    let period = std::time::Duration::from_millis(crate::shared::IDLE_TICK_MS);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        shared.idle_tick();
    }
}

/// Like MySQL: a client over the limit gets error 1040 instead of a greeting.
async fn refuse(socket: TcpStream, max: usize) {
    let (packet, _) = ProxyError::TooManyConnections { max }.to_client();
    let packet = packet.unwrap_or_else(|| ErrorPacket::new(1040, "08004", "Too many connections"));
    let mut payload = Vec::new();
    packet.write(&mut payload);
    let mut stream = PacketStream::new(socket, 1024);
    let _ = stream.send_packet(0, &payload).await;
}

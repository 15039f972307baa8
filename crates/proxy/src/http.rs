//! The optional HTTP listener (`[proxy] http`): `/metrics` in Prometheus text
//! format and `/status` as plain text. Answered from memory only, never from a
//! backend, so it stays cheap and works while backends are down.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::shared::Shared;

const MAX_REQUEST: usize = 8 * 1024;

/// Serves until the task is dropped.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((socket, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), answer(socket, &shared)).await;
        });
    }
}

async fn answer(mut socket: TcpStream, shared: &Shared) -> std::io::Result<()> {
    let mut request = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < MAX_REQUEST {
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        request.extend_from_slice(&chunk[..n]);
    }
    let line = request.split(|b| *b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|b| *b == b' ');
    let (method, path) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let (status, body) = match (method, path) {
        (b"GET", b"/metrics") => ("200 OK", metrics(shared)),
        (b"GET", b"/status") => ("200 OK", shared.statistics() + "\n"),
        (b"GET", _) => (
            "404 Not Found",
            "not found: try /metrics or /status\n".to_string(),
        ),
        _ => ("405 Method Not Allowed", "only GET\n".to_string()),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(response.as_bytes()).await?;
    socket.shutdown().await
}

/// The Prometheus exposition of hscale's counters.
pub fn metrics(shared: &Shared) -> String {
    let mut out = Exposition::default();
    clients(shared, &mut out);
    hosts(shared, &mut out);
    two_phase(shared, &mut out);
    pools(shared, &mut out);
    out.metric(
        "hscale_uptime_seconds",
        "gauge",
        "Seconds since start.",
        plain(shared.started.elapsed().as_secs()),
    );
    out.0
}

/// Metric families in Prometheus' text format, in the order written.
#[derive(Default)]
struct Exposition(String);

impl Exposition {
    fn metric(&mut self, name: &str, kind: &str, help: &str, samples: Vec<(String, u64)>) {
        self.0
            .push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for (labels, value) in samples {
            self.0.push_str(&format!("{name}{labels} {value}\n"));
        }
    }
}

/// One sample without labels.
fn plain(value: u64) -> Vec<(String, u64)> {
    vec![(String::new(), value)]
}

/// Clients, workers and what their statements met.
fn clients(shared: &Shared, out: &mut Exposition) {
    let c = &shared.counters;
    out.metric(
        "hscale_questions_total",
        "counter",
        "Commands received from clients.",
        plain(c.questions.total()),
    );
    out.metric(
        "hscale_client_connections_total",
        "counter",
        "Client connections accepted.",
        plain(c.connections.load(Ordering::Relaxed)),
    );
    out.metric(
        "hscale_clients",
        "gauge",
        "Client connections open now.",
        plain(c.clients.load(Ordering::Relaxed)),
    );
    let serving = shared.balance.serving().into_iter().enumerate();
    out.metric(
        "hscale_worker_clients",
        "gauge",
        "Client connections each worker thread serves now.",
        serving
            .map(|(worker, n)| (format!("{{worker=\"{worker}\"}}"), n as u64))
            .collect(),
    );
    out.metric(
        "hscale_clients_moved_total",
        "counter",
        "Clients moved from a busy worker thread to an idle one between statements.",
        plain(shared.balance.moved.load(Ordering::Relaxed)),
    );
    out.metric(
        "hscale_statements_waited_total",
        "counter",
        "Statements that waited for a move's fence or a lock on their table.",
        plain(c.waited.load(Ordering::Relaxed)),
    );
    out.metric(
        "hscale_lookup_joins_total",
        "counter",
        "SELECTs the partitions could not answer alone, answered by a lookup join.",
        plain(c.lookup_joins.load(Ordering::Relaxed)),
    );
    out.metric(
        "hscale_copied_statements_total",
        "counter",
        "SELECTs the partitions could not answer alone, answered from copies of their tables.",
        plain(c.copied.load(Ordering::Relaxed)),
    );
    out.metric(
        "hscale_deadlocks_total",
        "counter",
        "Transactions ended with error 1213: their lock waits formed a cycle through several backends.",
        plain(c.deadlocks.load(Ordering::Relaxed)),
    );
}

/// Each backend host as the monitor last saw it.
fn hosts(shared: &Shared, out: &mut Exposition) {
    let hosts: Vec<_> = shared
        .pools
        .iter()
        .flat_map(|pool| pool.replicas().view(pool.id()))
        .collect();
    let label = |h: &crate::backend::replicas::HostView| {
        format!(
            "{{backend=\"{}\",host=\"{}\",role=\"{}\"}}",
            h.backend, h.address, h.role
        )
    };
    out.metric(
        "hscale_backend_host_up",
        "gauge",
        "Whether the monitor's last check reached the backend host (1) or not (0), with its role.",
        hosts
            .iter()
            .map(|h| (label(h), u64::from(h.health.reachable)))
            .collect(),
    );
    out.metric(
        "hscale_backend_host_lag_ms",
        "gauge",
        "How far a replica's applied transactions trail its source (Seconds_Behind_Master), in ms.",
        hosts
            .iter()
            .filter_map(|h| {
                let lag = h.health.replication.as_ref()?.lag_s?;
                Some((label(h), lag * 1000))
            })
            .collect(),
    );
}

/// Two-phase commit and its recovery.
fn two_phase(shared: &Shared, out: &mut Exposition) {
    let xa = &shared.xa;
    out.metric(
        "hscale_xa_committed_total",
        "counter",
        "Writes over several backends committed in two phases.",
        plain(xa.committed.load(Ordering::Relaxed)),
    );
    out.metric(
        "hscale_xa_recovered_total",
        "counter",
        "Prepared branches that recovery committed or rolled back.",
        plain(xa.recovered.load(Ordering::Relaxed)),
    );
    out.metric(
        "hscale_xa_unresolved_branches",
        "gauge",
        "Prepared branches the last recovery pass left: their owner is at work, or a backend did not answer.",
        plain(xa.unresolved.load(Ordering::Relaxed)),
    );
}

/// Each backend's connections and idle lists.
fn pools(shared: &Shared, out: &mut Exposition) {
    let per_backend = |value: &dyn Fn(&crate::backend::Pool) -> u64| {
        shared
            .pools
            .iter()
            .map(|p| (format!("{{backend=\"{}\"}}", p.id()), value(p)))
            .collect()
    };
    out.metric(
        "hscale_backend_connections",
        "gauge",
        "Backend connections open now, idle or in use.",
        per_backend(&|p| p.open_connections() as u64),
    );
    out.metric(
        "hscale_pool_lock_acquisitions_total",
        "counter",
        "Times a worker locked one of a backend's idle lists (a take, a return, a look).",
        per_backend(&|p| p.lock_acquisitions()),
    );
    out.metric(
        "hscale_pool_borrowed_total",
        "counter",
        "Idle backend connections a worker borrowed from another worker's list.",
        per_backend(&|p| p.borrowed()),
    );
}

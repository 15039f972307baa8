//! Connections to the MySQL/MariaDB servers behind hscale, and their pools.

pub mod accounts;
mod conn;
mod pool;
pub mod replicas;
mod statements;
mod stream;

pub use conn::{BackendConn, ConnKey, ConnMark, Rows, MAX_PACKET, UNKNOWN_ID};
pub use pool::{Bucket, Lease, Pool};
pub use statements::Statements;
pub use stream::BackendStream;

use hscale_wire::packets::ErrorPacket;
use hscale_wire::WireError;

/// What can go wrong with a backend, named by its id and address.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("backend {backend} ({address}) is unreachable: {source}")]
    Connect {
        backend: u32,
        address: String,
        source: std::io::Error,
    },
    #[error("backend {backend} ({address}) did not answer within {timeout_ms} ms")]
    ConnectTimeout {
        backend: u32,
        address: String,
        timeout_ms: u64,
    },
    #[error("backend {backend} refused hscale's login: {}", error.message)]
    Login { backend: u32, error: ErrorPacket },
    #[error("backend {backend}: TLS: {reason}")]
    Tls { backend: u32, reason: String },
    #[error("no password is known yet for user '{user}''s account on backend {backend}: give backend_password, or let the user log in first")]
    NoSecret { backend: u32, user: String },
    #[error("backend {backend} asks for auth plugin '{plugin}', which hscale does not speak yet")]
    AuthPlugin { backend: u32, plugin: String },
    #[error("connection to backend {backend} lost: {source}")]
    Lost { backend: u32, source: WireError },
    #[error(
        "no free connection to backend {backend} within {waited_ms} ms (max_connections = {max})"
    )]
    PoolExhausted {
        backend: u32,
        waited_ms: u64,
        max: usize,
    },
    #[error("backend {backend} has no writer (no reachable host with read_only off) after {waited_ms} ms: a failover did not end, or its hosts are down")]
    NoWriter { backend: u32, waited_ms: u64 },
    #[error("backend {backend} has two writers ({}: read_only is off on each); writes are refused until one is read-only", hosts.join(" and "))]
    SplitBrain { backend: u32, hosts: Vec<String> },
    #[error("backend {backend}'s writer changed while this session held a connection to the old one (a failover or switchover): what it ran there since its last commit is not on the new writer")]
    WriterChanged { backend: u32 },
    #[error("backend {backend} refused hscale's own query: {message}")]
    Refused { backend: u32, message: String },
}

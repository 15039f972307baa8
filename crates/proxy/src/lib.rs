//! hscale, the proxy: configuration, the client-facing server, sessions, backend
//! pools, and the statement execution between them.

pub mod admin;
pub mod backend;
pub mod config;
pub mod cores;
pub mod deadlocks;
pub mod dictionary;
pub mod error;
pub mod exec;
pub mod failpoint;
pub mod http;
pub mod logging;
pub mod mariadb;
pub mod offline;
pub mod online;
pub mod playground;
pub mod server;
pub mod session;
pub mod sessions;
pub mod sha2_auth;
pub mod shared;
pub mod spool;
pub mod tls;
pub mod upkeep;
pub mod workers;
pub mod xa;

pub use server::{run, Server};
pub use shared::Shared;

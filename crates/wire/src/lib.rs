//! The MySQL wire protocol as hscale speaks it: frames, the packets hscale writes
//! itself, password scrambles, and a scanner that finds where a forwarded response
//! ends without decoding its rows. Sans-IO except `stream`, the thin tokio layer.

pub mod auth;
pub mod command;
pub mod error;
pub mod execute;
pub mod frame;
pub mod packets;
pub mod resultset;
pub mod scan;
pub mod stream;

pub use error::WireError;
pub use mysql_common::constants::{CapabilityFlags, Command, StatusFlags};

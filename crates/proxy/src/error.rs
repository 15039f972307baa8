//! The proxy's errors, and the one place that turns each into what the client
//! sees: a MySQL error code, SQLSTATE and message, and what becomes of the
//! connection.

use hscale_wire::packets::ErrorPacket;
use hscale_wire::WireError;

use hscale_planner::{Refusal, TableName};

use crate::admin::error::AdminError;
use crate::backend::BackendError;

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The client's own connection failed or sent something unreadable.
    #[error("client connection: {0}")]
    Client(#[from] WireError),
    #[error("access denied for user '{user}'")]
    AccessDenied { user: String, used_password: bool },
    #[error("client asked for auth plugin '{plugin}' after a switch")]
    AuthPlugin { plugin: String },
    #[error("client wants TLS, which this listener does not offer")]
    TlsRequired,
    #[error("client did not switch to TLS, which require_tls asks for")]
    InsecureTransport,
    #[error("too many connections (max_connections = {max})")]
    TooManyConnections { max: usize },
    #[error("unknown command {code:#04x}")]
    UnknownCommand { code: u8 },
    #[error("unknown prepared statement handler ({stmt_id}) given to {command}")]
    UnknownStatement { stmt_id: u32, command: &'static str },
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A backend error that happened after part of the answer was sent.
    #[error("{source} (after part of the answer was sent)")]
    BackendMidAnswer { source: BackendError },
    #[error("{what} is not supported by hscale")]
    NotSupported { what: &'static str },
    #[error("unknown thread id {id}")]
    NoSuchThread { id: u64 },
    #[error("not the owner of thread {id}")]
    KillDenied { id: u64 },
    #[error("this connection was killed")]
    ConnectionKilled,
    /// KILL QUERY of the client's own connection interrupts the KILL itself.
    #[error("the statement was interrupted")]
    QueryInterrupted,
    /// The deadlock detector ended the transaction: its lock waits formed a
    /// cycle through several backends.
    #[error("a deadlock through several backends ended the transaction")]
    Deadlock,
    #[error("the statement reads the one before it, whose backend connection has since served another client")]
    PreviousStatementElsewhere,
    #[error("the statement reads the one before it, which ran on several partitions")]
    PreviousStatementScattered,
    /// The server refused a command hscale sent for the client (state replay).
    #[error("backend refused: {}", .0.message)]
    Refused(ErrorPacket),
    /// A statement hscale cannot run correctly on partitioned tables.
    #[error("{}", unroutable_message(.0))]
    Unroutable(Refusal),
    /// A statement the transaction in progress cannot take.
    #[error("{}", transaction_message(.0))]
    Transaction(hscale_transaction::Refused),
    #[error("hscale: table {table} is held by {holder}; waited {waited_ms} ms")]
    LockWaitTimeout {
        table: TableName,
        /// What holds it: the move's job where one runs.
        holder: String,
        waited_ms: u64,
    },
    #[error("hscale: the partition dictionary could not be read within its lease; partitioned tables are not served until it can")]
    DictionaryStale,
    #[error("hscale: the dictionary names backend {backend}, which is not configured")]
    UnknownBackend { backend: u32 },
    #[error("hscale: the dictionary entry of {table} is damaged: {what}")]
    DictionaryCorrupt { table: TableName, what: String },
    #[error("Access denied for user '{user}': HSCALE commands need admin = true")]
    AdminDenied { user: String },
    /// A user without `admin` named hscale's schema, a default or partition
    /// table, or one of hscale's user locks.
    #[error("hscale: access denied for user '{user}' to hscale's dictionary, the default and partition tables of partitioned tables, and hscale's own locks: use the partitioned table")]
    Guarded { user: String },
    #[error("hscale: {0}")]
    Admin(#[from] AdminError),
    /// `[scans] timeout_ms` ended a statement on several partitions.
    #[error("Query execution was interrupted (hscale's [scans] timeout_ms = {ms} exceeded)")]
    ScanTimeout { ms: u64 },
    /// A merge outgrew `[scans] spill_bytes`, or its temporary files failed.
    #[error("hscale: {0}")]
    MergeSpill(hscale_merge::MergeError),
    /// The lines of a LOAD DATA outgrew `[scans] spill_bytes`, or their
    /// temporary files failed.
    #[error("hscale: LOAD DATA: {0}")]
    LoadSpill(#[from] crate::spool::SpoolError),
    /// A write to a reference table changed its copies by different numbers
    /// of rows: rolled back, as the copies no longer agree.
    #[error("hscale: the copies of a reference table differ: the write changed {affected:?} rows on its backends and was rolled back; compare the copies")]
    CopiesDiffer { affected: Vec<u64> },
    /// The rows copied for a statement answered from copies of its tables
    /// outgrew `[scans] spill_bytes`, or their temporary files failed.
    #[error("hscale: copying the rows a statement reads: {0}")]
    CopySpill(crate::spool::SpoolError),
    /// A partition move cannot start or go on.
    #[error("hscale: move: {0}")]
    Move(#[from] hscale_moves::MoveError),
}

fn unroutable_message(refusal: &Refusal) -> String {
    match &refusal.table {
        Some(table) => format!(
            "This version of hscale doesn't yet support '{}' on partitioned table {table}",
            refusal.reason
        ),
        None => format!(
            "This version of hscale doesn't yet support '{}'",
            refusal.reason
        ),
    }
}

fn transaction_message(refused: &hscale_transaction::Refused) -> String {
    match refused {
        hscale_transaction::Refused::SecondWriter { .. } => format!("hscale: {refused}"),
        _ => format!("This version of hscale doesn't yet support '{refused}'"),
    }
}

/// What happens to the client connection after an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Send the error; the connection goes on.
    Reply,
    /// Send the error, then close.
    ReplyAndClose,
    /// Close without a word: the protocol state is unknown.
    Close,
}

const ER_CON_COUNT_ERROR: u16 = 1040;
const ER_ACCESS_DENIED_ERROR: u16 = 1045;
const ER_UNKNOWN_COM_ERROR: u16 = 1047;
const ER_UNKNOWN_STMT_HANDLER: u16 = 1243;
const ER_NOT_SUPPORTED_AUTH_MODE: u16 = 1251;
const ER_CONNECT_TO_FOREIGN_DATA_SOURCE: u16 = 1429;
const ER_OPTION_PREVENTS_STATEMENT: u16 = 1290;
const ER_NO_SUCH_THREAD: u16 = 1094;
const ER_KILL_DENIED_ERROR: u16 = 1095;
const ER_NOT_SUPPORTED_YET: u16 = 1235;
const ER_CONNECTION_KILLED: u16 = 1927;
const ER_QUERY_INTERRUPTED: u16 = 1317;
const ER_UNKNOWN_ERROR: u16 = 1105;
const ER_SPECIFIC_ACCESS_DENIED: u16 = 1227;
const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;
const ER_LOCK_DEADLOCK: u16 = 1213;
const ER_NO_DB_ERROR: u16 = 1046;
const ER_NO_SUCH_TABLE: u16 = 1146;
const ER_TABLE_EXISTS_ERROR: u16 = 1050;
const ER_BAD_FIELD_ERROR: u16 = 1054;
const ER_WRONG_ARGUMENTS: u16 = 1210;
const ER_PARSE_ERROR: u16 = 1064;
const CR_SERVER_LOST: u16 = 2013;
const ER_STATEMENT_TIMEOUT: u16 = 1969;
const ER_OUT_OF_SORTMEMORY: u16 = 1038;
const ER_TABLEACCESS_DENIED_ERROR: u16 = 1142;
const ER_NET_PACKET_TOO_LARGE: u16 = 1153;
const ER_SECURE_TRANSPORT_REQUIRED: u16 = 3159;

impl ProxyError {
    pub fn to_client(&self) -> (Option<ErrorPacket>, Disposition) {
        use Disposition::*;
        let reply = |code, state, message: String| Some(ErrorPacket::new(code, state, message));
        match self {
            // As MariaDB answers a command over its max_allowed_packet.
            ProxyError::Client(WireError::PacketTooLarge { .. }) => (
                reply(
                    ER_NET_PACKET_TOO_LARGE,
                    "08S01",
                    "Got a packet bigger than 'max_allowed_packet' bytes".into(),
                ),
                ReplyAndClose,
            ),
            ProxyError::Client(_) => (None, Close),
            ProxyError::AccessDenied { user, used_password } => (
                reply(
                    ER_ACCESS_DENIED_ERROR,
                    "28000",
                    format!(
                        "Access denied for user '{user}'@'hscale' (using password: {})",
                        if *used_password { "YES" } else { "NO" }
                    ),
                ),
                ReplyAndClose,
            ),
            ProxyError::AuthPlugin { plugin } => (
                reply(
                    ER_NOT_SUPPORTED_AUTH_MODE,
                    "08004",
                    format!("Client does not support authentication protocol requested by server; hscale speaks mysql_native_password, the client answered with {plugin}"),
                ),
                ReplyAndClose,
            ),
            ProxyError::TlsRequired => (
                reply(ER_NOT_SUPPORTED_AUTH_MODE, "08004", "hscale does not offer TLS on this listener: it has no tls_cert".into()),
                ReplyAndClose,
            ),
            ProxyError::InsecureTransport => (
                reply(
                    ER_SECURE_TRANSPORT_REQUIRED,
                    "08004",
                    "Connections using insecure transport are prohibited while hscale's require_tls is on".into(),
                ),
                ReplyAndClose,
            ),
            ProxyError::TooManyConnections { .. } => (reply(ER_CON_COUNT_ERROR, "08004", "Too many connections".into()), ReplyAndClose),
            ProxyError::UnknownCommand { .. } => (reply(ER_UNKNOWN_COM_ERROR, "08S01", "Unknown command".into()), Reply),
            ProxyError::UnknownStatement { stmt_id, command } => (
                reply(
                    ER_UNKNOWN_STMT_HANDLER,
                    "HY000",
                    format!("Unknown prepared statement handler ({stmt_id}) given to {command}"),
                ),
                Reply,
            ),
            ProxyError::Backend(e) => match e {
                BackendError::Lost { .. } | BackendError::WriterChanged { .. } => (reply(CR_SERVER_LOST, "HY000", format!("hscale: {e}")), Reply),
                BackendError::PoolExhausted { .. } => (reply(ER_CON_COUNT_ERROR, "08004", format!("hscale: {e}")), Reply),
                BackendError::Connect { .. }
                | BackendError::ConnectTimeout { .. }
                | BackendError::Login { .. }
                | BackendError::NoSecret { .. }
                | BackendError::Tls { .. }
                | BackendError::AuthPlugin { .. }
                | BackendError::NoWriter { .. }
                | BackendError::Refused { .. } => (reply(ER_CONNECT_TO_FOREIGN_DATA_SOURCE, "HY000", format!("hscale: {e}")), Reply),
                // As a read-only server answers a write.
                BackendError::SplitBrain { .. } => (reply(ER_OPTION_PREVENTS_STATEMENT, "HY000", format!("hscale: {e}")), Reply),
            },
            ProxyError::BackendMidAnswer { .. } => (None, Close),
            ProxyError::NotSupported { what } => (
                reply(ER_NOT_SUPPORTED_YET, "42000", format!("This version of hscale doesn't yet support '{what}'")),
                Reply,
            ),
            ProxyError::NoSuchThread { id } => (reply(ER_NO_SUCH_THREAD, "HY000", format!("Unknown thread id: {id}")), Reply),
            ProxyError::KillDenied { id } => (reply(ER_KILL_DENIED_ERROR, "HY000", format!("You are not owner of thread {id}")), Reply),
            ProxyError::ConnectionKilled => (reply(ER_CONNECTION_KILLED, "70100", "Connection was killed".into()), ReplyAndClose),
            ProxyError::QueryInterrupted => (reply(ER_QUERY_INTERRUPTED, "70100", "Query execution was interrupted".into()), Reply),
            // MariaDB's words: applications match them to retry.
            ProxyError::Deadlock => (reply(ER_LOCK_DEADLOCK, "40001", "Deadlock found when trying to get lock; try restarting transaction".into()), Reply),
            ProxyError::PreviousStatementElsewhere => (
                reply(
                    ER_UNKNOWN_ERROR,
                    "HY000",
                    "hscale: ROW_COUNT(), FOUND_ROWS() and SHOW WARNINGS read this client's previous statement, and the backend connection that ran it has served another client since; run both statements in one transaction".into(),
                ),
                Reply,
            ),
            ProxyError::PreviousStatementScattered => (
                reply(
                    ER_NOT_SUPPORTED_YET,
                    "42000",
                    "hscale: the previous statement ran on several partitions: no one connection keeps its ROW_COUNT(), FOUND_ROWS() or warning count (SHOW WARNINGS lists every partition's messages); run it on one partition to read them".into(),
                ),
                Reply,
            ),
            ProxyError::Refused(packet) => (Some(packet.clone()), Reply),
            ProxyError::Unroutable(_) | ProxyError::Transaction(_) => {
                (reply(ER_NOT_SUPPORTED_YET, "42000", self.to_string()), Reply)
            }
            ProxyError::LockWaitTimeout { .. } => (reply(ER_LOCK_WAIT_TIMEOUT, "HY000", self.to_string()), Reply),
            ProxyError::DictionaryStale
            | ProxyError::UnknownBackend { .. }
            | ProxyError::DictionaryCorrupt { .. } => (reply(ER_UNKNOWN_ERROR, "HY000", self.to_string()), Reply),
            ProxyError::AdminDenied { .. } => (reply(ER_SPECIFIC_ACCESS_DENIED, "42000", self.to_string()), Reply),
            ProxyError::Guarded { .. } => (reply(ER_TABLEACCESS_DENIED_ERROR, "42000", self.to_string()), Reply),
            ProxyError::Admin(e) => {
                let (code, state) = match e {
                    AdminError::Syntax(_) => (ER_PARSE_ERROR, "42000"),
                    AdminError::NoDatabase => (ER_NO_DB_ERROR, "3D000"),
                    AdminError::NotPartitioned { .. } | AdminError::NoSuchTable { .. } => (ER_NO_SUCH_TABLE, "42S02"),
                    AdminError::AlreadyPartitioned { .. } | AdminError::TableExists { .. } => (ER_TABLE_EXISTS_ERROR, "42S01"),
                    AdminError::NoSuchColumn { .. } => (ER_BAD_FIELD_ERROR, "42S22"),
                    AdminError::Hash(_) | AdminError::Invalid(_) => (ER_WRONG_ARGUMENTS, "HY000"),
                    AdminError::Busy => (ER_LOCK_WAIT_TIMEOUT, "HY000"),
                };
                (reply(code, state, self.to_string()), Reply)
            }
            ProxyError::ScanTimeout { .. } => (reply(ER_STATEMENT_TIMEOUT, "70100", self.to_string()), Reply),
            ProxyError::MergeSpill(hscale_merge::MergeError::Budget(_)) => {
                (reply(ER_OUT_OF_SORTMEMORY, "HY001", self.to_string()), Reply)
            }
            ProxyError::MergeSpill(_)
            | ProxyError::LoadSpill(_)
            | ProxyError::CopySpill(_)
            | ProxyError::CopiesDiffer { .. } => {
                (reply(ER_UNKNOWN_ERROR, "HY000", self.to_string()), Reply)
            }
            ProxyError::Move(
                hscale_moves::MoveError::Unsupported(_) | hscale_moves::MoveError::NoKey(_),
            ) => {
                (reply(ER_NOT_SUPPORTED_YET, "42000", self.to_string()), Reply)
            }
            ProxyError::Move(_) => (reply(ER_UNKNOWN_ERROR, "HY000", self.to_string()), Reply),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One of each variant: adding a variant without a mapping fails to compile in
    /// `to_client`; this checks each mapping says something sensible.
    fn every_variant() -> Vec<ProxyError> {
        let lost = || BackendError::Lost {
            backend: 2,
            source: WireError::Closed,
        };
        vec![
            ProxyError::Client(WireError::Closed),
            ProxyError::Client(WireError::PacketTooLarge {
                size: 2 << 20,
                limit: 1 << 20,
            }),
            ProxyError::AccessDenied {
                user: "app".into(),
                used_password: true,
            },
            ProxyError::AuthPlugin {
                plugin: "dialog".into(),
            },
            ProxyError::TlsRequired,
            ProxyError::InsecureTransport,
            ProxyError::TooManyConnections { max: 1 },
            ProxyError::UnknownCommand { code: 0x99 },
            ProxyError::UnknownStatement {
                stmt_id: 7,
                command: "mysqld_stmt_execute",
            },
            ProxyError::Backend(lost()),
            ProxyError::Backend(BackendError::Connect {
                backend: 2,
                address: "127.0.0.1:1".into(),
                source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
            }),
            ProxyError::Backend(BackendError::ConnectTimeout {
                backend: 2,
                address: "x:1".into(),
                timeout_ms: 5,
            }),
            ProxyError::Backend(BackendError::Login {
                backend: 2,
                error: ErrorPacket::new(1045, "28000", "denied"),
            }),
            ProxyError::Backend(BackendError::Tls {
                backend: 2,
                reason: "invalid peer certificate: UnknownIssuer".into(),
            }),
            ProxyError::Backend(BackendError::NoSecret {
                backend: 2,
                user: "app".into(),
            }),
            ProxyError::Backend(BackendError::AuthPlugin {
                backend: 2,
                plugin: "ed25519".into(),
            }),
            ProxyError::Backend(BackendError::PoolExhausted {
                backend: 2,
                waited_ms: 10,
                max: 1,
            }),
            ProxyError::BackendMidAnswer { source: lost() },
            ProxyError::NotSupported { what: "KILL USER" },
            ProxyError::NoSuchThread { id: 9 },
            ProxyError::KillDenied { id: 9 },
            ProxyError::ConnectionKilled,
            ProxyError::QueryInterrupted,
            ProxyError::Deadlock,
            ProxyError::PreviousStatementElsewhere,
            ProxyError::PreviousStatementScattered,
            ProxyError::Refused(ErrorPacket::new(
                1193,
                "HY000",
                "Unknown system variable 'x'",
            )),
            ProxyError::Unroutable(Refusal {
                table: Some(table()),
                reason: "ORDER BY over several partitions".into(),
            }),
            ProxyError::Transaction(hscale_transaction::Refused::SecondWriter {
                first: 1,
                second: 2,
            }),
            ProxyError::LockWaitTimeout {
                table: table(),
                holder: "move 7 (HSCALE SHOW_MOVES)".into(),
                waited_ms: 10,
            },
            ProxyError::DictionaryStale,
            ProxyError::UnknownBackend { backend: 9 },
            ProxyError::DictionaryCorrupt {
                table: table(),
                what: "column_kind".into(),
            },
            ProxyError::AdminDenied { user: "app".into() },
            ProxyError::Guarded { user: "app".into() },
            ProxyError::Admin(AdminError::NoDatabase),
            ProxyError::Admin(AdminError::NotPartitioned { table: table() }),
            ProxyError::Admin(AdminError::Busy),
            ProxyError::ScanTimeout { ms: 10 },
            ProxyError::MergeSpill(hscale_merge::MergeError::Budget(1)),
            ProxyError::LoadSpill(crate::spool::SpoolError::Full(1)),
        ]
    }

    fn table() -> TableName {
        TableName {
            db: "app".into(),
            name: "users".into(),
        }
    }

    #[test]
    fn refusals_are_1235_and_name_the_table_and_the_reason() {
        let (packet, disposition) = ProxyError::Unroutable(Refusal {
            table: Some(table()),
            reason: "ORDER BY over several partitions".into(),
        })
        .to_client();
        let packet = packet.unwrap();
        assert_eq!((packet.code, &packet.sqlstate), (1235, b"42000"));
        assert!(packet.message.contains("`app`.`users`") && packet.message.contains("ORDER BY"));
        assert_eq!(disposition, Disposition::Reply);
        let (packet, _) = ProxyError::Transaction(hscale_transaction::Refused::SecondWriter {
            first: 1,
            second: 2,
        })
        .to_client();
        let packet = packet.unwrap();
        assert_eq!(packet.code, 1235);
        assert!(packet.message.contains("backend 1") && packet.message.contains("backend 2"));
    }

    #[test]
    fn every_error_maps_to_a_packet_or_a_deliberate_close() {
        for error in every_variant() {
            let (packet, disposition) = error.to_client();
            match packet {
                Some(p) => {
                    assert!(p.code >= 1000, "{error}: code {}", p.code);
                    assert!(!p.message.is_empty());
                    assert_ne!(disposition, Disposition::Close, "{error}");
                }
                None => assert_eq!(disposition, Disposition::Close, "{error}"),
            }
        }
    }

    #[test]
    fn backend_errors_name_the_backend() {
        for error in every_variant() {
            if let ProxyError::Backend(_) = error {
                let (packet, _) = error.to_client();
                assert!(packet.unwrap().message.contains("backend 2"), "{error}");
            }
        }
    }

    #[test]
    fn refused_commands_pass_the_server_error_through() {
        let (packet, _) = ProxyError::Refused(ErrorPacket::new(
            1193,
            "HY000",
            "Unknown system variable 'x'",
        ))
        .to_client();
        assert_eq!(
            packet.unwrap(),
            ErrorPacket::new(1193, "HY000", "Unknown system variable 'x'")
        );
    }
}

//! The configuration file (TOML): plain serde structs, and `validate`, which
//! reports every problem with its path.

mod validate;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use hscale_wire::auth::PasswordHash;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The client-facing side.
    pub proxy: ProxyConfig,
    /// Who may connect to hscale.
    #[serde(default)]
    pub users: Vec<UserConfig>,
    /// The MySQL/MariaDB servers behind hscale.
    #[serde(default)]
    pub backends: Vec<BackendConfig>,
    /// Where the partition dictionary lives.
    #[serde(default)]
    pub dictionary: DictionaryConfig,
    /// Statements that run on several partitions.
    #[serde(default)]
    pub scans: ScansConfig,
    /// Online moves and splits (docs/moves.md).
    #[serde(default)]
    pub moves: MovesConfig,
    /// Logging.
    #[serde(default)]
    pub log: LogConfig,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyConfig {
    /// host:port for MySQL-protocol clients.
    pub listen: String,
    /// Optional host:port for /metrics and /status.
    pub http: Option<String>,
    /// Client connections beyond this get error 1040.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Worker threads; 0 means one per core.
    #[serde(default)]
    pub threads: usize,
    /// When a client moves to another worker between its statements.
    #[serde(default)]
    pub move_clients: MoveClients,
    /// How long opening a backend connection may take before the statement fails.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// How long a statement waits for a free backend connection when a pool is full.
    #[serde(default = "default_queue_timeout_ms")]
    pub queue_timeout_ms: u64,
    /// "atomic": a statement that writes on several backends commits in two
    /// phases; "single": a transaction writes on one backend only; "multi":
    /// commits on each backend it wrote in turn, not atomically.
    #[serde(default)]
    pub transactions: Transactions,
    /// How long a statement runs (between one and two of these) before
    /// hscale looks for lock waits that form a cycle through several
    /// backends, which no server sees alone; a cycle seen at two looks in a
    /// row (at least 110 ms apart) ends one transaction with error 1213.
    /// 0: never (such waits end at innodb_lock_wait_timeout).
    #[serde(default = "default_deadlock_check_ms")]
    pub deadlock_check_ms: u64,
    /// A client that has not logged in this long after connecting is closed,
    /// as MariaDB's connect_timeout closes it: a crowd of silent sockets must
    /// not hold every connection slot.
    #[serde(default = "default_login_timeout_ms")]
    pub login_timeout_ms: u64,
    /// PEM certificate chain clients get when they switch to TLS; with
    /// `tls_key`, the greeting offers TLS.
    #[serde(default)]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `tls_cert`.
    #[serde(default)]
    pub tls_key: Option<PathBuf>,
    /// Clients that do not switch to TLS are refused (3159), as MariaDB's
    /// require_secure_transport refuses them.
    #[serde(default)]
    pub require_tls: bool,
    /// The authentication method the greeting names; a client that answers
    /// with mysql_native_password is served too.
    #[serde(default)]
    pub default_auth: DefaultAuth,
    /// How often every backend host is checked: reachable, read_only,
    /// GTID position, replication and lag (docs/replicas.md).
    #[serde(default = "default_monitor_ms")]
    pub monitor_ms: u64,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
pub enum DefaultAuth {
    #[default]
    #[serde(rename = "mysql_native_password")]
    NativePassword,
    /// MySQL 8's default: a scramble checked against a digest kept from the
    /// user's last full login, else the password over TLS or encrypted with
    /// hscale's RSA key.
    #[serde(rename = "caching_sha2_password")]
    CachingSha2Password,
}

impl DefaultAuth {
    pub fn plugin(self) -> &'static str {
        match self {
            DefaultAuth::NativePassword => hscale_wire::auth::NATIVE_PASSWORD,
            DefaultAuth::CachingSha2Password => hscale_wire::auth::CACHING_SHA2_PASSWORD,
        }
    }
}

pub use hscale_transaction::Transactions;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    /// The user name clients log in with.
    pub name: String,
    /// Plain text, or `*` and 40 hex digits (the mysql_native_password hash).
    #[serde(default)]
    pub password: String,
    /// May run HSCALE admin commands.
    #[serde(default)]
    pub admin: bool,
    /// The account this user's statements run as on every backend, whose
    /// grants the backends enforce; by default the user's own name.
    #[serde(default)]
    pub backend_user: Option<String>,
    /// That account's password; by default the user's. With a `*HEX`
    /// password and none here, hscale answers the backends with what the
    /// user's own login proves (SHA1 of the password).
    #[serde(default)]
    pub backend_password: Option<String>,
    /// Where this user's autocommitted reads go (docs/replicas.md).
    #[serde(default)]
    pub reads: Reads,
    /// A replica whose lag is above this is not read.
    #[serde(default = "default_max_lag_ms")]
    pub max_lag_ms: u64,
}

/// Where a user's autocommitted reads go.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Reads {
    /// The writer, as every other statement.
    #[default]
    Primary,
    /// A replica within `max_lag_ms` that applied the session's own
    /// writes; the writer where there is none.
    Replicas,
}

impl UserConfig {
    pub fn password_hash(&self) -> Option<PasswordHash> {
        if self.password.starts_with('*') && self.password.len() == 41 {
            PasswordHash::from_hex(&self.password)
        } else {
            Some(PasswordHash::from_plain(&self.password))
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    /// A small integer that names this backend in the dictionary and in errors.
    pub id: u32,
    /// host:port, or the path of a unix socket.
    pub address: String,
    /// The account hscale uses on this backend.
    pub user: String,
    #[serde(default)]
    pub password: String,
    /// Pool size: connections hscale opens to this backend at most.
    #[serde(default = "default_backend_connections")]
    pub max_connections: usize,
    /// Statements kept prepared on each connection; past this the least
    /// recently used is closed. Pool size times this stays under the
    /// server's max_prepared_stmt_count (16382 by default).
    #[serde(default = "default_prepared_statements")]
    pub prepared_statements: usize,
    /// TLS towards this backend: "off", "on" (encrypted, any certificate),
    /// "verify" (the certificate signed by `tls_ca`, for the address's host).
    #[serde(default)]
    pub tls: BackendTls,
    /// PEM file of the CA that signs the backend's certificate.
    #[serde(default)]
    pub tls_ca: Option<PathBuf>,
    /// The other hosts of this backend's replica set (host:port): with
    /// `address`, the writer is the one host whose read_only is off.
    #[serde(default)]
    pub replicas: Vec<String>,
    /// Who makes a replica the writer when the writer is gone.
    #[serde(default)]
    pub failover: Failover,
    /// With `failover = "auto"`: how long the writer must stay unreachable
    /// before a replica is promoted.
    #[serde(default = "default_failover_after_ms")]
    pub failover_after_ms: u64,
    /// How long statements that need this backend's writer wait for one
    /// (a failover, or the host back) before they fail.
    #[serde(default = "default_failover_wait_ms")]
    pub failover_wait_ms: u64,
    /// The account replicas log in to their primary with, which a
    /// switchover gives each host it points at the new writer; by default
    /// `user` and `password`.
    #[serde(default)]
    pub replication_user: Option<String>,
    #[serde(default)]
    pub replication_password: Option<String>,
}

impl BackendConfig {
    /// A backend at `address` reached as `root` without a password, the
    /// rest as a configuration file that names no more would have it.
    pub fn root_at(id: u32, address: String) -> BackendConfig {
        BackendConfig {
            id,
            address,
            user: "root".into(),
            password: String::new(),
            max_connections: default_backend_connections(),
            prepared_statements: default_prepared_statements(),
            tls: BackendTls::Off,
            tls_ca: None,
            replicas: Vec::new(),
            failover: Failover::External,
            failover_wait_ms: default_failover_wait_ms(),
            failover_after_ms: default_failover_after_ms(),
            replication_user: None,
            replication_password: None,
        }
    }

    /// The configured primary first, then the replicas.
    pub fn hosts(&self) -> Vec<String> {
        std::iter::once(&self.address)
            .chain(&self.replicas)
            .cloned()
            .collect()
    }
}

/// Who promotes a replica of a backend's replica set.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Failover {
    /// A tool or a person (MaxScale, orchestrator, `SET GLOBAL read_only`):
    /// hscale follows the host whose read_only is off.
    #[default]
    External,
    /// hscale promotes the most advanced replica once the writer has been
    /// unreachable for `failover_after_ms`.
    Auto,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BackendTls {
    #[default]
    Off,
    On,
    Verify,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DictionaryConfig {
    /// The main backend: holds the dictionary and every table that is not partitioned.
    #[serde(default = "default_main_backend")]
    pub backend: u32,
    /// Schema of the dictionary tables.
    #[serde(default = "default_schema")]
    pub schema: String,
    /// How often every instance checks the dictionary for changes.
    #[serde(default = "default_refresh_ms")]
    pub refresh_ms: u64,
    /// An instance that could not read the dictionary for this long stops
    /// serving partitioned tables; an instance whose heartbeat is older than
    /// this is not waited for.
    #[serde(default = "default_lease_ms")]
    pub lease_ms: u64,
    /// How long a statement waits for a partition move on its table to end.
    #[serde(default = "default_lock_wait_ms")]
    pub lock_wait_ms: u64,
}

impl Default for DictionaryConfig {
    fn default() -> Self {
        DictionaryConfig {
            backend: default_main_backend(),
            schema: default_schema(),
            refresh_ms: default_refresh_ms(),
            lease_ms: default_lease_ms(),
            lock_wait_ms: default_lock_wait_ms(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MovesConfig {
    /// Rows a move copies per second at most; 0: as fast as it goes.
    #[serde(default)]
    pub rows_per_s: u64,
    /// The copy pauses while the source's or a destination's
    /// `Threads_running` is above this; 0: it never pauses.
    #[serde(default = "default_max_threads_running")]
    pub max_threads_running: u64,
    /// How long a moved partition's old table is kept under its retired
    /// name before it is dropped.
    #[serde(default = "default_retired_retention_s")]
    pub retired_retention_s: u64,
    /// A move or split whose source writes no row binary log moves its rows
    /// while its table waits (in the fence), up to this many; above, it is
    /// refused.
    #[serde(default = "default_offline_max_rows")]
    pub offline_max_rows: u64,
}

impl Default for MovesConfig {
    fn default() -> Self {
        MovesConfig {
            rows_per_s: 0,
            max_threads_running: default_max_threads_running(),
            retired_retention_s: default_retired_retention_s(),
            offline_max_rows: default_offline_max_rows(),
        }
    }
}

fn default_max_threads_running() -> u64 {
    64
}
fn default_retired_retention_s() -> u64 {
    86_400
}
fn default_offline_max_rows() -> u64 {
    10_000
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScansConfig {
    /// Partition queries one unordered scan (a concatenation, aggregates
    /// without GROUP BY) runs at once on one backend; the others wait their
    /// turn. An ordered merge needs every partition at once.
    #[serde(default = "default_fan_out")]
    pub fan_out: usize,
    /// A statement on several partitions running longer than this is
    /// stopped (its partitions' queries killed) with error 1969; 0: no limit.
    #[serde(default)]
    pub timeout_ms: u64,
    /// What a merge may hold in memory (the groups an ORDER BY over combined
    /// groups keeps); past it, it spills to temporary files.
    #[serde(default = "default_merge_memory_bytes")]
    pub memory_bytes: usize,
    /// The temporary files one merge may write; past it, error 1038.
    #[serde(default = "default_spill_bytes")]
    pub spill_bytes: u64,
    /// Where temporary files go; absent: the system's temporary directory.
    #[serde(default)]
    pub spill_dir: Option<PathBuf>,
}

impl Default for ScansConfig {
    fn default() -> Self {
        ScansConfig {
            fan_out: default_fan_out(),
            timeout_ms: 0,
            memory_bytes: default_merge_memory_bytes(),
            spill_bytes: default_spill_bytes(),
            spill_dir: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// Default level: error, warn, info, debug or trace.
    #[serde(default = "default_level")]
    pub level: String,
    /// Log file; absent means stderr.
    pub file: Option<PathBuf>,
    /// When the log file starts anew.
    #[serde(default)]
    pub rotation: Rotation,
    /// Print the source file and line of each event.
    #[serde(default)]
    pub source: bool,
    /// Levels per category (a target prefix such as `hscale::session`).
    #[serde(default)]
    pub categories: BTreeMap<String, String>,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: default_level(),
            file: None,
            rotation: Rotation::default(),
            source: false,
            categories: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Rotation {
    #[default]
    Never,
    Hourly,
    Daily,
}

pub fn default_prepared_statements() -> usize {
    128
}
fn default_max_connections() -> usize {
    4096
}
fn default_connect_timeout_ms() -> u64 {
    3000
}
pub fn default_deadlock_check_ms() -> u64 {
    30
}

pub fn default_login_timeout_ms() -> u64 {
    10_000
}

pub fn default_max_lag_ms() -> u64 {
    1000
}
pub fn default_monitor_ms() -> u64 {
    500
}
pub fn default_failover_after_ms() -> u64 {
    3000
}
pub fn default_failover_wait_ms() -> u64 {
    10_000
}

fn default_queue_timeout_ms() -> u64 {
    10_000
}
pub fn default_backend_connections() -> usize {
    64
}
fn default_main_backend() -> u32 {
    1
}
fn default_schema() -> String {
    "hscale".into()
}
fn default_refresh_ms() -> u64 {
    1000
}
fn default_lease_ms() -> u64 {
    10_000
}
fn default_lock_wait_ms() -> u64 {
    10_000
}
fn default_fan_out() -> usize {
    8
}
fn default_merge_memory_bytes() -> usize {
    64 << 20
}
fn default_spill_bytes() -> u64 {
    1 << 30
}
fn default_level() -> String {
    "info".into()
}

/// One problem in a configuration, with the path of the offending key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub path: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Parse {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error("{path}: invalid configuration:\n{}", problems.iter().map(|p| format!("  {p}")).collect::<Vec<_>>().join("\n"))]
    Invalid {
        path: PathBuf,
        problems: Vec<Problem>,
    },
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let config = Config::parse(&text).map_err(|source| ConfigError::Parse {
            path: path.to_owned(),
            source: Box::new(source),
        })?;
        let problems = config.validate();
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError::Invalid {
                path: path.to_owned(),
                problems,
            })
        }
    }

    pub fn parse(text: &str) -> Result<Config, toml::de::Error> {
        toml::from_str(text)
    }

    pub fn main_backend(&self) -> &BackendConfig {
        self.backends
            .iter()
            .find(|b| b.id == self.dictionary.backend)
            .unwrap_or(&self.backends[0])
    }
}

/// When a client moves to another worker (`[proxy] move_clients`,
/// `cores::Balance`).
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum MoveClients {
    /// From a worker kept busy to one mostly idle, one at a time.
    #[default]
    ByLoad,
    /// Never: a client stays on the worker it was handed to.
    Never,
    /// At every statement boundary where it may (to the next worker): for
    /// tests of what a move must keep.
    Always,
}

#[cfg(test)]
mod tests;

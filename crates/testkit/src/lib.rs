//! Test support: MariaDB servers started once per test binary (own data
//! directories, free ports, stopped at exit), a database per test, hscale
//! proxies running in-process, and clients pointed at either.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

use hscale::config::Config;
use hscale::mariadb::{Binlog, LocalServer};
use hscale::playground::{config_for, start_servers_with, BackendPath};
use hscale::Shared;
use mysql::prelude::Queryable;
use mysql::{Conn, OptsBuilder};

pub mod differential;
pub mod order_entry;
pub mod raw;
pub mod replicas;
pub mod tls;

/// The servers every test of this binary shares.
pub struct Cluster {
    pub servers: Vec<Mutex<LocalServer>>,
    ports: Vec<u16>,
    sockets: Vec<String>,
    dir: PathBuf,
    /// The certificates the servers present, and hscale may: signed by a CA
    /// of this run's own.
    pub tls: tls::TlsFiles,
    /// Whether the servers write a binary log of row images.
    pub binlog: Binlog,
}

const BACKENDS: usize = 2;

static CLUSTER: OnceLock<Cluster> = OnceLock::new();

/// Statics are never dropped, so without this neither the servers nor their
/// data directories (about 40 MiB each) would go away. Left behind, test runs
/// filled a CI disk, and MariaDB then waits for space forever instead of failing.
extern "C" fn stop_servers_at_exit() {
    let Some(cluster) = CLUSTER.get() else {
        return;
    };
    for server in &cluster.servers {
        // A test that panicked holding the lock leaves it poisoned, not held.
        match server.try_lock() {
            Ok(mut server) => server.kill(),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner().kill(),
            // Still in use by a test thread: its directory must stay too.
            Err(std::sync::TryLockError::WouldBlock) => return,
        }
    }
    let _ = std::fs::remove_dir_all(&cluster.dir);
}

/// No test binary here runs for more than a minute or two. One that runs for
/// this long hangs, most likely on a server that waits (MariaDB waits, silently,
/// for a full disk to get space): rather than let CI run into its own limit with
/// nothing to show, print what the servers logged and end the run, failed.
const HUNG_AFTER: std::time::Duration = std::time::Duration::from_secs(15 * 60);

fn end_a_hung_run(logs: Vec<PathBuf>) {
    std::thread::sleep(HUNG_AFTER);
    // Straight to stderr: eprintln! would go to the output the harness captures
    // for the test that started this thread, and is lost with the process.
    let mut report = format!(
        "\ntests still running after {} minutes: ending the run. The servers' logs end with:\n",
        HUNG_AFTER.as_secs() / 60
    );
    for log in logs {
        let tail = hscale::mariadb::log_tail(&log);
        report.push_str(&format!("--- {}\n{tail}\n", log.display()));
    }
    let _ = std::io::Write::write_all(&mut std::io::stderr(), report.as_bytes());
    // exit, not abort: the exit handler stops the servers and removes their data.
    std::process::exit(1);
}

/// The servers of this binary: two, unless `cluster_of` asked for more first.
pub fn cluster() -> &'static Cluster {
    cluster_of(BACKENDS)
}

/// The servers of this binary, `backends` of them when this call starts them
/// (a binary that needs more than two asks before any other test starts them).
pub fn cluster_of(backends: usize) -> &'static Cluster {
    let cluster = CLUSTER.get_or_init(|| start_cluster(backends, Binlog::Rows));
    assert!(
        cluster.ports.len() >= backends,
        "the cluster started with {} backends, {backends} needed",
        cluster.ports.len()
    );
    cluster
}

/// The two servers of this binary as MariaDB comes out of the package:
/// without a binary log. A binary asks for them before any other test
/// starts servers.
pub fn cluster_as_packaged() -> &'static Cluster {
    let cluster = CLUSTER.get_or_init(|| start_cluster(BACKENDS, Binlog::Off));
    assert_eq!(cluster.binlog, Binlog::Off, "this binary's servers log");
    cluster
}

fn start_cluster(backends: usize, binlog: Binlog) -> Cluster {
    {
        let dir = tempfile::Builder::new()
            .prefix("hscale-test-")
            .tempdir()
            .expect("temp dir")
            .keep();
        let tls = tls::make_certificates(&dir.join("tls"));
        let servers = start_servers_with(&dir, backends, binlog).unwrap_or_else(|e| {
            let _ = std::fs::remove_dir_all(&dir);
            panic!("cannot start MariaDB: {e}")
        });
        // SAFETY: registers a plain extern "C" function with no captured state.
        unsafe {
            libc::atexit(stop_servers_at_exit);
        }
        let logs = servers.iter().map(LocalServer::error_log).collect();
        std::thread::spawn(move || end_a_hung_run(logs));
        Cluster {
            ports: servers.iter().map(|s| s.port).collect(),
            sockets: servers.iter().map(|s| s.socket()).collect(),
            servers: servers.into_iter().map(Mutex::new).collect(),
            dir,
            tls,
            binlog,
        }
    }
}

impl Cluster {
    pub fn backends(&self) -> usize {
        self.ports.len()
    }

    pub fn port(&self, backend: usize) -> u16 {
        self.ports[backend - 1]
    }

    /// A fresh, empty database of this name on every backend.
    pub fn database(&self, name: &str) -> String {
        for backend in 1..=self.ports.len() {
            let mut conn = self.direct(backend, None);
            conn.query_drop(format!("DROP DATABASE IF EXISTS `{name}`"))
                .unwrap();
            conn.query_drop(format!("CREATE DATABASE `{name}`"))
                .unwrap();
        }
        name.to_string()
    }

    /// A MariaDB account on every backend, for hscale's connections over the
    /// unix socket and over TCP, with every grant on `db` and no other;
    /// `require` adds a REQUIRE clause (`"SSL"`).
    pub fn account(&self, name: &str, password: &str, db: &str, require: Option<&str>) {
        let require = require.map_or(String::new(), |r| format!(" REQUIRE {r}"));
        for backend in 1..=self.ports.len() {
            let mut root = self.direct(backend, None);
            for host in ["localhost", "127.0.0.1"] {
                let account = format!("'{name}'@'{host}'");
                root.query_drop(format!("DROP USER IF EXISTS {account}"))
                    .unwrap();
                root.query_drop(format!(
                    "CREATE USER {account} IDENTIFIED BY '{password}'{require}"
                ))
                .unwrap();
                root.query_drop(format!("GRANT ALL ON `{db}`.* TO {account}"))
                    .unwrap();
            }
        }
    }

    /// A client connected straight to a backend, bypassing hscale.
    pub fn direct(&self, backend: usize, db: Option<&str>) -> Conn {
        connect(self.port(backend), "root", "", db)
    }

    /// The proxy configuration for these servers, listening on a free port.
    /// hscale reaches them over their unix sockets, as the playground does.
    pub fn config(&self) -> Config {
        self.config_with_addresses(&self.sockets)
    }

    /// The same, with hscale reaching the servers over TCP.
    pub fn config_over_tcp(&self) -> Config {
        let addresses: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        self.config_with_addresses(&addresses)
    }

    fn config_with_addresses(&self, addresses: &[String]) -> Config {
        let mut config = config_for(&[], 0, BackendPath::Unix);
        config.backends = addresses
            .iter()
            .enumerate()
            .map(|(i, address)| {
                hscale::config::BackendConfig::root_at(i as u32 + 1, address.clone())
            })
            .collect();
        config.proxy.listen = "127.0.0.1:0".into();
        config.log.level = "warn".into();
        // Admin commands wait for every live instance to load a change: tests
        // start many proxies, so they poll often. An instance serves only
        // while its last read is within the lease, by the clock: the lease
        // covers the longest stall of a loaded two-core machine (a second
        // and more seen), and stays short for the tests of takeovers.
        config.dictionary.refresh_ms = 50;
        config.dictionary.lease_ms = 5000;
        config
    }
}

/// A client of the `mysql` crate on 127.0.0.1 (never a unix socket).
pub fn connect(port: u16, user: &str, password: &str, db: Option<&str>) -> Conn {
    try_connect(port, user, password, db).unwrap_or_else(|e| panic!("connect to port {port}: {e}"))
}

pub fn try_connect(port: u16, user: &str, password: &str, db: Option<&str>) -> mysql::Result<Conn> {
    Conn::new(opts(port, user, password, db))
}

pub fn opts(port: u16, user: &str, password: &str, db: Option<&str>) -> OptsBuilder {
    OptsBuilder::new()
        .ip_or_hostname(Some("127.0.0.1"))
        .tcp_port(port)
        .prefer_socket(false)
        .user(Some(user))
        .pass(Some(password))
        .db_name(db)
}

/// hscale running in-process on its own runtime thread; stopped when dropped.
pub struct Proxy {
    pub port: u16,
    pub shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Proxy {
    pub fn start(config: Config) -> Proxy {
        // HSCALE_LOG=debug shows the proxy's log in a failing test's output.
        let _ = hscale::logging::init(&config.log);
        let problems = config.validate();
        assert!(problems.is_empty(), "invalid test config: {problems:?}");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let (listener, shared) = runtime.block_on(async {
            let listener = hscale::server::bind(&config.proxy.listen, config.proxy.max_connections)
                .expect("bind");
            let mut shared = Shared::new(&config);
            shared.learn_main_backend().await;
            // Recovery of interrupted moves done before the test goes on
            // (run() opens the dictionary again, which is cheap).
            let _ = hscale::upkeep::open(&shared).await;
            (listener, Arc::new(shared))
        });
        let port = listener.local_addr().expect("addr").port();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = shared.clone();
        let thread = std::thread::spawn(move || {
            runtime
                .block_on(hscale::run(listener, serving, async {
                    let _ = stopped.await;
                }))
                .expect("the workers start");
            runtime.shutdown_background();
        });
        Proxy {
            port,
            shared,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// A proxy in front of the shared cluster with the default test config.
    pub fn for_cluster() -> Proxy {
        Proxy::start(cluster().config())
    }

    pub fn connect(&self, db: Option<&str>) -> Conn {
        connect(self.port, "root", "", db)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Runs a command-line program and returns its stdout; panics with its stderr.
pub fn run_program(program: &str, args: &[&str]) -> String {
    let output = std::process::Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A scratch directory for a test's files.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hscale-scratch-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Writes a configuration for a `hscale serve` process of a test's own in
/// the scratch folder `name`: the cluster's backends and `more` (other
/// backends' sections), the dictionary's `schema`, a lease of `lease_ms`;
/// its path.
pub fn serve_config(name: &str, port: u16, more: &str, schema: &str, lease_ms: u64) -> PathBuf {
    let path = scratch(name).join("hscale.toml");
    let backends: String = cluster()
        .config()
        .backends
        .iter()
        .map(|b| {
            format!(
                "[[backends]]\nid = {}\naddress = \"{}\"\nuser = \"root\"\n",
                b.id, b.address
            )
        })
        .collect();
    std::fs::write(
        &path,
        format!(
            "[proxy]\nlisten = \"127.0.0.1:{port}\"\nconnect_timeout_ms = 1000\n\n[[users]]\nname = \"root\"\npassword = \"\"\nadmin = true\n\n{backends}{more}\n[dictionary]\nschema = \"{schema}\"\nrefresh_ms = 50\nlease_ms = {lease_ms}\n\n[log]\nlevel = \"warn\"\n"
        ),
    )
    .expect("the config");
    path
}

/// The data (gtrid and bqual) of each XA transaction prepared on `backend`.
pub fn xa_prepared(backend: usize) -> Vec<String> {
    let rows: Vec<(u32, u32, u32, Vec<u8>)> =
        cluster().direct(backend, None).query("XA RECOVER").unwrap();
    rows.into_iter()
        .map(|(_, _, _, data)| String::from_utf8_lossy(&data).into_owned())
        .collect()
}

/// A `hscale serve` process of a test's own on the cluster's backends and
/// dictionary (`serve_config`, a lease of 2 s), with `HSCALE_FAILPOINT`
/// set; killed (SIGKILL) when dropped, its scratch folder removed.
pub struct Serve {
    child: std::process::Child,
    pub port: u16,
    config: PathBuf,
}

impl Serve {
    /// `binary`: the test's `env!("CARGO_BIN_EXE_hscale")`; `more`: more
    /// sections of the configuration; `schema`: the dictionary's.
    pub fn start(binary: &str, name: &str, failpoint: &str, more: &str, schema: &str) -> Serve {
        let port = hscale::mariadb::free_port().unwrap();
        let config = serve_config(name, port, more, schema, 2000);
        Serve::run(binary, port, config, failpoint)
    }

    /// A process with the configuration `configured` writes for the port
    /// it listens on, in the scratch folder `name`.
    pub fn with_config(
        binary: &str,
        name: &str,
        failpoint: &str,
        configured: impl FnOnce(u16) -> String,
    ) -> Serve {
        let port = hscale::mariadb::free_port().unwrap();
        let config = scratch(name).join("hscale.toml");
        std::fs::write(&config, configured(port)).expect("the config");
        Serve::run(binary, port, config, failpoint)
    }

    fn run(binary: &str, port: u16, config: PathBuf, failpoint: &str) -> Serve {
        let child = std::process::Command::new(binary)
            .args(["serve", "--config", config.to_str().unwrap()])
            .env("HSCALE_FAILPOINT", failpoint)
            .spawn()
            .unwrap();
        Serve {
            child,
            port,
            config,
        }
    }

    /// A client, once the process listens.
    pub fn connect(&self, db: &str) -> Conn {
        self.connect_as("root", "", db)
    }

    /// A client of `user`, once the process listens.
    pub fn connect_as(&self, user: &str, password: &str, db: &str) -> Conn {
        let started = std::time::Instant::now();
        loop {
            match try_connect(self.port, user, password, Some(db)) {
                Ok(conn) => return conn,
                Err(e) => {
                    assert!(
                        started.elapsed() < std::time::Duration::from_secs(30),
                        "hscale serve: {e}"
                    );
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
            }
        }
    }

    /// The prefix of its branches' ids: its instance name begins with its
    /// process id.
    pub fn branches(&self) -> String {
        format!("{}-", self.child.id())
    }

    /// Whether it has ended (a failpoint killed it).
    pub fn has_ended(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_some()
    }

    /// Waits for it to end; how it ended.
    pub fn wait(&mut self) -> std::process::ExitStatus {
        self.child.wait().expect("hscale serve")
    }

    /// Kills it now (SIGKILL).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(folder) = self.config.parent() {
            let _ = std::fs::remove_dir_all(folder);
        }
    }
}

/// A MariaDB server of the test's own, in the scratch folder `name` (its
/// data directory copied from one installed there once), for a test that
/// kills and restarts it; the folder, to remove at the end.
pub fn scratch_server(name: &str) -> (LocalServer, PathBuf) {
    let dir = scratch(name);
    let template = dir.join("template");
    if !template.exists() {
        hscale::mariadb::install_datadir(&template).expect("mariadb-install-db");
    }
    let server_dir = dir.join("server");
    let _ = std::fs::remove_dir_all(&server_dir);
    std::fs::create_dir_all(&server_dir).expect("server dir");
    let server = LocalServer::start(&server_dir, &template).expect("a server of the test's own");
    (server, dir)
}

/// Runs `run(index, seed)` `HSCALE_<NAME>_RUNS` times (`default` unless
/// set), each with a seed drawn from `HSCALE_<NAME>_SEED` (`seed`), and
/// prints what each run said it did.
pub fn seeded_runs(name: &str, default: u64, mut run: impl FnMut(u64, u64) -> String) {
    let runs: u64 = std::env::var(format!("HSCALE_{name}_RUNS"))
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(default);
    let seed = seed(&format!("HSCALE_{name}_SEED"));
    let ran: Vec<String> = (0..runs).map(|i| run(i, seed.wrapping_add(i))).collect();
    println!("runs: {ran:#?}");
}

/// Accounts 1 to `accounts` with `opening` each, in `accounts (id,
/// balance)`: the bank of the transfer tests.
pub fn open_accounts(conn: &mut Conn, accounts: i64, opening: i64) {
    let values: Vec<String> = (1..=accounts)
        .map(|id| format!("({id}, {opening})"))
        .collect();
    conn.query_drop(format!("INSERT INTO accounts VALUES {}", values.join(", ")))
        .unwrap();
}

/// The last move job of `db` in the dictionary `main` holds: its id, phase
/// and last error.
pub fn last_job(main: &mut Conn, db: &str) -> Option<(u64, String, Option<String>)> {
    main.exec_first(
        "SELECT id, phase, last_error FROM hscale.moves WHERE db = ? ORDER BY id DESC LIMIT 1",
        (db,),
    )
    .unwrap()
}

/// A random test's seed: the environment variable `var` when set (to replay
/// a failure), else a fresh one; printed either way.
pub fn seed(var: &str) -> u64 {
    let seed = std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(std::process::id().into());
            h.finish()
        });
    println!("seed {seed} ({var}={seed} replays it)");
    seed
}

/// This process's resident memory (VmRSS), in KiB: a test alone in its
/// binary measures the proxy it runs.
pub fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .expect("VmRSS")
}

/// This process's peak resident memory while a test runs, sampled every
/// 20 ms from `start` to `grown_mib`.
pub struct PeakRss {
    baseline: u64,
    peak: std::sync::Arc<std::sync::atomic::AtomicU64>,
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    sampler: std::thread::JoinHandle<()>,
}

impl PeakRss {
    pub fn start() -> PeakRss {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        use std::sync::Arc;
        let baseline = rss_kib();
        let peak = Arc::new(AtomicU64::new(baseline));
        let done = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (peak, done) = (peak.clone(), done.clone());
            std::thread::spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    peak.fetch_max(rss_kib(), Ordering::Relaxed);
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            })
        };
        PeakRss {
            baseline,
            peak,
            done,
            sampler,
        }
    }

    /// How far the peak rose above the start, in MiB.
    pub fn grown_mib(self) -> u64 {
        use std::sync::atomic::Ordering;
        self.done.store(true, Ordering::Relaxed);
        self.sampler.join().expect("the sampler");
        (self.peak.load(Ordering::Relaxed) - self.baseline) / 1024
    }
}

/// The code and message of the server error `sql` gets.
pub fn error_of(conn: &mut Conn, sql: &str) -> (u16, String) {
    match conn.query_drop(sql) {
        Err(mysql::Error::MySqlError(e)) => (e.code, e.message),
        other => panic!("{sql}: expected an error, got {other:?}"),
    }
}

/// Runs `probe` until it returns `Some`, at most `limit`; panics with
/// `what` after that.
pub fn wait_for<T>(
    what: &str,
    limit: std::time::Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> T {
    let started = std::time::Instant::now();
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

//! `hscale playground`: local MariaDB servers in a temporary directory, the
//! proxy in front of them, a demo table, and instructions; Ctrl-C removes it all.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use crate::config::{BackendConfig, Config, DictionaryConfig, LogConfig, ProxyConfig, UserConfig};
use crate::mariadb::{ensure_free_space, install_datadir, Binlog, LaunchError, LocalServer};
use crate::shared::Shared;

#[derive(Debug, thiserror::Error)]
pub enum PlaygroundError {
    #[error(transparent)]
    Launch(#[from] LaunchError),
    #[error("cannot listen on 127.0.0.1:{port}: {source}")]
    Listen { port: u16, source: std::io::Error },
    #[error("setting up the demo data failed: {0}")]
    Demo(String),
    #[error("cannot start hscale's workers: {0}")]
    Workers(std::io::Error),
}

/// How the proxy reaches the local servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendPath {
    /// Their unix sockets: the cheapest path on one host.
    Unix,
    /// TCP on 127.0.0.1, as backends on other hosts are reached.
    Tcp,
}

pub fn config_for(servers: &[LocalServer], port: u16, path: BackendPath) -> Config {
    Config {
        proxy: ProxyConfig {
            listen: format!("127.0.0.1:{port}"),
            http: None,
            max_connections: 4096,
            threads: 0,
            move_clients: Default::default(),
            connect_timeout_ms: 3000,
            queue_timeout_ms: 10_000,
            transactions: Default::default(),
            deadlock_check_ms: crate::config::default_deadlock_check_ms(),
            login_timeout_ms: crate::config::default_login_timeout_ms(),
            tls_cert: None,
            tls_key: None,
            require_tls: false,
            default_auth: Default::default(),
            monitor_ms: crate::config::default_monitor_ms(),
        },
        users: vec![UserConfig {
            name: "root".into(),
            password: String::new(),
            admin: true,
            ..Default::default()
        }],
        backends: servers
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let address = match path {
                    BackendPath::Unix => s.socket(),
                    BackendPath::Tcp => format!("127.0.0.1:{}", s.port),
                };
                BackendConfig::root_at(i as u32 + 1, address)
            })
            .collect(),
        dictionary: DictionaryConfig::default(),
        scans: Default::default(),
        moves: Default::default(),
        log: LogConfig::default(),
    }
}

/// Starts `count` servers in `dir`.
pub fn start_servers(dir: &Path, count: usize) -> Result<Vec<LocalServer>, LaunchError> {
    start_servers_with(dir, count, Binlog::Rows)
}

pub fn start_servers_with(
    dir: &Path,
    count: usize,
    binlog: Binlog,
) -> Result<Vec<LocalServer>, LaunchError> {
    ensure_free_space(dir, count + 1)?;
    let template = dir.join("template");
    install_datadir(&template)?;
    (1..=count)
        .map(|i| {
            let server_dir = dir.join(format!("backend{i}"));
            std::fs::create_dir_all(&server_dir)?;
            LocalServer::start_with(&server_dir, &template, binlog)
        })
        .collect()
}

const DEMO_SQL: &str = "CREATE DATABASE IF NOT EXISTS demo; USE demo;
CREATE TABLE users (id INT UNSIGNED PRIMARY KEY, nickname VARCHAR(64) NOT NULL, created DATE NOT NULL);
INSERT INTO users VALUES (1,'martin','2008-05-06'),(2,'marvin','2008-06-01'),(3,'peter','2009-01-02'),(4,'paula','2010-03-04'),
(5,'Marlene','2010-07-08'),(6,'pete','2011-02-03'),(7,'zoe','2012-04-05'),(8,'anna','2013-06-07');";

/// The seeds' example: `users` partitioned by the first three letters of the
/// nickname, 'mar' on the second backend, 'pet' and 'pau' on the first.
fn demo_partitions(backends: usize) -> Vec<String> {
    let far = backends.min(2);
    vec![
        "HSCALE SETUP_TABLE('users', 'nickname', 'users_default', 1, 'PREFIX(3)')".into(),
        format!("HSCALE ADD_PARTITION('users', 'nick1', 'mar', {far})"),
        "HSCALE ADD_PARTITION('users', 'nick2', 'pet', 1)".into(),
        "HSCALE ADD_PARTITION('users', 'nick2', 'pau', 1)".into(),
    ]
}

async fn partition_demo(shared: &Arc<Shared>, backends: usize) -> Result<(), PlaygroundError> {
    let failed = |e: crate::error::ProxyError| PlaygroundError::Demo(e.to_string());
    crate::upkeep::open(shared).await.map_err(failed)?;
    let caller = crate::admin::Caller {
        db: Some("demo"),
        quoting: Default::default(),
        no_auto_value_on_zero: false,
    };
    for command in demo_partitions(backends) {
        crate::admin::execute(shared, &caller, &command)
            .await
            .map_err(failed)?;
    }
    Ok(())
}

fn create_demo(main: &LocalServer) -> Result<(), PlaygroundError> {
    let output = Command::new("mariadb")
        .args([
            "-h127.0.0.1",
            &format!("-P{}", main.port),
            "-uroot",
            "-e",
            DEMO_SQL,
        ])
        .output()
        .map_err(|e| PlaygroundError::Demo(format!("cannot run the mariadb client: {e}")))?;
    if !output.status.success() {
        return Err(PlaygroundError::Demo(
            String::from_utf8_lossy(&output.stderr).into_owned(),
        ));
    }
    Ok(())
}

pub async fn run(
    backends: usize,
    port: u16,
    path: BackendPath,
    tls: Option<std::path::PathBuf>,
) -> Result<(), PlaygroundError> {
    let dir = tempfile::Builder::new()
        .prefix("hscale-playground-")
        .tempdir()
        .map_err(LaunchError::Io)?;
    say_err(&format!(
        "starting {backends} MariaDB server(s) in {} ...\n",
        dir.path().display()
    ));
    if let Some(tls) = &tls {
        // The servers find their certificates here (mariadb::spawn).
        let into = dir.path().join("tls");
        std::fs::create_dir_all(&into).map_err(LaunchError::Io)?;
        for file in ["ca.pem", "server.pem", "server-key.pem"] {
            std::fs::copy(tls.join(file), into.join(file)).map_err(LaunchError::Io)?;
        }
    }
    let servers = start_servers(dir.path(), backends)?;
    create_demo(&servers[0])?;
    let mut config = config_for(&servers, port, path);
    if tls.is_some() {
        let tls = dir.path().join("tls");
        config.proxy.tls_cert = Some(tls.join("server.pem"));
        config.proxy.tls_key = Some(tls.join("server-key.pem"));
        for backend in &mut config.backends {
            backend.tls = crate::config::BackendTls::Verify;
            backend.tls_ca = Some(tls.join("ca.pem"));
        }
    }
    let listener = crate::server::bind(&config.proxy.listen, config.proxy.max_connections)
        .map_err(|source| PlaygroundError::Listen { port, source })?;
    // `--port 0` asks for any free port: tell the one it got.
    let port = listener.local_addr().map_or(port, |address| address.port());
    let mut shared = Shared::new(&config);
    shared.learn_main_backend().await;
    let shared = Arc::new(shared);
    partition_demo(&shared, backends).await?;
    let mut ready = String::new();
    for (i, s) in servers.iter().enumerate() {
        let (n, backend_port, pid) = (i + 1, s.port, s.pid());
        ready.push_str(&format!(
            "backend {n}: MariaDB on 127.0.0.1:{backend_port} (pid {pid})\n"
        ));
    }
    ready.push_str(&format!(
        "hscale playground is ready. Connect with:\n\n    mariadb -h127.0.0.1 -P{port} -uroot demo\n\n\
         `users` is partitioned by the first three letters of the nickname. Try:\n\n    \
         HSCALE SHOW_PARTITIONS('users');\n    \
         HSCALE EXPLAIN SELECT * FROM users WHERE nickname = 'Martin';\n    \
         SELECT * FROM users WHERE nickname = 'Martin';\n\n\
         Press Ctrl-C to stop and remove everything.\n"
    ));
    say(&ready);
    let served = crate::server::run(listener, shared, shutdown_signal()).await;
    drop(servers);
    drop(dir);
    served.map_err(PlaygroundError::Workers)?;
    say_err("playground stopped; its data is removed\n");
    Ok(())
}

/// Prints to stdout. A reader that went away (`| head`) must not stop the
/// playground, so write errors are ignored.
fn say(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|_| out.flush());
}

fn say_err(text: &str) {
    use std::io::Write;
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// Completes on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
    }
}
